"""The Numba backend: the whole op set as ``@njit(parallel=True, cache=True)`` kernels, the portable
fast path where the C kernels (``llmedge._native``) are not built.

What it owns: quantized matrix products the llama.cpp way (activations quantized on the fly to the
weight type's partner Q8_0 / Q8_1 / Q8_K with ggml's x86 rounding, exactly as :mod:`llmedge.quant`
does it, then integer dot products per block, scaled in float32), row gather (embeddings) equal
to the NumPy dequantizers bit for bit, RMS norm, RoPE, attention over an F16/F32 cache, SiLU/GELU
gated products, softmax, add, scale and soft-cap. Weights stay in their GGUF blocks (a read-only
view into the model's memory map); the kernels decode the blocks themselves.

The block dot products are small LLVM vector intrinsics written with
``numba.extending.intrinsic`` (LLVM fully unrolls Numba's 32-iteration block loops into scalar
code, so the inner work is emitted as vector IR directly). For Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K,
Q5_K and Q6_K they follow ggml's AVX2 ``vec_dot`` kernels: integer products summed in 8 lanes of
four values (``pmaddubsw``/``pmaddwd`` on x86 with AVX2, plain vector IR elsewhere), one fused
multiply-add per lane and block, llama.cpp's final horizontal sums, so on an AVX2 CPU the decode
products equal llama.cpp's bit for bit. From 8 activation rows every K-quant product that is not
repacked takes llama.cpp's tiled GEMM order (per block the exact integer totals, then
buf += (d * s1 - dmin * s2) * d8), as the native backend does. Q4_K products take llama.cpp's kernel
choice and order per product: with a multiple of 8 weight rows its repacked GEMV order, and for
prompts of more than 3 rows its repacked GEMM order (and that kernel's Q8_K sign rule) on the first
n - n % 4 rows; else the tiled order from 8 rows. IQ4_NL, and Q2_K, Q3_K and IQ4_XS below 8 rows, are
summed per block in ggml's generic order (a few float32 ulps from llama.cpp's SIMD kernels); F32,
F16 and BF16 weights in double. Float ops follow llama.cpp's CPU arithmetic on an AVX2 machine as
the native backend does, bit for bit: ggml's vectorized ``expf`` (SiLU, softmax), the fused
multiply-adds of its RoPE and GELU table, double sums in RMS norm and softmax, and the summation
orders of its attention without flash attention (ggml's ``vec_dot`` order for one query row,
llamafile's for several).

The package is split by concern: :mod:`.common` (compile cache set-up, type ids),
:mod:`.intrinsics` (LLVM vector building blocks, half conversions, ``expf``), :mod:`.dots`
(activation quantizers and per-row quantized dot products), :mod:`.matrix` (parallel matrix
drivers and row gather), :mod:`.ops` (float ops) and :mod:`.backend` (the backend class).

Compiled kernels are cached on disk: in ``$NUMBA_CACHE_DIR`` when set, else in
``<user cache>/llmedge/numba/<digest of the backend's sources>``. :meth:`NumbaBackend.warmup` compiles (or loads) every kernel once
and :attr:`NumbaBackend.compile_seconds` says how long that took.
"""

# isort: skip_file
# common first: it points numba's compile cache at llmedge's folder before numba is imported
from llmedge.backends.numba_cpu import common  # noqa: F401
from llmedge.backends.numba_cpu.backend import NumbaBackend, NumbaWeight
from llmedge.backends.numba_cpu.common import SUPPORTED
from llmedge.backends.numba_cpu.intrinsics import _X86_AVX2, FAST_ROWS

__all__ = ["FAST_ROWS", "SUPPORTED", "_X86_AVX2", "NumbaBackend", "NumbaWeight"]
