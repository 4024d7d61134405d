"""Float32 building blocks shared by the NumPy encoders, each equal to one idiom of ggml's C.

This module owns the small exact primitives: ``nearest_int`` (ggml's magic-number rounding),
sequential block sums (C's ``s += ...`` loops, which NumPy's pairwise ``sum`` does not
reproduce), the first maximum by magnitude (``if (ax > amax)`` loops), fp16 rounding and bytes.
"""

from __future__ import annotations

import numpy as np

__all__ = ["F32", "f16_bits", "f16_round", "first_abs_max", "nearest_int", "pack_bits", "seqsum"]

F32 = np.float32
_MAGIC = F32(12582912.0)  # 1.5 * 2**23


def nearest_int(v: np.ndarray) -> np.ndarray:
    """ggml's ``nearest_int``: ``v + 1.5*2^23`` in float32, low mantissa bits minus 2^22 (int32).

    Round half to even for |v| < 2^22; beyond that the same wrapped value ggml computes.
    """
    with np.errstate(all="ignore"):
        val = np.asarray(v, dtype=F32) + _MAGIC
    return (val.view(np.int32) & 0x7FFFFF) - 0x400000


def seqsum(a: np.ndarray, start: bool = True) -> np.ndarray:
    """Sum along the last axis in index order, in float32, like a C ``for`` loop.

    ``start=True`` models ``s = 0; s += a[i]`` (so an all -0.0 row sums to +0.0); ``start=False``
    models ``s = a[0]; s += a[i]`` for i >= 1.
    """
    with np.errstate(all="ignore"):
        s = np.cumsum(a, axis=-1, dtype=F32)[..., -1]
        return s + F32(0) if start else s


def first_abs_max(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row, ``(amax, max)``: the largest |x| and the first value that has it (0, 0 if all zero)."""
    i = np.abs(x).argmax(axis=-1)
    mx = np.take_along_axis(x, i[..., None], axis=-1)[..., 0]
    return np.abs(mx), np.where(mx != 0, mx, F32(0))


def f16_round(v: np.ndarray) -> np.ndarray:
    """``GGML_FP16_TO_FP32(GGML_FP32_TO_FP16(v))``: float32 values rounded through fp16."""
    from .quantize import fp32_to_fp16_bits

    return fp32_to_fp16_bits(v).view(np.float16).astype(F32)


def f16_bits(v: np.ndarray) -> np.ndarray:
    """[n] float32 -> [n, 2] bytes of their fp16 encoding (little-endian)."""
    from .quantize import fp32_to_fp16_bits

    return np.ascontiguousarray(fp32_to_fp16_bits(v)).reshape(-1, 1).view(np.uint8)


def pack_bits(mask: np.ndarray) -> np.ndarray:
    """[S, 8, n] booleans -> [S, n] bytes with bit b of byte m set from ``mask[:, b, m]``."""
    return np.packbits(mask.transpose(0, 2, 1), axis=2, bitorder="little")[..., 0]
