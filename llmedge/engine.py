"""The engine: runs a model over one or many sequences, reusing cached prefixes, and streams sampled tokens.

It owns the active sequence's KV cache, the sequence slots of a server (:class:`SlotPool`: one cache
each, allocated lazily) and a small LRU of recent sequences' cache snapshots (within a byte budget)
for prefix reuse. A :class:`Generation` is one sequence's request as a step-by-step state machine
(prompt still to evaluate, sampler, stream decoder, stop strings and held-back text, token budget,
context shift, done reason, timings in Ollama's terms). :meth:`Engine.step` advances several
generations with one batched forward (continuous batching: every decoding sequence's last token
plus chunks of waiting prompts, each weight read once for all rows); :meth:`Engine.generate` is the
single-sequence loop over the same machinery that the CLI and the Python API use. Prompts are
evaluated in chunks of ``n_batch`` tokens; a full context is shifted (keep ``n_keep`` tokens, drop
half of the rest, re-rotate the kept keys) or ends with ``length`` when shifting is off; sequence
states can be saved and loaded.
"""

from __future__ import annotations

import threading
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
from llmedge.speculative import SpecConfig, Speculation
from llmedge.tokenizer import Tokenizer

DEFAULT_PREFIX_CACHE_BYTES = 256 << 20  # snapshots of recent sequences kept for prefix reuse
PREFIX_CACHE_ENTRIES = 4
MIN_STASH_TOKENS = 16  # a sequence losing fewer cached tokens than this is not worth a snapshot
# Speculation (a draft's verify rows) runs only in a step of at most this many sequences. Batching and
# speculation sell the same thing, more tokens per weight read: with one sequence the weights are
# read for one row and the draft's rows ride along almost free, but once several sequences share a
# step their decode rows already fill the multi-row kernels, so verify rows cost nearly their full
# compute and a rejected draft is lost work (llama.cpp's server measured 1.10x at 1 slot, 0.86x at
# 4). Measured here (smollm2:135m, 4 sequences of 96 greedy tokens, prompt lookup n=3, CPU time of one
# thread): drafting in 4-sequence steps gave 0.86-0.92x the rate of not speculating, this rule
# 1.00-1.13x (the same work as plain decoding while batched); benchmarks/server_concurrency.py
# --lookup measures it end to end. Alone, a sequence speculates as before.
SPECULATE_MAX_SEQUENCES = 1
# One model evaluation at a time in this process: the native kernels' thread pool is process-wide and
# runs one job at a time, and a sequence's cache and the prefix LRU are plain Python objects. Held
# around every forward and every step of :meth:`Engine.generate` (never while a chunk is yielded), so
# models used from several threads take turns instead of racing.
RUN_LOCK = threading.RLock()


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

    def touch(self, tokens: Sequence[int]) -> bool:
        """Mark the snapshot of exactly ``tokens`` most recently used; False when there is none. A sequence
        trimmed again after the same tokens (a repeated or regenerated request) then costs no second copy
        of its cells. Only the same tokens count: a longer snapshot's ring layers (sliding windows) may no
        longer hold the cells a resume inside it needs."""
        want = list(tokens)
        for key, st in reversed(self.entries.items()):
            if st.tokens == want:
                self.entries.move_to_end(key)
                return True
        return False

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


class Generation:
    """One request's sequence, advanced step by step by :meth:`Engine.step`.

    Created by :meth:`Engine.begin`: the prompt is truncated to the context when shifting is on (keeping
    ``n_keep`` tokens), the cache's reusable prefix is kept and the rest of the prompt waits in ``todo``.
    Each step feeds either a chunk of ``todo`` or, once the prompt is evaluated, the last sampled token;
    :meth:`advance` then samples from the last row's logits and returns the chunk to emit (text held
    back while it could still grow into a stop string). ``done`` is set with ``timings.done_reason``
    ("stop" or "length") on the last chunk, or with ``error`` when sampling failed.
    """

    def __init__(self, engine: Engine, cache: SequenceCache, ids: Sequence[int], sampler: Sampler,
                 max_tokens: int = 128, stop: Sequence[str] = (), shift: bool = True,
                 n_keep: int | None = None, spec: SpecConfig | None = None) -> None:
        self.t0 = time.perf_counter_ns()
        self.engine = engine
        self.cache = cache
        self.sampler = sampler
        # at most ten contexts, Ollama's upper limit (llm/server.go, "to avoid the model running on
        # forever"): while the context shifts, a text that never ends would be generated for ever
        limit = 10 * engine.n_ctx
        self.max_tokens = limit if max_tokens < 0 or max_tokens > limit else max_tokens
        self.shift = shift
        self.timings = Timings(load_duration=engine.load_duration)
        ids = list(ids)
        if n_keep is None or n_keep < 0:
            n_keep = engine.default_keep(ids)
        self.n_keep = min(n_keep, len(ids))
        prompt = engine.truncate_prompt(ids, self.n_keep) if shift else ids
        engine._check_prompt(prompt)
        self.todo = prompt[engine.reuse_prefix(cache, prompt) :]
        self.timings.prompt_eval_count = len(self.todo)
        self.timings.extra["prompt_cached"] = len(prompt) - len(self.todo)
        self.t1 = 0
        self.decoder = engine.tokenizer.stream_decoder()
        self.stops = [s for s in stop if s]
        self.pending = ""
        self.history = list(ids)
        self.n_gen = 0
        self.n_shifts = 0
        self.next_token: int | None = None
        self.forced: list[int] = []  # tokens a grammar forced after next_token, evaluated with it
        self.done = False
        self.error: BaseException | None = None
        # speculation needs a sampler whose state is only the history (no grammar to roll back)
        usable = spec is not None and spec.active and getattr(sampler, "speculative", False)
        self.spec: Speculation | None = Speculation(spec, cache) if usable else None
        self.draft: list[int] = []  # the draft evaluated with next_token in the current step
        self.t_step: float | None = None

    @property
    def decoding(self) -> bool:
        """True once the prompt is evaluated: each step feeds one sampled token."""
        return not self.todo

    def next_rows(self, limit: int, speculate: bool = True) -> list[int]:
        """The tokens to evaluate in the next step: a chunk of the prompt (at most ``limit``, and at
        most ``n_batch``), or the last sampled token (after shifting a full context) and, when
        ``speculate``, a draft to verify with it."""
        if self.todo:
            return self.todo[: max(1, min(limit, self.engine.n_batch))]
        assert self.next_token is not None, "a finished generation has nothing to evaluate"
        if self.cache.offset >= self.engine.n_ctx:
            self.engine.shift_context(self.n_keep, self.cache)
            self.n_shifts += 1
        rows = [self.next_token, *self.forced]
        self.draft = []
        if self.spec is not None and not speculate:
            self.spec.batched += 1
        elif self.spec is not None and not self.forced:
            room = self.engine.n_ctx - self.cache.offset - 1
            if self.max_tokens >= 0:
                room = min(room, self.max_tokens - self.n_gen - 1)
            context = self.history if self.spec.config.draft is None else [*self.cache.tokens, self.next_token]
            self.t_step = time.perf_counter()  # the step's cost, drafting included, for the draft length
            self.draft = self.spec.propose(context, room)
            rows += self.draft
        return rows

    def advance_draft(self, logits: np.ndarray) -> list[Chunk]:
        """Take tokens from the verify rows' ``logits`` ([1 + len(draft), n_vocab]: after next_token
        and after each draft token): each draft token while the sampler accepts it, then the
        correction (or, all accepted, one more token from the last row). The cells of the rejected
        draft tokens are rolled back; the last token taken is evaluated next."""
        draft, chunks, n_acc = self.draft, [], 0
        token = -1
        for i in range(len(draft) + 1):
            if i < len(draft):
                token = self.sampler.verify(logits[i], self.history, draft[i])
            else:
                token = self.sampler.sample(logits[i], self.history)
            chunks.append(self._take(token, last=True))
            if self.done or i == len(draft) or token != draft[i]:
                break
            n_acc += 1
        self.cache.rollback(len(draft) - n_acc)
        assert self.spec is not None
        self.spec.record(len(draft), n_acc, self._step_seconds())
        self.timings.extra.update(self.spec.stats())
        self.draft = []
        self.next_token, self.forced = (token, []) if not self.done else (None, [])
        return chunks

    def _step_seconds(self) -> float | None:
        """Seconds since this step's drafting began (None when the step was not timed: the prompt)."""
        t, self.t_step = self.t_step, None
        return None if t is None else time.perf_counter() - t

    def advance(self, n_fed: int, logits: np.ndarray) -> list[Chunk]:
        """Account for ``n_fed`` evaluated tokens whose last row gave ``logits``; sample when the prompt
        is done, then take the tokens the sampler's grammar forces (if it offers ``forced``). Returns the
        chunks to emit (none while the prompt is evaluated, one per generated token otherwise)."""
        if self.todo:
            del self.todo[:n_fed]
            if self.todo:
                return []
            if self.spec is not None:  # a draft model reads the prompt too (prompt time, as llama.cpp)
                self.spec.prefill(self.cache.tokens)
            self.t1 = time.perf_counter_ns()
            self.timings.prompt_eval_duration = self.t1 - self.t0
            if self.max_tokens == 0:  # only the prompt was asked for
                self._finish(Chunk(-1, "", "length"))
                return []
        token = self.sampler.sample(logits, self.history)
        if self.spec is not None:
            self.spec.record(0, 0, self._step_seconds())
            self.timings.extra.update(self.spec.stats())
        tokens = [token]
        forced = getattr(self.sampler, "forced", None)  # a grammar's forced tokens: one forward for all
        if forced is not None:
            room = self.engine.n_ctx - self.cache.offset - 1
            left = self.max_tokens - self.n_gen - 1 if self.max_tokens >= 0 else room
            tokens += forced(max(0, min(room, left)))
        chunks = []
        for i, token in enumerate(tokens):
            chunk = self._take(token, last=i == len(tokens) - 1)
            chunks.append(chunk)
            if self.done:
                break
        self.next_token, self.forced = (tokens[0], tokens[1:]) if not self.done else (None, [])
        return chunks

    def _take(self, token: int, last: bool) -> Chunk:
        """Account for one generated token; the chunk to emit (the last one when it ends the sequence)."""
        self.n_gen += 1
        self.history.append(token)
        tok = self.engine.tokenizer
        if tok.is_eog(token):
            return self._finish(Chunk(token, self.pending + self.decoder.flush(), "stop"))
        self.pending += self.decoder.push(token)
        hit = _find_stop(self.pending, self.stops)
        if hit is not None:
            return self._finish(Chunk(token, self.pending[:hit], "stop"))
        if last and getattr(self.sampler, "finished", False):  # a complete grammar allows only the end
            return self._finish(Chunk(token, self.pending + self.decoder.flush(), "stop"))
        emit = len(self.pending) - _held_back(self.pending, self.stops)
        text, self.pending = self.pending[:emit], self.pending[emit:]
        at_budget = self.max_tokens >= 0 and self.n_gen >= self.max_tokens
        if at_budget or (self.cache.offset >= self.engine.n_ctx and not self.shift):
            return self._finish(Chunk(token, text + self.pending + self.decoder.flush(), "length"))
        return Chunk(token, text)

    def _finish(self, chunk: Chunk) -> Chunk:
        self.pending = ""
        self.next_token = None
        self.done = True
        t = self.timings
        t.eval_count = self.n_gen
        t.extra["context_shifts"] = self.n_shifts
        t2 = time.perf_counter_ns()
        t.eval_duration = t2 - self.t1
        t.total_duration = t2 - self.t0 + t.load_duration
        t.done_reason = chunk.done_reason or "stop"
        return chunk

    def fail(self, error: BaseException) -> None:
        """End this generation with ``error`` (its sampler could not go on)."""
        self.done = True
        self.error = error
        self.next_token = None


class SlotPool:
    """A server's sequence slots for one engine: ``n`` caches (slot 0 is the engine's active sequence,
    the others are allocated on first use), each kept after its request for prefix reuse.

    :meth:`acquire` picks the free slot whose cache shares the longest prefix with the new prompt
    (an empty or never used one on a tie, else the least recently used), so a follow-up request of a
    conversation continues in the cells its earlier turn left."""

    def __init__(self, engine: Engine, n: int) -> None:
        self.engine = engine
        self.caches: list[SequenceCache | None] = [None] * max(1, n)
        self.busy = [False] * len(self.caches)
        self.used = [0] * len(self.caches)
        self._clock = 0

    def __len__(self) -> int:
        return len(self.caches)

    @property
    def n_busy(self) -> int:
        return sum(self.busy)

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.caches if c is not None)

    def cache(self, i: int) -> SequenceCache:
        c = self.caches[i]
        if c is None:
            c = self.caches[i] = self.engine.cache if i == 0 else self.engine.new_cache()
        return c

    def acquire(self, ids: Sequence[int]) -> int | None:
        """Claim the best free slot for a prompt ``ids``; None when every slot is busy."""
        best, best_key = None, None
        for i, c in enumerate(self.caches):
            if self.busy[i]:
                continue
            held = c.tokens if c is not None else []
            n = common_prefix(held, ids) if held else 0
            key = (n, not held, -self.used[i])
            if best_key is None or key > best_key:
                best, best_key = i, key
        if best is not None:
            self.busy[best] = True
            self._clock += 1
            self.used[best] = self._clock
        return best

    def release(self, i: int) -> None:
        self.busy[i] = False


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
        self.slots: SlotPool | None = None  # a server's sequence slots (slot 0 is ``cache``)
        self._streaming: set[int] = set()  # ids of the caches an unfinished generate() streams in
        self._spare: list[SequenceCache] = []  # caches of generate() calls that overlapped another

    def slot_pool(self, n: int) -> SlotPool:
        """The server's ``n`` sequence slots (made on first use, or again when ``n`` changes while idle)."""
        if self.slots is None or (len(self.slots) != max(1, n) and not self.slots.n_busy):
            self.slots = SlotPool(self, n)
        return self.slots

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
            "slots": len(self.slots) if self.slots is not None else 1,
            "slot_bytes": self.slots.nbytes if self.slots is not None else self.cache.nbytes,
            "prefix_cache_bytes": self.prefix_cache.nbytes,
            "prefix_cache_entries": len(self.prefix_cache),
            "prefix_cache_budget": self.prefix_cache.budget_bytes,
        }

    # -- evaluation ------------------------------------------------------------------------------
    def forward(self, cache: SequenceCache, ids: Sequence[int], all_logits: bool = False,
                first_row: int = 0) -> np.ndarray:
        """Evaluate ``ids`` after what ``cache`` holds; logits of every row from ``first_row`` on
        (``all_logits``) or of the last one only. Rows before ``first_row`` still extend the cache,
        but the output head (a large share of a prompt's work on big vocabularies) skips them."""
        with RUN_LOCK:
            return self._forward(cache, ids, all_logits, first_row)

    def _check_ids(self, ids: Sequence[int]) -> None:
        """Every id names a token of the model's vocabulary."""
        n_vocab = self.model.params.n_vocab
        for t in ids:
            if not 0 <= t < n_vocab:
                raise LlmedgeError(f"token id {t} is out of range for a vocabulary of {n_vocab}")

    def _forward(self, cache: SequenceCache, ids: Sequence[int], all_logits: bool, first_row: int) -> np.ndarray:
        self._check_ids(ids)
        n_vocab = self.model.params.n_vocab
        if all_logits and ids and not 0 <= first_row < len(ids):
            raise LlmedgeError(f"first_row {first_row} is outside the {len(ids)} positions evaluated")
        first_row = first_row if all_logits else 0
        # every row's logits are written into one array as the chunks come (no second copy at the end)
        out = np.empty((len(ids) - first_row if all_logits else min(len(ids), 1), n_vocab), dtype=np.float32)
        for start in range(0, len(ids), self.n_batch):
            chunk = np.asarray(ids[start : start + self.n_batch], dtype=np.int64)
            pos = np.arange(cache.offset, cache.offset + len(chunk), dtype=np.int64)
            last_chunk = start + self.n_batch >= len(ids)
            skip = first_row - start  # rows of this chunk before first_row
            if not all_logits or skip >= len(chunk):
                rows = np.array([len(chunk) - 1])
            else:
                rows = None if skip <= 0 else np.arange(skip, len(chunk))
            try:
                logits = self.model.forward(Batch(chunk, pos, cache, rows))
            except BaseException:
                forget_unrecorded(cache)
                raise
            cache.tokens.extend(int(t) for t in chunk)
            self.n_evaluated += len(chunk)
            if all_logits and skip < len(chunk):
                out[max(start - first_row, 0) : start + len(chunk) - first_row] = logits
            elif not all_logits and last_chunk:
                out[:] = logits
        return out

    def forward_parallel(self, caches: Sequence[SequenceCache], ids: Sequence[int]) -> np.ndarray:
        """One decode step of several sequences: ``ids[i]`` evaluated after what ``caches[i]`` holds, in
        one batched forward (every weight read once for all of them), each row's numbers what they would be
        decoded alone, as :meth:`step` batches decoding generations. Logits ``[len(ids), n_vocab]``."""
        if len(caches) != len(ids) or not ids:
            raise LlmedgeError(f"{len(ids)} token ids for {len(caches)} sequences: give one id per sequence")
        if len({id(c) for c in caches}) != len(caches):
            raise LlmedgeError("a sequence's cache appears twice: each row needs a cache of its own")
        self._check_ids(ids)
        exact = len(ids) > 1 and getattr(self.model, "row_exact_batches", False)
        batches = [Batch(np.array([t], dtype=np.int64), np.array([c.offset], dtype=np.int64), c, np.array([0]),
                         row_exact=exact) for c, t in zip(caches, ids)]
        with RUN_LOCK:
            try:
                logits = self._forward_batches(batches)
            except BaseException:
                for c in caches:
                    forget_unrecorded(c)
                raise
            for c, t in zip(caches, ids):
                c.tokens.append(int(t))
            self.n_evaluated += len(ids)
        return np.concatenate(logits)

    def logits(self, ids: Sequence[int], first_row: int = 0) -> np.ndarray:
        """Logits at every position of ``ids`` from ``first_row`` on, in a fresh context (nothing
        cached is reused)."""
        if not ids:
            return np.empty((0, self.model.params.n_vocab), dtype=np.float32)
        cache = self.new_cache(max(len(ids), 1))
        return self.forward(cache, ids, all_logits=True, first_row=first_row)

    def prefill(self, ids: Sequence[int]) -> tuple[np.ndarray, int]:
        """Bring the engine's sequence to ``ids``, evaluating only what no cache holds.

        The active cache's common prefix is reused; a snapshot in the prefix LRU that shares a longer
        one replaces it (the active sequence is snapshotted first when that keeps much). Returns the
        last position's logits and how many tokens were actually evaluated.
        """
        ids = list(ids)
        self._check_prompt(ids)
        todo = ids[self.reuse_prefix(self.cache, ids) :]
        return self.forward(self.cache, todo)[-1], len(todo)

    def _check_prompt(self, ids: Sequence[int], n_ctx: int | None = None) -> None:
        n_ctx = n_ctx or self.n_ctx
        if len(ids) == 0:
            raise LlmedgeError("the prompt is empty")
        if len(ids) > n_ctx:
            raise LlmedgeError(f"the prompt has {len(ids)} tokens, more than the context of {n_ctx}")
        self._check_ids(ids)

    def reuse_prefix(self, cache: SequenceCache, ids: Sequence[int]) -> int:
        """Prepare ``cache`` to evaluate ``ids``: keep its longest usable common prefix, or load a longer
        one from the prefix LRU (snapshotting what ``cache`` held first when trimming loses much).
        Returns how many leading tokens of ``ids`` the cache now holds (at most ``len(ids) - 1``: the
        last token is always evaluated, for its logits)."""
        limit = len(ids) - 1
        held = cache.tokens
        common = self._usable(cache, min(common_prefix(held, ids), limit))
        key, other = self.prefix_cache.best(ids)
        if key is not None and min(other, limit) > common:
            state = self.prefix_cache.entries[key]
            n = min(other, limit)
            if cache.can_resume(state, n):
                self.prefix_cache.pop(key)  # before stashing: the stash may evict or supersede it
                self._stash(common, cache)
                cache.load_state(state)
                common = n
        if common < len(held):
            self._stash(common, cache)
        if not cache.trim_to(common):
            common = 0
        return common

    def _usable(self, cache: SequenceCache, n: int) -> int:
        return n if cache.can_trim_to(n) else 0

    def _stash(self, keep: int, cache: SequenceCache | None = None) -> None:
        """Snapshot a sequence into the prefix LRU when trimming it to ``keep`` tokens loses much."""
        cache = cache if cache is not None else self.cache
        if cache.offset - keep >= MIN_STASH_TOKENS and cache.offset >= MIN_STASH_TOKENS and \
                not self.prefix_cache.touch(cache.tokens):
            self.prefix_cache.add(cache.state())

    def shift_context(self, n_keep: int, cache: SequenceCache | None = None) -> int:
        """Make room in a full sequence (default: the active one): keep the first ``n_keep`` tokens, drop
        half of the rest, move the others back (re-rotating their keys). Returns how many were dropped."""
        cache = cache if cache is not None else self.cache
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
    def begin(self, ids: Sequence[int], sampler: Sampler, max_tokens: int = 128, stop: Sequence[str] = (),
              shift: bool = True, n_keep: int | None = None, cache: SequenceCache | None = None,
              spec: SpecConfig | None = None) -> Generation:
        """A :class:`Generation` of ``ids`` in ``cache`` (default: the active sequence), its cached prefix
        already reused; nothing is evaluated until :meth:`step`. ``spec``: speculative decoding."""
        return Generation(self, cache if cache is not None else self.cache, ids, sampler, max_tokens, stop,
                          shift, n_keep, spec)

    def step(self, gens: Sequence[Generation], prompt_rows: int | None = None,
             speculate: bool = True) -> list[list[Chunk]]:
        """Advance every unfinished generation in ``gens`` by one step: one batched forward over each
        decoding one's last sampled token (every weight read once for all of them), and the next prompt
        chunk (``n_batch`` tokens or the rest) of the others, in order, while they fit in ``prompt_rows``
        (default ``n_batch``; the first one always). Generations with speculation draft only when the
        step has at most :data:`SPECULATE_MAX_SEQUENCES` unfinished sequences, and ``speculate`` (a server
        passes False while a request waits to join: it would wait for the verify rows). Returns, per generation,
        the chunks it produced (none while its prompt is still being evaluated, at most one otherwise). A sampling error ends
        only its own generation (``error`` set); an error of the forward itself is raised.

        Each prompt chunk is its own forward, apart from the decoding rows: the kernels a matrix product
        picks depend on its row count, so this keeps every request's numbers what they would be alone
        (fixed chunk boundaries; decode rows only ever batched with other decode rows, row-exact when
        there are several: each row multiplied as a one-row decode, bit for bit). A prompt chunk of one
        token (a prompt whose cached prefix leaves one token, as a server's repeated or continued
        conversations do) is a one-row forward alone, so it joins the decoding rows: four such requests
        arriving together take one step, not four."""
        budget = self.n_batch if prompt_rows is None else max(1, prompt_rows)
        out: list[list[Chunk]] = [[] for _ in gens]
        decode: list[tuple[int, Generation, list[int]]] = []
        prompts: list[tuple[int, Generation, list[int]]] = []
        speculate = speculate and sum(not g.done for g in gens) <= SPECULATE_MAX_SEQUENCES
        for i, g in enumerate(gens):
            if g.done:
                continue
            if g.decoding or len(g.todo) == 1:  # a one-token prompt chunk: a one-row forward, as a decode row
                decode.append((i, g, g.next_rows(1, speculate)))
                continue
            n = min(len(g.todo), self.n_batch)
            if prompts and n > budget:
                continue
            prompts.append((i, g, g.next_rows(n)))
            budget -= n
        # several sequences' decode rows: each multiplied exactly as alone where the backend has that
        # path (the native stack's multi-row decode kernels); elsewhere as one batched forward
        exact = len(decode) > 1 and getattr(self.model, "row_exact_batches", False)
        for group in ([decode] if decode else []) + [[p] for p in prompts]:
            batches = []
            for _, g, rows in group:
                pos = np.arange(g.cache.offset, g.cache.offset + len(rows), dtype=np.int64)
                # only the last row's logits matter (and only for a prompt's last chunk: an earlier
                # chunk's last row is cheap and keeps every batch with one output row); a draft's
                # verify rows all matter, each exactly as if decoded alone
                if g.draft:
                    batches.append(Batch(np.asarray(rows, dtype=np.int64), pos, g.cache, None, row_exact=True))
                else:
                    batches.append(Batch(np.asarray(rows, dtype=np.int64), pos, g.cache, np.array([len(rows) - 1]),
                                         row_exact=exact and group is decode))
            try:
                logits = self._forward_batches(batches)
            except BaseException:
                for _, g, _ in group:
                    forget_unrecorded(g.cache)
                raise
            for (i, g, rows), lg in zip(group, logits):
                g.cache.tokens.extend(int(t) for t in rows)
                self.n_evaluated += len(rows)
                try:
                    out[i] = g.advance_draft(lg) if g.draft else g.advance(len(rows), lg[-1])
                except Exception as e:  # this request's sampler failed (a grammar with no way on, ...)
                    g.fail(e)
        return out

    def _forward_batches(self, batches: list[Batch]) -> list[np.ndarray]:
        """One forward over ``batches``; row-exact ones on a backend without a row-exact multi-row
        path run their rows one at a time (each then is a one-row decode)."""
        with RUN_LOCK:
            return self._forward_batches_locked(batches)

    def _forward_batches_locked(self, batches: list[Batch]) -> list[np.ndarray]:
        model = self.model
        if any(b.row_exact for b in batches) and not getattr(model, "row_exact_batches", False):
            out = []
            for b in batches:
                if not b.row_exact:
                    out.append(model.forward(b))
                    continue
                rows = [model.forward(Batch(b.tokens[r : r + 1], b.positions[r : r + 1], b.cache))
                        for r in range(len(b.tokens))]
                out.append(np.concatenate(rows))
            return out
        return [model.forward(batches[0])] if len(batches) == 1 else model.forward_many(batches)

    def generate(self, ids: Sequence[int], sampler: Sampler, max_tokens: int = 128, stop: Sequence[str] = (),
                 shift: bool = True, n_keep: int | None = None, spec: SpecConfig | None = None) -> Iterator[Chunk]:
        """Stream tokens after the prompt ``ids``; timings land in ``self.last`` when done.

        A full context is shifted (``n_keep`` tokens kept, default: BOS if present) unless ``shift``
        is False, in which case generation stops with done_reason ``length``. ``spec``: speculative
        decoding (prompt lookup and/or a draft model), exact at temperature 0.

        Several may stream at once (iterators interleaved, or threads): the first streams in the
        active sequence, each one overlapping it in a cache of its own, and their steps take turns
        (:data:`RUN_LOCK`), so every stream gets the tokens it would get alone.
        """
        with RUN_LOCK:
            cache = self._claim_cache()
            try:
                gen = self.begin(ids, sampler, max_tokens, stop, shift, n_keep, cache=cache, spec=spec)
            except BaseException:
                self._release_cache(cache)
                raise
            self.last = gen.timings
        try:
            while not gen.done:
                with RUN_LOCK:
                    (chunks,) = self.step([gen])
                if gen.error is not None:
                    raise gen.error
                yield from chunks
        finally:  # also when the iterator is closed or dropped unfinished
            with RUN_LOCK:
                self._release_cache(cache)

    def _claim_cache(self) -> SequenceCache:
        """The active sequence's cache for a new generate() or, while another unfinished generate()
        streams in it, a spare one (kept for the next overlap once its generation ends)."""
        cache = self.cache
        if id(cache) in self._streaming:
            cache = self._spare.pop() if self._spare else self.new_cache()
        self._streaming.add(id(cache))
        return cache

    def _release_cache(self, cache: SequenceCache) -> None:
        self._streaming.discard(id(cache))
        if cache is not self.cache:
            self._spare.append(cache)

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


def forget_unrecorded(cache: SequenceCache) -> None:
    """After a forward that did not return (an exception, Ctrl-C): forget the K/V cells it may have
    written past the tokens ``cache`` records, which the next forward would write again beside them
    (two cells at one position: every later token read a duplicated key). Clears the cache when a
    ring layer no longer holds what the recorded tokens need."""
    n = len(cache.tokens)
    if all(layer.can_trim_to(n) for layer in cache.layers):
        for layer in cache.layers:
            layer.trim_to(n)
    else:
        cache.clear()


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
