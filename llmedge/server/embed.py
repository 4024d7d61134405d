"""``/api/embed`` and ``/v1/embeddings``: a request's inputs and ``dimensions`` checked in the server's
error shapes, then embedded by :mod:`llmedge.embeddings` (mean-pooled, L2-normalized)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from llmedge.embeddings import pooled, shorten, text_ids

__all__ = ["embed_text", "is_embedding_model", "parse_dimensions", "shorten"]


def is_embedding_model(metadata: Mapping[str, Any], arch: str) -> bool:
    """Whether a GGUF is an embedding model by Ollama's rule (server/images.go, ggufCapabilities): it
    sets ``{arch}.pooling_type``. Ollama lists ``embedding`` instead of ``completion`` for it and
    refuses to generate with it; it still embeds."""
    return f"{arch}.pooling_type" in metadata


def embed_text(model: Any, text: str | Sequence[int], truncate: bool = True) -> tuple[list[float], int]:
    """The mean-pooled, L2-normalized embedding of ``text`` (or token ids) and how many tokens it took."""
    from llmedge.server.errors import ContextTooLong
    from llmedge.server.scheduler import ids_in_range

    if isinstance(text, str):
        ids = text_ids(model, text)
    else:
        ids = list(text) or [model.tokenizer.bos_id or 0]
        ids_in_range(ids, model.params.n_vocab)
    if len(ids) > model.n_ctx:
        if not truncate:
            raise ContextTooLong(f"the input has {len(ids)} tokens, more than the context of {model.n_ctx}")
        ids = ids[: model.n_ctx]
    return pooled(model, ids), len(ids)


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
