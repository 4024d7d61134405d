"""Numba versions of the per-block arithmetic of the legacy encoders (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0).

This module owns only the scalar loops of ggml's ``quantize_row_*_ref`` (scale, min, quants per
32-value block), in float32 without fastmath, so they give the NumPy references' bits
(:mod:`.quantize`) several times faster; packing the quants and converting scales to fp16 stays
in NumPy there.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

f4 = np.float32
_FLT_MAX = np.float32(3.4028234663852886e38)


@njit(cache=True, inline="always")
def _inv(d):  # noqa: ANN001, ANN202
    return f4(1) / d if d != f4(0) else f4(0)


@njit(parallel=True, cache=True)
def q8_0(xb):  # noqa: ANN001, ANN201
    """(d [B], q int8 [B, 32]): ``roundf(x / (amax / 127))``."""
    B, n = xb.shape
    d = np.empty(B, np.float32)
    q = np.empty((B, n), np.int8)
    for b in prange(B):
        amax = f4(0)
        for j in range(n):
            amax = max(amax, abs(xb[b, j]))
        db = amax / f4(127)
        inv = _inv(db)
        for j in range(n):
            v = np.float64(xb[b, j] * inv)
            q[b, j] = np.int8(math.copysign(math.floor(abs(v) + 0.5), v))
        d[b] = db
    return d, q


@njit(parallel=True, cache=True)
def q_sym(xb, div, bias, top):  # noqa: ANN001, ANN201
    """Q4_0 (div -8, bias 8.5, top 15) and Q5_0 (-16, 16.5, 31): (d [B], q uint8 [B, 32])."""
    B, n = xb.shape
    d = np.empty(B, np.float32)
    q = np.empty((B, n), np.uint8)
    fdiv, fbias = f4(div), f4(bias)
    for b in prange(B):
        amax = f4(0)
        mx = f4(0)
        for j in range(n):
            if amax < abs(xb[b, j]):
                amax = abs(xb[b, j])
                mx = xb[b, j]
        db = mx / fdiv
        inv = _inv(db)
        for j in range(n):
            q[b, j] = min(top, np.int64(xb[b, j] * inv + fbias))
        d[b] = db
    return d, q


@njit(parallel=True, cache=True)
def q_asym(xb, div, top):  # noqa: ANN001, ANN201
    """Q4_1 (div 15, top 15) and Q5_1 (31, no clamp: top 255): (d [B], min [B], q uint8 [B, 32])."""
    B, n = xb.shape
    d = np.empty(B, np.float32)
    m = np.empty(B, np.float32)
    q = np.empty((B, n), np.uint8)
    fdiv = f4(div)
    for b in prange(B):
        mn = _FLT_MAX
        mx = -_FLT_MAX
        for j in range(n):
            if xb[b, j] < mn:
                mn = xb[b, j]
            if xb[b, j] > mx:
                mx = xb[b, j]
        db = (mx - mn) / fdiv
        inv = _inv(db)
        for j in range(n):
            q[b, j] = min(top, np.int64((xb[b, j] - mn) * inv + f4(0.5)))
        d[b] = db
        m[b] = mn
    return d, m, q
