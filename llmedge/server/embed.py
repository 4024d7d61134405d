"""Embeddings for ``/api/embed`` and ``/v1/embeddings``: the mean over a text's tokens of the model's
final, normalized hidden states (llama.cpp's ``result_norm`` with mean pooling), L2-normalized.
They are evaluated in a fresh cache, so the engine's sequences are untouched.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def hidden_states(model: Any, ids: Sequence[int]) -> np.ndarray:
    """float32 [len(ids), n_embd]: the final normalized hidden state at every position, in a fresh context."""
    from llmedge.models.base import Batch

    net = model.model
    engine = model.engine
    cache = engine.new_cache(max(len(ids), 1))
    rows = []
    for start in range(0, len(ids), engine.n_batch):
        chunk = np.asarray(ids[start : start + engine.n_batch], dtype=np.int64)
        pos = np.arange(cache.offset, cache.offset + len(chunk), dtype=np.int64)
        rows.append(np.asarray(net.forward(Batch(chunk, pos, cache, None), hidden=True), dtype=np.float32))
        cache.tokens.extend(int(t) for t in chunk)
    return np.concatenate(rows, axis=0)


def embed_text(model: Any, text: str | Sequence[int], truncate: bool = True) -> tuple[list[float], int]:
    """The mean-pooled, L2-normalized embedding of ``text`` (or token ids) and how many tokens it took."""
    from llmedge.server.errors import ContextTooLong
    from llmedge.server.scheduler import ids_in_range

    if isinstance(text, str):
        ids = model.tokenize(text, add_bos=model.tokenizer.add_bos, special=False)
    else:
        ids = list(text)
        ids_in_range(ids, model.params.n_vocab)
    if not ids:
        ids = [model.tokenizer.bos_id or 0]
    if len(ids) > model.n_ctx:
        if not truncate:
            raise ContextTooLong(f"the input has {len(ids)} tokens, more than the context of {model.n_ctx}")
        ids = ids[: model.n_ctx]
    h = hidden_states(model, ids).astype(np.float64)
    v = h.mean(axis=0)
    norm = float(np.linalg.norm(v))
    if norm > 0:
        v = v / norm
    return [float(x) for x in v], len(ids)


def parse_dimensions(value: Any) -> int | None:
    """``dimensions``: keep the first N components (then L2-normalize again), as OpenAI's and Ollama's do."""
    from llmedge.server.errors import BadRequest
    from llmedge.server.ollama import number

    if value is None:
        return None
    n = int(number(value, "dimensions", int))
    if n <= 0:
        raise BadRequest("dimensions must be positive")
    return n


def shorten(vec: list[float], dims: int | None) -> list[float]:
    """``vec`` cut to ``dims`` components and normalized again (unchanged when it is not longer)."""
    if dims is None or dims >= len(vec):
        return vec
    v = np.asarray(vec[:dims], dtype=np.float64)
    v = v / max(float(np.linalg.norm(v)), 1e-12)
    return [float(x) for x in v]
