/* ggml's AVX-512 build's float reductions, shared by the AVX-512 tier's products (quants_avx512.c) and
 * float ops (ops_avx512.c, through ops_avx2.c): GCC's _mm512_reduce_add_ps tree (spelled out: SIMDe adds
 * in lane order), GGML_F32x16_REDUCE, ggml_vec_dot_f32/_f16 (4 accumulators of 16 lanes over 64
 * values; the rest after them as GCC compiles vec.cpp's loop: f32 as lle_f32_dot_finish says, f16 as
 * doubles) and
 * llamafile's tinyBLAS<16> (one 16-lane accumulator, n % 16 == 0). Include after avx512_compat.h. */
#ifndef LLE_GGML_AVX512_ORDERS_H
#define LLE_GGML_AVX512_ORDERS_H

#define LLE512_LDH(p) lle512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))

/* lanes i + (i + 8), then i + (i + 4), then (0 + 2) + (1 + 3) */
LLE_INLINE float lle512_reduce(__m512 v) {
    const __m256 t = _mm256_add_ps(_mm512_castps512_ps256(v),
                                   _mm256_castsi256_ps(_mm512_extracti64x4_epi64(_mm512_castps_si512(v), 1)));
    __m128 r = _mm_add_ps(_mm256_extractf128_ps(t, 1), _mm256_castps256_ps128(t));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

/* (a0 + a2) + (a1 + a3), reduced: GGML_F32x16_REDUCE */
LLE_INLINE float lle512_reduce_ggml4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
    return lle512_reduce(_mm512_add_ps(_mm512_add_ps(a0, a2), _mm512_add_ps(a1, a3)));
}

/* the ends of ggml_vec_dot_f32 / _f16 (shared with the rows kernels): the four accumulators a[] over
 * the first np values reduced, then the rest: f32 by 16 and 8 products (rounded, added in turn), the
 * last (n - np) % 8 fused; f16 one by one in double */
LLE_INLINE float lle512_finish_f32(const __m512 *a, const float *x, const float *y, int np, int n) {
    return lle_f32_dot_finish(lle512_reduce_ggml4(a[0], a[1], a[2], a[3]), x, y, np, n, 8);
}

LLE_INLINE float lle512_finish_f16(const __m512 *a, const lle_half *x, const lle_half *y, int np, int n) {
    double sumf = lle512_reduce_ggml4(a[0], a[1], a[2], a[3]);
    for (int i = np; i < n; i++) sumf += (double)(_cvtsh_ss(x[i]) * _cvtsh_ss(y[i]));
    return (float)sumf;
}

LLE_INLINE float lle512_dot_f32_ggml(int n, const float *x, const float *y) {
    const int np = n & ~63;
    __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int i = 0; i < np; i += 64)
        for (int r = 0; r < 4; r++) a[r] = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16 * r), _mm512_loadu_ps(y + i + 16 * r), a[r]);
    return lle512_finish_f32(a, x, y, np, n);
}

LLE_INLINE float lle512_dot_f16_ggml(int n, const lle_half *x, const lle_half *y) {
    const int np = n & ~63;
    __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int i = 0; i < np; i += 64)
        for (int r = 0; r < 4; r++) a[r] = _mm512_fmadd_ps(LLE512_LDH(x + i + 16 * r), LLE512_LDH(y + i + 16 * r), a[r]);
    return lle512_finish_f16(a, x, y, np, n);
}

LLE_INLINE float lle512_dot_f32_tb(int n, const float *x, const float *y) {
    __m512 c = _mm512_setzero_ps();
    for (int l = 0; l < n; l += 16) c = _mm512_fmadd_ps(_mm512_loadu_ps(x + l), _mm512_loadu_ps(y + l), c);
    return lle512_reduce(c);
}

LLE_INLINE float lle512_dot_f16_tb(int n, const lle_half *x, const lle_half *y) {
    __m512 c = _mm512_setzero_ps();
    for (int l = 0; l < n; l += 16) c = _mm512_fmadd_ps(LLE512_LDH(x + l), LLE512_LDH(y + l), c);
    return lle512_reduce(c);
}

#endif
