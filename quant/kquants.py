"""K-quant and IQ4 encoders: the scale searches of ggml's ``ggml-quants.c``, vectorized over blocks.

This module owns the searching quantizers, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL and IQ4_XS, as
``ggml_quantize_chunk`` runs them without an importance matrix (the ``quantize_row_*_ref`` of the
K-quants, ``quantize_iq4_nl`` / ``quantize_iq4_xs`` with their 7-step search), and with one
(``quant_weights``, the ``*_impl`` functions).

Byte-exactness rests on repeating ggml's float32 arithmetic in its order: every product and sum
is a float32 operation, C's left-to-right association is kept (``w*x*l`` is ``(w*x)*l``), sums
over a block are accumulated sequentially (:func:`_seqsum`, never NumPy's pairwise sum), and
``nearest_int`` is ggml's bit trick (:func:`nearest_int`: round half to even, and the same
garbage ggml produces for out-of-range values). ggml-base is compiled without FMA contraction on
x86-64, so none is modelled. Blocks are rows of 2-D arrays; per-block decisions of the C loops
become masks.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .quantize_common import F32, f16_bits, f16_round, first_abs_max, nearest_int, pack_bits, seqsum

__all__ = ["KQUANT_ENCODERS", "KVALUES_IQ4NL", "LEGACY_WEIGHTED", "search_backend"]

_BACKEND = {"name": "numba"}


class search_backend:  # noqa: N801 (used as a context manager, like np.errstate)
    """``with search_backend("numpy"):`` runs the searches in NumPy instead of Numba (same bytes)."""

    def __init__(self, name: str) -> None:
        if name not in ("numba", "numpy"):
            raise ValueError(f"search backend must be 'numba' or 'numpy', not {name!r}")
        self.name, self.prev = name, _BACKEND["name"]

    def __enter__(self) -> None:
        _BACKEND["name"] = self.name

    def __exit__(self, *exc: object) -> None:
        _BACKEND["name"] = self.prev


def _jit():  # noqa: ANN202
    if _BACKEND["name"] != "numba":
        return None
    from . import ksearch_jit

    return ksearch_jit

GROUP_MAX_EPS = F32(1e-15)
KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int32)
_KV = KVALUES_IQ4NL.astype(F32)


# ---- the shared searches --------------------------------------------------------------------


def _make_qkx2_np(
    x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int, use_mad: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ggml's ``make_qkx2_quants`` on blocks x [B, n] with weights w: (scale, the_min, L [B, n])."""
    mn = np.minimum(x.min(axis=1), F32(0))
    mx = x.max(axis=1)
    sum_w = seqsum(w, start=False)
    sum_x = seqsum(w * x, start=False)
    flat = mx == mn
    rng = (mx - mn)[:, None]
    iscale = F32(nmax) / rng
    scale = F32(1) / iscale
    L = np.clip(nearest_int(iscale * (x - mn[:, None])), 0, nmax)
    best = seqsum(w * _err(scale * L.astype(F32) + mn[:, None] - x, use_mad))
    scale = scale[:, 0]
    for step in range(nstep + 1):
        iscale = (F32(rmin) + F32(rdelta) * F32(step) + F32(nmax)) / (mx - mn)[:, None]
        laux = np.clip(nearest_int(iscale * (x - mn[:, None])), 0, nmax)
        lf = laux.astype(F32)
        wl = w * lf
        sum_l, sum_l2, sum_xl = seqsum(wl), seqsum(wl * lf), seqsum(wl * x)
        D = sum_w * sum_l2 - sum_l * sum_l
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
        pos = this_min > 0
        this_min = np.where(pos, F32(0), this_min)
        this_scale = np.where(pos, sum_xl / sum_l2, this_scale)
        cur = seqsum(w * _err(this_scale[:, None] * lf + this_min[:, None] - x, use_mad))
        upd = (D > 0) & (cur < best)
        L = np.where(upd[:, None], laux, L)
        best = np.where(upd, cur, best)
        scale = np.where(upd, this_scale, scale)
        mn = np.where(upd, this_min, mn)
    L = np.where(flat[:, None], 0, L)
    scale = np.where(flat, F32(0), scale)
    return scale, -mn, L


def _err(diff: np.ndarray, use_mad: bool) -> np.ndarray:
    return np.abs(diff) if use_mad else diff * diff


def _make_qx_np(x: np.ndarray, nmax: int, qw: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """ggml's ``make_qx_quants`` with rmse_type 1 on blocks x [B, n]: (scale, L [B, n] in 0..2*nmax-1)."""
    amax, mx = first_abs_max(x)
    zero = amax < GROUP_MAX_EPS
    w = x * x if qw is None else qw
    mxc = mx[:, None]

    def trial(iscale: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        lq = np.clip(nearest_int(iscale * x), -nmax, nmax - 1)
        lf = lq.astype(F32)
        return lq + nmax, seqsum(w * x * lf), seqsum(w * lf * lf)

    L, sumlx, suml2 = trial(F32(-nmax) / mxc)
    scale = np.where(suml2 != 0, sumlx / suml2, F32(0))
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        Lt, sumlx, suml2 = trial(-(F32(nmax) + F32(0.1) * F32(step)) / mxc)
        upd = (suml2 > 0) & (sumlx * sumlx > best * suml2)
        L = np.where(upd[:, None], Lt, L)
        scale = np.where(upd, sumlx / suml2, scale)
        best = np.where(upd, scale * sumlx, best)
    return np.where(zero, F32(0), scale), np.where(zero[:, None], 0, L)


def _make_q3_np(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """ggml's ``make_q3_quants`` with do_rmse on blocks x [B, n]: (scale, L [B, n] in 0..2*nmax-1)."""
    amax, mx = first_abs_max(x)
    zero = amax < GROUP_MAX_EPS
    L = np.clip(nearest_int((F32(-nmax) / mx)[:, None] * x), -nmax, nmax - 1)
    w = x * x
    wx = w * x
    lf = L.astype(F32)
    sumlx, suml2 = seqsum(wx * lf), seqsum(w * lf * lf)
    for _ in range(5):  # a block whose pass changes nothing would change nothing again
        for i in range(x.shape[1]):
            wi, xi, wxi, li = w[:, i], x[:, i], wx[:, i], L[:, i].astype(F32)
            slx = sumlx - wxi * li
            sl2 = suml2 - wi * li * li
            new_l = np.clip(nearest_int(xi * sl2 / slx), -nmax, nmax - 1)
            nf = new_l.astype(F32)
            slx2 = slx + wxi * nf
            sl22 = sl2 + wi * nf * nf
            upd = (slx > 0) & (new_l != L[:, i]) & (sl22 > 0) & (slx2 * slx2 * suml2 > sumlx * sumlx * sl22)
            L[:, i] = np.where(upd, new_l, L[:, i])
            sumlx = np.where(upd, slx2, sumlx)
            suml2 = np.where(upd, sl22, suml2)
    scale = np.where(suml2 > 0, sumlx / suml2, F32(0))
    return np.where(zero, F32(0), scale), np.where(zero[:, None], 0, L + nmax)


def best_index_iq4nl(v: np.ndarray) -> np.ndarray:
    """ggml's ``best_index_int8`` over the IQ4_NL table: the nearest value's index, ties upward."""
    mu = np.clip(np.searchsorted(_KV, v, side="right"), 1, 15)
    idx = np.where(v - _KV[mu - 1] < _KV[mu] - v, mu - 1, mu)
    idx = np.where(v <= _KV[0], 0, idx)
    return np.where(v >= _KV[15], 15, idx)


def _iq4_block_scales_np(x: np.ndarray, w: np.ndarray, ntry: int) -> np.ndarray:
    """The per-32-block scale search of ggml's ``quantize_row_iq4_nl_impl``: d [B] (0 for zero blocks)."""
    amax, mx = first_abs_max(x)
    mxc = mx[:, None]

    def trial(inv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        q = _KV[best_index_iq4nl(inv * x)]
        wq = w * q
        return seqsum(wq * x), seqsum(wq * q)

    d0 = -mx / _KV[0] if ntry > 0 else mx / _KV[0]
    sumqx, sumq2 = trial((F32(1) / d0)[:, None])
    d = np.where(sumq2 > 0, sumqx / sumq2, F32(0))
    best = d * sumqx
    for itry in range(-ntry, ntry + 1):
        sumqx, sumq2 = trial(F32(itry + int(KVALUES_IQ4NL[0])) / mxc)
        upd = (sumq2 > 0) & (sumqx * sumqx > best * sumq2)
        d = np.where(upd, sumqx / sumq2, d)
        best = np.where(upd, d * sumqx, best)
    return np.where(amax < GROUP_MAX_EPS, F32(0), d)


def make_qkx2(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int, use_mad: bool) -> tuple:
    """``make_qkx2_quants`` on blocks [B, n]: (scale [B], the_min [B], L [B, n])."""
    jit = _jit()
    if jit is None:
        return _make_qkx2_np(x, w, nmax, rmin, rdelta, nstep, use_mad)
    return jit.make_qkx2(np.ascontiguousarray(x), np.ascontiguousarray(w), nmax, rmin, rdelta, nstep, use_mad)


def make_qx(x: np.ndarray, nmax: int, qw: np.ndarray | None) -> tuple:
    """``make_qx_quants`` (rmse_type 1) on blocks [B, n]: (scale [B], L [B, n])."""
    jit = _jit()
    if jit is None:
        return _make_qx_np(x, nmax, qw)
    w = x * x if qw is None else qw
    return jit.make_qx(np.ascontiguousarray(x), np.ascontiguousarray(w), nmax)


def make_q3(x: np.ndarray, nmax: int) -> tuple:
    """``make_q3_quants`` (do_rmse) on blocks [B, n]: (scale [B], L [B, n])."""
    jit = _jit()
    return _make_q3_np(x, nmax) if jit is None else jit.make_q3(np.ascontiguousarray(x), nmax)


def iq4_block_scales(x: np.ndarray, w: np.ndarray, ntry: int) -> np.ndarray:
    """The IQ4 per-32-block scale search on blocks [B, 32]: d [B]."""
    jit = _jit()
    if jit is None:
        return _iq4_block_scales_np(x, w, ntry)
    return jit.iq4_block_scales(np.ascontiguousarray(x), np.ascontiguousarray(w), ntry)


# ---- packing helpers ------------------------------------------------------------------------


def _pack_k4_scales(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """Eight 6-bit scales and mins [S, 8] -> the 12 scale bytes of Q4_K / Q5_K."""
    out = np.zeros((len(ls), 12), np.uint8)
    out[:, 0:4] = ls[:, :4] | ((ls[:, 4:] >> 4) << 6)
    out[:, 4:8] = lm[:, :4] | ((lm[:, 4:] >> 4) << 6)
    out[:, 8:12] = (ls[:, 4:] & 0xF) | ((lm[:, 4:] & 0xF) << 4)
    return out


def _pack_2bit(L: np.ndarray) -> np.ndarray:
    """[S, 256] values 0..3 -> the 64 ``qs`` bytes of Q2_K / Q3_K (4 groups of 32 per 128)."""
    q = L.reshape(len(L), 2, 4, 32)
    return (q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)).reshape(len(L), 64)


def _pack_nibbles_64(L: np.ndarray) -> np.ndarray:
    """[S, 256] values 0..15 -> 128 bytes: per 64 values, value j low nibble, value j + 32 high."""
    q = L.reshape(len(L), 4, 2, 32)
    return (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(len(L), 128)


def _positive_max(v: np.ndarray) -> np.ndarray:
    """``m = 0; for each s: if (s > m) m = s``, per row."""
    m = v.max(axis=1)
    return np.where(m > 0, m, F32(0))


def _requant(x: np.ndarray, d: np.ndarray, dm: np.ndarray | None, lo: int, hi: int, L: np.ndarray) -> np.ndarray:
    """Final pass of the K-quants: ``nearest_int((x + dm)/d)`` clamped, kept as L where d == 0."""
    num = x if dm is None else x + dm[..., None]
    dd = d[..., None]
    q = np.clip(nearest_int(num / np.where(dd == 0, F32(1), dd)), lo, hi)
    return np.where(dd == 0, L, q)


# ---- the encoders (blocks of 256, or 32 for IQ4_NL) -------------------------------------------


def _k_scale_min(xb: np.ndarray, qw: np.ndarray | None, nmax: int, rmin: float, nstep: int) -> tuple:
    """Q4_K / Q5_K: searched scales and mins of the eight 32-blocks, quantized to 6 bits."""
    S = len(xb)
    xs = xb.reshape(S * 8, 32)
    if qw is None:
        av_x = np.sqrt(seqsum(xs * xs) / F32(32))
        w = av_x[:, None] + np.abs(xs)
        scales, mins, L = make_qkx2(xs, w, nmax, rmin, 0.1, nstep, False)
        scales, mins = scales.reshape(S, 8), mins.reshape(S, 8)
        max_scale, max_min = _positive_max(scales), _positive_max(mins)
        inv_scale = np.where(max_scale > 0, F32(63) / max_scale, F32(0))
        inv_min = np.where(max_min > 0, F32(63) / max_min, F32(0))
        ls = np.minimum(nearest_int(inv_scale[:, None] * scales) & 0xFF, 63).astype(np.uint8)
        lm = np.minimum(nearest_int(inv_min[:, None] * mins) & 0xFF, 63).astype(np.uint8)
        d = f16_round(max_scale / F32(63))
        dmin = f16_round(max_min / F32(63))
    else:  # quantize_row_q{4,5}_K_impl
        w = _imatrix_weights(xb, qw, 2, 32)
        sw = seqsum(w).reshape(S, 8)
        scales, mins, L = make_qkx2(xs, w, nmax, -0.9, 0.05, 36, False)
        d_block, ls = make_qp(scales.reshape(S, 8), 63, sw)
        m_block, lm = make_qp(mins.reshape(S, 8), 63, sw)
        ls, lm = np.minimum(ls, 63).astype(np.uint8), np.minimum(lm, 63).astype(np.uint8)
        d, dmin = f16_round(d_block), f16_round(m_block)
    dj = d[:, None] * ls.astype(F32)
    dmj = dmin[:, None] * lm.astype(F32)
    L = _requant(xb.reshape(S, 8, 32), dj, dmj, 0, nmax, L.reshape(S, 8, 32)).reshape(S, 256)
    head = np.concatenate([f16_bits(d), f16_bits(dmin), _pack_k4_scales(ls, lm)], axis=1)
    return head, L.astype(np.uint8)


def _imatrix_weights(xb: np.ndarray, qw: np.ndarray, factor: int, block: int) -> np.ndarray:
    """``qw * sqrtf(sigma2 + x*x)`` per sub-block [S * 256 / block, block], sigma2 per super-block."""
    s2 = (F32(factor) * seqsum(xb * xb)) / F32(xb.shape[1])
    xs = xb.reshape(-1, block)
    return qw.reshape(-1, block) * np.sqrt(np.repeat(s2, xb.shape[1] // block)[:, None] + xs * xs)


def make_qp(x: np.ndarray, nmax: int, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's ``make_qp_quants`` on rows x [S, n] with weights w: (scale [S], L [S, n] as uint8 values)."""
    mx = x.max(axis=1)
    mx = np.where(mx > 0, mx, F32(0))
    zero = mx < GROUP_MAX_EPS
    safe = np.where(zero, F32(1), mx)
    iscale = F32(nmax) / safe
    L0 = nearest_int(iscale[:, None] * x) & 0xFF
    diff = x - (F32(1) / iscale)[:, None] * L0.astype(F32)
    best = seqsum(w * diff * diff)
    for step in (-4, -3, -2, -1, 1, 2, 3, 4):
        isc = (F32(0.1) * F32(step) + F32(nmax)) / safe
        lf = np.minimum(nmax, nearest_int(isc[:, None] * x)).astype(F32)
        diff = x - (F32(1) / isc)[:, None] * lf
        mse = seqsum(w * diff * diff)
        upd = mse < best
        best = np.where(upd, mse, best)
        iscale = np.where(upd, isc, iscale)
    li = np.minimum(nmax, nearest_int(iscale[:, None] * x))
    lf = li.astype(F32)
    sumlx, suml2 = seqsum(w * x * lf), seqsum(w * lf * lf)
    L = li & 0xFF
    for _ in range(5):
        for i in range(x.shape[1]):
            wi, xi, li_f = w[:, i], x[:, i], L[:, i].astype(F32)
            slx = sumlx - wi * xi * li_f
            sl2 = suml2 - wi * li_f * li_f
            new_l = np.minimum(nmax, nearest_int(xi * sl2 / slx))
            nf = new_l.astype(F32)
            slx2 = slx + wi * xi * nf
            sl22 = sl2 + wi * nf * nf
            upd = (slx > 0) & (sl2 > 0) & (new_l != L[:, i]) & (slx2 * slx2 * suml2 > sumlx * sumlx * sl22)
            L[:, i] = np.where(upd, new_l & 0xFF, L[:, i])
            sumlx = np.where(upd, slx2, sumlx)
            suml2 = np.where(upd, sl22, suml2)
    scale = np.where(suml2 > 0, sumlx / suml2, F32(0))
    return np.where(zero, F32(0), scale), np.where(zero[:, None], 0, L)


def sigma2(xb: np.ndarray, factor: int) -> np.ndarray:
    """``sum(x*x) * factor / n`` per row, in ggml's order (the imatrix weighting's sigma2)."""
    return seqsum(xb * xb) * (F32(factor) / F32(xb.shape[1]))


def q4_k(xb: np.ndarray, qw: np.ndarray | None = None) -> np.ndarray:
    head, L = _k_scale_min(xb, qw, 15, -1.0, 20)
    return np.concatenate([head, _pack_nibbles_64(L)], axis=1)


def q5_k(xb: np.ndarray, qw: np.ndarray | None = None) -> np.ndarray:
    head, L = _k_scale_min(xb, qw, 31, -0.5, 15)
    hi = (L >> 4).reshape(len(L), 4, 2, 32)
    qh = np.zeros((len(L), 32), np.uint8)
    for n in range(4):
        qh |= (hi[:, n, 0] << (2 * n)) | (hi[:, n, 1] << (2 * n + 1))
    return np.concatenate([head, qh, _pack_nibbles_64(L & 0xF)], axis=1)


def q6_k(xb: np.ndarray, qw: np.ndarray | None = None) -> np.ndarray:
    S = len(xb)
    xs = xb.reshape(S * 16, 16)
    scales, L = make_qx(xs, 32, None if qw is None else qw.reshape(S * 16, 16))
    scales, L = scales.reshape(S, 16), L.reshape(S, 16, 16)
    amax, max_scale = first_abs_max(scales)
    zero = amax < GROUP_MAX_EPS
    iscale = F32(-128) / np.where(zero, F32(1), max_scale)
    d = f16_round(F32(1) / iscale)
    sc = ((np.minimum(127, nearest_int(iscale[:, None] * scales)) + 128) & 0xFF) - 128
    dj = d[:, None] * sc.astype(F32)
    L = (_requant(xb.reshape(S, 16, 16), dj, None, -32, 31, L - 32) + 32).reshape(S, 256)
    q = L.reshape(S, 2, 4, 32).astype(np.uint8)
    lo = q & 0xF
    ql = np.concatenate([lo[:, :, 0] | (lo[:, :, 2] << 4), lo[:, :, 1] | (lo[:, :, 3] << 4)], axis=2)
    h = q >> 4
    qh = h[:, :, 0] | (h[:, :, 1] << 2) | (h[:, :, 2] << 4) | (h[:, :, 3] << 6)
    out = np.concatenate(
        [ql.reshape(S, 128), qh.reshape(S, 64), sc.astype(np.int8).view(np.uint8), f16_bits(d)], axis=1
    )
    out[zero] = 0
    return out


def q2_k(xb: np.ndarray, qw: np.ndarray | None = None) -> np.ndarray:
    S = len(xb)
    xs = xb.reshape(S * 16, 16)
    if qw is None:
        scales, mins, L = make_qkx2(xs, np.abs(xs), 3, -0.5, 0.1, 15, True)
        scales, mins = scales.reshape(S, 16), mins.reshape(S, 16)
        max_scale, max_min = _positive_max(scales), _positive_max(mins)
        has_s, has_m = max_scale > 0, max_min > 0
        iscale = F32(15) / np.where(has_s, max_scale, F32(1))
        sc = np.where(has_s[:, None], nearest_int(iscale[:, None] * scales) & 0xFF, 0)
        imin = F32(15) / np.where(has_m, max_min, F32(1))
        sc = np.where(has_m[:, None], sc | ((nearest_int(imin[:, None] * mins) << 4) & 0xFF), sc).astype(np.uint8)
        d = f16_round(np.where(has_s, max_scale / F32(15), F32(0)))
        dmin = f16_round(np.where(has_m, max_min / F32(15), F32(0)))
    else:  # quantize_row_q2_K_impl
        w = _imatrix_weights(xb, qw, 1, 16)
        sw = seqsum(w).reshape(S, 16)
        scales, mins, L = make_qkx2(xs, w, 3, -0.9, 0.05, 36, False)
        dm, ls = make_qp(scales.reshape(S, 16), 15, sw)
        mm, lm = make_qp(mins.reshape(S, 16), 15, sw)
        sc = ((ls | (lm << 4)) & 0xFF).astype(np.uint8)
        d, dmin = f16_round(dm), f16_round(mm)
    dj = d[:, None] * (sc & 0xF).astype(F32)
    dmj = dmin[:, None] * (sc >> 4).astype(F32)
    L = _requant(xb.reshape(S, 16, 16), dj, dmj, 0, 3, L.reshape(S, 16, 16)).reshape(S, 256)
    return np.concatenate([sc, _pack_2bit(L.astype(np.uint8)), f16_bits(d), f16_bits(dmin)], axis=1)


def q3_k(xb: np.ndarray, qw: np.ndarray | None = None) -> np.ndarray:
    S = len(xb)
    if qw is None:
        scales, L = make_q3(xb.reshape(S * 16, 16), 4)
        scales, L = scales.reshape(S, 16), L.reshape(S, 16, 16)
        amax, max_scale = first_abs_max(scales)
        has = max_scale != 0
        iscale = F32(-32) / np.where(has, max_scale, F32(1))
        l6 = np.where(has[:, None], np.clip(((nearest_int(iscale[:, None] * scales) + 128) & 0xFF) - 128, -32, 31) + 32, 0)
        d = f16_round(np.where(has, F32(1) / iscale, F32(0)))
    else:  # quantize_row_q3_K_impl
        w = _imatrix_weights(xb, qw, 2, 16)
        scales, L = make_qx(xb.reshape(S * 16, 16), 4, w)
        scales, L = scales.reshape(S, 16), L.reshape(S, 16, 16)
        d_block, l6 = make_qx(scales, 32, seqsum(w).reshape(S, 16))
        d = f16_round(d_block)
    sc = np.zeros((S, 12), np.uint8)
    sc[:, 0:8] = (l6[:, 0:8] & 0xF) | ((l6[:, 8:16] & 0xF) << 4)
    hi = l6 >> 4
    sc[:, 8:12] = hi[:, 0:4] | (hi[:, 4:8] << 2) | (hi[:, 8:12] << 4) | (hi[:, 12:16] << 6)
    dj = d[:, None] * (l6 - 32).astype(F32)
    L = (_requant(xb.reshape(S, 16, 16), dj, None, -4, 3, L - 4) + 4).reshape(S, 256).astype(np.uint8)
    hmask = pack_bits((L > 3).reshape(S, 8, 32))
    return np.concatenate([hmask, _pack_2bit(L & 3), sc, f16_bits(d)], axis=1)


def iq4_nl(xb: np.ndarray, qw: np.ndarray | None = None) -> np.ndarray:
    w = xb * xb if qw is None else qw * np.sqrt(sigma2(xb, 2)[:, None] + xb * xb)
    d = iq4_block_scales(xb, w, 7)
    inv = np.where(d != 0, F32(1) / np.where(d != 0, d, F32(1)), F32(0))
    L = best_index_iq4nl(inv[:, None] * xb).astype(np.uint8)
    return np.concatenate([f16_bits(d), L[:, :16] | (L[:, 16:] << 4)], axis=1)


def iq4_xs(xb: np.ndarray, qw: np.ndarray | None = None) -> np.ndarray:
    S = len(xb)
    xs = xb.reshape(S * 8, 32)
    if qw is None:
        w = xs * xs
    else:
        w = qw.reshape(S * 8, 32) * np.sqrt(np.repeat(sigma2(xb, 2), 8)[:, None] + xs * xs)
    scales = iq4_block_scales(xs, w, 7).reshape(S, 8)
    _, max_scale = first_abs_max(scales)
    d = -max_scale / F32(32)
    inv = np.where(d != 0, F32(1) / np.where(d != 0, d, F32(1)), F32(0))
    ls = np.clip(nearest_int(inv[:, None] * scales), -32, 31)
    dl = d[:, None] * ls.astype(F32)
    idl = np.where(dl != 0, F32(1) / np.where(dl != 0, dl, F32(1)), F32(0))
    L = best_index_iq4nl(idl[..., None] * xb.reshape(S, 8, 32)).astype(np.uint8).reshape(S, 8, 32)
    q4 = (L[:, :, :16] | (L[:, :, 16:] << 4)).reshape(S, 128)
    lu = (ls + 32).astype(np.uint16)
    scales_h = np.zeros(S, np.uint16)
    for ib in range(8):
        scales_h |= (lu[:, ib] >> 4) << (2 * ib)
    lu8 = (lu & 0xF).astype(np.uint8)
    scales_l = lu8[:, 0::2] | (lu8[:, 1::2] << 4)
    return np.concatenate([f16_bits(d), scales_h.reshape(S, 1).view(np.uint8), scales_l, q4], axis=1)


# ---- the legacy types with an importance matrix (quantize_row_q{4,5}_{0,1}_impl) ----------------


def _q5_qh(L: np.ndarray) -> np.ndarray:
    return np.packbits((L >> 4) & 1, axis=1, bitorder="little")


def _nib32(L: np.ndarray) -> np.ndarray:
    return (L[:, :16] & 0xF) | ((L[:, 16:] & 0xF) << 4)


def q4_0_weighted(xb: np.ndarray, w: np.ndarray) -> np.ndarray:
    d, L = make_qx(xb, 8, w)
    return np.concatenate([f16_bits(d), _nib32(L.astype(np.uint8))], axis=1)


def q5_0_weighted(xb: np.ndarray, w: np.ndarray) -> np.ndarray:
    d, L = make_qx(xb, 16, w)
    L = L.astype(np.uint8)
    return np.concatenate([f16_bits(d), _q5_qh(L), _nib32(L)], axis=1)


def q4_1_weighted(xb: np.ndarray, w: np.ndarray) -> np.ndarray:
    d, the_min, L = make_qkx2(xb, w, 15, -0.9, 0.05, 36, False)
    return np.concatenate([f16_bits(d), f16_bits(-the_min), _nib32(L.astype(np.uint8))], axis=1)


def q5_1_weighted(xb: np.ndarray, w: np.ndarray) -> np.ndarray:
    d, the_min, L = make_qkx2(xb, w, 31, -0.9, 0.05, 36, False)
    L = L.astype(np.uint8)
    return np.concatenate([f16_bits(d), f16_bits(-the_min), _q5_qh(L), _nib32(L)], axis=1)


#: legacy type name -> encoder(blocks [B, 32], per-value weights [B, 32]) (weights: qw * sqrt(sigma2_row + x^2))
LEGACY_WEIGHTED: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "Q4_0": q4_0_weighted, "Q4_1": q4_1_weighted, "Q5_0": q5_0_weighted, "Q5_1": q5_1_weighted,
}  # fmt: skip


#: type name -> (block size, encoder(blocks [B, block], quant_weights or None) -> bytes [B, size])
KQUANT_ENCODERS: dict[str, tuple[int, Callable[..., np.ndarray]]] = {
    "Q2_K": (256, q2_k),
    "Q3_K": (256, q3_k),
    "Q4_K": (256, q4_k),
    "Q5_K": (256, q5_k),
    "Q6_K": (256, q6_k),
    "IQ4_NL": (32, iq4_nl),
    "IQ4_XS": (256, iq4_xs),
}
