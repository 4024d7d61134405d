/* AVX2 + FMA + F16C kernels: activation quantizers (bit-exact with the scalar reference), integer
 * dot products for every quantized type (ports of ggml's AVX2 kernels, MIT, The ggml authors),
 * float dot products, and multi-row tiles that reuse each unpacked weight block for up to four
 * activation rows (prefill). Compiled with a per-file target so one binary also runs on CPUs
 * without AVX2; the dispatcher only selects these when CPUID reports avx2, fma and f16c.
 */
#include "common.h"

#if defined(LLE_X86)

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,bmi2"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c,bmi2")
#endif

#include <immintrin.h>

lle_kernels lle_kernels_avx2[T_COUNT];

#define MM256_SET_M128I(a, b) _mm256_insertf128_si256(_mm256_castsi128_si256(b), (a), 1)

/* ---------------------------------------------------------------- helpers */

LLE_INLINE float hsum_float_8(const __m256 x) {
    __m128 res = _mm256_extractf128_ps(x, 1);
    res = _mm_add_ps(res, _mm256_castps256_ps128(x));
    res = _mm_add_ps(res, _mm_movehl_ps(res, res));
    res = _mm_add_ss(res, _mm_movehdup_ps(res));
    return _mm_cvtss_f32(res);
}

LLE_INLINE int hsum_i32_8(const __m256i a) {
    const __m128i sum128 = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extractf128_si256(a, 1));
    const __m128i hi64 = _mm_unpackhi_epi64(sum128, sum128);
    const __m128i sum64 = _mm_add_epi32(hi64, sum128);
    const __m128i hi32 = _mm_shuffle_epi32(sum64, _MM_SHUFFLE(2, 3, 0, 1));
    return _mm_cvtsi128_si32(_mm_add_epi32(sum64, hi32));
}

/* spread 32 bits to 32 bytes { 0x00, 0xFF } */
LLE_INLINE __m256i bytes_from_bits_32(const uint8_t *x) {
    uint32_t x32;
    memcpy(&x32, x, sizeof(uint32_t));
    const __m256i shuf_mask = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                0x0101010101010101, 0x0000000000000000);
    __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x32), shuf_mask);
    const __m256i bit_mask = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
    bytes = _mm256_or_si256(bytes, bit_mask);
    return _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1));
}

/* 32 nibbles -> 32 bytes in [0, 15]: low nibbles in the low lane, high nibbles in the high lane */
LLE_INLINE __m256i bytes_from_nibbles_32(const uint8_t *rsi) {
    const __m128i tmp = _mm_loadu_si128((const __m128i *)rsi);
    const __m256i bytes = MM256_SET_M128I(_mm_srli_epi16(tmp, 4), tmp);
    return _mm256_and_si256(_mm256_set1_epi8(0xF), bytes);
}

LLE_INLINE __m256 sum_i16_pairs_float(const __m256i x) {
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_set1_epi16(1), x));
}

/* unsigned ax times signed sy, summed in groups of four into 8 floats */
LLE_INLINE __m256 mul_sum_us8_pairs_float(const __m256i ax, const __m256i sy) {
    return sum_i16_pairs_float(_mm256_maddubs_epi16(ax, sy));
}

LLE_INLINE __m256i mul_sum_us8_pairs_i32(const __m256i ax, const __m256i sy) {
    return _mm256_madd_epi16(_mm256_set1_epi16(1), _mm256_maddubs_epi16(ax, sy));
}

/* signed x times signed y, summed in groups of four into 8 floats */
LLE_INLINE __m256 mul_sum_i8_pairs_float(const __m256i x, const __m256i y) {
    const __m256i ax = _mm256_sign_epi8(x, x);
    const __m256i sy = _mm256_sign_epi8(y, x);
    return mul_sum_us8_pairs_float(ax, sy);
}

LLE_INLINE __m256i mul_add_epi8(const __m256i x, const __m256i y) {
    const __m256i ax = _mm256_sign_epi8(x, x);
    const __m256i sy = _mm256_sign_epi8(y, x);
    return _mm256_maddubs_epi16(ax, sy);
}

static const uint8_t k_shuffle_q3k[128] = {
    0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3,
    4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7,
    8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11,
    12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15,
};
LLE_INLINE __m256i get_scale_shuffle_q3k(int i) { return _mm256_loadu_si256((const __m256i *)k_shuffle_q3k + i); }

static const uint8_t k_shuffle_k4[256] = {
    0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
    2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3,
    4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5,
    6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7,
    8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9,
    10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11,
    12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13,
    14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15,
};
LLE_INLINE __m256i get_scale_shuffle_k4(int i) { return _mm256_loadu_si256((const __m256i *)k_shuffle_k4 + i); }

static const uint8_t k_shuffle_q6[128] = {
    0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
    4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7,
    8, 8, 8, 8, 8, 8, 8, 8, 9, 9, 9, 9, 9, 9, 9, 9, 10, 10, 10, 10, 10, 10, 10, 10, 11, 11, 11, 11, 11, 11, 11, 11,
    12, 12, 12, 12, 12, 12, 12, 12, 13, 13, 13, 13, 13, 13, 13, 13, 14, 14, 14, 14, 14, 14, 14, 14, 15, 15, 15, 15, 15, 15, 15, 15,
};
LLE_INLINE __m128i get_scale_shuffle(int i) { return _mm_loadu_si128((const __m128i *)k_shuffle_q6 + i); }

LLE_INLINE float h2f(lle_half h) { return _cvtsh_ss(h); }

/* ---------------------------------------------------------------- activation quantizers */

/* round half away from zero (C roundf) for |v| < 2^23 */
LLE_INLINE __m256 roundf_ps(__m256 v) {
    const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 frac = _mm256_sub_ps(v, t);
    const __m256 sign = _mm256_and_ps(v, _mm256_set1_ps(-0.0f));
    const __m256 absfrac = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), frac);
    const __m256 ge = _mm256_cmp_ps(absfrac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    const __m256 one = _mm256_or_ps(_mm256_set1_ps(1.0f), sign);
    return _mm256_add_ps(t, _mm256_and_ps(ge, one));
}

LLE_INLINE __m256i pack_i32_to_i8(__m256i i0, __m256i i1, __m256i i2, __m256i i3) {
    i0 = _mm256_packs_epi32(i0, i1);
    i2 = _mm256_packs_epi32(i2, i3);
    i0 = _mm256_packs_epi16(i0, i2);
    return _mm256_permutevar8x32_epi32(i0, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

LLE_INLINE float block_amax(const float *x, __m256 *v) {
    const __m256 sign_bit = _mm256_set1_ps(-0.0f);
    v[0] = _mm256_loadu_ps(x);
    v[1] = _mm256_loadu_ps(x + 8);
    v[2] = _mm256_loadu_ps(x + 16);
    v[3] = _mm256_loadu_ps(x + 24);
    __m256 m = _mm256_andnot_ps(sign_bit, v[0]);
    m = _mm256_max_ps(m, _mm256_andnot_ps(sign_bit, v[1]));
    m = _mm256_max_ps(m, _mm256_andnot_ps(sign_bit, v[2]));
    m = _mm256_max_ps(m, _mm256_andnot_ps(sign_bit, v[3]));
    __m128 max4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
    max4 = _mm_max_ps(max4, _mm_movehl_ps(max4, max4));
    max4 = _mm_max_ss(max4, _mm_movehdup_ps(max4));
    return _mm_cvtss_f32(max4);
}

LLE_INLINE __m256i q8_round_ps(__m256 v, int mode) {
    return _mm256_cvtps_epi32(mode == LLE_ROUND_REF ? roundf_ps(v)
                                                    : _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

static void quantize_q8_0(const float *LLE_RESTRICT x, void *LLE_RESTRICT vy, int64_t k) {
    block_q8_0 *y = vy;
    const int mode = lle_act_rounding;
    for (int64_t i = 0; i < k / QK; i++, x += QK) {
        __m256 v[4];
        const float amax = block_amax(x, v);
        const float d = amax / 127;
        const float id = mode == LLE_ROUND_X86 ? (amax != 0.0f ? 127.f / amax : 0.0f) : (d ? 1.0f / d : 0.0f);
        y[i].d = lle_fp32_to_fp16(d);
        const __m256 mul = _mm256_set1_ps(id);
        __m256i q[4];
        for (int j = 0; j < 4; j++) q[j] = q8_round_ps(_mm256_mul_ps(v[j], mul), mode);
        _mm256_storeu_si256((__m256i *)y[i].qs, pack_i32_to_i8(q[0], q[1], q[2], q[3]));
    }
}

static void quantize_q8_1(const float *LLE_RESTRICT x, void *LLE_RESTRICT vy, int64_t k) {
    block_q8_1 *y = vy;
    const int mode = lle_act_rounding;
    for (int64_t i = 0; i < k / QK; i++, x += QK) {
        __m256 v[4];
        const float amax = block_amax(x, v);
        const float d = amax / 127;
        const float id = mode == LLE_ROUND_X86 ? (amax != 0.0f ? 127.f / amax : 0.0f) : (d ? 1.0f / d : 0.0f);
        y[i].d = lle_fp32_to_fp16(d);
        const __m256 mul = _mm256_set1_ps(id);
        __m256i q[4];
        for (int j = 0; j < 4; j++) q[j] = q8_round_ps(_mm256_mul_ps(v[j], mul), mode);
        const int sum = hsum_i32_8(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
        y[i].s = lle_fp32_to_fp16(sum * d);
        _mm256_storeu_si256((__m256i *)y[i].qs, pack_i32_to_i8(q[0], q[1], q[2], q[3]));
    }
}

/* Q8_K (ggml's quantize_row_q8_K_ref); r8_rule: the sign of the scale as
 * ggml_quantize_mat_q8_K_4x8 picks it (negative when +amax occurs anywhere in the block, where the
 * reference takes the sign of the first element of largest magnitude) */
LLE_INLINE void quantize_q8_K_impl(const float *LLE_RESTRICT x, void *LLE_RESTRICT vy, int64_t k, const int r8_rule) {
    block_q8_K *y = vy;
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        const __m256 sign_bit = _mm256_set1_ps(-0.0f);
        __m256 m = _mm256_setzero_ps();
        for (int j = 0; j < QK_K; j += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign_bit, _mm256_loadu_ps(x + j)));
        __m128 max4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
        max4 = _mm_max_ps(max4, _mm_movehl_ps(max4, max4));
        max4 = _mm_max_ss(max4, _mm_movehdup_ps(max4));
        const float amax = _mm_cvtss_f32(max4);
        if (!amax) {
            memset(&y[i], 0, sizeof(block_q8_K));
            continue;
        }
        float max = 0;
        if (r8_rule) {
            max = -amax;
            for (int j = 0; j < QK_K; ++j)
                if (x[j] == amax) { max = amax; break; }
        } else {
            for (int j = 0; j < QK_K; ++j)
                if (fabsf(x[j]) == amax) { max = x[j]; break; }
        }
        const float iscale = -127.f / max;
        const __m256 mul = _mm256_set1_ps(iscale);
        const __m256i lim = _mm256_set1_epi32(127);
        for (int j = 0; j < QK_K; j += 32) {
            __m256i q[4];
            for (int l = 0; l < 4; l++) {
                const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + j + 8 * l), mul);
                q[l] = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)), lim);
            }
            const __m256i packed = pack_i32_to_i8(q[0], q[1], q[2], q[3]);
            _mm256_storeu_si256((__m256i *)(y[i].qs + j), packed);
            const __m256i s16 = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(packed)), _mm256_set1_epi16(1));
            const __m256i s16h = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(packed, 1)), _mm256_set1_epi16(1));
            y[i].bsums[j / 16 + 0] = (int16_t)hsum_i32_8(s16);
            y[i].bsums[j / 16 + 1] = (int16_t)hsum_i32_8(s16h);
        }
        y[i].d = 1 / iscale;
    }
}

static void quantize_q8_K(const float *LLE_RESTRICT x, void *LLE_RESTRICT vy, int64_t k) { quantize_q8_K_impl(x, vy, k, 0); }
static void quantize_q8_K_r8(const float *LLE_RESTRICT x, void *LLE_RESTRICT vy, int64_t k) { quantize_q8_K_impl(x, vy, k, 1); }

static void quantize_f16(const float *LLE_RESTRICT x, void *LLE_RESTRICT vy, int64_t k) {
    lle_half *y = vy;
    int64_t i = 0;
    for (; i + 8 <= k; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < k; i++) y[i] = lle_fp32_to_fp16(x[i]);
}

/* ---------------------------------------------------------------- float dot products */
/* One activation row: ggml's vec_dot_f32/_f16/_bf16 exactly (accumulators, reduction tree, and
 * the multiply-adds GCC contracts in an -march=native build). Several rows: llamafile tinyBLAS's
 * order (one 8-lane accumulator, reduced as (hi+lo), then (0+2)+(1+3)). */

#define LDH(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define LDB(p) _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))

LLE_INLINE float reduce_ggml4(__m256 s0, __m256 s1, __m256 s2, __m256 s3) {
    const __m256 x = _mm256_add_ps(_mm256_add_ps(s0, s2), _mm256_add_ps(s1, s3));
    const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    const __m128 t1 = _mm_hadd_ps(t0, t0);
    return _mm_cvtss_f32(_mm_hadd_ps(t1, t1));
}

/* the ends of vec_dot_f32 / _f16 / _bf16 (shared with their rows kernels, gemv_rows_avx2.inc): the
 * four accumulators c[0..3] of the first np values (np = n & ~31) reduced, plus the tail (f32: by 8
 * and 4 products, rounded and added in turn, the last (n - np) % 4 fused) */
LLE_INLINE float finish_f32(const __m256 *c, const float *x, const float *y, int np, int n) {
    return lle_f32_dot_finish(reduce_ggml4(c[0], c[1], c[2], c[3]), x, y, np, n, 4);
}

static void vec_dot_f32(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const float *x = vx, *y = vy;
    const int np = n & ~31;
    __m256 c[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int i = 0; i < np; i += 32)
        for (int r = 0; r < 4; r++) c[r] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8 * r), _mm256_loadu_ps(y + i + 8 * r), c[r]);
    *s = finish_f32(c, x, y, np, n);
}

LLE_INLINE float finish_f16(const __m256 *c, const lle_half *x, const lle_half *y, int np, int n) {
    double sumf = reduce_ggml4(c[0], c[1], c[2], c[3]);
    for (int i = np; i < n; i++) sumf += (double)(h2f(x[i]) * h2f(y[i]));
    return (float)sumf;
}

LLE_INLINE float finish_bf16(const __m256 *c, const uint16_t *x, const uint16_t *y, int np, int n) {
    return lle_bf16_dot_finish((double)hsum_float_8(_mm256_add_ps(_mm256_add_ps(c[0], c[2]), _mm256_add_ps(c[1], c[3]))),
                               x, y, np, n);
}

#define VEC_DOT_HALF(NAME, T, LOAD)                                                                       \
    static void vec_dot_##NAME(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) { \
        const T *x = vx, *y = vy;                                                                         \
        const int np = n & ~31;                                                                           \
        __m256 c[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()}; \
        for (int i = 0; i < np; i += 32) {                                                                \
            c[0] = _mm256_fmadd_ps(LOAD(x + i), LOAD(y + i), c[0]);                                       \
            c[1] = _mm256_fmadd_ps(LOAD(x + i + 8), LOAD(y + i + 8), c[1]);                               \
            c[2] = _mm256_fmadd_ps(LOAD(x + i + 16), LOAD(y + i + 16), c[2]);                             \
            c[3] = _mm256_fmadd_ps(LOAD(x + i + 24), LOAD(y + i + 24), c[3]);                             \
        }                                                                                                 \
        *s = finish_##NAME(c, x, y, np, n);                                                               \
    }

VEC_DOT_HALF(f16, lle_half, LDH)
VEC_DOT_HALF(bf16, uint16_t, LDB)

static void vec_dot_f32_tb(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const float *x = vx, *y = vy;
    __m256 c = _mm256_setzero_ps();
    for (int l = 0; l < n; l += 8) c = _mm256_fmadd_ps(_mm256_loadu_ps(x + l), _mm256_loadu_ps(y + l), c);
    *s = hsum_float_8(c);
}

static void vec_dot_f16_tb(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const lle_half *x = vx, *y = vy;
    __m256 c = _mm256_setzero_ps();
    for (int l = 0; l < n; l += 8) c = _mm256_fmadd_ps(LDH(x + l), LDH(y + l), c);
    *s = hsum_float_8(c);
}

static void vec_dot_bf16_tb(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const uint16_t *x = vx, *y = vy;
    __m256 c = _mm256_setzero_ps();
    for (int l = 0; l < n; l += 8) c = _mm256_fmadd_ps(LDB(x + l), LDB(y + l), c);
    *s = hsum_float_8(c);
}

/* ---------------------------------------------------------------- 32-block quant dot products */

static void vec_dot_q4_0(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const block_q4_0 *x = vx;
    const block_q8_0 *y = vy;
    __m256 acc = _mm256_setzero_ps();
    for (int ib = 0; ib < n / QK; ++ib) {
        const __m256 d = _mm256_set1_ps(h2f(x[ib].d) * h2f(y[ib].d));
        const __m256i qx = _mm256_sub_epi8(bytes_from_nibbles_32(x[ib].qs), _mm256_set1_epi8(8));
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[ib].qs);
        acc = _mm256_fmadd_ps(d, mul_sum_i8_pairs_float(qx, qy), acc);
    }
    *s = hsum_float_8(acc);
}

static void vec_dot_q4_1(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const block_q4_1 *x = vx;
    const block_q8_1 *y = vy;
    __m256 acc = _mm256_setzero_ps();
    float summs = 0;
    for (int ib = 0; ib < n / QK; ++ib) {
        summs = fmaf(h2f(x[ib].m), h2f(y[ib].s), summs);  /* contracted in ggml's build (exact anyway) */
        const __m256 d0d1 = _mm256_set1_ps(h2f(x[ib].d) * h2f(y[ib].d));
        const __m256i qx = bytes_from_nibbles_32(x[ib].qs);
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[ib].qs);
        acc = _mm256_fmadd_ps(d0d1, mul_sum_us8_pairs_float(qx, qy), acc);
    }
    *s = hsum_float_8(acc) + summs;
}

static void vec_dot_q5_0(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const block_q5_0 *x = vx;
    const block_q8_0 *y = vy;
    __m256 acc = _mm256_setzero_ps();
    for (int ib = 0; ib < n / QK; ++ib) {
        const __m256 d = _mm256_set1_ps(h2f(x[ib].d) * h2f(y[ib].d));
        __m256i qx = bytes_from_nibbles_32(x[ib].qs);
        __m256i bxhi = bytes_from_bits_32(x[ib].qh);
        bxhi = _mm256_andnot_si256(bxhi, _mm256_set1_epi8((char)0xF0));
        qx = _mm256_or_si256(qx, bxhi);
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[ib].qs);
        acc = _mm256_fmadd_ps(d, mul_sum_i8_pairs_float(qx, qy), acc);
    }
    *s = hsum_float_8(acc);
}

static void vec_dot_q5_1(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const block_q5_1 *x = vx;
    const block_q8_1 *y = vy;
    __m256 acc = _mm256_setzero_ps();
    float summs = 0.0f;
    for (int ib = 0; ib < n / QK; ++ib) {
        const __m256 dx = _mm256_set1_ps(h2f(x[ib].d));
        summs += h2f(x[ib].m) * h2f(y[ib].s);
        __m256i qx = bytes_from_nibbles_32(x[ib].qs);
        __m256i bxhi = bytes_from_bits_32(x[ib].qh);
        bxhi = _mm256_and_si256(bxhi, _mm256_set1_epi8(0x10));
        qx = _mm256_or_si256(qx, bxhi);
        const __m256 dy = _mm256_set1_ps(h2f(y[ib].d));
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[ib].qs);
        acc = _mm256_fmadd_ps(mul_sum_us8_pairs_float(qx, qy), _mm256_mul_ps(dx, dy), acc);
    }
    *s = hsum_float_8(acc) + summs;
}

static void vec_dot_q8_0(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const block_q8_0 *x = vx;
    const block_q8_0 *y = vy;
    __m256 acc = _mm256_setzero_ps();
    for (int ib = 0; ib < n / QK; ++ib) {
        const __m256 d = _mm256_set1_ps(h2f(x[ib].d) * h2f(y[ib].d));
        const __m256i qx = _mm256_loadu_si256((const __m256i *)x[ib].qs);
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[ib].qs);
        acc = _mm256_fmadd_ps(d, mul_sum_i8_pairs_float(qx, qy), acc);
    }
    *s = hsum_float_8(acc);
}

static void vec_dot_iq4_nl(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const block_iq4_nl *x = vx;
    const block_q8_0 *y = vy;
    const int nb = n / QK;
    const __m128i values128 = _mm_loadu_si128((const __m128i *)lle_kvalues_iq4nl);
    const __m128i m4b = _mm_set1_epi8(0x0f);
    const __m256i mone = _mm256_set1_epi16(1);
    __m256 accum1 = _mm256_setzero_ps(), accum2 = _mm256_setzero_ps();
    int ib = 0;
    for (; ib + 1 < nb; ib += 2) {
        const __m128i q4bits_1 = _mm_loadu_si128((const __m128i *)x[ib + 0].qs);
        const __m128i q4bits_2 = _mm_loadu_si128((const __m128i *)x[ib + 1].qs);
        const __m256i q8b_1 = _mm256_loadu_si256((const __m256i *)y[ib + 0].qs);
        const __m256i q8b_2 = _mm256_loadu_si256((const __m256i *)y[ib + 1].qs);
        const __m256i q4b_1 = MM256_SET_M128I(_mm_shuffle_epi8(values128, _mm_and_si128(_mm_srli_epi16(q4bits_1, 4), m4b)),
                                              _mm_shuffle_epi8(values128, _mm_and_si128(q4bits_1, m4b)));
        const __m256i q4b_2 = MM256_SET_M128I(_mm_shuffle_epi8(values128, _mm_and_si128(_mm_srli_epi16(q4bits_2, 4), m4b)),
                                              _mm_shuffle_epi8(values128, _mm_and_si128(q4bits_2, m4b)));
        const __m256i p_1 = _mm256_madd_epi16(mul_add_epi8(q4b_1, q8b_1), mone);
        const __m256i p_2 = _mm256_madd_epi16(mul_add_epi8(q4b_2, q8b_2), mone);
        accum1 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(y[ib + 0].d) * h2f(x[ib + 0].d)), _mm256_cvtepi32_ps(p_1), accum1);
        accum2 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(y[ib + 1].d) * h2f(x[ib + 1].d)), _mm256_cvtepi32_ps(p_2), accum2);
    }
    float sumf = hsum_float_8(_mm256_add_ps(accum1, accum2));
    for (; ib < nb; ++ib) {
        const float d = h2f(y[ib].d) * h2f(x[ib].d);
        int sumi1 = 0, sumi2 = 0;
        for (int j = 0; j < QK / 2; ++j) {
            sumi1 += y[ib].qs[j] * lle_kvalues_iq4nl[x[ib].qs[j] & 0xf];
            sumi2 += y[ib].qs[j + QK / 2] * lle_kvalues_iq4nl[x[ib].qs[j] >> 4];
        }
        sumf = fmaf(d, (float)(sumi1 + sumi2), sumf);  /* GCC contracts ggml's `sumf += d * (...)` */
    }
    *s = sumf;
}

/* IQ4_NL for several activation rows, as llamafile's tinyBLAS_Q0_AVX: one accumulator over all blocks */
static void vec_dot_iq4_nl_tb(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const block_iq4_nl *x = vx;
    const block_q8_0 *y = vy;
    const __m128i values128 = _mm_loadu_si128((const __m128i *)lle_kvalues_iq4nl);
    const __m128i m4b = _mm_set1_epi8(0x0f);
    __m256 acc = _mm256_setzero_ps();
    for (int ib = 0; ib < n / QK; ++ib) {
        const __m128i q4bits = _mm_loadu_si128((const __m128i *)x[ib].qs);
        const __m256i q4b = MM256_SET_M128I(_mm_shuffle_epi8(values128, _mm_and_si128(_mm_srli_epi16(q4bits, 4), m4b)),
                                            _mm_shuffle_epi8(values128, _mm_and_si128(q4bits, m4b)));
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[ib].qs);
        const __m256 d = _mm256_set1_ps(h2f(x[ib].d) * h2f(y[ib].d));
        acc = _mm256_fmadd_ps(d, mul_sum_i8_pairs_float(q4b, qy), acc);
    }
    *s = hsum_float_8(acc);
}

/* ---------------------------------------------------------------- K-quant dot products */

static void vec_dot_q2_K(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const block_q2_K *x = vx;
    const block_q8_K *y = vy;
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m128i m4 = _mm_set1_epi8(0xF);
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < n / QK_K; ++i) {
        const float d = y[i].d * h2f(x[i].d);
        const float dmin = -y[i].d * h2f(x[i].dmin);
        const uint8_t *q2 = x[i].qs;
        const int8_t *q8 = y[i].qs;
        const __m128i mins_and_scales = _mm_loadu_si128((const __m128i *)x[i].scales);
        const __m128i scales8 = _mm_and_si128(mins_and_scales, m4);
        const __m128i mins8 = _mm_and_si128(_mm_srli_epi16(mins_and_scales, 4), m4);
        const __m256i mins = _mm256_cvtepi8_epi16(mins8);
        const __m256i prod = _mm256_madd_epi16(mins, _mm256_loadu_si256((const __m256i *)y[i].bsums));
        acc = _mm256_fmadd_ps(_mm256_broadcast_ss(&dmin), _mm256_cvtepi32_ps(prod), acc);
        const __m256i all_scales = _mm256_cvtepi8_epi16(scales8);
        const __m128i l_scales = _mm256_extracti128_si256(all_scales, 0);
        const __m128i h_scales = _mm256_extracti128_si256(all_scales, 1);
        const __m256i scales[2] = {MM256_SET_M128I(l_scales, l_scales), MM256_SET_M128I(h_scales, h_scales)};
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < QK_K / 128; ++j) {
            const __m256i q2bits = _mm256_loadu_si256((const __m256i *)q2);
            q2 += 32;
            const __m256i q8_0 = _mm256_loadu_si256((const __m256i *)q8); q8 += 32;
            const __m256i q8_1 = _mm256_loadu_si256((const __m256i *)q8); q8 += 32;
            const __m256i q8_2 = _mm256_loadu_si256((const __m256i *)q8); q8 += 32;
            const __m256i q8_3 = _mm256_loadu_si256((const __m256i *)q8); q8 += 32;
            const __m256i q2_0 = _mm256_and_si256(q2bits, m3);
            const __m256i q2_1 = _mm256_and_si256(_mm256_srli_epi16(q2bits, 2), m3);
            const __m256i q2_2 = _mm256_and_si256(_mm256_srli_epi16(q2bits, 4), m3);
            const __m256i q2_3 = _mm256_and_si256(_mm256_srli_epi16(q2bits, 6), m3);
            __m256i p0 = _mm256_maddubs_epi16(q2_0, q8_0);
            __m256i p1 = _mm256_maddubs_epi16(q2_1, q8_1);
            __m256i p2 = _mm256_maddubs_epi16(q2_2, q8_2);
            __m256i p3 = _mm256_maddubs_epi16(q2_3, q8_3);
            p0 = _mm256_madd_epi16(_mm256_shuffle_epi8(scales[j], get_scale_shuffle_q3k(0)), p0);
            p1 = _mm256_madd_epi16(_mm256_shuffle_epi8(scales[j], get_scale_shuffle_q3k(1)), p1);
            p2 = _mm256_madd_epi16(_mm256_shuffle_epi8(scales[j], get_scale_shuffle_q3k(2)), p2);
            p3 = _mm256_madd_epi16(_mm256_shuffle_epi8(scales[j], get_scale_shuffle_q3k(3)), p3);
            p0 = _mm256_add_epi32(p0, p1);
            p2 = _mm256_add_epi32(p2, p3);
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p2));
        }
        acc = _mm256_fmadd_ps(_mm256_broadcast_ss(&d), _mm256_cvtepi32_ps(sumi), acc);
    }
    *s = hsum_float_8(acc);
}

static void vec_dot_q3_K(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const block_q3_K *x = vx;
    const block_q8_K *y = vy;
    const uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m256i mone = _mm256_set1_epi8(1);
    const __m128i m32 = _mm_set1_epi8(32);
    __m256 acc = _mm256_setzero_ps();
    uint32_t aux[3];
    for (int i = 0; i < n / QK_K; ++i) {
        const float d = y[i].d * h2f(x[i].d);
        const uint8_t *q3 = x[i].qs;
        const int8_t *q8 = y[i].qs;
        memcpy(aux, x[i].scales, 12);
        __m128i scales128 = _mm_set_epi32((int)(((aux[1] >> 4) & kmask2) | (((aux[2] >> 6) & kmask1) << 4)),
                                          (int)(((aux[0] >> 4) & kmask2) | (((aux[2] >> 4) & kmask1) << 4)),
                                          (int)((aux[1] & kmask2) | (((aux[2] >> 2) & kmask1) << 4)),
                                          (int)((aux[0] & kmask2) | (((aux[2] >> 0) & kmask1) << 4)));
        scales128 = _mm_sub_epi8(scales128, m32);
        const __m256i all_scales = _mm256_cvtepi8_epi16(scales128);
        const __m128i l_scales = _mm256_extracti128_si256(all_scales, 0);
        const __m128i h_scales = _mm256_extracti128_si256(all_scales, 1);
        const __m256i scales[2] = {MM256_SET_M128I(l_scales, l_scales), MM256_SET_M128I(h_scales, h_scales)};
        const __m256i hbits = _mm256_loadu_si256((const __m256i *)x[i].hmask);
        __m256i sumi = _mm256_setzero_si256();
        int bit = 0;
        for (int j = 0; j < QK_K / 128; ++j) {
            const __m256i q3bits = _mm256_loadu_si256((const __m256i *)q3);
            q3 += 32;
            __m256i q3l[4], q3h[4];
            for (int l = 0; l < 4; l++) {
                q3l[l] = _mm256_and_si256(_mm256_srli_epi16(q3bits, 2 * l), m3);
                q3h[l] = _mm256_slli_epi16(_mm256_srli_epi16(_mm256_andnot_si256(hbits, _mm256_slli_epi16(mone, bit)), bit), 2);
                ++bit;
            }
            for (int l = 0; l < 4; l++) {
                const __m256i q8v = _mm256_loadu_si256((const __m256i *)q8);
                q8 += 32;
                __m256i p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(q3l[l], q8v), _mm256_maddubs_epi16(q3h[l], q8v));
                p16 = _mm256_madd_epi16(_mm256_shuffle_epi8(scales[j], get_scale_shuffle_q3k(l)), p16);
                sumi = _mm256_add_epi32(sumi, p16);
            }
        }
        acc = _mm256_fmadd_ps(_mm256_broadcast_ss(&d), _mm256_cvtepi32_ps(sumi), acc);
    }
    *s = hsum_float_8(acc);
}

LLE_INLINE void k4_utmp(const uint8_t *scales, uint32_t *utmp) {
    const uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
    memcpy(utmp, scales, 12);
    utmp[3] = ((utmp[2] >> 4) & kmask2) | (((utmp[1] >> 6) & kmask3) << 4);
    const uint32_t uaux = utmp[1] & kmask1;
    utmp[1] = (utmp[2] & kmask2) | (((utmp[0] >> 6) & kmask3) << 4);
    utmp[2] = uaux;
    utmp[0] &= kmask1;
}

static void vec_dot_q4_K(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const block_q4_K *x = vx;
    const block_q8_K *y = vy;
    uint32_t utmp[4];
    const __m256i m4 = _mm256_set1_epi8(0xF);
    __m256 acc = _mm256_setzero_ps();
    __m128 acc_m = _mm_setzero_ps();
    for (int i = 0; i < n / QK_K; ++i) {
        const float d = y[i].d * h2f(x[i].d);
        const float dmin = -y[i].d * h2f(x[i].dmin);
        k4_utmp(x[i].scales, utmp);
        const uint8_t *q4 = x[i].qs;
        const int8_t *q8 = y[i].qs;
        const __m256i mins_and_scales = _mm256_cvtepu8_epi16(_mm_set_epi32((int)utmp[3], (int)utmp[2], (int)utmp[1], (int)utmp[0]));
        const __m256i q8sums = _mm256_loadu_si256((const __m256i *)y[i].bsums);
        const __m128i q8s = _mm_hadd_epi16(_mm256_extracti128_si256(q8sums, 0), _mm256_extracti128_si256(q8sums, 1));
        const __m128i prod = _mm_madd_epi16(_mm256_extracti128_si256(mins_and_scales, 1), q8s);
        acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m);
        const __m128i sc128 = _mm256_extracti128_si256(mins_and_scales, 0);
        const __m256i scales = MM256_SET_M128I(sc128, sc128);
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < QK_K / 64; ++j) {
            const __m256i scale_l = _mm256_shuffle_epi8(scales, get_scale_shuffle_k4(2 * j + 0));
            const __m256i scale_h = _mm256_shuffle_epi8(scales, get_scale_shuffle_k4(2 * j + 1));
            const __m256i q4bits = _mm256_loadu_si256((const __m256i *)q4);
            q4 += 32;
            const __m256i q4l = _mm256_and_si256(q4bits, m4);
            const __m256i q4h = _mm256_and_si256(_mm256_srli_epi16(q4bits, 4), m4);
            const __m256i q8l = _mm256_loadu_si256((const __m256i *)q8); q8 += 32;
            __m256i p16l = _mm256_madd_epi16(scale_l, _mm256_maddubs_epi16(q4l, q8l));
            const __m256i q8h = _mm256_loadu_si256((const __m256i *)q8); q8 += 32;
            __m256i p16h = _mm256_madd_epi16(scale_h, _mm256_maddubs_epi16(q4h, q8h));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p16l, p16h));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    acc_m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
    acc_m = _mm_add_ss(acc_m, _mm_movehdup_ps(acc_m));
    *s = hsum_float_8(acc) + _mm_cvtss_f32(acc_m);
}

static void vec_dot_q5_K(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const block_q5_K *x = vx;
    const block_q8_K *y = vy;
    uint32_t utmp[4];
    const __m256i m4 = _mm256_set1_epi8(0xF);
    const __m128i mzero = _mm_setzero_si128();
    const __m256i mone = _mm256_set1_epi8(1);
    __m256 acc = _mm256_setzero_ps();
    float summs = 0.f;
    for (int i = 0; i < n / QK_K; ++i) {
        const uint8_t *q5 = x[i].qs;
        const int8_t *q8 = y[i].qs;
        const float d = y[i].d * h2f(x[i].d);
        const float dmin = -y[i].d * h2f(x[i].dmin);
        k4_utmp(x[i].scales, utmp);
        const __m256i mins_and_scales = _mm256_cvtepu8_epi16(_mm_set_epi32((int)utmp[3], (int)utmp[2], (int)utmp[1], (int)utmp[0]));
        const __m256i q8sums = _mm256_loadu_si256((const __m256i *)y[i].bsums);
        const __m128i q8s = _mm_hadd_epi16(_mm256_extracti128_si256(q8sums, 0), _mm256_extracti128_si256(q8sums, 1));
        const __m128i prod = _mm_madd_epi16(_mm256_extracti128_si256(mins_and_scales, 1), q8s);
        const __m128i hsum = _mm_hadd_epi32(_mm_hadd_epi32(prod, mzero), mzero);
        summs = fmaf(dmin, (float)_mm_extract_epi32(hsum, 0), summs);  /* contracted in ggml's build */
        const __m128i sc128 = _mm256_extracti128_si256(mins_and_scales, 0);
        const __m256i scales = MM256_SET_M128I(sc128, sc128);
        const __m256i hbits = _mm256_loadu_si256((const __m256i *)x[i].qh);
        __m256i hmask = mone;
        __m256i sumi = _mm256_setzero_si256();
        int bit = 0;
        for (int j = 0; j < QK_K / 64; ++j) {
            const __m256i scale_0 = _mm256_shuffle_epi8(scales, get_scale_shuffle_k4(2 * j + 0));
            const __m256i scale_1 = _mm256_shuffle_epi8(scales, get_scale_shuffle_k4(2 * j + 1));
            const __m256i q5bits = _mm256_loadu_si256((const __m256i *)q5);
            q5 += 32;
            const __m256i q5l_0 = _mm256_and_si256(q5bits, m4);
            const __m256i q5h_0 = _mm256_slli_epi16(_mm256_srli_epi16(_mm256_and_si256(hbits, hmask), bit++), 4);
            const __m256i q5_0 = _mm256_add_epi8(q5l_0, q5h_0);
            hmask = _mm256_slli_epi16(hmask, 1);
            const __m256i q5l_1 = _mm256_and_si256(_mm256_srli_epi16(q5bits, 4), m4);
            const __m256i q5h_1 = _mm256_slli_epi16(_mm256_srli_epi16(_mm256_and_si256(hbits, hmask), bit++), 4);
            const __m256i q5_1 = _mm256_add_epi8(q5l_1, q5h_1);
            hmask = _mm256_slli_epi16(hmask, 1);
            const __m256i q8_0 = _mm256_loadu_si256((const __m256i *)q8); q8 += 32;
            const __m256i q8_1 = _mm256_loadu_si256((const __m256i *)q8); q8 += 32;
            const __m256i p16_0 = _mm256_madd_epi16(scale_0, _mm256_maddubs_epi16(q5_0, q8_0));
            const __m256i p16_1 = _mm256_madd_epi16(scale_1, _mm256_maddubs_epi16(q5_1, q8_1));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p16_0, p16_1));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    *s = hsum_float_8(acc) + summs;
}

static void vec_dot_q6_K(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const block_q6_K *x = vx;
    const block_q8_K *y = vy;
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m256i m15 = _mm256_set1_epi8(15);
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < n / QK_K; ++i) {
        const float d = y[i].d * h2f(x[i].d);
        const uint8_t *q4 = x[i].ql, *qh = x[i].qh;
        const int8_t *q8 = y[i].qs;
        const __m256i q8sums = _mm256_loadu_si256((const __m256i *)y[i].bsums);
        const __m128i scales = _mm_loadu_si128((const __m128i *)x[i].scales);
        const __m256i scales_16 = _mm256_cvtepi8_epi16(scales);
        const __m256i q8sclsub = _mm256_slli_epi32(_mm256_madd_epi16(q8sums, scales_16), 5);
        __m256i sumi = _mm256_setzero_si256();
        int is = 0;
        for (int j = 0; j < QK_K / 128; ++j) {
            const __m256i q4bits1 = _mm256_loadu_si256((const __m256i *)q4); q4 += 32;
            const __m256i q4bits2 = _mm256_loadu_si256((const __m256i *)q4); q4 += 32;
            const __m256i q4bitsH = _mm256_loadu_si256((const __m256i *)qh); qh += 32;
            const __m256i q4h_0 = _mm256_slli_epi16(_mm256_and_si256(q4bitsH, m3), 4);
            const __m256i q4h_1 = _mm256_slli_epi16(_mm256_and_si256(q4bitsH, _mm256_set1_epi8(12)), 2);
            const __m256i q4h_2 = _mm256_and_si256(q4bitsH, _mm256_set1_epi8(48));
            const __m256i q4h_3 = _mm256_srli_epi16(_mm256_and_si256(q4bitsH, _mm256_set1_epi8(-64)), 2);
            const __m256i q4_0 = _mm256_or_si256(_mm256_and_si256(q4bits1, m15), q4h_0);
            const __m256i q4_1 = _mm256_or_si256(_mm256_and_si256(q4bits2, m15), q4h_1);
            const __m256i q4_2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4bits1, 4), m15), q4h_2);
            const __m256i q4_3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4bits2, 4), m15), q4h_3);
            const __m256i q8_0 = _mm256_loadu_si256((const __m256i *)q8); q8 += 32;
            const __m256i q8_1 = _mm256_loadu_si256((const __m256i *)q8); q8 += 32;
            const __m256i q8_2 = _mm256_loadu_si256((const __m256i *)q8); q8 += 32;
            const __m256i q8_3 = _mm256_loadu_si256((const __m256i *)q8); q8 += 32;
            __m256i p16_0 = _mm256_maddubs_epi16(q4_0, q8_0);
            __m256i p16_1 = _mm256_maddubs_epi16(q4_1, q8_1);
            __m256i p16_2 = _mm256_maddubs_epi16(q4_2, q8_2);
            __m256i p16_3 = _mm256_maddubs_epi16(q4_3, q8_3);
            const __m128i scale_0 = _mm_shuffle_epi8(scales, get_scale_shuffle(is + 0));
            const __m128i scale_1 = _mm_shuffle_epi8(scales, get_scale_shuffle(is + 1));
            const __m128i scale_2 = _mm_shuffle_epi8(scales, get_scale_shuffle(is + 2));
            const __m128i scale_3 = _mm_shuffle_epi8(scales, get_scale_shuffle(is + 3));
            is += 4;
            p16_0 = _mm256_madd_epi16(_mm256_cvtepi8_epi16(scale_0), p16_0);
            p16_1 = _mm256_madd_epi16(_mm256_cvtepi8_epi16(scale_1), p16_1);
            p16_2 = _mm256_madd_epi16(_mm256_cvtepi8_epi16(scale_2), p16_2);
            p16_3 = _mm256_madd_epi16(_mm256_cvtepi8_epi16(scale_3), p16_3);
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p16_0, p16_1));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p16_2, p16_3));
        }
        sumi = _mm256_sub_epi32(sumi, q8sclsub);
        acc = _mm256_fmadd_ps(_mm256_broadcast_ss(&d), _mm256_cvtepi32_ps(sumi), acc);
    }
    *s = hsum_float_8(acc);
}

static void vec_dot_iq4_xs(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const block_iq4_xs *x = vx;
    const block_q8_K *y = vy;
    const __m128i values128 = _mm_loadu_si128((const __m128i *)lle_kvalues_iq4nl);
    const __m128i m4b = _mm_set1_epi8(0x0f);
    __m256 accum = _mm256_setzero_ps();
    for (int ibl = 0; ibl < n / QK_K; ++ibl) {
        const uint8_t *qs = x[ibl].qs;
        const int8_t *q8 = y[ibl].qs;
        uint16_t sh = x[ibl].scales_h;
        __m256i sumi1 = _mm256_setzero_si256(), sumi2 = _mm256_setzero_si256();
        for (int ib = 0; ib < QK_K / 32; ib += 2) {
            const __m128i q4bits_1 = _mm_loadu_si128((const __m128i *)qs); qs += 16;
            const __m128i q4bits_2 = _mm_loadu_si128((const __m128i *)qs); qs += 16;
            const __m256i q8b_1 = _mm256_loadu_si256((const __m256i *)q8); q8 += 32;
            const __m256i q8b_2 = _mm256_loadu_si256((const __m256i *)q8); q8 += 32;
            const __m256i q4b_1 = MM256_SET_M128I(_mm_shuffle_epi8(values128, _mm_and_si128(_mm_srli_epi16(q4bits_1, 4), m4b)),
                                                  _mm_shuffle_epi8(values128, _mm_and_si128(q4bits_1, m4b)));
            const __m256i q4b_2 = MM256_SET_M128I(_mm_shuffle_epi8(values128, _mm_and_si128(_mm_srli_epi16(q4bits_2, 4), m4b)),
                                                  _mm_shuffle_epi8(values128, _mm_and_si128(q4bits_2, m4b)));
            const __m256i p16_1 = mul_add_epi8(q4b_1, q8b_1);
            const __m256i p16_2 = mul_add_epi8(q4b_2, q8b_2);
            const int16_t ls1 = (int16_t)(((x[ibl].scales_l[ib / 2] & 0xf) | ((sh << 4) & 0x30)) - 32);
            const int16_t ls2 = (int16_t)(((x[ibl].scales_l[ib / 2] >> 4) | ((sh << 2) & 0x30)) - 32);
            sh >>= 4;
            sumi1 = _mm256_add_epi32(_mm256_madd_epi16(p16_1, _mm256_set1_epi16(ls1)), sumi1);
            sumi2 = _mm256_add_epi32(_mm256_madd_epi16(p16_2, _mm256_set1_epi16(ls2)), sumi2);
        }
        accum = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[ibl].d) * y[ibl].d),
                                _mm256_cvtepi32_ps(_mm256_add_epi32(sumi1, sumi2)), accum);
    }
    *s = hsum_float_8(accum);
}

#include "gemv_avx2.inc"
#include "gemv_rows_avx2.inc"
#include "tiles_avx2.inc"
#include "korder_avx2.inc"
#include "packed_avx2.inc"

void lle_register_avx2(void) {
    lle_kernels *t = lle_kernels_avx2;
    t[T_F32] = (lle_kernels){.vec_dot = vec_dot_f32, .gemv_rows = gemv_rows_f32, .vec_dot_batch = vec_dot_f32_tb};
    t[T_F16] = (lle_kernels){.from_float = quantize_f16, .vec_dot = vec_dot_f16, .gemv_rows = gemv_rows_f16, .vec_dot_batch = vec_dot_f16_tb};
    t[T_BF16] = (lle_kernels){.vec_dot = vec_dot_bf16, .gemv_rows = gemv_rows_bf16, .vec_dot_batch = vec_dot_bf16_tb};
    t[T_Q4_0] = (lle_kernels){.vec_dot = vec_dot_q4_0, .gemv = gemv_q4_0, .gemv_rows = gemv_rows_q4_0, .tile = tile_q4_0};
    t[T_Q4_1] = (lle_kernels){.vec_dot = vec_dot_q4_1, .gemv = gemv_q4_1, .gemv_rows = gemv_rows_q4_1, .tile = tile_q4_1,
                              .packed = packed_q4_1, .packed_layout = LLE_PK_SPLIT8};
    t[T_Q5_0] = (lle_kernels){.vec_dot = vec_dot_q5_0, .gemv = gemv_q5_0, .tile = tile_q5_0};
    t[T_Q5_1] = (lle_kernels){.vec_dot = vec_dot_q5_1, .gemv = gemv_q5_1, .tile = tile_q5_1};
    t[T_Q8_0] = (lle_kernels){.from_float = quantize_q8_0, .vec_dot = vec_dot_q8_0, .gemv = gemv_q8_0,
                              .gemv_rows = gemv_rows_q8_0, .tile = tile_q8_0, .packed = packed_q8_0,
                              .packed_layout = LLE_PK_SPLIT8, .packed_prep = prep_q8_0_avx2, .packed_prep_bytes = 4};
    t[T_Q8_1] = (lle_kernels){.from_float = quantize_q8_1};
    t[T_Q8_K] = (lle_kernels){.from_float = quantize_q8_K, .from_float_r8 = quantize_q8_K_r8};
    t[T_Q2_K] = (lle_kernels){.vec_dot = vec_dot_q2_K, .vec_dot_tiled = vec_dot_q2_K_tiled};
    t[T_Q3_K] = (lle_kernels){.vec_dot = vec_dot_q3_K, .vec_dot_tiled = vec_dot_q3_K_tiled};
    t[T_Q4_K] = (lle_kernels){.vec_dot = vec_dot_q4_K, .tile = tile_q4_K, .vec_dot_r8 = vec_dot_q4_K_r8,
                              .vec_dot_r8_gemm = vec_dot_q4_K_r8_gemm, .tile_r8_gemm = tile_q4_K_r8g,
                              .vec_dot_tiled = vec_dot_q4_K_tiled, .tile_tiled = tile_q4_K_tiled};
    t[T_Q5_K] = (lle_kernels){.vec_dot = vec_dot_q5_K, .vec_dot_tiled = vec_dot_q5_K_tiled};
    t[T_Q6_K] = (lle_kernels){.vec_dot = vec_dot_q6_K, .tile = tile_q6_K, .vec_dot_tiled = vec_dot_q6_K_tiled,
                              .tile_tiled = tile_q6_K_tiled};
    t[T_IQ4_NL] = (lle_kernels){.vec_dot = vec_dot_iq4_nl, .vec_dot_batch = vec_dot_iq4_nl_tb};
    t[T_IQ4_XS] = (lle_kernels){.vec_dot = vec_dot_iq4_xs, .vec_dot_tiled = vec_dot_iq4_xs_tiled};
}

#if defined(__clang__)
#pragma clang attribute pop
#endif

#else /* not x86 */

lle_kernels lle_kernels_avx2[T_COUNT];
void lle_register_avx2(void) {}

#endif
