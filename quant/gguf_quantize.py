"""Quantize a GGUF file to another GGUF file, byte for byte as ``llama_model_quantize`` writes it.

This module owns the file-level driver of ``llmedge quantize``: reading the input (memory-mapped,
one tensor at a time), asking :mod:`.mix` for every tensor's type, encoding with
:func:`.quantize.quantize`, and writing the output in llama.cpp's layout:

- the input's key/value pairs copied byte for byte in their order, minus ``split.*``,
  ``general.quantization_version`` and ``general.file_type``, which are then appended (u32 2 and
  the llama ftype);
- the tensors ordered like llama.cpp's model loader (block number, then name), each tensor info
  written with ggml's ``n_dims`` (trailing 1s dropped), data aligned to 32 bytes with zero padding;
- atomically: the bytes go to a temporary file beside the output, which is fsynced and then renamed
  over it, so the output path holds the previous file or the complete new one, never a partial GGUF.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
from gguf.constants import GGMLQuantizationType as T

from llmedge.fsutil import atomic_write
from llmedge.gguf import GGUFFile

from .dequant import dequantize
from .imatrix import ImatrixData
from .layout import row_nbytes
from .mix import FTYPES, MixParams, ModelInfo, TypePlanner, tensor_order_key
from .quantize import QUANTIZABLE, quantize

__all__ = ["QuantizeResult", "quantize_gguf"]

ALIGNMENT = 32
GGML_QNT_VERSION = 2
_DROPPED_KEYS = ("general.quantization_version", "general.file_type", "split.no", "split.count", "split.tensors.count")
_ROWS_PER_PASS_VALUES = 1 << 22  # values dequantized and re-encoded per pass (bounds memory)


@dataclass
class QuantizeResult:
    """What a run did: tensors and their chosen types, sizes in bytes, seconds spent."""

    types: dict[str, T]
    size_in: int
    size_out: int
    seconds: float
    n_fallback: int


@dataclass
class _Tensor:
    name: str
    ggml_type: T
    ne: list[int]
    raw: np.ndarray

    @property
    def n_dims(self) -> int:
        return max([i + 1 for i, d in enumerate(self.ne) if d != 1], default=1)


def _model_info(gf: GGUFFile) -> ModelInfo:
    def get(key: str, default: int = 0) -> int:
        v = gf.metadata.get(key, default)
        return int(v[0]) if isinstance(v, np.ndarray | list) else int(v)

    arch = gf.metadata.get("general.architecture")
    if not isinstance(arch, str):
        raise ValueError("not a model file: general.architecture is missing")
    n_head = get(f"{arch}.attention.head_count")
    return ModelInfo(
        arch=arch,
        n_layer=get(f"{arch}.block_count"),
        n_head=n_head,
        n_head_kv=get(f"{arch}.attention.head_count_kv", n_head),
        n_expert=get(f"{arch}.expert_count"),
    )


_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


def _kv_bytes(buf: memoryview) -> list[bytes]:
    """The raw bytes of every key/value pair of a GGUF header (v3), in order, minus the dropped keys."""
    (n_kv,) = struct.unpack_from("<Q", buf, 16)
    pos, out = 24, []
    for _ in range(n_kv):
        start = pos
        (n,) = struct.unpack_from("<Q", buf, pos)
        key = bytes(buf[pos + 8 : pos + 8 + n]).decode("utf-8")
        pos += 8 + n
        (vtype,) = struct.unpack_from("<I", buf, pos)
        pos = _skip_value(buf, pos + 4, vtype)
        if key not in _DROPPED_KEYS:
            out.append(bytes(buf[start:pos]))
    return out


def _skip_value(buf: memoryview, pos: int, vtype: int) -> int:
    if vtype == _STRING:
        return pos + 8 + struct.unpack_from("<Q", buf, pos)[0]
    if vtype != _ARRAY:
        return pos + _SCALAR_SIZES[vtype]
    etype, count = struct.unpack_from("<IQ", buf, pos)
    pos += 12
    if etype != _STRING:
        return pos + count * _SCALAR_SIZES[etype] if etype != _ARRAY else _skip_arrays(buf, pos, count)
    unpack = struct.Struct("<Q").unpack_from
    for _ in range(count):
        pos += 8 + unpack(buf, pos)[0]
    return pos


def _skip_arrays(buf: memoryview, pos: int, count: int) -> int:
    for _ in range(count):
        pos = _skip_value(buf, pos, _ARRAY)
    return pos


def _kv_key(kv: bytes) -> str:
    (n,) = struct.unpack_from("<Q", kv, 0)
    return kv[8 : 8 + n].decode("utf-8")


def _u32_kv(key: str, value: int) -> bytes:
    k = key.encode("utf-8")
    return struct.pack("<Q", len(k)) + k + struct.pack("<II", 4, value)


def _tensors(gf: GGUFFile) -> list[_Tensor]:
    out = [_Tensor(t.name, T(t.ggml_type), list(t.dims), t.data) for t in gf.tensors.values()]
    out.sort(key=lambda t: tensor_order_key(t.name))
    return out


def _nbytes(t: T, ne: list[int]) -> int:
    rows = 1
    for d in ne[1:]:
        rows *= d
    return rows * row_nbytes(t, ne[0])


def _pad(n: int) -> int:
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def _tensor_info(name: str, ne: list[int], n_dims: int, t: T, offset: int) -> bytes:
    b = name.encode("utf-8")
    dims = struct.pack(f"<{n_dims}Q", *ne[:n_dims])
    return struct.pack("<Q", len(b)) + b + struct.pack("<I", n_dims) + dims + struct.pack("<IQ", int(t), offset)


def _encode(t: _Tensor, new: T, write: Callable[[bytes], None], imatrix: np.ndarray | None) -> None:
    n = t.ne[0]
    rows = len(t.raw) // row_nbytes(t.ggml_type, n)
    per_expert = t.ne[1] if len(t.ne) > 1 else 1
    src_row = row_nbytes(t.ggml_type, n)
    step = max(1, _ROWS_PER_PASS_VALUES // n)
    for e0 in range(0, rows, per_expert):  # an importance row per expert (3-D tensors)
        qw = None if imatrix is None else imatrix[e0 // per_expert * n : (e0 // per_expert + 1) * n]
        for r in range(e0, e0 + per_expert, step):
            k = min(step, e0 + per_expert - r)
            x = dequantize(t.raw[r * src_row : (r + k) * src_row], t.ggml_type, (k, n))
            write(quantize(x, new, quant_weights=qw).tobytes())


def _str_kv(key: str, value: str) -> bytes:
    k, v = key.encode("utf-8"), value.encode("utf-8")
    return struct.pack("<Q", len(k)) + k + struct.pack("<IQ", 8, len(v)) + v


def _imatrix_rows(tensors: list[_Tensor], types: dict[str, T], imatrix: ImatrixData | None) -> dict[str, np.ndarray]:
    """llama-quantize's lookup: the importance rows of each tensor that is re-encoded, checked."""
    out: dict[str, np.ndarray] = {}
    if imatrix is None:
        return out
    for t in tensors:
        if types[t.name] == t.ggml_type or t.name not in imatrix.weights:
            continue
        w = imatrix.weights[t.name]
        n_expert = t.ne[2] if len(t.ne) > 2 else 1
        if len(w) == t.ne[0] * n_expert:
            out[t.name] = w
        elif t.name not in ("token_embd.weight", "per_layer_token_embd.weight"):
            raise ValueError(f"imatrix size {len(w)} is different from tensor size {t.ne[0] * n_expert} for {t.name}")
    return out


def _write(
    dst: Path,
    header: bytes,
    tensors: list[_Tensor],
    types: dict[str, T],
    progress: Callable | None,
    imatrix_rows: dict[str, np.ndarray],
) -> int:
    """Write the file under a temporary name beside ``dst``, fsync it, then rename it over ``dst``:
    a killed or failed run leaves ``dst`` as it was (absent or the previous file), never a partial
    GGUF under the final name; the next run removes the temporary files of killed ones."""
    with atomic_write(dst) as f:
        return _write_body(f, header, tensors, types, progress, imatrix_rows)


def _write_body(
    f: BinaryIO,
    header: bytes,
    tensors: list[_Tensor],
    types: dict[str, T],
    progress: Callable | None,
    imatrix_rows: dict[str, np.ndarray],
) -> int:
    f.write(header + b"\0" * (_pad(len(header)) - len(header)))
    for i, t in enumerate(tensors):
        new = types[t.name]
        if progress is not None:
            progress(i, len(tensors), t.name, new)
        start = f.tell()
        if new == t.ggml_type:
            f.write(memoryview(np.ascontiguousarray(t.raw)))  # straight from the input mmap
        else:
            _encode(t, new, f.write, imatrix_rows.get(t.name))
        written = f.tell() - start
        f.write(b"\0" * (_pad(written) - written))
    return f.tell()


def check_output(src: str | Path, dst: str | Path) -> None:
    """ValueError when ``dst`` cannot be the output for ``src``: a folder, or the input file itself
    (the same path, a hard link or a symlink to it: the input is read while the output is written)."""
    src, dst = Path(src), Path(dst)
    if dst.is_dir():
        raise ValueError(f"the output {dst} is a folder; give the path of the GGUF file to write")
    same = os.path.realpath(src) == os.path.realpath(dst)
    if not same and dst.exists():
        try:
            same = os.path.samefile(src, dst)
        except OSError:
            pass
    if same:
        raise ValueError(f"the output {dst} is the input file {src}; choose another output file")


def quantize_gguf(
    src: str | Path,
    dst: str | Path,
    params: MixParams,
    *,
    allow_requantize: bool = False,
    imatrix: ImatrixData | None = None,
    imatrix_name: str = "",
    progress: Callable[[int, int, str, T], None] | None = None,
) -> QuantizeResult:
    """Write ``dst``: ``src`` quantized with llama-quantize's rules for ``params``.

    Raises ``ValueError`` (one line) for what llama-quantize refuses: an unknown mix, a type
    without an encoder here, requantizing a quantized tensor without ``allow_requantize``, a mix
    that needs an importance matrix; and for an output that is a folder or the input itself.
    """
    t0 = time.perf_counter()
    check_output(src, dst)
    gf = GGUFFile(src)
    if gf.version != 3:
        raise ValueError(f"GGUF version {gf.version} input is not supported (llama-quantize writes version 3)")
    tensors = _tensors(gf)
    if imatrix is not None:
        params = dataclasses.replace(params, has_imatrix=True)
    planner = TypePlanner(_model_info(gf), params, [t.name for t in tensors])
    types: dict[str, T] = {}
    for t in tensors:
        new = planner.target_type(t.name, t.ggml_type, t.ne)
        if imatrix is None and planner.allows_quantization(t.name, t.n_dims) and planner.requires_imatrix(t.name, new):
            raise ValueError(f"this quantization requires an importance matrix (tensor {t.name}, type {new.name})")
        if new != t.ggml_type:
            if new not in QUANTIZABLE:
                raise ValueError(f"no encoder for type {new.name} (tensor {t.name})")
            if t.ggml_type not in (T.F32, T.F16, T.BF16) and not allow_requantize:
                raise ValueError(f"requantizing from type {t.ggml_type.name} is disabled (use --allow-requantize)")
        types[t.name] = new
    rows = _imatrix_rows(tensors, types, imatrix)
    for t in tensors:
        if types[t.name] != t.ggml_type and t.name not in rows and planner.requires_imatrix(t.name, types[t.name]):
            raise ValueError(f"missing importance matrix for tensor {t.name} in a very low-bit quantization")

    with open(src, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        view = memoryview(mm)
        try:
            kvs = _kv_bytes(view)
        finally:
            view.release()
    kvs += [_u32_kv("general.quantization_version", GGML_QNT_VERSION), _u32_kv("general.file_type", FTYPES[params.ftype][0])]
    if imatrix is not None:
        extra = imatrix.metadata(imatrix_name)
        keys = {k for k, _ in extra}
        kvs = [kv for kv in kvs if _kv_key(kv) not in keys]
        kvs += [_str_kv(k, v) if isinstance(v, str) else _u32_kv(k, v) for k, v in extra]
    infos, offset = [], 0
    for t in tensors:
        infos.append(_tensor_info(t.name, t.ne, t.n_dims, types[t.name], offset))
        offset += _pad(_nbytes(types[t.name], t.ne))
    header = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs) + b"".join(infos)
    size_in = sum(len(t.raw) for t in tensors)
    size_out = _write(Path(dst), header, tensors, types, progress, rows)
    return QuantizeResult(types, size_in, size_out, time.perf_counter() - t0, planner.n_fallback)
