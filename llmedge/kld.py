"""KL divergence of a model against a base model's saved log-probabilities, as llama-perplexity does it.

Owns the base-logits file (llama-perplexity's ``--kl-divergence-base`` layout, so files are
interchangeable): ``_logits_``, int32 n_ctx, n_vocab, n_chunk, the ``n_chunk * n_ctx`` int32 tokens,
then for every chunk the ``n_ctx - 1 - n_ctx // 2`` scored rows, each ``nv = 2 * ceil(n_vocab / 2) + 4``
uint16: a float32 scale and a float32 minimum log-prob, then every log-prob quantized to 16 bits over
at most 16 nats below the top one. Also owns the per-token comparison and the statistics printed by
``--kl-divergence`` (means with uncertainties, percentiles, top-token agreement), computed with
llama.cpp's float32/float64 mix so the figures match llama-perplexity's.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np

from llmedge.errors import LlmedgeError
from llmedge.fsutil import atomic_write

MAGIC = b"_logits_"
F32 = np.float32


def row_width(n_vocab: int) -> int:
    """uint16 slots per saved row: the two float32 header values then the padded vocabulary."""
    return 2 * ((n_vocab + 1) // 2) + 4


def _log_sum_exp(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row: float32 max, its first index and float32 log(sum(expf(l - max))) summed in float64."""
    mx = logits.max(axis=1)
    ex = np.exp(logits - mx[:, None]).astype(np.float64).sum(axis=1)
    return mx, logits.argmax(axis=1), np.log(ex).astype(F32)


def quantize_rows(logits: np.ndarray) -> np.ndarray:
    """The saved uint16 rows of float32 ``logits`` (rows, n_vocab), as llama-perplexity stores them."""
    logits = np.ascontiguousarray(logits, dtype=F32)
    n, v = logits.shape
    mx, _, lse = _log_sum_exp(logits)
    mn = np.maximum(logits.min(axis=1), mx - F32(16))
    min_log_prob = (mn - mx - lse).astype(F32)
    scale = ((mx - mn) / F32(65535)).astype(F32)
    out = np.zeros((n, row_width(v)), np.uint16)
    head = np.stack([scale, min_log_prob], axis=1).astype(F32)
    out[:, :4] = head.view(np.uint16)
    with np.errstate(divide="ignore"):
        inv = np.where(scale > 0, F32(1) / scale, F32(0)).astype(F32)
    q = np.rint(inv[:, None] * (logits - mn[:, None])).astype(F32)  # ties to even, as nearest_int
    q = np.where(logits > mn[:, None], np.clip(q, 0, 65535), 0)
    out[:, 4 : 4 + v] = q.astype(np.uint16)
    return out


def dequantize_rows(rows: np.ndarray, n_vocab: int) -> np.ndarray:
    """float32 log-probs back from saved rows: ``scale * q + min_log_prob``."""
    head = np.ascontiguousarray(rows[:, :4]).view(F32)
    return (head[:, :1] * rows[:, 4 : 4 + n_vocab].astype(F32) + head[:, 1:2]).astype(F32)


# -- the base file ------------------------------------------------------------------------------------
@dataclass
class BaseLogits:
    """A base-logits file opened for reading (rows memory-mapped)."""

    path: Path
    n_ctx: int
    n_vocab: int
    n_chunk: int
    tokens: np.ndarray
    rows: np.ndarray  # (n_chunk, n_scored_per_chunk, nv) uint16

    @property
    def n_scored(self) -> int:
        return self.n_ctx - 1 - self.n_ctx // 2


@contextlib.contextmanager
def open_base(path: str | Path, n_ctx: int, n_vocab: int, n_chunk: int, tokens: list[int]) -> Iterator[BinaryIO]:
    """Create a base file and write its header and tokens; the body then writes each chunk's
    :func:`quantize_rows` output, in order. The rows go to a temporary file beside ``path`` that
    replaces it only when the body ends normally: an error or Ctrl-C part-way leaves no truncated
    file, and an earlier file at ``path`` as it was."""
    path = Path(path)
    if path.is_dir():  # refused now, not by the rename after every chunk was computed
        raise LlmedgeError(f"cannot write {path}: it is a directory")
    try:
        with atomic_write(path) as f:
            f.write(MAGIC)
            f.write(np.array([n_ctx, n_vocab, n_chunk], np.int32).tobytes())
            f.write(np.asarray(tokens[: n_chunk * n_ctx], np.int32).tobytes())
            yield f
    except OSError as e:
        raise LlmedgeError(f"cannot write {path}: {e.strerror or e}") from None

def write_base(path: str | Path, n_ctx: int, n_vocab: int, tokens: list[int], rows: Iterable[np.ndarray],
               n_chunk: int) -> None:
    """Write a whole base file: ``rows`` yields each of the ``n_chunk`` chunks' saved rows."""
    with open_base(path, n_ctx, n_vocab, n_chunk, tokens) as f:
        for r in rows:
            f.write(np.ascontiguousarray(r, np.uint16).tobytes())


def read_base(path: str | Path) -> BaseLogits:
    """Open a base file, refusing anything that is not one (one-line errors)."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(20)
    except OSError as e:
        raise LlmedgeError(f"cannot read {path}: {e.strerror or e}") from None
    if len(head) < 20 or head[:8] != MAGIC:
        raise LlmedgeError(f"{path} is not a file of base log-probabilities (llama-perplexity --kl-divergence-base)")
    n_ctx, n_vocab, n_chunk = (int(x) for x in np.frombuffer(head[8:], np.int32))
    if n_ctx < 3 or n_vocab < 1 or n_chunk < 1:  # 3: perplexity.MIN_CTX, the smallest chunk that scores a token
        raise LlmedgeError(f"{path} has an invalid header (n_ctx {n_ctx}, n_vocab {n_vocab}, n_chunk {n_chunk})")
    nv, n_scored = row_width(n_vocab), n_ctx - 1 - n_ctx // 2
    want = 20 + 4 * n_chunk * n_ctx + 2 * n_chunk * n_scored * nv
    if size < want:
        raise LlmedgeError(f"{path} is truncated ({size} bytes, {want} expected)")
    tokens = np.fromfile(path, np.int32, n_chunk * n_ctx, offset=20)
    rows = np.memmap(path, np.uint16, "r", offset=20 + 4 * n_chunk * n_ctx, shape=(n_chunk, n_scored, nv))
    return BaseLogits(path, n_ctx, n_vocab, n_chunk, tokens, rows)


# -- the comparison -----------------------------------------------------------------------------------
@dataclass
class KldSums:
    """llama-perplexity's ``kl_divergence_result``, plus every token's KLD and Δp for percentiles."""

    sum_nll: float = 0.0
    sum_nll2: float = 0.0
    sum_nll_base: float = 0.0
    sum_nll_base2: float = 0.0
    sum_nll_nll_base: float = 0.0
    sum_kld: float = 0.0
    sum_kld2: float = 0.0
    sum_p_diff: float = 0.0
    sum_p_diff2: float = 0.0
    sum_p_diff4: float = 0.0
    max_p_diff: float = 0.0
    n_same_top: int = 0
    count: int = 0
    kld_values: list[np.ndarray] = field(default_factory=list)
    p_diff_values: list[np.ndarray] = field(default_factory=list)

    def add(self, logits: np.ndarray, base_rows: np.ndarray, targets: np.ndarray) -> None:
        """Fold in one chunk: float32 ``logits`` of the scored rows, the base rows, the next tokens."""
        logits = np.ascontiguousarray(logits, dtype=F32)
        n, v = logits.shape
        r = np.arange(n)
        mx, imax, lse = _log_sum_exp(logits)
        nll = (mx + lse - logits[r, targets]).astype(F32)
        base = dequantize_rows(base_rows, v)
        nll_base = (-base[r, targets]).astype(F32)
        top = (mx + lse).astype(F32)
        keep = base > F32(-16)
        terms = np.where(keep, np.exp(np.where(keep, base, F32(0))) * (base - logits + top[:, None]), F32(0))
        kld = terms.astype(np.float64).sum(axis=1)
        p_diff = (np.exp(-nll) - np.exp(-nll_base)).astype(F32)
        d = np.float64
        self.sum_nll += float(nll.astype(d).sum())
        self.sum_nll2 += float((nll * nll).astype(d).sum())
        self.sum_nll_base += float(nll_base.astype(d).sum())
        self.sum_nll_base2 += float((nll_base * nll_base).astype(d).sum())
        self.sum_nll_nll_base += float((nll * nll_base).astype(d).sum())
        self.sum_kld += float(kld.sum())
        self.sum_kld2 += float((kld * kld).sum())
        p2 = (p_diff * p_diff).astype(d)
        self.sum_p_diff += float(p_diff.astype(d).sum())
        self.sum_p_diff2 += float(p2.sum())
        self.sum_p_diff4 += float((p2 * p2).sum())
        self.max_p_diff = max(self.max_p_diff, float(np.abs(p_diff).max()))
        self.n_same_top += int((imax == base.argmax(axis=1)).sum())
        self.count += n
        self.kld_values.append(kld.astype(F32))
        self.p_diff_values.append(p_diff)


def mean_and_uncertainty(s: float, s2: float, count: int) -> tuple[float, float]:
    if count < 1:
        return 0.0, 0.0
    f = s / count
    df = s2 / count - f * f
    return f, (math.sqrt(df / (count - 1)) if df > 0 and count > 10 else 0.0)


def covariance(sa: float, sb: float, sab: float, count: int) -> float:
    if count < 10:
        return 0.0
    return (sab / count - (sa / count) * (sb / count)) / (count - 1)


def percentile(values: np.ndarray, fraction: float) -> float:
    """llama-perplexity's linear interpolation on sorted float32 values."""
    if fraction <= 0:
        return float(values[0])
    if fraction >= 1:
        return float(values[-1])
    p = F32(fraction) * F32(len(values) - 1)
    ip = int(p)
    p = F32(p - F32(ip))
    return float((F32(1) - p) * values[ip] + p * values[min(ip + 1, len(values) - 1)])


def median(values: np.ndarray) -> float:
    n = len(values)
    return float(F32(0.5) * (values[n // 2] + values[n // 2 - 1])) if n % 2 == 0 else float(values[n // 2])


@dataclass
class KldStats:
    """The figures llama-perplexity prints after a KL-divergence run (fractions, not percents)."""

    count: int
    ppl_q: tuple[float, float]
    ppl_base: tuple[float, float]
    cor: float
    ln_ratio: tuple[float, float]
    ppl_ratio: tuple[float, float]
    ppl_diff: tuple[float, float]
    kld: tuple[float, float]
    kld_percentiles: dict[str, float]
    p_diff: tuple[float, float]
    p_diff_percentiles: dict[str, float]
    rms_p_diff: tuple[float, float]
    same_top: tuple[float, float]


KLD_LEVELS = [("Maximum", 1.0), ("99.9%", 0.999), ("99.0%", 0.99), ("95.0%", 0.95), ("90.0%", 0.9),
              ("Median", None), ("10.0%", 0.1), (" 5.0%", 0.05), (" 1.0%", 0.01), (" 0.1%", 0.001),
              ("Minimum", 0.0)]
P_LEVELS = KLD_LEVELS[:5] + [("75.0%", 0.75), ("Median", None), ("25.0%", 0.25)] + KLD_LEVELS[6:]


def _levels(values: np.ndarray, levels: list) -> dict[str, float]:
    return {name.strip(): (median(values) if f is None else percentile(values, f)) for name, f in levels}


def statistics(s: KldSums) -> KldStats:
    """Everything llama-perplexity prints at the end of ``--kl-divergence``, from the sums."""
    n = s.count
    lp = mean_and_uncertainty(s.sum_nll, s.sum_nll2, n)
    lb = mean_and_uncertainty(s.sum_nll_base, s.sum_nll_base2, n)
    ppl, ppl_b = math.exp(lp[0]), math.exp(lb[0])
    cov = covariance(s.sum_nll, s.sum_nll_base, s.sum_nll_nll_base, n)
    cor = cov / (lp[1] * lb[1]) if lp[1] * lb[1] > 0 else 0.0
    ln_r = lp[0] - lb[0]
    ln_u = math.sqrt(max(lp[1] ** 2 + lb[1] ** 2 - 2 * cov, 0.0))
    ppl_u, ppl_bu = ppl * lp[1], ppl_b * lb[1]
    diff_u = math.sqrt(max(ppl_u**2 + ppl_bu**2 - 2 * ppl * ppl_b * cov, 0.0))
    mse = mean_and_uncertainty(s.sum_p_diff2, s.sum_p_diff4, n)
    rms = math.sqrt(mse[0])
    top = s.n_same_top / n
    kv = np.sort(np.concatenate(s.kld_values))
    pv = np.sort(np.concatenate(s.p_diff_values))
    return KldStats(
        count=n, ppl_q=(ppl, ppl_u), ppl_base=(ppl_b, ppl_bu), cor=cor, ln_ratio=(ln_r, ln_u),
        ppl_ratio=(math.exp(ln_r), math.exp(ln_r) * ln_u), ppl_diff=(ppl - ppl_b, diff_u),
        kld=mean_and_uncertainty(s.sum_kld, s.sum_kld2, n), kld_percentiles=_levels(kv, KLD_LEVELS),
        p_diff=mean_and_uncertainty(s.sum_p_diff, s.sum_p_diff2, n), p_diff_percentiles=_levels(pv, P_LEVELS),
        rms_p_diff=(rms, 0.5 / rms * mse[1] if rms > 0 else 0.0),
        same_top=(top, math.sqrt(top * (1 - top) / (n - 1)) if n > 1 else 0.0),
    )


def chunk_line(i: int, s: KldSums) -> str:
    """One row of llama-perplexity's running table (PPL, ln ratio, KLD, RMS Δp, same top)."""
    st = statistics(s)
    return (f"{i:4d}    {st.ppl_q[0]:9.4f} ± {st.ppl_q[1]:9.4f}    {st.ln_ratio[0]:10.5f} ± {st.ln_ratio[1]:10.5f}"
            f"    {st.kld[0]:10.5f} ± {st.kld[1]:10.5f}    {100 * st.rms_p_diff[0]:6.3f} ± {100 * st.rms_p_diff[1]:6.3f} %"
            f"    {100 * st.same_top[0]:6.3f} ± {100 * st.same_top[1]:6.3f} %")


TABLE_HEADER = ("chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence"
                "              Δp RMS            Same top p")


def report(st: KldStats) -> str:
    """The closing statistics, laid out as llama-perplexity prints them."""
    lines = ["====== Perplexity statistics ======",
             f"Mean PPL(Q)                   : {st.ppl_q[0]:10.6f} ± {st.ppl_q[1]:10.6f}",
             f"Mean PPL(base)                : {st.ppl_base[0]:10.6f} ± {st.ppl_base[1]:10.6f}",
             f"Cor(ln(PPL(Q)), ln(PPL(base))): {100 * st.cor:6.2f}%",
             f"Mean ln(PPL(Q)/PPL(base))     : {st.ln_ratio[0]:10.6f} ± {st.ln_ratio[1]:10.6f}",
             f"Mean PPL(Q)/PPL(base)         : {st.ppl_ratio[0]:10.6f} ± {st.ppl_ratio[1]:10.6f}",
             f"Mean PPL(Q)-PPL(base)         : {st.ppl_diff[0]:10.6f} ± {st.ppl_diff[1]:10.6f}",
             "", "====== KL divergence statistics ======",
             f"Mean    KLD: {st.kld[0]:10.6f} ± {st.kld[1]:10.6f}"]
    lines += [f"{name:<7} KLD: {st.kld_percentiles[name.strip()]:10.6f}" for name, _ in KLD_LEVELS]
    lines += ["", "====== Token probability statistics ======",
              f"Mean    Δp: {100 * st.p_diff[0]:6.3f} ± {100 * st.p_diff[1]:5.3f} %"]
    lines += [f"{name:<7} Δp: {100 * st.p_diff_percentiles[name.strip()]:6.3f}%" for name, _ in P_LEVELS]
    lines += [f"RMS Δp    : {100 * st.rms_p_diff[0]:6.3f} ± {100 * st.rms_p_diff[1]:5.3f} %",
              f"Same top p: {100 * st.same_top[0]:6.3f} ± {100 * st.same_top[1]:5.3f} %"]
    return "\n".join(lines)


def compare(base: BaseLogits, chunk_logits: Callable[[list[int]], np.ndarray],
            on_chunk: Callable[[int, KldSums], None] | None = None) -> KldSums:
    """Sums over every chunk of ``base``: ``chunk_logits(tokens)`` gives a chunk's scored float32 rows."""
    s = KldSums()
    first = base.n_ctx // 2
    for c in range(base.n_chunk):
        chunk = base.tokens[c * base.n_ctx : (c + 1) * base.n_ctx]
        s.add(chunk_logits([int(t) for t in chunk]), np.asarray(base.rows[c]), chunk[first + 1 :])
        if on_chunk:
            on_chunk(c + 1, s)
    return s
