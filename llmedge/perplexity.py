"""Perplexity the way llama-perplexity computes it, so the two numbers can be compared directly.

The whole text is tokenized with the model's default BOS rule and cut into chunks of ``n_ctx``
tokens; each chunk is evaluated in a fresh context with its first token replaced by BOS when the
model adds one, and only the second half of each chunk is scored (the first ``n_chunks`` chunks with
``--chunks``); the result carries llama-perplexity's "+/-" (:func:`uncertainty`). The same chunks feed the KL
divergence runs: :func:`save_kld_base` stores the base model's log-probs (llama-perplexity's
``--kl-divergence-base`` file) and :func:`kl_divergence` scores another model against them (the file
layout and the statistics live in :mod:`llmedge.kld`).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llmedge import kld
from llmedge.errors import LlmedgeError


@dataclass
class PerplexityResult:
    ppl: float
    n_chunks: int
    n_tokens: int
    n_scored: int
    chunk_ppls: list[float]
    uncertainty: float | None = None  # llama-perplexity's "+/-" (None below two scored tokens)


MIN_CTX = 3  # a chunk scores its second half minus its last token: at least one token


def check_ctx(n_ctx: object, name: str = "n_ctx") -> int:
    """``n_ctx`` when it is a usable chunk size (tokens per chunk); ValueError naming it (``name``) and
    the allowed range otherwise."""
    if isinstance(n_ctx, bool) or not isinstance(n_ctx, numbers.Integral) or n_ctx < MIN_CTX:
        raise ValueError(f"{name} (tokens per chunk) must be an integer of at least {MIN_CTX}, not {n_ctx!r}")
    return int(n_ctx)


def check_chunks(n_chunks: object, name: str = "n_chunks") -> int | None:
    """``n_chunks`` (None: every chunk) when it is a usable number of chunks; ValueError naming it
    (``name``) otherwise: 0 or a negative number would score nothing."""
    if n_chunks is None:
        return None
    if isinstance(n_chunks, bool) or not isinstance(n_chunks, numbers.Integral) or n_chunks < 1:
        raise ValueError(f"{name} (the first chunks to score) must be an integer of at least 1, not {n_chunks!r}; "
                         "leave it out to score every chunk")
    return int(n_chunks)


def uncertainty(nll: float, nll2: float, count: int) -> float | None:
    """llama-perplexity's "+/-" of ``exp(nll / count)`` from the sums of the per-token negative
    log-likelihoods (``nll``) and of their squares (``nll2``): the standard error of their mean,
    ``sqrt((nll2/count - mean**2) / (count - 1))``, times the perplexity; None where llama.cpp prints
    no estimate (a variance that is not positive) or where it is undefined (fewer than two tokens)."""
    if count < 2:
        return None
    mean = nll / count
    var = nll2 / count - mean * mean
    return math.sqrt(var / (count - 1)) * math.exp(mean) if var > 0 else None


def text_ids(model, text: str, n_ctx: int) -> list[int]:
    """The text's tokens, refusing a chunk size that scores nothing and a text shorter than one chunk."""
    check_ctx(n_ctx)
    ids = model.tokenizer.encode(text, add_bos=True, special=False)
    if len(ids) < n_ctx:
        raise LlmedgeError(f"the text has {len(ids)} tokens; at least {n_ctx} are needed for --ctx {n_ctx}")
    return ids


def scored_logits(model, chunk: list[int]) -> np.ndarray:
    """float32 logits of a chunk's scored rows (``n_ctx // 2`` to ``n_ctx - 2``), its first token
    replaced by BOS when the model adds one."""
    tok, n_ctx = model.tokenizer, len(chunk)
    if tok.add_bos and tok.bos_id is not None:
        chunk = [tok.bos_id] + list(chunk[1:])
    return model.logits(chunk, first_row=n_ctx // 2)[: n_ctx - 1 - n_ctx // 2]


def log_normalizers(logits: np.ndarray, rows_per_block: int = 32) -> np.ndarray:
    """log(sum(exp(row))) of each row, in float64, a block of rows at a time (no float64 copy of a
    whole 262k-vocabulary chunk)."""
    out = np.empty(len(logits), dtype=np.float64)
    for s in range(0, len(logits), rows_per_block):
        block = logits[s : s + rows_per_block].astype(np.float64)
        m = block.max(axis=1)
        out[s : s + rows_per_block] = m + np.log(np.exp(block - m[:, None]).sum(axis=1))
    return out


def perplexity(model, text: str, n_ctx: int = 512,
               on_chunk: Callable[[int, int, float], None] | None = None,
               keep: Callable[[np.ndarray], None] | None = None, n_chunks: int | None = None) -> PerplexityResult:
    """Perplexity of ``text`` under ``model`` (an :class:`llmedge.api.Model`); ``keep`` receives each
    chunk's scored float32 logits; ``n_chunks``: the first that many chunks only (llama-perplexity's
    ``--chunks``; more than the text holds: all of them)."""
    n_chunks = check_chunks(n_chunks)
    ids = text_ids(model, text, n_ctx)
    n_chunks = len(ids) // n_ctx if n_chunks is None else min(n_chunks, len(ids) // n_ctx)
    first = n_ctx // 2
    nll, nll2, count, chunk_ppls = 0.0, 0.0, 0, []
    for c in range(n_chunks):
        chunk = ids[c * n_ctx : (c + 1) * n_ctx]
        rows = scored_logits(model, chunk)
        if keep:
            keep(rows)
        targets = np.asarray(chunk[first + 1 : n_ctx])
        token_nll = log_normalizers(rows) - rows[np.arange(len(targets)), targets]
        chunk_nll = float(np.sum(token_nll))
        nll += chunk_nll
        nll2 += float(np.sum(token_nll * token_nll))
        count += len(targets)
        chunk_ppls.append(math.exp(chunk_nll / len(targets)))
        if on_chunk:
            on_chunk(c + 1, n_chunks, math.exp(nll / count))
    return PerplexityResult(math.exp(nll / count), n_chunks, len(ids), count, chunk_ppls,
                            uncertainty(nll, nll2, count))


def save_kld_base(model, text: str, path: str | Path, n_ctx: int = 512,
                  on_chunk: Callable[[int, int, float], None] | None = None,
                  n_chunks: int | None = None) -> PerplexityResult:
    """Perplexity of ``text`` while writing the model's log-probs to ``path`` for later
    :func:`kl_divergence` runs (llama-perplexity's ``--kl-divergence-base`` file); ``n_chunks``: of
    the first that many chunks only."""
    n_chunks = check_chunks(n_chunks)
    ids = text_ids(model, text, n_ctx)
    n_saved = len(ids) // n_ctx if n_chunks is None else min(n_chunks, len(ids) // n_ctx)
    with kld.open_base(path, n_ctx, model.tokenizer.n_vocab, n_saved, ids) as f:
        try:  # rows are written as each chunk is scored: a large vocabulary never piles up in memory
            result = perplexity(model, text, n_ctx, on_chunk, keep=lambda r: f.write(kld.quantize_rows(r).tobytes()),
                                n_chunks=n_saved)
        except OSError as e:
            raise LlmedgeError(f"cannot write {path}: {e.strerror or e}") from None
    return result


def check_base(model, base: kld.BaseLogits, text: str | None = None) -> None:
    """Refuse a base file made with another vocabulary, or from another text than ``text``."""
    n_vocab = model.tokenizer.n_vocab
    if base.n_vocab != n_vocab:
        raise LlmedgeError(f"{base.path} was made with a vocabulary of {base.n_vocab} tokens; "
                           f"this model has {n_vocab}")
    if base.tokens.size and (base.tokens.min() < 0 or base.tokens.max() >= n_vocab):
        raise LlmedgeError(f"{base.path} holds token ids outside this model's vocabulary")
    if text is not None:
        ids = np.asarray(model.tokenizer.encode(text, add_bos=True, special=False)[: base.tokens.size])
        same = np.flatnonzero(ids != base.tokens[: ids.size]) if ids.size <= base.tokens.size else []
        if ids.size < base.tokens.size or len(same):
            at = int(same[0]) if len(same) else int(ids.size)
            raise LlmedgeError(f"{base.path} was made from other tokens than this text gives "
                               f"(they differ from token {at}); make the base file again")


def kl_divergence(model, base: str | Path | kld.BaseLogits, text: str | None = None,
                  on_chunk: Callable[[int, kld.KldSums], None] | None = None,
                  n_chunks: int | None = None) -> kld.KldSums:
    """Compare ``model`` with the base log-probs saved by :func:`save_kld_base`, over the file's own
    tokens (checked against ``text`` when given), or its first ``n_chunks`` chunks;
    :func:`llmedge.kld.statistics` turns the sums into llama-perplexity's figures."""
    n_chunks = check_chunks(n_chunks)
    if not isinstance(base, kld.BaseLogits):
        base = kld.read_base(base)
    check_base(model, base, text)
    if model.n_ctx < base.n_ctx:
        raise LlmedgeError(f"{base.path} was made with --ctx {base.n_ctx}; this model's context is {model.n_ctx}")
    if n_chunks is not None and n_chunks < base.n_chunk:
        base = dataclasses.replace(base, n_chunk=n_chunks, tokens=base.tokens[: n_chunks * base.n_ctx],
                                   rows=base.rows[:n_chunks])
    return kld.compare(base, lambda chunk: scored_logits(model, chunk), on_chunk)
