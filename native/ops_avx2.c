/* AVX2 + FMA + F16C inner loops of the float ops: SiLU/GELU gated products (ggml's vectorized expf,
 * so values agree with llama.cpp on AVX2 machines), float/half dot products and axpy for attention,
 * and the exponentials of softmax.
 *
 * Compiled a second time as the AVX-512 tier's ops (ops_avx512.c, LLE_OPS_512; and against SIMDe
 * for the self-test, selftest_simde_ops.c), which reproduce ggml's AVX-512 build instead, what
 * llama.cpp and Ollama run on an AVX-512 CPU: its own vectorized expf (scalef) 16 values at a time
 * for SiLU and softmax, softmax sums per 16-value chunk (_mm512_reduce_add_ps), and attention dot
 * products with 16-lane accumulators (ggml's vec_dot: 4 of them over 64 values; tinyBLAS<16>: one),
 * so V sums keep 64 or 16 partial sums per value instead of 32 or 8. The tier constants below
 * (KQ_TB ... V_GG) and #if LLE_OPS_512 blocks hold the differences.
 */
#include "common.h"

#if defined(LLE_X86)

#if defined(LLE_OPS_512)
#include "avx512_compat.h"
#include "ggml_avx512_orders.h"
#define LLE_OPS_TABLE LLE_OPS_512
#else
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c")
#endif
#include <immintrin.h>
#define LLE_OPS_TABLE lle_ops_avx2
#endif

/* ggml_v_expf (adapted by ggml from ARM's optimized routines): max error 1.45358 + 0.5 ulp */
LLE_INLINE __m256 v_expf(__m256 x) {
    const __m256 r = _mm256_set1_ps(0x1.8p23f);
    const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), r);
    const __m256 n = _mm256_sub_ps(z, r);
    const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f),
                                      _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
    const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
    const __m256 k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(_mm256_set1_ps(1))));
    const __m256i c = _mm256_castps_si256(_mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.f), n),
                                                        _mm256_set1_ps(126), _CMP_GT_OQ));
    const __m256 u = _mm256_mul_ps(b, b);
    const __m256 j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f)), u,
                        _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f))),
        u, _mm256_mul_ps(_mm256_set1_ps(0x1.ffffecp-1f), b));
    if (!_mm256_movemask_ps(_mm256_castsi256_ps(c))) return _mm256_fmadd_ps(j, k, k);
    const __m256i g = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
                                       _mm256_set1_epi32((int)0x82000000u));
    const __m256 s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f000000)));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
    const __m256i d = _mm256_castps_si256(_mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.f), n),
                                                        _mm256_set1_ps(192), _CMP_GT_OQ));
    return _mm256_or_ps(
        _mm256_and_ps(_mm256_castsi256_ps(d), _mm256_mul_ps(s1, s1)),
        _mm256_andnot_ps(_mm256_castsi256_ps(d),
                         _mm256_or_ps(_mm256_and_ps(_mm256_castsi256_ps(c), _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1)),
                                      _mm256_andnot_ps(_mm256_castsi256_ps(c), _mm256_fmadd_ps(k, j, k)))));
}

LLE_INLINE __m256 v_silu(__m256 x) {
    const __m256 neg_x = _mm256_sub_ps(_mm256_setzero_ps(), x);
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1), v_expf(neg_x)));
}

#if defined(LLE_OPS_512)
/* ggml_v_expf of ggml's AVX-512 build (another rounding than the AVX2 one: scalef, no k + k * j); the
 * mask test is `d == 0` (kortestz, which SIMDe lacks) */
LLE_INLINE __m512 v_expf512(__m512 x) {
    const __m512 r = _mm512_set1_ps(0x1.8p23f);
    const __m512 z = _mm512_fmadd_ps(x, _mm512_set1_ps(0x1.715476p+0f), r);
    const __m512 n = _mm512_sub_ps(z, r);
    const __m512 b = _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.7f7d1cp-20f), _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.62e4p-1f), x));
    const __mmask16 d = _mm512_cmp_ps_mask(_mm512_abs_ps(n), _mm512_set1_ps(192), _CMP_GT_OQ);
    const __m512 u = _mm512_mul_ps(b, b);
    const __m512 j = _mm512_fmadd_ps(
        _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_set1_ps(0x1.0e4020p-7f), b, _mm512_set1_ps(0x1.573e2ep-5f)), u,
                        _mm512_fmadd_ps(_mm512_set1_ps(0x1.555e66p-3f), b, _mm512_set1_ps(0x1.fffdb6p-2f))),
        u, _mm512_fmadd_ps(_mm512_set1_ps(0x1.ffffecp-1f), b, _mm512_set1_ps(1.0f)));
    const __m512 res = _mm512_scalef_ps(j, n);
    if (d == 0) return res;
    const __m512 alt = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(n, _mm512_setzero_ps(), _CMP_LE_OQ),
                                            _mm512_set1_ps(INFINITY), _mm512_setzero_ps());
    return _mm512_mask_blend_ps(d, res, alt);
}

LLE_INLINE __m512 v_silu512(__m512 x) {
    const __m512 neg_x = _mm512_sub_ps(_mm512_setzero_ps(), x);
    return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1), v_expf512(neg_x)));
}
#endif

/* ggml_vec_swiglu_f32: 8 (AVX2) or 16 (AVX-512) values at a time, the rest with libm's expf */
static void swiglu(int n, float *y, const float *x, const float *g) {
    int i = 0;
#if defined(LLE_OPS_512)
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_mul_ps(v_silu512(_mm512_loadu_ps(x + i)), _mm512_loadu_ps(g + i)));
#else
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(v_silu(_mm256_loadu_ps(x + i)), _mm256_loadu_ps(g + i)));
#endif
    for (; i < n; ++i) y[i] = x[i] / (1.0f + expf(-x[i])) * g[i];
}

static void geglu(int n, float *y, const float *x, const float *g) {
    for (int i = 0; i < n; ++i) {
        if (x[i] <= -10.0f) {
            y[i] = 0.0f;
        } else if (x[i] >= 10.0f) {
            y[i] = x[i] * g[i];
        } else {
            y[i] = _cvtsh_ss(lle_gelu_table[_cvtss_sh(x[i], 0)]) * g[i];
        }
    }
}

LLE_INLINE float hsum8(__m256 x) {
    __m128 res = _mm256_extractf128_ps(x, 1);
    res = _mm_add_ps(res, _mm256_castps256_ps128(x));
    res = _mm_add_ps(res, _mm_movehl_ps(res, res));
    res = _mm_add_ss(res, _mm_movehdup_ps(res));
    return _mm_cvtss_f32(res);
}

/* the tier's ggml orders: K.Q rows per tinyBLAS step (prompts, head size a multiple of it) and per ggml
 * vec_dot step (decode, blocked when the head size is a multiple), softmax chunk, and V partial sums
 * (lanes) per output value for prompts (tinyBLAS) and decode (ggml) */
#if defined(LLE_OPS_512)
enum { KQ_TB = 16, KQ_GG = 64, SMX = 16, V_TB = 16, V_GG = 64 };
#else
enum { KQ_TB = 8, KQ_GG = 32, SMX = 8, V_TB = 8, V_GG = 32 };
#endif

/* ---- llama.cpp's float reduction orders, reproduced exactly ----
 * decode (one query row): ggml_vec_dot_f16/_f32 with 4 accumulators of 8 lanes (element e in
 * accumulator (e % 32) / 8, lane e % 8), reduced as ((s0+s2)+(s1+s3)), then lanes i+(i+4), then
 * two horizontal adds; prefill (several rows): llamafile's tinyBLAS, one 8-lane accumulator per
 * output, reduced as (hi+lo), then (0+2)+(1+3). */

#define LDH(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))

LLE_INLINE float reduce_ggml4(__m256 s0, __m256 s1, __m256 s2, __m256 s3) {
    const __m256 x = _mm256_add_ps(_mm256_add_ps(s0, s2), _mm256_add_ps(s1, s3));
    const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    const __m128 t1 = _mm_hadd_ps(t0, t0);
    return _mm_cvtss_f32(_mm_hadd_ps(t1, t1));
}

#if defined(LLE_OPS_512)
/* ggml's AVX-512 orders (ggml_avx512_orders.h) */
#define dot_f16_ggml lle512_dot_f16_ggml
#define dot_f32_ggml lle512_dot_f32_ggml
#define dot_f16_tb lle512_dot_f16_tb
#define dot_f32_tb lle512_dot_f32_tb
#else
static float dot_f16_ggml(int n, const lle_half *x, const lle_half *y) {
    const int np = n & ~31;
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    for (int i = 0; i < np; i += 32) {
        s0 = _mm256_fmadd_ps(LDH(x + i), LDH(y + i), s0);
        s1 = _mm256_fmadd_ps(LDH(x + i + 8), LDH(y + i + 8), s1);
        s2 = _mm256_fmadd_ps(LDH(x + i + 16), LDH(y + i + 16), s2);
        s3 = _mm256_fmadd_ps(LDH(x + i + 24), LDH(y + i + 24), s3);
    }
    double sumf = reduce_ggml4(s0, s1, s2, s3);
    for (int i = np; i < n; ++i) sumf += (double)(_cvtsh_ss(x[i]) * _cvtsh_ss(y[i]));
    return (float)sumf;
}

static float dot_f32_ggml(int n, const float *x, const float *y) {
    const int np = n & ~31;
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    for (int i = 0; i < np; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 16), _mm256_loadu_ps(y + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 24), _mm256_loadu_ps(y + i + 24), s3);
    }
    return lle_f32_dot_finish(reduce_ggml4(s0, s1, s2, s3), x, y, np, n, 4);  /* as vec_dot_f32's */
}

static float dot_f16_tb(int n, const lle_half *x, const lle_half *y) {
    __m256 c = _mm256_setzero_ps();
    for (int l = 0; l < n; l += 8) c = _mm256_fmadd_ps(LDH(x + l), LDH(y + l), c);
    return hsum8(c);
}

static float dot_f32_tb(int n, const float *x, const float *y) {
    __m256 c = _mm256_setzero_ps();
    for (int l = 0; l < n; l += 8) c = _mm256_fmadd_ps(_mm256_loadu_ps(x + l), _mm256_loadu_ps(y + l), c);
    return hsum8(c);
}
#endif


/* ggml_vec_soft_max_f32: exponentials of 8 (AVX2) or 16 (AVX-512) values at a time, each chunk's
 * float sum added as a double; the rest with libm's expf */
static double softmax_exp(int n, float *y, const float *x, float max) {
    int i = 0;
    double sum = 0;
#if defined(LLE_OPS_512)
    for (; i + 16 <= n; i += 16) {
        const __m512 val = v_expf512(_mm512_sub_ps(_mm512_loadu_ps(x + i), _mm512_set1_ps(max)));
        _mm512_storeu_ps(y + i, val);
        sum += (double)lle512_reduce(val);
    }
#else
    for (; i + 8 <= n; i += 8) {
        const __m256 val = v_expf(_mm256_sub_ps(_mm256_loadu_ps(x + i), _mm256_set1_ps(max)));
        _mm256_storeu_ps(y + i, val);
        sum += (double)hsum8(val);
    }
#endif
    for (; i < n; ++i) {
        const float val = expf(x[i] - max);
        sum += (double)val;
        y[i] = val;
    }
    return sum;
}

/* ---- blocks of 8 cells: eight dot products at once, reduced together ----
 * hsum8_x8 / reduce_ggml4_x8 return the 8 horizontal sums of c[0..7] in one vector, each lane added
 * in exactly hsum8's (tinyBLAS) or reduce_ggml4's (ggml) order: (lo + hi) first, then
 * (0 + 2) + (1 + 3) for tinyBLAS, (0 + 1) + (2 + 3) for ggml. */

LLE_INLINE void halves_x8(const __m256 *c, __m256 *v) {
    for (int k = 0; k < 4; k++)
        v[k] = _mm256_add_ps(_mm256_permute2f128_ps(c[k], c[k + 4], 0x20), _mm256_permute2f128_ps(c[k], c[k + 4], 0x31));
}

LLE_INLINE __m256 hsum8_x8(const __m256 *c) {
    __m256 v[4];
    halves_x8(c, v); /* v[k] = [a_k | a_k+4], a_j[m] = c_j[m] + c_j[m + 4] */
    const __m256 u01 = _mm256_add_ps(_mm256_unpacklo_ps(v[0], v[1]), _mm256_unpackhi_ps(v[0], v[1]));
    const __m256 u23 = _mm256_add_ps(_mm256_unpacklo_ps(v[2], v[3]), _mm256_unpackhi_ps(v[2], v[3]));
    return _mm256_add_ps(_mm256_shuffle_ps(u01, u23, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm256_shuffle_ps(u01, u23, _MM_SHUFFLE(3, 2, 3, 2)));
}

LLE_INLINE __m256 reduce_ggml4_x8(const __m256 *x) {
    __m256 v[4];
    halves_x8(x, v);
    return _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
}

/* one K row, as floats from an f16 or f32 cache (byte address) */
LLE_INLINE __m256 ld_kv(const uint8_t *p, int f16) {
    return f16 ? LDH((const lle_half *)p) : _mm256_loadu_ps((const float *)p);
}

#if defined(LLE_OPS_512)
/* 16 values of a K or V row as floats */
LLE_INLINE __m512 ld_kv16(const uint8_t *p, int f16) {
    return f16 ? lle512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)) : _mm512_loadu_ps((const float *)p);
}

LLE_INLINE __m256 lo256(__m512 v) { return _mm512_castps512_ps256(v); }
LLE_INLINE __m256 hi256(__m512 v) { return _mm256_castsi256_ps(_mm512_extracti64x4_epi64(_mm512_castps_si512(v), 1)); }
#endif

#if defined(LLE_OPS_512)
/* scores of cells j..j+7 for nh queries in tinyBLAS<16>'s order (d % 16 == 0) into s[h]: one 16-lane
 * accumulator per (cell, query), lle512_reduce; cells in two halves of 4 (16 accumulators at most live),
 * each K slice loaded once for the nh queries (attn_group; kq8_tb is nh = 1) */
LLE_INLINE void kq8_tb_group(const uint8_t *k0, size_t kst, const float *const *qv, int nh, int64_t d, int f16,
                             __m256 *s) {
    const size_t esz = f16 ? 2 : 4;
    __m256 t[LLE_ATTN_GROUP][8];
    for (int m0 = 0; m0 < 8; m0 += 4) {
        __m512 c[LLE_ATTN_GROUP][4];
        for (int h = 0; h < nh; h++) c[h][0] = c[h][1] = c[h][2] = c[h][3] = _mm512_setzero_ps();
        for (int64_t l = 0; l < d; l += 16) {
            const uint8_t *kl = k0 + (size_t)l * esz + (size_t)m0 * kst;
            __m512 kv[4];
            for (int m = 0; m < 4; m++) kv[m] = ld_kv16(kl + m * kst, f16);
            for (int h = 0; h < nh; h++) {
                const __m512 qq = _mm512_loadu_ps(qv[h] + l);
                for (int m = 0; m < 4; m++) c[h][m] = _mm512_fmadd_ps(kv[m], qq, c[h][m]);
            }
        }
        for (int h = 0; h < nh; h++)
            for (int m = 0; m < 4; m++) t[h][m0 + m] = _mm256_add_ps(lo256(c[h][m]), hi256(c[h][m]));
    }
    for (int h = 0; h < nh; h++) s[h] = hsum8_x8(t[h]);
}

LLE_INLINE __m256 kq8_tb(const uint8_t *k0, size_t kst, const float *qv, int64_t d, int f16) {
    __m256 s;
    kq8_tb_group(k0, kst, &qv, 1, d, f16, &s);
    return s;
}

/* the same in ggml's AVX-512 vec_dot order (d % 64 == 0): 4 accumulators of 16 lanes per (cell, query),
 * ((s0 + s2) + (s1 + s3)), then lle512_reduce */
LLE_INLINE void kq8_ggml_group(const uint8_t *k0, size_t kst, const float *const *qv, int nh, int64_t d, int f16,
                               __m256 *s) {
    const size_t esz = f16 ? 2 : 4;
    __m256 t[LLE_ATTN_GROUP][8];
    for (int m = 0; m < 8; m++) {
        const uint8_t *kr = k0 + m * kst;
        __m512 c[LLE_ATTN_GROUP][4];
        for (int h = 0; h < nh; h++) c[h][0] = c[h][1] = c[h][2] = c[h][3] = _mm512_setzero_ps();
        for (int64_t l = 0; l < d; l += 64) {
            __m512 kv[4];
            for (int r = 0; r < 4; r++) kv[r] = ld_kv16(kr + (size_t)(l + 16 * r) * esz, f16);
            for (int h = 0; h < nh; h++)
                for (int r = 0; r < 4; r++) c[h][r] = _mm512_fmadd_ps(kv[r], _mm512_loadu_ps(qv[h] + l + 16 * r), c[h][r]);
        }
        for (int h = 0; h < nh; h++) {
            const __m512 x = _mm512_add_ps(_mm512_add_ps(c[h][0], c[h][2]), _mm512_add_ps(c[h][1], c[h][3]));
            t[h][m] = _mm256_add_ps(lo256(x), hi256(x));
        }
    }
    for (int h = 0; h < nh; h++) s[h] = hsum8_x8(t[h]);
}

LLE_INLINE __m256 kq8_ggml(const uint8_t *k0, size_t kst, const float *qv, int64_t d, int f16) {
    __m256 s;
    kq8_ggml_group(k0, kst, &qv, 1, d, f16, &s);
    return s;
}
#else
/* scores of cells j..j+7 against the float query qv: tinyBLAS order (d % 8 == 0) */
LLE_INLINE __m256 kq8_tb(const uint8_t *k0, size_t kst, const float *qv, int64_t d, int f16) {
    __m256 c[8];
    const size_t esz = f16 ? 2 : 4;
    for (int m = 0; m < 8; m++) c[m] = _mm256_setzero_ps();
    for (int64_t l = 0; l < d; l += 8) {
        const __m256 qq = _mm256_loadu_ps(qv + l);
        const uint8_t *kl = k0 + (size_t)l * esz;
        for (int m = 0; m < 8; m++) c[m] = _mm256_fmadd_ps(ld_kv(kl + m * kst, f16), qq, c[m]);
    }
    return hsum8_x8(c);
}

/* the same in ggml's vec_dot order (d % 32 == 0): 4 accumulators per cell */
LLE_INLINE __m256 kq8_ggml(const uint8_t *k0, size_t kst, const float *qv, int64_t d, int f16) {
    __m256 x[8];
    const size_t esz = f16 ? 2 : 4;
    for (int m = 0; m < 8; m++) {
        const uint8_t *kr = k0 + m * kst;
        __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
        for (int64_t l = 0; l < d; l += 32) {
            s0 = _mm256_fmadd_ps(ld_kv(kr + (size_t)l * esz, f16), _mm256_loadu_ps(qv + l), s0);
            s1 = _mm256_fmadd_ps(ld_kv(kr + (size_t)(l + 8) * esz, f16), _mm256_loadu_ps(qv + l + 8), s1);
            s2 = _mm256_fmadd_ps(ld_kv(kr + (size_t)(l + 16) * esz, f16), _mm256_loadu_ps(qv + l + 16), s2);
            s3 = _mm256_fmadd_ps(ld_kv(kr + (size_t)(l + 24) * esz, f16), _mm256_loadu_ps(qv + l + 24), s3);
        }
        x[m] = _mm256_add_ps(_mm256_add_ps(s0, s2), _mm256_add_ps(s1, s3));
    }
    return reduce_ggml4_x8(x);
}
#endif

/* visibility of cells j..j+7 for query position qp: bit m set when cell j+m is visible */
LLE_INLINE int visible8(const int *kpos, __m256i vqp, int window, __m256i vwin) {
    const __m256i kp = _mm256_loadu_si256((const __m256i *)kpos);
    __m256i bad = _mm256_or_si256(_mm256_cmpgt_epi32(_mm256_setzero_si256(), kp), _mm256_cmpgt_epi32(kp, vqp));
    if (window > 0)  /* qp - kp >= window */
        bad = _mm256_or_si256(bad, _mm256_xor_si256(_mm256_cmpgt_epi32(vwin, _mm256_sub_epi32(vqp, kp)),
                                                    _mm256_set1_epi32(-1)));
    return ~_mm256_movemask_ps(_mm256_castsi256_ps(bad)) & 0xff;
}

/* 8 raw scores of cells whose visibility bits are vis (not 0): soft-capped, scaled, masked to -inf */
LLE_INLINE __m256 finish_scores8(__m256 s, int vis, const lle_attn_args *a, float inv_cap, __m256 vscale, __m256 ninf) {
    if (a->softcap > 0) {
        float tmp[8];
        _mm256_storeu_ps(tmp, s);
        for (int m = 0; m < 8; m++) tmp[m] = tanhf(tmp[m] * inv_cap) * a->softcap;
        s = _mm256_loadu_ps(tmp);
    }
    s = _mm256_mul_ps(s, vscale);
    if (vis != 0xff) {
        const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
        const __m256i on = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(vis), bit), bit);
        s = _mm256_blendv_ps(ninf, s, _mm256_castsi256_ps(on));
    }
    return s;
}

/* the largest of the 8 lanes, compared in lane order (a NaN lane never wins, as in the scalar loop) */
LLE_INLINE float max8(__m256 v) {
    float tmp[8];
    _mm256_storeu_ps(tmp, v);
    float max = tmp[0];
    for (int m = 1; m < 8; m++)
        if (tmp[m] > max) max = tmp[m];
    return max;
}

/* one cell's score over an f16 K row in ggml's order (4 accumulators of 8 or 16, d % KQ_GG == 0) */
LLE_INLINE float kq_ggml_f16(const lle_half *kh, const float *qv, int64_t d) {
#if defined(LLE_OPS_512)
    __m512 c[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t l = 0; l < d; l += 64)
        for (int r = 0; r < 4; r++) c[r] = _mm512_fmadd_ps(LLE512_LDH(kh + l + 16 * r), _mm512_loadu_ps(qv + l + 16 * r), c[r]);
    return lle512_reduce(_mm512_add_ps(_mm512_add_ps(c[0], c[2]), _mm512_add_ps(c[1], c[3])));
#else
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    for (int64_t l = 0; l < d; l += 32) {
        s0 = _mm256_fmadd_ps(LDH(kh + l), _mm256_loadu_ps(qv + l), s0);
        s1 = _mm256_fmadd_ps(LDH(kh + l + 8), _mm256_loadu_ps(qv + l + 8), s1);
        s2 = _mm256_fmadd_ps(LDH(kh + l + 16), _mm256_loadu_ps(qv + l + 16), s2);
        s3 = _mm256_fmadd_ps(LDH(kh + l + 24), _mm256_loadu_ps(qv + l + 24), s3);
    }
    return reduce_ggml4(s0, s1, s2, s3);
#endif
}

/* Prefetches of KV head g's rows (`n` cells from cell j) for attention over a cell-major cache, where
 * one head's rows are 128-byte runs strided by the other heads' and the hardware prefetchers catch
 * few of them; a step's weights stream through the last-level cache between two visits of a
 * layer, so without these every row is a miss that the scores or the sums wait for. The scores
 * prefetch K rows KV_AHEAD cells ahead (and the first ones before they start) and the V rows of the
 * cells they score: the V sum comes after the softmax and visits cells by lane (j, j + 32, ...),
 * not in order. Prefetches are hints: nothing past the cache's t cells is touched. */
enum { KV_AHEAD = 24 };

LLE_INLINE void prefetch_rows(const uint8_t *base, int64_t stride_t, int64_t stride_h, const lle_attn_args *a,
                              int64_t g, int64_t j, int64_t n, size_t esz) {
    if (j + n > a->t) n = a->t - j;
    const size_t row = (size_t)a->d * esz;
    const uint8_t *r0 = base + ((size_t)j * stride_t + (size_t)g * stride_h) * esz;
    for (int64_t c = 0; c < n; c++)
        for (size_t o = 0; o < row; o += 64) _mm_prefetch((const char *)r0 + (size_t)c * stride_t * esz + o, _MM_HINT_T0);
}

/* before the scores: the first KV_AHEAD cells' K rows */
LLE_INLINE void prefetch_kv_start(const lle_attn_args *a, int64_t g, size_t esz) {
    prefetch_rows(a->k, a->ks_t, a->ks_h, a, g, 0, KV_AHEAD, esz);
}

/* while scoring the 8 cells at j: K rows KV_AHEAD cells on, V rows of these */
LLE_INLINE void prefetch_kv8(const lle_attn_args *a, int64_t g, int64_t j, size_t esz) {
    prefetch_rows(a->k, a->ks_t, a->ks_h, a, g, j + KV_AHEAD, 8, esz);
    prefetch_rows(a->v, a->vs_t, a->vs_h, a, g, j, 8, esz);
}

/* one cell's raw score (the t % 8 tail of the blocked scores): K row kr (f16 or f32) against the
 * float query qv, in tinyBLAS's order (tb) or ggml's */
LLE_INLINE float score1(const uint8_t *kr, const float *qv, int64_t d, int tb, int f16) {
    if (!f16) return tb ? dot_f32_tb((int)d, (const float *)kr, qv) : dot_f32_ggml((int)d, (const float *)kr, qv);
    const lle_half *kh = (const lle_half *)kr;
    if (!tb) return kq_ggml_f16(kh, qv, d);
#if defined(LLE_OPS_512)
    __m512 c16 = _mm512_setzero_ps();
    for (int64_t l = 0; l < d; l += 16) c16 = _mm512_fmadd_ps(LLE512_LDH(kh + l), _mm512_loadu_ps(qv + l), c16);
    return lle512_reduce(c16);
#else
    __m256 c = _mm256_setzero_ps();
    for (int64_t l = 0; l < d; l += 8) c = _mm256_fmadd_ps(LDH(kh + l), _mm256_loadu_ps(qv + l), c);
    return hsum8(c);
#endif
}

/* scores of all t cells into w (-inf when masked); returns the max, sets [jlo, jhi] */
LLE_INLINE float scores_blocked(const lle_attn_args *a, int64_t g, int qp, const float *qv, int tb, int f16,
                                float *w, int64_t *jlo_out, int64_t *jhi_out) {
    const int64_t d = a->d, t = a->t;
    const size_t esz = f16 ? 2 : 4;
    const size_t kst = (size_t)a->ks_t * esz;
    const uint8_t *kb = a->k + (size_t)(g * a->ks_h) * esz;
    const __m256i vqp = _mm256_set1_epi32(qp), vwin = _mm256_set1_epi32(a->window);
    const __m256 ninf = _mm256_set1_ps(-INFINITY), vscale = _mm256_set1_ps(a->scale);
    const float inv_cap = a->softcap > 0 ? 1.0f / a->softcap : 0.0f;
    __m256 vmax = ninf;
    int64_t jlo = t, jhi = -1, j = 0;
    prefetch_kv_start(a, g, esz);
    for (; j + 8 <= t; j += 8) {
        const int vis = visible8(a->k_pos + j, vqp, a->window, vwin);
        if (!vis) {
            _mm256_storeu_ps(w + j, ninf);
            continue;
        }
        if (jlo == t) jlo = j + __builtin_ctz((unsigned)vis);
        jhi = j + 31 - __builtin_clz((unsigned)vis);
        prefetch_kv8(a, g, j, esz);
        const __m256 s = finish_scores8(tb ? kq8_tb(kb + j * kst, kst, qv, d, f16) : kq8_ggml(kb + j * kst, kst, qv, d, f16),
                                        vis, a, inv_cap, vscale, ninf);
        _mm256_storeu_ps(w + j, s);
        vmax = _mm256_max_ps(s, vmax); /* NaN scores never become the max, as in the scalar loop */
    }
    float max = max8(vmax);
    for (; j < t; j++) {
        const int kp = a->k_pos[j];
        if (kp < 0 || kp > qp || (a->window > 0 && qp - kp >= a->window)) {
            w[j] = -INFINITY;
            continue;
        }
        if (j < jlo) jlo = j;
        jhi = j;
        float s = score1(kb + j * kst, qv, d, tb, f16);
        if (a->softcap > 0) s = tanhf(s * inv_cap) * a->softcap;
        w[j] = s * a->scale;
        if (w[j] > max) max = w[j];
    }
    *jlo_out = jlo;
    *jhi_out = jhi;
    return max;
}

/* o[e] = the sum of the L partial sums acc[l * ld + e] (e < d, ld >= d a multiple of 8) in
 * llama.cpp's order: the last step of every V sum (L = 8 or 32 on AVX2, 16 or 64 on AVX-512) */
LLE_INLINE void v_sum_finish(const float *acc, int64_t ld, int64_t d, int L, float *o) {
    int64_t e = 0;
#if defined(LLE_OPS_512)
    /* 16 values at a time (the same lane-wise additions as below) */
    if (L == 16 || L == 64) {
#define Z(l) _mm512_loadu_ps(acc + (l) * ld + e)
        for (; e + 16 <= d; e += 16) {
            __m512 y[16];
            for (int m = 0; m < 16; m++)
                y[m] = L == 16 ? Z(m) : _mm512_add_ps(_mm512_add_ps(Z(m), Z(32 + m)), _mm512_add_ps(Z(16 + m), Z(48 + m)));
            __m512 t3[8];
            for (int m = 0; m < 8; m++) t3[m] = _mm512_add_ps(y[m + 8], y[m]);
            _mm512_storeu_ps(o + e, _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(t3[4], t3[0]), _mm512_add_ps(t3[6], t3[2])),
                                                  _mm512_add_ps(_mm512_add_ps(t3[5], t3[1]), _mm512_add_ps(t3[7], t3[3]))));
        }
#undef Z
    }
#endif
#define A(l) _mm256_loadu_ps(acc + (l) * ld + e)
    for (; e < d; e += 8) {
        __m256 r;
        if (L == 16 || L == 64) {
            /* ggml's AVX-512 lanes: (for 64, the 4 accumulators first: (s0 + s2) + (s1 + s3)), then lle512_reduce */
            __m256 y[16];
            for (int m = 0; m < 16; m++)
                y[m] = L == 16 ? A(m) : _mm256_add_ps(_mm256_add_ps(A(m), A(32 + m)), _mm256_add_ps(A(16 + m), A(48 + m)));
            __m256 t3[8];
            for (int m = 0; m < 8; m++) t3[m] = _mm256_add_ps(y[m + 8], y[m]);
            r = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(t3[4], t3[0]), _mm256_add_ps(t3[6], t3[2])),
                              _mm256_add_ps(_mm256_add_ps(t3[5], t3[1]), _mm256_add_ps(t3[7], t3[3])));
        } else if (L == 8) {
            r = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(A(4), A(0)), _mm256_add_ps(A(6), A(2))),
                              _mm256_add_ps(_mm256_add_ps(A(5), A(1)), _mm256_add_ps(A(7), A(3))));
        } else {
            __m256 x[8];
            for (int l = 0; l < 8; l++) x[l] = _mm256_add_ps(_mm256_add_ps(A(l), A(16 + l)), _mm256_add_ps(A(8 + l), A(24 + l)));
            __m256 t0[4];
            for (int l = 0; l < 4; l++) t0[l] = _mm256_add_ps(x[l], x[4 + l]);
            r = _mm256_add_ps(_mm256_add_ps(t0[0], t0[1]), _mm256_add_ps(t0[2], t0[3]));
        }
        if (e + 8 <= d) {
            _mm256_storeu_ps(o + e, r);
        } else {
            float tmp[8];
            _mm256_storeu_ps(tmp, r);
            memcpy(o + e, tmp, (size_t)(d - e) * sizeof(float));
        }
    }
#undef A
}

#if defined(LLE_OPS_512)
/* v_sum_tree's step: lanes m, m + 16, m + 32, m + 48 of ch chunks of 16 values from value c0, for nh
 * heads, in registers (nh * ch * 4 of them); each head's sums of the four lanes into buf[h] row m */
LLE_INLINE void v_tree_lanes(const uint8_t *vb, size_t vst, int f16, const float *const *w, const int nh,
                             const int ch, int64_t jb, int64_t jend, int m, int64_t c0, int64_t d, float *const *buf) {
    const size_t esz = f16 ? 2 : 4;
    __m512 z[LLE_ATTN_GROUP][4][4];  /* head, chunk, lane */
    for (int h = 0; h < nh; h++)
        for (int k = 0; k < ch; k++) z[h][k][0] = z[h][k][1] = z[h][k][2] = z[h][k][3] = _mm512_setzero_ps();
    for (int64_t j0 = jb + m; j0 < jend; j0 += 64)
        for (int r = 0; r < 4; r++) {  /* lane m + 16 r */
            const int64_t j = j0 + 16 * r;
            if (j >= jend) break;
            const uint8_t *vr = vb + (size_t)j * vst + (size_t)c0 * esz;
            __m512 v[4];
            for (int k = 0; k < ch; k++) v[k] = ld_kv16(vr + (size_t)(16 * k) * esz, f16);
            for (int h = 0; h < nh; h++) {
                const __m512 p = _mm512_set1_ps(w[h][j]);
                const __mmask16 on = _mm512_cmp_ps_mask(p, _mm512_setzero_ps(), _CMP_NEQ_UQ);
                for (int k = 0; k < ch; k++) z[h][k][r] = _mm512_mask_mov_ps(z[h][k][r], on, _mm512_fmadd_ps(v[k], p, z[h][k][r]));
            }
        }
    for (int h = 0; h < nh; h++)
        for (int k = 0; k < ch; k++)
            _mm512_storeu_ps(buf[h] + m * d + c0 + 16 * k, _mm512_add_ps(_mm512_add_ps(z[h][k][0], z[h][k][2]),
                                                                      _mm512_add_ps(z[h][k][1], z[h][k][3])));
}

/* ggml's AVX-512 decode V sum (64 lanes; d % 16 == 0) of nh heads with v_sum_finish's first step done in
 * registers: for each lane m < 16 and 16 values, lanes m, m + 16, m + 32, m + 48 are summed over their
 * cells in order (a head's cells of probability 0 skipped, as v_sum_rows skips them, by mask), then
 * added as v_sum_finish adds them, (m + (m + 32)) + ((m + 16) + (m + 48)); those 16 sums per value go to
 * buf[h] and v_sum_finish (L = 16) adds them in the rest of its tree. The same additions, so the same
 * values, with 16 x d partial sums stored and reloaded instead of 64 x d: at short contexts (a few cells
 * per lane) that store and reload was most of the V sum. Each V load and probability serves as many
 * 16-value chunks as registers allow. buf[h]: 16 * d floats. */
LLE_INLINE void v_sum_tree(const lle_attn_args *a, int64_t g, const float *const *w, const int nh, int64_t jb,
                           int64_t jend, int f16, float *const *buf, float *const *out) {
    const int64_t d = a->d;
    const size_t vst = (size_t)a->vs_t * (f16 ? 2 : 4);
    const uint8_t *vb = a->v + (size_t)(g * a->vs_h) * (f16 ? 2 : 4);
    const int ch = nh == 1 ? 4 : nh <= 3 ? 2 : 1;  /* chunks per pass: 16 to 24 accumulators */
    for (int m = 0; m < 16; m++) {
        int64_t c0 = 0;
        for (; c0 + 16 * ch <= d; c0 += 16 * ch) v_tree_lanes(vb, vst, f16, w, nh, ch, jb, jend, m, c0, d, buf);
        for (; c0 < d; c0 += 16) v_tree_lanes(vb, vst, f16, w, nh, 1, jb, jend, m, c0, d, buf);
    }
    for (int h = 0; h < nh; h++) v_sum_finish(buf[h], d, d, 16, out[h]);
}

/* v_sum_tree's reach: cells from jb up to lle_attn_tree_max (the same values either way) */
LLE_INLINE int v_tree(int64_t d, int64_t jb, int64_t jend) {
    return d % 16 == 0 && jend - jb <= lle_attn_tree_max;
}
#endif

/* V sum (d % 8 == 0; w[j] are the final probabilities, 0 for masked cells, over [jb, jend) with jb a
 * multiple of L): llama.cpp keeps, per output value, L partial sums of the cells j with j % L = l.
 * Here each pass takes one l and a block of up to 64 output values (8 registers), so a V row is
 * read once per block and its probability broadcast once; the partial sums go to acc[l][e] and are
 * then added in llama.cpp's order. Cells with probability 0 are skipped as before. */
LLE_INLINE void v_sum_rows(const lle_attn_args *a, int64_t g, const float *w, int64_t jb, int64_t jend, int L,
                           int f16, float *acc, float *o) {
    const int64_t d = a->d;
    const size_t esz = f16 ? 2 : 4;
    const size_t vst = (size_t)a->vs_t * esz;
#if defined(LLE_OPS_512)
    if (L == 64 && v_tree(d, jb, jend)) {
        v_sum_tree(a, g, &w, 1, jb, jend, f16, &acc, &o);
        return;
    }
#endif
    for (int64_t e0 = 0; e0 < d; e0 += 64) {
        const int S = d - e0 >= 64 ? 8 : (int)((d - e0) / 8);
        const uint8_t *vb = a->v + (size_t)(g * a->vs_h + e0) * esz;
        for (int l = 0; l < L; l++) {
            __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
            __m256 s4 = _mm256_setzero_ps(), s5 = _mm256_setzero_ps(), s6 = _mm256_setzero_ps(), s7 = _mm256_setzero_ps();
#if defined(LLE_OPS_512)
            if (S == 8) {  /* the same lane-wise sums, 16 values per register */
                __m512 z0 = _mm512_setzero_ps(), z1 = _mm512_setzero_ps(), z2 = _mm512_setzero_ps(), z3 = _mm512_setzero_ps();
                for (int64_t j = jb + l; j < jend; j += L) {
                    if (w[j] == 0.0f) continue;
                    const __m512 p = _mm512_set1_ps(w[j]);
                    const uint8_t *vr = vb + (size_t)j * vst;
                    z0 = _mm512_fmadd_ps(ld_kv16(vr, f16), p, z0);
                    z1 = _mm512_fmadd_ps(ld_kv16(vr + 16 * esz, f16), p, z1);
                    z2 = _mm512_fmadd_ps(ld_kv16(vr + 32 * esz, f16), p, z2);
                    z3 = _mm512_fmadd_ps(ld_kv16(vr + 48 * esz, f16), p, z3);
                }
                s0 = lo256(z0); s1 = hi256(z0); s2 = lo256(z1); s3 = hi256(z1);
                s4 = lo256(z2); s5 = hi256(z2); s6 = lo256(z3); s7 = hi256(z3);
            } else
#endif
            if (S == 8) {
                for (int64_t j = jb + l; j < jend; j += L) {
                    if (w[j] == 0.0f) continue;
                    const __m256 p = _mm256_broadcast_ss(w + j);
                    const uint8_t *vr = vb + (size_t)j * vst;
                    s0 = _mm256_fmadd_ps(ld_kv(vr, f16), p, s0);
                    s1 = _mm256_fmadd_ps(ld_kv(vr + 8 * esz, f16), p, s1);
                    s2 = _mm256_fmadd_ps(ld_kv(vr + 16 * esz, f16), p, s2);
                    s3 = _mm256_fmadd_ps(ld_kv(vr + 24 * esz, f16), p, s3);
                    s4 = _mm256_fmadd_ps(ld_kv(vr + 32 * esz, f16), p, s4);
                    s5 = _mm256_fmadd_ps(ld_kv(vr + 40 * esz, f16), p, s5);
                    s6 = _mm256_fmadd_ps(ld_kv(vr + 48 * esz, f16), p, s6);
                    s7 = _mm256_fmadd_ps(ld_kv(vr + 56 * esz, f16), p, s7);
                }
            } else {
                for (int64_t j = jb + l; j < jend; j += L) {
                    if (w[j] == 0.0f) continue;
                    const __m256 p = _mm256_broadcast_ss(w + j);
                    const uint8_t *vr = vb + (size_t)j * vst;
                    s0 = _mm256_fmadd_ps(ld_kv(vr, f16), p, s0);
                    if (S > 1) s1 = _mm256_fmadd_ps(ld_kv(vr + 8 * esz, f16), p, s1);
                    if (S > 2) s2 = _mm256_fmadd_ps(ld_kv(vr + 16 * esz, f16), p, s2);
                    if (S > 3) s3 = _mm256_fmadd_ps(ld_kv(vr + 24 * esz, f16), p, s3);
                    if (S > 4) s4 = _mm256_fmadd_ps(ld_kv(vr + 32 * esz, f16), p, s4);
                    if (S > 5) s5 = _mm256_fmadd_ps(ld_kv(vr + 40 * esz, f16), p, s5);
                    if (S > 6) s6 = _mm256_fmadd_ps(ld_kv(vr + 48 * esz, f16), p, s6);
                }
            }
            float *al = acc + l * d + e0;
            const __m256 sv[8] = {s0, s1, s2, s3, s4, s5, s6, s7};
            for (int k = 0; k < S; k++) _mm256_storeu_ps(al + 8 * k, sv[k]);
        }
    }
    v_sum_finish(acc, d, d, L, o);
}

/* Attention of one query row and head exactly as llama.cpp computes it without flash attention
 * on this tier's CPU: Q rounded to the cache type, K.Q in ggml's (one query) or tinyBLAS's (several
 * queries) order, soft-cap, scale, softmax with ggml's vectorized expf over cells padded to SMX,
 * probabilities rounded to the cache type, and the V sum in the same two orders (kept as V_GG or V_TB
 * partial sums per output value while cells are visited one by one). Cells are scored 8 at a time
 * (blocks with no visible cell skipped) and the V partial sums live in registers, 8-value slice by
 * slice; every sum is still formed in llama.cpp's order. */
static void attn_row(const lle_attn_args *a, int64_t i, int64_t h, float *scratch) {
    const int64_t d = a->d, t = a->t;
    const int64_t tp = (t + 31) & ~(int64_t)31, ts = (t + SMX - 1) & ~(int64_t)(SMX - 1);
    const int64_t g = h / (a->n_head / a->n_kv);
    const int f16 = a->kv_f16;              /* Q and the probabilities rounded to f16 */
    const int ld16 = f16 && !a->kv_wide;     /* K and V read as f16 (else f32 copies, see lle_attn_args) */
    const size_t esz = ld16 ? 2 : 4;
    /* llama.cpp takes the tinyBLAS path for two or more query rows when the shapes allow it */
    const int tb_kq = a->n >= 2 && d % KQ_TB == 0;
    const int tb_kqv = a->n >= 2 && d % 4 == 0;
    float *w = scratch;                       /* tp scores, then probabilities */
    float *qf = w + 2 * tp;                   /* d floats (or d halves) */
    lle_half *q16 = (lle_half *)qf;
    float *acc = qf + ((d + 7) & ~(int64_t)7); /* up to V_GG x d partial sums */
    const float *q = a->q + (i * a->n_head + h) * d;
    if (f16) {
        int64_t e = 0;
        for (; e + 8 <= d; e += 8)
            _mm_storeu_si128((__m128i *)(q16 + e), _mm256_cvtps_ph(_mm256_loadu_ps(q + e), _MM_FROUND_TO_NEAREST_INT));
        for (; e < d; e++) q16[e] = _cvtss_sh(q[e], _MM_FROUND_TO_NEAREST_INT);
    } else {
        memcpy(qf, q, (size_t)d * sizeof(float));
    }
    const int qp = a->q_pos[i];
    const float inv_cap = a->softcap > 0 ? 1.0f / a->softcap : 0.0f;
    /* blocked scores: head size a multiple of 8 (tinyBLAS) or 32 (ggml); Q as floats once */
    const int blocked = tb_kq ? 1 : d % KQ_GG == 0;
    const int fast_kq = f16 && blocked;
    float *qc = acc;  /* reused: the V partial sums are only needed after the scores */
    if (fast_kq)
        for (int64_t e = 0; e < d; e += 8) _mm256_storeu_ps(qc + e, LDH(q16 + e));
    float max = -INFINITY;
    int64_t jlo = t, jhi = -1;
    if (blocked) {
        max = ld16 ? scores_blocked(a, g, qp, qc, tb_kq, 1, w, &jlo, &jhi)
                   : scores_blocked(a, g, qp, f16 ? qc : qf, tb_kq, 0, w, &jlo, &jhi);
    } else {
        for (int64_t j = 0; j < t; j++) {
            const int kp = a->k_pos[j];
            if (kp < 0 || kp > qp || (a->window > 0 && qp - kp >= a->window)) {
                w[j] = -INFINITY;
                continue;
            }
            if (j < jlo) jlo = j;
            jhi = j;
            const uint8_t *kr = a->k + (size_t)(j * a->ks_t + g * a->ks_h) * esz;
            float s;
            if (f16) {
                /* an f16 cache is read as f16 here: its f32 copies (kv_wide) exist only for head sizes
                 * of the tier's tinyBLAS order (kv_wide_align), which take the blocked path above */
                const lle_half *kh = (const lle_half *)kr;
                s = tb_kq ? dot_f16_tb((int)d, kh, q16) : dot_f16_ggml((int)d, kh, q16);
            } else {
                s = tb_kq ? dot_f32_tb((int)d, (const float *)kr, qf) : dot_f32_ggml((int)d, (const float *)kr, qf);
            }
            if (a->softcap > 0) s = tanhf(s * inv_cap) * a->softcap;
            w[j] = s * a->scale;
            if (w[j] > max) max = w[j];
        }
    }
    float *o = a->out + (i * a->n_head + h) * d;
    if (max == -INFINITY) {
        memset(o, 0, (size_t)d * sizeof(float));
        return;
    }
    for (int64_t j = t; j < ts; j++) w[j] = -INFINITY;
    /* the exponentials of whole 8-cell chunks outside [jlo, jhi] are all exactly 0 (masked): ggml's
     * sum over every chunk equals the sum over the chunks that hold a visible cell */
    const int64_t c0 = jlo & ~(int64_t)(SMX - 1), c1 = (jhi + SMX) & ~(int64_t)(SMX - 1);
    const float inv = (float)(1.0 / softmax_exp((int)(c1 - c0), w + c0, w + c0, max));
    /* probabilities, rounded to the cache type (cells of [c0, c1) outside [jlo, jhi] stay 0) */
    const __m256 vinv = _mm256_set1_ps(inv);
    for (int64_t j = c0; j < c1; j += 8) {
        const __m256 p = _mm256_mul_ps(_mm256_loadu_ps(w + j), vinv);
        _mm256_storeu_ps(w + j, f16 ? _mm256_cvtph_ps(_mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT)) : p);
    }
    const int L = tb_kqv ? V_TB : V_GG;
    if (d % 8 == 0) {
        /* llama.cpp's lanes are j % L: start at a multiple of L, the cells before c0 weigh 0 */
        const int64_t jb = jlo & ~(int64_t)(L - 1);
        for (int64_t j = jb; j < c0; j++) w[j] = 0.0f;
        if (ld16) v_sum_rows(a, g, w, jb, jhi + 1, L, 1, acc, o);
        else v_sum_rows(a, g, w, jb, jhi + 1, L, 0, acc, o);
        return;
    }
    const int64_t dp = (d + 7) & ~(int64_t)7;
    memset(acc, 0, (size_t)(L * dp) * sizeof(float));
    for (int64_t j = jlo; j <= jhi; j++) {
        const float p = w[j];
        if (p == 0.0f) continue;
        float *al = acc + (j % L) * dp;
        const __m256 vp = _mm256_set1_ps(p);
        const uint8_t *vr = a->v + (size_t)(j * a->vs_t + g * a->vs_h) * esz;
        int64_t e = 0;
        if (f16) {
            const lle_half *vh = (const lle_half *)vr;
            for (; e + 8 <= d; e += 8) _mm256_storeu_ps(al + e, _mm256_fmadd_ps(LDH(vh + e), vp, _mm256_loadu_ps(al + e)));
            for (; e < d; e++) al[e] = fmaf(_cvtsh_ss(vh[e]), p, al[e]);
        } else {
            const float *vf = (const float *)vr;
            for (; e + 8 <= d; e += 8) _mm256_storeu_ps(al + e, _mm256_fmadd_ps(_mm256_loadu_ps(vf + e), vp, _mm256_loadu_ps(al + e)));
            for (; e < d; e++) al[e] = fmaf(vf[e], p, al[e]);
        }
    }
    v_sum_finish(acc, dp, d, L, o);
}

/* ---- the query heads of one KV head together (f16 cache; AVX-512 tier) ----
 * attn_group computes heads h0 .. h0 + nh - 1 of query row i, which share KV head g, exactly as
 * attn_row computes each (the same scores, softmax and V sums in the same order, so every value
 * bit for bit), but each K and V row is loaded (and converted from f16) once for the nh heads
 * instead of once per head: grouped-query attention reads its cache 1/nh as often. One query row
 * (decode) takes ggml's orders over the f16 cache (d % 32 == 0); several (a prompt) take tinyBLAS's,
 * over the f16 cache or its f32 copies (kv_wide; d % 8 == 0). A 512-token prompt chunk after 2048
 * tokens reads its K and V rows from L2 once per (row, KV head) instead of once per (row, head):
 * SmolLM2's prompt attention went from 2.45-2.52 to 1.44-1.59 s. Anything else goes head by head
 * through attn_row. Scratch: nh consecutive attn_row scratches of `per` floats.
 * The 512-bit registers hold the nh heads' accumulators; with AVX2's 16 registers the shared
 * conversion needs a buffer, and measured slower than head by head (SmolLM2, 2048 cells: 164-227
 * vs 121-131 us per layer), so the AVX2 tier has no attn_group. */
#if defined(LLE_OPS_512)

/* scores_blocked (ggml order, f16 cache) for nh queries: w[h] gets query h's scores, max[h] its max;
 * the visible range [jlo, jhi] depends on positions only, so it is the same for every query */
/* scores_group's steps, shared with wide_scores: the scores of the visible 8 cells at j (vis != 0) for
 * nh queries into w[h] + j, their running maxima vmax; one cell j's scores (the t % 8 tail), max */
LLE_INLINE void scores8_group(const lle_attn_args *a, const uint8_t *k8, size_t kst, const float *const *qv, int nh,
                              int tb, int f16, int vis, float *const *w, int64_t j, __m256 *vmax) {
    const __m256 ninf = _mm256_set1_ps(-INFINITY), vscale = _mm256_set1_ps(a->scale);
    const float inv_cap = a->softcap > 0 ? 1.0f / a->softcap : 0.0f;
    __m256 s[LLE_ATTN_GROUP];
    if (tb) kq8_tb_group(k8, kst, qv, nh, a->d, f16, s);
    else kq8_ggml_group(k8, kst, qv, nh, a->d, f16, s);
    for (int h = 0; h < nh; h++) {
        const __m256 sh = finish_scores8(s[h], vis, a, inv_cap, vscale, ninf);
        _mm256_storeu_ps(w[h] + j, sh);
        vmax[h] = _mm256_max_ps(sh, vmax[h]);
    }
}

LLE_INLINE void score1_group(const lle_attn_args *a, const uint8_t *kr, const float *const *qv, int nh, int tb,
                             int f16, float *const *w, int64_t j, float *max) {
    const float inv_cap = a->softcap > 0 ? 1.0f / a->softcap : 0.0f;
    for (int h = 0; h < nh; h++) {
        float sc = score1(kr, qv[h], a->d, tb, f16);
        if (a->softcap > 0) sc = tanhf(sc * inv_cap) * a->softcap;
        w[h][j] = sc * a->scale;
        if (w[h][j] > max[h]) max[h] = w[h][j];
    }
}

/* cell j's visibility for query position qp (the scalar test of the t % 8 tail) */
LLE_INLINE int visible1(const lle_attn_args *a, int64_t j, int qp) {
    const int kp = a->k_pos[j];
    return !(kp < 0 || kp > qp || (a->window > 0 && qp - kp >= a->window));
}

LLE_INLINE void scores_group(const lle_attn_args *a, int64_t g, int qp, const float *const *qv, int nh, int tb,
                             int f16, float *const *w, float *max, int64_t *jlo_out, int64_t *jhi_out) {
    const int64_t t = a->t;
    const size_t esz = f16 ? 2 : 4;
    const size_t kst = (size_t)a->ks_t * esz;
    const uint8_t *kb = a->k + (size_t)(g * a->ks_h) * esz;
    const __m256i vqp = _mm256_set1_epi32(qp), vwin = _mm256_set1_epi32(a->window);
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    __m256 vmax[LLE_ATTN_GROUP];
    for (int h = 0; h < nh; h++) vmax[h] = ninf;
    int64_t jlo = t, jhi = -1, j = 0;
    prefetch_kv_start(a, g, esz);
    for (; j + 8 <= t; j += 8) {
        const int vis = visible8(a->k_pos + j, vqp, a->window, vwin);
        if (!vis) {
            for (int h = 0; h < nh; h++) _mm256_storeu_ps(w[h] + j, ninf);
            continue;
        }
        if (jlo == t) jlo = j + __builtin_ctz((unsigned)vis);
        jhi = j + 31 - __builtin_clz((unsigned)vis);
        prefetch_kv8(a, g, j, esz);
        scores8_group(a, kb + j * kst, kst, qv, nh, tb, f16, vis, w, j, vmax);
    }
    for (int h = 0; h < nh; h++) max[h] = max8(vmax[h]);
    for (; j < t; j++) {  /* the last t % 8 cells one by one, as scores_blocked */
        if (!visible1(a, j, qp)) {
            for (int h = 0; h < nh; h++) w[h][j] = -INFINITY;
            continue;
        }
        if (j < jlo) jlo = j;
        jhi = j;
        score1_group(a, kb + j * kst, qv, nh, tb, f16, w, j, max);
    }
    *jlo_out = jlo;
    *jhi_out = jhi;
}

/* v_sum_rows (f16 cache, L lanes) for nh heads: a V row is loaded and converted once per slice
 * block for every head whose probability of the cell is not 0; per (head, lane, value) the cells
 * are added in the same order, so the partial sums acc[h] are v_sum_rows' */
LLE_INLINE void v_sum_group(const lle_attn_args *a, int64_t g, const float *const *w, int nh, int64_t jb,
                            int64_t jend, int L, int f16, float *const *acc) {
    const int64_t d = a->d;
    const size_t esz = f16 ? 2 : 4;
    const size_t vst = (size_t)a->vs_t * esz;
    enum { E = 64 };  /* values per pass: 4 registers of 16 per head */
    for (int64_t e0 = 0; e0 < d; e0 += E) {
        const int S = d - e0 >= E ? E / 8 : (int)((d - e0) / 8);  /* 8-value slices in this pass */
        const uint8_t *vb = a->v + (size_t)(g * a->vs_h + e0) * esz;
        for (int l = 0; l < L; l++) {
            if (S == 8) {
                __m512 z[LLE_ATTN_GROUP][4];
                for (int h = 0; h < nh; h++) z[h][0] = z[h][1] = z[h][2] = z[h][3] = _mm512_setzero_ps();
                for (int64_t j = jb + l; j < jend; j += L) {
                    int any = 0;
                    for (int h = 0; h < nh; h++) any |= w[h][j] != 0.0f;
                    if (!any) continue;
                    const uint8_t *vr = vb + (size_t)j * vst;
                    const __m512 v0 = ld_kv16(vr, f16), v1 = ld_kv16(vr + 16 * esz, f16), v2 = ld_kv16(vr + 32 * esz, f16),
                                 v3 = ld_kv16(vr + 48 * esz, f16);
                    for (int h = 0; h < nh; h++) {
                        if (w[h][j] == 0.0f) continue;
                        const __m512 p = _mm512_set1_ps(w[h][j]);
                        z[h][0] = _mm512_fmadd_ps(v0, p, z[h][0]);
                        z[h][1] = _mm512_fmadd_ps(v1, p, z[h][1]);
                        z[h][2] = _mm512_fmadd_ps(v2, p, z[h][2]);
                        z[h][3] = _mm512_fmadd_ps(v3, p, z[h][3]);
                    }
                }
                for (int h = 0; h < nh; h++)
                    for (int k = 0; k < 4; k++) _mm512_storeu_ps(acc[h] + l * d + e0 + 16 * k, z[h][k]);
                continue;
            }
            /* the last d % 64 values: S < 8 slices of 8, two at a time */
            for (int s0 = 0; s0 < S; s0 += 2) {
                const int two = s0 + 1 < S;
                __m256 y[LLE_ATTN_GROUP][2];
                for (int h = 0; h < nh; h++) y[h][0] = y[h][1] = _mm256_setzero_ps();
                for (int64_t j = jb + l; j < jend; j += L) {
                    int any = 0;
                    for (int h = 0; h < nh; h++) any |= w[h][j] != 0.0f;
                    if (!any) continue;
                    const uint8_t *vr = vb + (size_t)j * vst + (size_t)(8 * s0) * esz;
                    const __m256 v0 = ld_kv(vr, f16), v1 = two ? ld_kv(vr + 8 * esz, f16) : _mm256_setzero_ps();
                    for (int h = 0; h < nh; h++) {
                        if (w[h][j] == 0.0f) continue;
                        const __m256 p = _mm256_broadcast_ss(w[h] + j);
                        y[h][0] = _mm256_fmadd_ps(v0, p, y[h][0]);
                        if (two) y[h][1] = _mm256_fmadd_ps(v1, p, y[h][1]);
                    }
                }
                for (int h = 0; h < nh; h++) {
                    _mm256_storeu_ps(acc[h] + l * d + e0 + 8 * s0, y[h][0]);
                    if (two) _mm256_storeu_ps(acc[h] + l * d + e0 + 8 * s0 + 8, y[h][1]);
                }
            }
        }
    }
}

LLE_INLINE void attn_group_n(const lle_attn_args *a, int64_t i, int64_t h0, const int nh, float *scratch, int64_t per) {
    const int64_t d = a->d, t = a->t;
    const int64_t tp = (t + 31) & ~(int64_t)31, ts = (t + SMX - 1) & ~(int64_t)(SMX - 1);
    const int64_t g = h0 / (a->n_head / a->n_kv);
    const int qp = a->q_pos[i];
    float *w[LLE_ATTN_GROUP], *acc[LLE_ATTN_GROUP], max[LLE_ATTN_GROUP];
    const float *qc[LLE_ATTN_GROUP];
    int nv = 0;  /* heads with a visible cell */
    for (int hh = 0; hh < nh; hh++) {
        /* attn_row's scratch layout per head: scores, Q (as halves, then as floats in acc) */
        float *sc = scratch + hh * per;
        w[hh] = sc;
        lle_half *q16 = (lle_half *)(sc + 2 * tp);
        acc[hh] = sc + 2 * tp + ((d + 7) & ~(int64_t)7);
        const float *q = a->q + (i * a->n_head + h0 + hh) * d;
        for (int64_t e = 0; e < d; e += 8)
            _mm_storeu_si128((__m128i *)(q16 + e), _mm256_cvtps_ph(_mm256_loadu_ps(q + e), _MM_FROUND_TO_NEAREST_INT));
        for (int64_t e = 0; e < d; e += 8) _mm256_storeu_ps(acc[hh] + e, LDH(q16 + e));
        qc[hh] = acc[hh];
    }
    /* attn_row's orders: ggml's for one query row (32 V lanes), tinyBLAS's for several (8); K and V
     * read as f16, or from the f32 copies of a prompt's cache (kv_wide) */
    const int tb = a->n >= 2, ld16 = !a->kv_wide;
    int64_t jlo, jhi;
    scores_group(a, g, qp, qc, nh, tb, ld16, w, max, &jlo, &jhi);
    const int L = tb ? V_TB : V_GG;
    const int64_t c0 = jlo & ~(int64_t)(SMX - 1), c1 = (jhi + SMX) & ~(int64_t)(SMX - 1), jb = jlo & ~(int64_t)(L - 1);
    float *wv[LLE_ATTN_GROUP], *av[LLE_ATTN_GROUP];
    int64_t hv[LLE_ATTN_GROUP];
    for (int hh = 0; hh < nh; hh++) {
        float *o = a->out + (i * a->n_head + h0 + hh) * d;
        if (max[hh] == -INFINITY) {
            memset(o, 0, (size_t)d * sizeof(float));
            continue;
        }
        float *wh = w[hh];
        for (int64_t j = t; j < ts; j++) wh[j] = -INFINITY;
        const float inv = (float)(1.0 / softmax_exp((int)(c1 - c0), wh + c0, wh + c0, max[hh]));
        const __m256 vinv = _mm256_set1_ps(inv);
        for (int64_t j = c0; j < c1; j += 8) {
            const __m256 p = _mm256_mul_ps(_mm256_loadu_ps(wh + j), vinv);
            _mm256_storeu_ps(wh + j, _mm256_cvtph_ps(_mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT)));
        }
        for (int64_t j = jb; j < c0; j++) wh[j] = 0.0f;
        wv[nv] = wh;
        av[nv] = acc[hh];
        hv[nv++] = hh;
    }
    if (!nv) return;
    if (L == V_GG && ld16 && v_tree(d, jb, jhi + 1)) {
        float *ov[LLE_ATTN_GROUP];
        for (int k = 0; k < nv; k++) ov[k] = a->out + (i * a->n_head + h0 + hv[k]) * d;
        /* every head or none has a visible cell (positions decide), so nv is nh but for NaN scores;
         * nh is a constant in each attn_group_n instance, so that call's loops are unrolled for it */
        if (nv == nh) v_sum_tree(a, g, (const float *const *)wv, nh, jb, jhi + 1, 1, av, ov);
        else v_sum_tree(a, g, (const float *const *)wv, nv, jb, jhi + 1, 1, av, ov);
        return;
    }
    v_sum_group(a, g, (const float *const *)wv, nv, jb, jhi + 1, L, ld16, av);
    for (int k = 0; k < nv; k++) v_sum_finish(av[k], d, d, L, a->out + (i * a->n_head + h0 + hv[k]) * d);
}

/* nh a compile-time constant in each instance, so the heads' accumulators stay in registers */
static void attn_group(const lle_attn_args *a, int64_t i, int64_t h0, int nh, float *scratch, int64_t per) {
    const int64_t d = a->d;
    if (nh < 2 || nh > LLE_ATTN_GROUP || !a->kv_f16 || (a->n == 1 ? a->kv_wide || d % KQ_GG != 0 : d % KQ_TB != 0)) {
        for (int hh = 0; hh < nh; hh++) attn_row(a, i, h0 + hh, scratch);
        return;
    }
    switch (nh) {
    case 2: attn_group_n(a, i, h0, 2, scratch, per); break;
    case 3: attn_group_n(a, i, h0, 3, scratch, per); break;
    default: attn_group_n(a, i, h0, 4, scratch, per); break;
    }
}

/* ---- lle_attn_wide's phases (common.h; ops.c runs them): attn_group's operations, split by cells and
 * by (KV head, lane half) ---- */

/* scores of block b's cells for every head, as scores_group, but KV head by KV head per 8 cells: the
 * cells' rows of all KV heads are adjacent, so the block is read front to back */
LLE_INLINE void wide_scores_n(lle_attn_wide *p, int64_t b, const int hpg) {
    const lle_attn_args *a = p->a;
    const int64_t t = a->t, nh = a->n_head, nkv = a->n_kv;
    const int64_t j0 = b * LLE_ATTN_WIDE_CELLS, j1 = j0 + LLE_ATTN_WIDE_CELLS < t ? j0 + LLE_ATTN_WIDE_CELLS : t;
    const size_t kst = (size_t)a->ks_t * 2;
    const int qp = a->q_pos[0];
    const __m256i vqp = _mm256_set1_epi32(qp), vwin = _mm256_set1_epi32(a->window);
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    __m256 vmax[LLE_ATTN_WIDE_MAX_HEADS];
    const float *qv[LLE_ATTN_WIDE_MAX_HEADS];
    float *w[LLE_ATTN_WIDE_MAX_HEADS];
    for (int64_t h = 0; h < nh; h++) {
        vmax[h] = ninf;
        qv[h] = p->qc + h * a->d;
        w[h] = p->w + h * p->tp;
    }
    int64_t jlo = t, jhi = -1, j = j0;
    for (; j + 8 <= j1; j += 8) {
        const int vis = visible8(a->k_pos + j, vqp, a->window, vwin);
        if (!vis) {
            for (int64_t h = 0; h < nh; h++) _mm256_storeu_ps(w[h] + j, ninf);
            continue;
        }
        if (jlo == t) jlo = j + __builtin_ctz((unsigned)vis);
        jhi = j + 31 - __builtin_clz((unsigned)vis);
        for (int64_t g = 0; g < nkv; g++)
            scores8_group(a, a->k + (size_t)(g * a->ks_h) * 2 + j * kst, kst, qv + g * hpg, hpg, 0, 1, vis, w + g * hpg,
                          j, vmax + g * hpg);
    }
    float *bmax = p->bmax + b * nh;
    for (int64_t h = 0; h < nh; h++) bmax[h] = max8(vmax[h]);
    for (; j < j1; j++) {  /* the last t % 8 cells one by one, as scores_group */
        if (!visible1(a, j, qp)) {
            for (int64_t h = 0; h < nh; h++) w[h][j] = -INFINITY;
            continue;
        }
        if (j < jlo) jlo = j;
        jhi = j;
        for (int64_t g = 0; g < nkv; g++)
            score1_group(a, a->k + (size_t)(g * a->ks_h) * 2 + j * kst, qv + g * hpg, hpg, 0, 1, w + g * hpg, j,
                         bmax + g * hpg);
    }
    p->bjlo[b] = jlo;
    p->bjhi[b] = jhi;
}

static void wide_scores(lle_attn_wide *p, int64_t b) {
    switch (p->a->n_head / p->a->n_kv) {
    case 1: wide_scores_n(p, b, 1); break;
    case 2: wide_scores_n(p, b, 2); break;
    case 3: wide_scores_n(p, b, 3); break;
    default: wide_scores_n(p, b, 4); break;
    }
}

/* softmax_exp's exponentials of block b's 16-cell chunks in [c0, c1), each chunk's lle512_reduce kept for
 * the sum (csum[j / 16]; ops.c adds them as doubles in chunk order, as softmax_exp) */
static void wide_exp(lle_attn_wide *p, int64_t b) {
    const int64_t lo = b * LLE_ATTN_WIDE_CELLS > p->c0 ? b * LLE_ATTN_WIDE_CELLS : p->c0;
    const int64_t hi = (b + 1) * LLE_ATTN_WIDE_CELLS < p->c1 ? (b + 1) * LLE_ATTN_WIDE_CELLS : p->c1;
    for (int64_t h = 0; h < p->a->n_head; h++) {
        if (p->maxv[h] == -INFINITY) continue;
        float *w = p->w + h * p->tp, *cs = p->csum + h * (p->tp / 8);
        const __m512 vmax = _mm512_set1_ps(p->maxv[h]);
        for (int64_t j = lo; j < hi; j += 16) {
            const __m512 val = v_expf512(_mm512_sub_ps(_mm512_loadu_ps(w + j), vmax));
            _mm512_storeu_ps(w + j, val);
            cs[j / 16] = lle512_reduce(val);
        }
    }
}

/* V sums of KV head g's query heads in lanes 16 * part .. + 15 (lane l: cells j % 64 == l, in order;
 * part 0..3), as v_sum_group: first the probabilities of this part's cells, in place of their exponentials (times
 * inv, rounded to f16; 0 before c0, where attn_group zeroes them), then lane by lane with the sums in
 * registers, a head skipping the cells where its probability is 0 */
LLE_INLINE void wide_v_n(lle_attn_wide *p, int64_t g, int part, const int hpg) {
    const lle_attn_args *a = p->a;
    const int64_t d = a->d, h0 = g * hpg;
    const size_t vst = (size_t)a->vs_t * 2;
    const uint8_t *vb = a->v + (size_t)(g * a->vs_h) * 2;
    const int64_t jend = p->jhi + 1, l0 = 16 * part;
    float *w[LLE_ATTN_GROUP];
    int live[LLE_ATTN_GROUP], nlive = 0;
    for (int hh = 0; hh < hpg; hh++) {
        w[hh] = p->w + (h0 + hh) * p->tp;
        live[hh] = p->inv[h0 + hh] != 0.0f;
        nlive += live[hh];
        if (!live[hh]) continue;
        const __m256 vinv = _mm256_set1_ps(p->inv[h0 + hh]);
        for (int64_t base = p->jb + l0; base < jend; base += V_GG)
            for (int m = 0; m < 16; m += 8) {
                const int64_t j = base + m;
                __m256 x = _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_mul_ps(_mm256_loadu_ps(w[hh] + j), vinv), _MM_FROUND_TO_NEAREST_INT));
                if (j < p->c0 || j + 8 > jend) {
                    float tmp[8];
                    _mm256_storeu_ps(tmp, x);
                    for (int i = 0; i < 8; i++)
                        if (j + i < p->c0 || j + i >= jend) tmp[i] = 0.0f;
                    x = _mm256_loadu_ps(tmp);
                }
                _mm256_storeu_ps(w[hh] + j, x);
            }
    }
    for (int64_t l = l0; nlive && l < l0 + 16; l++) {
        for (int64_t e0 = 0; e0 < d; e0 += 64) {
            const int four = d - e0 >= 64;  /* else the last 32 values */
            __m512 z[LLE_ATTN_GROUP][4];
            for (int hh = 0; hh < hpg; hh++) z[hh][0] = z[hh][1] = z[hh][2] = z[hh][3] = _mm512_setzero_ps();
            for (int64_t j = p->jb + l; j < jend; j += V_GG) {
                _mm_prefetch((const char *)vb + (size_t)(j + 128) * vst + e0 * 2, _MM_HINT_T0);
                if (four) _mm_prefetch((const char *)vb + (size_t)(j + 128) * vst + e0 * 2 + 64, _MM_HINT_T0);
                int any = 0;
                for (int hh = 0; hh < hpg; hh++) any |= live[hh] && w[hh][j] != 0.0f;
                if (!any) continue;
                const uint8_t *vr = vb + (size_t)j * vst + e0 * 2;
                const __m512 v0 = ld_kv16(vr, 1), v1 = ld_kv16(vr + 32, 1);
                const __m512 v2 = four ? ld_kv16(vr + 64, 1) : v0, v3 = four ? ld_kv16(vr + 96, 1) : v1;
                for (int hh = 0; hh < hpg; hh++) {
                    if (!live[hh] || w[hh][j] == 0.0f) continue;
                    const __m512 pv = _mm512_set1_ps(w[hh][j]);
                    z[hh][0] = _mm512_fmadd_ps(v0, pv, z[hh][0]);
                    z[hh][1] = _mm512_fmadd_ps(v1, pv, z[hh][1]);
                    if (four) {
                        z[hh][2] = _mm512_fmadd_ps(v2, pv, z[hh][2]);
                        z[hh][3] = _mm512_fmadd_ps(v3, pv, z[hh][3]);
                    }
                }
            }
            for (int hh = 0; hh < hpg; hh++) {
                if (!live[hh]) continue;
                float *al = p->acc + ((h0 + hh) * V_GG + l) * d + e0;
                _mm512_storeu_ps(al, z[hh][0]);
                _mm512_storeu_ps(al + 16, z[hh][1]);
                if (four) {
                    _mm512_storeu_ps(al + 32, z[hh][2]);
                    _mm512_storeu_ps(al + 48, z[hh][3]);
                }
            }
        }
    }
    /* the last of KV head g's four tasks to end adds the 64 lanes of its heads (attn_group_n's end) */
    if (__atomic_sub_fetch(&p->v_left[g], 1, __ATOMIC_ACQ_REL) != 0) return;
    for (int hh = 0; hh < hpg; hh++) {
        float *o = a->out + (h0 + hh) * d;
        if (live[hh]) v_sum_finish(p->acc + (h0 + hh) * V_GG * d, d, d, V_GG, o);
        else memset(o, 0, sizeof(float) * (size_t)d);
    }
}

static void wide_v(lle_attn_wide *p, int64_t g, int part) {
    switch (p->a->n_head / p->a->n_kv) {
    case 1: wide_v_n(p, g, part, 1); break;
    case 2: wide_v_n(p, g, part, 2); break;
    case 3: wide_v_n(p, g, part, 3); break;
    default: wide_v_n(p, g, part, 4); break;
    }
}
#define WIDE_SCORES wide_scores
#define WIDE_EXP wide_exp
#define WIDE_V wide_v
#define ATTN_GROUP attn_group
#else
#define ATTN_GROUP NULL
#define WIDE_SCORES NULL
#define WIDE_EXP NULL
#define WIDE_V NULL
#endif

/* ggml's rotate_pairs as GCC contracts it in an -march=native build:
 * x0*cos - x1*sin -> fma(x0, cos, -(x1*sin)) and x0*sin + x1*cos -> fma(x0, sin, x1*cos) */
static void rope_head(const float *src, float *dst, const float *cache, int n_rot, int neox) {
    const int half = n_rot / 2;
    for (int i0 = 0; i0 < n_rot; i0 += 2) {
        const int a = neox ? i0 / 2 : i0, b = neox ? i0 / 2 + half : i0 + 1;
        const float x0 = src[a], x1 = src[b];
        dst[a] = fmaf(x0, cache[i0], -(x1 * cache[i0 + 1]));
        dst[b] = fmaf(x0, cache[i0 + 1], x1 * cache[i0]);
    }
}

static void f16_to_f32(int64_t n, const lle_half *x, float *y) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    for (; i < n; i++) y[i] = _cvtsh_ss(x[i]);
}

/* F16C rounds to nearest even, as lle_fp32_to_fp16 (NaNs stay NaNs, their payload bits may differ) */
static void f32_to_f16(int64_t n, const float *x, lle_half *y) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) y[i] = lle_fp32_to_fp16(x[i]);
}

lle_op_kernels LLE_OPS_TABLE = {swiglu, geglu, softmax_exp, rope_head, attn_row, f16_to_f32, ATTN_GROUP, f32_to_f16,
                               WIDE_SCORES, WIDE_EXP, WIDE_V, KQ_TB};

#if defined(__clang__)
#pragma clang attribute pop
#endif

#elif defined(LLE_OPS_512)
lle_op_kernels LLE_OPS_512;
#else
lle_op_kernels lle_ops_avx2;
#endif
