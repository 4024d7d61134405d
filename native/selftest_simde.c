/* The AVX-512 kernels (quants_avx512.c) compiled a second time against SIMDe's portable
 * implementations of the AVX-512 intrinsics, for the self-test only: a CPU without AVX-512 then
 * checks that source bit for bit against the AVX2 kernels. Empty unless built with
 * -DLLE_SELFTEST_SIMDE (and SIMDe's headers, Debian libsimde-dev); never part of llmedge._native.
 *
 *   cc -O2 -std=gnu11 -ffp-contract=off -pthread -DLLE_SELFTEST_SIMDE native/[a-z]*.c -lm -o selftest
 */
#if defined(LLE_SELFTEST_SIMDE)
/* The machines this stands in for have AVX2, FMA and F16C (the AVX-512 tier requires them): SIMDe
 * then uses those natively and emulates only AVX-512. Its portable fallback of _mm256_fmadd_ps
 * rounds twice, unlike the instruction, and would not be bit-exact. (GCC defines __AVX2__ etc.
 * after this pragma, which is how SIMDe sees them.) */
#pragma GCC target("avx2,fma,f16c,bmi2")
#define LLE_AVX512_SIMDE 1
#include "quants_avx512.c"
#else
typedef int lle_selftest_simde_unused;
#endif
