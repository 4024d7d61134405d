/* ARM NEON + dotprod kernels (aarch64 only; elsewhere this file compiles to an empty table):
 * Q8_0/Q8_1 activation quantizers and integer dot products for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
 * IQ4_NL, Q4_K and Q6_K, ported from ggml's NEON kernels (MIT, The ggml authors) so results follow
 * llama.cpp's ARM build. The other types use the scalar kernels. Selected at run time only when
 * the CPU reports asimddp (HWCAP); checked against the scalar kernels by native/selftest.c.
 */
#include "common.h"

lle_kernels lle_kernels_neon[T_COUNT];

#if defined(__aarch64__)

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("dotprod"))), apply_to = function)
#else
#pragma GCC target("arch=armv8.2-a+dotprod")
#endif

#include <arm_neon.h>

#define VDOT(acc, a, b) vdotq_s32(acc, a, b)

/* (!b) << 4 for the 8 bits of a byte, one byte each (ggml's table_b2b_1) */
static uint64_t table_b2b_1[256];

static void init_tables(void) {
    for (int i = 0; i < 256; i++) {
        uint64_t v = 0;
        for (int b = 0; b < 8; b++)
            if (!((i >> b) & 1)) v |= (uint64_t)0x10 << (8 * b);
        table_b2b_1[i] = v;
    }
}

/* ---------------------------------------------------------------- activation quantizers */

static void quantize_q8_row(const float *LLE_RESTRICT x, int8_t *qs, float *dout, int32_t *sum_out) {
    float32x4_t srcv[8], amaxv = vdupq_n_f32(0.0f);
    for (int j = 0; j < 8; j++) {
        srcv[j] = vld1q_f32(x + 4 * j);
        amaxv = vmaxq_f32(amaxv, vabsq_f32(srcv[j]));
    }
    const float amax = vmaxvq_f32(amaxv);
    const float d = amax / ((1 << 7) - 1);
    const int mode = lle_act_rounding;
    const float id = mode == LLE_ROUND_X86 ? (amax != 0.0f ? 127.f / amax : 0.0f) : (d ? 1.0f / d : 0.0f);
    int32x4_t accv = vdupq_n_s32(0);
    for (int j = 0; j < 8; j++) {
        const float32x4_t v = vmulq_n_f32(srcv[j], id);
        /* vrndaq: ties away from zero (roundf); vcvtnq: ties to even */
        const int32x4_t vi = mode == LLE_ROUND_REF ? vcvtq_s32_f32(vrndaq_f32(v)) : vcvtnq_s32_f32(v);
        qs[4 * j + 0] = (int8_t)vgetq_lane_s32(vi, 0);
        qs[4 * j + 1] = (int8_t)vgetq_lane_s32(vi, 1);
        qs[4 * j + 2] = (int8_t)vgetq_lane_s32(vi, 2);
        qs[4 * j + 3] = (int8_t)vgetq_lane_s32(vi, 3);
        accv = vaddq_s32(accv, vi);
    }
    *dout = d;
    *sum_out = vaddvq_s32(accv);
}

static void quantize_q8_0(const float *LLE_RESTRICT x, void *LLE_RESTRICT vy, int64_t k) {
    block_q8_0 *y = vy;
    for (int64_t i = 0; i < k / QK; i++) {
        float d;
        int32_t sum;
        quantize_q8_row(x + i * QK, y[i].qs, &d, &sum);
        y[i].d = lle_fp32_to_fp16(d);
    }
}

static void quantize_q8_1(const float *LLE_RESTRICT x, void *LLE_RESTRICT vy, int64_t k) {
    block_q8_1 *y = vy;
    for (int64_t i = 0; i < k / QK; i++) {
        float d;
        int32_t sum;
        quantize_q8_row(x + i * QK, y[i].qs, &d, &sum);
        y[i].d = lle_fp32_to_fp16(d);
        y[i].s = lle_fp32_to_fp16(d * sum);
    }
}

/* ---------------------------------------------------------------- 32-block dot products */

static void vec_dot_q4_0(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const block_q4_0 *x = vx;
    const block_q8_0 *y = vy;
    const int nb = n / QK;
    const uint8x16_t m4b = vdupq_n_u8(0x0F);
    const int8x16_t s8b = vdupq_n_s8(0x8);
    float32x4_t sumv0 = vdupq_n_f32(0.0f), sumv1 = vdupq_n_f32(0.0f);
    int ib = 0;
    for (; ib + 1 < nb; ib += 2) {
        const uint8x16_t v0_0 = vld1q_u8(x[ib].qs), v0_1 = vld1q_u8(x[ib + 1].qs);
        const int8x16_t v0_0ls = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v0_0, m4b)), s8b);
        const int8x16_t v0_0hs = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v0_0, 4)), s8b);
        const int8x16_t v0_1ls = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v0_1, m4b)), s8b);
        const int8x16_t v0_1hs = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v0_1, 4)), s8b);
        const int32x4_t p_0 = VDOT(VDOT(vdupq_n_s32(0), v0_0ls, vld1q_s8(y[ib].qs)), v0_0hs, vld1q_s8(y[ib].qs + 16));
        const int32x4_t p_1 = VDOT(VDOT(vdupq_n_s32(0), v0_1ls, vld1q_s8(y[ib + 1].qs)), v0_1hs, vld1q_s8(y[ib + 1].qs + 16));
        sumv0 = vmlaq_n_f32(sumv0, vcvtq_f32_s32(p_0), FP16(x[ib].d) * FP16(y[ib].d));
        sumv1 = vmlaq_n_f32(sumv1, vcvtq_f32_s32(p_1), FP16(x[ib + 1].d) * FP16(y[ib + 1].d));
    }
    float sumf = vaddvq_f32(sumv0) + vaddvq_f32(sumv1);
    for (; ib < nb; ++ib) {
        int sumi = 0;
        for (int j = 0; j < QK / 2; ++j)
            sumi += ((x[ib].qs[j] & 0x0F) - 8) * y[ib].qs[j] + ((x[ib].qs[j] >> 4) - 8) * y[ib].qs[j + QK / 2];
        sumf += sumi * FP16(x[ib].d) * FP16(y[ib].d);
    }
    *s = sumf;
}

static void vec_dot_q4_1(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const block_q4_1 *x = vx;
    const block_q8_1 *y = vy;
    const int nb = n / QK;
    const uint8x16_t m4b = vdupq_n_u8(0x0F);
    float32x4_t sumv0 = vdupq_n_f32(0.0f), sumv1 = vdupq_n_f32(0.0f);
    float summs = 0;
    int ib = 0;
    for (; ib + 1 < nb; ib += 2) {
        summs += FP16(x[ib].m) * FP16(y[ib].s) + FP16(x[ib + 1].m) * FP16(y[ib + 1].s);
        const uint8x16_t v0_0 = vld1q_u8(x[ib].qs), v0_1 = vld1q_u8(x[ib + 1].qs);
        const int8x16_t v0_0l = vreinterpretq_s8_u8(vandq_u8(v0_0, m4b));
        const int8x16_t v0_0h = vreinterpretq_s8_u8(vshrq_n_u8(v0_0, 4));
        const int8x16_t v0_1l = vreinterpretq_s8_u8(vandq_u8(v0_1, m4b));
        const int8x16_t v0_1h = vreinterpretq_s8_u8(vshrq_n_u8(v0_1, 4));
        const int32x4_t p_0 = VDOT(VDOT(vdupq_n_s32(0), v0_0l, vld1q_s8(y[ib].qs)), v0_0h, vld1q_s8(y[ib].qs + 16));
        const int32x4_t p_1 = VDOT(VDOT(vdupq_n_s32(0), v0_1l, vld1q_s8(y[ib + 1].qs)), v0_1h, vld1q_s8(y[ib + 1].qs + 16));
        sumv0 = vmlaq_n_f32(sumv0, vcvtq_f32_s32(p_0), FP16(x[ib].d) * FP16(y[ib].d));
        sumv1 = vmlaq_n_f32(sumv1, vcvtq_f32_s32(p_1), FP16(x[ib + 1].d) * FP16(y[ib + 1].d));
    }
    float sumf = vaddvq_f32(sumv0) + vaddvq_f32(sumv1) + summs;
    for (; ib < nb; ++ib) {
        int sumi = 0;
        for (int j = 0; j < QK / 2; ++j)
            sumi += (x[ib].qs[j] & 0x0F) * y[ib].qs[j] + (x[ib].qs[j] >> 4) * y[ib].qs[j + QK / 2];
        sumf += (FP16(x[ib].d) * FP16(y[ib].d)) * sumi + FP16(x[ib].m) * FP16(y[ib].s);
    }
    *s = sumf;
}

/* the 5th bits of a Q5 block as bytes: (!b) << 4 (Q5_0, subtracted) */
LLE_INLINE void q5_high_bits(const uint8_t *qh4, int8x16_t *lo, int8x16_t *hi) {
    uint32_t qh;
    uint64_t tmp[4];
    memcpy(&qh, qh4, sizeof(qh));
    tmp[0] = table_b2b_1[(qh >> 0) & 0xFF];
    tmp[1] = table_b2b_1[(qh >> 8) & 0xFF];
    tmp[2] = table_b2b_1[(qh >> 16) & 0xFF];
    tmp[3] = table_b2b_1[(qh >> 24)];
    *lo = vld1q_s8((const int8_t *)(tmp + 0));
    *hi = vld1q_s8((const int8_t *)(tmp + 2));
}

static void vec_dot_q5_0(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const block_q5_0 *x = vx;
    const block_q8_0 *y = vy;
    const int nb = n / QK;
    const uint8x16_t m4b = vdupq_n_u8(0x0F);
    float32x4_t sumv0 = vdupq_n_f32(0.0f), sumv1 = vdupq_n_f32(0.0f);
    int ib = 0;
    for (; ib + 1 < nb; ib += 2) {
        int8x16_t qhl0, qhh0, qhl1, qhh1;
        q5_high_bits(x[ib].qh, &qhl0, &qhh0);
        q5_high_bits(x[ib + 1].qh, &qhl1, &qhh1);
        const uint8x16_t v0_0 = vld1q_u8(x[ib].qs), v0_1 = vld1q_u8(x[ib + 1].qs);
        const int8x16_t v0_0lf = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v0_0, m4b)), qhl0);
        const int8x16_t v0_0hf = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v0_0, 4)), qhh0);
        const int8x16_t v0_1lf = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v0_1, m4b)), qhl1);
        const int8x16_t v0_1hf = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v0_1, 4)), qhh1);
        sumv0 = vmlaq_n_f32(sumv0, vcvtq_f32_s32(vaddq_s32(VDOT(vdupq_n_s32(0), v0_0lf, vld1q_s8(y[ib].qs)),
                                                          VDOT(vdupq_n_s32(0), v0_0hf, vld1q_s8(y[ib].qs + 16)))),
                            FP16(x[ib].d) * FP16(y[ib].d));
        sumv1 = vmlaq_n_f32(sumv1, vcvtq_f32_s32(vaddq_s32(VDOT(vdupq_n_s32(0), v0_1lf, vld1q_s8(y[ib + 1].qs)),
                                                          VDOT(vdupq_n_s32(0), v0_1hf, vld1q_s8(y[ib + 1].qs + 16)))),
                            FP16(x[ib + 1].d) * FP16(y[ib + 1].d));
    }
    float sumf = vaddvq_f32(sumv0) + vaddvq_f32(sumv1);
    for (; ib < nb; ++ib) {
        uint32_t qh;
        memcpy(&qh, x[ib].qh, sizeof(qh));
        int sumi = 0;
        for (int j = 0; j < QK / 2; ++j) {
            const int32_t x0 = (int8_t)(((x[ib].qs[j] & 0x0F) | (((qh >> j) << 4) & 0x10)) - 16);
            const int32_t x1 = (int8_t)(((x[ib].qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)) - 16);
            sumi += x0 * y[ib].qs[j] + x1 * y[ib].qs[j + QK / 2];
        }
        sumf += (FP16(x[ib].d) * FP16(y[ib].d)) * sumi;
    }
    *s = sumf;
}

static void vec_dot_q5_1(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const block_q5_1 *x = vx;
    const block_q8_1 *y = vy;
    const int nb = n / QK;
    const uint8x16_t m4b = vdupq_n_u8(0x0F);
    const int8x16_t m16 = vdupq_n_s8(0x10);
    float32x4_t sumv0 = vdupq_n_f32(0.0f), sumv1 = vdupq_n_f32(0.0f);
    float summs = 0;
    int ib = 0;
    for (; ib + 1 < nb; ib += 2) {
        summs += FP16(x[ib].m) * FP16(y[ib].s) + FP16(x[ib + 1].m) * FP16(y[ib + 1].s);
        int8x16_t nl0, nh0, nl1, nh1;  /* (!b) << 4; the bit itself is 0x10 - that */
        q5_high_bits(x[ib].qh, &nl0, &nh0);
        q5_high_bits(x[ib + 1].qh, &nl1, &nh1);
        const uint8x16_t v0_0 = vld1q_u8(x[ib].qs), v0_1 = vld1q_u8(x[ib + 1].qs);
        const int8x16_t v0_0lf = vorrq_s8(vreinterpretq_s8_u8(vandq_u8(v0_0, m4b)), vsubq_s8(m16, nl0));
        const int8x16_t v0_0hf = vorrq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v0_0, 4)), vsubq_s8(m16, nh0));
        const int8x16_t v0_1lf = vorrq_s8(vreinterpretq_s8_u8(vandq_u8(v0_1, m4b)), vsubq_s8(m16, nl1));
        const int8x16_t v0_1hf = vorrq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v0_1, 4)), vsubq_s8(m16, nh1));
        sumv0 = vmlaq_n_f32(sumv0, vcvtq_f32_s32(vaddq_s32(VDOT(vdupq_n_s32(0), v0_0lf, vld1q_s8(y[ib].qs)),
                                                          VDOT(vdupq_n_s32(0), v0_0hf, vld1q_s8(y[ib].qs + 16)))),
                            FP16(x[ib].d) * FP16(y[ib].d));
        sumv1 = vmlaq_n_f32(sumv1, vcvtq_f32_s32(vaddq_s32(VDOT(vdupq_n_s32(0), v0_1lf, vld1q_s8(y[ib + 1].qs)),
                                                          VDOT(vdupq_n_s32(0), v0_1hf, vld1q_s8(y[ib + 1].qs + 16)))),
                            FP16(x[ib + 1].d) * FP16(y[ib + 1].d));
    }
    float sumf = vaddvq_f32(sumv0) + vaddvq_f32(sumv1) + summs;
    for (; ib < nb; ++ib) {
        uint32_t qh;
        memcpy(&qh, x[ib].qh, sizeof(qh));
        int sumi = 0;
        for (int j = 0; j < QK / 2; ++j) {
            sumi += ((x[ib].qs[j] & 0xF) | (((qh >> j) << 4) & 0x10)) * y[ib].qs[j];
            sumi += ((x[ib].qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)) * y[ib].qs[j + QK / 2];
        }
        sumf += (FP16(x[ib].d) * FP16(y[ib].d)) * sumi + FP16(x[ib].m) * FP16(y[ib].s);
    }
    *s = sumf;
}

static void vec_dot_q8_0(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const block_q8_0 *x = vx;
    const block_q8_0 *y = vy;
    const int nb = n / QK;
    float32x4_t sumv0 = vdupq_n_f32(0.0f), sumv1 = vdupq_n_f32(0.0f);
    int ib = 0;
    for (; ib + 1 < nb; ib += 2) {
        sumv0 = vmlaq_n_f32(sumv0, vcvtq_f32_s32(vaddq_s32(VDOT(vdupq_n_s32(0), vld1q_s8(x[ib].qs), vld1q_s8(y[ib].qs)),
                                                          VDOT(vdupq_n_s32(0), vld1q_s8(x[ib].qs + 16), vld1q_s8(y[ib].qs + 16)))),
                            FP16(x[ib].d) * FP16(y[ib].d));
        sumv1 = vmlaq_n_f32(sumv1, vcvtq_f32_s32(vaddq_s32(VDOT(vdupq_n_s32(0), vld1q_s8(x[ib + 1].qs), vld1q_s8(y[ib + 1].qs)),
                                                          VDOT(vdupq_n_s32(0), vld1q_s8(x[ib + 1].qs + 16), vld1q_s8(y[ib + 1].qs + 16)))),
                            FP16(x[ib + 1].d) * FP16(y[ib + 1].d));
    }
    float sumf = vaddvq_f32(sumv0) + vaddvq_f32(sumv1);
    for (; ib < nb; ++ib) {
        int sumi = 0;
        for (int j = 0; j < QK; j++) sumi += x[ib].qs[j] * y[ib].qs[j];
        sumf += sumi * (FP16(x[ib].d) * FP16(y[ib].d));
    }
    *s = sumf;
}

static void vec_dot_iq4_nl(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const block_iq4_nl *x = vx;
    const block_q8_0 *y = vy;
    const int nb = n / QK;
    const int8x16_t values = vld1q_s8(lle_kvalues_iq4nl);
    const uint8x16_t m4b = vdupq_n_u8(0x0f);
    float sumf = 0;
    int ib = 0;
    for (; ib + 1 < nb; ib += 2) {
        const uint8x16_t b0 = vld1q_u8(x[ib].qs), b1 = vld1q_u8(x[ib + 1].qs);
        const int8x16_t q0 = vqtbl1q_s8(values, vandq_u8(b0, m4b)), q1 = vqtbl1q_s8(values, vshrq_n_u8(b0, 4));
        const int8x16_t q2 = vqtbl1q_s8(values, vandq_u8(b1, m4b)), q3 = vqtbl1q_s8(values, vshrq_n_u8(b1, 4));
        const int32x4_t p1 = VDOT(VDOT(vdupq_n_s32(0), q0, vld1q_s8(y[ib].qs)), q1, vld1q_s8(y[ib].qs + 16));
        const int32x4_t p2 = VDOT(VDOT(vdupq_n_s32(0), q2, vld1q_s8(y[ib + 1].qs)), q3, vld1q_s8(y[ib + 1].qs + 16));
        sumf += FP16(x[ib].d) * FP16(y[ib].d) * vaddvq_s32(p1) + FP16(x[ib + 1].d) * FP16(y[ib + 1].d) * vaddvq_s32(p2);
    }
    for (; ib < nb; ++ib) {
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

/* ---------------------------------------------------------------- K-quant dot products */

static void vec_dot_q4_K(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const block_q4_K *x = vx;
    const block_q8_K *y = vy;
    const uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
    const uint8x16_t m4b = vdupq_n_u8(0xf);
    const int32x4_t mzero = vdupq_n_s32(0);
    uint32_t utmp[4];
    float sumf = 0;
    for (int i = 0; i < n / QK_K; ++i) {
        const float d = y[i].d * FP16(x[i].d);
        const float dmin = y[i].d * FP16(x[i].dmin);
        const int16x8_t q8sums = vpaddq_s16(vld1q_s16(y[i].bsums), vld1q_s16(y[i].bsums + 8));
        memcpy(utmp, x[i].scales, 12);
        uint32x2_t mins8 = vdup_n_u32(0);
        mins8 = vset_lane_u32(utmp[1] & kmask1, mins8, 0);
        mins8 = vset_lane_u32(((utmp[2] >> 4) & kmask2) | (((utmp[1] >> 6) & kmask3) << 4), mins8, 1);
        utmp[1] = (utmp[2] & kmask2) | (((utmp[0] >> 6) & kmask3) << 4);
        utmp[0] &= kmask1;
        const int16x8_t mins = vreinterpretq_s16_u16(vmovl_u8(vreinterpret_u8_u32(mins8)));
        const int32x4_t prod = vaddq_s32(vmull_s16(vget_low_s16(q8sums), vget_low_s16(mins)),
                                         vmull_s16(vget_high_s16(q8sums), vget_high_s16(mins)));
        sumf -= dmin * vaddvq_s32(prod);
        const uint8_t *scales = (const uint8_t *)utmp;
        const uint8_t *q4 = x[i].qs;
        const int8_t *q8 = y[i].qs;
        int32_t sumi1 = 0, sumi2 = 0;
        for (int j = 0; j < QK_K / 64; ++j) {
            const uint8x16_t b0 = vld1q_u8(q4), b1 = vld1q_u8(q4 + 16);
            q4 += 32;
            const int32x4_t p1 = VDOT(VDOT(mzero, vreinterpretq_s8_u8(vandq_u8(b0, m4b)), vld1q_s8(q8)),
                                      vreinterpretq_s8_u8(vandq_u8(b1, m4b)), vld1q_s8(q8 + 16));
            sumi1 += vaddvq_s32(p1) * scales[2 * j + 0];
            const int32x4_t p2 = VDOT(VDOT(mzero, vreinterpretq_s8_u8(vshrq_n_u8(b0, 4)), vld1q_s8(q8 + 32)),
                                      vreinterpretq_s8_u8(vshrq_n_u8(b1, 4)), vld1q_s8(q8 + 48));
            sumi2 += vaddvq_s32(p2) * scales[2 * j + 1];
            q8 += 64;
        }
        sumf += d * (sumi1 + sumi2);
    }
    *s = sumf;
}

static void vec_dot_q6_K(int n, float *LLE_RESTRICT s, const void *LLE_RESTRICT vx, const void *LLE_RESTRICT vy) {
    const block_q6_K *x = vx;
    const block_q8_K *y = vy;
    const uint8x16_t m4b = vdupq_n_u8(0xF);
    const int32x4_t vzero = vdupq_n_s32(0);
    const uint8x16_t mthree = vdupq_n_u8(3);
    float sum = 0;
    for (int i = 0; i < n / QK_K; ++i) {
        const float d_all = FP16(x[i].d);
        const uint8_t *q6 = x[i].ql, *qh = x[i].qh;
        const int8_t *q8 = y[i].qs;
        const int8_t *scale = x[i].scales;
        const int16x8_t s0 = vld1q_s16(y[i].bsums), s1 = vld1q_s16(y[i].bsums + 8);
        const int8x16_t scales = vld1q_s8(scale);
        const int16x8_t sc0 = vmovl_s8(vget_low_s8(scales)), sc1 = vmovl_s8(vget_high_s8(scales));
        const int32x4_t prod = vaddq_s32(vaddq_s32(vmull_s16(vget_low_s16(s0), vget_low_s16(sc0)),
                                                   vmull_s16(vget_high_s16(s0), vget_high_s16(sc0))),
                                         vaddq_s32(vmull_s16(vget_low_s16(s1), vget_low_s16(sc1)),
                                                   vmull_s16(vget_high_s16(s1), vget_high_s16(sc1))));
        const int32_t isum_mins = vaddvq_s32(prod);
        int32_t isum = 0;
        for (int j = 0; j < QK_K / 128; ++j) {
            const uint8x16_t qh0 = vld1q_u8(qh), qh1 = vld1q_u8(qh + 16);
            qh += 32;
            uint8x16_t b[4];
            for (int l = 0; l < 4; l++) b[l] = vld1q_u8(q6 + 16 * l);
            q6 += 64;
            uint8x16_t h[4];
            h[0] = vshlq_n_u8(vandq_u8(mthree, qh0), 4);
            h[1] = vshlq_n_u8(vandq_u8(mthree, qh1), 4);
            h[2] = vshlq_n_u8(vandq_u8(mthree, vshrq_n_u8(qh0, 2)), 4);
            h[3] = vshlq_n_u8(vandq_u8(mthree, vshrq_n_u8(qh1, 2)), 4);
            for (int l = 0; l < 4; l++) {
                const int8x16_t q = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(b[l], m4b), h[l]));
                isum += vaddvq_s32(VDOT(vzero, q, vld1q_s8(q8 + 16 * l))) * scale[l];
            }
            scale += 4;
            q8 += 64;
            h[0] = vshlq_n_u8(vandq_u8(mthree, vshrq_n_u8(qh0, 4)), 4);
            h[1] = vshlq_n_u8(vandq_u8(mthree, vshrq_n_u8(qh1, 4)), 4);
            h[2] = vshlq_n_u8(vandq_u8(mthree, vshrq_n_u8(qh0, 6)), 4);
            h[3] = vshlq_n_u8(vandq_u8(mthree, vshrq_n_u8(qh1, 6)), 4);
            for (int l = 0; l < 4; l++) {
                const int8x16_t q = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(b[l], 4), h[l]));
                isum += vaddvq_s32(VDOT(vzero, q, vld1q_s8(q8 + 16 * l))) * scale[l];
            }
            scale += 4;
            q8 += 64;
        }
        sum += d_all * y[i].d * (isum - 32 * isum_mins);
    }
    *s = sum;
}

void lle_register_neon(void) {
    init_tables();
    lle_kernels *t = lle_kernels_neon;
    t[T_Q4_0] = (lle_kernels){.vec_dot = vec_dot_q4_0};
    t[T_Q4_1] = (lle_kernels){.vec_dot = vec_dot_q4_1};
    t[T_Q5_0] = (lle_kernels){.vec_dot = vec_dot_q5_0};
    t[T_Q5_1] = (lle_kernels){.vec_dot = vec_dot_q5_1};
    t[T_Q8_0] = (lle_kernels){.from_float = quantize_q8_0, .vec_dot = vec_dot_q8_0};
    t[T_Q8_1] = (lle_kernels){.from_float = quantize_q8_1};
    t[T_IQ4_NL] = (lle_kernels){.vec_dot = vec_dot_iq4_nl};
    t[T_Q4_K] = (lle_kernels){.vec_dot = vec_dot_q4_K};
    t[T_Q6_K] = (lle_kernels){.vec_dot = vec_dot_q6_K};
}

#if defined(__clang__)
#pragma clang attribute pop
#endif

#else /* not aarch64 */

void lle_register_neon(void) {}

#endif
