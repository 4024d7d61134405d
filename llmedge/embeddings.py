"""Text embeddings: the mean over a text's tokens of the model's final, normalized hidden states
(llama.cpp's ``result_norm`` with mean pooling), L2-normalized. Evaluated in a fresh cache, so the
engine's sequences are untouched. Used by :meth:`llmedge.api.Model.embed` and the server's
``/api/embed`` and ``/v1/embeddings``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def hidden_states(model: Any, ids: Sequence[int]) -> np.ndarray:
    """float32 [len(ids), n_embd]: the final normalized hidden state at every position, in a fresh context."""
    from llmedge.engine import RUN_LOCK
    from llmedge.models.base import Batch

    net = model.model
    engine = model.engine
    cache = engine.new_cache(max(len(ids), 1))
    rows = []
    with RUN_LOCK:  # the native thread pool runs one job at a time (see RUN_LOCK)
        for start in range(0, len(ids), engine.n_batch):
            chunk = np.asarray(ids[start : start + engine.n_batch], dtype=np.int64)
            pos = np.arange(cache.offset, cache.offset + len(chunk), dtype=np.int64)
            rows.append(np.asarray(net.forward(Batch(chunk, pos, cache, None), hidden=True), dtype=np.float32))
            cache.tokens.extend(int(t) for t in chunk)
    return np.concatenate(rows, axis=0)


def text_ids(model: Any, text: str) -> list[int]:
    """The ids a text is embedded from (BOS as the model adds it; never empty)."""
    ids = model.tokenize(text, add_bos=model.tokenizer.add_bos, special=False)
    return ids or [model.tokenizer.bos_id or 0]


def pooled(model: Any, ids: Sequence[int]) -> list[float]:
    """The mean-pooled, L2-normalized embedding of token ``ids`` (which fit the model's context)."""
    v = hidden_states(model, ids).astype(np.float64).mean(axis=0)
    norm = float(np.linalg.norm(v))
    if norm > 0:
        v = v / norm
    return [float(x) for x in v]


def shorten(vec: list[float], dims: int | None) -> list[float]:
    """``vec`` cut to ``dims`` components and normalized again (unchanged when it is not longer), as
    OpenAI's and Ollama's ``dimensions`` do."""
    if dims is None or dims >= len(vec):
        return vec
    v = np.asarray(vec[:dims], dtype=np.float64)
    v = v / max(float(np.linalg.norm(v)), 1e-12)
    return [float(x) for x in v]
