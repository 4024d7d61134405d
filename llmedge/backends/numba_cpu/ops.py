"""Float ops of the Numba backend, as llama.cpp's CPU arithmetic: RMS norm, RoPE (linear, YaRN,
frequency factors), SiLU/GELU gated products, attention over an F16/F32 cache (ggml's vec_dot
order for one query row, llamafile's for several), softmax and soft-cap."""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange, types
from numba.extending import overload

from llmedge.backends.numba_cpu.common import F32
from llmedge.backends.numba_cpu.intrinsics import (
    _axpy_row,
    _f2h,
    _fma,
    _h2f,
    _lanes_fma8,
    _lanes_fma8_x4,
    _lanes_fma32,
    _round_h,
    _v_expf,
)

# ---------------------------------------------------------------------------------------------
# float ops


@njit(cache=True)
def _rms_norm_rows(x, w, has_w, eps, out, r0, r1):
    d = x.shape[1]
    for r in range(r0, r1):
        s = 0.0
        for e in range(d):
            s += np.float64(x[r, e] * x[r, e])
        mean = F32(s / d)
        scale = F32(1.0) / np.sqrt(mean + eps)
        if has_w:
            for e in range(d):
                out[r, e] = (x[r, e] * scale) * w[e]
        else:
            for e in range(d):
                out[r, e] = x[r, e] * scale


@njit(parallel=True, cache=True)
def _rms_norm_par(x, w, has_w, eps, out):
    n = x.shape[0]
    nc = min(n, 64)
    for c in prange(nc):
        _rms_norm_rows(x, w, has_w, eps, out, c * n // nc, (c + 1) * n // nc)


@njit
def _rope_rows(x, pos, n_rot, freq_scale, theta_scale, neox, ff, has_ff, mscale, ext, lo, hi, out, r0, r1):
    n_head, hd = x.shape[1], x.shape[2]
    half = n_rot // 2
    cache = np.empty(n_rot, np.float32)
    for r in range(r0, r1):
        theta = F32(pos[r])
        for i0 in range(0, n_rot, 2):
            f = ff[i0 // 2] if has_ff else F32(1.0)
            extrap = theta / f
            th = freq_scale * extrap
            if ext != F32(0.0):  # YaRN (ggml's rope_yarn): ramp between interpolated and extrapolated
                y = (F32(i0 // 2) - lo) / max(F32(0.001), hi - lo)
                mix = (F32(1.0) - min(F32(1.0), max(F32(0.0), y))) * ext
                th = th * (F32(1.0) - mix) + extrap * mix
            cache[i0] = F32(math.cos(th)) * mscale
            cache[i0 + 1] = F32(math.sin(th)) * mscale
            theta = theta * theta_scale
        for h in range(n_head):
            for i0 in range(0, n_rot, 2):
                a = i0 // 2 if neox else i0
                b = i0 // 2 + half if neox else i0 + 1
                x0 = x[r, h, a]
                x1 = x[r, h, b]
                c = cache[i0]
                s = cache[i0 + 1]
                out[r, h, a] = _fma(x0, c, -(x1 * s))
                out[r, h, b] = _fma(x0, s, x1 * c)
            for e in range(n_rot, hd):
                out[r, h, e] = x[r, h, e]


@njit(cache=True)
def _rope_ser(x, pos, n_rot, freq_scale, theta_scale, neox, ff, has_ff, mscale, ext, lo, hi, out):
    _rope_rows(x, pos, n_rot, freq_scale, theta_scale, neox, ff, has_ff, mscale, ext, lo, hi, out, 0, x.shape[0])


@njit(parallel=True, cache=True)
def _rope_par(x, pos, n_rot, freq_scale, theta_scale, neox, ff, has_ff, mscale, ext, lo, hi, out):
    n = x.shape[0]
    nc = min(n, 64)
    for c in prange(nc):
        _rope_rows(x, pos, n_rot, freq_scale, theta_scale, neox, ff, has_ff, mscale, ext, lo, hi, out,
                   c * n // nc, (c + 1) * n // nc)


_GELU_A = F32(0.044715)
_SQRT_2_OVER_PI = F32(0.79788456080286535587989211986876)


@njit(cache=True)
def _build_gelu_table():
    """ggml's GELU lookup table: float32 values of the F16 results for every F16 input."""
    tab = np.empty(65536, np.float32)
    for i in range(65536):
        f = _h2f(i)
        inner = _fma(_GELU_A * f, f, F32(1.0))
        g = F32(0.5) * f * (F32(1.0) + math.tanh(_SQRT_2_OVER_PI * f * inner))
        tab[i] = _round_h(g)
    return tab


@njit
def _glu_range(g, u, kind, tab, out, i0, i1, d):
    """out[i] = act(g[i]) * u[i] over flat rows of ``d`` values: SiLU restarts ggml's 8-wide vector loop at
    every row (ggml_vec_swiglu_f32 per row), so a row's last d % 8 values take libm's expf."""
    d8 = d & ~7
    for i in range(i0, i1):
        x = g[i]
        if kind == 0:
            if i % d < d8:
                y = x / (F32(1.0) + _v_expf(F32(0.0) - x))
            else:
                y = x / (F32(1.0) + F32(math.exp(-x)))
            out[i] = y * u[i]
        elif x <= F32(-10.0):
            out[i] = F32(0.0)
        elif x >= F32(10.0):
            out[i] = x * u[i]
        else:
            out[i] = tab[_f2h(x)] * u[i]


@njit(cache=True)
def _glu_ser(g, u, kind, tab, out, d):
    n = g.shape[0]
    _glu_range(g, u, kind, tab, out, 0, n, d)


@njit(parallel=True, cache=True)
def _glu_par(g, u, kind, tab, out, d):
    n = g.shape[0]
    nc = (n + 4095) // 4096
    for c in prange(nc):
        _glu_range(g, u, kind, tab, out, c * 4096, min(n, (c + 1) * 4096), d)


@njit
def _hsum8(v, o):
    """llama.cpp's hsum of 8 lanes v[o:o+8]: ((4+0) + (6+2)) + ((5+1) + (7+3))."""
    r0 = v[o + 4] + v[o]
    r1 = v[o + 5] + v[o + 1]
    r2 = v[o + 6] + v[o + 2]
    r3 = v[o + 7] + v[o + 3]
    return (r0 + r2) + (r1 + r3)


@njit
def _reduce_ggml4(acc):
    """ggml's reduction of 4 accumulators of 8 lanes acc[0:32]: ((s0+s2)+(s1+s3)), lanes l+(l+4), two hadds."""
    t0 = F32(0.0)
    t1 = F32(0.0)
    t2 = F32(0.0)
    t3 = F32(0.0)
    for ll in range(4):
        xl = (acc[ll] + acc[16 + ll]) + (acc[8 + ll] + acc[24 + ll])
        xh = (acc[ll + 4] + acc[20 + ll]) + (acc[12 + ll] + acc[28 + ll])
        v = xl + xh
        if ll == 0:
            t0 = v
        elif ll == 1:
            t1 = v
        elif ll == 2:
            t2 = v
        else:
            t3 = v
    return (t0 + t1) + (t2 + t3)


def _kv(a, j, g, e):  # pragma: no cover - replaced by the overload below inside kernels
    raise NotImplementedError


@overload(_kv)
def _kv_impl(a, j, g, e):
    if a.dtype == types.uint16:
        return lambda a, j, g, e: _h2f(a[j, g, e])
    return lambda a, j, g, e: a[j, g, e]


@njit
def _attn_row(q, k, v, f16, i, h, group, qpos, kpos, scale, window, softcap, n, w, qc, acc, out):
    """One query row and head, llama.cpp's attention without flash-attention on AVX2 (see native)."""
    d = q.shape[2]
    t = k.shape[0]
    g = h // group
    nkv = k.shape[1]
    tb_kq = n >= 2 and d % 8 == 0
    tb_kqv = n >= 2 and d % 4 == 0
    for e in range(d):
        qc[e] = _round_h(q[i, h, e]) if f16 else q[i, h, e]
    qp = qpos[i]
    inv_cap = F32(1.0) / softcap if softcap > F32(0.0) else F32(0.0)
    mx = -np.inf
    jlo = t
    jhi = -1
    lanes = acc[:32]
    j4 = 0
    for j in range(t):
        kp = kpos[j]
        if kp < 0 or kp > qp or (window > 0 and qp - kp >= window):
            w[j] = -np.inf
            continue
        if j < jlo:
            jlo = j
        jhi = j
        if tb_kq:
            # keys four at a time (each one's lanes as alone; masked keys among them go unused)
            if j < j4:
                s = _hsum8(lanes, 8 * (j - j4 + 4))
            elif j + 4 <= t:
                _lanes_fma8_x4(k, (j * nkv + g) * d, nkv * d, qc, d, lanes)
                j4 = j + 4
                s = _hsum8(lanes, 0)
            else:
                _lanes_fma8(k, (j * nkv + g) * d, qc, d, lanes)
                s = _hsum8(lanes, 0)
        else:
            np_ = d & ~31
            _lanes_fma32(k, (j * nkv + g) * d, qc, np_, lanes)
            s = _reduce_ggml4(lanes)
            if np_ < d:
                if f16:
                    sd = np.float64(s)
                    for e in range(np_, d):
                        sd += np.float64(_kv(k, j, g, e) * qc[e])
                    s = F32(sd)
                else:
                    for e in range(np_, d):
                        s = _fma(_kv(k, j, g, e), qc[e], s)
        if softcap > F32(0.0):
            s = F32(math.tanh(s * inv_cap)) * softcap
        s = s * scale
        w[j] = s
        if s > mx:
            mx = s
    if jhi < 0:
        for e in range(d):
            out[i, h, e] = F32(0.0)
        return
    t8 = (t + 7) & ~7
    for j in range(t, t8):
        w[j] = -np.inf
    c0 = jlo & ~7
    c1 = (jhi + 8) & ~7
    mxf = F32(mx)
    total = 0.0
    for c in range(c0, c1, 8):
        for ll in range(8):
            w[c + ll] = _v_expf(w[c + ll] - mxf)
        total += np.float64(_hsum8(w, c))
    inv = F32(1.0 / total)
    for j in range(jlo, jhi + 1):
        p = w[j] * inv
        w[j] = _round_h(p) if f16 else p
    nl = 8 if tb_kqv else 32
    for ll in range(nl * d):
        acc[ll] = F32(0.0)
    for j in range(jlo, jhi + 1):
        p = w[j]
        if p == F32(0.0):
            continue
        _axpy_row(v, (j * nkv + g) * d, p, acc, (j % nl) * d, d)
    for e in range(d):
        if nl == 8:
            r = ((acc[4 * d + e] + acc[e]) + (acc[6 * d + e] + acc[2 * d + e])) + \
                ((acc[5 * d + e] + acc[d + e]) + (acc[7 * d + e] + acc[3 * d + e]))
        else:
            t0 = F32(0.0)
            t1 = F32(0.0)
            t2 = F32(0.0)
            t3 = F32(0.0)
            for ll in range(4):
                xl = (acc[ll * d + e] + acc[(16 + ll) * d + e]) + (acc[(8 + ll) * d + e] + acc[(24 + ll) * d + e])
                xh = (acc[(ll + 4) * d + e] + acc[(20 + ll) * d + e]) + \
                    (acc[(12 + ll) * d + e] + acc[(28 + ll) * d + e])
                vv = xl + xh
                if ll == 0:
                    t0 = vv
                elif ll == 1:
                    t1 = vv
                elif ll == 2:
                    t2 = vv
                else:
                    t3 = vv
            r = (t0 + t1) + (t2 + t3)
        out[i, h, e] = r


@njit(parallel=True, cache=True)
def _attention(q, k, v, f16, qpos, kpos, scale, window, softcap, out):
    n, n_head, d = q.shape
    t = k.shape[0]
    group = n_head // k.shape[1]
    tasks = n * n_head
    nc = min(tasks, 256)
    for c in prange(nc):
        w = np.empty(((t + 7) & ~7) + 8, np.float32)
        qc = np.empty(d, np.float32)
        acc = np.empty(max(32 * d, 32), np.float32)
        for task in range(c, tasks, nc):  # strided: a causal prompt's late rows cost more than its early ones
            _attn_row(q, k, v, f16, task // n_head, task % n_head, group, qpos, kpos, scale, window, softcap, n,
                      w, qc, acc, out)


@njit(cache=True)
def _softmax_rows(x, scale, out):
    n, d = x.shape
    for r in range(n):
        mx = -np.inf
        for e in range(d):
            out[r, e] = x[r, e] * scale
            if out[r, e] > mx:
                mx = out[r, e]
        mxf = F32(mx)
        total = 0.0
        d8 = d & ~7
        for c in range(0, d8, 8):
            for ll in range(8):
                out[r, c + ll] = _v_expf(out[r, c + ll] - mxf)
            total += np.float64(_hsum8(out[r], c))
        for e in range(d8, d):
            val = F32(math.exp(out[r, e] - mxf))
            total += np.float64(val)
            out[r, e] = val
        inv = F32(1.0 / total)
        for e in range(d):
            out[r, e] = out[r, e] * inv


@njit(cache=True)
def _softcap(x, cap, out):
    inv = F32(1.0) / cap
    for i in range(x.shape[0]):
        out[i] = F32(math.tanh(x[i] * inv)) * cap
