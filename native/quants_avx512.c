/* AVX-512 tier of the dispatch table. No AVX-512 kernels are registered yet: the development
 * machine has no AVX-512, and untested SIMD code must not be selected on users' CPUs. While this
 * table is empty the dispatcher reports avx512 as unavailable and uses the AVX2 kernels.
 */
#include "common.h"

lle_kernels lle_kernels_avx512[T_COUNT];

void lle_register_avx512(void) {}
