/* Stand-alone self-test of the SIMD kernels against the scalar ones, for CPUs (or emulators such
 * as qemu-aarch64) where the Python test-suite does not run. Not part of llmedge._native.
 *
 *   cc -O2 -pthread native/[a-z]*.c -lm -o selftest && ./selftest      (this file included)
 *   aarch64-linux-gnu-gcc -O2 -static -pthread native/[a-z]*.c -lm -o selftest && qemu-aarch64 ./selftest
 *
 * For every ISA this CPU can run: activation quantization must equal the scalar bytes exactly;
 * each weight type's dot product must agree with the scalar one to float rounding; the matmul
 * driver (decode and prefill paths) must reproduce that ISA's own dot product bit for bit; the
 * float ops must agree with the scalar ones, and each ISA's attention paths (row, grouped heads, wide)
 * with each other bit for bit. The AVX-512 tier's products equal the AVX2 tier's bit for bit; its
 * float ops follow ggml's AVX-512 build instead (tests/test_native_kernels.py checks them against
 * that build's outputs). Exit status 0 when everything passes.
 */
#include "common.h"

#include <stdio.h>
#include <stdlib.h>

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}
static float rndf(void) { return (float)(rnd() >> 8) / 8388608.0f - 1.0f; } /* [-1, 1) */

static int failures = 0;
#define CHECK(cond, ...)                            \
    do {                                            \
        if (!(cond)) {                              \
            if (failures++ < 20) {                  \
                printf("FAIL: " __VA_ARGS__);       \
                printf("\n");                       \
            }                                       \
        }                                           \
    } while (0)

/* offsets of the f16 scales in a block, to keep random weights finite and moderate */
static void f16_fields(int t, int *off, int *n) {
    *n = 0;
    switch (t) {
    case T_Q4_0: case T_Q5_0: case T_Q8_0: case T_IQ4_NL: case T_IQ4_XS: off[(*n)++] = 0; break;
    case T_Q4_1: case T_Q5_1: case T_Q4_K: case T_Q5_K: off[(*n)++] = 0; off[(*n)++] = 2; break;
    case T_Q2_K: off[(*n)++] = 80; off[(*n)++] = 82; break;
    case T_Q3_K: off[(*n)++] = 108; break;
    case T_Q6_K: off[(*n)++] = 208; break;
    default: break;
    }
}

static void random_weights(int t, int m, int k, uint8_t *w) {
    const long long rs = lle_row_size(t, k);
    if (t == T_F32) {
        for (long long i = 0; i < (long long)m * k; i++) ((float *)w)[i] = rndf();
        return;
    }
    if (t == T_F16) {
        for (long long i = 0; i < (long long)m * k; i++) ((lle_half *)w)[i] = lle_fp32_to_fp16(rndf());
        return;
    }
    if (t == T_BF16) {
        for (long long i = 0; i < (long long)m * k; i++) ((uint16_t *)w)[i] = lle_fp32_to_bf16(rndf());
        return;
    }
    for (long long i = 0; i < rs * m; i++) w[i] = (uint8_t)rnd();
    int off[2], nf;
    f16_fields(t, off, &nf);
    const int bsz = lle_type_size(t);
    for (long long b = 0; b < rs * m / bsz; b++)
        for (int f = 0; f < nf; f++) {
            const lle_half h = lle_fp32_to_fp16(rndf() * 0.05f);
            memcpy(w + b * bsz + off[f], &h, 2);
        }
}

static void test_types(int isa) {
    static const int types[] = {T_F32, T_F16, T_BF16, T_Q4_0, T_Q4_1, T_Q5_0, T_Q5_1, T_Q8_0, T_Q2_K,
                                T_Q3_K, T_Q4_K, T_Q5_K, T_Q6_K, T_IQ4_NL, T_IQ4_XS};
    const int k = 512, m = 37, n = 5;
    float *x = malloc(sizeof(float) * n * k), *out = malloc(sizeof(float) * n * m);
    uint8_t *w = malloc(1 << 20), *qa = malloc(1 << 20), *qb = malloc(1 << 20);
    for (int i = 0; i < n * k; i++) x[i] = rndf() * 3.0f;
    for (int i = k; i < 2 * k; i++) x[i] = (i % 32 == 0) ? 127.0f : (float)((int)(rndf() * 120)) + 0.5f;  /* ties */
    for (unsigned ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
        const int t = types[ti], vt = lle_vec_type(t);
        const long long rs = lle_row_size(t, k), vs = lle_row_size(vt, k);
        random_weights(t, m, k, w);
        lle_set_isa(ISA_SCALAR);
        lle_quantize_act(vt, x, n, k, qa);
        float ref[64];
        for (int j = 0; j < m; j++) lle_vec_dot(t, k, w + j * rs, qa, &ref[j]);
        const int mode0 = lle_act_rounding_mode();
        for (int mode = 0; mode < 3; mode++) {  /* every rounding variant, then back to the default */
            lle_set_act_rounding(mode);
            lle_set_isa(ISA_SCALAR);
            lle_quantize_act(vt, x, n, k, qa);
            lle_set_isa(isa);
            lle_quantize_act(vt, x, n, k, qb);
            CHECK(memcmp(qa, qb, (size_t)(vs * n)) == 0, "%s activations (%s, rounding %d) differ from scalar",
                  lle_type_traits[t].name, lle_type_traits[vt].name, mode);
        }
        lle_set_act_rounding(mode0);
        lle_set_isa(ISA_SCALAR);
        lle_quantize_act(vt, x, n, k, qa);
        lle_set_isa(isa);
        lle_quantize_act(vt, x, n, k, qb);
        float mine[64], mag = 0;
        for (int j = 0; j < m; j++) {
            lle_vec_dot(t, k, w + j * rs, qb, &mine[j]);
            mag = fmaxf(mag, fabsf(ref[j]));
        }
        for (int j = 0; j < m; j++)
            CHECK(fabsf(mine[j] - ref[j]) <= 1e-5f * mag + 1e-6f, "%s dot row %d: %g vs scalar %g", lle_type_traits[t].name,
                  j, mine[j], ref[j]);
        lle_matmul(t, w, rs, m, k, x, 1, out, m);
        for (int j = 0; j < m; j++)
            CHECK(out[j] == mine[j], "%s decode matmul row %d: %g vs vec_dot %g", lle_type_traits[t].name, j, out[j], mine[j]);
        lle_matmul(t, w, rs, m, k, x, n, out, m);
        for (int i = 0; i < n; i++)
            for (int j = 0; j < m; j++) {
                float v;
                lle_vec_dot(t, k, w + j * rs, qb + i * vs, &v);
                CHECK(fabsf(out[i * m + j] - v) <= 1e-5f * mag + 1e-6f, "%s prefill matmul [%d,%d]: %g vs %g",
                      lle_type_traits[t].name, i, j, out[i * m + j], v);
            }
    }
    free(x); free(out); free(w); free(qa); free(qb);
}

#if defined(LLE_X86)
#include <immintrin.h>
/* ggml's AVX-512 build's orders where they differ from its AVX2 build's (F32, F16, BF16 products;
 * IQ4_NL's decode), in portable scalar C: the avx512 tier must equal these bit for bit (the SIMDe
 * build checks its source on CPUs without AVX-512 this way), the avx2 tier keeps the AVX2 build's.
 * See the float products section of quants_avx512.c for the orders. */
static float ref_val(int t, const void *p, int i) {
    if (t == T_F32) return ((const float *)p)[i];
    if (t == T_F16) return lle_fp16_to_fp32(((const lle_half *)p)[i]);
    return lle_bf16_to_fp32(((const uint16_t *)p)[i]);
}

/* _mm512_reduce_add_ps: lanes i + (i + 8), (i + 4), then (0 + 2) + (1 + 3) */
static float ref_reduce16(const float *v) {
    float t[8], u[4];
    for (int i = 0; i < 8; i++) t[i] = v[i] + v[i + 8];
    for (int i = 0; i < 4; i++) u[i] = t[i] + t[i + 4];
    return (u[0] + u[2]) + (u[1] + u[3]);
}

/* vdpbf16ps on lane l of the 32 bf16 at x, y: the odd pair member first, DAZ and FTZ (MXCSR set by the caller) */
static float ref_dpbf16_lane(float acc, const uint16_t *x, const uint16_t *y, int l) {
    acc = fmaf(lle_bf16_to_fp32(x[2 * l + 1]), lle_bf16_to_fp32(y[2 * l + 1]), acc);
    return fmaf(lle_bf16_to_fp32(x[2 * l]), lle_bf16_to_fp32(y[2 * l]), acc);
}

/* ggml_vec_dot_f32 / _f16 / _bf16 (AVX-512) and ggml_vec_dot_iq4_nl_q8_0 as that build compiles it */
static float ref512_dot(int t, int k, const void *w, const void *a) {
    if (t == T_IQ4_NL) {
        const block_iq4_nl *x = w;
        const block_q8_0 *y = a;
        const int nb = k / QK;
        float acc[2][8] = {{0}};
        int ib = 0;
        for (; ib + 1 < nb; ib += 2)
            for (int h = 0; h < 2; h++) {
                const float d = lle_fp16_to_fp32(y[ib + h].d) * lle_fp16_to_fp32(x[ib + h].d);
                for (int l = 0; l < 8; l++) {  /* lane l: values 4l..4l+3 (0..15 low nibbles, 16..31 high) */
                    int s = 0;
                    for (int e = 4 * l; e < 4 * l + 4; e++) {
                        const uint8_t q = x[ib + h].qs[e % 16];
                        s += y[ib + h].qs[e] * lle_kvalues_iq4nl[e < 16 ? q & 15 : q >> 4];
                    }
                    acc[h][l] = fmaf(d, (float)s, acc[h][l]);
                }
            }
        float v[8];
        for (int l = 0; l < 8; l++) v[l] = acc[0][l] + acc[1][l];
        float sumf = ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
        for (; ib < nb; ib++) {
            int s = 0;
            for (int j = 0; j < QK / 2; j++)
                s += y[ib].qs[j] * lle_kvalues_iq4nl[x[ib].qs[j] & 15] + y[ib].qs[j + QK / 2] * lle_kvalues_iq4nl[x[ib].qs[j] >> 4];
            sumf = fmaf(lle_fp16_to_fp32(y[ib].d) * lle_fp16_to_fp32(x[ib].d), (float)s, sumf);  /* fused there */
        }
        return sumf;
    }
    const int np = k & ~63;
    if (t == T_BF16) {
        float c[2][16] = {{0}};
        const unsigned int csr = _mm_getcsr();
        _mm_setcsr(csr | 0x8040u);
        for (int i = 0; i < np; i += 64)
            for (int h = 0; h < 2; h++)
                for (int l = 0; l < 16; l++)
                    c[h][l] = ref_dpbf16_lane(c[h][l], (const uint16_t *)w + i + 32 * h, (const uint16_t *)a + i + 32 * h, l);
        _mm_setcsr(csr);
        double sumf = ref_reduce16(c[0]);
        sumf += ref_reduce16(c[1]);
        for (int i = np; i < k; i++) sumf += (double)(ref_val(t, w, i) * ref_val(t, a, i));
        return (float)sumf;
    }
    float acc[4][16] = {{0}}, v[16];
    for (int i = 0; i < np; i += 64)
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 16; l++) acc[j][l] = fmaf(ref_val(t, w, i + 16 * j + l), ref_val(t, a, i + 16 * j + l), acc[j][l]);
    for (int l = 0; l < 16; l++) v[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
    if (t == T_F32) {
        float sumf = ref_reduce16(v);
        /* there: products rounded and added in turn, by vectors of 16 and 8, the last (k - np) % 8 fused */
        const int nv = np + ((k - np) & ~7);
        for (int i = np; i < k; i++)
            sumf = i < nv ? sumf + ref_val(t, w, i) * ref_val(t, a, i) : fmaf(ref_val(t, w, i), ref_val(t, a, i), sumf);
        return sumf;
    }
    double sumf = ref_reduce16(v);
    for (int i = np; i < k; i++) sumf += (double)(ref_val(t, w, i) * ref_val(t, a, i));
    return (float)sumf;
}

/* llamafile's tinyBLAS<16, __m512> (<32, __m512bh> for bf16): one 16-lane accumulator */
static float ref512_dot_tb(int t, int k, const void *w, const void *a) {
    float c[16] = {0};
    if (t == T_BF16) {
        const unsigned int csr = _mm_getcsr();
        _mm_setcsr(csr | 0x8040u);
        for (int l = 0; l < k; l += 32)
            for (int e = 0; e < 16; e++) c[e] = ref_dpbf16_lane(c[e], (const uint16_t *)w + l, (const uint16_t *)a + l, e);
        _mm_setcsr(csr);
    } else {
        for (int l = 0; l < k; l += 16)
            for (int e = 0; e < 16; e++) c[e] = fmaf(ref_val(t, w, l + e), ref_val(t, a, l + e), c[e]);
    }
    return ref_reduce16(c);
}

/* ref_dpbf16_lane (and the avx512 tier's two FMAs under DAZ/FTZ) against the vdpbf16ps instruction
 * itself, on a CPU that has it: random pairs of every magnitude, denormal inputs, products and sums
 * included. Returns the number of lanes compared (0: no AVX512_BF16 here). */
#if !defined(LLE_SELFTEST_SIMDE) && (defined(__clang__) || __GNUC__ >= 10)
__attribute__((target("avx512f,avx512bf16"))) static void hw_dpbf16(float *acc, const uint16_t *x, const uint16_t *y) {
    __m512 c = _mm512_loadu_ps(acc);
    c = _mm512_dpbf16_ps(c, (__m512bh)_mm512_loadu_si512((const void *)x), (__m512bh)_mm512_loadu_si512((const void *)y));
    _mm512_storeu_ps(acc, c);
}
static int test_dpbf16_emulation(void) {
    if (!__builtin_cpu_supports("avx512bf16")) return 0;
    static const float scale[] = {1.0f, 1e-19f, 1e-20f, 3e-39f};
    int n = 0;
    for (int it = 0; it < 20000; it++) {
        uint16_t x[32], y[32];
        float hw[16], em[16];
        for (int i = 0; i < 32; i++) {
            x[i] = lle_fp32_to_bf16(rndf() * scale[rnd() % 4] * 4.0f);
            y[i] = lle_fp32_to_bf16(rndf() * scale[rnd() % 4]);
            if (rnd() % 16 == 0) x[i] = (uint16_t)(rnd() & 0x807F);  /* a denormal bf16 */
        }
        for (int l = 0; l < 16; l++) hw[l] = rndf() * scale[rnd() % 4] * 1e-18f;
        memcpy(em, hw, sizeof(hw));
        hw_dpbf16(hw, x, y);
        const unsigned int csr = _mm_getcsr();
        _mm_setcsr(csr | 0x8040u);
        for (int l = 0; l < 16; l++) em[l] = ref_dpbf16_lane(em[l], x, y, l);
        _mm_setcsr(csr);
        for (int l = 0; l < 16; l++, n++)
            CHECK(memcmp(&hw[l], &em[l], 4) == 0, "vdpbf16ps lane %d: %.9g, emulated %.9g", l, hw[l], em[l]);
    }
    return n;
}
#else
static int test_dpbf16_emulation(void) { return 0; }
#endif

/* lle_matmul's products as ggml's AVX-512 build computes them, into out[i * m + j]; 0 (nothing
 * written) where that build computes as its AVX2 build (other types, IQ4_NL with several rows) */
static int ref512_matmul(int t, const uint8_t *w, long long rs, int m, int k, const float *x, int n, float *out) {
    const int plain = t == T_F32 || t == T_F16 || t == T_BF16;
    if (!plain && (t != T_IQ4_NL || n > 1)) return 0;
    const int vt = lle_vec_type(t);
    const long long vs = lle_row_size(vt, k);
    uint8_t *qa = malloc((size_t)(vs * n));
    lle_quantize_act(vt, x, n, k, qa);
    const int tb = plain && n >= 2 && m % 4 == 0 && k % (t == T_BF16 ? 32 : 16) == 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < m; j++)
            out[i * m + j] = (tb ? ref512_dot_tb : ref512_dot)(t, k, w + j * rs, qa + i * vs);
    free(qa);
    return 1;
}
#else
static int ref512_matmul(int t, const uint8_t *w, long long rs, int m, int k, const float *x, int n, float *out) {
    (void)t; (void)w; (void)rs; (void)m; (void)k; (void)x; (void)n; (void)out;
    return 0;
}
#endif

/* an ISA whose kernels promise the summation order of another (AVX-512 of AVX2): the products, on
 * the decode and every prefill path (tiles, repacked and tiled K-quant orders, m % 8 == 0 or not,
 * chunked activations), must be equal bit for bit; for the AVX-512 tier, where ggml's AVX-512 build
 * sums otherwise (ref512_matmul), equal to that order instead */
static void test_bitexact(int isa, int ref_isa) {
    static const int types[] = {T_F32, T_F16, T_BF16, T_Q4_0, T_Q4_1, T_Q5_0, T_Q5_1, T_Q8_0, T_Q2_K,
                                T_Q3_K, T_Q4_K, T_Q5_K, T_Q6_K, T_IQ4_NL, T_IQ4_XS};
    /* float types also with odd tails: k not a multiple of the vector widths (520: of 16, 32 and 64;
     * 517, 44: of 8, where prefill takes the one-row order) */
    static const int ms[] = {37, 40}, ks[] = {512, 2304}, ks_float[] = {520, 517, 44}, ns[] = {1, 3, 5, 8, 13};
    const int kmax = 2304, mmax = 40, nmax = 13;
    float *x = malloc(sizeof(float) * nmax * kmax), *oa = malloc(sizeof(float) * nmax * mmax);
    float *ob = malloc(sizeof(float) * nmax * mmax);
    uint8_t *w = malloc(1 << 20), *qa = malloc(1 << 20), *qb = malloc(1 << 20);
    for (int i = 0; i < nmax * kmax; i++) x[i] = rndf() * 3.0f;
    for (unsigned ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++)
        for (int mi = 0; mi < 2; mi++)
            for (int ki = 0; ki < 5; ki++) {
                const int t = types[ti], m = ms[mi], vt = lle_vec_type(t);
                const int plain = t == T_F32 || t == T_F16 || t == T_BF16;
                if (ki >= 2 && !plain) continue;
                const int k = ki < 2 ? ks[ki] : ks_float[ki - 2];
                const long long rs = lle_row_size(t, k), vs = lle_row_size(vt, k);
                random_weights(t, m, k, w);
                const int own = isa == ISA_AVX512;  /* the AVX-512 build's order where it has its own */
                lle_set_isa(ref_isa);
                lle_quantize_act(vt, x, 1, k, qa);
                lle_vec_dot(t, k, w, qa, oa);
                if (own) ref512_matmul(t, w, rs, 1, k, x, 1, oa);
                lle_set_isa(isa);
                lle_quantize_act(vt, x, 1, k, qb);
                lle_vec_dot(t, k, w, qb, ob);
                CHECK(memcmp(qa, qb, (size_t)vs) == 0, "%s activations differ", lle_type_traits[vt].name);
                CHECK(memcmp(oa, ob, sizeof(float)) == 0, "%s vec_dot k=%d: %.9g vs %.9g", lle_type_traits[t].name, k,
                      ob[0], oa[0]);
                for (int ni = 0; ni < 5; ni++) {
                    const int n = ns[ni];
                    lle_set_isa(ref_isa);
                    lle_matmul(t, w, rs, m, k, x, n, oa, m);
                    if (own) ref512_matmul(t, w, rs, m, k, x, n, oa);
                    lle_set_isa(isa);
                    lle_matmul(t, w, rs, m, k, x, n, ob, m);
                    for (int i = 0; i < n * m; i++)
                        CHECK(memcmp(oa + i, ob + i, sizeof(float)) == 0, "%s matmul m=%d k=%d n=%d [%d]: %.9g vs %.9g",
                              lle_type_traits[t].name, m, k, n, i, ob[i], oa[i]);
                    /* the row-exact products (rows kernels, up to LLE_GEMV_ROWS rows per call): each row
                     * as the reference ISA's product of that row alone */
                    if (n == 1) continue;
                    for (int i = 0; i < n; i++) {
                        lle_set_isa(ref_isa);
                        lle_matmul(t, w, rs, m, k, x + i * k, 1, oa + i * m, m);
                        if (own) ref512_matmul(t, w, rs, m, k, x + i * k, 1, oa + i * m);
                    }
                    lle_set_isa(isa);
                    lle_matmul_rows(t, w, rs, m, k, x, n, ob, m);
                    for (int i = 0; i < n * m; i++)
                        CHECK(memcmp(oa + i, ob + i, sizeof(float)) == 0, "%s rows m=%d k=%d n=%d [%d]: %.9g vs %.9g",
                              lle_type_traits[t].name, m, k, n, i, ob[i], oa[i]);
                }
            }
    free(x); free(oa); free(ob); free(w); free(qa); free(qb);
}

/* the row-exact products on one ISA (its rows kernels, 1..LLE_GEMV_ROWS rows per call, and the
 * float types' odd tails, k shorter than one vector step and several conversion chunks): each row
 * equal to that row's product alone */
static void test_rows(int isa) {
    static const int types[] = {T_F32, T_F16, T_BF16, T_Q4_0, T_Q4_1, T_Q8_0};
    static const int ks[] = {1056, 520, 517, 100, 44, 8}, ns[] = {2, 3, 5, 8, 11};
    const int m = 19, kmax = 1056, nmax = 11;
    float *x = malloc(sizeof(float) * nmax * kmax), *oa = malloc(sizeof(float) * nmax * m);
    float *ob = malloc(sizeof(float) * nmax * m);
    uint8_t *w = malloc(1 << 20);
    for (int i = 0; i < nmax * kmax; i++) x[i] = rndf() * 3.0f;
    lle_set_isa(isa);
    for (unsigned ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++)
        for (int ki = 0; ki < (int)(sizeof(ks) / sizeof(ks[0])); ki++) {
            const int t = types[ti], k = ks[ki];
            if (k % lle_type_traits[t].block_size) continue;
            const long long rs = lle_row_size(t, k);
            random_weights(t, m, k, w);
            for (int ni = 0; ni < (int)(sizeof(ns) / sizeof(ns[0])); ni++) {
                const int n = ns[ni];
                for (int i = 0; i < n; i++) lle_matmul(t, w, rs, m, k, x + i * k, 1, oa + i * m, m);
                lle_matmul_rows(t, w, rs, m, k, x, n, ob, m);
                for (int i = 0; i < n * m; i++)
                    CHECK(memcmp(oa + i, ob + i, sizeof(float)) == 0, "%s rows k=%d n=%d [%d]: %.9g vs alone %.9g",
                          lle_type_traits[t].name, k, n, i, ob[i], oa[i]);
            }
        }
    free(x); free(oa); free(ob); free(w);
}

/* packed weights (native/packed.c): a packed copy must give the products of the unpacked weight on
 * the reference ISA bit for bit, on the decode and prefill paths (both orders of the repacked Q4_K,
 * 4-row groups and the n % 4 rows after them); a weight whose bytes changed after packing must not
 * use the stale copy */
/* A packed copy's products against the unpacked kernels of `ref_isa`, bit for bit: every product of
 * `isa` (one row and prefill, the row-exact batch, the grouped decode products). The references are
 * computed before the copy exists (ref_isa may be isa itself, whose products would otherwise find it). */
static void test_packed(int isa, int ref_isa) {
    enum { NN = 6, MMAX = 48, KMAX = 2304, NMAX = 13 };
    static const int ms[] = {16, MMAX}, ks[] = {512, KMAX}, ns[NN] = {1, 3, 4, 5, 8, NMAX};
    static const int pts[] = {T_Q4_K, T_Q6_K, T_Q4_1, T_Q8_0};
    static float ref[NN][2][2][NMAX * MMAX];  /* [n][stale][whole product, one row at a time] */
    float *x = malloc(sizeof(float) * NMAX * KMAX), *ob = malloc(sizeof(float) * NMAX * MMAX);
    uint8_t *w = malloc(1 << 20);
    for (int i = 0; i < NMAX * KMAX; i++) x[i] = rndf() * 3.0f;
    int packed = 0;
    for (int ti = 0; ti < 4; ti++)
    for (int mi = 0; mi < 2; mi++)
        for (int ki = 0; ki < 2; ki++) {
            const int m = ms[mi], k = ks[ki], t = pts[ti];
            const long long rs = lle_row_size(t, k);
            random_weights(t, m, k, w);
            lle_set_isa(ref_isa);
            for (int ni = 0; ni < NN; ni++)
                for (int stale = 0; stale < 2; stale++) {
                    const int n = ns[ni];
                    if (stale) w[0] ^= 0x5a;  /* the copy will no longer match the weight */
                    lle_matmul(t, w, rs, m, k, x, n, ref[ni][stale][0], m);
                    for (int i = 0; i < n; i++) lle_matmul(t, w, rs, m, k, x + (size_t)i * k, 1, ref[ni][stale][1] + (size_t)i * m, m);
                    if (stale) w[0] ^= 0x5a;
                }
            lle_set_isa(isa);
            const int r = lle_pack_weight(t, w, rs, m, k, 0);
            CHECK(r >= 0 && r <= 2, "lle_pack_weight returned %d", r);
            packed += r > 0;
            for (int ni = 0; ni < NN; ni++) {
                const int n = ns[ni];
                for (int stale = 0; stale < 2; stale++) {
                    if (stale) w[0] ^= 0x5a;
                    const float *oa = ref[ni][stale][0];
                    lle_matmul(t, w, rs, m, k, x, n, ob, m);
                    for (int i = 0; i < n * m; i++)
                        CHECK(memcmp(oa + i, ob + i, sizeof(float)) == 0, "packed %s m=%d k=%d n=%d%s [%d]: %.9g vs %.9g",
                              lle_type_traits[t].name, m, k, n, stale ? " (changed bytes)" : "", i, ob[i], oa[i]);
                    /* the row-exact batch (batched decode): each row as the one-row product */
                    oa = ref[ni][stale][1];
                    lle_matmul_rows(t, w, rs, m, k, x, n, ob, m);
                    for (int i = 0; i < n * m; i++)
                        CHECK(memcmp(oa + i, ob + i, sizeof(float)) == 0, "packed rows %s m=%d k=%d n=%d%s [%d]: %.9g vs %.9g",
                              lle_type_traits[t].name, m, k, n, stale ? " (changed bytes)" : "", i, ob[i], oa[i]);
                    if (n == 1) {  /* the grouped decode products (Q/K/V, gate/up) of the decoder layers */
                        const lle_weight lw = {t, w, rs, m, k};
                        const lle_weight *ws2[2] = {&lw, &lw};
                        float *outs[2] = {ob, ob + m};
                        lle_lock();
                        CHECK(lle_matvec_group_impl(ws2, 2, x, outs) == 0, "lle_matvec_group_impl failed");
                        lle_unlock();
                        for (int i = 0; i < 2 * m; i++)
                            CHECK(memcmp(oa + i % m, ob + i, sizeof(float)) == 0, "packed group %s m=%d k=%d%s [%d]: %.9g vs %.9g",
                                  lle_type_traits[t].name, m, k, stale ? " (changed bytes)" : "", i, ob[i], oa[i % m]);
                    }
                    if (stale) w[0] ^= 0x5a;
                }
            }
            if (r > 0) lle_unpack_weight(w);
        }
    CHECK(lle_packed_count() == 0, "%d packed copies left", lle_packed_count());
    printf("  packed Q4_K, Q6_K, Q4_1, Q8_0 (%s): %d of 16 shapes packed\n", isa == ISA_AVX512 ? "avx512" : "avx2", packed);
    free(x); free(ob); free(w);
}

static void compare(const char *what, const float *a, const float *b, int n, float tol) {
    float mag = 0, err = 0;
    for (int i = 0; i < n; i++) {
        mag = fmaxf(mag, fabsf(a[i]));
        err = fmaxf(err, fabsf(a[i] - b[i]));
    }
    CHECK(err <= tol * (mag + 1e-6f), "%s: max error %g (magnitude %g)", what, err, mag);
}

static void test_ops(int isa) {
    enum { N = 5, H = 4, D = 64, T = 19, KV = 2 };
    float x[N * H * D], w[D], a[N * H * D], b[N * H * D], g[N * H * D];
    lle_half k[T * KV * D], v[T * KV * D];
    int pos[N] = {3, 11, 18, 7, 15}, kpos[T];
    for (int i = 0; i < N * H * D; i++) { x[i] = rndf() * 4; g[i] = rndf(); }
    for (int i = 0; i < D; i++) w[i] = rndf();
    for (int i = 0; i < T * KV * D; i++) { k[i] = lle_fp32_to_fp16(rndf()); v[i] = lle_fp32_to_fp16(rndf()); }
    for (int i = 0; i < T; i++) kpos[i] = i;
    const int isas[2] = {ISA_SCALAR, isa};
    float *res[2] = {a, b};
    /* attention of 5 query rows reads f32 copies of the f16 cache (lle_attn_args.kv_wide), of 3 the cache */
    const char *names[] = {"rms_norm", "rope", "softmax", "glu silu", "glu gelu", "attention", "attention 3 rows"};
    for (int op = 0; op < 7; op++) {
        for (int s = 0; s < 2; s++) {
            lle_set_isa(isas[s]);
            switch (op) {
            case 0: lle_rms_norm(x, w, N * H, D, 1e-5f, res[s]); break;
            case 1: lle_rope(x, pos, N, H, D, D, 10000.0f, 1.0f, 1, NULL, res[s]); break;
            case 2: lle_softmax(x, N * H, D, 0.5f, res[s]); break;
            case 3: lle_glu(x, g, N * H * D, D, 0, res[s]); break;
            case 4: lle_glu(x, g, N * H * D, D, 1, res[s]); break;
            case 5: lle_attention(x, N, H, D, k, v, 1, T, KV, KV * D, D, KV * D, D, pos, kpos, 0.125f, 0, 0.0f, res[s]); break;
            case 6: lle_attention(x, 3, H, D, k, v, 1, T, KV, KV * D, D, KV * D, D, pos, kpos, 0.125f, 0, 0.0f, res[s]); break;
            }
        }
        compare(names[op], a, b, op == 6 ? 3 * H * D : N * H * D, op >= 5 ? 2e-3f : 1e-5f);
    }
}

/* the K/V cache's float -> half conversion of an ISA against lle_fp32_to_fp16, bit for bit: values
 * exactly halfway between two halves (ties to even), half's subnormals and their halfway points,
 * overflow to infinity, infinities, signed zeros; n = 37 leaves a tail after the 8-wide loop */
static void test_f32_to_f16(int isa) {
    enum { N = 37 };
    float x[N];
    lle_half got[N];
    const float special[] = {0.0f, -0.0f, 1.0f + 0x1.0p-11f, 1.0f + 3 * 0x1.0p-11f, 0x1.0p-24f, 0x1.8p-24f,
                             0x1.0p-25f, 0x1.0p-26f, 65504.0f, 65520.0f, -65520.0f, 1e9f, INFINITY, -INFINITY,
                             0x1.ffcp-15f, -0x1.0p-14f};
    const int ns = (int)(sizeof(special) / sizeof(special[0]));
    for (int rep = 0; rep < 64; rep++) {
        for (int i = 0; i < N; i++) x[i] = i < ns && rep == 0 ? special[i] : rndf() * (float)(1 << (rep % 20));
        lle_set_isa(isa);
        lle_ops->f32_to_f16(N, x, got);
        for (int i = 0; i < N; i++)
            CHECK(got[i] == lle_fp32_to_fp16(x[i]), "f32_to_f16(%.9g): %04x vs %04x", x[i], got[i], lle_fp32_to_fp16(x[i]));
    }
}

/* attn_group (the query heads of one KV head at once) against attn_row head by head, bit for bit:
 * head sizes 32, 64 and 256, 2 to 4 heads per KV head, cell counts that are and are not multiples of
 * 8, an empty cell, a sliding window and a soft-cap; the first head of each group is made so peaked
 * that most of its probabilities round to 0 in f16 while its neighbours' do not (V cells skipped
 * for one head and not the others). One query row (decode: ggml's orders over the f16 cache) and
 * three (a prompt: tinyBLAS's orders, over the f16 cache and over its f32 copies, kv_wide, with the
 * copies head-major as lle_attention makes them; each row at its own position) */
static void test_attention_groups(int isa) {
    lle_set_isa(isa);
    const lle_op_kernels *ops = lle_ops;
    if (!ops->attn_group) return;
    enum { KV = 2, TMAX = 200, DMAX = 256, NMAX = 3 };
    static const int ds[] = {32, 64, 256}, ts[] = {37, 200}, hpgs[] = {2, 3, 4};
    lle_half *kh = malloc(sizeof(lle_half) * TMAX * KV * DMAX), *vh = malloc(sizeof(lle_half) * TMAX * KV * DMAX);
    float *kf = malloc(sizeof(float) * TMAX * KV * DMAX), *vf = malloc(sizeof(float) * TMAX * KV * DMAX);
    float *q = malloc(sizeof(float) * NMAX * 4 * KV * DMAX), *og = malloc(sizeof(float) * NMAX * 4 * KV * DMAX);
    float *orow = malloc(sizeof(float) * NMAX * 4 * KV * DMAX);
    int kpos[TMAX];
    for (int i = 0; i < TMAX * KV * DMAX; i++) { kh[i] = lle_fp32_to_fp16(rndf()); vh[i] = lle_fp32_to_fp16(rndf()); }
    for (int j = 0; j < TMAX; j++) kpos[j] = j;
    kpos[5] = -1;
    for (int di = 0; di < 3; di++)
        for (int ti = 0; ti < 2; ti++)
            for (int hi = 0; hi < 3; hi++)
                for (int variant = 0; variant < 3; variant++)
                    for (int shape = 0; shape < 3; shape++) {  /* 1 row; 3 rows over f16; 3 rows over f32 copies */
                        const int d = ds[di], t = ts[ti], hpg = hpgs[hi], n_head = hpg * KV, n = shape ? NMAX : 1;
                        const int wide = shape == 2;
                        int qp[NMAX];
                        for (int i = 0; i < n; i++) qp[i] = t - n + i;
                        for (int i = 0; i < n; i++)
                            for (int h = 0; h < n_head; h++)
                                for (int e = 0; e < d; e++) q[(i * n_head + h) * d + e] = rndf() * (h % hpg == 0 ? 40.0f : 1.0f);
                        if (wide)  /* head-major f32 copies, as lle_attention_impl's */
                            for (int g = 0; g < KV; g++)
                                for (int j = 0; j < t; j++)
                                    for (int e = 0; e < d; e++) {
                                        kf[((size_t)g * t + j) * d + e] = lle_fp16_to_fp32(kh[((size_t)j * KV + g) * d + e]);
                                        vf[((size_t)g * t + j) * d + e] = lle_fp16_to_fp32(vh[((size_t)j * KV + g) * d + e]);
                                    }
                        lle_attn_args a = {q, n, n_head, d, (const uint8_t *)kh, (const uint8_t *)vh, 1, t, KV,
                                           KV * d, d, KV * d, d, qp, kpos, 0.125f, variant == 1 ? 29 : 0,
                                           variant == 2 ? 20.0f : 0.0f, og, 0};
                        if (wide) {
                            a.k = (const uint8_t *)kf;
                            a.v = (const uint8_t *)vf;
                            a.ks_t = a.vs_t = d;
                            a.ks_h = a.vs_h = (int64_t)t * d;
                            a.kv_wide = 1;
                        }
                        lle_attn_args b = a;
                        b.out = orow;
                        const int64_t per = (lle_attn_scratch_floats(t, d) + 15) & ~(int64_t)15;
                        float *scratch = malloc(sizeof(float) * (size_t)(per * hpg));
                        for (int i = 0; i < n; i++)
                            for (int g = 0; g < KV; g++) ops->attn_group(&a, i, g * hpg, hpg, scratch, per);
                        for (int i = 0; i < n; i++)
                            for (int h = 0; h < n_head; h++) ops->attn_row(&b, i, h, scratch);
                        for (int i = 0; i < n * n_head * d; i++)
                            CHECK(memcmp(og + i, orow + i, sizeof(float)) == 0,
                                  "attn_group d=%d t=%d heads/kv=%d variant %d rows %d wide %d [%d]: %.9g vs %.9g",
                                  d, t, hpg, variant, n, wide, i, og[i], orow[i]);
                        free(scratch);
                    }
    free(kh); free(vh); free(kf); free(vf); free(q); free(og); free(orow);
}

/* the wide decode attention (lle_attn_wide: scores and exponentials by cell blocks, V sums by KV head
 * and 16-lane part, three pool jobs) against attn_group / attn_row, bit for bit: head sizes 32 to 256
 * (the wide path takes multiples of 64),
 * 1 to 4 heads per KV head, cell counts around the blocks' and lanes' boundaries, several problems in
 * one call, empty cells, a query before the last cells, a sliding window, a soft-cap, and peaked heads
 * whose probabilities mostly round to 0 */
static void test_attention_wide(int isa) {
    lle_set_isa(isa);
    if (!lle_ops->wide_scores) return;
    enum { KV = 2, TMAX = 777, DMAX = 256, NP = 3 };
    static const int ds[] = {32, 64, 256}, ts[] = {1, 7, 255, 257, 777}, hpgs[] = {1, 3, 4};
    lle_half *kh = malloc(sizeof(lle_half) * TMAX * KV * DMAX), *vh = malloc(sizeof(lle_half) * TMAX * KV * DMAX);
    float *q = malloc(sizeof(float) * NP * 4 * KV * DMAX);
    float *ow = malloc(sizeof(float) * NP * 4 * KV * DMAX), *og = malloc(sizeof(float) * NP * 4 * KV * DMAX);
    int kpos[TMAX];
    for (int i = 0; i < TMAX * KV * DMAX; i++) { kh[i] = lle_fp32_to_fp16(rndf()); vh[i] = lle_fp32_to_fp16(rndf()); }
    for (int j = 0; j < TMAX; j++) kpos[j] = j;
    kpos[5] = -1;
    kpos[300] = -1;
    int checked = 0;
    for (int di = 0; di < 3; di++)
        for (int ti = 0; ti < 5; ti++)
            for (int hi = 0; hi < 3; hi++)
                for (int variant = 0; variant < 4; variant++) {
                    const int d = ds[di], t = ts[ti], hpg = hpgs[hi], n_head = hpg * KV;
                    int qp[NP];
                    lle_attn_args a[NP];
                    for (int i = 0; i < NP; i++) {
                        qp[i] = t - 1 - (variant == 3 ? 3 * i : 0);
                        for (int h = 0; h < n_head; h++)
                            for (int e = 0; e < d; e++)
                                q[(i * n_head + h) * d + e] = rndf() * (h % hpg == 0 ? 40.0f : 1.0f);
                        a[i] = (lle_attn_args){q + i * n_head * d, 1, n_head, d, (const uint8_t *)kh, (const uint8_t *)vh, 1,
                                               t - i, KV, KV * d, d, KV * d, d, &qp[i], kpos, 0.125f,
                                               variant == 1 ? 29 : 0, variant == 2 ? 20.0f : 0.0f, ow + i * n_head * d, 0};
                    }
                    lle_set_attn_wide_min(0);
                    CHECK(lle_attention_rows_impl(a, t > 2 ? NP : 1) == 0, "wide attention failed");
                    for (int i = 0; i < NP; i++) a[i].out = og + i * n_head * d;
                    lle_set_attn_wide_min(1LL << 40);
                    CHECK(lle_attention_rows_impl(a, t > 2 ? NP : 1) == 0, "attention failed");
                    for (int i = 0; i < (t > 2 ? NP : 1) * n_head * d; i++)
                        CHECK(memcmp(ow + i, og + i, sizeof(float)) == 0, "wide attention d=%d t=%d heads/kv=%d variant %d [%d]: %.9g vs %.9g",
                              d, t, hpg, variant, i, ow[i], og[i]);
                    checked++;
                }
    lle_set_attn_wide_min(LLE_ATTN_WIDE_MIN);
    printf("  wide decode attention: %d cases compared\n", checked);
    free(kh); free(vh); free(q); free(ow); free(og);
}

/* the AVX-512 decode V sums formed 4 lanes at a time in registers (v_sum_tree) against the 64 lanes kept
 * in scratch (lle_set_attn_tree_max(-1)), bit for bit, through attn_row (f16 and f32 caches) and
 * attn_group: every cell count from 1 to 130 (one or two cells per lane, lanes left empty), head sizes
 * 16 to 256 and 80 (not a multiple of 64), peaked heads whose probabilities round to 0, an empty cell
 * whose V row is infinite (its probability 0: skipped, not 0 * inf), V values -0, a sliding window
 * (the first lane past 0), a query before the last cells and a soft-cap */
static void test_attention_tree(int isa) {
    lle_set_isa(isa);
    const lle_op_kernels *ops = lle_ops;
    if (isa != ISA_AVX512) return;
    enum { KV = 2, TMAX = 130, DMAX = 256, HMAX = 4 * KV };
    static const int ds[] = {16, 64, 80, 128, 256}, hpgs[] = {1, 3, 4};
    lle_half *kh = malloc(sizeof(lle_half) * TMAX * KV * DMAX), *vh = malloc(sizeof(lle_half) * TMAX * KV * DMAX);
    float *kf = malloc(sizeof(float) * TMAX * KV * DMAX), *vf = malloc(sizeof(float) * TMAX * KV * DMAX);
    float *q = malloc(sizeof(float) * HMAX * DMAX), *o[2] = {malloc(sizeof(float) * HMAX * DMAX), malloc(sizeof(float) * HMAX * DMAX)};
    float *scratch = malloc(sizeof(float) * 4 * (size_t)((lle_attn_scratch_floats(TMAX, DMAX) + 15) & ~15));
    int kpos[TMAX], checked = 0;
    for (int i = 0; i < TMAX * KV * DMAX; i++) {
        kh[i] = lle_fp32_to_fp16(rndf());
        vh[i] = lle_fp32_to_fp16(i % 37 == 0 ? -0.0f : rndf());
    }
    for (int j = 0; j < TMAX; j++) kpos[j] = j;
    kpos[5] = -1;
    for (int di = 0; di < 5; di++) {
        for (int i = 5 * KV * ds[di]; i < 6 * KV * ds[di]; i++) vh[i] = lle_fp32_to_fp16(INFINITY);  /* cell 5 */
        for (int i = 0; i < TMAX * KV * DMAX; i++) { kf[i] = lle_fp16_to_fp32(kh[i]); vf[i] = lle_fp16_to_fp32(vh[i]); }
        for (int hi = 0; hi < 3; hi++)
            for (int t = 1; t <= TMAX; t++)
                for (int variant = 0; variant < 4; variant++)
                    for (int f16 = 0; f16 < 2; f16++) {
                        const int d = ds[di], hpg = hpgs[hi], n_head = hpg * KV;
                        if (!f16 && hpg != 1) continue;  /* attn_group takes f16 caches only */
                        const int qp = variant == 3 ? t - 1 - t / 3 : t - 1;
                        for (int h = 0; h < n_head; h++)
                            for (int e = 0; e < d; e++) q[h * d + e] = rndf() * (h % hpg == 0 ? 40.0f : 1.0f);
                        const lle_attn_args a = {q, 1, n_head, d, f16 ? (const uint8_t *)kh : (const uint8_t *)kf,
                                                 f16 ? (const uint8_t *)vh : (const uint8_t *)vf, f16, t, KV, KV * d, d,
                                                 KV * d, d, &qp, kpos, 0.125f, variant == 1 ? 29 : 0,
                                                 variant == 2 ? 20.0f : 0.0f, NULL, 0};
                        const int64_t per = (lle_attn_scratch_floats(t, d) + 15) & ~(int64_t)15;
                        for (int s = 0; s < 2; s++) {
                            lle_attn_args b = a;
                            b.out = o[s];
                            lle_set_attn_tree_max(s ? LLE_ATTN_TREE_MAX : -1);
                            for (int g = 0; g < KV; g++) {
                                if (hpg == 1) ops->attn_row(&b, 0, g, scratch);
                                else ops->attn_group(&b, 0, g * hpg, hpg, scratch, per);
                            }
                        }
                        for (int i = 0; i < n_head * d; i++)
                            CHECK(memcmp(o[0] + i, o[1] + i, sizeof(float)) == 0,
                                  "V sum tree d=%d t=%d heads/kv=%d variant %d f16 %d [%d]: %.9g vs %.9g", d, t, hpg,
                                  variant, f16, i, o[1][i], o[0][i]);
                        checked++;
                    }
        for (int i = 5 * KV * ds[di]; i < 6 * KV * ds[di]; i++) vh[i] = lle_fp32_to_fp16(rndf());
    }
    lle_set_attn_tree_max(LLE_ATTN_TREE_MAX);
    printf("  decode V sums in registers: %d cases compared\n", checked);
    free(kh); free(vh); free(kf); free(vf); free(q); free(o[0]); free(o[1]); free(scratch);
}

#if defined(LLE_SELFTEST_SIMDE)
/* selftest_simde.c: the AVX-512 source compiled against SIMDe, run as the AVX-512 tier */
extern lle_kernels lle_kernels_avx512_simde[T_COUNT];
extern lle_op_kernels lle_ops_avx512_simde;  /* selftest_simde_ops.c */
void lle_register_avx512_simde(void);

static int use_simde_avx512(void) {
    if (!lle_isa_available(ISA_AVX2)) {
        printf("FAIL: the SIMDe AVX-512 check compares with the AVX2 kernels; this CPU has no AVX2\n");
        return 0;
    }
    lle_register_avx512_simde();
    memcpy(lle_kernels_avx512, lle_kernels_avx512_simde, sizeof(lle_kernels_avx512));
    lle_ops_avx512 = lle_ops_avx512_simde;
    lle_test_add_cpu_features(LLE_CPU_AVX512F | LLE_CPU_AVX512BW | LLE_CPU_AVX512VL | LLE_CPU_AVX512DQ |
                              LLE_CPU_AVX512VNNI);
    printf("avx512 kernels: SIMDe\n");
    return lle_isa_available(ISA_AVX512);
}
#endif

/* lle_chunks: whatever subset of the threads asks, every chunk is handed out exactly once (the
 * present threads race on their own ranges and steal the absent ones'), and the pool takes them all */
#include <pthread.h>
typedef struct { lle_chunks *c; int ith; int *seen; } chunk_arg;
static void *chunk_thread(void *v) {
    chunk_arg *a = v;
    for (int64_t ch; (ch = lle_chunks_next(a->c, a->ith)) >= 0;) __atomic_add_fetch(&a->seen[ch], 1, __ATOMIC_RELAXED);
    return NULL;
}
typedef struct { lle_chunks c; int *seen; } chunk_job;
static void chunk_task(void *v, int ith, int nth) {
    (void)nth;
    chunk_job *j = v;
    for (int64_t ch; (ch = lle_chunks_next(&j->c, ith)) >= 0;) __atomic_add_fetch(&j->seen[ch], 1, __ATOMIC_RELAXED);
}
static void test_chunks(void) {
    static int seen[5000];
    static const int64_t counts[] = {0, 1, 2, 3, 7, 64, 1000, 4999};
    for (int nth = 1; nth <= 10; nth++)
        for (int ci = 0; ci < (int)(sizeof(counts) / sizeof(counts[0])); ci++)
            for (int present = 1; present <= nth; present++) {
                const int64_t n = counts[ci];
                lle_chunks c;
                lle_chunks_init(&c, n, nth);
                memset(seen, 0, sizeof(seen));
                pthread_t t[10];
                chunk_arg args[10];
                for (int i = 0; i < present; i++) {  /* threads nth - present .. nth - 1: thread 0 may be absent */
                    args[i] = (chunk_arg){&c, nth - present + i, seen};
                    pthread_create(&t[i], NULL, chunk_thread, &args[i]);
                }
                for (int i = 0; i < present; i++) pthread_join(t[i], NULL);
                int bad = 0;
                for (int64_t i = 0; i < n; i++) bad += seen[i] != 1;
                CHECK(!bad, "lle_chunks: %lld chunks over %d ranges, %d threads present: %d chunks not taken once",
                      (long long)n, nth, present, bad);
            }
    chunk_job j;
    j.seen = seen;
    for (int rep = 0; rep < 200; rep++) {
        const int64_t n = 1 + rnd() % 600;
        memset(seen, 0, sizeof(seen));
        lle_chunks_init(&j.c, n, lle_pool_threads());
        lle_pool_run(chunk_task, &j);
        int bad = 0;
        for (int64_t i = 0; i < n; i++) bad += seen[i] != 1;
        CHECK(!bad, "lle_chunks through the pool: %lld chunks, %d not taken once", (long long)n, bad);
    }
}

int main(void) {
    unsetenv("LLMEDGE_ISA");  /* every tier of this CPU is tested */
    lle_init(2);
    static const char *isa_names[] = {"scalar", "avx2", "avx512", "neon"};
    int tested = 0;
#if defined(LLE_SELFTEST_SIMDE)
    if (!use_simde_avx512()) failures++;
#endif
    if (lle_isa_available(ISA_AVX512) && lle_isa_available(ISA_AVX2)) {
        printf("testing avx512's products against avx2's, bit for bit (float products, IQ4_NL decode: against ggml's AVX-512 order)\n");
#if defined(LLE_X86)
        const int lanes = test_dpbf16_emulation();
        if (lanes) printf("  vdpbf16ps: %d lanes equal to its emulation\n", lanes);
#endif
        test_bitexact(ISA_AVX512, ISA_AVX2);
        test_packed(ISA_AVX512, ISA_AVX2);
    }
    if (lle_isa_available(ISA_AVX2)) {
        printf("testing avx2's packed weights against its unpacked kernels, bit for bit\n");
        test_packed(ISA_AVX2, ISA_AVX2);
    }
    for (int isa = 1; isa < ISA_COUNT; isa++) {
        if (!lle_isa_available(isa)) continue;
        printf("testing %s against scalar\n", isa_names[isa]);
        test_types(isa);
        test_rows(isa);
        test_ops(isa);
        test_f32_to_f16(isa);
        test_attention_groups(isa);
        test_attention_wide(isa);
        test_attention_tree(isa);
        tested++;
    }
    printf("testing the chunks of a pool job\n");
    test_chunks();
    if (!tested) printf("no SIMD ISA available: nothing to compare\n");
    printf("%s (%d failures)\n", failures ? "FAILED" : "PASSED", failures);
    return failures ? 1 : 0;
}
