"""The trait table: one :class:`TypeTraits` per GGML type the ``gguf`` package knows.

This module owns the per-type facts other code dispatches on, in the spirit of ggml's
``type_traits`` (ggml.c) and ``type_traits_cpu`` (ggml-cpu.c): block geometry, whether the type
is block-quantized, the activation type its dot product pairs with, and the NumPy reference
encoder/decoder where one exists. Types are keyed by ``gguf.GGMLQuantizationType``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from gguf.constants import GGMLQuantizationType as T

from .dequant import dequantizer
from .layout import BLOCK_SIZES, as_ggml_type, row_nbytes
from .quantize import quantizer

__all__ = ["TRAITS", "TypeTraits", "row_nbytes", "traits"]

# ggml-cpu.c type_traits_cpu[].vec_dot_type: the format the other operand of a dot product (the
# activations) is converted to. Types absent here have no CPU dot product (integers, F64, Q8_K).
_VEC_DOT_TYPE: dict[T, T] = {
    T.F32: T.F32,
    T.F16: T.F16,
    T.BF16: T.BF16,
    **dict.fromkeys((T.Q4_0, T.Q5_0, T.Q8_0, T.IQ4_NL, T.MXFP4, T.NVFP4, T.Q1_0), T.Q8_0),
    **dict.fromkeys((T.Q4_1, T.Q5_1, T.Q8_1), T.Q8_1),
    **dict.fromkeys(
        (
            T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K,
            T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M, T.IQ4_XS,
            T.TQ1_0, T.TQ2_0,
        ),
        T.Q8_K,
    ),
}  # fmt: skip

# Plain element types (ggml's is_quantized = false); every other type is block-quantized.
_PLAIN = frozenset({T.F32, T.F16, T.BF16, T.F64, T.I8, T.I16, T.I32, T.I64})


@dataclass(frozen=True)
class TypeTraits:
    """What llmedge knows about one GGML type.

    ``block_size`` values are stored in ``type_size`` bytes. ``vec_dot_type`` is the type the
    activations are quantized to for a dot product with a row of this type (None: no CPU dot
    product). ``dequantize_ref(raw, shape) -> float32`` and ``quantize_ref(x) -> uint8`` are the
    NumPy references, None where llmedge has none.
    """

    ggml_type: T
    name: str
    block_size: int
    type_size: int
    is_quantized: bool
    vec_dot_type: T | None
    dequantize_ref: Callable[[np.ndarray, Sequence[int]], np.ndarray] | None
    quantize_ref: Callable[[np.ndarray], np.ndarray] | None


def _make(t: T) -> TypeTraits:
    block, size = BLOCK_SIZES[t]
    return TypeTraits(
        ggml_type=t,
        name=t.name,
        block_size=block,
        type_size=size,
        is_quantized=t not in _PLAIN,
        vec_dot_type=_VEC_DOT_TYPE.get(t),
        dequantize_ref=dequantizer(t),
        quantize_ref=quantizer(t),
    )


#: Every GGML type of the installed ``gguf`` package, by enum member.
TRAITS: dict[T, TypeTraits] = {t: _make(t) for t in BLOCK_SIZES}


def traits(t: T | int | str) -> TypeTraits:
    """The traits of ``t`` (enum member, integer value or name). Raises ``ValueError`` if unknown."""
    gt = as_ggml_type(t)
    try:
        return TRAITS[gt]
    except KeyError:
        raise ValueError(f"GGML type {gt.name} has no known block size") from None
