"""NumPy reference quantizers: float32 rows to GGML blocks, byte for byte as ggml writes them.

This module owns encoding. Each quantizer works on all blocks at once and repeats the arithmetic
of llama.cpp's ``quantize_row_*_ref`` (``ggml-quants.c``) in float32, including its rounding:
``roundf`` (half away from zero) for Q8_0/Q8_1, ``nearest_int`` (half to even) for Q8_K,
truncation after ``+ 8.5f`` / ``+ 16.5f`` / ``+ 0.5f`` for Q4_0/Q5_0/Q4_1/Q5_1, ggml's
round-to-nearest-even for F16 (NaN -> 0x7E00 with its sign) and BF16 (NaN forced quiet).

Activations of a matrix product are quantized by the CPU backend's ``from_float`` rather than the
``_ref`` function. For Q8_0 and Q8_1 those differ: the x86 AVX/AVX2 path (``variant="x86"``)
uses ``id = 127 / amax`` and rounds half to even, the ARM NEON path (``variant="arm"``) uses
``id = 1 / d`` and rounds half to even. For every other type here the CPU path calls the ``_ref``
function, so ``variant`` changes nothing for them.

Inputs must be finite (ggml's handling of NaN in block maxima is order-dependent and not modelled).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import numpy as np
from gguf.constants import GGMLQuantizationType as T

from .kquants import KQUANT_ENCODERS, LEGACY_WEIGHTED
from .layout import BLOCK_SIZES, as_ggml_type, row_nbytes
from .quantize_common import seqsum

__all__ = ["QUANTIZABLE", "Variant", "fp32_to_bf16_bits", "fp32_to_fp16_bits", "quantize", "quantizer"]

Variant = Literal["ref", "x86", "arm"]
_VARIANTS = ("ref", "x86", "arm")

_F32 = np.float32


def fp32_to_fp16_bits(x: np.ndarray) -> np.ndarray:
    """ggml's ``GGML_FP32_TO_FP16``: round to nearest even; any NaN becomes sign | 0x7E00."""
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        h = x.astype(np.float16).view(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        h = np.where(nan, ((x.view(np.uint32) >> 16) & 0x8000).astype(np.uint16) | np.uint16(0x7E00), h)
    return h


def fp32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """ggml's ``GGML_FP32_TO_BF16``: round to nearest even; NaN keeps its top bits, forced quiet."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32)
    rounded = (u + (np.uint32(0x7FFF) + ((u >> 16) & 1))) >> 16
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, (u >> 16) | 64, rounded).astype(np.uint16)


def _round_away(v: np.ndarray) -> np.ndarray:
    """C ``roundf``: nearest integer, halves away from zero (exact for every float32)."""
    a = np.abs(v)
    f = np.floor(a)
    f += (a - f) >= 0.5
    return np.copysign(f, v)


def _inverse(d: np.ndarray) -> np.ndarray:
    """``d ? 1.0f/d : 0.0f`` elementwise."""
    with np.errstate(divide="ignore"):
        return np.where(d != 0, _F32(1) / d, _F32(0)).astype(np.float32)


def _abs_max_signed(xb: np.ndarray) -> np.ndarray:
    """Per block, the value with the largest magnitude (the first one on ties), keeping its sign."""
    i = np.abs(xb).argmax(axis=1)
    return xb[np.arange(len(xb)), i]


def _f16_bytes(v: np.ndarray) -> np.ndarray:
    return fp32_to_fp16_bits(v).reshape(-1, 1).view(np.uint8)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """[n, 32] values 0..15 -> [n, 16] bytes: value j in the low nibble, value j + 16 in the high."""
    return (q[:, :16] & 0x0F) | (q[:, 16:] << 4)


def _legacy_jit(variant: Variant):  # noqa: ANN202
    """The Numba loops for ``_ref`` rounding when the searches run in Numba, else None."""
    from .kquants import _jit

    if variant != "ref" or _jit() is None:
        return None
    from . import legacy_jit

    return legacy_jit


def _q8_scaled(xb: np.ndarray, variant: Variant) -> tuple[np.ndarray, np.ndarray]:
    """Shared part of Q8_0/Q8_1: the block scale d and the rounded quants (int8)."""
    jit = _legacy_jit(variant)
    if jit is not None:
        return jit.q8_0(xb)
    amax = np.abs(xb).max(axis=1)
    d = amax / _F32(127)
    if variant == "x86":
        with np.errstate(divide="ignore"):
            inv = np.where(amax != 0, _F32(127) / amax, _F32(0)).astype(np.float32)
    else:
        inv = _inverse(d)
    v = xb * inv[:, None]
    q = _round_away(v) if variant == "ref" else np.rint(v)
    return d, q.astype(np.int8)


def _q8_0(xb: np.ndarray, variant: Variant) -> np.ndarray:
    d, q = _q8_scaled(xb, variant)
    return np.concatenate([_f16_bytes(d), q.view(np.uint8)], axis=1)


def _q8_1(xb: np.ndarray, variant: Variant) -> np.ndarray:
    d, q = _q8_scaled(xb, variant)
    s = q.sum(axis=1, dtype=np.int32).astype(np.float32) * d
    return np.concatenate([_f16_bytes(d), _f16_bytes(s), q.view(np.uint8)], axis=1)


def _q8_k(xb: np.ndarray, variant: Variant) -> np.ndarray:
    n = len(xb)
    mx = _abs_max_signed(xb)
    zero = mx == 0
    with np.errstate(divide="ignore"):
        iscale = np.where(zero, _F32(0), _F32(-127) / np.where(zero, _F32(1), mx)).astype(np.float32)
    q = np.minimum(np.rint(xb * iscale[:, None]), 127).astype(np.int8)  # nearest_int: half to even
    with np.errstate(divide="ignore"):
        d = np.where(zero, _F32(0), _F32(1) / np.where(zero, _F32(1), iscale)).astype(np.float32)
    bsums = q.reshape(n, 16, 16).sum(axis=2, dtype=np.int16)
    return np.concatenate([d.reshape(n, 1).view(np.uint8), q.view(np.uint8), bsums.view(np.uint8)], axis=1)


def _sym(xb: np.ndarray, variant: Variant, div: int, bias: float, top: int) -> tuple[np.ndarray, np.ndarray]:
    """Q4_0 / Q5_0: d = (signed absolute maximum) / div, q = min(top, trunc(x / d + bias))."""
    jit = _legacy_jit(variant)
    if jit is not None:
        return jit.q_sym(xb, div, bias, top)
    d = _abs_max_signed(xb) / _F32(div)
    v = xb * _inverse(d)[:, None]
    return d, np.minimum(np.trunc(v + _F32(bias)), top).astype(np.uint8)


def _asym(xb: np.ndarray, variant: Variant, div: int, top: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_1 / Q5_1: d = (max - min) / div, q = min(top, trunc((x - min) / d + 0.5))."""
    jit = _legacy_jit(variant)
    if jit is not None:
        return jit.q_asym(xb, div, top)
    mn = xb.min(axis=1)
    d = (xb.max(axis=1) - mn) / _F32(div)
    v = (xb - mn[:, None]) * _inverse(d)[:, None]
    return d, mn, np.minimum(np.trunc(v + _F32(0.5)), top).astype(np.uint8)


def _q4_0(xb: np.ndarray, variant: Variant) -> np.ndarray:
    d, q = _sym(xb, variant, -8, 8.5, 15)
    return np.concatenate([_f16_bytes(d), _pack_nibbles(q)], axis=1)


def _q4_1(xb: np.ndarray, variant: Variant) -> np.ndarray:
    d, mn, q = _asym(xb, variant, 15, 15)
    return np.concatenate([_f16_bytes(d), _f16_bytes(mn), _pack_nibbles(q)], axis=1)


def _q5_qh(q: np.ndarray) -> np.ndarray:
    """The little-endian u32 holding the 5th bit of value j at bit j, as 4 bytes per block."""
    return np.packbits((q >> 4) & 1, axis=1, bitorder="little")


def _q5_0(xb: np.ndarray, variant: Variant) -> np.ndarray:
    d, q = _sym(xb, variant, -16, 16.5, 31)
    return np.concatenate([_f16_bytes(d), _q5_qh(q), _pack_nibbles(q)], axis=1)


def _q5_1(xb: np.ndarray, variant: Variant) -> np.ndarray:
    d, mn, q = _asym(xb, variant, 31, 255)  # no clamp in ggml: the value cannot exceed 31
    return np.concatenate([_f16_bytes(d), _f16_bytes(mn), _q5_qh(q), _pack_nibbles(q)], axis=1)


_KERNELS: dict[T, Callable[[np.ndarray, Variant], np.ndarray]] = {
    T.Q4_0: _q4_0,
    T.Q4_1: _q4_1,
    T.Q5_0: _q5_0,
    T.Q5_1: _q5_1,
    T.Q8_0: _q8_0,
    T.Q8_1: _q8_1,
    T.Q8_K: _q8_k,
}

_SEARCHING: dict[T, Callable[..., np.ndarray]] = {T[name]: fn for name, (_, fn) in KQUANT_ENCODERS.items()}
_CHUNK_VALUES = 1 << 20  # values encoded per NumPy pass of a searching quantizer (bounds temporaries)

#: Every type :func:`quantize` accepts.
QUANTIZABLE: frozenset[T] = frozenset({T.F32, T.F16, T.BF16, *_KERNELS, *_SEARCHING})


def quantize(
    x: np.ndarray, ggml_type: T | int | str, variant: Variant = "ref", quant_weights: np.ndarray | None = None
) -> np.ndarray:
    """Encode float32 rows ``x`` [..., n] as type ``ggml_type``: uint8 [..., row_nbytes(n)].

    ``n`` must be a multiple of the block size. ``variant`` picks whose rounding to reproduce for
    the activation types Q8_0 and Q8_1: ``"ref"`` (``quantize_row_*_ref``, the default), ``"x86"``
    or ``"arm"`` (ggml-cpu's SIMD ``from_float``); see the module docstring. ``quant_weights``
    (float32 [n], an importance-matrix row) selects ggml's weighted searches, as
    ``ggml_quantize_chunk`` does when given one; types without a weighted search ignore it.
    """
    gt = as_ggml_type(ggml_type)
    if variant not in _VARIANTS:
        raise ValueError(f"variant must be one of {_VARIANTS}, not {variant!r}")
    if gt not in QUANTIZABLE:
        raise ValueError(f"no quantizer for GGML type {gt.name}")
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 0:
        raise ValueError("x must have at least one axis")
    out_shape = (*x.shape[:-1], row_nbytes(gt, x.shape[-1]))
    if gt == T.F32:
        return np.array(x, dtype=np.float32, order="C").view(np.uint8).reshape(out_shape)
    if gt == T.F16:
        return np.ascontiguousarray(fp32_to_fp16_bits(x)).view(np.uint8).reshape(out_shape)
    if gt == T.BF16:
        return np.ascontiguousarray(fp32_to_bf16_bits(x)).view(np.uint8).reshape(out_shape)
    block, size = BLOCK_SIZES[gt]
    if quant_weights is not None and (gt in _SEARCHING or gt.name in LEGACY_WEIGHTED):
        return _quantize_weighted(np.ascontiguousarray(x).reshape(-1, x.shape[-1]), gt, quant_weights).reshape(out_shape)
    xb = np.ascontiguousarray(x).reshape(-1, block)
    if gt in _SEARCHING:
        return _encode_chunked(_SEARCHING[gt], xb, size).reshape(out_shape)
    return _KERNELS[gt](xb, variant).reshape(out_shape)


def _quantize_weighted(x2: np.ndarray, gt: T, qw: np.ndarray) -> np.ndarray:
    """Rows [r, n] with one importance row [n]; legacy types weight by the whole row's sigma2."""
    rows, n = x2.shape
    qw = np.ascontiguousarray(qw, dtype=np.float32).reshape(-1)
    if len(qw) != n:
        raise ValueError(f"importance row has {len(qw)} values for rows of {n}")
    block, size = BLOCK_SIZES[gt]
    out = np.empty((rows, row_nbytes(gt, n)), np.uint8)
    step = max(1, _CHUNK_VALUES // n)
    with np.errstate(all="ignore"):
        for r in range(0, rows, step):
            xc = x2[r : r + step]
            xb = xc.reshape(-1, block)
            qwb = np.broadcast_to(qw, xc.shape).reshape(-1, block)
            if gt in _SEARCHING:
                enc = _SEARCHING[gt](xb, qwb)
            else:
                s2 = seqsum(xc * xc) / np.float32(n)
                w = qwb * np.sqrt(np.repeat(s2, n // block)[:, None] + xb * xb)
                enc = LEGACY_WEIGHTED[gt.name](xb, w)
            out[r : r + step] = enc.reshape(len(xc), -1)
    return out


def _encode_chunked(fn: Callable[..., np.ndarray], xb: np.ndarray, size: int) -> np.ndarray:
    out = np.empty((len(xb), size), np.uint8)
    step = max(1, _CHUNK_VALUES // xb.shape[1])
    with np.errstate(all="ignore"):
        for i in range(0, len(xb), step):
            out[i : i + step] = fn(xb[i : i + step])
    return out


def quantizer(ggml_type: T | int | str) -> Callable[[np.ndarray], np.ndarray] | None:
    """``x -> bytes`` for one type with ggml's ``_ref`` rounding (the traits' ``quantize_ref``), or None."""
    gt = as_ggml_type(ggml_type)
    if gt not in QUANTIZABLE:
        return None

    def quantize_ref(x: np.ndarray) -> np.ndarray:
        return quantize(x, gt)

    quantize_ref.__name__ = f"quantize_{gt.name.lower()}"
    quantize_ref.__qualname__ = quantize_ref.__name__
    return quantize_ref
