/* The AVX-512 tier's float ops: ops_avx2.c compiled for AVX-512, with ggml's AVX-512 build's orders
 * (its expf, 16-value softmax chunks, 16-lane attention accumulators) where they differ from AVX2's.
 * Selected with the AVX-512 kernels (api.c). */
#define LLE_OPS_512 lle_ops_avx512
#include "ops_avx2.c"
