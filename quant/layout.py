"""Byte geometry of the GGML types: elements per block, bytes per block, bytes per row.

This module owns the sizes (and nothing else), so that the trait table, the dequantizers and the
quantizers all read them from one place. The sizes are those of ggml's C block structs
(``ggml-common.h``). They equal ``gguf.constants.GGML_QUANT_SIZES`` for every type but one:
``Q8_1``, whose block in ggml is ``{ggml_half d; ggml_half s; int8_t qs[32]}`` = 36 bytes, while the
``gguf`` package still lists the old 40-byte ``{float d; float s; ...}`` layout. ``Q8_1`` only ever
exists as an activation buffer inside a matrix product (never in a GGUF file), and the native
kernels must match ggml's layout, so ggml's 36 bytes are used here.
"""

from __future__ import annotations

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

__all__ = ["BLOCK_SIZES", "GGUF_SIZE_EXCEPTIONS", "QK_K", "as_ggml_type", "row_nbytes"]

QK_K = 256

# Types whose ggml block size differs from what the installed gguf package says, with ggml's value.
GGUF_SIZE_EXCEPTIONS: dict[GGMLQuantizationType, tuple[int, int]] = {
    GGMLQuantizationType.Q8_1: (32, 2 + 2 + 32),
}

# (elements per block, bytes per block) for every type the gguf package knows.
BLOCK_SIZES: dict[GGMLQuantizationType, tuple[int, int]] = {
    t: GGUF_SIZE_EXCEPTIONS.get(t, GGML_QUANT_SIZES[t]) for t in GGMLQuantizationType if t in GGML_QUANT_SIZES
}


def as_ggml_type(t: GGMLQuantizationType | int | str) -> GGMLQuantizationType:
    """The enum member for ``t`` (an enum member, its integer value or its name such as ``"Q4_K"``).

    Raises ``ValueError`` for an integer or name that is not a known GGML type.
    """
    if isinstance(t, GGMLQuantizationType):
        return t
    if isinstance(t, str):
        try:
            return GGMLQuantizationType[t.upper()]
        except KeyError:
            raise ValueError(f"unknown GGML type name {t!r}") from None
    try:
        return GGMLQuantizationType(int(t))
    except ValueError:
        raise ValueError(f"unknown GGML type {t!r}") from None


def row_nbytes(t: GGMLQuantizationType | int | str, n_per_row: int) -> int:
    """Bytes taken by one row of ``n_per_row`` values of type ``t``.

    Raises ``ValueError`` if ``n_per_row`` is negative or not a multiple of the type's block size.
    """
    gt = as_ggml_type(t)
    block, nbytes = BLOCK_SIZES[gt]
    if n_per_row < 0 or n_per_row % block:
        raise ValueError(f"row length {n_per_row} is not a multiple of the {gt.name} block size {block}")
    return n_per_row // block * nbytes
