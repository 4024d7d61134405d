"""The engine: runs a model over a sequence, reusing its cached prefix, and streams sampled tokens.

It owns the sequence cache, evaluates prompts in chunks of ``n_batch`` tokens, samples with a
per-request :class:`~llmedge.sampling.Sampler`, stops on end-of-generation tokens, stop strings, the
token budget or a full context, and reports timings in Ollama's terms. This first cut drives one
sequence at a time; the CLI, the API and (later) the server all go through it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from llmedge.errors import LlmedgeError
from llmedge.kvcache import SequenceCache
from llmedge.models.base import Batch
from llmedge.sampling import Sampler
from llmedge.tokenizer import Tokenizer


@dataclass
class Chunk:
    """One generated token and the text it completes ("" while text is held back)."""

    token: int
    text: str
    done_reason: str | None = None  # set on the last chunk: "stop" or "length"


@dataclass
class Timings:
    """Ollama's timing fields, in nanoseconds."""

    load_duration: int = 0
    prompt_eval_count: int = 0
    prompt_eval_duration: int = 0
    eval_count: int = 0
    eval_duration: int = 0
    total_duration: int = 0
    done_reason: str = ""
    extra: dict[str, float] = field(default_factory=dict)


class Engine:
    """Drives one model's sequence: prefix reuse, chunked prefill, sampling, stopping, timings."""

    def __init__(self, model, tokenizer: Tokenizer, n_ctx: int, n_batch: int = 512, kv_type: str = "f16",
                 load_duration: int = 0) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.n_ctx = n_ctx
        self.n_batch = n_batch
        self.kv_type = kv_type
        self.cache: SequenceCache = model.make_cache(n_ctx, kv_type, n_batch)
        self.load_duration = load_duration
        self.last = Timings()

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
            if all_logits or last_chunk:
                out.append(logits)
        return np.concatenate(out, axis=0) if out else np.empty((0, n_vocab), dtype=np.float32)

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """Logits at every position of ``ids`` in a fresh context (nothing cached is reused)."""
        if not ids:
            return np.empty((0, self.model.params.n_vocab), dtype=np.float32)
        cache = self.model.make_cache(max(len(ids), 1), self.kv_type, self.n_batch)
        return self.forward(cache, ids, all_logits=True)

    def prefill(self, ids: Sequence[int]) -> tuple[np.ndarray, int]:
        """Bring the engine's sequence to ``ids``, evaluating only what its cache lacks.

        Returns the last position's logits and how many tokens were actually evaluated.
        """
        if len(ids) == 0:
            raise LlmedgeError("the prompt is empty")
        if len(ids) >= self.n_ctx:
            raise LlmedgeError(f"the prompt has {len(ids)} tokens, more than the context of {self.n_ctx}")
        held = self.cache.tokens
        common = 0
        for a, b in zip(held, ids):
            if a != b:
                break
            common += 1
        common = min(common, len(ids) - 1)  # always evaluate at least the last token for its logits
        if not self.cache.trim_to(common):
            common = 0
        todo = ids[common:]
        return self.forward(self.cache, todo)[-1], len(todo)

    # -- generation ------------------------------------------------------------------------------
    def generate(self, ids: Sequence[int], sampler: Sampler, max_tokens: int = 128,
                 stop: Sequence[str] = ()) -> Iterator[Chunk]:
        """Stream tokens after the prompt ``ids``; timings land in ``self.last`` when done."""
        t0 = time.perf_counter_ns()
        timings = Timings(load_duration=self.load_duration)
        self.last = timings
        logits, n_eval = self.prefill(list(ids))
        t1 = time.perf_counter_ns()
        timings.prompt_eval_count, timings.prompt_eval_duration = n_eval, t1 - t0
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
            if self.cache.offset + 1 >= self.n_ctx:
                reason = "length"
                yield Chunk(token, text + pending + decoder.flush(), reason)
                pending = ""
                break
            at_budget = max_tokens >= 0 and n_gen >= max_tokens
            if at_budget:
                yield Chunk(token, text + pending + decoder.flush(), "length")
                pending = ""
                break
            yield Chunk(token, text)
            logits = self.forward(self.cache, [token])
        timings.eval_count = n_gen
        t2 = time.perf_counter_ns()
        timings.eval_duration = t2 - t1
        timings.total_duration = t2 - t0 + self.load_duration
        timings.done_reason = reason


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
