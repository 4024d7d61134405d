"""NumPy reference dequantization: GGUF tensor bytes to float32, bit for bit as ggml computes it.

This module owns the decoding of every supported block format. Each kernel works on a whole
``[n_blocks, type_size]`` array of blocks at once (no Python loop over blocks) and repeats ggml's
``dequantize_row_*`` arithmetic exactly, in float32 and in ggml's order of operations (for example
``Q4_K``: ``(d * sc) * q - (dmin * m)``), so the result is bit-identical to llama.cpp's and to
``gguf.quants.dequantize``. Large tensors are processed in chunks of blocks that stay in cache.

Supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q8_K, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
IQ4_NL, IQ4_XS. (Q8_1 and Q8_K are activation formats; they are decoded here so the quantizers can
be round-trip tested.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from gguf.constants import GGMLQuantizationType as T

from .layout import BLOCK_SIZES, as_ggml_type, row_nbytes

__all__ = ["DEQUANTIZABLE", "dequantize", "dequantize_rows", "dequantizer"]

# Values of the 4-bit non-linear codebook of IQ4_NL and IQ4_XS (ggml-common.h kvalues_iq4nl).
KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)

# Output floats produced per chunk of blocks: big enough to amortize NumPy call overhead, small
# enough that a chunk's temporaries stay in the L2 cache.
_CHUNK_VALUES = 1 << 17

_Kernel = Callable[[np.ndarray, np.ndarray], None]


def _f16(blocks: np.ndarray, at: int) -> np.ndarray:
    """The f16 stored at byte ``at`` of every block, as float32 [n_blocks, 1]."""
    return blocks[:, at : at + 2].view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """Split bytes [..., k] into [..., 2, k]: all low nibbles, then all high nibbles (ggml order)."""
    q = np.empty((*qs.shape[:-1], 2, qs.shape[-1]), np.uint8)
    np.bitwise_and(qs, 0x0F, out=q[..., 0, :])
    np.right_shift(qs, 4, out=q[..., 1, :])
    return q


def _crumbs(qs: np.ndarray) -> np.ndarray:
    """Split bytes [..., k] into [..., 4, k]: bits 0-1, 2-3, 4-5, 6-7 of every byte."""
    q = np.empty((*qs.shape[:-1], 4, qs.shape[-1]), np.uint8)
    for i in range(4):
        np.right_shift(qs, 2 * i, out=q[..., i, :])
    q &= 3
    return q


def _bits(qh: np.ndarray) -> np.ndarray:
    """Split bytes [..., k] into [..., 8, k]: bit 0 of every byte, then bit 1, ... bit 7."""
    q = np.empty((*qh.shape[:-1], 8, qh.shape[-1]), np.uint8)
    for i in range(8):
        np.right_shift(qh, i, out=q[..., i, :])
    q &= 1
    return q


def _to_int8(q: np.ndarray, offset: int) -> np.ndarray:
    """``q - offset`` as int8, in place (``q`` is uint8 with values that fit after the shift)."""
    s = q.view(np.int8)
    np.subtract(s, np.int8(offset), out=s)
    return s


# ---- 32-value blocks ----------------------------------------------------------------------------


def _q4_0(blocks: np.ndarray, out: np.ndarray) -> None:
    # block_q4_0: d (f16), qs[16]; y[j] = (qs[j] & 15) - 8, y[j + 16] = (qs[j] >> 4) - 8, times d.
    q = _to_int8(_nibbles(blocks[:, 2:18]), 8).reshape(len(blocks), 32)
    np.multiply(_f16(blocks, 0), q, out=out)


def _q4_1(blocks: np.ndarray, out: np.ndarray) -> None:
    # block_q4_1: d, m (f16), qs[16]; y = q * d + m.
    q = _nibbles(blocks[:, 4:20]).reshape(len(blocks), 32)
    np.multiply(_f16(blocks, 0), q, out=out)
    out += _f16(blocks, 2)


def _q5(blocks: np.ndarray, at_qh: int) -> np.ndarray:
    """The 5-bit values (uint8, 0..31) of Q5_0/Q5_1 blocks whose qh starts at byte ``at_qh``."""
    n = len(blocks)
    q = _nibbles(blocks[:, at_qh + 4 : at_qh + 20]).reshape(n, 32)
    hi = np.unpackbits(blocks[:, at_qh : at_qh + 4], axis=1, bitorder="little")  # bit j -> value j
    hi <<= 4
    q |= hi
    return q


def _q5_0(blocks: np.ndarray, out: np.ndarray) -> None:
    # block_q5_0: d (f16), qh (u32, bit j = 5th bit of value j), qs[16]; y = (q - 16) * d.
    np.multiply(_f16(blocks, 0), _to_int8(_q5(blocks, 2), 16), out=out)


def _q5_1(blocks: np.ndarray, out: np.ndarray) -> None:
    # block_q5_1: d, m (f16), qh (u32), qs[16]; y = q * d + m.
    np.multiply(_f16(blocks, 0), _q5(blocks, 4), out=out)
    out += _f16(blocks, 2)


def _q8_0(blocks: np.ndarray, out: np.ndarray) -> None:
    # block_q8_0: d (f16), qs[32] (int8); y = qs * d.
    np.multiply(_f16(blocks, 0), blocks[:, 2:34].view(np.int8), out=out)


def _q8_1(blocks: np.ndarray, out: np.ndarray) -> None:
    # block_q8_1: d, s (f16; s = d * sum(qs)), qs[32] (int8); y = qs * d.
    np.multiply(_f16(blocks, 0), blocks[:, 4:36].view(np.int8), out=out)


def _iq4_nl(blocks: np.ndarray, out: np.ndarray) -> None:
    # block_iq4_nl: d (f16), qs[16]; y = d * kvalues[nibble], low nibbles first.
    k = np.take(KVALUES_IQ4NL, _nibbles(blocks[:, 2:18])).reshape(len(blocks), 32)
    np.multiply(_f16(blocks, 0), k, out=out)


# ---- 256-value super-blocks ---------------------------------------------------------------------


def _q8_k(blocks: np.ndarray, out: np.ndarray) -> None:
    # block_q8_K: d (f32), qs[256] (int8), bsums[16] (int16); y = d * qs.
    np.multiply(blocks[:, 0:4].view(np.float32), blocks[:, 4:260].view(np.int8), out=out)


def _q2_k(blocks: np.ndarray, out: np.ndarray) -> None:
    # block_q2_K: scales[16] (low nibble scale, high nibble min), qs[64], d, dmin (f16).
    # Values: for each half h of 128, each shift s in (0, 2, 4, 6), 32 crumbs of qs[32h : 32h + 32];
    # sub-block i of 16 values uses scales[i]: y = (d * sc) * q - (dmin * m).
    n = len(blocks)
    sc = blocks[:, 0:16]
    dl = (_f16(blocks, 80) * (sc & 0x0F)).reshape(n, 16, 1)
    ml = (_f16(blocks, 82) * (sc >> 4)).reshape(n, 16, 1)
    q = _crumbs(blocks[:, 16:80].reshape(n, 2, 32)).reshape(n, 16, 16)
    o = out.reshape(n, 16, 16)
    np.multiply(dl, q, out=o)
    o -= ml


def _q3_k_scales(sc: np.ndarray) -> np.ndarray:
    """The 16 signed 6-bit scales of Q3_K blocks from their 12 packed bytes, as int8 - 32."""
    n = len(sc)
    s = np.empty((n, 16), np.uint8)
    np.bitwise_and(sc[:, 0:8], 0x0F, out=s[:, 0:8])  # low 4 bits of scales 0..7
    np.right_shift(sc[:, 0:8], 4, out=s[:, 8:16])  # low 4 bits of scales 8..15
    hi = _crumbs(sc[:, 8:12]).reshape(n, 16)  # scale i: bits 2*(i // 4) of byte 8 + i % 4
    hi <<= 4
    s |= hi
    return _to_int8(s, 32)


def _q3_k(blocks: np.ndarray, out: np.ndarray) -> None:
    # block_q3_K: hmask[32], qs[64], scales[12] (6-bit, packed), d (f16).
    # Value order as Q2_K; value v of bit-plane b = v // 32 has 2 low bits from qs and subtracts 4
    # when bit b of hmask[v % 32] is clear: y = (d * (scale - 32)) * q.
    n = len(blocks)
    dl = (_f16(blocks, 108) * _q3_k_scales(blocks[:, 96:108])).reshape(n, 16, 1)
    q = _crumbs(blocks[:, 32:96].reshape(n, 2, 32)).reshape(n, 256)
    h = _bits(blocks[:, 0:32]).reshape(n, 256)
    h <<= 2
    q |= h  # q + 4 * hbit, in 0..7
    q = _to_int8(q, 4).reshape(n, 16, 16)
    np.multiply(dl, q, out=out.reshape(n, 16, 16))


def _k_scale_min(sc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 8 six-bit scales and mins of Q4_K/Q5_K from 12 packed bytes (ggml get_scale_min_k4)."""
    n = len(sc)
    s = sc.reshape(n, 3, 4)
    lo_d, lo_m, mix = s[:, 0], s[:, 1], s[:, 2]
    scale = np.empty((n, 8), np.uint8)
    mins = np.empty((n, 8), np.uint8)
    np.bitwise_and(lo_d, 0x3F, out=scale[:, 0:4])
    np.bitwise_and(lo_m, 0x3F, out=mins[:, 0:4])
    scale[:, 4:8] = (mix & 0x0F) | ((lo_d >> 2) & 0x30)
    mins[:, 4:8] = (mix >> 4) | ((lo_m >> 2) & 0x30)
    return scale, mins


def _q4_k(blocks: np.ndarray, out: np.ndarray) -> None:
    # block_q4_K: d, dmin (f16), scales[12], qs[128]. 8 sub-blocks of 32: sub-block 2j are the low
    # nibbles of qs[32j : 32j + 32], sub-block 2j + 1 their high nibbles. y = (d*sc) * q - (dmin*m).
    n = len(blocks)
    sc, mn = _k_scale_min(blocks[:, 4:16])
    d1 = (_f16(blocks, 0) * sc).reshape(n, 8, 1)
    m1 = (_f16(blocks, 2) * mn).reshape(n, 8, 1)
    q = _nibbles(blocks[:, 16:144].reshape(n, 4, 32)).reshape(n, 8, 32)
    o = out.reshape(n, 8, 32)
    np.multiply(d1, q, out=o)
    o -= m1


def _q5_k(blocks: np.ndarray, out: np.ndarray) -> None:
    # block_q5_K: d, dmin (f16), scales[12], qh[32], qs[128]; as Q4_K with a 5th bit: bit i of
    # qh[l] for value l of sub-block i.
    n = len(blocks)
    sc, mn = _k_scale_min(blocks[:, 4:16])
    d1 = (_f16(blocks, 0) * sc).reshape(n, 8, 1)
    m1 = (_f16(blocks, 2) * mn).reshape(n, 8, 1)
    q = _nibbles(blocks[:, 48:176].reshape(n, 4, 32)).reshape(n, 8, 32)
    h = _bits(blocks[:, 16:48])
    h <<= 4
    q |= h
    o = out.reshape(n, 8, 32)
    np.multiply(d1, q, out=o)
    o -= m1


def _q6_k(blocks: np.ndarray, out: np.ndarray) -> None:
    # block_q6_K: ql[128], qh[64], scales[16] (int8), d (f16). Each half h of 128 values: low
    # nibbles of ql[64h : 64h + 64] then their high nibbles, 2 more bits from qh[32h : 32h + 32] at
    # shifts 0, 2, 4, 6; sub-block i of 16 uses scales[i]: y = (d * scale) * (q - 32).
    n = len(blocks)
    q = _nibbles(blocks[:, 0:128].reshape(n, 2, 64)).reshape(n, 256)
    h = _crumbs(blocks[:, 128:192].reshape(n, 2, 32)).reshape(n, 256)
    h <<= 4
    q |= h
    q = _to_int8(q, 32).reshape(n, 16, 16)
    d = (_f16(blocks, 208) * blocks[:, 192:208].view(np.int8)).reshape(n, 16, 1)
    np.multiply(d, q, out=out.reshape(n, 16, 16))


def _iq4_xs(blocks: np.ndarray, out: np.ndarray) -> None:
    # block_iq4_xs: d (f16), scales_h (u16), scales_l[4], qs[128]. Sub-block i of 32 has the 6-bit
    # scale (nibble i of scales_l) | (bits 2i..2i+1 of scales_h) << 4 and the values kvalues[nibble]
    # of qs[16i : 16i + 16], low nibbles first: y = (d * (scale - 32)) * kvalue.
    n = len(blocks)
    ls = _nibbles(blocks[:, 4:8])  # [n, 2, 4]: nibble i of scales_l is ls[:, i % 2, i // 2]
    ls = ls.transpose(0, 2, 1).reshape(n, 8)
    sh = blocks[:, 2:4].view(np.uint16) >> np.arange(0, 16, 2, dtype=np.uint16)
    ls |= ((sh & 3) << 4).astype(np.uint8)
    dl = (_f16(blocks, 0) * _to_int8(ls, 32)).reshape(n, 8, 1)
    k = np.take(KVALUES_IQ4NL, _nibbles(blocks[:, 8:136].reshape(n, 8, 16))).reshape(n, 8, 32)
    np.multiply(dl, k, out=out.reshape(n, 8, 32))


_KERNELS: dict[T, _Kernel] = {
    T.Q4_0: _q4_0,
    T.Q4_1: _q4_1,
    T.Q5_0: _q5_0,
    T.Q5_1: _q5_1,
    T.Q8_0: _q8_0,
    T.Q8_1: _q8_1,
    T.Q8_K: _q8_k,
    T.Q2_K: _q2_k,
    T.Q3_K: _q3_k,
    T.Q4_K: _q4_k,
    T.Q5_K: _q5_k,
    T.Q6_K: _q6_k,
    T.IQ4_NL: _iq4_nl,
    T.IQ4_XS: _iq4_xs,
}

#: Every type :func:`dequantize` accepts.
DEQUANTIZABLE: frozenset[T] = frozenset({T.F32, T.F16, T.BF16, *_KERNELS})


def _flat_bytes(raw: np.ndarray | bytes | bytearray | memoryview) -> np.ndarray:
    """The bytes of ``raw`` as a flat uint8 array (a view when ``raw`` is contiguous)."""
    if isinstance(raw, (bytes, bytearray, memoryview)):
        return np.frombuffer(raw, dtype=np.uint8)
    buf = np.ascontiguousarray(raw).reshape(-1)
    return buf if buf.dtype == np.uint8 else buf.view(np.uint8)


def dequantize(raw: np.ndarray, ggml_type: T | int | str, shape: Sequence[int]) -> np.ndarray:
    """Decode the bytes of a tensor of type ``ggml_type`` into float32 of NumPy shape ``shape``.

    ``raw`` holds exactly the tensor's bytes (any shape; a non-uint8 array is reinterpreted as its
    bytes). ``shape`` is the NumPy-order shape of the result: its last axis is the row length and
    must be a multiple of the type's block size. The result is a new array, except for F32, where
    it is a view of ``raw`` (zero copy; read-only if ``raw`` is). Raises ``ValueError`` for a type
    without a dequantizer or a byte count that does not match ``shape``.
    """
    gt = as_ggml_type(ggml_type)
    shape = tuple(int(s) for s in shape)
    if not shape:
        raise ValueError("shape must have at least one axis")
    if gt not in DEQUANTIZABLE:
        raise ValueError(f"no dequantizer for GGML type {gt.name}")
    n_rows = 1
    for s in shape[:-1]:
        n_rows *= s
    buf = _flat_bytes(raw)
    n_bytes = n_rows * row_nbytes(gt, shape[-1])
    if buf.size != n_bytes:
        raise ValueError(f"a {gt.name} tensor of shape {shape} has {n_bytes} bytes, got {buf.size}")
    if gt == T.F32:
        return buf.view(np.float32).reshape(shape)
    if gt == T.F16:
        return buf.view(np.float16).astype(np.float32).reshape(shape)
    if gt == T.BF16:
        bits = buf.view(np.uint16).astype(np.uint32)
        bits <<= 16
        return bits.view(np.float32).reshape(shape)
    block, type_size = BLOCK_SIZES[gt]
    blocks = buf.reshape(-1, type_size)
    out = np.empty((len(blocks), block), np.float32)
    kernel = _KERNELS[gt]
    step = max(1, _CHUNK_VALUES // block)
    for i in range(0, len(blocks), step):
        kernel(blocks[i : i + step], out[i : i + step])
    return out.reshape(shape)


def dequantize_rows(
    raw: np.ndarray, ggml_type: T | int | str, n_per_row: int, rows: Sequence[int] | np.ndarray
) -> np.ndarray:
    """Decode only ``rows`` of a 2-D tensor (an embedding lookup): float32 [len(rows), n_per_row].

    ``raw`` holds the whole tensor's bytes, ``n_per_row`` values per row.
    """
    gt = as_ggml_type(ggml_type)
    rb = row_nbytes(gt, n_per_row)
    buf = _flat_bytes(raw)
    if rb == 0 or buf.size % rb:
        raise ValueError(f"{buf.size} bytes are not a whole number of {gt.name} rows of {n_per_row} values")
    ids = np.asarray(rows, dtype=np.int64).reshape(-1)
    picked = buf.reshape(-1, rb)[ids]
    return dequantize(picked, gt, (len(ids), n_per_row))


def dequantizer(ggml_type: T | int | str) -> Callable[[np.ndarray, Sequence[int]], np.ndarray] | None:
    """``raw, shape -> float32`` for one type (the trait table's ``dequantize_ref``), or None."""
    gt = as_ggml_type(ggml_type)
    if gt not in DEQUANTIZABLE:
        return None

    def dequantize_ref(raw: np.ndarray, shape: Sequence[int]) -> np.ndarray:
        return dequantize(raw, gt, shape)

    dequantize_ref.__name__ = f"dequantize_{gt.name.lower()}"
    dequantize_ref.__qualname__ = dequantize_ref.__name__
    return dequantize_ref
