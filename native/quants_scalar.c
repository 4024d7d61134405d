/* Portable reference kernels: activation quantization (Q8_0, Q8_1, Q8_K, F16, BF16), dequantization
 * of every supported GGUF type, and scalar dot products. Bit-exact with ggml's *_ref quantizers and
 * dequantizers; the dot products follow ggml's generic kernels. Compiled without any ISA flags, so
 * it is the fallback on every CPU and the oracle the SIMD kernels are tested against.
 */
#include "common.h"

const int8_t lle_kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                      1, 13, 25, 38, 53, 69, 89, 113};

const lle_traits lle_type_traits[T_COUNT] = {
    [T_F32] = {1, 4, T_F32, "F32"},
    [T_F16] = {1, 2, T_F16, "F16"},
    [T_BF16] = {1, 2, T_BF16, "BF16"},
    [T_Q4_0] = {QK, sizeof(block_q4_0), T_Q8_0, "Q4_0"},
    [T_Q4_1] = {QK, sizeof(block_q4_1), T_Q8_1, "Q4_1"},
    [T_Q5_0] = {QK, sizeof(block_q5_0), T_Q8_0, "Q5_0"},
    [T_Q5_1] = {QK, sizeof(block_q5_1), T_Q8_1, "Q5_1"},
    [T_Q8_0] = {QK, sizeof(block_q8_0), T_Q8_0, "Q8_0"},
    [T_Q8_1] = {QK, sizeof(block_q8_1), T_Q8_1, "Q8_1"},
    [T_Q2_K] = {QK_K, sizeof(block_q2_K), T_Q8_K, "Q2_K"},
    [T_Q3_K] = {QK_K, sizeof(block_q3_K), T_Q8_K, "Q3_K"},
    [T_Q4_K] = {QK_K, sizeof(block_q4_K), T_Q8_K, "Q4_K"},
    [T_Q5_K] = {QK_K, sizeof(block_q5_K), T_Q8_K, "Q5_K"},
    [T_Q6_K] = {QK_K, sizeof(block_q6_K), T_Q8_K, "Q6_K"},
    [T_Q8_K] = {QK_K, sizeof(block_q8_K), T_Q8_K, "Q8_K"},
    [T_IQ4_NL] = {QK, sizeof(block_iq4_nl), T_Q8_0, "IQ4_NL"},
    [T_IQ4_XS] = {QK_K, sizeof(block_iq4_xs), T_Q8_K, "IQ4_XS"},
};

lle_kernels lle_kernels_scalar[T_COUNT];

/* ======================= activation quantizers (ggml quantize_row_*_ref) ======================= */

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
int lle_act_rounding = LLE_ROUND_X86;
#elif defined(__aarch64__)
int lle_act_rounding = LLE_ROUND_ARM;
#else
int lle_act_rounding = LLE_ROUND_REF;
#endif

/* the per-block multiplier and rounding of the selected variant */
LLE_INLINE float q8_inverse_scale(float amax, float d, int mode) {
    if (mode == LLE_ROUND_X86) return amax != 0.0f ? 127.f / amax : 0.0f;
    return d ? 1.0f / d : 0.0f;
}

LLE_INLINE int8_t q8_round(float v, int mode) {
    return (int8_t)(mode == LLE_ROUND_REF ? roundf(v) : nearbyintf(v));
}

static void quantize_q8_0(const float *LLE_RESTRICT x, void *LLE_RESTRICT vy, int64_t k) {
    block_q8_0 *y = vy;
    const int64_t nb = k / QK;
    const int mode = lle_act_rounding;
    for (int64_t i = 0; i < nb; i++) {
        float amax = 0.0f;
        for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(x[i * QK + j]));
        const float d = amax / ((1 << 7) - 1);
        const float id = q8_inverse_scale(amax, d, mode);
        y[i].d = lle_fp32_to_fp16(d);
        for (int j = 0; j < QK; ++j) y[i].qs[j] = q8_round(x[i * QK + j] * id, mode);
    }
}

static void quantize_q8_1(const float *LLE_RESTRICT x, void *LLE_RESTRICT vy, int64_t k) {
    block_q8_1 *y = vy;
    const int64_t nb = k / QK;
    const int mode = lle_act_rounding;
    for (int64_t i = 0; i < nb; i++) {
        float amax = 0.0f;
        for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(x[i * QK + j]));
        const float d = amax / ((1 << 7) - 1);
        const float id = q8_inverse_scale(amax, d, mode);
        y[i].d = lle_fp32_to_fp16(d);
        int sum = 0;
        for (int j = 0; j < QK; ++j) {
            y[i].qs[j] = q8_round(x[i * QK + j] * id, mode);
            sum += y[i].qs[j];
        }
        y[i].s = lle_fp32_to_fp16(sum * d);
    }
}

LLE_INLINE int nearest_int(float fval) {
    float val = fval + 12582912.f;
    int i;
    memcpy(&i, &val, sizeof(int));
    return (i & 0x007fffff) - 0x00400000;
}

static void quantize_q8_K(const float *LLE_RESTRICT x, void *LLE_RESTRICT vy, int64_t k) {
    block_q8_K *y = vy;
    const int64_t nb = k / QK_K;
    for (int64_t i = 0; i < nb; i++) {
        float max = 0, amax = 0;
        for (int j = 0; j < QK_K; ++j) {
            const float ax = fabsf(x[j]);
            if (ax > amax) { amax = ax; max = x[j]; }
        }
        if (!amax) {
            y[i].d = 0;
            memset(y[i].qs, 0, QK_K);
            memset(y[i].bsums, 0, sizeof(y[i].bsums));
            x += QK_K;
            continue;
        }
        const float iscale = -127.f / max;
        for (int j = 0; j < QK_K; ++j) {
            const int v = nearest_int(iscale * x[j]);
            y[i].qs[j] = (int8_t)(v < 127 ? v : 127);
        }
        for (int j = 0; j < QK_K / 16; ++j) {
            int sum = 0;
            for (int ii = 0; ii < 16; ++ii) sum += y[i].qs[j * 16 + ii];
            y[i].bsums[j] = (int16_t)sum;
        }
        y[i].d = 1 / iscale;
        x += QK_K;
    }
}

static void quantize_f16(const float *LLE_RESTRICT x, void *LLE_RESTRICT vy, int64_t k) {
    lle_half *y = vy;
    for (int64_t i = 0; i < k; i++) y[i] = lle_fp32_to_fp16(x[i]);
}

static void quantize_bf16(const float *LLE_RESTRICT x, void *LLE_RESTRICT vy, int64_t k) {
    uint16_t *y = vy;
    for (int64_t i = 0; i < k; i++) y[i] = lle_fp32_to_bf16(x[i]);
}

static void quantize_f32(const float *LLE_RESTRICT x, void *LLE_RESTRICT vy, int64_t k) {
    memcpy(vy, x, (size_t)k * sizeof(float));
}

static void act_scales_q8_0(int k, const void *a, float *scales) {
    const block_q8_0 *y = a;
    for (int i = 0; i < k / QK; i++) scales[i] = FP16(y[i].d);
}

static void act_scales_q8_1(int k, const void *a, float *scales) {
    const block_q8_1 *y = a;
    const int nb = k / QK;
    for (int i = 0; i < nb; i++) {
        scales[i] = FP16(y[i].d);
        scales[nb + i] = FP16(y[i].s);
    }
}

/* ======================= dequantization (ggml dequantize_row_*) ======================= */

static void dequant_f32(const void *LLE_RESTRICT vx, float *LLE_RESTRICT y, int64_t k) {
    memcpy(y, vx, (size_t)k * sizeof(float));
}

static void dequant_f16(const void *LLE_RESTRICT vx, float *LLE_RESTRICT y, int64_t k) {
    const lle_half *x = vx;
    for (int64_t i = 0; i < k; i++) y[i] = FP16(x[i]);
}

static void dequant_bf16(const void *LLE_RESTRICT vx, float *LLE_RESTRICT y, int64_t k) {
    const uint16_t *x = vx;
    for (int64_t i = 0; i < k; i++) y[i] = lle_bf16_to_fp32(x[i]);
}

static void dequant_q4_0(const void *LLE_RESTRICT vx, float *LLE_RESTRICT y, int64_t k) {
    const block_q4_0 *x = vx;
    for (int64_t i = 0; i < k / QK; i++) {
        const float d = FP16(x[i].d);
        for (int j = 0; j < QK / 2; ++j) {
            y[i * QK + j] = ((x[i].qs[j] & 0x0F) - 8) * d;
            y[i * QK + j + QK / 2] = ((x[i].qs[j] >> 4) - 8) * d;
        }
    }
}

static void dequant_q4_1(const void *LLE_RESTRICT vx, float *LLE_RESTRICT y, int64_t k) {
    const block_q4_1 *x = vx;
    for (int64_t i = 0; i < k / QK; i++) {
        const float d = FP16(x[i].d), m = FP16(x[i].m);
        for (int j = 0; j < QK / 2; ++j) {
            y[i * QK + j] = (x[i].qs[j] & 0x0F) * d + m;
            y[i * QK + j + QK / 2] = (x[i].qs[j] >> 4) * d + m;
        }
    }
}

static void dequant_q5_0(const void *LLE_RESTRICT vx, float *LLE_RESTRICT y, int64_t k) {
    const block_q5_0 *x = vx;
    for (int64_t i = 0; i < k / QK; i++) {
        const float d = FP16(x[i].d);
        uint32_t qh;
        memcpy(&qh, x[i].qh, sizeof(qh));
        for (int j = 0; j < QK / 2; ++j) {
            const uint8_t xh_0 = ((qh >> (j + 0)) << 4) & 0x10;
            const uint8_t xh_1 = ((qh >> (j + 12))) & 0x10;
            y[i * QK + j] = (((x[i].qs[j] & 0x0F) | xh_0) - 16) * d;
            y[i * QK + j + QK / 2] = (((x[i].qs[j] >> 4) | xh_1) - 16) * d;
        }
    }
}

static void dequant_q5_1(const void *LLE_RESTRICT vx, float *LLE_RESTRICT y, int64_t k) {
    const block_q5_1 *x = vx;
    for (int64_t i = 0; i < k / QK; i++) {
        const float d = FP16(x[i].d), m = FP16(x[i].m);
        uint32_t qh;
        memcpy(&qh, x[i].qh, sizeof(qh));
        for (int j = 0; j < QK / 2; ++j) {
            const uint8_t xh_0 = ((qh >> (j + 0)) << 4) & 0x10;
            const uint8_t xh_1 = ((qh >> (j + 12))) & 0x10;
            y[i * QK + j] = ((x[i].qs[j] & 0x0F) | xh_0) * d + m;
            y[i * QK + j + QK / 2] = ((x[i].qs[j] >> 4) | xh_1) * d + m;
        }
    }
}

static void dequant_q8_0(const void *LLE_RESTRICT vx, float *LLE_RESTRICT y, int64_t k) {
    const block_q8_0 *x = vx;
    for (int64_t i = 0; i < k / QK; i++) {
        const float d = FP16(x[i].d);
        for (int j = 0; j < QK; ++j) y[i * QK + j] = x[i].qs[j] * d;
    }
}

static void dequant_q8_1(const void *LLE_RESTRICT vx, float *LLE_RESTRICT y, int64_t k) {
    const block_q8_1 *x = vx;
    for (int64_t i = 0; i < k / QK; i++) {
        const float d = FP16(x[i].d);
        for (int j = 0; j < QK; ++j) y[i * QK + j] = x[i].qs[j] * d;
    }
}

static void dequant_q8_K(const void *LLE_RESTRICT vx, float *LLE_RESTRICT y, int64_t k) {
    const block_q8_K *x = vx;
    for (int64_t i = 0; i < k / QK_K; i++)
        for (int j = 0; j < QK_K; ++j) y[i * QK_K + j] = x[i].d * x[i].qs[j];
}

static void dequant_q2_K(const void *LLE_RESTRICT vx, float *LLE_RESTRICT y, int64_t k) {
    const block_q2_K *x = vx;
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float d = FP16(x[i].d), min = FP16(x[i].dmin);
        const uint8_t *q = x[i].qs;
        int is = 0;
        for (int n = 0; n < QK_K; n += 128) {
            int shift = 0;
            for (int j = 0; j < 4; ++j) {
                uint8_t sc = x[i].scales[is++];
                float dl = d * (sc & 0xF), ml = min * (sc >> 4);
                for (int l = 0; l < 16; ++l) *y++ = dl * ((int8_t)((q[l] >> shift) & 3)) - ml;
                sc = x[i].scales[is++];
                dl = d * (sc & 0xF);
                ml = min * (sc >> 4);
                for (int l = 0; l < 16; ++l) *y++ = dl * ((int8_t)((q[l + 16] >> shift) & 3)) - ml;
                shift += 2;
            }
            q += 32;
        }
    }
}

/* unpack the 16 6-bit Q3_K scales (still offset by 32) */
LLE_INLINE void q3k_scales(const uint8_t *src, int8_t *scales) {
    const uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
    uint32_t aux[4];
    memcpy(aux, src, 12);
    const uint32_t tmp = aux[2];
    aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
    aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
    aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
    aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
    memcpy(scales, aux, 16);
}

static void dequant_q3_K(const void *LLE_RESTRICT vx, float *LLE_RESTRICT y, int64_t k) {
    const block_q3_K *x = vx;
    int8_t scales[16];
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float d_all = FP16(x[i].d);
        const uint8_t *q = x[i].qs;
        const uint8_t *hm = x[i].hmask;
        uint8_t m = 1;
        q3k_scales(x[i].scales, scales);
        int is = 0;
        for (int n = 0; n < QK_K; n += 128) {
            int shift = 0;
            for (int j = 0; j < 4; ++j) {
                float dl = d_all * (scales[is++] - 32);
                for (int l = 0; l < 16; ++l)
                    *y++ = dl * ((int8_t)((q[l + 0] >> shift) & 3) - ((hm[l + 0] & m) ? 0 : 4));
                dl = d_all * (scales[is++] - 32);
                for (int l = 0; l < 16; ++l)
                    *y++ = dl * ((int8_t)((q[l + 16] >> shift) & 3) - ((hm[l + 16] & m) ? 0 : 4));
                shift += 2;
                m <<= 1;
            }
            q += 32;
        }
    }
}

LLE_INLINE void get_scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
    }
}

static void dequant_q4_K(const void *LLE_RESTRICT vx, float *LLE_RESTRICT y, int64_t k) {
    const block_q4_K *x = vx;
    for (int64_t i = 0; i < k / QK_K; i++) {
        const uint8_t *q = x[i].qs;
        const float d = FP16(x[i].d), min = FP16(x[i].dmin);
        int is = 0;
        uint8_t sc, m;
        for (int j = 0; j < QK_K; j += 64) {
            get_scale_min_k4(is + 0, x[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = min * m;
            get_scale_min_k4(is + 1, x[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = min * m;
            for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xF) - m1;
            for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
            q += 32;
            is += 2;
        }
    }
}

static void dequant_q5_K(const void *LLE_RESTRICT vx, float *LLE_RESTRICT y, int64_t k) {
    const block_q5_K *x = vx;
    for (int64_t i = 0; i < k / QK_K; i++) {
        const uint8_t *ql = x[i].qs, *qh = x[i].qh;
        const float d = FP16(x[i].d), min = FP16(x[i].dmin);
        int is = 0;
        uint8_t sc, m, u1 = 1, u2 = 2;
        for (int j = 0; j < QK_K; j += 64) {
            get_scale_min_k4(is + 0, x[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = min * m;
            get_scale_min_k4(is + 1, x[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = min * m;
            for (int l = 0; l < 32; ++l) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; ++l) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
            ql += 32;
            is += 2;
            u1 <<= 2;
            u2 <<= 2;
        }
    }
}

static void dequant_q6_K(const void *LLE_RESTRICT vx, float *LLE_RESTRICT y, int64_t k) {
    const block_q6_K *x = vx;
    for (int64_t i = 0; i < k / QK_K; i++) {
        const float d = FP16(x[i].d);
        const uint8_t *ql = x[i].ql, *qh = x[i].qh;
        const int8_t *sc = x[i].scales;
        for (int n = 0; n < QK_K; n += 128) {
            for (int l = 0; l < 32; ++l) {
                const int is = l / 16;
                const int8_t q1 = (int8_t)((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int8_t q2 = (int8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int8_t q3 = (int8_t)((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int8_t q4 = (int8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l + 0] = d * sc[is + 0] * q1;
                y[l + 32] = d * sc[is + 2] * q2;
                y[l + 64] = d * sc[is + 4] * q3;
                y[l + 96] = d * sc[is + 6] * q4;
            }
            y += 128;
            ql += 64;
            qh += 32;
            sc += 8;
        }
    }
}

static void dequant_iq4_nl(const void *LLE_RESTRICT vx, float *LLE_RESTRICT y, int64_t k) {
    const block_iq4_nl *x = vx;
    for (int64_t i = 0; i < k / QK; i++) {
        const float d = FP16(x[i].d);
        for (int j = 0; j < QK / 2; ++j) {
            y[j] = d * lle_kvalues_iq4nl[x[i].qs[j] & 0xf];
            y[j + QK / 2] = d * lle_kvalues_iq4nl[x[i].qs[j] >> 4];
        }
        y += QK;
    }
}

static void dequant_iq4_xs(const void *LLE_RESTRICT vx, float *LLE_RESTRICT y, int64_t k) {
    const block_iq4_xs *x = vx;
    for (int64_t i = 0; i < k / QK_K; i++) {
        const uint8_t *qs = x[i].qs;
        const float d = FP16(x[i].d);
        for (int ib = 0; ib < QK_K / 32; ++ib) {
            const int ls = ((x[i].scales_l[ib / 2] >> 4 * (ib % 2)) & 0xf) | (((x[i].scales_h >> 2 * ib) & 3) << 4);
            const float dl = d * (ls - 32);
            for (int j = 0; j < 16; ++j) {
                y[j + 0] = dl * lle_kvalues_iq4nl[qs[j] & 0xf];
                y[j + 16] = dl * lle_kvalues_iq4nl[qs[j] >> 4];
            }
            y += 32;
            qs += 16;
        }
    }
}

/* ======================= scalar dot products (ggml *_generic) ======================= */

static void vec_dot_f32(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const float *x = vx, *y = vy;
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += (double)(x[i] * y[i]);
    *s = (float)sum;
}

static void vec_dot_f16(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const lle_half *x = vx, *y = vy;
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += (double)(FP16(x[i]) * FP16(y[i]));
    *s = (float)sum;
}

static void vec_dot_bf16(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const uint16_t *x = vx, *y = vy;
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += (double)(lle_bf16_to_fp32(x[i]) * lle_bf16_to_fp32(y[i]));
    *s = (float)sum;
}

static void vec_dot_q4_0(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const block_q4_0 *x = vx;
    const block_q8_0 *y = vy;
    float sumf = 0;
    for (int ib = 0; ib < n / QK; ++ib) {
        int sumi0 = 0, sumi1 = 0;
        for (int j = 0; j < QK / 2; ++j) {
            sumi0 += ((x[ib].qs[j] & 0x0F) - 8) * y[ib].qs[j];
            sumi1 += ((x[ib].qs[j] >> 4) - 8) * y[ib].qs[j + QK / 2];
        }
        sumf += (sumi0 + sumi1) * FP16(x[ib].d) * FP16(y[ib].d);
    }
    *s = sumf;
}

static void vec_dot_q4_1(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const block_q4_1 *x = vx;
    const block_q8_1 *y = vy;
    float sumf = 0;
    for (int ib = 0; ib < n / QK; ++ib) {
        int sumi0 = 0, sumi1 = 0;
        for (int j = 0; j < QK / 2; ++j) {
            sumi0 += (x[ib].qs[j] & 0x0F) * y[ib].qs[j];
            sumi1 += (x[ib].qs[j] >> 4) * y[ib].qs[j + QK / 2];
        }
        sumf += (FP16(x[ib].d) * FP16(y[ib].d)) * (sumi0 + sumi1) + FP16(x[ib].m) * FP16(y[ib].s);
    }
    *s = sumf;
}

static void vec_dot_q5_0(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const block_q5_0 *x = vx;
    const block_q8_0 *y = vy;
    float sumf = 0;
    for (int ib = 0; ib < n / QK; ++ib) {
        uint32_t qh;
        memcpy(&qh, x[ib].qh, sizeof(qh));
        int sumi0 = 0, sumi1 = 0;
        for (int j = 0; j < QK / 2; ++j) {
            const uint8_t xh_0 = ((qh & (1u << (j + 0))) >> (j + 0)) << 4;
            const uint8_t xh_1 = ((qh & (1u << (j + 16))) >> (j + 12));
            const int32_t x0 = (int8_t)(((x[ib].qs[j] & 0x0F) | xh_0) - 16);
            const int32_t x1 = (int8_t)(((x[ib].qs[j] >> 4) | xh_1) - 16);
            sumi0 += x0 * y[ib].qs[j];
            sumi1 += x1 * y[ib].qs[j + QK / 2];
        }
        sumf += (FP16(x[ib].d) * FP16(y[ib].d)) * (sumi0 + sumi1);
    }
    *s = sumf;
}

static void vec_dot_q5_1(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const block_q5_1 *x = vx;
    const block_q8_1 *y = vy;
    float sumf = 0;
    for (int ib = 0; ib < n / QK; ++ib) {
        uint32_t qh;
        memcpy(&qh, x[ib].qh, sizeof(qh));
        int sumi0 = 0, sumi1 = 0;
        for (int j = 0; j < QK / 2; ++j) {
            const uint8_t xh_0 = ((qh >> (j + 0)) << 4) & 0x10;
            const uint8_t xh_1 = ((qh >> (j + 12))) & 0x10;
            sumi0 += ((x[ib].qs[j] & 0xF) | xh_0) * y[ib].qs[j];
            sumi1 += ((x[ib].qs[j] >> 4) | xh_1) * y[ib].qs[j + QK / 2];
        }
        sumf += (FP16(x[ib].d) * FP16(y[ib].d)) * (sumi0 + sumi1) + FP16(x[ib].m) * FP16(y[ib].s);
    }
    *s = sumf;
}

static void vec_dot_q8_0(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const block_q8_0 *x = vx;
    const block_q8_0 *y = vy;
    float sumf = 0;
    for (int ib = 0; ib < n / QK; ++ib) {
        int sumi = 0;
        for (int j = 0; j < QK; j++) sumi += x[ib].qs[j] * y[ib].qs[j];
        sumf += sumi * (FP16(x[ib].d) * FP16(y[ib].d));
    }
    *s = sumf;
}

static void vec_dot_q2_K(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const block_q2_K *x = vx;
    const block_q8_K *y = vy;
    float sumf = 0;
    for (int i = 0; i < n / QK_K; ++i) {
        const uint8_t *q2 = x[i].qs;
        const int8_t *q8 = y[i].qs;
        const uint8_t *sc = x[i].scales;
        int summs = 0;
        for (int j = 0; j < 16; ++j) summs += y[i].bsums[j] * (sc[j] >> 4);
        const float dall = y[i].d * FP16(x[i].d);
        const float dmin = y[i].d * FP16(x[i].dmin);
        int isum = 0, is = 0;
        for (int k = 0; k < QK_K / 128; ++k) {
            int shift = 0;
            for (int j = 0; j < 4; ++j) {
                int d = sc[is++] & 0xF;
                int isuml = 0;
                for (int l = 0; l < 16; ++l) isuml += q8[l] * ((q2[l] >> shift) & 3);
                isum += d * isuml;
                d = sc[is++] & 0xF;
                isuml = 0;
                for (int l = 16; l < 32; ++l) isuml += q8[l] * ((q2[l] >> shift) & 3);
                isum += d * isuml;
                shift += 2;
                q8 += 32;
            }
            q2 += 32;
        }
        sumf += dall * isum - dmin * summs;
    }
    *s = sumf;
}

static void vec_dot_q3_K(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const block_q3_K *x = vx;
    const block_q8_K *y = vy;
    int8_t aux8[QK_K];
    int16_t aux16[8];
    float sums[8] = {0};
    int32_t aux32[8];
    int8_t scales[16];
    for (int i = 0; i < n / QK_K; ++i) {
        const uint8_t *q3 = x[i].qs, *hm = x[i].hmask;
        const int8_t *q8 = y[i].qs;
        memset(aux32, 0, sizeof(aux32));
        int8_t *a = aux8;
        uint8_t m = 1;
        for (int j = 0; j < QK_K; j += 128) {
            for (int sh = 0; sh < 8; sh += 2) {
                for (int l = 0; l < 32; ++l) a[l] = (int8_t)(((q3[l] >> sh) & 3) - (hm[l] & m ? 0 : 4));
                a += 32;
                m <<= 1;
            }
            q3 += 32;
        }
        a = aux8;
        q3k_scales(x[i].scales, scales);
        for (int j = 0; j < QK_K / 16; ++j) {
            for (int h = 0; h < 2; ++h) {
                for (int l = 0; l < 8; ++l) aux16[l] = (int16_t)(q8[l] * a[l]);
                for (int l = 0; l < 8; ++l) aux32[l] += (scales[j] - 32) * aux16[l];
                q8 += 8;
                a += 8;
            }
        }
        const float d = FP16(x[i].d) * y[i].d;
        for (int l = 0; l < 8; ++l) sums[l] += d * aux32[l];
    }
    float sumf = 0;
    for (int l = 0; l < 8; ++l) sumf += sums[l];
    *s = sumf;
}

/* unpack the 8 6-bit scales and 8 6-bit mins of a Q4_K/Q5_K block */
LLE_INLINE void k4_scales_mins(const uint8_t *src, uint8_t *scales, uint8_t *mins) {
    const uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
    uint32_t utmp[4];
    memcpy(utmp, src, 12);
    utmp[3] = ((utmp[2] >> 4) & kmask2) | (((utmp[1] >> 6) & kmask3) << 4);
    const uint32_t uaux = utmp[1] & kmask1;
    utmp[1] = (utmp[2] & kmask2) | (((utmp[0] >> 6) & kmask3) << 4);
    utmp[2] = uaux;
    utmp[0] &= kmask1;
    memcpy(scales, utmp, 8);
    memcpy(mins, utmp + 2, 8);
}

static void vec_dot_q4_K(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const block_q4_K *x = vx;
    const block_q8_K *y = vy;
    uint8_t scales[8], mins[8];
    int8_t aux8[QK_K];
    int16_t aux16[8];
    float sums[8] = {0};
    int32_t aux32[8];
    float sumf = 0;
    for (int i = 0; i < n / QK_K; ++i) {
        const uint8_t *q4 = x[i].qs;
        const int8_t *q8 = y[i].qs;
        memset(aux32, 0, sizeof(aux32));
        int8_t *a = aux8;
        for (int j = 0; j < QK_K / 64; ++j) {
            for (int l = 0; l < 32; ++l) a[l] = (int8_t)(q4[l] & 0xF);
            a += 32;
            for (int l = 0; l < 32; ++l) a[l] = (int8_t)(q4[l] >> 4);
            a += 32;
            q4 += 32;
        }
        k4_scales_mins(x[i].scales, scales, mins);
        int sumi = 0;
        for (int j = 0; j < QK_K / 16; ++j) sumi += y[i].bsums[j] * mins[j / 2];
        a = aux8;
        for (int j = 0; j < QK_K / 32; ++j) {
            const int32_t scale = scales[j];
            for (int h = 0; h < 4; ++h) {
                for (int l = 0; l < 8; ++l) aux16[l] = (int16_t)(q8[l] * a[l]);
                for (int l = 0; l < 8; ++l) aux32[l] += scale * aux16[l];
                q8 += 8;
                a += 8;
            }
        }
        const float d = FP16(x[i].d) * y[i].d;
        for (int l = 0; l < 8; ++l) sums[l] += d * aux32[l];
        const float dmin = FP16(x[i].dmin) * y[i].d;
        sumf -= dmin * sumi;
    }
    for (int l = 0; l < 8; ++l) sumf += sums[l];
    *s = sumf;
}

static void vec_dot_q5_K(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const block_q5_K *x = vx;
    const block_q8_K *y = vy;
    uint8_t scales[8], mins[8];
    int8_t aux8[QK_K];
    int16_t aux16[8];
    float sums[8] = {0};
    int32_t aux32[8];
    float sumf = 0;
    for (int i = 0; i < n / QK_K; ++i) {
        const uint8_t *q4 = x[i].qs, *hm = x[i].qh;
        const int8_t *q8 = y[i].qs;
        memset(aux32, 0, sizeof(aux32));
        int8_t *a = aux8;
        uint8_t m = 1;
        for (int j = 0; j < QK_K / 64; ++j) {
            for (int l = 0; l < 32; ++l) a[l] = (int8_t)((q4[l] & 0xF) + (hm[l] & m ? 16 : 0));
            a += 32;
            m <<= 1;
            for (int l = 0; l < 32; ++l) a[l] = (int8_t)((q4[l] >> 4) + (hm[l] & m ? 16 : 0));
            a += 32;
            m <<= 1;
            q4 += 32;
        }
        k4_scales_mins(x[i].scales, scales, mins);
        int sumi = 0;
        for (int j = 0; j < QK_K / 16; ++j) sumi += y[i].bsums[j] * mins[j / 2];
        a = aux8;
        for (int j = 0; j < QK_K / 32; ++j) {
            const int32_t scale = scales[j];
            for (int h = 0; h < 4; ++h) {
                for (int l = 0; l < 8; ++l) aux16[l] = (int16_t)(q8[l] * a[l]);
                for (int l = 0; l < 8; ++l) aux32[l] += scale * aux16[l];
                q8 += 8;
                a += 8;
            }
        }
        const float d = FP16(x[i].d) * y[i].d;
        for (int l = 0; l < 8; ++l) sums[l] += d * aux32[l];
        const float dmin = FP16(x[i].dmin) * y[i].d;
        sumf -= dmin * sumi;
    }
    for (int l = 0; l < 8; ++l) sumf += sums[l];
    *s = sumf;
}

static void vec_dot_q6_K(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const block_q6_K *x = vx;
    const block_q8_K *y = vy;
    int8_t aux8[QK_K];
    int16_t aux16[8];
    float sums[8] = {0};
    int32_t aux32[8];
    for (int i = 0; i < n / QK_K; ++i) {
        const uint8_t *q4 = x[i].ql, *qh = x[i].qh;
        const int8_t *q8 = y[i].qs;
        memset(aux32, 0, sizeof(aux32));
        int8_t *a = aux8;
        for (int j = 0; j < QK_K; j += 128) {
            for (int l = 0; l < 32; ++l) {
                a[l + 0] = (int8_t)((q4[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                a[l + 32] = (int8_t)((q4[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                a[l + 64] = (int8_t)((q4[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                a[l + 96] = (int8_t)((q4[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            }
            a += 128;
            q4 += 64;
            qh += 32;
        }
        a = aux8;
        for (int j = 0; j < QK_K / 16; ++j) {
            const int scale = x[i].scales[j];
            for (int h = 0; h < 2; ++h) {
                for (int l = 0; l < 8; ++l) aux16[l] = (int16_t)(q8[l] * a[l]);
                for (int l = 0; l < 8; ++l) aux32[l] += scale * aux16[l];
                q8 += 8;
                a += 8;
            }
        }
        const float d = FP16(x[i].d) * y[i].d;
        for (int l = 0; l < 8; ++l) sums[l] += d * aux32[l];
    }
    float sumf = 0;
    for (int l = 0; l < 8; ++l) sumf += sums[l];
    *s = sumf;
}

static void vec_dot_iq4_nl(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const block_iq4_nl *x = vx;
    const block_q8_0 *y = vy;
    float sumf = 0;
    for (int ib = 0; ib < n / QK; ++ib) {
        const float d = FP16(y[ib].d) * FP16(x[ib].d);
        int sumi1 = 0, sumi2 = 0;
        for (int j = 0; j < QK / 2; ++j) {
            sumi1 += y[ib].qs[j] * lle_kvalues_iq4nl[x[ib].qs[j] & 0xf];
            sumi2 += y[ib].qs[j + QK / 2] * lle_kvalues_iq4nl[x[ib].qs[j] >> 4];
        }
        sumf += d * (sumi1 + sumi2);
    }
    *s = sumf;
}

static void vec_dot_iq4_xs(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const block_iq4_xs *x = vx;
    const block_q8_K *y = vy;
    float sumf = 0;
    for (int ibl = 0; ibl < n / QK_K; ++ibl) {
        const float d4d8 = FP16(x[ibl].d) * y[ibl].d;
        uint16_t h = x[ibl].scales_h;
        const uint8_t *qs = x[ibl].qs;
        const int8_t *q8 = y[ibl].qs;
        for (int ib = 0; ib < QK_K / 32; ib += 2) {
            const uint8_t ls1 = (x[ibl].scales_l[ib / 2] & 0xf) | ((h << 4) & 0x30);
            const uint8_t ls2 = (x[ibl].scales_l[ib / 2] >> 4) | ((h << 2) & 0x30);
            h >>= 4;
            const float d1 = d4d8 * (ls1 - 32);
            const float d2 = d4d8 * (ls2 - 32);
            int sumi1 = 0, sumi2 = 0;
            for (int j = 0; j < 16; ++j) {
                sumi1 += q8[j + 0] * lle_kvalues_iq4nl[qs[j] & 0xf];
                sumi2 += q8[j + 16] * lle_kvalues_iq4nl[qs[j] >> 4];
            }
            sumf += d1 * (sumi1 + sumi2);
            qs += 16;
            q8 += 32;
            sumi1 = sumi2 = 0;
            for (int j = 0; j < 16; ++j) {
                sumi1 += q8[j + 0] * lle_kvalues_iq4nl[qs[j] & 0xf];
                sumi2 += q8[j + 16] * lle_kvalues_iq4nl[qs[j] >> 4];
            }
            sumf += d2 * (sumi1 + sumi2);
            qs += 16;
            q8 += 32;
        }
    }
    *s = sumf;
}

void lle_register_scalar(void) {
    lle_kernels *t = lle_kernels_scalar;
    t[T_F32] = (lle_kernels){.to_float = dequant_f32, .from_float = quantize_f32, .vec_dot = vec_dot_f32};
    t[T_F16] = (lle_kernels){.to_float = dequant_f16, .from_float = quantize_f16, .vec_dot = vec_dot_f16};
    t[T_BF16] = (lle_kernels){.to_float = dequant_bf16, .from_float = quantize_bf16, .vec_dot = vec_dot_bf16};
    t[T_Q4_0] = (lle_kernels){.to_float = dequant_q4_0, .vec_dot = vec_dot_q4_0};
    t[T_Q4_1] = (lle_kernels){.to_float = dequant_q4_1, .vec_dot = vec_dot_q4_1};
    t[T_Q5_0] = (lle_kernels){.to_float = dequant_q5_0, .vec_dot = vec_dot_q5_0};
    t[T_Q5_1] = (lle_kernels){.to_float = dequant_q5_1, .vec_dot = vec_dot_q5_1};
    t[T_Q8_0] = (lle_kernels){.to_float = dequant_q8_0, .from_float = quantize_q8_0, .act_scales = act_scales_q8_0,
                              .vec_dot = vec_dot_q8_0};
    t[T_Q8_1] = (lle_kernels){.to_float = dequant_q8_1, .from_float = quantize_q8_1, .act_scales = act_scales_q8_1};
    t[T_Q8_K] = (lle_kernels){.to_float = dequant_q8_K, .from_float = quantize_q8_K};
    t[T_Q2_K] = (lle_kernels){.to_float = dequant_q2_K, .vec_dot = vec_dot_q2_K};
    t[T_Q3_K] = (lle_kernels){.to_float = dequant_q3_K, .vec_dot = vec_dot_q3_K};
    t[T_Q4_K] = (lle_kernels){.to_float = dequant_q4_K, .vec_dot = vec_dot_q4_K};
    t[T_Q5_K] = (lle_kernels){.to_float = dequant_q5_K, .vec_dot = vec_dot_q5_K};
    t[T_Q6_K] = (lle_kernels){.to_float = dequant_q6_K, .vec_dot = vec_dot_q6_K};
    t[T_IQ4_NL] = (lle_kernels){.to_float = dequant_iq4_nl, .vec_dot = vec_dot_iq4_nl};
    t[T_IQ4_XS] = (lle_kernels){.to_float = dequant_iq4_xs, .vec_dot = vec_dot_iq4_xs};
}
