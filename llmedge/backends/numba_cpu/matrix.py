"""Matrix drivers of the Numba backend: the parallel ``x @ W.T`` kernels per weight family (rows
split over threads with ``prange``), F32/F16/BF16 products, and row gather (embeddings) equal to
the NumPy dequantizers bit for bit."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from llmedge.backends.numba_cpu.common import (
    F32,
    KVALUES_IQ4NL,
    TBF16,
    TF16,
    TIQ4_NL,
    TIQ4_XS,
    TQ2_K,
    TQ3_K,
    TQ4_0,
    TQ4_1,
    TQ4_K,
    TQ5_0,
    TQ5_1,
    TQ5_K,
    TQ6_K,
    TQ8_0,
)
from llmedge.backends.numba_cpu.dots import (
    _decode_q6_k_row,
    _k_scale_min,
    _q3_k_scale,
    _q4_k_row_scales,
    _quant_q8_block,
    _quant_q8_k_block,
    _quantize_q8_0,
    _quantize_q8_1,
    _quantize_q8_k,
    _row_k_fast,
    _row_k_tiled,
    _row_q4_k_r8,
    _row_q6_k_dec,
    _row_q8_0_family,
    _row_q8_1_family,
    _row_q8_k_family,
    _u,
)
from llmedge.backends.numba_cpu.intrinsics import (
    FAST_ROWS,
    _gemv_q8_0,
    _h2f,
    _hb,
    _q4_k_rows4,
    _q6_k_rows4,
    _round_bf16,
    _round_h,
    _rowdot4_q4_0,
    _rowdot4_q4_1,
    _rowdot4_q5_0,
    _rowdot4_q5_1,
    _rowdot4_q8_0,
    _rowdotw4_q4_0,
    _rowdotw4_q4_1,
    _rowdotw4_q5_0,
    _rowdotw4_q5_1,
    _u32_as_f32,
)

# ---------------------------------------------------------------------------------------------
# matrix products: x [n, k] float32 times weight rows [m, row bytes] -> out [n, m]


@njit
def _as_q8_0(t, wr, nb, w8):
    """A Q4_0 / Q5_0 row as Q8_0 blocks: each block's F16 scale bytes, then its 32 values as signed
    bytes (q - 8, or q - 16 with the fifth bit): exactly what their kernels multiply."""
    bsz = 18 if t == TQ4_0 else 22
    for b in range(nb):
        o = b * bsz
        p = b * 34
        w8[p] = wr[o]
        w8[p + 1] = wr[o + 1]
        if t == TQ4_0:
            for e in range(16):
                q = np.int32(wr[o + 2 + e])
                w8[p + 2 + e] = np.uint8(((q & 15) - 8) & 255)
                w8[p + 18 + e] = np.uint8(((q >> 4) - 8) & 255)
        else:
            qh = np.uint32(wr[o + 2]) | (np.uint32(wr[o + 3]) << 8) | (np.uint32(wr[o + 4]) << 16) | \
                (np.uint32(wr[o + 5]) << 24)
            for e in range(32):
                q = np.int32(wr[o + 6 + (e & 15)])
                v = ((q & 15) if e < 16 else (q >> 4)) | (np.int32((qh >> np.uint32(e)) & np.uint32(1)) << 4)
                w8[p + 2 + e] = np.uint8((v - 16) & 255)


@njit(parallel=True, cache=True)
def _mm_q8_0(x, wu, wi, t, out):
    n, k = x.shape
    m = wu.shape[0]
    nb = k // 32
    aq = np.empty((n, k), np.int8)
    ad = np.empty((n, nb), np.float32)
    asum = np.empty((n, nb), np.int32)
    if n >= 8:
        for i in prange(n):
            for b in range(nb):
                d, _, s = _quant_q8_block(x, i, b * 32, aq, False)
                ad[i, b] = d
                asum[i, b] = s
    else:
        _quantize_q8_0(x, aq, ad, asum)
    n4 = n - n % 4 if FAST_ROWS and t != TIQ4_NL else 0
    if n < 4 and FAST_ROWS and t == TQ8_0:
        # decode: Q8_0 one row at a time (four 34-byte-block streams at once read from memory at
        # under half this rate), each thread's rows in one call
        nc = min(m, 64)
        for c in prange(nc):
            for i in range(n):
                _gemv_q8_0(wu, c * m // nc, (c + 1) * m // nc, aq[i], ad[i], ad[i], out[i])
        return
    if n < 4 and FAST_ROWS and t != TIQ4_NL and t != TQ8_0 and m >= 4:
        # decode: four weight rows per step (the same per-row sums as the one-row kernel)
        m4 = m // 4
        for j4 in prange(m4):
            j = 4 * j4
            for i in range(n):
                if t == TQ4_0:
                    r0, r1, r2, r3 = _rowdotw4_q4_0(wu, j, aq[i], ad[i], ad[i], nb)
                else:
                    r0, r1, r2, r3 = _rowdotw4_q5_0(wu, j, aq[i], ad[i], ad[i], nb)
                out[i, j] = r0
                out[i, j + 1] = r1
                out[i, j + 2] = r2
                out[i, j + 3] = r3
        for j in range(4 * m4, m):
            for i in range(n):
                out[i, j] = _row_q8_0_family(t, wu[j], wi[j], aq[i], ad[i], asum[i], nb)
        return
    for j in prange(m):
        wr = wu[j]
        wir = wi[j]
        w8 = wr
        if n4 >= 8 and t != TQ8_0:
            # many activation rows: the 4/5-bit row decoded once into Q8_0 blocks (the same signed
            # values and scale, so the same products), not once per four activation rows
            w8 = np.empty(nb * 34, np.uint8)
            _as_q8_0(t, wr, nb, w8)
        for i in range(0, n4, 4):
            if t == TQ8_0 or n4 >= 8:
                r0, r1, r2, r3 = _rowdot4_q8_0(w8, aq, ad, ad, i, nb)
            elif t == TQ4_0:
                r0, r1, r2, r3 = _rowdot4_q4_0(wr, aq, ad, ad, i, nb)
            else:
                r0, r1, r2, r3 = _rowdot4_q5_0(wr, aq, ad, ad, i, nb)
            out[i, j] = r0
            out[i + 1, j] = r1
            out[i + 2, j] = r2
            out[i + 3, j] = r3
        for i in range(n4, n):
            out[i, j] = _row_q8_0_family(t, wr, wir, aq[i], ad[i], asum[i], nb)


@njit(parallel=True, cache=True)
def _mm_q8_1(x, wu, t, out):
    n, k = x.shape
    m = wu.shape[0]
    nb = k // 32
    aq = np.empty((n, k), np.int8)
    ad = np.empty((n, nb), np.float32)
    asm = np.empty((n, nb), np.float32)
    if n >= 8:
        for i in prange(n):
            for b in range(nb):
                d, s16, _ = _quant_q8_block(x, i, b * 32, aq, True)
                ad[i, b] = d
                asm[i, b] = s16
    else:
        _quantize_q8_1(x, aq, ad, asm)
    n4 = n - n % 4 if FAST_ROWS else 0
    if n < 4 and FAST_ROWS and m >= 4:
        # decode: four weight rows per step (the same per-row sums as the one-row kernel)
        m4 = m // 4
        for j4 in prange(m4):
            j = 4 * j4
            for i in range(n):
                if t == TQ4_1:
                    r0, r1, r2, r3 = _rowdotw4_q4_1(wu, j, aq[i], ad[i], asm[i], nb)
                else:
                    r0, r1, r2, r3 = _rowdotw4_q5_1(wu, j, aq[i], ad[i], asm[i], nb)
                out[i, j] = r0
                out[i, j + 1] = r1
                out[i, j + 2] = r2
                out[i, j + 3] = r3
        for j in range(4 * m4, m):
            for i in range(n):
                out[i, j] = _row_q8_1_family(t, wu[j], aq[i], ad[i], asm[i], nb)
        return
    for j in prange(m):
        wr = wu[j]
        for i in range(0, n4, 4):
            if t == TQ4_1:
                r0, r1, r2, r3 = _rowdot4_q4_1(wr, aq, ad, asm, i, nb)
            else:
                r0, r1, r2, r3 = _rowdot4_q5_1(wr, aq, ad, asm, i, nb)
            out[i, j] = r0
            out[i + 1, j] = r1
            out[i + 2, j] = r2
            out[i + 3, j] = r3
        for i in range(n4, n):
            out[i, j] = _row_q8_1_family(t, wr, aq[i], ad[i], asm[i], nb)


@njit(parallel=True, cache=True)
def _mm_q8_k(x, wu, wi, t, out):
    n, k = x.shape
    m = wu.shape[0]
    nsb = k // 256
    aq = np.empty((n, k), np.int8)
    ad = np.empty((n, nsb), np.float32)
    bs = np.empty((n, k // 16), np.int32)
    if n >= 8:
        for i in prange(n):
            for b in range(nsb):
                ad[i, b] = _quant_q8_k_block(x, i, b * 256, aq, bs, b * 16)
    else:
        _quantize_q8_k(x, aq, ad, bs)
    nc = min(m, 128)
    fast = FAST_ROWS and (t == TQ4_K or t == TQ5_K or t == TQ6_K)
    tiled = n >= 8  # llama.cpp's tiled K-quant GEMM order, as native's lle_matmul_impl picks it
    dec = fast and t == TQ6_K and tiled  # a prompt: each Q6_K row unpacked once, not once per activation row
    for c in prange(nc):
        scb = np.empty(16, np.int32)
        qd = np.empty(nsb * 256 if dec else 1, np.uint8)
        for j in range(c * m // nc, (c + 1) * m // nc):
            wr = wu[j]
            wir = wi[j]
            i4 = 0
            if dec:
                _decode_q6_k_row(wr, nsb, qd)
                i4 = n - n % 4
                for i in range(0, i4, 4):
                    r0, r1, r2, r3 = _q6_k_rows4(qd, wr, aq, ad, bs, i, nsb)
                    out[i, j] = r0
                    out[i + 1, j] = r1
                    out[i + 2, j] = r2
                    out[i + 3, j] = r3
            for i in range(i4, n):
                if dec:
                    out[i, j] = _row_q6_k_dec(qd, wr, wir, aq[i], ad[i], bs[i], nsb, scb)
                elif tiled:
                    out[i, j] = _row_k_tiled(t, wr, wir, aq[i], ad[i], bs[i], nsb, scb)
                elif fast:
                    out[i, j] = _row_k_fast(t, wr, wir, aq[i], ad[i], bs[i], nsb, scb)
                else:
                    out[i, j] = _row_q8_k_family(t, wr, wir, aq[i], ad[i], bs[i], nsb)


@njit(parallel=True, cache=True)
def _mm_q4_k(x, wu, wi, out):
    """Q4_K with llama.cpp's choice of kernel per product (as ``lle_matmul_impl`` makes it): with a
    multiple of 8 weight rows the repacked order, its GEMM (and its activation quantizer) for the
    first n - n % 4 rows when n > 3 and its GEMV for the rest; else from 8 rows the tiled order;
    else ggml's AVX2 vec_dot."""
    n, k = x.shape
    m = wu.shape[0]
    nsb = k // 256
    aq = np.empty((n, k), np.int8)
    ad = np.empty((n, nsb), np.float32)
    bs = np.empty((n, k // 16), np.int32)
    r8 = m % 8 == 0
    n_head = n - n % 4 if r8 and n > 3 else 0
    mode = 1 if r8 else (2 if n >= 8 else 0)
    if n >= 8:
        for i in prange(n):
            for b in range(nsb):
                ad[i, b] = _quant_q8_k_block(x, i, b * 256, aq, bs, b * 16, i < n_head)
    else:
        for i in range(n):
            for b in range(nsb):
                ad[i, b] = _quant_q8_k_block(x, i, b * 256, aq, bs, b * 16, i < n_head)
    nc = min(m, 128)
    for c in prange(nc):
        scb = np.empty(16, np.int32)
        sm = np.empty((nsb, 16), np.int32)
        hdm = np.empty((nsb, 2), np.float32)
        for j in range(c * m // nc, (c + 1) * m // nc):
            wr = wu[j]
            wir = wi[j]
            if n_head > 0:  # only in mode 1
                _q4_k_row_scales(wr, nsb, sm, hdm)
            for i in range(0, n_head, 4):
                r0, r1, r2, r3 = _q4_k_rows4(wr, sm, hdm, aq, ad, bs, i, nsb)
                out[i, j] = r0
                out[i + 1, j] = r1
                out[i + 2, j] = r2
                out[i + 3, j] = r3
            for i in range(n_head, n):
                if mode == 1:
                    out[i, j] = _row_q4_k_r8(wr, aq[i], ad[i], bs[i], nsb, scb)
                elif mode == 2:
                    out[i, j] = _row_k_tiled(TQ4_K, wr, wir, aq[i], ad[i], bs[i], nsb, scb)
                elif FAST_ROWS:
                    out[i, j] = _row_k_fast(TQ4_K, wr, wir, aq[i], ad[i], bs[i], nsb, scb)
                else:
                    out[i, j] = _row_q8_k_family(TQ4_K, wr, wir, aq[i], ad[i], bs[i], nsb)


@njit(parallel=True, cache=True)
def _mm_f32(x, w, out):
    """F32 weights: float32 products summed in double (ggml's generic F32 dot)."""
    n, k = x.shape
    m = w.shape[0]
    for j in prange(m):
        for i in range(n):
            s = 0.0
            for e in range(k):
                s += np.float64(x[i, e] * w[j, e])
            out[i, j] = F32(s)


@njit(parallel=True, cache=True)
def _mm_half(x, w, bf16, out):
    """F16 / BF16 weights (uint16 bits): activations rounded to the weight type, products summed in double."""
    n, k = x.shape
    m = w.shape[0]
    xr = np.empty((n, k), np.float32)
    for i in range(n):
        for e in range(k):
            xr[i, e] = _round_bf16(x[i, e]) if bf16 else _round_h(x[i, e])
    for j in prange(m):
        for i in range(n):
            s = 0.0
            for e in range(k):
                wv = _u32_as_f32(np.uint32(w[j, e]) << np.uint32(16)) if bf16 else _h2f(w[j, e])
                s += np.float64(wv * xr[i, e])
            out[i, j] = F32(s)


# ---------------------------------------------------------------------------------------------
# dequantization of whole rows (get_rows), bit-exact with llmedge.quant.dequantize


@njit
def _dequant_row(t, wu, wi, y):
    k = y.shape[0]
    if t == TQ8_0:
        for b in range(k // 32):
            o = b * 34
            d = _hb(wu, o)
            for e in range(32):
                y[b * 32 + e] = d * F32(wi[o + 2 + e])
    elif t == TQ4_0 or t == TIQ4_NL:
        for b in range(k // 32):
            o = b * 18
            d = _hb(wu, o)
            for e in range(16):
                q = _u(wu, o + 2 + e)
                if t == TQ4_0:
                    y[b * 32 + e] = d * F32(np.int32(q & 15) - 8)
                    y[b * 32 + 16 + e] = d * F32(np.int32(q >> 4) - 8)
                else:
                    y[b * 32 + e] = d * F32(KVALUES_IQ4NL[q & 15])
                    y[b * 32 + 16 + e] = d * F32(KVALUES_IQ4NL[q >> 4])
    elif t == TQ4_1:
        for b in range(k // 32):
            o = b * 20
            d = _hb(wu, o)
            mn = _hb(wu, o + 2)
            for e in range(16):
                q = _u(wu, o + 4 + e)
                y[b * 32 + e] = d * F32(q & 15) + mn
                y[b * 32 + 16 + e] = d * F32(q >> 4) + mn
    elif t == TQ5_0 or t == TQ5_1:
        bsz = 22 if t == TQ5_0 else 24
        ho = 2 if t == TQ5_0 else 4
        for b in range(k // 32):
            o = b * bsz
            d = _hb(wu, o)
            mn = _hb(wu, o + 2) if t == TQ5_1 else F32(0.0)
            qh = np.uint32(_u(wu, o + ho)) | (np.uint32(_u(wu, o + ho + 1)) << 8) | (np.uint32(_u(wu, o + ho + 2)) << 16) | \
                (np.uint32(_u(wu, o + ho + 3)) << 24)
            for e in range(32):
                q = _u(wu, o + ho + 4 + (e & 15))
                v = np.int32((q & 15) if e < 16 else (q >> 4)) | np.int32(((qh >> np.uint32(e)) & np.uint32(1)) << 4)
                if t == TQ5_0:
                    y[b * 32 + e] = d * F32(v - 16)
                else:
                    y[b * 32 + e] = d * F32(v) + mn
    elif t == TQ2_K:
        for b in range(k // 256):
            o = b * 84
            d = _hb(wu, o + 80)
            dmin = _hb(wu, o + 82)
            for i in range(16):
                sc = _u(wu, o + i)
                dl = d * F32(sc & 15)
                ml = dmin * F32(sc >> 4)
                qo = o + 16 + (i >> 3) * 32 + (i & 1) * 16
                sh = 2 * ((i & 7) >> 1)
                for e in range(16):
                    y[b * 256 + i * 16 + e] = dl * F32((_u(wu, qo + e) >> sh) & 3) - ml
    elif t == TQ3_K:
        for b in range(k // 256):
            o = b * 110
            d = _hb(wu, o + 108)
            for i in range(16):
                dl = d * F32(_q3_k_scale(wu, o + 96, i))
                qo = o + 32 + (i >> 3) * 32 + (i & 1) * 16
                sh = 2 * ((i & 7) >> 1)
                hb = i >> 1
                for e in range(16):
                    q = np.int32((_u(wu, qo + e) >> sh) & 3) + 4 * np.int32((_u(wu, o + (i & 1) * 16 + e) >> hb) & 1) - 4
                    y[b * 256 + i * 16 + e] = dl * F32(q)
    elif t == TQ4_K or t == TQ5_K:
        bsz = 144 if t == TQ4_K else 176
        qs = 16 if t == TQ4_K else 48
        for b in range(k // 256):
            o = b * bsz
            d = _hb(wu, o)
            dmin = _hb(wu, o + 2)
            for sb in range(8):
                sc, mn = _k_scale_min(wu, o + 4, sb)
                d1 = d * F32(sc)
                m1 = dmin * F32(mn)
                qo = o + qs + (sb >> 1) * 32
                sh = (sb & 1) * 4
                for e in range(32):
                    q = np.int32((_u(wu, qo + e) >> sh) & 15)
                    if t == TQ5_K:
                        q |= np.int32((_u(wu, o + 16 + e) >> sb) & 1) << 4
                    y[b * 256 + sb * 32 + e] = d1 * F32(q) - m1
    elif t == TQ6_K:
        for b in range(k // 256):
            o = b * 210
            d = _hb(wu, o + 208)
            for h in range(2):
                for g in range(4):
                    for half in range(2):
                        sidx = h * 8 + g * 2 + half
                        dl = d * F32(wi[o + 192 + sidx])
                        lo = o + h * 64 + (32 if (g & 1) else 0) + half * 16
                        ho = o + 128 + h * 32 + half * 16
                        ls = 4 * (g >> 1)
                        for e in range(16):
                            q = np.int32((_u(wu, lo + e) >> ls) & 15) | (np.int32((_u(wu, ho + e) >> (2 * g)) & 3) << 4)
                            y[b * 256 + sidx * 16 + e] = dl * F32(q - 32)
    elif t == TIQ4_XS:
        for b in range(k // 256):
            o = b * 136
            d = _hb(wu, o)
            sh = np.int64(_u(wu, o + 2)) | (np.int64(_u(wu, o + 3)) << 8)
            for sb in range(8):
                ls = ((_u(wu, o + 4 + (sb >> 1)) >> (4 * (sb & 1))) & 15) | (((sh >> (2 * sb)) & 3) << 4)
                dl = d * F32(ls - 32)
                for e in range(16):
                    q = _u(wu, o + 8 + sb * 16 + e)
                    y[b * 256 + sb * 32 + e] = dl * F32(KVALUES_IQ4NL[q & 15])
                    y[b * 256 + sb * 32 + 16 + e] = dl * F32(KVALUES_IQ4NL[q >> 4])
    elif t == TF16:
        for e in range(k):
            y[e] = _h2f(np.uint32(_u(wu, 2 * e)) | (np.uint32(_u(wu, 2 * e + 1)) << 8))
    elif t == TBF16:
        for e in range(k):
            y[e] = _u32_as_f32((np.uint32(_u(wu, 2 * e)) << 16) | (np.uint32(_u(wu, 2 * e + 1)) << 24))
    else:  # F32
        for e in range(k):
            y[e] = _u32_as_f32(np.uint32(_u(wu, 4 * e)) | (np.uint32(_u(wu, 4 * e + 1)) << 8) |
                               (np.uint32(_u(wu, 4 * e + 2)) << 16) | (np.uint32(_u(wu, 4 * e + 3)) << 24))


@njit(parallel=True, cache=True)
def _get_rows(wu, wi, t, ids, out):
    for r in prange(ids.shape[0]):
        _dequant_row(t, wu[ids[r]], wi[ids[r]], out[r])
