/* AVX-512 tier (F, BW, VL, DQ, VNNI) of the dispatch table: quantized products for the types of
 * the reference models (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0; Q4_K, Q6_K), the F32/F16/BF16 products (decode,
 * prefill tile, BF16 rows kernel) and IQ4_NL's decode, selected at run time only when CPUID reports
 * avx512f/bw/vl/vnni (api.c); the tier's float ops (attention) are ops_avx512.c. Every other field
 * and type falls back to the AVX2 tier.
 *
 * Summation order: the tier reproduces ggml's AVX-512 build (llama.cpp and Ollama on an AVX-512
 * CPU; tests/fixtures/native_ggml_ops_avx512.json). Where that build runs the same code as its AVX2
 * build (the quantized products), every kernel here reproduces the AVX2 kernel of the same slot bit
 * for bit (see quants_avx2.c and korder_avx2.inc). The integer parts of a block are exact whatever
 * instructions compute them (vpdpbusd/vpdpwssd here, maddubs/madd in AVX2); the float operations
 * happen per output in the same order and rounding: where two outputs share a 512-bit register (two
 * activation rows of a prefill tile, in the two 256-bit halves), each half performs exactly the AVX2
 * kernel's 8-lane operations. Where the AVX-512 build differs (the float products, IQ4_NL's odd last
 * block) the kernels follow it instead (the float products section).
 *
 * Q4_K, Q6_K, Q4_1 and Q8_0 weights with a multiple of 16 rows also get a packed copy at load
 * (native/packed.c): packed_q4_K serves decode and both repacked prefill orders, packed_q6_K the tiled
 * order (8+ rows), packed_q4_1 and packed_q8_0 every product of their type (one row, row-exact
 * batches, prefill), from 16 interleaved rows.
 *
 * The same source is compiled a second time against SIMDe (LLE_AVX512_SIMDE, see
 * native/selftest_simde.c), into the self-test only, so that a CPU without AVX-512 checks this code
 * bit for bit against the AVX2 kernels, and the float products against selftest.c's scalar copy of
 * ggml's AVX-512 orders (tests/test_native_kernels.py).
 */
#include "common.h"

#if defined(LLE_X86)

#include "avx512_compat.h"
#include "ggml_avx512_orders.h"
#if defined(LLE_AVX512_SIMDE)
#define LLE_AVX512_TABLE lle_kernels_avx512_simde
#define LLE_AVX512_REGISTER lle_register_avx512_simde
#else
#define LLE_AVX512_TABLE lle_kernels_avx512
#define LLE_AVX512_REGISTER lle_register_avx512
#endif

lle_kernels LLE_AVX512_TABLE[T_COUNT];

/* decode kernels stream the weights: prefetch this many bytes ahead of the block being read */
#ifndef LLE_PREFETCH
#define LLE_PREFETCH 2048












#endif

/* ---------------------------------------------------------------- helpers (as in quants_avx2.c) */

LLE_INLINE float h2f(lle_half h) { return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h))); }

LLE_INLINE __m128 h2f_pair(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm_cvtph_ps(_mm_cvtsi32_si128(v));
}

LLE_INLINE float hsum_float_8(const __m256 x) {
    __m128 res = _mm256_extractf128_ps(x, 1);
    res = _mm_add_ps(res, _mm256_castps256_ps128(x));
    res = _mm_add_ps(res, _mm_movehl_ps(res, res));
    res = _mm_add_ss(res, _mm_movehdup_ps(res));
    return _mm_cvtss_f32(res);
}

LLE_INLINE __m256 hi256_ps(__m512 v) { return _mm256_castsi256_ps(_mm512_extracti64x4_epi64(_mm512_castps_si512(v), 1)); }

/* 32 nibbles -> 32 bytes in [0, 15]: low nibbles in the low lane, high nibbles in the high lane */
LLE_INLINE __m256i bytes_from_nibbles_32(const uint8_t *rsi) {
    const __m128i tmp = _mm_loadu_si128((const __m128i *)rsi);
    const __m256i bytes = _mm256_inserti128_si256(_mm256_castsi128_si256(tmp), _mm_srli_epi16(tmp, 4), 1);
    return _mm256_and_si256(_mm256_set1_epi8(0xF), bytes);
}

/* the same 32 bytes twice, [w | w]: the 16 packed bytes in all four 128-bit lanes, odd lanes shifted */
LLE_INLINE __m512i nibbles_x2(const uint8_t *rsi) {
    const __m512i b = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)rsi));
    const __m512i shift = _mm512_set_epi64(4 * 0x0001000100010001ll, 4 * 0x0001000100010001ll, 0, 0,
                                           4 * 0x0001000100010001ll, 4 * 0x0001000100010001ll, 0, 0);
    return _mm512_and_si512(_mm512_srlv_epi16(b, shift), _mm512_set1_epi8(0xF));
}

/* the 32 high bits of a Q5 block as a mask over both 256-bit halves */
LLE_INLINE lle_mask64 bits_x2(const uint8_t *qh) {
    uint32_t b;
    memcpy(&b, qh, 4);
    return (lle_mask64)b | ((lle_mask64)b << 32);
}

/* 8 lane sums of 4 products each, unsigned ax times signed sy (= madd(1, maddubs(ax, sy)) exactly) */
LLE_INLINE __m256 dot_us8_float(__m256i ax, __m256i sy) {
    return _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), ax, sy));
}

LLE_INLINE __m256 dot_i8_float(__m256i x, __m256i y) {
    return dot_us8_float(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

/* ---------------------------------------------------------------- one row: dot products, decode */
/* the AVX2 vec_dot / gemv kernels with vpdpbusd in place of maddubs + madd (same integers) */

#define W_Q4_0(x) _mm256_sub_epi8(bytes_from_nibbles_32((x).qs), _mm256_set1_epi8(8))
#define W_Q5_0(x) _mm256_or_si256(bytes_from_nibbles_32((x).qs), _mm256_maskz_mov_epi8(~q5_bits32((x).qh), _mm256_set1_epi8((char)0xF0)))
#define W_Q8_0(x) _mm256_loadu_si256((const __m256i *)(x).qs)
#define W_Q4_1(x) bytes_from_nibbles_32((x).qs)
#define W_Q5_1(x) _mm256_or_si256(bytes_from_nibbles_32((x).qs), _mm256_maskz_mov_epi8(q5_bits32((x).qh), _mm256_set1_epi8(0x10)))

LLE_INLINE lle_mask32 q5_bits32(const uint8_t *qh) {
    uint32_t b;
    memcpy(&b, qh, 4);
    return (lle_mask32)b;
}

/* signed weights against Q8_0: acc = fma(dx * dy, dot, acc) */
#define ROW_Q80(NAME, WBLOCK, UNPACK)                                                                   \
    static void vec_dot_##NAME(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) { \
        const WBLOCK *x = vx;                                                                            \
        const block_q8_0 *y = vy;                                                                        \
        __m256 acc = _mm256_setzero_ps();                                                                \
        for (int ib = 0; ib < n / QK; ++ib) {                                                            \
            const __m256 d = _mm256_set1_ps(h2f(x[ib].d) * h2f(y[ib].d));                                \
            acc = _mm256_fmadd_ps(d, dot_i8_float(UNPACK(x[ib]), _mm256_loadu_si256((const __m256i *)y[ib].qs)), acc); \
        }                                                                                                \
        *s = hsum_float_8(acc);                                                                          \
    }                                                                                                    \
    static void gemv_##NAME(int k, const void *w, size_t ws, int nr, const void *a, const float *as, float *out) { \
        const block_q8_0 *y = a;                                                                         \
        for (int j = 0; j < nr; j++) {                                                                   \
            const WBLOCK *x = (const WBLOCK *)((const uint8_t *)w + (size_t)j * ws);                     \
            __m256 acc = _mm256_setzero_ps();                                                            \
            for (int ib = 0; ib < k / QK; ++ib) {                                                        \
                lle_prefetch_weight((const char *)(x + ib) + LLE_PREFETCH);                    \
                const __m256 d = _mm256_set1_ps(h2f(x[ib].d) * as[ib]);                                  \
                acc = _mm256_fmadd_ps(d, dot_i8_float(UNPACK(x[ib]), _mm256_loadu_si256((const __m256i *)y[ib].qs)), acc); \
            }                                                                                            \
            out[j] = hsum_float_8(acc);                                                                  \
        }                                                                                                \
    }

ROW_Q80(q4_0, block_q4_0, W_Q4_0)
ROW_Q80(q5_0, block_q5_0, W_Q5_0)
ROW_Q80(q8_0, block_q8_0, W_Q8_0)

static void vec_dot_q4_1(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const block_q4_1 *x = vx;
    const block_q8_1 *y = vy;
    __m256 acc = _mm256_setzero_ps();
    float summs = 0;
    for (int ib = 0; ib < n / QK; ++ib) {
        summs = fmaf(h2f(x[ib].m), h2f(y[ib].s), summs);
        const __m256 d0d1 = _mm256_set1_ps(h2f(x[ib].d) * h2f(y[ib].d));
        acc = _mm256_fmadd_ps(d0d1, dot_us8_float(W_Q4_1(x[ib]), _mm256_loadu_si256((const __m256i *)y[ib].qs)), acc);
    }
    *s = hsum_float_8(acc) + summs;
}

static void gemv_q4_1(int k, const void *w, size_t ws, int nr, const void *a, const float *as, float *out) {
    const int nb = k / QK;
    const block_q8_1 *y = a;
    const float *yd = as, *ys = as + nb;
    for (int j = 0; j < nr; j++) {
        const block_q4_1 *x = (const block_q4_1 *)((const uint8_t *)w + (size_t)j * ws);
        __m256 acc = _mm256_setzero_ps();
        float summs = 0;
        for (int ib = 0; ib < nb; ++ib) {
            lle_prefetch_weight((const char *)(x + ib) + LLE_PREFETCH);
            const __m128 dm = h2f_pair(&x[ib].d);
            summs = fmaf(_mm_cvtss_f32(_mm_movehdup_ps(dm)), ys[ib], summs);
            const __m256 d0d1 = _mm256_set1_ps(_mm_cvtss_f32(dm) * yd[ib]);
            acc = _mm256_fmadd_ps(d0d1, dot_us8_float(W_Q4_1(x[ib]), _mm256_loadu_si256((const __m256i *)y[ib].qs)), acc);
        }
        out[j] = hsum_float_8(acc) + summs;
    }
}

static void vec_dot_q5_1(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const block_q5_1 *x = vx;
    const block_q8_1 *y = vy;
    __m256 acc = _mm256_setzero_ps();
    float summs = 0.0f;
    for (int ib = 0; ib < n / QK; ++ib) {
        const __m256 dx = _mm256_set1_ps(h2f(x[ib].d));
        summs += h2f(x[ib].m) * h2f(y[ib].s);
        const __m256 dy = _mm256_set1_ps(h2f(y[ib].d));
        acc = _mm256_fmadd_ps(dot_us8_float(W_Q5_1(x[ib]), _mm256_loadu_si256((const __m256i *)y[ib].qs)),
                              _mm256_mul_ps(dx, dy), acc);
    }
    *s = hsum_float_8(acc) + summs;
}

static void gemv_q5_1(int k, const void *w, size_t ws, int nr, const void *a, const float *as, float *out) {
    const int nb = k / QK;
    const block_q8_1 *y = a;
    const float *yd = as, *ys = as + nb;
    for (int j = 0; j < nr; j++) {
        const block_q5_1 *x = (const block_q5_1 *)((const uint8_t *)w + (size_t)j * ws);
        __m256 acc = _mm256_setzero_ps();
        float summs = 0;
        for (int ib = 0; ib < nb; ++ib) {
            const __m128 dm = h2f_pair(&x[ib].d);
            summs += _mm_cvtss_f32(_mm_movehdup_ps(dm)) * ys[ib];
            const __m256 dxdy = _mm256_set1_ps(_mm_cvtss_f32(dm) * yd[ib]);
            acc = _mm256_fmadd_ps(dot_us8_float(W_Q5_1(x[ib]), _mm256_loadu_si256((const __m256i *)y[ib].qs)), dxdy, acc);
        }
        out[j] = hsum_float_8(acc) + summs;
    }
}

/* ---------------------------------------------------------------- prefill tiles, 32-value blocks */
/* A tile multiplies weight rows with a group of up to four activation rows. The activations are
 * first laid out per block for 512-bit use (act_blk, a chunk of blocks at a time): rows 2p and
 * 2p+1 side by side in one register, their float block scales spread over the matching halves, and
 * for signed weights the correction below. A signed weight w enters vpdpbusd as the unsigned byte
 * w ^ 0x80 = w + 128, which adds 128 * (sum of the 4 activation bytes) to each int32 lane; the lane
 * starts from minus that amount, so the lane total is the exact sum of w * y, as in AVX2. */

typedef struct {
    __m512i y[4];   /* rows (0,1), (2,3), (4,5), (6,7): 32 quants each */
    __m512i nc[4];  /* -128 * sum of each 4 quants (signed-weight types) */
    __m512 sc[4];   /* dy of the rows, 8 lanes each */
} act_blk;

#define TILE_CHUNK 16  /* activation blocks laid out at a time (12 KB, with the weights in L1) */
#define TILE_ROWS 64   /* weight rows whose accumulators persist across chunks */

/* the layout of NP row pairs; `sc` holds the scales of consecutive 4-row groups (d[nb][4], s[nb][4]) */
static void act_layout(act_blk *buf, const int NP, const uint8_t *a, size_t as, const float *sc, int nb, int nr,
                       int b0, int bn, int correct, size_t act_block_bytes, size_t qs_offset) {
    const __m512i m128 = _mm512_set1_epi8((char)0x80);
    for (int i = 0; i < bn; i++) {
        const int ib = b0 + i;
        for (int p = 0; p < NP; p++) {
            __m256i q[2];
            for (int h = 0; h < 2; h++) {
                const int r = 2 * p + h;
                q[h] = r < nr ? _mm256_loadu_si256((const __m256i *)(a + (size_t)r * as + (size_t)ib * act_block_bytes + qs_offset))
                              : _mm256_setzero_si256();
            }
            const __m512i y = _mm512_inserti64x4(_mm512_castsi256_si512(q[0]), q[1], 1);
            buf[i].y[p] = y;
            buf[i].nc[p] = correct ? _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), m128, y))
                                   : _mm512_setzero_si512();
            const __m128 s4 = _mm_loadu_ps(sc + (size_t)(p / 2) * 8 * nb + 4 * ib);
            const int l = 2 * (p % 2);
            const __m512i idx = _mm512_set_epi32(l + 1, l + 1, l + 1, l + 1, l + 1, l + 1, l + 1, l + 1, l, l, l, l, l, l, l, l);
            buf[i].sc[p] = _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(s4));
        }
    }
}

/* weight kinds of the tile */
enum { WK_Q4_0, WK_Q5_0, WK_Q8_0, WK_Q4_1, WK_Q5_1 };

/* [w | w] as vpdpbusd's unsigned operand: w + 128 for the signed kinds, w itself for Q4_1/Q5_1 */
LLE_INLINE __m512i unpack_x2(const int kind, const uint8_t *blk) {
    switch (kind) {
    case WK_Q4_0:  /* (nib - 8) + 128 */
        return _mm512_add_epi8(nibbles_x2(blk + 2), _mm512_set1_epi8(120));
    case WK_Q5_0:  /* (nib | (bit ? 0 : 0xF0)) + 128 = nib | (bit ? 0x80 : 0x70) */
        return _mm512_or_si512(nibbles_x2(blk + 6), _mm512_mask_blend_epi8(bits_x2(blk + 2), _mm512_set1_epi8(0x70),
                                                                           _mm512_set1_epi8((char)0x80)));
    case WK_Q8_0:
        return _mm512_xor_si512(_mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 2))),
                                _mm512_set1_epi8((char)0x80));
    case WK_Q4_1:
        return nibbles_x2(blk + 4);
    default:       /* Q5_1: nib | (bit ? 0x10 : 0) */
        return _mm512_or_si512(nibbles_x2(blk + 8), _mm512_maskz_mov_epi8(bits_x2(blk + 4), _mm512_set1_epi8(0x10)));
    }
}

/* up to 2 * NP activation rows (a tile of 8 rows is two 4-row groups: tile_rows = 8 below) */
LLE_INLINE void tile32(const int kind, const int NP, int k, const uint8_t *w, size_t ws, int nc, const uint8_t *a,
                       size_t as, const float *sc, int nr, float *out, size_t ldo) {
    const int nb = k / QK;
    const int has_min = kind == WK_Q4_1 || kind == WK_Q5_1;
    const size_t wbytes = kind == WK_Q4_0 ? sizeof(block_q4_0) : kind == WK_Q5_0 ? sizeof(block_q5_0)
                        : kind == WK_Q8_0 ? sizeof(block_q8_0) : kind == WK_Q4_1 ? sizeof(block_q4_1) : sizeof(block_q5_1);
    const size_t abytes = has_min ? sizeof(block_q8_1) : sizeof(block_q8_0);
    const size_t qoff = has_min ? offsetof(block_q8_1, qs) : offsetof(block_q8_0, qs);
    act_blk buf[TILE_CHUNK];
    __m512 accs[TILE_ROWS][4];
    __m128 summs[TILE_ROWS][2];
    for (int j0 = 0; j0 < nc; j0 += TILE_ROWS) {
        const int jn = nc - j0 < TILE_ROWS ? nc - j0 : TILE_ROWS;
        for (int b0 = 0; b0 < nb; b0 += TILE_CHUNK) {
            const int bn = nb - b0 < TILE_CHUNK ? nb - b0 : TILE_CHUNK;
            act_layout(buf, NP, a, as, sc, nb, nr, b0, bn, !has_min, abytes, qoff);
            for (int j = 0; j < jn; j++) {
                const uint8_t *x = w + (size_t)(j0 + j) * ws + (size_t)b0 * wbytes;
                __m512 acc[4];
                __m128 sm[2];
#pragma GCC unroll 4
                for (int p = 0; p < NP; p++) acc[p] = b0 ? accs[j][p] : _mm512_setzero_ps();
                for (int g = 0; g < NP / 2; g++) sm[g] = b0 ? summs[j][g] : _mm_setzero_ps();
                for (int i = 0; i < bn; i++, x += wbytes) {
                    const __m512i wu = unpack_x2(kind, x);
                    __m512 dx;
                    if (has_min) {
                        const __m128 dm = h2f_pair(x);
                        const __m128 m = _mm_permute_ps(dm, 0x55);
                        for (int g = 0; g < NP / 2; g++) {
                            const __m128 s4 = _mm_loadu_ps(sc + (size_t)g * 8 * nb + 4 * (nb + b0 + i));
                            sm[g] = kind == WK_Q4_1 ? _mm_fmadd_ps(m, s4, sm[g]) : _mm_add_ps(sm[g], _mm_mul_ps(m, s4));
                        }
                        dx = _mm512_broadcastss_ps(dm);
                    } else {
                        dx = _mm512_set1_ps(h2f(*(const lle_half *)x));
                    }
#pragma GCC unroll 4
                    for (int p = 0; p < NP; p++) {
                        const __m512 pf = lle512_cvtepi32_ps(_mm512_dpbusd_epi32(buf[i].nc[p], wu, buf[i].y[p]));
                        acc[p] = _mm512_fmadd_ps(_mm512_mul_ps(dx, buf[i].sc[p]), pf, acc[p]);
                    }
                }
#pragma GCC unroll 4
                for (int p = 0; p < NP; p++) accs[j][p] = acc[p];
                for (int g = 0; g < NP / 2; g++) summs[j][g] = sm[g];
            }
        }
        for (int j = 0; j < jn; j++) {
            float sm[8];
            for (int g = 0; g < NP / 2; g++) _mm_storeu_ps(sm + 4 * g, summs[j][g]);
            for (int r = 0; r < nr; r++) {
                const __m512 v = accs[j][r / 2];
                const float t = hsum_float_8(r % 2 ? hi256_ps(v) : _mm512_castps512_ps256(v));
                out[(size_t)r * ldo + j0 + j] = has_min ? t + sm[r] : t;
            }
        }
    }
}

#define TILE32(NAME, KIND)                                                                               \
    static void tile_##NAME(int k, const void *w, size_t ws, int nc, const void *a, size_t as, const float *sc, \
                            int nr, float *out, size_t ldo) {                                            \
        if (nr > 4) tile32(KIND, 4, k, w, ws, nc, a, as, sc, nr, out, ldo);                             \
        else tile32(KIND, 2, k, w, ws, nc, a, as, sc, nr, out, ldo);                                     \
    }
TILE32(q4_0, WK_Q4_0)
TILE32(q5_0, WK_Q5_0)
TILE32(q8_0, WK_Q8_0)
TILE32(q4_1, WK_Q4_1)
TILE32(q5_1, WK_Q5_1)

/* ---------------------------------------------------------------- Q4_K, repacked order (decode) */
/* The GEMV order of llama.cpp's repacked Q4_K (korder_avx2.inc: vec_dot_q4_K_r8): per block the
 * exact integers s1 (scales * quants . activations) and s2 (mins * bsums), then two fused
 * multiply-adds. Here s1 comes from 512-bit maddubs + vpdpwssd, 64 values per step. */

LLE_INLINE void k4_utmp(const uint8_t *scales, uint32_t *utmp) {
    const uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
    memcpy(utmp, scales, 12);
    utmp[3] = ((utmp[2] >> 4) & kmask2) | (((utmp[1] >> 6) & kmask3) << 4);
    const uint32_t uaux = utmp[1] & kmask1;
    utmp[1] = (utmp[2] & kmask2) | (((utmp[0] >> 6) & kmask3) << 4);
    utmp[2] = uaux;
    utmp[0] &= kmask1;
}

LLE_INLINE int32_t hsum_i32_16(__m512i v) {
    const __m256i a = _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
    __m128i b = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    b = _mm_add_epi32(b, _mm_unpackhi_epi64(b, b));
    b = _mm_add_epi32(b, _mm_shuffle_epi32(b, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(b);
}

static const uint16_t k_q4k_scale_idx[4][32] = {
    {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
    {2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3},
    {4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5},
    {6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7},
};

LLE_INLINE void ints_q4_K(const block_q4_K *x, const block_q8_K *y, int32_t *s1, int32_t *s2) {
    uint32_t utmp[4];
    k4_utmp(x->scales, utmp);
    const __m128i mins_scales = _mm_set_epi32((int)utmp[3], (int)utmp[2], (int)utmp[1], (int)utmp[0]);
    const __m128i q8s = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)y->bsums), _mm_loadu_si128((const __m128i *)(y->bsums + 8)));
    const __m128i prod = _mm_madd_epi16(_mm_cvtepu8_epi16(_mm_srli_si128(mins_scales, 8)), q8s);
    __m128i t = _mm_add_epi32(prod, _mm_unpackhi_epi64(prod, prod));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, _MM_SHUFFLE(2, 3, 0, 1)));
    *s2 = _mm_cvtsi128_si32(t);
    const __m512i sc16 = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(mins_scales));
    const __m512i shift = _mm512_set_epi64(4 * 0x0001000100010001ll, 4 * 0x0001000100010001ll, 4 * 0x0001000100010001ll,
                                           4 * 0x0001000100010001ll, 0, 0, 0, 0);
    const __m512i m4 = _mm512_set1_epi8(0xF);
    __m512i acc = _mm512_setzero_si512();
    for (int j = 0; j < QK_K / 64; ++j) {
        const __m512i q4 = _mm512_and_si512(_mm512_srlv_epi16(_mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(x->qs + 32 * j))), shift), m4);
        const __m512i p = _mm512_maddubs_epi16(q4, _mm512_loadu_si512((const void *)(y->qs + 64 * j)));
        acc = _mm512_dpwssd_epi32(acc, p, _mm512_permutexvar_epi16(_mm512_loadu_si512((const void *)k_q4k_scale_idx[j]), sc16));
    }
    *s1 = hsum_i32_16(acc);
}

static void vec_dot_q4_K_r8(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const block_q4_K *x = vx;
    const block_q8_K *y = vy;
    float acc = 0, accm = 0;
    for (int i = 0; i < n / QK_K; ++i) {
        lle_prefetch_weight((const char *)(x + i) + LLE_PREFETCH);
        lle_prefetch_weight((const char *)(x + i) + LLE_PREFETCH + 64);
        int32_t s1, s2;
        ints_q4_K(x + i, y + i, &s1, &s2);
        acc = fmaf((float)s1, h2f(x[i].d) * y[i].d, acc);
        accm = fmaf((float)s2, h2f(x[i].dmin) * y[i].d, accm);
    }
    *s = acc - accm;
}

/* ---------------------------------------------------------------- Q4_K, packed 16 rows (native/packed.c) */
/* Both orders of llama.cpp's repacked Q4_K (korder_avx2.inc: vec_dot_q4_K_r8 for gemm = 0 and
 * vec_dot_q4_K_r8_gemm / tile_q4_K_r8g for gemm = 1) over a group of 16 weight rows, lane l = row l:
 * the sub-block dot products come from vpdpbusd of 4 weight bytes of every row against 4
 * activation bytes broadcast, so no horizontal sum is needed. The integers (per quarter: s1 =
 * sc[2j] * D[2j] + sc[2j+1] * D[2j+1], s2 = mins . bsum pairs; per block their totals) are those of
 * the unpacked kernels, and every lane performs that kernel's float operations in its order. */

LLE_INLINE int32_t load_i32(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

#define LLE_PF_Q4K 4096
LLE_INLINE void packed_q4_K_nr(const int NR, int k, const uint8_t *pw, int ng, const uint8_t *a, size_t as,
                               int gemm, float *out, size_t ldo) {
    const int nb = k / QK_K;
    const __m512i m4 = _mm512_set1_epi8(0xF);
    for (int g = 0; g < ng; g++) {
        const uint8_t *gw = pw + (size_t)g * nb * LLE_PK_Q4K_BLOCK;
        __m512 acc[4], accm[4];
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) acc[r] = accm[r] = _mm512_setzero_ps();
        for (int b = 0; b < nb; b++) {
            const uint8_t *blk = gw + (size_t)b * LLE_PK_Q4K_BLOCK;
            /* the lines LLE_PF_Q4K bytes ahead (into the next group at the end of this one): without, the
             * stream had only the hardware's prefetchers. One thread from memory: 640x2048 22.1 -> 20.6 us
             * for one row, 37 -> 25 us for four; 640x1024 11.7 -> 11.1, 14.7 -> 11.8 */
#pragma GCC unroll 37
            for (int i = 0; i < LLE_PK_Q4K_BLOCK; i += 64) lle_prefetch_weight((const char *)blk + LLE_PF_Q4K + i);
            const __m512 dw = lle512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + LLE_PK_Q4K_D)));
            const __m512 mw = lle512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + LLE_PK_Q4K_DMIN)));
            const block_q8_K *y[4];
            __m512 dd[4], dm[4];
            __m512i t1[4], t2[4];
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                y[r] = (const block_q8_K *)(a + (size_t)r * as) + b;
                const __m512 dy = _mm512_set1_ps(y[r]->d);
                dd[r] = _mm512_mul_ps(dw, dy);
                dm[r] = _mm512_mul_ps(mw, dy);
                t1[r] = t2[r] = _mm512_setzero_si512();
            }
            for (int j = 0; j < 4; j++) {
                __m512i d0[4], d1[4];
#pragma GCC unroll 4
                for (int r = 0; r < NR; r++) d0[r] = d1[r] = _mm512_setzero_si512();
                const uint8_t *q = blk + LLE_PK_Q4K_QS + 512 * j;
#pragma GCC unroll 8
                for (int i = 0; i < 8; i++) {
                    const __m512i p = _mm512_loadu_si512((const void *)(q + 64 * i));
                    const __m512i w0 = _mm512_and_si512(p, m4);
                    const __m512i w1 = _mm512_and_si512(_mm512_srli_epi16(p, 4), m4);
#pragma GCC unroll 4
                    for (int r = 0; r < NR; r++) {
                        const int8_t *q8 = y[r]->qs + 64 * j + 4 * i;
                        d0[r] = _mm512_dpbusd_epi32(d0[r], w0, _mm512_set1_epi32(load_i32(q8)));
                        d1[r] = _mm512_dpbusd_epi32(d1[r], w1, _mm512_set1_epi32(load_i32(q8 + 32)));
                    }
                }
                const __m512i sc0 = lle512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + LLE_PK_Q4K_SC + 32 * j)));
                const __m512i sc1 = lle512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + LLE_PK_Q4K_SC + 32 * j + 16)));
                const __m512i mn = lle512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(blk + LLE_PK_Q4K_MN + 32 * j)));
#pragma GCC unroll 4
                for (int r = 0; r < NR; r++) {
                    const int16_t *bs = y[r]->bsums + 4 * j;
                    const uint32_t pair = (uint16_t)(bs[0] + bs[1]) | ((uint32_t)(uint16_t)(bs[2] + bs[3]) << 16);
                    const __m512i s1 = _mm512_add_epi32(_mm512_mullo_epi32(d0[r], sc0), _mm512_mullo_epi32(d1[r], sc1));
                    const __m512i s2 = _mm512_dpwssd_epi32(_mm512_setzero_si512(), mn, _mm512_set1_epi32((int)pair));
                    if (gemm) {
                        acc[r] = _mm512_fmadd_ps(lle512_cvtepi32_ps(s1), dd[r], acc[r]);
                        accm[r] = _mm512_fmadd_ps(lle512_cvtepi32_ps(s2), dm[r], accm[r]);
                    } else {
                        t1[r] = _mm512_add_epi32(t1[r], s1);
                        t2[r] = _mm512_add_epi32(t2[r], s2);
                    }
                }
            }
            if (!gemm) {
#pragma GCC unroll 4
                for (int r = 0; r < NR; r++) {
                    acc[r] = _mm512_fmadd_ps(lle512_cvtepi32_ps(t1[r]), dd[r], acc[r]);
                    accm[r] = _mm512_fmadd_ps(lle512_cvtepi32_ps(t2[r]), dm[r], accm[r]);
                }
            }
        }
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) _mm512_storeu_ps(out + (size_t)r * ldo + LLE_PACK_ROWS * g, _mm512_sub_ps(acc[r], accm[r]));
    }
}

static void packed_q4_K(int k, const void *pw, int ng, const void *a, size_t as, int nr, int gemm, float *out,
                        size_t ldo) {
    switch (nr) {
    case 1: packed_q4_K_nr(1, k, pw, ng, a, as, gemm, out, ldo); break;
    case 2: packed_q4_K_nr(2, k, pw, ng, a, as, gemm, out, ldo); break;
    case 3: packed_q4_K_nr(3, k, pw, ng, a, as, gemm, out, ldo); break;
    default: packed_q4_K_nr(4, k, pw, ng, a, as, gemm, out, ldo); break;
    }
}

/* The weight stream of the two-pass 4-row kernels (packed_q4_1_4, packed_q8_0_4). Their first pass over
 * a group reads it from memory, the second from L1, so a group's reads come in bursts, and a prefetch
 * distance fixed in bytes ahead of the read (LLE_PREFETCH, the one-row kernels') keeps too few lines in
 * flight: at four rows a block takes 4x as long to consume, and a 1536x576 Q4_1 product from memory took
 * about the time of its arithmetic plus that of its reads. Instead each pass prefetches half a block per
 * block of the group one group plus LLE_PF_ROWS_EXTRA bytes ahead, so the next group arrives at an even
 * rate over both passes of this one. Measured here (Zen 5, one thread, from memory, p10 of 2000): Q4_1
 * 1536x576 22.9 -> 18.8 us, 576x1536 21.5 -> 18.6, 576x576 8.9 -> 7.9; Q8_0 2048x576 45 -> 33.4 us
 * (29.5 in cache, 33.9 for one row). Groups over LLE_PF_ROWS_MAX_GROUP bytes (wide k) keep the fixed
 * distance: a group and a half ahead would not stay in L1 until read. */
#define LLE_PF_ROWS_EXTRA 4096
#define LLE_PF_ROWS_MAX_GROUP (24 * 1024)
LLE_INLINE void prefetch_rows_stream(const uint8_t *group, size_t gbytes, size_t block, const int HIGH, int b,
                                     const int lines) {
    const char *p = (const char *)group + gbytes + LLE_PF_ROWS_EXTRA + (HIGH ? gbytes / 2 : 0) + (size_t)b * (block / 2);
    for (int i = 0; i < lines; i++) lle_prefetch_weight(p + 64 * i);
}

/* ---------------------------------------------------------------- Q4_1, packed 16 rows (native/packed.c) */
/* vec_dot_q4_1's order (the only one Q4_1 has, so this serves decode, batched rows and prefill) over
 * a group of 16 weight rows, lane l = row l. AVX2's 8-lane dot of a block becomes 8 vectors: its
 * lane c < 4 (low nibbles of qs[4c..4c+3] against activation bytes 4c..) and lane c + 4 (their high
 * nibbles against bytes 16 + 4c..) are vpdpbusd of one 64-byte chunk against 4 activation bytes
 * broadcast, the same integers. Each of the 8 lanes then keeps its own accumulator with the one-row
 * kernel's float operations (acc = fma(dx * dy, dot, acc); summs = fma(m, s, summs)), and the end
 * adds them in hsum_float_8's tree, so every row's value is bit for bit the unpacked kernel's. No
 * dependency chain runs through one accumulator per block (the one-row gemv's bound), and a block's
 * unpacked weights serve two activation rows. */
/* hsum_float_8 of AVX2's 8 lanes, each lane a vector of 16 rows: ((l4 + l0) + (l6 + l2)) + ((l5 + l1) + (l7 + l3)) */
LLE_INLINE __m512 hsum8_lanes(const __m512 v[8]) {
    return _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(v[4], v[0]), _mm512_add_ps(v[6], v[2])),
                         _mm512_add_ps(_mm512_add_ps(v[5], v[1]), _mm512_add_ps(v[7], v[3])));
}

/* the float scales d, s of each Q8_1 activation block (packed_prep: read as broadcasts, not converted
 * from f16 once per block, row and weight group) */
static void prep_q4_1(int k, void *row) {
    const int nb = k / QK;
    const block_q8_1 *y = row;
    float *x = (float *)((uint8_t *)row + LLE_PK_PREP_OFF((size_t)nb * sizeof(block_q8_1)));
    for (int b = 0; b < nb; b++) {
        x[2 * b] = h2f(y[b].d);
        x[2 * b + 1] = h2f(y[b].s);
    }
}

LLE_INLINE void packed_q4_1_nr(const int NR, int k, const uint8_t *pw, const uint8_t *a, size_t as, float *out,
                               size_t ldo) {
    const int nb = k / QK;
    const size_t xoff = LLE_PK_PREP_OFF((size_t)nb * sizeof(block_q8_1));
    const __m512i m4 = _mm512_set1_epi8(0xF);
    __m512 acc[4][8], summs[4];
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
        summs[r] = _mm512_setzero_ps();
#pragma GCC unroll 8
        for (int l = 0; l < 8; l++) acc[r][l] = _mm512_setzero_ps();
    }
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = pw + (size_t)b * LLE_PK_Q41_BLOCK;
        lle_prefetch_weight((const char *)blk + LLE_PREFETCH);
        lle_prefetch_weight((const char *)blk + LLE_PREFETCH + 64);
        lle_prefetch_weight((const char *)blk + LLE_PREFETCH + 128);
        lle_prefetch_weight((const char *)blk + LLE_PREFETCH + 192);
        lle_prefetch_weight((const char *)blk + LLE_PREFETCH + 256);
        const __m512 dw = lle512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + LLE_PK_Q41_D)));
        const __m512 mw = lle512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + LLE_PK_Q41_M)));
        __m512i wq[8];
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            const __m512i p = _mm512_loadu_si512((const void *)(blk + LLE_PK_Q41_QS + 64 * c));
            wq[c] = _mm512_and_si512(p, m4);
            wq[c + 4] = _mm512_and_si512(_mm512_srli_epi16(p, 4), m4);
        }
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const uint8_t *row = a + (size_t)r * as;
            const block_q8_1 *y = (const block_q8_1 *)row + b;
            const float *ys = (const float *)(row + xoff) + 2 * b;
            summs[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(ys[1]), summs[r]);
            const __m512 dd = _mm512_mul_ps(dw, _mm512_set1_ps(ys[0]));
#pragma GCC unroll 8
            for (int l = 0; l < 8; l++) {
                const __m512i yq = _mm512_set1_epi32(load_i32(y->qs + (l < 4 ? 4 * l : 16 + 4 * (l - 4))));
                const __m512 dot = lle512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), wq[l], yq));
                acc[r][l] = _mm512_fmadd_ps(dd, dot, acc[r][l]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) _mm512_storeu_ps(out + (size_t)r * ldo, _mm512_add_ps(hsum8_lanes(acc[r]), summs[r]));
}

/* packed_q4_1_nr for 4 activation rows in two passes over the group: lanes 0-3 (low nibbles) of every
 * block, then lanes 4-7 (high nibbles) from L1. Each lane's accumulator still takes the blocks in order
 * with the same operations, so every value is packed_q4_1_nr's bit for bit, but only 16 accumulators
 * are live instead of 32, and none spill. While the second pass computes, it prefetches the next group
 * (the next in memory, which is almost always this thread's next one): otherwise memory would sit idle
 * during that pass. At four rows the product is bound by arithmetic. On Zen 4, vpdpbusd and FMA share
 * the two 512-bit pipes (one zmm op per cycle between them), so llama.cpp's order (8 dot lanes, each
 * with its own FMA per block) costs 18 such ops per 16 row-blocks of one activation row, and this
 * kernel runs at 1.16 cycles per row-block in L1, against 1.42 for the one-pass kernel. Measured
 * in-process A/B, interleaved: Q4_1 3072x576 from memory, 4 rows, 60.4 -> 53.3 us and 1536x576
 * 37.7 -> 35.2 us; the SmolLM2 4-sequence step 6.96 -> 6.66 ms (medians of 8). */
/* one pass of packed_q4_1_4: lanes 0-3 (the low nibbles; the min sums too; prefetching this group's
 * blocks ahead) or, HIGH, lanes 4-7 (the high nibbles; prefetching the next group) */
LLE_INLINE void packed_q4_1_4_pass(int k, const uint8_t *pw, const uint8_t *a, size_t as, const int HIGH,
                                   __m512 acc[4][4], __m512 summs[4]) {
    const int nb = k / QK;
    const size_t xoff = LLE_PK_PREP_OFF((size_t)nb * sizeof(block_q8_1));
    const size_t gbytes = (size_t)nb * LLE_PK_Q41_BLOCK;
    const int spread = gbytes <= LLE_PF_ROWS_MAX_GROUP;
    const size_t ahead = HIGH ? gbytes : LLE_PREFETCH;
    const __m512i m4 = _mm512_set1_epi8(0xF);
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) {
        if (!HIGH) summs[r] = _mm512_setzero_ps();
#pragma GCC unroll 4
        for (int l = 0; l < 4; l++) acc[r][l] = _mm512_setzero_ps();
    }
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = pw + (size_t)b * LLE_PK_Q41_BLOCK;
        if (spread) {
            prefetch_rows_stream(pw, gbytes, LLE_PK_Q41_BLOCK, HIGH, b, 3);
        } else {
#pragma GCC unroll 5
            for (int i = 0; i < 5; i++) lle_prefetch_weight((const char *)blk + ahead + 64 * i);
        }
        const __m512 dw = lle512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + LLE_PK_Q41_D)));
        __m512 mw = _mm512_setzero_ps();
        if (!HIGH) mw = lle512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + LLE_PK_Q41_M)));
        __m512i wq[4];
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            const __m512i p = _mm512_loadu_si512((const void *)(blk + LLE_PK_Q41_QS + 64 * c));
            wq[c] = _mm512_and_si512(HIGH ? _mm512_srli_epi16(p, 4) : p, m4);
        }
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const uint8_t *row = a + (size_t)r * as;
            const block_q8_1 *y = (const block_q8_1 *)row + b;
            const float *ys = (const float *)(row + xoff) + 2 * b;
            if (!HIGH) summs[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(ys[1]), summs[r]);
            const __m512 dd = _mm512_mul_ps(dw, _mm512_set1_ps(ys[0]));
#pragma GCC unroll 4
            for (int l = 0; l < 4; l++) {
                const __m512i yq = _mm512_set1_epi32(load_i32(y->qs + 16 * HIGH + 4 * l));
                acc[r][l] = _mm512_fmadd_ps(dd, lle512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), wq[l], yq)), acc[r][l]);
            }
        }
    }
}

static void packed_q4_1_4(int k, const uint8_t *pw, const uint8_t *a, size_t as, float *out, size_t ldo) {
    __m512 lo[4][4], hi[4][4], summs[4];
    packed_q4_1_4_pass(k, pw, a, as, 0, lo, summs);
    packed_q4_1_4_pass(k, pw, a, as, 1, hi, summs);
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) {
        const __m512 v[8] = {lo[r][0], lo[r][1], lo[r][2], lo[r][3], hi[r][0], hi[r][1], hi[r][2], hi[r][3]};
        _mm512_storeu_ps(out + (size_t)r * ldo, _mm512_add_ps(hsum8_lanes(v), summs[r]));
    }
}

/* The packed kernel NAME of a one-order type (`gemm` unused): each group against every activation
 * row, four at a time (NAME_4), then pairs, then one (NAME_nr). Every block read from memory feeds
 * four rows' work (NAME_4 in two passes over the group, 16 accumulators live; NAME_nr with two rows
 * holds 16, with one 8). */
#define PACKED_BY_ROWS(NAME, BLOCK_BYTES)                                                                        \
    static void NAME(int k, const void *pw, int ng, const void *a, size_t as, int nr, int gemm, float *out,     \
                     size_t ldo) {                                                                             \
        (void)gemm;                                                                                            \
        const size_t gbytes = (size_t)(k / QK) * (BLOCK_BYTES);                                                \
        for (int g = 0; g < ng; g++) {                                                                         \
            const uint8_t *gw = (const uint8_t *)pw + (size_t)g * gbytes;                                      \
            int r = 0;                                                                                         \
            for (; r + 4 <= nr; r += 4)                                                                        \
                NAME##_4(k, gw, (const uint8_t *)a + (size_t)r * as, as, out + (size_t)r * ldo + LLE_PACK_ROWS * g, ldo); \
            for (; r + 2 <= nr; r += 2)                                                                        \
                NAME##_nr(2, k, gw, (const uint8_t *)a + (size_t)r * as, as, out + (size_t)r * ldo + LLE_PACK_ROWS * g, ldo); \
            if (r < nr)                                                                                        \
                NAME##_nr(1, k, gw, (const uint8_t *)a + (size_t)r * as, as, out + (size_t)r * ldo + LLE_PACK_ROWS * g, ldo); \
        }                                                                                                      \
    }

PACKED_BY_ROWS(packed_q4_1, LLE_PK_Q41_BLOCK)

/* ---------------------------------------------------------------- Q8_0, packed 16 rows (native/packed.c) */
/* vec_dot_q8_0's order (gemv_q8_0: acc = fma(dx * dy, dot, acc) over AVX2's 8 lanes of 4 products,
 * hsum_float_8 at the end) over a group of 16 weight rows, lane l = row l, as packed_q4_1. The
 * weights are stored plus 128 (vpdpbusd's unsigned operand); each lane's dot starts from -128 times
 * the sum of its 4 activation bytes (prep_q8_0), so it is the signed dot, the same integer as the
 * unpacked kernel's |x| * sign(y, x). */
static void prep_q8_0(int k, void *row) {
    const int nb = k / QK;
    const block_q8_0 *y = row;
    uint8_t *x = (uint8_t *)row + LLE_PK_PREP_OFF((size_t)nb * sizeof(block_q8_0));
    for (int b = 0; b < nb; b++, x += LLE_PK_Q80_PREP) {
        const float d = h2f(y[b].d);
        memcpy(x, &d, 4);
        const __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8((char)0x80),
                                              _mm256_loadu_si256((const __m256i *)y[b].qs));
        _mm256_storeu_si256((__m256i *)(x + 4), _mm256_sub_epi32(_mm256_setzero_si256(), s));
    }
}

LLE_INLINE void packed_q8_0_nr(const int NR, int k, const uint8_t *pw, const uint8_t *a, size_t as, float *out,
                               size_t ldo) {
    const int nb = k / QK;
    const size_t xoff = LLE_PK_PREP_OFF((size_t)nb * sizeof(block_q8_0));
    __m512 acc[4][8];
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
#pragma GCC unroll 8
        for (int l = 0; l < 8; l++) acc[r][l] = _mm512_setzero_ps();
    }
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = pw + (size_t)b * LLE_PK_Q80_BLOCK;
#pragma GCC unroll 9
        for (int i = 0; i < 9; i++) lle_prefetch_weight((const char *)blk + LLE_PREFETCH + 64 * i);
        const __m512 dw = lle512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + LLE_PK_Q80_D)));
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const uint8_t *row = a + (size_t)r * as;
            const block_q8_0 *y = (const block_q8_0 *)row + b;
            const uint8_t *yx = row + xoff + (size_t)b * LLE_PK_Q80_PREP;
            float dy;
            memcpy(&dy, yx, 4);
            const __m512 dd = _mm512_mul_ps(dw, _mm512_set1_ps(dy));
#pragma GCC unroll 8
            for (int l = 0; l < 8; l++) {
                const __m512i w = _mm512_loadu_si512((const void *)(blk + LLE_PK_Q80_QS + 64 * l));
                const __m512i yq = _mm512_set1_epi32(load_i32(y->qs + 4 * l));
                const __m512i dot = _mm512_dpbusd_epi32(_mm512_set1_epi32(load_i32(yx + 4 + 4 * l)), w, yq);
                acc[r][l] = _mm512_fmadd_ps(dd, lle512_cvtepi32_ps(dot), acc[r][l]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) _mm512_storeu_ps(out + (size_t)r * ldo, hsum8_lanes(acc[r]));
}

/* packed_q8_0_nr for 4 activation rows in two passes over the group, as packed_q4_1_4: lanes 0-3 of
 * every block (bytes 0-15 of each row's block), then lanes 4-7 from L1; each lane's accumulator takes the
 * blocks in order with the same operations, so every value is packed_q8_0_nr's bit for bit. 16
 * accumulators live instead of 32 (which spilled): in cache, 2048x576 at 4 rows went from 2.0 to 1.65
 * cycles per 16 outputs (one thread), and with prefetch_rows_stream its product from memory costs about
 * what one row's does (the output head of a 4-sequence decode step). */
LLE_INLINE void packed_q8_0_4_pass(int k, const uint8_t *pw, const uint8_t *a, size_t as, const int HIGH,
                                   __m512 acc[4][4]) {
    const int nb = k / QK;
    const size_t xoff = LLE_PK_PREP_OFF((size_t)nb * sizeof(block_q8_0));
    const size_t gbytes = (size_t)nb * LLE_PK_Q80_BLOCK;
    const int spread = gbytes <= LLE_PF_ROWS_MAX_GROUP;
    const size_t ahead = HIGH ? gbytes : LLE_PREFETCH;
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) {
#pragma GCC unroll 4
        for (int l = 0; l < 4; l++) acc[r][l] = _mm512_setzero_ps();
    }
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = pw + (size_t)b * LLE_PK_Q80_BLOCK;
        if (spread) {
            prefetch_rows_stream(pw, gbytes, LLE_PK_Q80_BLOCK, HIGH, b, 5);
        } else {
#pragma GCC unroll 9
            for (int i = 0; i < 9; i++) lle_prefetch_weight((const char *)blk + ahead + 64 * i);
        }
        const __m512 dw = lle512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + LLE_PK_Q80_D)));
        __m512i w[4];
#pragma GCC unroll 4
        for (int l = 0; l < 4; l++) w[l] = _mm512_loadu_si512((const void *)(blk + LLE_PK_Q80_QS + 64 * (l + 4 * HIGH)));
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const uint8_t *row = a + (size_t)r * as;
            const block_q8_0 *y = (const block_q8_0 *)row + b;
            const uint8_t *yx = row + xoff + (size_t)b * LLE_PK_Q80_PREP;
            float dy;
            memcpy(&dy, yx, 4);
            const __m512 dd = _mm512_mul_ps(dw, _mm512_set1_ps(dy));
#pragma GCC unroll 4
            for (int l = 0; l < 4; l++) {
                const int L = l + 4 * HIGH;
                const __m512i yq = _mm512_set1_epi32(load_i32(y->qs + 4 * L));
                const __m512i dot = _mm512_dpbusd_epi32(_mm512_set1_epi32(load_i32(yx + 4 + 4 * L)), w[l], yq);
                acc[r][l] = _mm512_fmadd_ps(dd, lle512_cvtepi32_ps(dot), acc[r][l]);
            }
        }
    }
}

static void packed_q8_0_4(int k, const uint8_t *pw, const uint8_t *a, size_t as, float *out, size_t ldo) {
    __m512 lo[4][4], hi[4][4];
    packed_q8_0_4_pass(k, pw, a, as, 0, lo);
    packed_q8_0_4_pass(k, pw, a, as, 1, hi);
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) {
        const __m512 v[8] = {lo[r][0], lo[r][1], lo[r][2], lo[r][3], hi[r][0], hi[r][1], hi[r][2], hi[r][3]};
        _mm512_storeu_ps(out + (size_t)r * ldo, hsum8_lanes(v));
    }
}

PACKED_BY_ROWS(packed_q8_0, LLE_PK_Q80_BLOCK)

/* ---------------------------------------------------------------- Q6_K */
/* Per 128 values j of a block: A = [q4_0 | q4_1] and B = [q4_2 | q4_3] in AVX2's names (6-bit
 * quants against activation bytes 128j..+63 and +64..+127), then maddubs and vpdpwssd with each
 * word's 16-value scale. Lane l < 8 of the 512-bit total holds AVX2's lane l of q4_0 and q4_2, lane
 * l + 8 that of q4_1 and q4_3: AVX2's 8-lane sum is the sum of the two halves. The -32 offset
 * (AVX2's q8sclsub: 32 * scale * bsums) enters the low half through one more vpdpwssd. */

static const uint16_t k_q6_scale_idx[4][32] = {
    {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3},
    {4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7},
    {8, 8, 8, 8, 8, 8, 8, 8, 9, 9, 9, 9, 9, 9, 9, 9, 10, 10, 10, 10, 10, 10, 10, 10, 11, 11, 11, 11, 11, 11, 11, 11},
    {12, 12, 12, 12, 12, 12, 12, 12, 13, 13, 13, 13, 13, 13, 13, 13, 14, 14, 14, 14, 14, 14, 14, 14, 15, 15, 15, 15, 15, 15, 15, 15},
};

typedef struct {
    __m512i q[4];   /* A0, B0, A1, B1 */
    __m512i sc[4];  /* their word scales */
    __m512i neg32;  /* -32 * scale, words 0..15, zero above */
} q6_unpacked;

LLE_INLINE void q6_unpack(const block_q6_K *x, q6_unpacked *u) {
    const __m512i m15 = _mm512_set1_epi8(15), m48 = _mm512_set1_epi8(48);
    const __m512i shl = _mm512_set_epi64(0x0002000200020002ll, 0x0002000200020002ll, 0x0002000200020002ll, 0x0002000200020002ll,
                                         0x0004000400040004ll, 0x0004000400040004ll, 0x0004000400040004ll, 0x0004000400040004ll);
    const __m512i shr = _mm512_set_epi64(0x0002000200020002ll, 0x0002000200020002ll, 0x0002000200020002ll, 0x0002000200020002ll,
                                         0, 0, 0, 0);
    for (int j = 0; j < 2; j++) {
        const __m512i l = _mm512_loadu_si512((const void *)(x->ql + 64 * j));
        const __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(x->qh + 32 * j)));
        u->q[2 * j] = _mm512_or_si512(_mm512_and_si512(l, m15), _mm512_and_si512(_mm512_sllv_epi16(h, shl), m48));
        u->q[2 * j + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m15), _mm512_and_si512(_mm512_srlv_epi16(h, shr), m48));
    }
    const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x->scales));
    const __m512i s16z = _mm512_castsi256_si512(s16);
    for (int i = 0; i < 4; i++) u->sc[i] = _mm512_permutexvar_epi16(_mm512_loadu_si512((const void *)k_q6_scale_idx[i]), s16z);
    u->neg32 = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_mullo_epi16(s16, _mm256_set1_epi16(-32)), 0);
}

LLE_INLINE __m512i q6_sumi(const q6_unpacked *u, const block_q8_K *y) {
    __m512i sumi = _mm512_dpwssd_epi32(_mm512_setzero_si512(),
                                       _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_loadu_si256((const __m256i *)y->bsums), 0),
                                       u->neg32);
    for (int i = 0; i < 4; i++)
        sumi = _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(u->q[i], _mm512_loadu_si512((const void *)(y->qs + 64 * i))), u->sc[i]);
    return sumi;
}

static void vec_dot_q6_K(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const block_q6_K *x = vx;
    const block_q8_K *y = vy;
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < n / QK_K; ++i) {
        lle_prefetch_weight((const char *)(x + i) + LLE_PREFETCH);
        lle_prefetch_weight((const char *)(x + i) + LLE_PREFETCH + 64);
        lle_prefetch_weight((const char *)(x + i) + LLE_PREFETCH + 128);
        const float d = y[i].d * h2f(x[i].d);
        q6_unpacked u;
        q6_unpack(x + i, &u);
        const __m512i z = q6_sumi(&u, y + i);
        const __m256i sumi = _mm256_add_epi32(_mm512_castsi512_si256(z), _mm512_extracti64x4_epi64(z, 1));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    *s = hsum_float_8(acc);
}

/* Q6_K, packed 16 rows (native/packed.c), the tiled order only (tile_q6_K_tiled: per block
 * buf = fma(d * s1, dy, buf)): s1 = sum over sub-blocks of scale * (q . a) - 32 * scale * bsum, the
 * exact integer of ints_q6_K, from vpdpbusd of the unsigned quants with 4 activation bytes broadcast
 * (lane l = row l). `gemm` is unused (one order). */
LLE_INLINE void packed_q6_K_nr(const int NR, int k, const uint8_t *pw, int ng, const uint8_t *a, size_t as,
                               float *out, size_t ldo) {
    const int nb = k / QK_K;
    for (int g = 0; g < ng; g++) {
        const uint8_t *gw = pw + (size_t)g * nb * LLE_PK_Q6K_BLOCK;
        __m512 buf[4];
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) buf[r] = _mm512_setzero_ps();
        for (int b = 0; b < nb; b++) {
            const uint8_t *blk = gw + (size_t)b * LLE_PK_Q6K_BLOCK;
            const __m512 dw = lle512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + LLE_PK_Q6K_D)));
            const block_q8_K *y[4];
            __m512i s1[4], off[4];
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                y[r] = (const block_q8_K *)(a + (size_t)r * as) + b;
                s1[r] = off[r] = _mm512_setzero_si512();
            }
            for (int s = 0; s < 16; s++) {
                const __m512i sc = lle512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + LLE_PK_Q6K_SC + 16 * s)));
                __m512i dsum[4];
#pragma GCC unroll 4
                for (int r = 0; r < NR; r++) dsum[r] = _mm512_setzero_si512();
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++) {
                    const __m512i q = _mm512_loadu_si512((const void *)(blk + LLE_PK_Q6K_Q + 64 * (4 * s + i)));
#pragma GCC unroll 4
                    for (int r = 0; r < NR; r++)
                        dsum[r] = _mm512_dpbusd_epi32(dsum[r], q, _mm512_set1_epi32(load_i32(y[r]->qs + 16 * s + 4 * i)));
                }
#pragma GCC unroll 4
                for (int r = 0; r < NR; r++) {
                    s1[r] = _mm512_add_epi32(s1[r], _mm512_mullo_epi32(dsum[r], sc));
                    off[r] = _mm512_add_epi32(off[r], _mm512_mullo_epi32(sc, _mm512_set1_epi32(y[r]->bsums[s])));
                }
            }
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                const __m512i t = _mm512_sub_epi32(s1[r], _mm512_slli_epi32(off[r], 5));
                buf[r] = _mm512_fmadd_ps(_mm512_mul_ps(dw, lle512_cvtepi32_ps(t)), _mm512_set1_ps(y[r]->d), buf[r]);
            }
        }
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) _mm512_storeu_ps(out + (size_t)r * ldo + LLE_PACK_ROWS * g, buf[r]);
    }
}

static void packed_q6_K(int k, const void *pw, int ng, const void *a, size_t as, int nr, int gemm, float *out,
                        size_t ldo) {
    (void)gemm;
    switch (nr) {
    case 1: packed_q6_K_nr(1, k, pw, ng, a, as, out, ldo); break;
    case 2: packed_q6_K_nr(2, k, pw, ng, a, as, out, ldo); break;
    case 3: packed_q6_K_nr(3, k, pw, ng, a, as, out, ldo); break;
    default: packed_q6_K_nr(4, k, pw, ng, a, as, out, ldo); break;
    }
}

/* the four lane totals of four 16-lane int32 vectors: [sum v0, sum v1, sum v2, sum v3] */
LLE_INLINE __m128i hsum4x16(__m512i v0, __m512i v1, __m512i v2, __m512i v3) {
    const __m512i s01 = _mm512_add_epi32(_mm512_unpacklo_epi32(v0, v1), _mm512_unpackhi_epi32(v0, v1));
    const __m512i s23 = _mm512_add_epi32(_mm512_unpacklo_epi32(v2, v3), _mm512_unpackhi_epi32(v2, v3));
    const __m512i t = _mm512_add_epi32(_mm512_unpacklo_epi64(s01, s23), _mm512_unpackhi_epi64(s01, s23));
    const __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(t), _mm512_extracti64x4_epi64(t, 1));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

#define ACT_ROW(r) ((const block_q8_K *)(a + (size_t)((r) < nr ? (r) : 0) * as))

/* the tiled K-quant GEMM order of Q6_K (korder_avx2.inc): per block, the four rows' totals s1,
 * then buf = fma(d * s1, dy, buf) in the lanes of a 128-bit vector */
static void tile_q6_K_tiled(int k, const void *w, size_t ws, int nc, const void *av, size_t as, const float *sc,
                            int nr, float *out, size_t ldo) {
    (void)sc;
    const uint8_t *a = av;
    for (int jr = 0; jr < nc; jr++) {
        const block_q6_K *x = (const block_q6_K *)((const uint8_t *)w + (size_t)jr * ws);
        __m128 buf = _mm_setzero_ps();
        for (int i = 0; i < k / QK_K; ++i) {
            q6_unpacked u;
            q6_unpack(x + i, &u);
            const __m128i s1 = hsum4x16(q6_sumi(&u, ACT_ROW(0) + i), q6_sumi(&u, ACT_ROW(1) + i),
                                        q6_sumi(&u, ACT_ROW(2) + i), q6_sumi(&u, ACT_ROW(3) + i));
            const __m128 dy = _mm_set_ps(ACT_ROW(3)[i].d, ACT_ROW(2)[i].d, ACT_ROW(1)[i].d, ACT_ROW(0)[i].d);
            const __m128 res = _mm_mul_ps(_mm_set1_ps(h2f(x[i].d)), _mm_cvtepi32_ps(s1));
            buf = _mm_fmadd_ps(res, dy, buf);
        }
        float res[4];
        _mm_storeu_ps(res, buf);
        for (int r = 0; r < nr; r++) out[(size_t)r * ldo + jr] = res[r];
    }
}

#undef ACT_ROW

/* ---------------------------------------------------------------- float products (F32, F16, BF16) */
/* ggml's AVX-512 build (what llama.cpp and Ollama run on an AVX-512 CPU; the AVX2 tier keeps the
 * AVX2 build's orders), checked by tests/fixtures/native_ggml_ops_avx512.json:
 * - one activation row: ggml_vec_dot_f32 / _f16 (GGML_F32x16): four 16-lane accumulators over 64
 *   values, reduced (a0 + a2) + (a1 + a3), then _mm512_reduce_add_ps; the values past the last 64
 *   one by one (f32: rounded products added in turn, the last (n % 64) % 8 fused, as GCC vectorizes
 *   that loop; f16: in double). ggml_vec_dot_bf16 (AVX512_BF16): two
 *   vdpbf16ps accumulators over 64 values, each reduced and added in double, then the rest in double;
 * - several rows, when m % 4 == 0 and k is a multiple of 16 (f32, f16) or 32 (bf16; batch_k):
 *   llamafile's tinyBLAS<16, __m512> (<32, __m512bh> for bf16), one 16-lane accumulator per output,
 *   _mm512_reduce_add_ps.
 * vdpbf16ps adds to each f32 lane the product of the odd bf16 of its pair, then that of the even
 * one, each rounded, denormal inputs read as zero and denormal results flushed (whatever MXCSR says).
 * Here it is two FMAs (the product of two bf16 is exact) with MXCSR's DAZ and FTZ set around the
 * loop: equal to the instruction bit for bit, denormals included, on every AVX-512 CPU (with or
 * without AVX512_BF16) and through SIMDe. */

/* MXCSR with DAZ and FTZ set (vdpbf16ps's denormal rules); returns the previous value to restore */
LLE_INLINE unsigned int daz_ftz_on(void) {
    const unsigned int csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040u);
    return csr;
}

/* the bf16 pairs of 32 values as floats: odd members (high halves), even members (low halves) */
LLE_INLINE __m512 bf16_odd(__m512i v) { return _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32((int)0xFFFF0000u))); }
LLE_INLINE __m512 bf16_even(__m512i v) { return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)); }

/* vdpbf16ps(acc, x, y) over the 32 bf16 at x and y (under daz_ftz_on) */
LLE_INLINE __m512 dpbf16(__m512 acc, const uint16_t *x, const uint16_t *y) {
    const __m512i xv = _mm512_loadu_si512((const void *)x), yv = _mm512_loadu_si512((const void *)y);
    acc = _mm512_fmadd_ps(bf16_odd(xv), bf16_odd(yv), acc);
    return _mm512_fmadd_ps(bf16_even(xv), bf16_even(yv), acc);
}

static void vec_dot_f32(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    *s = lle512_dot_f32_ggml(n, vx, vy);
}

static void vec_dot_f16(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    *s = lle512_dot_f16_ggml(n, vx, vy);
}

/* the end of vec_dot_bf16 (shared with its rows kernel): c1, c2 over the first np values, the tail */
LLE_INLINE float finish_bf16(__m512 c1, __m512 c2, const uint16_t *x, const uint16_t *y, int np, int n) {
    double sumf = lle512_reduce(c1);
    sumf += lle512_reduce(c2);
    return lle_bf16_dot_finish(sumf, x, y, np, n);
}

static void vec_dot_bf16(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const uint16_t *x = vx, *y = vy;
    const int np = n & ~63;
    __m512 c1 = _mm512_setzero_ps(), c2 = _mm512_setzero_ps();
    const unsigned int csr = daz_ftz_on();
    for (int i = 0; i < np; i += 64) {
        c1 = dpbf16(c1, x + i, y + i);
        c2 = dpbf16(c2, x + i + 32, y + i + 32);
    }
    _mm_setcsr(csr);
    *s = finish_bf16(c1, c2, x, y, np, n);
}

/* several bf16 activation rows (decode of a few tokens at once), each exactly vec_dot_bf16 above:
 * two weight rows split into odd and even floats per LLE_ROWS_CHUNK values (a multiple of 64), each
 * activation chunk read once for both */
#define LLE_ROWS_CHUNK 256
/* weight rows x0, x1 against n activation rows into out[r * ldo + 0 / 1] (x1 == x0 for a last odd
 * row: computed twice, stored once) */
LLE_INLINE void rows_bf16_pair(int k, const uint16_t *x0, const uint16_t *x1, int two, const void *av, size_t as,
                               const int n, float *out, size_t ldo) {
    const int np = k & ~63;
    float wf[2][2 * LLE_ROWS_CHUNK] __attribute__((aligned(64)));  /* per 32 values: 16 odd, 16 even */
    __m512 acc[LLE_GEMV_ROWS][4];
    for (int r = 0; r < n; r++)
        for (int q = 0; q < 4; q++) acc[r][q] = _mm512_setzero_ps();
    const unsigned int csr = daz_ftz_on();
    for (int c0 = 0; c0 < np; c0 += LLE_ROWS_CHUNK) {
        const int len = np - c0 < LLE_ROWS_CHUNK ? np - c0 : LLE_ROWS_CHUNK;
        for (int i = 0; i < len; i += 32) {
            const __m512i v0 = _mm512_loadu_si512((const void *)(x0 + c0 + i)), v1 = _mm512_loadu_si512((const void *)(x1 + c0 + i));
            _mm512_store_ps(wf[0] + i, bf16_odd(v0));
            _mm512_store_ps(wf[0] + i + 16, bf16_even(v0));
            _mm512_store_ps(wf[1] + i, bf16_odd(v1));
            _mm512_store_ps(wf[1] + i + 16, bf16_even(v1));
        }
        for (int r = 0; r < n; r++) {
            const uint16_t *y = (const uint16_t *)((const uint8_t *)av + (size_t)r * as) + c0;
            __m512 a0 = acc[r][0], a1 = acc[r][1], b0 = acc[r][2], b1 = acc[r][3];
            for (int i = 0; i < len; i += 64) {
                __m512i yv = _mm512_loadu_si512((const void *)(y + i));
                __m512 yo = bf16_odd(yv), ye = bf16_even(yv);
                a0 = _mm512_fmadd_ps(_mm512_load_ps(wf[0] + i + 16), ye, _mm512_fmadd_ps(_mm512_load_ps(wf[0] + i), yo, a0));
                b0 = _mm512_fmadd_ps(_mm512_load_ps(wf[1] + i + 16), ye, _mm512_fmadd_ps(_mm512_load_ps(wf[1] + i), yo, b0));
                yv = _mm512_loadu_si512((const void *)(y + i + 32));
                yo = bf16_odd(yv);
                ye = bf16_even(yv);
                a1 = _mm512_fmadd_ps(_mm512_load_ps(wf[0] + i + 48), ye, _mm512_fmadd_ps(_mm512_load_ps(wf[0] + i + 32), yo, a1));
                b1 = _mm512_fmadd_ps(_mm512_load_ps(wf[1] + i + 48), ye, _mm512_fmadd_ps(_mm512_load_ps(wf[1] + i + 32), yo, b1));
            }
            acc[r][0] = a0; acc[r][1] = a1; acc[r][2] = b0; acc[r][3] = b1;
        }
    }
    _mm_setcsr(csr);
    for (int r = 0; r < n; r++) {
        const uint16_t *y = (const uint16_t *)((const uint8_t *)av + (size_t)r * as);
        out[(size_t)r * ldo] = finish_bf16(acc[r][0], acc[r][1], x0, y, np, k);
        if (two) out[(size_t)r * ldo + 1] = finish_bf16(acc[r][2], acc[r][3], x1, y, np, k);
    }
}

LLE_INLINE void rows_bf16(int k, const void *w, size_t ws, int nr, const void *av, size_t as, const float *sc,
                          const int n, float *out, size_t ldo) {
    (void)sc;
    for (int j = 0; j < nr; j += 2) {
        const uint16_t *x0 = (const uint16_t *)((const uint8_t *)w + (size_t)j * ws);
        const int two = j + 1 < nr;
        rows_bf16_pair(k, x0, two ? (const uint16_t *)((const uint8_t *)x0 + ws) : x0, two, av, as, n, out + j, ldo);
    }
}

LLE_ROWS_DISPATCH(bf16)

/* several f32 / f16 activation rows, each exactly vec_dot_f32 / _f16 above (same four accumulators
 * per row, same reduction and tail): each weight row is read from memory once, its vectors loaded
 * (converted, for f16) once for up to 4 activation rows (16 accumulators), and 8 rows take it twice
 * from L1. f16 activations are converted to floats once per call where they fit LLE_ROWS_F16_BUF
 * (the conversion is exact: the same products), else per weight row. Each row ends as vec_dot's does
 * (lle512_finish_f32 / _f16). */

#define LDF(p) _mm512_loadu_ps(p)
#define LLE_ROWS_F16_BUF 12288

/* weight row x (TW) against g (<= 4) activation rows: their first np values at av (TA, rows avs
 * elements apart), all k at y (TW, rows ys bytes apart: the tail), into out[r * ldo] */
#define ROWS_GROUP(NAME, TW, LOADW, TA, LOADA, FINISH)                                                      \
    LLE_INLINE void NAME(int k, const TW *x, const TA *av, size_t avs, const uint8_t *y, size_t ys, const int g, \
                         float *out, size_t ldo) {                                                           \
        const int np = k & ~63;                                                                              \
        __m512 acc[4][4];                                                                                    \
        for (int r = 0; r < g; r++)                                                                          \
            for (int q = 0; q < 4; q++) acc[r][q] = _mm512_setzero_ps();                                     \
        for (int i = 0; i < np; i += 64) {                                                                   \
            const __m512 w0 = LOADW(x + i), w1 = LOADW(x + i + 16), w2 = LOADW(x + i + 32), w3 = LOADW(x + i + 48); \
            for (int r = 0; r < g; r++) {                                                                    \
                const TA *v = av + r * avs + i;                                                              \
                acc[r][0] = _mm512_fmadd_ps(w0, LOADA(v), acc[r][0]);                                        \
                acc[r][1] = _mm512_fmadd_ps(w1, LOADA(v + 16), acc[r][1]);                                   \
                acc[r][2] = _mm512_fmadd_ps(w2, LOADA(v + 32), acc[r][2]);                                   \
                acc[r][3] = _mm512_fmadd_ps(w3, LOADA(v + 48), acc[r][3]);                                   \
            }                                                                                                \
        }                                                                                                    \
        for (int r = 0; r < g; r++) out[(size_t)r * ldo] = FINISH(acc[r], x, (const TW *)(y + r * ys), np, k); \
    }

ROWS_GROUP(group_f32, float, LDF, float, LDF, lle512_finish_f32)
ROWS_GROUP(group_f16, lle_half, LLE512_LDH, lle_half, LLE512_LDH, lle512_finish_f16)
ROWS_GROUP(group_f16f, lle_half, LLE512_LDH, float, LDF, lle512_finish_f16)

/* nr weight rows against n activation rows (av: their vector parts, avs elements apart) */
#define ROWS_WEIGHTS(GROUP, TW)                                                                              \
    for (int j = 0; j < nr; j++) {                                                                           \
        const TW *x = (const TW *)((const uint8_t *)w + (size_t)j * ws);                                     \
        GROUP(k, x, av, avs, a, as, n < 4 ? n : 4, out + j, ldo);                                            \
        if (n > 4) GROUP(k, x, av + 4 * avs, avs, (const uint8_t *)a + 4 * as, as, n - 4, out + 4 * ldo + j, ldo); \
    }

LLE_INLINE void rows_f32(int k, const void *w, size_t ws, int nr, const void *a, size_t as, const float *sc,
                         const int n, float *out, size_t ldo) {
    (void)sc;
    const float *av = a;
    const size_t avs = as / sizeof(float);
    ROWS_WEIGHTS(group_f32, float)
}

LLE_INLINE void rows_f16(int k, const void *w, size_t ws, int nr, const void *a, size_t as, const float *sc,
                         const int n, float *out, size_t ldo) {
    (void)sc;
    const int np = k & ~63;
    if ((size_t)n * np > LLE_ROWS_F16_BUF || nr < 2) {
        const lle_half *av = a;
        const size_t avs = as / sizeof(lle_half);
        ROWS_WEIGHTS(group_f16, lle_half)
        return;
    }
    float buf[LLE_ROWS_F16_BUF] __attribute__((aligned(64)));
    for (int r = 0; r < n; r++) {
        const lle_half *y = (const lle_half *)((const uint8_t *)a + (size_t)r * as);
        for (int i = 0; i < np; i += 16) _mm512_store_ps(buf + (size_t)r * np + i, LLE512_LDH(y + i));
    }
    const float *av = buf;
    const size_t avs = (size_t)np;
    ROWS_WEIGHTS(group_f16f, lle_half)
}

LLE_ROWS_DISPATCH(f32)
LLE_ROWS_DISPATCH(f16)

/* tinyBLAS's order, one output: vec_dot_batch */
static void vec_dot_f32_tb(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    *s = lle512_dot_f32_tb(n, vx, vy);
}

static void vec_dot_f16_tb(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    *s = lle512_dot_f16_tb(n, vx, vy);
}

static void vec_dot_bf16_tb(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const uint16_t *x = vx, *y = vy;
    __m512 c = _mm512_setzero_ps();
    const unsigned int csr = daz_ftz_on();
    for (int l = 0; l < n; l += 32) c = dpbf16(c, x + l, y + l);
    _mm_setcsr(csr);
    *s = lle512_reduce(c);
}

/* tinyBLAS's order for nr (<= 4) activation rows and nw (<= 4) weight rows at once: out[r * ldo + j].
 * LOAD(T pointer) gives 16 floats; bf16 (STEP 32) splits each 32 values into odd and even floats */
#define TB_BLOCK(NAME, T, STEP)                                                                               \
    LLE_INLINE void tb_block_##NAME(int k, const uint8_t *w, size_t ws, const uint8_t *av, size_t as, const int nr, \
                                    const int nw, float *out, size_t ldo) {                                   \
        __m512 acc[4][4];                                                                                     \
        for (int r = 0; r < nr; r++)                                                                          \
            for (int j = 0; j < nw; j++) acc[r][j] = _mm512_setzero_ps();                                     \
        for (int l = 0; l < k; l += STEP) {                                                                   \
            TB_WEIGHTS_##NAME                                                                                 \
            for (int r = 0; r < nr; r++) {                                                                    \
                const T *y = (const T *)(av + (size_t)r * as) + l;                                            \
                TB_MADD_##NAME                                                                                \
            }                                                                                                 \
        }                                                                                                     \
        for (int r = 0; r < nr; r++)                                                                          \
            for (int j = 0; j < nw; j++) out[(size_t)r * ldo + j] = lle512_reduce(acc[r][j]);                     \
    }

#define TB_WEIGHTS_f32 __m512 wv[4]; for (int j = 0; j < nw; j++) wv[j] = _mm512_loadu_ps((const float *)(w + (size_t)j * ws) + l);
#define TB_MADD_f32 const __m512 yv = _mm512_loadu_ps(y); for (int j = 0; j < nw; j++) acc[r][j] = _mm512_fmadd_ps(wv[j], yv, acc[r][j]);
#define TB_WEIGHTS_f16 __m512 wv[4]; for (int j = 0; j < nw; j++) wv[j] = LLE512_LDH((const lle_half *)(w + (size_t)j * ws) + l);
#define TB_MADD_f16 const __m512 yv = LLE512_LDH(y); for (int j = 0; j < nw; j++) acc[r][j] = _mm512_fmadd_ps(wv[j], yv, acc[r][j]);
#define TB_WEIGHTS_bf16                                                                                       \
    __m512 wo[4], we[4];                                                                                      \
    for (int j = 0; j < nw; j++) {                                                                            \
        const __m512i v = _mm512_loadu_si512((const void *)((const uint16_t *)(w + (size_t)j * ws) + l));     \
        wo[j] = bf16_odd(v);                                                                                  \
        we[j] = bf16_even(v);                                                                                 \
    }
#define TB_MADD_bf16                                                                                          \
    const __m512i yi = _mm512_loadu_si512((const void *)y);                                                   \
    const __m512 yo = bf16_odd(yi), ye = bf16_even(yi);                                                       \
    for (int j = 0; j < nw; j++) acc[r][j] = _mm512_fmadd_ps(we[j], ye, _mm512_fmadd_ps(wo[j], yo, acc[r][j]));

TB_BLOCK(f32, float, 16)
TB_BLOCK(f16, lle_half, 16)
TB_BLOCK(bf16, uint16_t, 32)

/* tile_batch: weight rows four at a time (then one by one), each block with constant row counts so
 * that the accumulators stay in registers */
#define TILE_BATCH(NAME, CSR)                                                                                 \
    LLE_INLINE void tile_batch_##NAME##_nr(int k, const uint8_t *w, size_t ws, int nc, const uint8_t *av, size_t as, \
                                           const int nr, float *out, size_t ldo) {                            \
        int j = 0;                                                                                            \
        for (; j + 4 <= nc; j += 4) tb_block_##NAME(k, w + (size_t)j * ws, ws, av, as, nr, 4, out + j, ldo);  \
        for (; j < nc; j++) tb_block_##NAME(k, w + (size_t)j * ws, ws, av, as, nr, 1, out + j, ldo);          \
    }                                                                                                         \
    static void tile_batch_##NAME(int k, const void *w, size_t ws, int nc, const void *av, size_t as,         \
                                  const float *sc, int nr, float *out, size_t ldo) {                          \
        (void)sc;                                                                                             \
        const unsigned int csr = CSR ? daz_ftz_on() : 0;                                                     \
        switch (nr) {                                                                                         \
        case 1: tile_batch_##NAME##_nr(k, w, ws, nc, av, as, 1, out, ldo); break;                             \
        case 2: tile_batch_##NAME##_nr(k, w, ws, nc, av, as, 2, out, ldo); break;                             \
        case 3: tile_batch_##NAME##_nr(k, w, ws, nc, av, as, 3, out, ldo); break;                             \
        default: tile_batch_##NAME##_nr(k, w, ws, nc, av, as, 4, out, ldo); break;                            \
        }                                                                                                     \
        if (CSR) _mm_setcsr(csr);                                                                             \
    }

TILE_BATCH(f32, 0)
TILE_BATCH(f16, 0)
TILE_BATCH(bf16, 1)

/* IQ4_NL, one row: the AVX2 kernel (ggml's AVX2 code, which its AVX-512 build also runs), except
 * that the AVX-512 build fuses the odd last block's `sumf += d * sumi` into one FMA */
static void vec_dot_iq4_nl(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const block_iq4_nl *x = vx;
    const block_q8_0 *y = vy;
    const int nb = n / QK;
    const __m128i values128 = _mm_loadu_si128((const __m128i *)lle_kvalues_iq4nl);
    const __m128i m4b = _mm_set1_epi8(0x0f);
    __m256 accum1 = _mm256_setzero_ps(), accum2 = _mm256_setzero_ps();
    int ib = 0;
    for (; ib + 1 < nb; ib += 2) {
        const __m128i q4bits_1 = _mm_loadu_si128((const __m128i *)x[ib + 0].qs);
        const __m128i q4bits_2 = _mm_loadu_si128((const __m128i *)x[ib + 1].qs);
        const __m256i q4b_1 = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_shuffle_epi8(values128, _mm_and_si128(q4bits_1, m4b))),
                                                      _mm_shuffle_epi8(values128, _mm_and_si128(_mm_srli_epi16(q4bits_1, 4), m4b)), 1);
        const __m256i q4b_2 = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_shuffle_epi8(values128, _mm_and_si128(q4bits_2, m4b))),
                                                      _mm_shuffle_epi8(values128, _mm_and_si128(_mm_srli_epi16(q4bits_2, 4), m4b)), 1);
        const __m256 p_1 = dot_i8_float(q4b_1, _mm256_loadu_si256((const __m256i *)y[ib + 0].qs));
        const __m256 p_2 = dot_i8_float(q4b_2, _mm256_loadu_si256((const __m256i *)y[ib + 1].qs));
        accum1 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(y[ib + 0].d) * h2f(x[ib + 0].d)), p_1, accum1);
        accum2 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(y[ib + 1].d) * h2f(x[ib + 1].d)), p_2, accum2);
    }
    float sumf = hsum_float_8(_mm256_add_ps(accum1, accum2));
    for (; ib < nb; ++ib) {
        const float d = h2f(y[ib].d) * h2f(x[ib].d);
        int sumi = 0;
        for (int j = 0; j < QK / 2; ++j)
            sumi += y[ib].qs[j] * lle_kvalues_iq4nl[x[ib].qs[j] & 0xf] + y[ib].qs[j + QK / 2] * lle_kvalues_iq4nl[x[ib].qs[j] >> 4];
        sumf = fmaf(d, (float)sumi, sumf);
    }
    *s = sumf;
}

/* ---------------------------------------------------------------- several rows (batched decode) */
/* The AVX2 rows kernels (gemv_rows_avx2.inc) with two activation rows per 512-bit register: row 2p
 * in the low half, row 2p + 1 in the high half, each half performing that kernel's 8-lane steps
 * (vpdpbusd for maddubs + madd: the same integers, no pair here reaches maddubs' saturation; the
 * row's d = dx * dy lane broadcast by a permute instead of a load), so every row's value is the
 * one-row gemv's. An odd last row fills both halves and is stored once. */

/* [32 bytes at lo | 32 bytes at hi] */
LLE_INLINE __m512i rows_pair256(const void *lo, const void *hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)lo)),
                              _mm256_loadu_si256((const __m256i *)hi), 1);
}

/* [v[2p] x 8 | v[2p + 1] x 8] from the 8 per-row floats v */
LLE_INLINE __m512 rows_pair_lanes(__m256 v, int p) {
    const __m512i idx = _mm512_inserti64x4(_mm512_set1_epi32(2 * p), _mm256_set1_epi32(2 * p + 1), 1);
    return _mm512_permutexvar_ps(idx, _mm512_castps256_ps512(v));
}

LLE_INLINE float rows_half_sum(__m512 v, int r) {
    return hsum_float_8(r % 2 ? hi256_ps(v) : _mm512_castps512_ps256(v));
}

/* [qx | qx]: the block's signed weights twice */
#define X2_Q8_0(b) _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b).qs))
#define X2_Q4_0(b) _mm512_sub_epi8(nibbles_x2((b).qs), _mm512_set1_epi8(8))

/* signed weights against Q8_0: acc[r] += (dx * dy[r]) * sum4(|qx| * sign(qy[r], qx)) */
#define ROWS512_Q80(NAME, WBLOCK, X2)                                                                        \
    LLE_INLINE void rows_##NAME(int k, const void *w, size_t ws, int nr, const void *a, size_t as_stride,   \
                                const float *sc, const int n, float *out, size_t ldo) {                      \
        const int nb = k / QK, np = (n + 1) / 2;                                                              \
        for (int j = 0; j < nr; j++) {                                                                        \
            const WBLOCK *x = (const WBLOCK *)((const uint8_t *)w + (size_t)j * ws);                          \
            __m512 acc[LLE_GEMV_ROWS / 2];                                                                    \
            for (int p = 0; p < np; p++) acc[p] = _mm512_setzero_ps();                                        \
            for (int ib = 0; ib < nb; ++ib) {                                                                 \
                lle_prefetch_weight((const char *)(x + ib) + LLE_PREFETCH);                         \
                const __m256 dd = _mm256_mul_ps(_mm256_set1_ps(h2f(x[ib].d)), _mm256_loadu_ps(sc + 8 * ib));  \
                const __m512i qx = X2(x[ib]);                                                                 \
                const __m512i ax = _mm512_abs_epi8(qx);                                                       \
                const lle_mask64 neg = _mm512_movepi8_mask(qx);                                               \
                for (int p = 0; p < np; p++) {                                                                \
                    const int r1 = 2 * p + 1 < n ? 2 * p + 1 : 2 * p;                                         \
                    const block_q8_0 *y0 = (const block_q8_0 *)((const uint8_t *)a + (size_t)(2 * p) * as_stride); \
                    const block_q8_0 *y1 = (const block_q8_0 *)((const uint8_t *)a + (size_t)r1 * as_stride); \
                    __m512i sy = rows_pair256(y0[ib].qs, y1[ib].qs);                                          \
                    sy = _mm512_mask_sub_epi8(sy, neg, _mm512_setzero_si512(), sy);                           \
                    const __m512 f = lle512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ax, sy));  \
                    acc[p] = _mm512_fmadd_ps(rows_pair_lanes(dd, p), f, acc[p]);                              \
                }                                                                                             \
            }                                                                                                 \
            for (int r = 0; r < n; r++) out[(size_t)r * ldo + j] = rows_half_sum(acc[r / 2], r);              \
        }                                                                                                     \
    }

ROWS512_Q80(q8_0, block_q8_0, X2_Q8_0)
ROWS512_Q80(q4_0, block_q4_0, X2_Q4_0)

/* Q4_1 x Q8_1: acc[r] += (dx * dy[r]) * sum4(qx * qy[r]); summs[r] = fmaf(mx, sy[r], summs[r]).
 * Weight rows four at a time (the last ones alone): each activation pair's load serves the four,
 * and their accumulation chains are independent, so two or four activation rows are not held to
 * one FMA latency per block (1536 x 576, in cache, 2 threads: 4 rows 50.5 -> 41.9 us, 8 rows 85 ->
 * 75; from memory the same). Per row the arithmetic is still the one-row gemv's. */
#define Q4_1_ROWS_BODY(NW)                                                                                     \
    do {                                                                                                      \
        __m512 acc[4][LLE_GEMV_ROWS / 2];                                                                     \
        __m256 summs[4];                                                                                      \
        for (int q = 0; q < NW; q++) {                                                                        \
            summs[q] = _mm256_setzero_ps();                                                                   \
            for (int p = 0; p < np; p++) acc[q][p] = _mm512_setzero_ps();                                     \
        }                                                                                                     \
        for (int ib = 0; ib < nb; ++ib) {                                                                     \
            __m256 dd[4];                                                                                     \
            __m512i qx[4];                                                                                    \
            for (int q = 0; q < NW; q++) {                                                                    \
                lle_prefetch_weight((const char *)(x[q] + ib) + LLE_PREFETCH);                      \
                const __m128 dm = h2f_pair(&x[q][ib].d);                                                      \
                dd[q] = _mm256_mul_ps(_mm256_broadcastss_ps(dm), _mm256_loadu_ps(sc + 8 * ib));               \
                summs[q] = _mm256_fmadd_ps(_mm256_broadcastss_ps(_mm_movehdup_ps(dm)), _mm256_loadu_ps(ss + 8 * ib), summs[q]); \
                qx[q] = nibbles_x2(x[q][ib].qs);                                                              \
            }                                                                                                 \
            for (int p = 0; p < np; p++) {                                                                    \
                const int r1 = 2 * p + 1 < n ? 2 * p + 1 : 2 * p;                                             \
                const block_q8_1 *y0 = (const block_q8_1 *)((const uint8_t *)a + (size_t)(2 * p) * as_stride); \
                const block_q8_1 *y1 = (const block_q8_1 *)((const uint8_t *)a + (size_t)r1 * as_stride);     \
                const __m512i qy = rows_pair256(y0[ib].qs, y1[ib].qs);                                        \
                for (int q = 0; q < NW; q++) {                                                                \
                    const __m512 f = lle512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), qx[q], qy)); \
                    acc[q][p] = _mm512_fmadd_ps(rows_pair_lanes(dd[q], p), f, acc[q][p]);                     \
                }                                                                                             \
            }                                                                                                 \
        }                                                                                                     \
        for (int q = 0; q < NW; q++) {                                                                        \
            float sm[8] __attribute__((aligned(32)));                                                         \
            _mm256_store_ps(sm, summs[q]);                                                                    \
            for (int r = 0; r < n; r++) out[(size_t)r * ldo + j + q] = rows_half_sum(acc[q][r / 2], r) + sm[r]; \
        }                                                                                                     \
    } while (0)

LLE_INLINE void rows_q4_1(int k, const void *w, size_t ws, int nr, const void *a, size_t as_stride,
                          const float *sc, const int n, float *out, size_t ldo) {
    const int nb = k / QK, np = (n + 1) / 2;
    const float *ss = sc + 8 * (size_t)nb;
    int j = 0;
    for (; j + 3 < nr; j += 4) {
        const block_q4_1 *x[4];
        for (int q = 0; q < 4; q++) x[q] = (const block_q4_1 *)((const uint8_t *)w + (size_t)(j + q) * ws);
        Q4_1_ROWS_BODY(4);
    }
    for (; j < nr; j++) {
        const block_q4_1 *x[4] = {(const block_q4_1 *)((const uint8_t *)w + (size_t)j * ws)};
        Q4_1_ROWS_BODY(1);
    }
}

LLE_ROWS_DISPATCH(q8_0)
LLE_ROWS_DISPATCH(q4_0)
LLE_ROWS_DISPATCH(q4_1)

/* ---------------------------------------------------------------- registration */

/* the registration runs on every x86 CPU at start-up: compiled for the baseline, not AVX-512 (GCC
 * copies the kernel table with zmm moves otherwise) */
#if !defined(LLE_AVX512_SIMDE)
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif

/* the AVX2 entry of a type with some slots replaced: the slots not replaced keep AVX2's kernels,
 * which compute the same values (a type's kernels are taken from one tier, see api.c) */
static lle_kernels from_avx2(int t) { return lle_kernels_avx2[t]; }

void LLE_AVX512_REGISTER(void) {
    lle_kernels *t = LLE_AVX512_TABLE;
    lle_kernels k;
    k = from_avx2(T_Q4_0); k.vec_dot = vec_dot_q4_0; k.gemv = gemv_q4_0; k.gemv_rows = gemv_rows_q4_0; k.tile = tile_q4_0; k.tile_rows = 8; t[T_Q4_0] = k;
    k = from_avx2(T_Q5_0); k.vec_dot = vec_dot_q5_0; k.gemv = gemv_q5_0; k.tile = tile_q5_0; k.tile_rows = 8; t[T_Q5_0] = k;
    k = from_avx2(T_Q8_0); k.vec_dot = vec_dot_q8_0; k.gemv = gemv_q8_0; k.gemv_rows = gemv_rows_q8_0; k.tile = tile_q8_0; k.tile_rows = 8;
    k.packed = packed_q8_0; k.packed_layout = LLE_PK_INTERLEAVED; k.packed_prep = prep_q8_0; k.packed_prep_bytes = LLE_PK_Q80_PREP; t[T_Q8_0] = k;
    k = from_avx2(T_Q4_1); k.vec_dot = vec_dot_q4_1; k.gemv = gemv_q4_1; k.gemv_rows = gemv_rows_q4_1; k.tile = tile_q4_1; k.tile_rows = 8; k.packed = packed_q4_1;
    k.packed_layout = LLE_PK_INTERLEAVED; k.packed_prep = prep_q4_1; k.packed_prep_bytes = 8; t[T_Q4_1] = k;
    k = from_avx2(T_Q4_K); k.vec_dot_r8 = vec_dot_q4_K_r8; k.packed = packed_q4_K; t[T_Q4_K] = k;
    k = from_avx2(T_Q6_K); k.vec_dot = vec_dot_q6_K; k.tile_tiled = tile_q6_K_tiled; k.packed = packed_q6_K; t[T_Q6_K] = k;
    /* the float types and IQ4_NL: ggml's AVX-512 build's orders, which differ from its AVX2 build's */
    k = from_avx2(T_F32); k.vec_dot = vec_dot_f32; k.gemv_rows = gemv_rows_f32; k.vec_dot_batch = vec_dot_f32_tb; k.tile_batch = tile_batch_f32; k.batch_k = 16; t[T_F32] = k;
    k = from_avx2(T_F16); k.vec_dot = vec_dot_f16; k.gemv_rows = gemv_rows_f16; k.vec_dot_batch = vec_dot_f16_tb; k.tile_batch = tile_batch_f16; k.batch_k = 16; t[T_F16] = k;
    k = from_avx2(T_BF16); k.vec_dot = vec_dot_bf16; k.gemv_rows = gemv_rows_bf16; k.vec_dot_batch = vec_dot_bf16_tb;
    k.tile_batch = tile_batch_bf16; k.batch_k = 32; t[T_BF16] = k;
    k = from_avx2(T_IQ4_NL); k.vec_dot = vec_dot_iq4_nl; t[T_IQ4_NL] = k;
    k = from_avx2(T_Q5_1); k.vec_dot = vec_dot_q5_1; k.gemv = gemv_q5_1; k.tile = tile_q5_1; k.tile_rows = 8; t[T_Q5_1] = k;
}

#else /* not x86 */

lle_kernels lle_kernels_avx512[T_COUNT];
void lle_register_avx512(void) {}

#endif
