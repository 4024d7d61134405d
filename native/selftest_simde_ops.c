/* The AVX-512 float ops (ops_avx512.c) compiled against SIMDe for the self-test only, as
 * selftest_simde.c does for the kernels: a CPU without AVX-512 checks them bit for bit against the
 * AVX2 ops. Empty unless built with -DLLE_SELFTEST_SIMDE; never part of llmedge._native. */
#if defined(LLE_SELFTEST_SIMDE)
/* as in selftest_simde.c: AVX2, FMA and F16C native, only AVX-512 emulated */
#pragma GCC target("avx2,fma,f16c,bmi2")
#define LLE_AVX512_SIMDE 1
#define LLE_OPS_512 lle_ops_avx512_simde
#include "ops_avx2.c"
#else
typedef int lle_selftest_simde_ops_unused;
#endif
