/* The AVX-512 intrinsics for one translation unit (quants_avx512.c, ops_avx512.c): native, with the
 * rest of the file compiled for F, BW, VL, DQ, VNNI (the file pops that target before any code that
 * must run on every CPU), or SIMDe's portable versions under LLE_AVX512_SIMDE (the self-test's
 * copies, selftest_simde*.c), with the few intrinsics SIMDe lacks composed from 256-bit ones.
 * lle512_* name the intrinsics that differ between the two. Include after common.h, on x86 only. */
#ifndef LLE_AVX512_COMPAT_H
#define LLE_AVX512_COMPAT_H

#if defined(LLE_AVX512_SIMDE)
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#include <simde/x86/fma.h>
#include <simde/x86/f16c.h>
typedef simde__mmask64 lle_mask64;
typedef simde__mmask32 lle_mask32;
/* intrinsics SIMDe 0.7 lacks, composed from the 256-bit ones it has */
static inline __m512 lle512_cvtepi32_ps(__m512i v) {
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_cvtepi32_ps(_mm512_castsi512_si256(v))),
                              _mm256_cvtepi32_ps(_mm512_extracti64x4_epi64(v, 1)), 1);
}
static inline __m512 lle512_cvtph_ps(__m256i h) {
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_cvtph_ps(_mm256_castsi256_si128(h))),
                              _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), 1);
}
static inline __m512i lle512_cvtepu8_epi32(__m128i v) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_cvtepu8_epi32(v)), _mm256_cvtepu8_epi32(_mm_srli_si128(v, 8)), 1);
}
static inline __m512i lle512_cvtepi8_epi32(__m128i v) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_cvtepi8_epi32(v)), _mm256_cvtepi8_epi32(_mm_srli_si128(v, 8)), 1);
}
static inline __m512i lle512_cvtepu16_epi32(__m256i v) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(v))),
                              _mm256_cvtepu16_epi32(_mm256_extracti128_si256(v, 1)), 1);
}
static inline __m512i lle512_cvtepu8_epi16(__m256i v) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_cvtepu8_epi16(_mm256_castsi256_si128(v))),
                              _mm256_cvtepu8_epi16(_mm256_extracti128_si256(v, 1)), 1);
}
#else
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi2")
#endif
#include <immintrin.h>
#define lle512_cvtepi32_ps _mm512_cvtepi32_ps
#define lle512_cvtph_ps _mm512_cvtph_ps
#define lle512_cvtepu8_epi32 _mm512_cvtepu8_epi32
#define lle512_cvtepu8_epi16 _mm512_cvtepu8_epi16
#define lle512_cvtepu16_epi32 _mm512_cvtepu16_epi32
#define lle512_cvtepi8_epi32 _mm512_cvtepi8_epi32
typedef __mmask64 lle_mask64;
typedef __mmask32 lle_mask32;
#endif

#endif
