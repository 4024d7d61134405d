"""Numba versions of the per-block scale searches of :mod:`.kquants` (the slow part, 20-50x faster).

This module owns only the inner searches: ``make_qkx2_quants``, ``make_qx_quants``,
``make_q3_quants`` and the IQ4 block-scale search, written as the scalar loops ggml runs, one
block per iteration of a ``prange``. Everything is float32 (integers are converted explicitly,
constants are ``np.float32``) and no fastmath is enabled, so LLVM neither contracts to FMA nor
reassociates: the results are bit-identical to :mod:`.kquants`' NumPy searches, which stay the
reference. The packing around the searches is vectorized NumPy in :mod:`.kquants`.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

f4 = np.float32
_MAGIC = f4(12582912.0)
_LIM = f4(4194303.0)
_EPS = f4(1e-15)
_KV = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)


@njit(cache=True)
def nearest_int(fv: float) -> int:
    """ggml's ``nearest_int`` (see :func:`.quantize_common.nearest_int`), scalar."""
    val = fv + _MAGIC
    if fv >= -_LIM and fv <= _LIM:
        return np.int64(val) - 12582912
    if val != val:
        return 0
    if np.isinf(val):
        return -4194304
    fr, _ = math.frexp(np.float64(val))
    return (np.int64(abs(fr) * 16777216.0) & 0x7FFFFF) - 0x400000


@njit(cache=True, inline="always")
def _ni(fv: float) -> int:
    """``nearest_int`` for |fv| <= 2^22 (where ggml asserts it is used): the float add rounds."""
    return np.int64(fv + _MAGIC) - 12582912


@njit(cache=True)
def _qkx2_block(x, w, nmax, rmin, rdelta, nstep, use_mad, L, Laux):  # noqa: ANN001, ANN202
    n = x.shape[0]
    mn = x[0]
    mx = x[0]
    sum_w = w[0]
    sum_x = sum_w * x[0]
    for i in range(1, n):
        if x[i] < mn:
            mn = x[i]
        if x[i] > mx:
            mx = x[i]
        sum_w += w[i]
        sum_x += w[i] * x[i]
    if mn > f4(0):
        mn = f4(0)
    if mx == mn:
        for i in range(n):
            L[i] = 0
        return f4(0), -mn
    fnmax = f4(nmax)
    iscale = fnmax / (mx - mn)
    scale = f4(1) / iscale
    best = f4(0)
    for i in range(n):
        L[i] = max(0, min(nmax, _ni(iscale * (x[i] - mn))))
        diff = scale * f4(L[i]) + mn - x[i]
        diff = abs(diff) if use_mad else diff * diff
        best += w[i] * diff
    for step in range(nstep + 1):
        iscale = (rmin + rdelta * f4(step) + fnmax) / (mx - mn)
        sl = f4(0)
        sl2 = f4(0)
        sxl = f4(0)
        for i in range(n):
            q = max(0, min(nmax, _ni(iscale * (x[i] - mn))))
            Laux[i] = q
            wl = w[i] * f4(q)
            sl += wl
            sl2 += wl * f4(q)
            sxl += wl * x[i]
        D = sum_w * sl2 - sl * sl
        if D > f4(0):
            ts = (sum_w * sxl - sum_x * sl) / D
            tm = (sl2 * sum_x - sl * sxl) / D
            if tm > f4(0):
                tm = f4(0)
                ts = sxl / sl2
            cur = f4(0)
            for i in range(n):
                diff = ts * f4(Laux[i]) + tm - x[i]
                diff = abs(diff) if use_mad else diff * diff
                cur += w[i] * diff
            if cur < best:
                for i in range(n):
                    L[i] = Laux[i]
                best = cur
                scale = ts
                mn = tm
    return scale, -mn


@njit(parallel=True, cache=True)
def make_qkx2(x, w, nmax, rmin, rdelta, nstep, use_mad):  # noqa: ANN001, ANN201
    B, n = x.shape
    scale = np.empty(B, np.float32)
    the_min = np.empty(B, np.float32)
    L = np.empty((B, n), np.int32)
    for b in prange(B):
        Laux = np.empty(n, np.int32)
        s, m = _qkx2_block(x[b], w[b], nmax, f4(rmin), f4(rdelta), nstep, use_mad, L[b], Laux)
        scale[b] = s
        the_min[b] = m
    return scale, the_min, L


@njit(cache=True)
def _first_abs_max(x):  # noqa: ANN001, ANN202
    amax = f4(0)
    mx = f4(0)
    for i in range(x.shape[0]):
        ax = abs(x[i])
        if ax > amax:
            amax = ax
            mx = x[i]
    return amax, mx


@njit(cache=True)
def _qx_trial(x, w, nmax, iscale, L):  # noqa: ANN001, ANN202
    sumlx = f4(0)
    suml2 = f4(0)
    for i in range(x.shape[0]):
        q = max(-nmax, min(nmax - 1, _ni(iscale * x[i])))
        L[i] = q + nmax
        lf = f4(q)
        sumlx += w[i] * x[i] * lf
        suml2 += w[i] * lf * lf
    return sumlx, suml2


@njit(parallel=True, cache=True)
def make_qx(x, w, nmax):  # noqa: ANN001, ANN201
    B, n = x.shape
    scale = np.zeros(B, np.float32)
    L = np.zeros((B, n), np.int32)
    for b in prange(B):
        xb = x[b]
        amax, mx = _first_abs_max(xb)
        if amax < _EPS:
            continue
        Lt = np.empty(n, np.int32)
        sumlx, suml2 = _qx_trial(xb, w[b], nmax, f4(-nmax) / mx, L[b])
        s = sumlx / suml2 if suml2 != f4(0) else f4(0)
        best = s * sumlx
        for step in range(-9, 10):
            if step == 0:
                continue
            sumlx, suml2 = _qx_trial(xb, w[b], nmax, -(f4(nmax) + f4(0.1) * f4(step)) / mx, Lt)
            if suml2 > f4(0) and sumlx * sumlx > best * suml2:
                L[b, :] = Lt
                s = sumlx / suml2
                best = s * sumlx
        scale[b] = s
    return scale, L


@njit(parallel=True, cache=True)
def make_q3(x, nmax):  # noqa: ANN001, ANN201
    B, n = x.shape
    scale = np.zeros(B, np.float32)
    Lout = np.zeros((B, n), np.int32)
    for b in prange(B):
        xb = x[b]
        amax, mx = _first_abs_max(xb)
        if amax < _EPS:
            continue
        L = Lout[b]
        iscale = f4(-nmax) / mx
        sumlx = f4(0)
        suml2 = f4(0)
        for i in range(n):
            q = max(-nmax, min(nmax - 1, nearest_int(iscale * xb[i])))
            L[i] = q
            w = xb[i] * xb[i]
            sumlx += w * xb[i] * f4(q)
            suml2 += w * f4(q) * f4(q)
        for _ in range(5):
            changed = 0
            for i in range(n):
                w = xb[i] * xb[i]
                slx = sumlx - w * xb[i] * f4(L[i])
                if slx > f4(0):
                    sl2 = suml2 - w * f4(L[i]) * f4(L[i])
                    new_l = max(-nmax, min(nmax - 1, nearest_int(xb[i] * sl2 / slx)))
                    if new_l != L[i]:
                        slx += w * xb[i] * f4(new_l)
                        sl2 += w * f4(new_l) * f4(new_l)
                        if sl2 > f4(0) and slx * slx * suml2 > sumlx * sumlx * sl2:
                            L[i] = new_l
                            sumlx = slx
                            suml2 = sl2
                            changed += 1
            if changed == 0:
                break
        for i in range(n):
            L[i] += nmax
        scale[b] = sumlx / suml2 if suml2 > f4(0) else f4(0)
    return scale, Lout


@njit(cache=True)
def best_index_iq4nl(v):  # noqa: ANN001, ANN201
    # ggml bisects; counting the table values <= v finds the same bracket without branches
    hi = 0
    for k in range(16):
        hi += v >= _KV[k]
    hi = min(max(hi, 1), 15)
    return hi - 1 if v - _KV[hi - 1] < _KV[hi] - v else hi


@njit(cache=True)
def _iq4_trial(x, w, inv):  # noqa: ANN001, ANN202
    sumqx = f4(0)
    sumq2 = f4(0)
    for j in range(x.shape[0]):
        q = _KV[best_index_iq4nl(inv * x[j])]
        sumqx += w[j] * q * x[j]
        sumq2 += w[j] * q * q
    return sumqx, sumq2


@njit(parallel=True, cache=True)
def iq4_block_scales(x, w, ntry):  # noqa: ANN001, ANN201
    B = x.shape[0]
    out = np.zeros(B, np.float32)
    for b in prange(B):
        amax, mx = _first_abs_max(x[b])
        if amax < _EPS:
            continue
        d = -mx / _KV[0] if ntry > 0 else mx / _KV[0]
        sumqx, sumq2 = _iq4_trial(x[b], w[b], f4(1) / d)
        d = sumqx / sumq2 if sumq2 > f4(0) else f4(0)
        best = d * sumqx
        for itry in range(-ntry, ntry + 1):
            sumqx, sumq2 = _iq4_trial(x[b], w[b], f4(itry - 127) / mx)
            if sumq2 > f4(0) and sumqx * sumqx > best * sumq2:
                d = sumqx / sumq2
                best = d * sumqx
        out[b] = d
    return out
