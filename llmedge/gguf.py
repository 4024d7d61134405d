"""The GGUF reader: a validated, zero-copy view of a GGUF file.

The file is memory-mapped once. The header (metadata and tensor infos) is parsed eagerly and every
length, count, offset and size is checked against the bytes actually present before it is used, so a
malformed file raises one :class:`~llmedge.errors.GGUFError` saying what is wrong and at which byte
offset, never an ``IndexError``, a ``MemoryError`` or a crash. Tensor data is exposed as NumPy views
into the mapping (no copy). Nothing above this module parses bytes.
"""

from __future__ import annotations

import mmap
import os
import struct
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from llmedge.errors import GGUFError
from llmedge.quant.traits import traits as quant_traits

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
INT64_MAX = (1 << 63) - 1
MAX_NAME_BYTES = 63  # GGML_MAX_NAME is 64 with the terminating NUL
MAX_VALUE_BYTES = 1 << 30  # one metadata string or array: past 1 GiB it is an attack, not a model

# GGUF metadata value types -> (struct format, NumPy dtype); STRING (8) and ARRAY (9) are special.
_SCALAR_TYPES: dict[int, tuple[str, str]] = {
    0: ("<B", "uint8"),
    1: ("<b", "int8"),
    2: ("<H", "uint16"),
    3: ("<h", "int16"),
    4: ("<I", "uint32"),
    5: ("<i", "int32"),
    6: ("<f", "float32"),
    7: ("<?", "bool"),
    10: ("<Q", "uint64"),
    11: ("<q", "int64"),
    12: ("<d", "float64"),
}
_STRING, _ARRAY = 8, 9
_TYPE_NAMES = {**{k: v[1] for k, v in _SCALAR_TYPES.items()}, _STRING: "string", _ARRAY: "array"}
# Smallest possible encodings, used to reject absurd counts before looping over them.
_MIN_KV_BYTES = 8 + 4 + 1
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a GGUF file: its name, GGML type, dimensions and raw bytes."""

    name: str
    ggml_type: int
    dims: tuple[int, ...]  # GGUF order: dims[0] is the row length (innermost)
    offset: int  # absolute byte offset of the data in the file
    n_bytes: int
    _buffer: np.ndarray = field(repr=False)

    @property
    def shape(self) -> tuple[int, ...]:
        """NumPy order (outermost first): the reverse of ``dims``."""
        return tuple(reversed(self.dims))

    @property
    def type_name(self) -> str:
        return quant_traits(self.ggml_type).name

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.dims:
            n *= d
        return n

    @property
    def data(self) -> np.ndarray:
        """The raw bytes, a uint8 view into the memory map (no copy)."""
        return self._buffer[self.offset : self.offset + self.n_bytes]

    def rows(self) -> np.ndarray:
        """The raw bytes as [n_rows, row_bytes]: one row of ``dims[0]`` values per line."""
        n_rows = self.n_elements // self.dims[0] if self.dims[0] else 0
        return self.data.reshape(n_rows, -1) if n_rows else self.data.reshape(0, 0)


class _Cursor:
    """Bounds-checked little-endian reads over the mapped bytes."""

    def __init__(self, buf: memoryview, size: int) -> None:
        self.buf = buf
        self.size = size
        self.pos = 0

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise GGUFError(
                f"truncated or corrupt file: {what} at byte {self.pos} needs {n} bytes, "
                f"only {self.size - self.pos} left"
            )

    def scalar(self, fmt: str, what: str) -> Any:
        n = struct.calcsize(fmt)
        self.need(n, what)
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return v

    def u32(self, what: str) -> int:
        return self.scalar("<I", what)

    def u64(self, what: str) -> int:
        return self.scalar("<Q", what)

    def string(self, what: str, limit: int = MAX_VALUE_BYTES) -> str:
        """A length-prefixed UTF-8 string (invalid bytes become U+FFFD), decoded straight from the map."""
        n = self.u64(f"length of {what}")
        if n > limit:
            if n > INT64_MAX:
                claim = f"a negative length ({n - (1 << 64)})"
            elif limit < MAX_VALUE_BYTES:
                claim = f"{n} bytes, longer than {limit} bytes"
            else:
                claim = f"{n} bytes, over the 1 GiB limit"
            raise GGUFError(f"{what} at byte {self.pos - 8} claims {claim}")
        self.need(n, what)
        text = str(self.buf[self.pos : self.pos + n], "utf-8", "replace")
        self.pos += n
        return text

    def strings(self, count: int, what: str) -> list[str]:
        """``count`` consecutive strings (the hot path of loading: vocabularies and merges)."""
        bulk = _bulk_strings(self.buf, self.size, self.pos, count)
        if bulk is not None:
            out, self.pos = bulk
            return out
        buf, pos, size = self.buf, self.pos, self.size
        out: list[str] = []
        append = out.append
        from_bytes = int.from_bytes
        for i in range(count):
            if pos + 8 > size:
                self.pos = pos
                self.need(8, f"length of element {i} of {what}")
            n = from_bytes(buf[pos : pos + 8], "little")
            pos += 8
            if pos + n > size:
                self.pos = pos
                self.need(n, f"element {i} of {what}")
            raw = bytes(buf[pos : pos + n])
            pos += n
            try:
                append(raw.decode("utf-8"))
            except UnicodeDecodeError:
                append(raw.decode("utf-8", errors="replace"))
        self.pos = pos
        return out

    def left(self) -> int:
        return self.size - self.pos


def _bulk_strings(buf: memoryview, size: int, pos: int, count: int) -> tuple[list[str], int] | None:
    """Decode ``count`` GGUF strings at ``pos`` at once: the native library finds their byte ranges,
    each length prefix is replaced by one NUL separator, and one UTF-8 decode and one split yield
    the strings. None (use the per-string path, which also reports errors precisely) when the native
    library is missing, the strings run past the end, a string holds a NUL byte or is not valid
    UTF-8 on its own (a character cannot span a separator)."""
    if count < 1024:
        return None
    try:
        from llmedge._native import ffi, lib
    except ImportError:
        return None
    starts = np.empty(count, dtype=np.int64)
    ends = np.empty(count, dtype=np.int64)
    end = lib.lle_gguf_strings(ffi.from_buffer("unsigned char[]", buf), size, pos, count,
                               ffi.from_buffer("long long[]", starts), ffi.from_buffer("long long[]", ends))
    if end < 0:
        return None
    region = np.frombuffer(buf, dtype=np.uint8, count=end - pos, offset=pos).copy()
    keep = np.ones(region.size, dtype=bool)
    prefix = starts - (pos + 8)
    for k in range(7):  # 7 of each prefix's 8 bytes (one pass each: no 7x index array)
        keep[prefix + k] = False
    region[starts - pos - 1] = 0  # the 8th becomes the separator
    joined = region[keep]
    if int(np.count_nonzero(joined == 0)) != count:
        return None
    try:
        text = joined.tobytes().decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text.split("\x00")[1:], int(end)


# The read-only file mappings GGUFFile made (the only memory release_resident_pages touches), each with the
# page ranges released from it ({first byte: end}).
_FILE_MAPPINGS: weakref.WeakKeyDictionary[mmap.mmap, dict[int, int]] = weakref.WeakKeyDictionary()


def _file_mapping(arr: np.ndarray) -> tuple[Any, dict[int, int]] | None:
    """The open GGUF file mapping ``arr`` views, and its released page ranges, or None."""
    base: Any = arr
    while base is not None and not isinstance(base, mmap.mmap):
        base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
    released = _FILE_MAPPINGS.get(base) if base is not None else None
    if released is None or not hasattr(mmap, "MADV_DONTNEED") or base.closed:
        return None
    return base, released


def prepare_release(arr: np.ndarray) -> bool:
    """Whether ``arr`` views a GGUF file's read-only mapping, whose pages may be dropped from the resident
    set (:func:`release_resident_pages`; the native packer drops them slice by slice as it copies). If so,
    the mapping is first told to use no huge-page mappings (MADV_NOHUGEPAGE, once): Linux 6.x maps a file
    cached in 2 MB folios 2 MB at a time, so releasing part of one would unmap its neighbours' pages and
    the next read of any neighbour (a norm, a weight kept in the file) would map the released part back."""
    found = _file_mapping(arr)
    if found is None:
        return False
    base, released = found
    if not released and hasattr(mmap, "MADV_NOHUGEPAGE"):
        try:
            base.madvise(mmap.MADV_NOHUGEPAGE)
        except OSError:  # a kernel without transparent huge pages: nothing is mapped 2 MB at a time
            pass
    return True


def release_resident_pages(arr: np.ndarray) -> bool:
    """Drop the whole pages under ``arr`` from this process's resident set, when ``arr`` is a view into a
    GGUF file's read-only mapping (a backend that made its own copy of a tensor, e.g. the native backend's
    packed weights, no longer reads the file's bytes). The bytes stay valid: an access faults them back in
    from the page cache. Returns False, touching nothing, for any other memory (anonymous memory would be
    zeroed) or where the OS has no MADV_DONTNEED."""
    found = _file_mapping(arr)
    if found is None:
        return False
    base, released = found
    start = arr.ctypes.data - np.frombuffer(base, dtype=np.uint8).ctypes.data
    page = mmap.PAGESIZE
    first = -(-start // page) * page
    last = (start + arr.nbytes) // page * page
    if last > first:
        base.madvise(mmap.MADV_DONTNEED, first, last - first)
        released[first] = last
    return True


class GGUFFile:
    """A memory-mapped, validated GGUF file.

    ``metadata`` maps keys to Python values: str, int, float, bool; string arrays are ``list[str]``;
    numeric arrays are NumPy arrays. ``tensors`` maps names to :class:`TensorInfo` in file order.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size == 0:
                    raise GGUFError(f"{self.path}: empty file, not a GGUF model")
                self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                _FILE_MAPPINGS[self._mmap] = {}
        except OSError as e:
            raise GGUFError(f"{self.path}: cannot open: {e.strerror or e}") from None
        self.file_size = size
        self._bytes = np.frombuffer(self._mmap, dtype=np.uint8)
        self.metadata: dict[str, Any] = {}
        self.value_types: dict[str, str] = {}
        self.tensors: dict[str, TensorInfo] = {}
        try:
            self._parse()
        except GGUFError as e:
            raise GGUFError(f"{self.path}: {e}") from None

    # -- parsing ---------------------------------------------------------------------------------
    def _parse(self) -> None:
        cur = _Cursor(memoryview(self._mmap), self.file_size)
        self._parse_preamble(cur)
        n_tensors = cur.u64("tensor count")
        n_kv = cur.u64("metadata count")
        for what, n, least in (("metadata", n_kv, _MIN_KV_BYTES), ("tensor", n_tensors, _MIN_TENSOR_INFO_BYTES)):
            if n > INT64_MAX:
                raise GGUFError(f"{what} count {n} is negative as int64")
            if n * least > cur.left():
                raise GGUFError(f"{what} count {n} is impossible for a file of {self.file_size} bytes")
        for i in range(n_kv):
            self._parse_kv(cur, i)
        self.alignment = self._alignment()
        seen: set[str] = set()
        infos = [self._parse_tensor_info(cur, i, seen) for i in range(n_tensors)]
        data_start = -(-cur.pos // self.alignment) * self.alignment
        if data_start > self.file_size:
            raise GGUFError(f"tensor data section starts at byte {data_start}, past the end of the file")
        self.data_offset = data_start
        expected = 0  # each offset is the padded running sum of the sizes before it, as llama.cpp requires
        for name, dims, ggml_type, offset, start in infos:
            n_bytes = self._tensor_bytes(name, dims, ggml_type, start)
            if offset != expected:
                why = "not aligned to " + str(self.alignment) if offset % self.alignment else "not the end of the previous tensor"
                raise GGUFError(f"tensor {_q(name)} data offset {offset} is {why} (expected {expected})")
            abs_offset = data_start + offset
            if abs_offset + n_bytes > self.file_size:
                raise GGUFError(
                    f"tensor {_q(name)} data ({n_bytes} bytes at byte {abs_offset}) runs past the end of the "
                    f"file ({self.file_size} bytes)"
                )
            expected = offset + -(-n_bytes // self.alignment) * self.alignment
            self.tensors[name] = TensorInfo(name, ggml_type, dims, abs_offset, n_bytes, self._bytes)

    def _parse_preamble(self, cur: _Cursor) -> None:
        cur.need(4, "magic")
        magic = bytes(cur.buf[0:4])
        cur.pos = 4
        if magic != GGUF_MAGIC:
            raise GGUFError(f"not a GGUF file: magic is {magic!r}, expected b'GGUF'")
        self.version = cur.u32("version")
        if self.version not in SUPPORTED_VERSIONS:
            swapped = int.from_bytes(self.version.to_bytes(4, "little"), "big")
            if swapped in SUPPORTED_VERSIONS:
                raise GGUFError(f"GGUF version {self.version} is version {swapped} byte-swapped: "
                                "big-endian files are not supported")
            why = " (GGUF v1 is obsolete)" if self.version == 1 else ""
            raise GGUFError(f"unsupported GGUF version {self.version}{why} (supported: 2, 3)")

    def _parse_kv(self, cur: _Cursor, i: int) -> None:
        start = cur.pos
        key = cur.string(f"key of metadata entry {i}")
        if not key:
            raise GGUFError(f"metadata entry {i} at byte {start} has an empty key")
        if key in self.metadata:
            raise GGUFError(f"duplicate metadata key {_q(key)} at byte {start}")
        vtype = cur.u32(f"value type of {_q(key)}")
        self.metadata[key] = self._read_value(cur, vtype, key)
        self.value_types[key] = _TYPE_NAMES[vtype]

    def _alignment(self) -> int:
        alignment = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if "general.alignment" in self.metadata and self.value_types["general.alignment"] != "uint32":
            raise GGUFError(f"general.alignment must be a uint32, got {self.value_types['general.alignment']}")
        if alignment <= 0 or alignment & (alignment - 1):
            raise GGUFError(f"general.alignment must be a positive power of two, got {alignment!r}")
        return alignment

    def _parse_tensor_info(self, cur: _Cursor, i: int, seen: set[str]) -> tuple[str, tuple[int, ...], int, int, int]:
        start = cur.pos
        name = cur.string(f"name of tensor {i}", MAX_NAME_BYTES)
        if name in seen:
            raise GGUFError(f"duplicate tensor name {_q(name)} at byte {start}")
        seen.add(name)
        n_dims = cur.u32(f"rank of tensor {_q(name)}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise GGUFError(f"tensor {_q(name)} has rank {n_dims}; ranks 1 to {MAX_DIMS} are valid")
        dims = tuple(cur.u64(f"dimension {d} of tensor {_q(name)}") for d in range(n_dims))
        ggml_type = cur.u32(f"type of tensor {_q(name)}")
        offset = cur.u64(f"data offset of tensor {_q(name)}")
        return name, dims, ggml_type, offset, start

    def _tensor_bytes(self, name: str, dims: tuple[int, ...], ggml_type: int, start: int) -> int:
        """The byte size of a tensor's data, after checking its type and dimensions."""
        try:
            tr = quant_traits(ggml_type)
        except (KeyError, ValueError):
            raise GGUFError(f"tensor {_q(name)} (header byte {start}) has unknown GGML type {ggml_type}") from None
        if tr.type_size == 0 or tr.block_size == 0:
            raise GGUFError(f"tensor {_q(name)} has unsupported GGML type {tr.name}")
        n_elems = 1
        for d in dims:
            if d > INT64_MAX:
                raise GGUFError(f"tensor {_q(name)} has a negative dimension ({d - (1 << 64)})")
            n_elems *= d
        if n_elems > INT64_MAX:
            raise GGUFError(f"tensor {_q(name)} dimensions {list(dims)} overflow int64 elements")
        if dims[0] % tr.block_size:
            raise GGUFError(
                f"tensor {_q(name)} row length {dims[0]} is not a multiple of the {tr.name} block size "
                f"{tr.block_size}"
            )
        n_bytes = n_elems // tr.block_size * tr.type_size
        if n_bytes + self.alignment > INT64_MAX:
            raise GGUFError(f"tensor {_q(name)} byte size {n_bytes} overflows int64")
        return n_bytes

    def _read_value(self, cur: _Cursor, vtype: int, key: str) -> Any:
        if vtype in _SCALAR_TYPES:
            v = cur.scalar(_SCALAR_TYPES[vtype][0], f"value of {_q(key)}")
            return float(v) if vtype in (6, 12) else v
        if vtype == _STRING:
            return cur.string(f"string value of {_q(key)}")
        if vtype != _ARRAY:
            raise GGUFError(f"metadata {_q(key)} has unknown value type {vtype} (byte {cur.pos - 4})")
        etype = cur.u32(f"array element type of {_q(key)}")
        count = cur.u64(f"array length of {_q(key)}")
        if etype == _ARRAY:
            raise GGUFError(f"array {_q(key)} holds arrays: nested arrays are not supported")
        if etype not in _SCALAR_TYPES and etype != _STRING:
            raise GGUFError(f"array {_q(key)} has unknown element type {etype}")
        least = np.dtype(_SCALAR_TYPES[etype][1]).itemsize if etype in _SCALAR_TYPES else 8
        if count * least > MAX_VALUE_BYTES:
            raise GGUFError(f"array {_q(key)} of {count} elements is over the 1 GiB limit")
        if count * least > cur.left():
            raise GGUFError(f"array length {count} of {_q(key)} is past the end of the file")
        if etype == _STRING:
            return cur.strings(count, f"{_q(key)}")
        dtype = np.dtype(_SCALAR_TYPES[etype][1]).newbyteorder("<")
        arr = np.frombuffer(self._mmap, dtype=dtype, count=count, offset=cur.pos)
        cur.pos += count * least
        return arr

    # -- typed accessors -------------------------------------------------------------------------
    @property
    def architecture(self) -> str:
        return self.get_str("general.architecture")

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def _typed(self, key: str, default: Any, types: tuple[type, ...], kind: str) -> Any:
        if key not in self.metadata:
            if default is _REQUIRED:
                raise GGUFError(f"{self.path}: required metadata {_q(key)} is missing")
            return default
        v = self.metadata[key]
        if isinstance(v, bool) and bool not in types:
            raise GGUFError(f"{self.path}: metadata {_q(key)} should be {kind}, got bool")
        if not isinstance(v, types):
            raise GGUFError(f"{self.path}: metadata {_q(key)} should be {kind}, got {self.value_types[key]}")
        return v

    def get_str(self, key: str, default: Any = None) -> str:
        return self._typed(key, _REQUIRED if default is None else default, (str,), "a string")

    def get_int(self, key: str, default: Any = None) -> int:
        return self._typed(key, _REQUIRED if default is None else default, (int,), "an integer")

    def get_float(self, key: str, default: Any = None) -> float:
        v = self._typed(key, _REQUIRED if default is None else default, (int, float), "a number")
        return float(v)

    def get_bool(self, key: str, default: Any = None) -> bool:
        return self._typed(key, _REQUIRED if default is None else default, (bool,), "a boolean")

    def get_array(self, key: str, default: Any = None) -> Any:
        return self._typed(key, _REQUIRED if default is None else default, (list, np.ndarray), "an array")

    @property
    def file_type(self) -> str:
        """The file's quantization as llama.cpp and Ollama name it: ``general.file_type`` (``Q4_K_M``),
        else the most common tensor type other than F32."""
        ft = self.metadata.get("general.file_type")
        if isinstance(ft, int) and not isinstance(ft, bool) and ft in FILE_TYPES:
            return FILE_TYPES[ft]
        from collections import Counter

        types = Counter(t.type_name for t in self.tensors.values())
        return max((t for t in types if t != "F32"), key=lambda t: types[t], default="F32")

    def tensor(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise GGUFError(f"{self.path}: tensor {_q(name)} is missing") from None

    @property
    def released_bytes(self) -> int:
        """Bytes of the file that :func:`release_resident_pages` took out of the resident set (a backend
        holds its own copy of those tensors), so the process holds file size minus this of the mapping."""
        return sum(end - first for first, end in _FILE_MAPPINGS.get(self._mmap, {}).items())

    def close(self) -> None:
        """Release the mapping (only possible once no tensor view is alive)."""
        try:
            self._mmap.close()
        except BufferError:
            pass

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_REQUIRED = object()

#: ``general.file_type`` (llama.h's ``llama_ftype``) -> the name Ollama's ``quantization_level`` shows
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
    12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
    19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL",
    26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0",
    37: "TQ2_0", 38: "MXFP4",
}


def _q(text: str, limit: int = 80) -> str:
    """A name from the file, quoted for a one-line message: escaped (no newline survives) and cut."""
    return repr(text[:limit]) + ("..." if len(text) > limit else "")
