"""GGUF weight blocks onto MLX's affine quantized format (``w = scale * q + bias`` per group of 32,
codes packed little-endian into uint32 words), computed from llmedge's NumPy dequantization.

Each GGML type maps to one :class:`Mapping`: the code width and, per 32-value group, the float32
scale and bias. The codes are then ``rint((value - bias) / scale)``, which recovers the stored
integers exactly (the reference computes each value from them with at most one rounding), so the
mapped weight dequantizes to the reference values wherever ``scale * q + bias`` is exact in float32.

- exact, same width: Q4_0 (d, -8d), Q4_1 (d, m), Q5_0 (d, -16d), Q5_1 (d, m), Q8_0 (d, -128d),
  Q4_K / Q5_K (d*sc, -dmin*m per 32-value sub-block);
- exact, 8-bit codes: Q3_K (d*(sc-32)*(q-4) is d times an integer in [-124, 128]: scale d, bias
  -127d), IQ4_NL and IQ4_XS (d or d*(ls-32) times a table value in [-127, 113]: bias -128*scale);
- exact, split: Q2_K is d*(sc*q) (6-bit codes, scale d, bias 0) minus dmin*m per 16-value
  sub-block, which the product subtracts as the activation's 16-value sums times those mins;
- not exact: Q6_K (16-value sub-blocks with signed 8-bit scales: no 32-group affine form holds it)
  is re-quantized by MLX to 8-bit codes (or, on request, dequantized to float16).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from llmedge.quant import GGMLQuantizationType as T
from llmedge.quant import dequantize, traits
from llmedge.quant.dequant import _k_scale_min

GROUP = 32
_Fields = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


def _f16(blocks: np.ndarray, at: int) -> np.ndarray:
    """The f16 at byte ``at`` of every block [rows, nb, size], as float32 [rows, nb, 1]."""
    return blocks[..., at : at + 2].copy().view(np.float16).astype(np.float32)


def _one_group(scale_of: Callable[[np.ndarray], np.ndarray], bias_mult: float | None) -> _Fields:
    """Types with one 32-value group per block: scale from ``scale_of``, bias ``bias_mult * scale``
    (or, with None, the block's f16 ``m`` at byte 2)."""

    def fields(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        s = scale_of(blocks)
        b = _f16(blocks, 2) if bias_mult is None else np.float32(bias_mult) * s
        return s, b

    return fields


def _k_fields(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K: 8 sub-blocks of 32 with scale d*sc and bias -dmin*m."""
    r, nb, size = blocks.shape
    sc, mn = _k_scale_min(np.ascontiguousarray(blocks[..., 4:16]).reshape(r * nb, 12))
    s = _f16(blocks, 0) * sc.reshape(r, nb, 8)
    b = -(_f16(blocks, 2) * mn.reshape(r, nb, 8))
    return s, b


def _q3_k_fields(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    d = np.repeat(_f16(blocks, 108), 8, axis=-1)
    return d, np.float32(-127.0) * d


def _iq4_xs_fields(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r, nb, _ = blocks.shape
    lo = blocks[..., 4:8]
    ls = np.stack([lo & 0x0F, lo >> 4], axis=-1).reshape(r, nb, 8).astype(np.int32)  # nibble i of scales_l
    sh = blocks[..., 2:4].copy().view(np.uint16).astype(np.int32)
    ls |= ((sh >> np.arange(0, 16, 2)) & 3) << 4
    s = _f16(blocks, 0) * (ls - 32).astype(np.float32)
    return s, np.float32(-128.0) * s


def _q2_k_fields(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    d = np.repeat(_f16(blocks, 80), 8, axis=-1)
    return d, np.zeros_like(d)


def q2_k_mins(blocks: np.ndarray) -> np.ndarray:
    """Q2_K's dmin*m of each 16-value sub-block, float32 [rows, nb * 16]."""
    r, nb, _ = blocks.shape
    return (_f16(blocks, 82) * (blocks[..., 0:16] >> 4)).reshape(r, nb * 16)


@dataclass(frozen=True)
class Mapping:
    bits: int
    fields: _Fields
    exact: bool = True


_d = lambda blocks: _f16(blocks, 0)  # noqa: E731

MAPPINGS: dict[T, Mapping] = {
    T.Q4_0: Mapping(4, _one_group(_d, -8.0)),
    T.Q4_1: Mapping(4, _one_group(_d, None)),
    T.Q5_0: Mapping(5, _one_group(_d, -16.0)),
    T.Q5_1: Mapping(5, _one_group(_d, None)),
    T.Q8_0: Mapping(8, _one_group(_d, -128.0)),
    T.IQ4_NL: Mapping(8, _one_group(_d, -128.0)),
    T.Q4_K: Mapping(4, _k_fields),
    T.Q5_K: Mapping(5, _k_fields),
    T.Q3_K: Mapping(8, _q3_k_fields),
    T.IQ4_XS: Mapping(8, _iq4_xs_fields),
    T.Q2_K: Mapping(6, _q2_k_fields),
}

#: types with no exact 32-group affine form, and what they become by default
REQUANTIZED: dict[T, str] = {T.Q6_K: "q8"}


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """Unsigned codes [rows, k] (uint8, < 2**bits) as MLX packs them: a little-endian bit stream of
    ``bits`` per value, in uint32 words [rows, k * bits / 32]."""
    rows, k = codes.shape
    if bits == 8:
        return np.ascontiguousarray(codes).view(np.uint32)
    if bits == 4:
        return np.ascontiguousarray(codes[:, 0::2] | (codes[:, 1::2] << 4)).view(np.uint32)
    c = codes.reshape(rows, k // 8, 8)
    word = np.zeros((rows, k // 8), np.uint64)  # 8 codes fill ``bits`` bytes exactly
    for i in range(8):
        word |= c[..., i].astype(np.uint64) << np.uint64(bits * i)
    return np.ascontiguousarray(word.view(np.uint8).reshape(rows, k // 8, 8)[..., :bits]).reshape(rows, -1).view(np.uint32)


def unpack_codes(words: np.ndarray, bits: int, k: int) -> np.ndarray:
    """The inverse of :func:`pack_codes`: packed uint32 words [rows, k * bits / 32] as uint8 codes [rows, k]."""
    rows = words.shape[0]
    b = np.ascontiguousarray(words).view(np.uint8).reshape(rows, -1)
    if bits == 8:
        return b
    if bits == 4:
        codes = np.empty((rows, k), np.uint8)
        codes[:, 0::2] = b & 0x0F
        codes[:, 1::2] = b >> 4
        return codes
    by = b.reshape(rows, k // 8, bits)  # 8 codes fill ``bits`` bytes
    codes = np.empty((rows, k // 8, 8), np.uint8)
    for i in range(8):  # code i: ``bits`` bits from bit bits*i, inside the 16 bits of bytes j, j + 1
        j, at = divmod(bits * i, 8)
        word = by[..., j].astype(np.uint16)
        if at + bits > 8:
            word |= by[..., j + 1].astype(np.uint16) << 8
        codes[..., i] = (word >> at) & ((1 << bits) - 1)
    return codes.reshape(rows, k)


def dequantize_affine(words: np.ndarray, scales: np.ndarray, biases: np.ndarray, bits: int,
                      mins: np.ndarray | None = None) -> np.ndarray:
    """MLX affine rows as float32 [rows, k]: ``scale * code + bias`` per group of 32, minus Q2_K's
    per-16 ``mins``; the values ``mx.dequantize`` gives (and ``mx.quantized_matmul`` multiplies by)."""
    rows, groups = scales.shape
    w = unpack_codes(words, bits, groups * GROUP).reshape(rows, groups, GROUP).astype(np.float32)
    w *= scales[..., None]
    w += biases[..., None]
    if mins is not None:
        w.reshape(rows, -1, 16)[...] -= mins[..., None]
    return w.reshape(rows, groups * GROUP)


def affine_rows(raw: np.ndarray, t: T, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """Rows of raw blocks [rows, row_bytes] of type ``t`` as (packed codes, scales, biases, mins):
    scales and biases float32 [rows, k / 32], ``mins`` (Q2_K only) float32 [rows, k / 16]."""
    m = MAPPINGS[t]
    tr = traits(t)
    rows = raw.shape[0]
    blocks = raw.reshape(rows, k // tr.block_size, tr.type_size)
    s, b = (a.reshape(rows, k // GROUP) for a in m.fields(blocks))
    if t == T.Q8_0:  # the big embedding tables: the int8 codes offset by 128 are the bytes with the sign bit flipped
        return pack_codes(np.ascontiguousarray(blocks[..., 2:34]).reshape(rows, k) ^ np.uint8(0x80), 8), s, b, None
    values = dequantize(raw, t, (rows, k))
    mins = None
    if t == T.Q2_K:
        mins = q2_k_mins(blocks)
        values = values + np.repeat(mins, 16, axis=1)
    sg, bg = np.repeat(s, GROUP, axis=1), np.repeat(b, GROUP, axis=1)
    codes = np.divide(values - bg, sg, out=np.zeros_like(values), where=sg != 0)
    codes = np.clip(np.rint(codes), 0, (1 << m.bits) - 1).astype(np.uint8)
    return pack_codes(codes, m.bits), s, b, mins
