"""Perplexity the way llama-perplexity computes it, so the two numbers can be compared directly.

The whole text is tokenized with the model's default BOS rule and cut into chunks of ``n_ctx``
tokens; each chunk is evaluated in a fresh context with its first token replaced by BOS when the
model adds one, and only the second half of each chunk is scored.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from llmedge.errors import LlmedgeError


@dataclass
class PerplexityResult:
    ppl: float
    n_chunks: int
    n_tokens: int
    n_scored: int
    chunk_ppls: list[float]


def perplexity(model, text: str, n_ctx: int = 512,
               on_chunk: Callable[[int, int, float], None] | None = None) -> PerplexityResult:
    """Perplexity of ``text`` under ``model`` (an :class:`llmedge.api.Model`)."""
    tok = model.tokenizer
    ids = tok.encode(text, add_bos=True, special=False)
    n_chunks = len(ids) // n_ctx
    if n_chunks == 0:
        raise LlmedgeError(f"the text has {len(ids)} tokens; at least {n_ctx} are needed for --ctx {n_ctx}")
    first = n_ctx // 2
    nll, count, chunk_ppls = 0.0, 0, []
    for c in range(n_chunks):
        chunk = ids[c * n_ctx : (c + 1) * n_ctx]
        if tok.add_bos and tok.bos_id is not None:
            chunk = [tok.bos_id] + chunk[1:]
        logits = model.logits(chunk)[first : n_ctx - 1].astype(np.float64)
        targets = np.asarray(chunk[first + 1 : n_ctx])
        m = logits.max(axis=1)
        logz = m + np.log(np.exp(logits - m[:, None]).sum(axis=1))
        chunk_nll = float(np.sum(logz - logits[np.arange(len(targets)), targets]))
        nll += chunk_nll
        count += len(targets)
        chunk_ppls.append(math.exp(chunk_nll / len(targets)))
        if on_chunk:
            on_chunk(c + 1, n_chunks, math.exp(nll / count))
    return PerplexityResult(math.exp(nll / count), n_chunks, len(ids), count, chunk_ppls)
