"""llmedge.quant: the GGML quantization formats.

One trait table per GGML type (:mod:`.traits`), their byte geometry (:mod:`.layout`), NumPy
reference decoding bit-exact with ggml (:mod:`.dequant`) and encoders byte-exact with ggml's
(:mod:`.quantize`; the K-quant and IQ4 searches in :mod:`.kquants`, their Numba loops in
:mod:`.ksearch_jit` and :mod:`.legacy_jit`). Whole files: llama-quantize's per-tensor rules
(:mod:`.mix`), importance matrices (:mod:`.imatrix`) and the GGUF-to-GGUF driver
(:mod:`.gguf_quantize`).
"""

from gguf.constants import GGMLQuantizationType

from .dequant import DEQUANTIZABLE, dequantize, dequantize_rows
from .layout import BLOCK_SIZES, QK_K, as_ggml_type, row_nbytes
from .quantize import QUANTIZABLE, fp32_to_bf16_bits, fp32_to_fp16_bits, quantize
from .traits import TRAITS, TypeTraits, traits

__all__ = [
    "BLOCK_SIZES",
    "DEQUANTIZABLE",
    "QK_K",
    "QUANTIZABLE",
    "TRAITS",
    "GGMLQuantizationType",
    "TypeTraits",
    "as_ggml_type",
    "dequantize",
    "dequantize_rows",
    "fp32_to_bf16_bits",
    "fp32_to_fp16_bits",
    "quantize",
    "row_nbytes",
    "traits",
]
