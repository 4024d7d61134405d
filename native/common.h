/* Internal definitions shared by every llmedge native source file: GGUF block layouts (identical
 * to ggml's), half/bfloat16 conversions, the per-ISA kernel table types and the thread pool API.
 *
 * The block layouts and kernel arithmetic follow ggml (MIT, Copyright (c) 2023-2024 The ggml
 * authors) so that dot products agree with llama.cpp.
 */
#ifndef LLE_COMMON_H
#define LLE_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <math.h>

#include "llmedge_api.h"

#if defined(__GNUC__)
#define LLE_INLINE static inline __attribute__((always_inline))
#define LLE_RESTRICT __restrict__
#else
#define LLE_INLINE static inline
#define LLE_RESTRICT
#endif

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#define LLE_X86 1
#endif
#if defined(__aarch64__)
#define LLE_ARM64 1
#endif

/* a spin-wait's pause (the pool's workers, layer.c's phase waits) */
#if defined(LLE_X86)
#include <xmmintrin.h>
#define LLE_PAUSE() _mm_pause()
#elif defined(LLE_ARM64)
#define LLE_PAUSE() __asm__ __volatile__("yield")
#else
#define LLE_PAUSE() ((void)0)
#endif

/* The hint of every prefetch that runs ahead of a weight stream (x86 decode kernels), chosen per
 * process by lle_set_weight_prefetch: non-temporal (NTA) by default, T0 when the weights a step reads
 * fit in the last-level cache (the Python backend decides, see llmedge/backends/native.py).
 * - NTA: where the ~100 MB a step reads exceed the cache, T0 made them evict the K/V cache,
 *   activations and scales from L2/L3 on every step (SmolLM2 on a Zen 4 with 32 MB of L3, 1-sequence
 *   step minimum 4.33-4.65 -> 3.93-4.39 ms, 4 sequences 6.37-6.93 -> 5.57-5.82 ms).
 * - T0: where they fit, NTA kept them out of the L3 (an Intel L3 does not keep NTA lines), so every
 *   step read them from memory again (SmolLM2 on a Xeon with 300 MB of L3: 8.4 -> 3.3 ms per token).
 * The branch is on a flag that changes only between products, so it costs no measurable time. */
extern int lle_weights_cached;
extern int lle_kv_prefetch_on;  /* lle_set_kv_prefetch */
#if defined(LLE_X86)
#include <xmmintrin.h>
LLE_INLINE void lle_prefetch_weight(const void *p) {
    if (__atomic_load_n(&lle_weights_cached, __ATOMIC_RELAXED))
        _mm_prefetch((const char *)p, _MM_HINT_T0);
    else
        _mm_prefetch((const char *)p, _MM_HINT_NTA);
}
#endif

/* ---- GGML type ids (gguf-py GGMLQuantizationType) ---- */
enum {
    T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8, T_Q8_1 = 9,
    T_Q2_K = 10, T_Q3_K = 11, T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14, T_Q8_K = 15,
    T_IQ4_NL = 20, T_IQ4_XS = 23, T_BF16 = 30, T_COUNT = 40
};

enum { ISA_SCALAR = 0, ISA_AVX2 = 1, ISA_AVX512 = 2, ISA_NEON = 3, ISA_COUNT = 4 };

enum {
    LLE_CPU_AVX2 = 1 << 0, LLE_CPU_FMA = 1 << 1, LLE_CPU_F16C = 1 << 2, LLE_CPU_AVX512F = 1 << 3,
    LLE_CPU_AVX512BW = 1 << 4, LLE_CPU_AVX512VL = 1 << 5, LLE_CPU_AVX512VNNI = 1 << 6,
    LLE_CPU_AVX512BF16 = 1 << 7, LLE_CPU_NEON = 1 << 8, LLE_CPU_DOTPROD = 1 << 9,
    LLE_CPU_I8MM = 1 << 10, LLE_CPU_AVX512DQ = 1 << 11,
    LLE_CPU_INTEL = 1 << 12, LLE_CPU_AMD = 1 << 13 /* the vendor (the weight prefetch hint's default) */
};

#define QK 32
#define QK_K 256

typedef uint16_t lle_half;

typedef struct { lle_half d; uint8_t qs[QK / 2]; } block_q4_0;
typedef struct { lle_half d; lle_half m; uint8_t qs[QK / 2]; } block_q4_1;
typedef struct { lle_half d; uint8_t qh[4]; uint8_t qs[QK / 2]; } block_q5_0;
typedef struct { lle_half d; lle_half m; uint8_t qh[4]; uint8_t qs[QK / 2]; } block_q5_1;
typedef struct { lle_half d; int8_t qs[QK]; } block_q8_0;
typedef struct { lle_half d; lle_half s; int8_t qs[QK]; } block_q8_1;
typedef struct { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; lle_half d; lle_half dmin; } block_q2_K;
typedef struct { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; lle_half d; } block_q3_K;
typedef struct { lle_half d; lle_half dmin; uint8_t scales[12]; uint8_t qs[QK_K / 2]; } block_q4_K;
typedef struct { lle_half d; lle_half dmin; uint8_t scales[12]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; } block_q5_K;
typedef struct { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; lle_half d; } block_q6_K;
typedef struct { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; } block_q8_K;
typedef struct { lle_half d; uint8_t qs[QK / 2]; } block_iq4_nl;
typedef struct { lle_half d; uint16_t scales_h; uint8_t scales_l[QK_K / 64]; uint8_t qs[QK_K / 2]; } block_iq4_xs;

_Static_assert(sizeof(block_q4_0) == 18, "q4_0");
_Static_assert(sizeof(block_q4_1) == 20, "q4_1");
_Static_assert(sizeof(block_q5_0) == 22, "q5_0");
_Static_assert(sizeof(block_q5_1) == 24, "q5_1");
_Static_assert(sizeof(block_q8_0) == 34, "q8_0");
_Static_assert(sizeof(block_q8_1) == 36, "q8_1");
_Static_assert(sizeof(block_q2_K) == 84, "q2_K");
_Static_assert(sizeof(block_q3_K) == 110, "q3_K");
_Static_assert(sizeof(block_q4_K) == 144, "q4_K");
_Static_assert(sizeof(block_q5_K) == 176, "q5_K");
_Static_assert(sizeof(block_q6_K) == 210, "q6_K");
_Static_assert(sizeof(block_q8_K) == 292, "q8_K");
_Static_assert(sizeof(block_iq4_nl) == 18, "iq4_nl");
_Static_assert(sizeof(block_iq4_xs) == 136, "iq4_xs");

extern const int8_t lle_kvalues_iq4nl[16];

/* How Q8_0/Q8_1 activations are rounded: ggml's *_ref (1/d, half away from zero), its x86 AVX path
 * (127/amax, half to even) or its ARM NEON path (1/d, half to even). llama.cpp quantizes
 * activations with the path of the CPU it runs on; the default here is the host's. */
enum { LLE_ROUND_REF = 0, LLE_ROUND_X86 = 1, LLE_ROUND_ARM = 2 };
extern int lle_act_rounding;

/* ---- half and bfloat16 (bit-exact with ggml's scalar conversions) ---- */
LLE_INLINE float lle_f32_from_bits(uint32_t w) { float f; memcpy(&f, &w, 4); return f; }
LLE_INLINE uint32_t lle_f32_to_bits(float f) { uint32_t w; memcpy(&w, &f, 4); return w; }

LLE_INLINE float lle_fp16_to_fp32(lle_half h) {
    const uint32_t w = (uint32_t)h << 16;
    const uint32_t sign = w & UINT32_C(0x80000000);
    const uint32_t two_w = w + w;
    const uint32_t exp_offset = UINT32_C(0xE0) << 23;
    const float exp_scale = 0x1.0p-112f;
    const float normalized_value = lle_f32_from_bits((two_w >> 4) + exp_offset) * exp_scale;
    const uint32_t magic_mask = UINT32_C(126) << 23;
    const float magic_bias = 0.5f;
    const float denormalized_value = lle_f32_from_bits((two_w >> 17) | magic_mask) - magic_bias;
    const uint32_t denormalized_cutoff = UINT32_C(1) << 27;
    const uint32_t result = sign | (two_w < denormalized_cutoff ? lle_f32_to_bits(denormalized_value)
                                                                : lle_f32_to_bits(normalized_value));
    return lle_f32_from_bits(result);
}

LLE_INLINE lle_half lle_fp32_to_fp16(float f) {
    const float scale_to_inf = 0x1.0p+112f;
    const float scale_to_zero = 0x1.0p-110f;
    float base = (fabsf(f) * scale_to_inf) * scale_to_zero;
    const uint32_t w = lle_f32_to_bits(f);
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & UINT32_C(0x80000000);
    uint32_t bias = shl1_w & UINT32_C(0xFF000000);
    if (bias < UINT32_C(0x71000000)) bias = UINT32_C(0x71000000);
    base = lle_f32_from_bits((bias >> 1) + UINT32_C(0x07800000)) + base;
    const uint32_t bits = lle_f32_to_bits(base);
    const uint32_t exp_bits = (bits >> 13) & UINT32_C(0x00007C00);
    const uint32_t mantissa_bits = bits & UINT32_C(0x00000FFF);
    const uint32_t nonsign = exp_bits + mantissa_bits;
    return (lle_half)((sign >> 16) | (shl1_w > UINT32_C(0xFF000000) ? UINT16_C(0x7E00) : nonsign));
}

LLE_INLINE float lle_bf16_to_fp32(uint16_t h) { return lle_f32_from_bits((uint32_t)h << 16); }

/* the end of every x86 tier's vec_dot_bf16: the vector sum `sumf`, then the values past the last
 * full 32 (from `from` to n) one by one in double */
LLE_INLINE float lle_bf16_dot_finish(double sumf, const uint16_t *x, const uint16_t *y, int from, int n) {
    for (int i = from; i < n; i++) sumf += (double)(lle_bf16_to_fp32(x[i]) * lle_bf16_to_fp32(y[i]));
    return (float)sumf;
}

/* the end of every x86 tier's vec_dot_f32 (ggml_vec_dot_f32): vec.cpp's `sumf += x[i]*y[i]` over the
 * values past its SIMD steps (from `from` to n), as GCC compiles it (-O3, -ffp-contract=fast): an
 * in-order reduction vectorized by `v` products at a time (the narrowest vector: 4 in ggml's AVX2
 * build, 8 in its AVX-512 build), each product rounded and added in turn, then the last (n - from) % v
 * as a scalar epilogue contracted to fmas (read off both builds' libggml-cpu.so, 0.3.36) */
LLE_INLINE float lle_f32_dot_finish(float sumf, const float *x, const float *y, int from, int n, int v) {
    const int nv = from + ((n - from) & ~(v - 1));
    int i = from;
    for (; i < nv; i++) sumf += x[i] * y[i];  /* not fused (-ffp-contract=off) */
    for (; i < n; i++) sumf = fmaf(x[i], y[i], sumf);
    return sumf;
}

LLE_INLINE uint16_t lle_fp32_to_bf16(float s) {
    const uint32_t i = lle_f32_to_bits(s);
    if ((i & 0x7fffffff) > 0x7f800000) return (uint16_t)((i >> 16) | 64);
    return (uint16_t)((i + (0x7fff + ((i >> 16) & 1))) >> 16);
}

#define FP16(x) lle_fp16_to_fp32(x)

/* ---- kernel table ---- */
/* dequantize `k` values (k a multiple of the block size) */
typedef void (*lle_to_float_fn)(const void *LLE_RESTRICT x, float *LLE_RESTRICT y, int64_t k);
/* quantize `k` floats to the activation type */
typedef void (*lle_from_float_fn)(const float *LLE_RESTRICT x, void *LLE_RESTRICT y, int64_t k);
/* *s = dot(weight row vx, activation row vy) over k values */
typedef void (*lle_vec_dot_fn)(int k, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx,
                               const void *LLE_RESTRICT vy);
/* out[i*ldo + j] = dot(act row i, weight row j), i < nr (<= 4), j < nc; `sc`: the float block
 * scales of the 4-row activation group, interleaved by row (d[nb][4], then s[nb][4] for Q8_1) */
typedef void (*lle_tile_fn)(int k, const void *w, size_t w_stride, int nc, const void *a, size_t a_stride,
                            const float *sc, int nr, float *out, size_t ldo);

/* out[j] = dot(weight row j, act) for j < nr: the decode kernel. `as` holds float copies of the
 * activation block scales (d[nb], then s[nb] for Q8_1), made once per activation row by act_scales */
typedef void (*lle_gemv_fn)(int k, const void *w, size_t w_stride, int nr, const void *a, const float *as,
                            float *out);
/* the gemv of up to LLE_GEMV_ROWS activation rows at once, each row's arithmetic exactly the gemv's:
 * out[r * ldo + j] for r < n, j < nr; rows `as_stride` bytes apart, their float scales `sc`
 * interleaved by row (act_scales' d[nb], s[nb] of row r at sc[8 * ib + r], sc[8 * (nb + ib) + r];
 * the lanes of absent rows zero) */
#define LLE_GEMV_ROWS 8
typedef void (*lle_gemv_rows_fn)(int k, const void *w, size_t w_stride, int nr, const void *a, size_t as_stride,
                                 const float *sc, int n, float *out, size_t ldo);
/* gemv_rows_NAME (lle_gemv_rows_fn) from rows_NAME(..., n, ...), one instance per row count: with n a constant the accumulators stay in registers */
#define LLE_ROWS_DISPATCH(NAME)                                                                              \
    static void gemv_rows_##NAME(int k, const void *w, size_t ws, int nr, const void *a, size_t as_stride,  \
                                 const float *sc, int n, float *out, size_t ldo) {               \
        switch (n) {                                                                                         \
        case 1: rows_##NAME(k, w, ws, nr, a, as_stride, sc, 1, out, ldo); break;                         \
        case 2: rows_##NAME(k, w, ws, nr, a, as_stride, sc, 2, out, ldo); break;                         \
        case 3: rows_##NAME(k, w, ws, nr, a, as_stride, sc, 3, out, ldo); break;                         \
        case 4: rows_##NAME(k, w, ws, nr, a, as_stride, sc, 4, out, ldo); break;                         \
        case 5: rows_##NAME(k, w, ws, nr, a, as_stride, sc, 5, out, ldo); break;                         \
        case 6: rows_##NAME(k, w, ws, nr, a, as_stride, sc, 6, out, ldo); break;                         \
        case 7: rows_##NAME(k, w, ws, nr, a, as_stride, sc, 7, out, ldo); break;                         \
        default: rows_##NAME(k, w, ws, nr, a, as_stride, sc, 8, out, ldo); break;                        \
        }                                                                                                    \
    }

/* the float block scales of one activation row (activation types with f16 scales) */
typedef void (*lle_act_scales_fn)(int k, const void *a, float *scales);

/* A packed weight (native/packed.c): LLE_PACK_ROWS rows interleaved per group. out[r*ldo + 16*g + l]
 * = dot(act row r, weight row 16*g + l) for r < nr (<= 4), g < n_groups; `gemm` selects the order of
 * the rows (1: that of vec_dot_r8_gemm, whose activations come from from_float_r8; 0: vec_dot_r8) */
typedef void (*lle_packed_fn)(int k, const void *pw, int n_groups, const void *a, size_t a_stride, int nr,
                              int gemm, float *out, size_t ldo);
/* optional per-block values a packed kernel reads beside each quantized activation row (float
 * scales, offset corrections), computed once per product instead of once per weight group: the
 * caller gives each row LLE_PK_PREP_OFF(row bytes) + blocks * packed_prep_bytes bytes and calls
 * prep(k, row) after quantizing it, which writes them from LLE_PK_PREP_OFF(row bytes) on */
typedef void (*lle_packed_prep_fn)(int k, void *row);
#define LLE_PK_PREP_OFF(row_bytes) (((size_t)(row_bytes) + 63) & ~(size_t)63)

typedef struct {
    lle_to_float_fn to_float;
    lle_from_float_fn from_float;   /* only for activation types */
    lle_act_scales_fn act_scales;   /* only for activation types */
    /* only Q8_K: the quantizer of llama.cpp's repacked GEMM (ggml_quantize_mat_q8_K_4x8), which
     * settles an abs-max tie between signs differently */
    lle_from_float_fn from_float_r8;
    lle_vec_dot_fn vec_dot;         /* only for weight types */
    lle_gemv_fn gemv;               /* optional: several weight rows, one activation row */
    /* optional: `gemv` for several activation rows sharing each weight block (same per-row
     * arithmetic as the AVX2 gemv, which every x86 tier's gemv reproduces; float types, which have
     * no gemv: as their vec_dot) */
    lle_gemv_rows_fn gemv_rows;
    lle_tile_fn tile;               /* optional multi-row kernel */
    int tile_rows;                  /* activation rows per call of `tile` (0: 4; else a multiple of 4:
                                     * `sc` then holds the scales of consecutive 4-row groups) */
    /* optional dot product for several activation rows (llama.cpp uses llamafile's tinyBLAS there,
     * with another summation order); float types only when m % 4 == 0 and k % batch_k == 0 */
    lle_vec_dot_fn vec_dot_batch;
    lle_tile_fn tile_batch;         /* optional: vec_dot_batch's order for up to 4 activation rows */
    int batch_k;                    /* float types: the k multiple tinyBLAS needs (0: 8, its AVX2 width) */
    /* optional: llama.cpp's orders for repacked weights (CPU_REPACK), used when m % 8 == 0: its
     * GEMM's for the first n - n % 4 activation rows when n > 3, its GEMV's for the others */
    lle_vec_dot_fn vec_dot_r8;
    lle_vec_dot_fn vec_dot_r8_gemm;
    lle_tile_fn tile_r8_gemm;       /* 4-row tile of the GEMM order */
    /* optional: llama.cpp's tiled K-quant GEMM order, used for 8 or more activation rows */
    lle_vec_dot_fn vec_dot_tiled;
    lle_tile_fn tile_tiled;         /* 4-row tile of the tiled order */
    /* optional: the products of a packed copy of the weight (native/packed.c), same orders */
    lle_packed_fn packed;
    int packed_layout;  /* which layout `packed` reads (LLE_PK_INTERLEAVED, LLE_PK_SPLIT8) */
    lle_packed_prep_fn packed_prep;  /* optional, with packed_prep_bytes per activation block */
    int packed_prep_bytes;
} lle_kernels;

typedef struct {
    int block_size;
    int type_size;
    int vec_type;
    const char *name;
} lle_traits;

extern const lle_traits lle_type_traits[T_COUNT];
extern lle_kernels lle_kernels_scalar[T_COUNT];
extern lle_kernels lle_kernels_avx2[T_COUNT];
extern lle_kernels lle_kernels_avx512[T_COUNT];
extern lle_kernels lle_kernels_neon[T_COUNT];

void lle_register_scalar(void);
void lle_register_avx2(void);
void lle_register_avx512(void);
void lle_register_neon(void);
void lle_test_add_cpu_features(int features);  /* self-test only */

/* ---- packed weights (native/packed.c) ---- */
/* Q4_K, 16 rows per group; per 256-value block of the group (LLE_PK_Q4K_BLOCK bytes):
 *   d[16], dmin[16] (f16) | sc[8][16]: the 6-bit scale of sub-block s of row l | mn[4][16][2]: the
 *   mins of sub-blocks 2j and 2j+1 of row l | qs[32][64]: for quarter j (64 values) and i < 8, the 4
 *   bytes qs[32j + 4i ..] of each row l (low nibbles: values 64j + 4i.., high: 64j + 32 + 4i..) */
#define LLE_PACK_ROWS 16
#define LLE_PK_Q4K_D 0
#define LLE_PK_Q4K_DMIN 32
#define LLE_PK_Q4K_SC 64
#define LLE_PK_Q4K_MN 192
#define LLE_PK_Q4K_QS 320
#define LLE_PK_Q4K_BLOCK (320 + 32 * 64)
/* Q6_K, 16 rows per group, read by the tiled order only (8 or more activation rows); per block:
 *   d[16] (f16) | sc[16][16]: the int8 scale of sub-block s of row l | q[64][64]: for i < 64 the
 *   quants 4i..4i+3 of each row l as bytes in [0, 63] (the value plus 32) */
#define LLE_PK_Q6K_D 0
#define LLE_PK_Q6K_SC 32
#define LLE_PK_Q6K_Q 288
#define LLE_PK_Q6K_BLOCK (288 + 64 * 64)
/* Q4_1, 16 rows per group, read by every product (one order: vec_dot's); per 32-value block:
 *   d[16], m[16] (f16) | qs[4][64]: for c < 4 the 4 bytes qs[4c ..] of each row l (low nibbles:
 *   values 4c.., AVX2's lane c; high nibbles: values 16 + 4c.., its lane c + 4) */
#define LLE_PK_Q41_D 0
#define LLE_PK_Q41_M 32
#define LLE_PK_Q41_QS 64
#define LLE_PK_Q41_BLOCK (64 + 4 * 64)
/* Q8_0, 16 rows per group, read by every product (vec_dot's order). LLE_PK_INTERLEAVED (AVX-512), per
 * block: d[16] (f16) | qs[8][64]: for c < 8 the 4 bytes qs[4c ..] of each row l, plus 128 (XOR 0x80:
 * vpdpbusd's unsigned operand; the activation side subtracts 128 times its 4-byte sums). LLE_PK_SPLIT8
 * (AVX2): the halves' blocks one after the other (below), each half-block d[8] | qs[8][32], the bytes
 * as they are (vpsignb takes their signs). */
#define LLE_PK_Q80_D 0
#define LLE_PK_Q80_QS 32
#define LLE_PK_Q80_BLOCK (32 + 8 * 64)
/* its activation prep per block (AVX-512): float d, then int32 -128 * (sum of bytes 4c..4c+3) for c < 8 */
#define LLE_PK_Q80_PREP 36
/* A group's two 8-row halves: LLE_PK_INTERLEAVED as above (a 512-bit register takes a chunk of the 16
 * rows); LLE_PK_SPLIT8 (AVX2) the first half's blocks, then the second's, each half-block d[8], m[8] |
 * qs[4][32], so that reading one half streams only its own bytes (read interleaved, the first half's
 * pass pulled every line from memory and the second computed while memory idled). Same bytes per group. */
#define LLE_PK_INTERLEAVED 0
#define LLE_PK_SPLIT8 1
#define LLE_PK_Q41_HBLOCK (32 + 4 * 32)
#define LLE_PK_Q80_HBLOCK (16 + 8 * 32)
/* Q4_1 rows of more blocks than this (k > 32768) are not packed (a kernel keeps per-row block scales
 * on its stack) */
#define LLE_PK_Q41_MAX_BLOCKS 1024
/* the packed copy of weight w (m rows of k values, row stride ws) if one was made, else NULL */
const void *lle_packed_find(int type, int layout, const void *w, size_t ws, int64_t m, int64_t k);
/* bytes of one packed group of LLE_PACK_ROWS rows */
int64_t lle_packed_group_bytes(int type, int64_t k);
void lle_pack_rows(int type, int layout, const void *w, size_t ws, int64_t m, int64_t k, void *dst);
int lle_packed_add(int type, int layout, const void *w, size_t ws, int64_t m, int64_t k, int release_source);
void lle_packed_remove(const void *w);
int lle_packed_entries(void);
int lle_packed_get_rows(int type, const void *w, size_t ws, int64_t k, const int *ids, int64_t n,
                        lle_to_float_fn tf, float *out);

/* ---- float op kernels (per ISA) ---- */

/* one attention problem: q [n, n_head, d] over t cells of k/v (f16 or f32, strides in elements) */
typedef struct {
    const float *q; int64_t n, n_head, d;
    const uint8_t *k, *v; int kv_f16; int64_t t, n_kv;
    int64_t ks_t, ks_h, vs_t, vs_h;
    const int *q_pos, *k_pos;
    float scale; int window; float softcap;
    float *out;
    /* 1: k and v hold exact f32 copies of an f16 cache (read as f32, lle_attention_impl makes them for
     * prefill); kv_f16 still rounds Q and the probabilities to f16. Only with n >= 2 and d % 8 == 0 */
    int kv_wide;
    /* NULL, or what a one-row problem's cache and Q still need before its attention (lle_attn_prep) */
    const struct lle_attn_prep *prep;
} lle_attn_args;

/* A decode row's last steps before its attention, done per KV head by the task that then reads that
 * head (lle_attention_rows_impl; layer.c's decode steps): RoPE of the row's Q heads of the KV head
 * (then Q scaling) and of its K head, and the store of that K and V head at the row's cell. The same
 * operations, element by element, as lle_rope_impl, lle_scale_impl and the stack's store_rows over
 * the whole row, so the values are theirs; they run in the pool job beside the attention instead of
 * one thread doing every row's before it. */
typedef struct lle_attn_prep {
    const float *table; int n_rot, neox; float q_scale;  /* the row's RoPE table (lle_rope_table_impl) */
    float *q, *k; const float *v;                        /* the row's Q [n_head][d], K and V [n_kv][d] */
    void *k_cells, *v_cells; int kv_f16; int64_t cell;   /* cells [cell][n_kv * d], f16 or f32 */
} lle_attn_prep;

/* the RoPE tables of n rows at positions pos (n x n_rot floats; lle_rope_impl's, kept until the next
 * call with other parameters or positions; NULL: out of memory or invalid) */
const float *lle_rope_table_impl(const int *pos, long long n, int n_rot, float freq_base, float freq_scale,
                                 const float *freq_factors, float attn_factor, float ext_factor, float corr_lo,
                                 float corr_hi);

/* query heads attn_group takes at once */
#define LLE_ATTN_GROUP 4

/* cells past the first lane's from which AVX-512 decode V sums keep their 64 lanes in scratch instead
 * of summing them 4 by 4 in registers (v_sum_tree, ops_avx2.c; lle_set_attn_tree_max sets it) */
#define LLE_ATTN_TREE_MAX 1024
extern int64_t lle_attn_tree_max;

/* floats of scratch one attention row needs */
LLE_INLINE int64_t lle_attn_scratch_floats(int64_t t, int64_t d) {
    const int64_t tp = (t + 31) & ~(int64_t)31;
    return 2 * tp + 65 * (d + 8) + 64;  /* scores, Q, up to 64 V partial sums per value (AVX-512 decode) */
}

/* Decode attention over a long cache (ops.c, attn_wide): one query row of one sequence, every head, in
 * three pool jobs: the scores and the exponentials split by cells, then the V sums by (KV head, half
 * of ggml's 32 lanes). attn_group's one task per KV head leaves 2 threads unevenly loaded (SmolLM2's
 * 3 KV heads) and reads each head's rows as strided 128-byte runs; here the scores read the
 * cell-major cache front to back. Every value is attn_group's, bit for bit: the same scores per cell,
 * the same exponentials and the same order of their sum, the same probabilities, the same 64 V lanes
 * with each lane's cells added in order. The AVX-512 tier's only (ggml's AVX-512 orders). */
#define LLE_ATTN_WIDE_CELLS 256 /* cells per scores / exponentials task (a multiple of 32) */
#define LLE_ATTN_WIDE_MIN 1024  /* cells from which decode rows take it (lle_set_attn_wide_min) */
#define LLE_ATTN_WIDE_MAX_HEADS 64
typedef struct {
    const lle_attn_args *a;  /* n == 1, f16 cache read as f16, d % 64 == 0, heads per KV head <= LLE_ATTN_GROUP */
    int64_t tp, n_blocks;    /* t rounded up to 32; cell blocks of LLE_ATTN_WIDE_CELLS */
    float *qc;               /* n_head x d: Q rounded to f16, as floats */
    float *w;                /* n_head x tp: scores, then exponentials */
    float *csum;             /* n_head x tp / 8: each 16-cell chunk's float sum of exponentials (j / 16) */
    float *acc;              /* n_head x 64 x d: the V sums' 64 lanes */
    float *bmax;             /* n_blocks x n_head: each block's largest score per head */
    int64_t *bjlo, *bjhi;    /* n_blocks: each block's first and last visible cell (t and -1: none) */
    float *inv;              /* n_head: 1 / the sum of exponentials (0: no visible cell) */
    float *maxv;             /* n_head */
    int *v_left;             /* n_kv: V tasks of each KV head not ended (the last finishes its heads) */
    int64_t jlo, jhi, c0, c1, jb;
} lle_attn_wide;

typedef struct {
    /* y = silu(x) * g  or  gelu(x) * g over n values */
    void (*swiglu)(int n, float *y, const float *x, const float *g);
    void (*geglu)(int n, float *y, const float *x, const float *g);
    /* y[i] = exp(x[i] - max), returns sum (double accumulation) */
    double (*softmax_exp)(int n, float *y, const float *x, float max);
    /* rotate one head: pairs (i0, i0+1) or NeoX (i0/2, i0/2 + n_rot/2) by cache[i0] = cos, cache[i0+1] = sin */
    void (*rope_head)(const float *src, float *dst, const float *cache, int n_rot, int neox);
    /* attention of query row i, head h into a->out (scratch: lle_attn_scratch_floats floats) */
    void (*attn_row)(const lle_attn_args *a, int64_t i, int64_t h, float *scratch);
    /* y[i] = half x[i] as float (exact) */
    void (*f16_to_f32)(int64_t n, const lle_half *x, float *y);
    /* attention of query row i, heads h0 .. h0 + nh - 1 of one KV head (nh <= LLE_ATTN_GROUP), each
     * exactly as attn_row; scratch: nh attn_row scratches `per` floats apart. NULL: head by head */
    void (*attn_group)(const lle_attn_args *a, int64_t i, int64_t h0, int nh, float *scratch, int64_t per);
    /* y[i] = x[i] rounded to half, to nearest even (lle_fp32_to_fp16's values; the K/V cache writes) */
    void (*f32_to_f16)(int64_t n, const float *x, lle_half *y);
    /* lle_attn_wide's phases (NULL: none): the scores of cell block b (bmax, bjlo, bjhi of b); the
     * exponentials of block b's 16-cell chunks in [c0, c1) and their sums (maxv set); the V sums of KV
     * head g's query heads in lanes 16 * part .. 16 * part + 15 (inv set), the last of g's four tasks
     * writing its heads' outputs */
    void (*wide_scores)(lle_attn_wide *p, int64_t b);
    void (*wide_exp)(lle_attn_wide *p, int64_t b);
    void (*wide_v)(lle_attn_wide *p, int64_t g, int part);
    /* prompt attention over an f16 cache reads f32 copies of it (kv_wide) for head sizes d that are a
     * multiple of this: those whose K.Q takes the tier's tinyBLAS order (8 on AVX2, 16 on AVX-512) */
    int kv_wide_align;
} lle_op_kernels;

extern lle_op_kernels lle_ops_scalar;
extern lle_op_kernels lle_ops_avx2;
extern lle_op_kernels lle_ops_avx512;  /* ggml's AVX-512 build's values (SiLU, softmax, attention differ from AVX2's) */
extern const lle_op_kernels *lle_ops;   /* selected */

/* gelu lookup table (ggml GGML_GELU_FP16): gelu(fp16 x) rounded to fp16 */
extern lle_half lle_gelu_table[65536];

/* ---- thread pool ---- */
typedef void (*lle_task_fn)(void *ctx, int ith, int nth);
void lle_pool_run(lle_task_fn fn, void *ctx);   /* run fn on all threads (caller is thread 0) */
int lle_pool_threads(void);
int lle_pool_create(int n_threads);
void lle_pool_destroy(void);
void lle_pool_set_spin_us(int us);
/* the median round trip (ns) of a cache line between thread 0 and a worker, over batches of `rounds`;
 * 0 with one thread or when no worker joined */
double lle_pool_round_trip_ns(int rounds);
void lle_pool_atfork_child(void);

/* dynamic scheduling inside one pool run: counters live in the task context */
LLE_INLINE int64_t lle_next_chunk(int64_t *counter) {
    return __atomic_fetch_add(counter, 1, __ATOMIC_RELAXED);
}

/* The chunks of one pool job, handed out without one counter that every thread hits. The chunks are
 * split into contiguous ranges, one per thread: thread i takes its range's chunks front to back, with
 * an atomic on a cache line that no other thread touches while that range lasts, and then takes the
 * other ranges' chunks from their back. A shared counter costs a cache-line transfer between cores per
 * chunk (on a VM whose two vCPUs sit on different CCDs, ~200 ns each, thousands of times per decode
 * step), and it deals neighbouring chunks to different cores, so neither streams its weights in one
 * run. Each chunk still goes to exactly one thread, and whichever threads join take all of them. */
#define LLE_CHUNK_RANGES 8
typedef struct { _Alignas(64) uint64_t lohi; } lle_chunk_range;  /* (end << 32) | next */
typedef struct { lle_chunk_range r[LLE_CHUNK_RANGES]; int n; } lle_chunks;
/* n_chunks (< 2^32) over `nth` threads (the pool's, or 1 when the caller runs the job alone) */
void lle_chunks_init(lle_chunks *c, int64_t n_chunks, int nth);
/* thread ith's next chunk, or -1 when every chunk is taken */
int64_t lle_chunks_next(lle_chunks *c, int ith);
/* split `chunks` (n_chunks of them) and run fn on ctx: on the caller alone, or on the pool */
void lle_pool_run_chunks(lle_task_fn fn, void *ctx, lle_chunks *chunks, int64_t n_chunks, int alone);

/* ---- unlocked op bodies (the public lle_* wrappers take the library lock); for fused callers ---- */
int lle_matmul_impl(int type, const void *w, long long w_stride, long long m, long long k,
                    const float *x, long long n, float *out, long long ldo);
/* Background prefetch: memory the next op will read (the next layer's K/V cells), pulled into cache by
 * the matrix products' threads a few lines after each chunk, while the products keep the vector units
 * busy. lle_bg_prefetch_set (under the lock, before the products' pool jobs) replaces the pending
 * ranges (n = 0 clears them); lle_bg_prefetch_some is what a product task's thread ith calls between
 * chunks: each thread prefetches its own share of the lines, with a cursor no other thread touches. */
typedef struct { const void *p; size_t bytes; } lle_pf_range;
#define LLE_BG_MAX_RANGES 64
void lle_bg_prefetch_set(const lle_pf_range *r, int n);
void lle_bg_prefetch_some(int ith);

int lle_matmul_rows_impl(int type, const void *w, long long w_stride, long long m, long long k,
                         const float *x, long long n, float *out, long long ldo);
#define LLE_MAX_GROUP 4
/* one activation row times up to LLE_MAX_GROUP weights, in one pool job (bit-identical to separate calls) */
int lle_matvec_group_impl(const lle_weight *const *ws, int count, const float *x, float *const *outs);
/* n >= 1 activation rows times up to LLE_MAX_GROUP weights in one pool job, each product bit-identical
 * to lle_matmul_rows_impl's (a decode step's Q, K and V, or gate and up, of several sequences) */
int lle_matmul_rows_group_impl(const lle_weight *const *ws, int count, const float *x, long long n,
                               float *const *outs);
/* A product of a weight with n >= 2 activation rows, each row multiplied exactly as a one-row decode
 * (lle_matmul_rows_impl's kernels and chunks), split into pieces a caller's own pool job runs (layer.c's
 * decode layer): lle_mr_plan_init prepares it without the rows, lle_mr_plan_quantize puts row i in
 * place (when owns_act; a plan made with `prev` may read prev's rows instead), lle_mr_plan_chunk
 * multiplies chunk ch (of n_chunks) of the weight rows by every activation row. */
typedef struct {
    lle_vec_dot_fn vd; lle_gemv_fn gemv; lle_gemv_rows_fn gemv_rows;
    lle_packed_fn packed; const uint8_t *pw; int64_t gbytes;  /* a packed copy (see mm_ctx) */
    int type; const uint8_t *w; size_t ws; int64_t m; int k;
    const uint8_t *a; size_t as; int64_t n;
    const float *scales; int64_t scale_stride;
    const float *group_scales; int64_t group_stride;  /* gemv_rows: per 8-row group, interleaved by row */
    float *out; int64_t ldo;
    int64_t chunk, n_chunks;
    int owns_act;  /* its activation rows are its own (else prev's, or float rows read in place) */
} lle_mr_plan;
#define LLE_MR_SLOTS 8  /* plans whose activations live at once (each slot its own buffer) */
/* 0, or 1: float activations (read in place, not through a plan), or < 0: invalid / no memory */
int lle_mr_plan_init(lle_mr_plan *p, const lle_weight *w, long long n, float *out, int slot, const lle_mr_plan *prev);
void lle_mr_plan_quantize(const lle_mr_plan *p, const float *x, int64_t i);
void lle_mr_plan_chunk(const lle_mr_plan *p, int64_t ch);
int lle_rms_norm_impl(const float *x, const float *w, long long n, long long d, float eps, float *out);
int lle_rope_impl(const float *x, const int *pos, long long n, long long n_head, long long head_dim,
                  int n_rot, float freq_base, float freq_scale, int neox, const float *freq_factors,
                  float attn_factor, float ext_factor, float corr_lo, float corr_hi, float *out);
int lle_attention_impl(const float *q, long long n, long long n_head, long long d,
                       const void *k, const void *v, int kv_f16, long long t, long long n_kv,
                       long long k_stride_t, long long k_stride_h, long long v_stride_t, long long v_stride_h,
                       const int *q_pos, const int *k_pos, float scale, int window, float softcap, float *out);
/* several one-row attention problems (each a's n is 1: a decode row of one sequence, in its own
 * cache) in one pool job over every (problem, head): each row's numbers exactly as lle_attention_impl
 * computes it alone */
int lle_attention_rows_impl(const lle_attn_args *a, int count);
/* lle_attention_rows_impl in pieces for a caller's own pool job (layer.c's decode layer): the plan, then
 * its n_prep prep items (lle_attn_prep steps of one problem's KV head, where several tasks read that
 * head; else each task does its own), then each of its n_tasks tasks (nh heads of one problem) on
 * thread ith. whole: return 1 when the problems need more than such pieces (the long-cache path). */
typedef struct {
    const lle_attn_args *a; int count; int64_t n_head; int nh;
    float *scratch; int64_t scratch_per_thread, per_head;
    int prep;  /* each task first does its KV head's lle_attn_prep steps (nh is the heads per KV head) */
    int64_t n_tasks, work, n_prep;
} lle_attn_rows_plan;
int lle_attn_rows_plan_init(lle_attn_rows_plan *c, const lle_attn_args *a, int count, int whole);
void lle_attn_rows_prep(const lle_attn_rows_plan *c, int64_t item);
void lle_attn_rows_task(const lle_attn_rows_plan *c, int ith, int64_t task);
/* rms_norm of n rows on the calling thread (lle_rms_norm_impl's values) */
void lle_rms_norm_serial(const float *x, const float *w, long long n, long long d, float eps, float *out);
int lle_glu_impl(const float *gate, const float *up, long long n, long long row, int kind, float *out);
/* lle_glu_impl's values (kind 0 or 1, n a multiple of row) on the calling thread */
void lle_glu_serial(const float *gate, const float *up, long long n, long long row, int kind, float *out);
int lle_add_impl(const float *a, const float *b, long long n, float *out);
int lle_scale_impl(const float *x, float s, long long n, float *out);
void lle_lock(void);
void lle_unlock(void);
void lle_ensure_init(void);

#endif
