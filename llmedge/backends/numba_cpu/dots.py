"""Quantized dot products of the Numba backend: activation quantizers to Q8_0 / Q8_1 / Q8_K
(llmedge.quant's x86 rounding) and the per-row block dot products for every supported weight
type, in llama.cpp's orders (GEMV, repacked Q4_K GEMV/GEMM, tiled)."""

from __future__ import annotations

import numpy as np
from numba import njit

from llmedge.backends.numba_cpu.common import (
    F32,
    KVALUES_IQ4NL,
    TQ2_K,
    TQ3_K,
    TQ4_0,
    TQ4_1,
    TQ4_K,
    TQ5_0,
    TQ5_K,
    TQ6_K,
    TQ8_0,
)
from llmedge.backends.numba_cpu.intrinsics import (
    FAST_ROWS,
    _dot_f1_16,
    _dot_f1_32,
    _dot_f2_16,
    _dot_f2_32,
    _dot_nib32,
    _dot_q5_32,
    _dot_ss32,
    _fma,
    _hb,
    _lanes_q4_k,
    _lanes_q5_k,
    _lanes_q6_k,
    _lanes_q6_k_dec,
    _round_h,
    _rowdot_q4_0,
    _rowdot_q4_1,
    _rowdot_q5_0,
    _rowdot_q5_1,
    _rowdot_q8_0,
)

# ---------------------------------------------------------------------------------------------
# activation quantizers (llmedge.quant's x86 variant: id = 127/amax, round half to even)


@njit
def _quant_q8_block(x, i, o, aq, with_sum):
    """Quantize x[i, o:o+32] into aq[i, o:o+32]; return (d as stored f16 -> f32, s as stored f16 -> f32, int sum)."""
    amax = F32(0.0)
    for e in range(32):
        v = abs(x[i, o + e])
        if v > amax:
            amax = v
    d = amax / F32(127.0)
    inv = F32(127.0) / amax if amax != F32(0.0) else F32(0.0)
    s = 0
    for e in range(32):
        q = np.rint(x[i, o + e] * inv)
        qi = int(q)
        aq[i, o + e] = qi
        s += qi
    s16 = _round_h(F32(s) * d) if with_sum else F32(0.0)
    return _round_h(d), s16, s


@njit
def _quant_q8_k_block(x, i, o, aq, bs, bo, r8=False):
    """Quantize x[i, o:o+256] to Q8_K: returns d; 16 block sums into bs[i, bo:bo+16]. ``r8``: the
    scale's sign as llama.cpp's repacked Q4_K GEMM picks it (ggml_quantize_mat_q8_K_4x8: positive
    when +amax occurs in the block, else negative) instead of the first value of largest magnitude."""
    amax = F32(0.0)
    mx = F32(0.0)
    for e in range(256):
        v = abs(x[i, o + e])
        if v > amax:
            amax = v
            mx = x[i, o + e]
    if r8:
        mx = -amax
        for e in range(256):
            if x[i, o + e] == amax:
                mx = amax
                break
    if amax == F32(0.0):
        for e in range(256):
            aq[i, o + e] = 0
        for g in range(16):
            bs[i, bo + g] = 0
        return F32(0.0)
    iscale = F32(-127.0) / mx
    for g in range(16):
        s = 0
        for e in range(16):
            q = int(np.rint(x[i, o + g * 16 + e] * iscale))
            if q > 127:
                q = 127
            aq[i, o + g * 16 + e] = q
            s += q
        bs[i, bo + g] = s
    return F32(1.0) / iscale


@njit(cache=True)
def _quantize_q8_0(x, aq, ad, asum):
    n, k = x.shape
    for i in range(n):
        for b in range(k // 32):
            d, _, s = _quant_q8_block(x, i, b * 32, aq, False)
            ad[i, b] = d
            asum[i, b] = s


@njit(cache=True)
def _quantize_q8_1(x, aq, ad, asm):
    n, k = x.shape
    for i in range(n):
        for b in range(k // 32):
            d, s16, _ = _quant_q8_block(x, i, b * 32, aq, True)
            ad[i, b] = d
            asm[i, b] = s16


@njit(cache=True)
def _quantize_q8_k(x, aq, ad, bs):
    n, k = x.shape
    for i in range(n):
        for b in range(k // 256):
            ad[i, b] = _quant_q8_k_block(x, i, b * 256, aq, bs, b * 16)


# ---------------------------------------------------------------------------------------------
# block dot products: one weight row (uint8 / int8 views of its bytes) times one activation row


@njit
def _u(b, o):
    """Byte ``o`` of uint8 array ``b`` as int64 (numba types uint8-with-int64 arithmetic as float64)."""
    return np.int64(b[o])


@njit
def _row_q8_0_family(t, wu, wi, aq, ad, asum, nb):
    if FAST_ROWS:
        if t == TQ8_0:
            return _rowdot_q8_0(wu, aq, ad, ad, nb)
        if t == TQ4_0:
            return _rowdot_q4_0(wu, aq, ad, ad, nb)
        if t == TQ5_0:
            return _rowdot_q5_0(wu, aq, ad, ad, nb)
    sumf = F32(0.0)
    if t == TQ8_0:
        for b in range(nb):
            o = b * 34
            isum = _dot_ss32(wi, o + 2, aq, b * 32)
            sumf += F32(isum) * (_hb(wu, o) * ad[b])
    elif t == TQ4_0:
        for b in range(nb):
            o = b * 18
            isum = _dot_nib32(wu, o + 2, aq, b * 32) - 8 * asum[b]
            sumf += F32(isum) * (_hb(wu, o) * ad[b])
    elif t == TQ5_0:
        for b in range(nb):
            o = b * 22
            isum = _dot_q5_32(wu, o + 2, o + 6, aq, b * 32) - 16 * asum[b]
            sumf += F32(isum) * (_hb(wu, o) * ad[b])
    else:  # IQ4_NL
        for b in range(nb):
            o = b * 18
            isum = 0
            for e in range(16):
                q = _u(wu, o + 2 + e)
                isum += KVALUES_IQ4NL[q & 15] * aq[b * 32 + e] + KVALUES_IQ4NL[q >> 4] * aq[b * 32 + 16 + e]
            sumf += F32(isum) * (_hb(wu, o) * ad[b])
    return sumf


@njit
def _row_q8_1_family(t, wu, aq, ad, asm, nb):
    if FAST_ROWS:
        if t == TQ4_1:
            return _rowdot_q4_1(wu, aq, ad, asm, nb)
        return _rowdot_q5_1(wu, aq, ad, asm, nb)
    sumf = F32(0.0)
    if t == TQ4_1:
        for b in range(nb):
            o = b * 20
            isum = _dot_nib32(wu, o + 4, aq, b * 32)
            sumf += (_hb(wu, o) * ad[b]) * F32(isum) + _hb(wu, o + 2) * asm[b]
    else:  # Q5_1
        for b in range(nb):
            o = b * 24
            isum = _dot_q5_32(wu, o + 4, o + 8, aq, b * 32)
            sumf += (_hb(wu, o) * ad[b]) * F32(isum) + _hb(wu, o + 2) * asm[b]
    return sumf


@njit
def _k_scale_min(wu, so, sb):
    """6-bit scale and min of sub-block ``sb`` of a Q4_K/Q5_K block whose scales start at ``so``."""
    if sb < 4:
        return _u(wu, so + sb) & 63, _u(wu, so + 4 + sb) & 63
    s = sb - 4
    sc = (_u(wu, so + 8 + s) & 15) | ((_u(wu, so + s) >> 6) << 4)
    mn = (_u(wu, so + 8 + s) >> 4) | ((_u(wu, so + 4 + s) >> 6) << 4)
    return sc, mn


@njit
def _q3_k_scale(wu, so, i):
    lo = (_u(wu, so + i) & 15) if i < 8 else (_u(wu, so + i - 8) >> 4)
    hi = (_u(wu, so + 8 + (i & 3)) >> (2 * (i >> 2))) & 3
    return (lo | (hi << 4)) - 32


@njit
def _k_scales(t, wu, b):
    """Block ``b``'s byte offset, F16 scale and F16 min (0 where the type has none) as float32."""
    if t == TQ2_K:
        o = b * 84
        return o, _hb(wu, o + 80), _hb(wu, o + 82)
    if t == TQ3_K:
        o = b * 110
        return o, _hb(wu, o + 108), F32(0.0)
    if t == TQ4_K or t == TQ5_K:
        o = b * (144 if t == TQ4_K else 176)
        return o, _hb(wu, o), _hb(wu, o + 2)
    if t == TQ6_K:
        o = b * 210
        return o, _hb(wu, o + 208), F32(0.0)
    o = b * 136  # IQ4_XS
    return o, _hb(wu, o), F32(0.0)


@njit
def _k_ints(t, wu, wi, o, aq, ab, bs, bb):
    """Exact integer totals of one K-quant block (at byte ``o``) times Q8_K, in scalar code: s1 =
    sub-block scales times q . a (Q3_K's -4 and Q6_K's -32 offsets folded in), s2 = mins times the
    activation sums (0 for the types without mins)."""
    isum = 0
    summ = 0
    if t == TQ4_K:
        for sb in range(8):
            sc, mn = _k_scale_min(wu, o + 4, sb)
            isub = _dot_f1_32(wu, o + 16 + (sb >> 1) * 32, (sb & 1) * 4, 15, 0, 0, 0, 0, aq, ab + sb * 32)
            isum += sc * isub
            summ += mn * (bs[bb + 2 * sb] + bs[bb + 2 * sb + 1])
    elif t == TQ6_K:
        for h in range(2):
            for g in range(4):
                for half in range(2):
                    sidx = h * 8 + g * 2 + half
                    lo = o + h * 64 + (32 if (g & 1) else 0) + half * 16
                    ho = o + 128 + h * 32 + half * 16
                    isub = _dot_f2_16(wu, lo, 4 * (g >> 1), 15, ho, 2 * g, 3, 4, aq, ab + sidx * 16)
                    isum += wi[o + 192 + sidx] * (isub - 32 * bs[bb + sidx])
    elif t == TQ5_K:
        for sb in range(8):
            sc, mn = _k_scale_min(wu, o + 4, sb)
            isub = _dot_f2_32(wu, o + 48 + (sb >> 1) * 32, (sb & 1) * 4, 15, o + 16, sb, 1, 4, aq, ab + sb * 32)
            isum += sc * isub
            summ += mn * (bs[bb + 2 * sb] + bs[bb + 2 * sb + 1])
    elif t == TQ2_K:
        for i in range(16):
            sc = _u(wu, o + i)
            qo = o + 16 + (i >> 3) * 32 + (i & 1) * 16
            isub = _dot_f1_16(wu, qo, 2 * ((i & 7) >> 1), 3, 0, 0, 0, 0, aq, ab + i * 16)
            isum += (sc & 15) * isub
            summ += (sc >> 4) * bs[bb + i]
    elif t == TQ3_K:
        for i in range(16):
            qo = o + 32 + (i >> 3) * 32 + (i & 1) * 16
            isub = _dot_f2_16(wu, qo, 2 * ((i & 7) >> 1), 3, o + (i & 1) * 16, i >> 1, 1, 2, aq, ab + i * 16)
            isum += _q3_k_scale(wu, o + 96, i) * (isub - 4 * bs[bb + i])
    else:  # IQ4_XS
        sh = np.int64(_u(wu, o + 2)) | (np.int64(_u(wu, o + 3)) << 8)
        for sb in range(8):
            ls = ((_u(wu, o + 4 + (sb >> 1)) >> (4 * (sb & 1))) & 15) | (((sh >> (2 * sb)) & 3) << 4)
            qo = o + 8 + sb * 16
            ao = ab + sb * 32
            isub = 0
            for e in range(16):
                q = _u(wu, qo + e)
                isub += KVALUES_IQ4NL[q & 15] * aq[ao + e] + KVALUES_IQ4NL[q >> 4] * aq[ao + 16 + e]
            isum += (ls - 32) * isub
    return isum, summ


@njit
def _has_min(t):
    return t == TQ2_K or t == TQ4_K or t == TQ5_K


@njit
def _row_q8_k_family(t, wu, wi, aq, ad, bs, nsb):
    """A K-quant row times Q8_K in ggml's generic order: per block (d * d8) * s1 - (dmin * d8) * s2."""
    sumf = F32(0.0)
    for b in range(nsb):
        o, d, dmin = _k_scales(t, wu, b)
        s1, s2 = _k_ints(t, wu, wi, o, aq, b * 256, bs, b * 16)
        da = ad[b]
        if _has_min(t):
            sumf += (d * da) * F32(s1) - (dmin * da) * F32(s2)
        else:
            sumf += (d * da) * F32(s1)
    return sumf


@njit
def _q6_k_fma8(lanes, d, bs, bb, scb, a0, a1, a2, a3, a4, a5, a6, a7):
    """One Q6_K block's float step in ggml's AVX2 order: lane l += d * (lanes[l] - 32 * (the two
    sub-block scales times their activation sums)), fused."""
    l0, l1, l2, l3, l4, l5, l6, l7 = lanes
    a0 = _fma(d, F32(l0 - 32 * (bs[bb + 0] * scb[0] + bs[bb + 1] * scb[1])), a0)
    a1 = _fma(d, F32(l1 - 32 * (bs[bb + 2] * scb[2] + bs[bb + 3] * scb[3])), a1)
    a2 = _fma(d, F32(l2 - 32 * (bs[bb + 4] * scb[4] + bs[bb + 5] * scb[5])), a2)
    a3 = _fma(d, F32(l3 - 32 * (bs[bb + 6] * scb[6] + bs[bb + 7] * scb[7])), a3)
    a4 = _fma(d, F32(l4 - 32 * (bs[bb + 8] * scb[8] + bs[bb + 9] * scb[9])), a4)
    a5 = _fma(d, F32(l5 - 32 * (bs[bb + 10] * scb[10] + bs[bb + 11] * scb[11])), a5)
    a6 = _fma(d, F32(l6 - 32 * (bs[bb + 12] * scb[12] + bs[bb + 13] * scb[13])), a6)
    a7 = _fma(d, F32(l7 - 32 * (bs[bb + 14] * scb[14] + bs[bb + 15] * scb[15])), a7)
    return a0, a1, a2, a3, a4, a5, a6, a7


@njit
def _row_k_fast(t, wu, wi, aq, ad, bs, nsb, scb):
    """Q4_K / Q5_K / Q6_K times Q8_K in ggml's AVX2 order (8 float lanes, llama.cpp's final sums)."""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = F32(0.0)
    m0 = m1 = m2 = m3 = F32(0.0)
    summs = F32(0.0)
    for b in range(nsb):
        ab = b * 256
        bb = b * 16
        if t == TQ6_K:
            o = b * 210
            for i in range(16):
                scb[i] = wi[o + 192 + i]
            lanes = _lanes_q6_k(wu, o, aq, ab, scb, 0)
            a0, a1, a2, a3, a4, a5, a6, a7 = _q6_k_fma8(lanes, ad[b] * _hb(wu, o + 208), bs, bb, scb,
                                                        a0, a1, a2, a3, a4, a5, a6, a7)
        else:
            o = b * (144 if t == TQ4_K else 176)
            for sb in range(8):
                sc, mn = _k_scale_min(wu, o + 4, sb)
                scb[sb] = sc
                scb[8 + sb] = mn
            if t == TQ4_K:
                l0, l1, l2, l3, l4, l5, l6, l7 = _lanes_q4_k(wu, o, aq, ab, scb, 0)
            else:
                l0, l1, l2, l3, l4, l5, l6, l7 = _lanes_q5_k(wu, o, aq, ab, scb, 0)
            d = ad[b] * _hb(wu, o)
            dmin = (-ad[b]) * _hb(wu, o + 2)
            a0 = _fma(d, F32(l0), a0)
            a1 = _fma(d, F32(l1), a1)
            a2 = _fma(d, F32(l2), a2)
            a3 = _fma(d, F32(l3), a3)
            a4 = _fma(d, F32(l4), a4)
            a5 = _fma(d, F32(l5), a5)
            a6 = _fma(d, F32(l6), a6)
            a7 = _fma(d, F32(l7), a7)
            p0 = scb[8] * (bs[bb] + bs[bb + 1]) + scb[9] * (bs[bb + 2] + bs[bb + 3])
            p1 = scb[10] * (bs[bb + 4] + bs[bb + 5]) + scb[11] * (bs[bb + 6] + bs[bb + 7])
            p2 = scb[12] * (bs[bb + 8] + bs[bb + 9]) + scb[13] * (bs[bb + 10] + bs[bb + 11])
            p3 = scb[14] * (bs[bb + 12] + bs[bb + 13]) + scb[15] * (bs[bb + 14] + bs[bb + 15])
            if t == TQ4_K:
                m0 = _fma(dmin, F32(p0), m0)
                m1 = _fma(dmin, F32(p1), m1)
                m2 = _fma(dmin, F32(p2), m2)
                m3 = _fma(dmin, F32(p3), m3)
            else:
                summs = _fma(dmin, F32(p0 + p1 + p2 + p3), summs)
    r = ((a4 + a0) + (a6 + a2)) + ((a5 + a1) + (a7 + a3))
    if t == TQ4_K:
        return r + ((m0 + m2) + (m1 + m3))
    if t == TQ5_K:
        return r + summs
    return r


@njit
def _decode_q6_k_row(wu, nsb, qd):
    """A Q6_K row's six-bit values (0..63) in activation order, 256 bytes per block, into ``qd``."""
    for b in range(nsb):
        o = b * 210
        for h in range(2):
            for g in range(4):
                lo = o + h * 64 + (32 if (g & 1) else 0)
                ls = 4 * (g >> 1)
                p = b * 256 + (h * 4 + g) * 32
                for e in range(32):
                    qv = ((_u(wu, lo + e) >> ls) & 15) | (((_u(wu, o + 128 + h * 32 + e) >> (2 * g)) & 3) << 4)
                    qd[p + e] = np.uint8(qv)


@njit
def _row_q6_k_dec(qd, wu, wi, aq, ad, bs, nsb, scb):
    """:func:`_row_k_tiled` for Q6_K from the row's decoded values (:func:`_decode_q6_k_row`): the
    same integer totals and float steps."""
    buf = F32(0.0)
    for b in range(nsb):
        o = b * 210
        for i in range(16):
            scb[i] = wi[o + 192 + i]
        s1 = _q6_k_lane_total(_lanes_q6_k_dec(qd, b * 256, aq, b * 256, scb, 0), bs, b * 16, scb)
        buf = _fma(_hb(wu, o + 208) * F32(s1), ad[b], buf)
    return buf


@njit
def _q4_k_ints(wu, o, aq, ab, bs, bb, scb, t=TQ4_K):
    """Exact integer totals of one Q4_K (or Q5_K) block times Q8_K from the vector lanes: (scale *
    q.a, min * bsums); scales and mins left in ``scb[0:8]`` and ``scb[8:16]``."""
    for sb in range(8):
        sc, mn = _k_scale_min(wu, o + 4, sb)
        scb[sb] = sc
        scb[8 + sb] = mn
    if t == TQ5_K:
        l0, l1, l2, l3, l4, l5, l6, l7 = _lanes_q5_k(wu, o, aq, ab, scb, 0)
    else:
        l0, l1, l2, l3, l4, l5, l6, l7 = _lanes_q4_k(wu, o, aq, ab, scb, 0)
    s1 = np.int64(l0) + l1 + l2 + l3 + l4 + l5 + l6 + l7
    s2 = np.int64(0)
    for sb in range(8):
        s2 += scb[8 + sb] * (np.int64(bs[bb + 2 * sb]) + bs[bb + 2 * sb + 1])
    return s1, s2


@njit
def _q6_k_lane_total(lanes, bs, bb, scb):
    """A Q6_K block's exact s1 from its lanes (:data:`_lanes_q6_k`): their sum minus 32 times the
    sub-block scales (``scb``) times the activation sums."""
    l0, l1, l2, l3, l4, l5, l6, l7 = lanes
    s1 = np.int64(l0) + l1 + l2 + l3 + l4 + l5 + l6 + l7
    corr = np.int64(0)
    for i in range(16):
        corr += np.int64(scb[i]) * bs[bb + i]
    return s1 - 32 * corr


@njit
def _row_q4_k_r8(wu, aq, ad, bs, nsb, scb):
    """Q4_K in the order of llama.cpp's repacked (q4_K_8x8) GEMV: per block
    acc += s1 * (d * d8), accm += s2 * (dmin * d8), fused; result acc - accm."""
    acc = F32(0.0)
    accm = F32(0.0)
    for b in range(nsb):
        o = b * 144
        s1, s2 = _q4_k_ints(wu, o, aq, b * 256, bs, b * 16, scb)
        acc = _fma(F32(s1), _hb(wu, o) * ad[b], acc)
        accm = _fma(F32(s2), _hb(wu, o + 2) * ad[b], accm)
    return acc - accm


@njit
def _q4_k_row_scales(wu, nsb, sm, hdm):
    """A Q4_K row's per-block sub-block scales (sm[b, 0:8]) and mins (sm[b, 8:16]) and its F16
    scale and min as float32 (hdm[b]), decoded once for a prompt's activation rows."""
    for b in range(nsb):
        o = b * 144
        for sb in range(8):
            sc, mn = _k_scale_min(wu, o + 4, sb)
            sm[b, sb] = sc
            sm[b, 8 + sb] = mn
        hdm[b, 0] = _hb(wu, o)
        hdm[b, 1] = _hb(wu, o + 2)


@njit
def _row_k_tiled(t, wu, wi, aq, ad, bs, nsb, scb):
    """A K-quant row times Q8_K in the order of llama.cpp's tiled K-quant GEMM (8 or more activation
    rows, weights not repacked; native's vec_dot_*_tiled): per block the exact integer totals s1 and
    s2, r = d * s1 - dmin * s2 (fused; d * s1 for the types without mins), buf += r * d8 (fused)."""
    buf = F32(0.0)
    for b in range(nsb):
        o, d, dmin = _k_scales(t, wu, b)
        ab = b * 256
        bb = b * 16
        if FAST_ROWS and (t == TQ4_K or t == TQ5_K):
            s1, s2 = _q4_k_ints(wu, o, aq, ab, bs, bb, scb, t)
        elif FAST_ROWS and t == TQ6_K:
            for i in range(16):
                scb[i] = wi[o + 192 + i]
            s1 = _q6_k_lane_total(_lanes_q6_k(wu, o, aq, ab, scb, 0), bs, bb, scb)
            s2 = np.int64(0)
        else:
            s1, s2 = _k_ints(t, wu, wi, o, aq, ab, bs, bb)
        if _has_min(t):
            r = _fma(-dmin, F32(s2), d * F32(s1))
        else:
            r = d * F32(s1)
        buf = _fma(r, ad[b], buf)
    return buf
