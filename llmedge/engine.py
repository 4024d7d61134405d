"""The engine: runs a model over a sequence, reusing cached prefixes, and streams sampled tokens.

It owns the active sequence's KV cache and a small LRU of recent sequences' cache snapshots (within
a byte budget) for prefix reuse, evaluates prompts in chunks of ``n_batch`` tokens, samples with a
per-request :class:`~llmedge.sampling.Sampler`, stops on end-of-generation tokens, stop strings or
the token budget, shifts the context when it is full (keep ``n_keep`` tokens, drop half of the rest,
re-rotate the kept keys; or stop with ``length`` when shifting is off), saves and loads sequence
states, and reports timings in Ollama's terms. This first cut drives one sequence at a time; the
CLI, the API and (later) the server all go through it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from llmedge.errors import LlmedgeError
from llmedge.kvcache import SequenceCache, SequenceState, check_kv_type, common_prefix
from llmedge.models.base import Batch
from llmedge.sampling import Sampler
from llmedge.tokenizer import Tokenizer

DEFAULT_PREFIX_CACHE_BYTES = 256 << 20  # snapshots of recent sequences kept for prefix reuse
PREFIX_CACHE_ENTRIES = 4
MIN_STASH_TOKENS = 16  # a sequence losing fewer cached tokens than this is not worth a snapshot


@dataclass
class Chunk:
    """One generated token and the text it completes ("" while text is held back)."""

    token: int
    text: str
    done_reason: str | None = None  # set on the last chunk: "stop" or "length"


@dataclass
class Timings:
    """Ollama's timing fields, in nanoseconds (``extra``: prompt_cached, context_shifts)."""

    load_duration: int = 0
    prompt_eval_count: int = 0
    prompt_eval_duration: int = 0
    eval_count: int = 0
    eval_duration: int = 0
    total_duration: int = 0
    done_reason: str = ""
    extra: dict[str, float] = field(default_factory=dict)


class PrefixCache:
    """An LRU of sequence snapshots (tokens + K/V cells) within a byte budget."""

    def __init__(self, budget_bytes: int = DEFAULT_PREFIX_CACHE_BYTES, max_entries: int = PREFIX_CACHE_ENTRIES
                 ) -> None:
        self.budget_bytes = budget_bytes
        self.max_entries = max_entries
        self.entries: OrderedDict[int, SequenceState] = OrderedDict()
        self._next = 0

    @property
    def nbytes(self) -> int:
        return sum(st.nbytes for st in self.entries.values())

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, state: SequenceState) -> bool:
        """Keep ``state`` (evicting the least recently used ones); False when it exceeds the budget."""
        if not state.tokens or state.nbytes > self.budget_bytes or self.max_entries <= 0:
            return False
        for key, st in list(self.entries.items()):  # a snapshot that is a prefix of the new one is redundant
            if len(st.tokens) <= len(state.tokens) and common_prefix(st.tokens, state.tokens) == len(st.tokens):
                del self.entries[key]
        self.entries[self._next] = state
        self._next += 1
        while len(self.entries) > self.max_entries or self.nbytes > self.budget_bytes:
            self.entries.popitem(last=False)
        return True

    def best(self, ids: Sequence[int]) -> tuple[int | None, int]:
        """The snapshot sharing the longest prefix with ``ids``: (key, common length)."""
        best_key, best_n = None, 0
        for key, st in self.entries.items():
            n = common_prefix(st.tokens, ids)
            if n > best_n:
                best_key, best_n = key, n
        return best_key, best_n

    def pop(self, key: int) -> SequenceState:
        return self.entries.pop(key)

    def clear(self) -> None:
        self.entries.clear()


class Engine:
    """Drives one model's sequence: prefix reuse, chunked prefill, sampling, stopping, context shift,
    state files, timings."""

    def __init__(self, model: Any, tokenizer: Tokenizer, n_ctx: int, n_batch: int = 512, kv_type: str = "f16",
                 load_duration: int = 0, prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.n_ctx = n_ctx
        self.n_batch = max(1, min(n_batch, n_ctx))
        self.kv_type = check_kv_type(kv_type)
        self.cache: SequenceCache = self.new_cache()
        self.prefix_cache = PrefixCache(prefix_cache_bytes)
        self.load_duration = load_duration
        self.last = Timings()
        self.n_evaluated = 0  # tokens run through the model by this engine (all caches), for accounting
        self.n_shifts = 0

    # -- caches ----------------------------------------------------------------------------------
    def new_cache(self, n_ctx: int | None = None) -> SequenceCache:
        """A fresh sequence cache for this model (``n_ctx`` cells for full-attention layers)."""
        cache = self.model.make_cache(n_ctx or self.n_ctx, self.kv_type, self.n_batch)
        specs = getattr(self.model, "specs", None) or [getattr(self.model, "attn", None)] * len(cache.layers)
        for layer, spec in zip(cache.layers, specs):
            if spec is not None and layer.rope is None:
                layer.rope = (spec.n_rot, spec.rope_base, spec.rope_scale, spec.neox)
        return cache

    @property
    def cache_bytes(self) -> int:
        """KV bytes allocated for the active sequence."""
        return self.cache.nbytes

    def memory(self) -> dict[str, Any]:
        """What the caches hold and cost, for ``llmedge show`` / ``ps`` and the API."""
        layers = self.cache.layers
        return {
            "kv_type": self.kv_type,
            "n_ctx": self.n_ctx,
            "sequence_bytes": self.cache.nbytes,
            "scratch_bytes": self.cache.scratch_bytes,
            "layers_full": sum(1 for layer in layers if not layer.ring),
            "layers_ring": sum(1 for layer in layers if layer.ring),
            "ring_cells": max((layer.capacity for layer in layers if layer.ring), default=0),
            "tokens": self.cache.offset,
            "prefix_cache_bytes": self.prefix_cache.nbytes,
            "prefix_cache_entries": len(self.prefix_cache),
            "prefix_cache_budget": self.prefix_cache.budget_bytes,
        }

    # -- evaluation ------------------------------------------------------------------------------
    def forward(self, cache: SequenceCache, ids: Sequence[int], all_logits: bool = False) -> np.ndarray:
        """Evaluate ``ids`` after what ``cache`` holds; logits of every row or of the last one only."""
        n_vocab = self.model.params.n_vocab
        for t in ids:
            if not 0 <= t < n_vocab:
                raise LlmedgeError(f"token id {t} is out of range for a vocabulary of {n_vocab}")
        out = []
        for start in range(0, len(ids), self.n_batch):
            chunk = np.asarray(ids[start : start + self.n_batch], dtype=np.int64)
            pos = np.arange(cache.offset, cache.offset + len(chunk), dtype=np.int64)
            last_chunk = start + self.n_batch >= len(ids)
            rows = None if all_logits else np.array([len(chunk) - 1])
            logits = self.model.forward(Batch(chunk, pos, cache, rows))
            cache.tokens.extend(int(t) for t in chunk)
            self.n_evaluated += len(chunk)
            if all_logits or last_chunk:
                out.append(logits)
        return np.concatenate(out, axis=0) if out else np.empty((0, n_vocab), dtype=np.float32)

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """Logits at every position of ``ids`` in a fresh context (nothing cached is reused)."""
        if not ids:
            return np.empty((0, self.model.params.n_vocab), dtype=np.float32)
        cache = self.new_cache(max(len(ids), 1))
        return self.forward(cache, ids, all_logits=True)

    def prefill(self, ids: Sequence[int]) -> tuple[np.ndarray, int]:
        """Bring the engine's sequence to ``ids``, evaluating only what no cache holds.

        The active cache's common prefix is reused; a snapshot in the prefix LRU that shares a longer
        one replaces it (the active sequence is snapshotted first when that keeps much). Returns the
        last position's logits and how many tokens were actually evaluated.
        """
        ids = list(ids)
        if len(ids) == 0:
            raise LlmedgeError("the prompt is empty")
        if len(ids) > self.n_ctx:
            raise LlmedgeError(f"the prompt has {len(ids)} tokens, more than the context of {self.n_ctx}")
        limit = len(ids) - 1  # always evaluate at least the last token for its logits
        held = self.cache.tokens
        common = self._usable(self.cache, min(common_prefix(held, ids), limit))
        key, other = self.prefix_cache.best(ids)
        if key is not None and min(other, limit) > common:
            state = self.prefix_cache.entries[key]
            n = min(other, limit)
            if self.cache.can_resume(state, n):
                self.prefix_cache.pop(key)  # before stashing: the stash may evict or supersede it
                self._stash(common)
                self.cache.load_state(state)
                common = n
        if common < len(held):
            self._stash(common)
        if not self.cache.trim_to(common):
            common = 0
        todo = ids[common:]
        return self.forward(self.cache, todo)[-1], len(todo)

    def _usable(self, cache: SequenceCache, n: int) -> int:
        return n if cache.can_trim_to(n) else 0

    def _stash(self, keep: int) -> None:
        """Snapshot the active sequence into the prefix LRU when trimming it to ``keep`` tokens loses much."""
        if self.cache.offset - keep >= MIN_STASH_TOKENS and self.cache.offset >= MIN_STASH_TOKENS:
            self.prefix_cache.add(self.cache.state())

    def shift_context(self, n_keep: int) -> int:
        """Make room in the full active sequence: keep the first ``n_keep`` tokens, drop half of the rest,
        move the others back (re-rotating their keys). Returns how many tokens were dropped."""
        cache = self.cache
        n = cache.offset
        n_keep = max(0, min(n_keep, n - 2))
        n_discard = max(1, (n - n_keep) // 2)
        if not cache.shift(n_keep, n_discard, self.model.backend):
            # a sliding-window ring no longer holds what would come back into view: evaluate the kept
            # tokens again at their new positions
            kept = cache.tokens[:n_keep] + cache.tokens[n_keep + n_discard :]
            cache.clear()
            self.forward(cache, kept)
        self.n_shifts += 1
        return n_discard

    def truncate_prompt(self, ids: list[int], n_keep: int) -> list[int]:
        """A prompt longer than the context with whole blocks of half the free space dropped after the
        first ``n_keep`` tokens (llama.cpp server's rule), so that it fits with room to generate."""
        if len(ids) <= self.n_ctx:
            return ids
        n_keep = max(0, min(n_keep, self.n_ctx // 2))
        block = max(1, (self.n_ctx - n_keep) // 2)
        erased = (len(ids) - n_keep - block) // block
        return ids[:n_keep] + ids[n_keep + erased * block :]

    def default_keep(self, ids: Sequence[int]) -> int:
        """``n_keep`` when the request sets none: the BOS token if the prompt starts with it."""
        bos = self.tokenizer.bos_id
        return 1 if ids and bos is not None and ids[0] == bos else 0

    # -- generation ------------------------------------------------------------------------------
    def generate(self, ids: Sequence[int], sampler: Sampler, max_tokens: int = 128, stop: Sequence[str] = (),
                 shift: bool = True, n_keep: int | None = None) -> Iterator[Chunk]:
        """Stream tokens after the prompt ``ids``; timings land in ``self.last`` when done.

        A full context is shifted (``n_keep`` tokens kept, default: BOS if present) unless ``shift``
        is False, in which case generation stops with done_reason ``length``.
        """
        t0 = time.perf_counter_ns()
        timings = Timings(load_duration=self.load_duration)
        self.last = timings
        ids = list(ids)
        if n_keep is None or n_keep < 0:
            n_keep = self.default_keep(ids)
        n_keep = min(n_keep, len(ids))
        shifts0 = self.n_shifts
        prompt = self.truncate_prompt(ids, n_keep) if shift else ids
        logits, n_eval = self.prefill(prompt)
        t1 = time.perf_counter_ns()
        timings.prompt_eval_count, timings.prompt_eval_duration = n_eval, t1 - t0
        timings.extra["prompt_cached"] = len(prompt) - n_eval
        decoder = self.tokenizer.stream_decoder()
        stops = [s for s in stop if s]
        pending = ""
        history = list(ids)
        n_gen = 0
        reason = "length"
        while max_tokens < 0 or n_gen < max_tokens:
            token = sampler.sample(logits[-1] if logits.ndim == 2 else logits, history)
            n_gen += 1
            history.append(token)
            if self.tokenizer.is_eog(token):
                reason = "stop"
                yield Chunk(token, pending + decoder.flush(), reason)
                pending = ""
                break
            pending += decoder.push(token)
            hit = _find_stop(pending, stops)
            if hit is not None:
                reason = "stop"
                yield Chunk(token, pending[:hit], reason)
                pending = ""
                break
            emit = len(pending) - _held_back(pending, stops)
            text, pending = pending[:emit], pending[emit:]
            at_budget = max_tokens >= 0 and n_gen >= max_tokens
            if at_budget or (self.cache.offset >= self.n_ctx and not shift):
                reason = "length"
                yield Chunk(token, text + pending + decoder.flush(), reason)
                pending = ""
                break
            yield Chunk(token, text)
            if self.cache.offset >= self.n_ctx:
                self.shift_context(n_keep)
            logits = self.forward(self.cache, [token])
        timings.eval_count = n_gen
        timings.extra["context_shifts"] = self.n_shifts - shifts0
        t2 = time.perf_counter_ns()
        timings.eval_duration = t2 - t1
        timings.total_duration = t2 - t0 + self.load_duration
        timings.done_reason = reason

    # -- state files -----------------------------------------------------------------------------
    def save_state(self, path: str | Path, model_digest: str, architecture: str,
                   extra: dict[str, Any] | None = None) -> int:
        """Write the active sequence (tokens and cache) to ``path``; returns the bytes written."""
        from llmedge.state import write_state

        return write_state(path, self.cache.state(), model_digest, architecture, extra)

    def load_state(self, path: str | Path, model_digest: str) -> dict[str, Any]:
        """Replace the active sequence by the one saved in ``path``; returns the saved ``extra``.

        Any problem (another model, a truncated or corrupted file, a context too small) raises a
        one-line LlmedgeError and leaves the active sequence as it was.
        """
        from llmedge.state import read_state

        state, extra = read_state(path, model_digest)
        if len(state.tokens) > self.n_ctx:
            raise LlmedgeError(f"{path}: the saved sequence has {len(state.tokens)} tokens, more than this "
                               f"context of {self.n_ctx}")
        n_vocab = self.model.params.n_vocab
        if any(not 0 <= t < n_vocab for t in state.tokens):
            raise LlmedgeError(f"{path}: the saved tokens do not fit this model's vocabulary of {n_vocab}")
        why = self.cache.check_state(state)
        if why:
            raise LlmedgeError(f"{path}: the saved KV state does not fit this model: {why}")
        self._stash(0)
        self.cache.load_state(state)
        return extra


def _find_stop(text: str, stops: Sequence[str]) -> int | None:
    """Index where the earliest stop string starts in ``text``, if any."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None


def _held_back(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that could still grow into a stop string."""
    best = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if s.startswith(text[-n:]):
                best = n
                break
    return best
