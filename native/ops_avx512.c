/* The AVX-512 tier's float ops: ops_avx2.c compiled for AVX-512 with its 512-bit attention loops,
 * every value bit-equal to the AVX2 ops (same summation order). Selected with the AVX-512 kernels
 * (api.c). */
#define LLE_OPS_512 lle_ops_avx512
#include "ops_avx2.c"
