"""Importance matrices: reading llama.cpp's imatrix files into per-tensor weight vectors.

This module owns the two on-disk formats llama-quantize accepts and its normalization of them:

- GGUF (``llama-imatrix`` today): tensors ``<name>.in_sum2`` (F32 sums of squared activations,
  one row per expert) and ``<name>.counts`` (F32 token counts per expert, rounded with
  ``lround``); the weights are ``sum / count`` per expert (1 where the count is 0). Metadata
  ``imatrix.datasets``, ``imatrix.chunk_count`` and ``imatrix.chunk_size`` must be present.
- legacy ``.dat``: int32 entry count, then per entry an int32-length name, int32 ``ncall``, int32
  value count and the float32 values; the weights are ``values / ncall``. An optional trailer
  holds the chunk count and a dataset name.

It also builds the ``quantize.imatrix.*`` keys llama-quantize adds to the output file.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = ["ImatrixData", "load_imatrix"]


@dataclass
class ImatrixData:
    """Normalized weights per tensor name, plus what llama-quantize records about the file."""

    weights: dict[str, np.ndarray]
    datasets: list[str] = field(default_factory=list)
    chunk_count: int = 0

    def metadata(self, file_name: str) -> list[tuple[str, str | int]]:
        """The ``quantize.imatrix.*`` keys (string or u32) llama-quantize appends, in its order."""
        out: list[tuple[str, str | int]] = [("quantize.imatrix.file", _c_str127(file_name))]
        if self.datasets:
            out.append(("quantize.imatrix.dataset", _c_str127(self.datasets[0])))
        out.append(("quantize.imatrix.entries_count", len(self.weights)))
        if self.chunk_count > 0:
            out.append(("quantize.imatrix.chunks_count", self.chunk_count))
        return out


def _c_str127(s: str) -> str:
    """``strncpy(dst, s, 127)``: at most 127 bytes, cut at a NUL."""
    b = s.encode("utf-8")[:127].split(b"\0")[0]
    return b.decode("utf-8", errors="ignore")


def load_imatrix(path: str | Path) -> ImatrixData:
    """Read an imatrix file (GGUF or legacy), normalized as llama-quantize does."""
    p = Path(path)
    with open(p, "rb") as f:
        magic = f.read(4)
    return _load_gguf(p) if magic == b"GGUF" else _load_legacy(p)


def _load_gguf(path: Path) -> ImatrixData:
    from gguf import GGUFReader

    r = GGUFReader(str(path), "r")
    meta = {k: r.fields.get(k) for k in ("imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size")}
    if any(v is None for v in meta.values()):
        raise ValueError(f"missing imatrix metadata in file {path}")
    datasets = [bytes(meta["imatrix.datasets"].parts[i]).decode("utf-8") for i in meta["imatrix.datasets"].data]
    chunk_count = int(meta["imatrix.chunk_count"].parts[meta["imatrix.chunk_count"].data[0]][0])
    sums, counts = {}, {}
    for t in r.tensors:
        if t.name.endswith(".in_sum2"):
            sums[t.name[: -len(".in_sum2")]] = t
        elif t.name.endswith(".counts"):
            counts[t.name[: -len(".counts")]] = t
    if not sums and not counts:
        raise ValueError(f"no data in file {path}")
    weights = {}
    for name in sorted(set(sums) | set(counts)):
        if name not in sums or name not in counts:
            raise ValueError(f"mismatched sums and counts for {name}")
        s = np.asarray(sums[name].data, dtype=np.float32).reshape(-1)
        c = np.asarray(counts[name].data, dtype=np.float32).reshape(-1)
        n_exp = len(c)
        cnt = _lround(c).astype(np.float32)
        s2 = s.reshape(n_exp, -1)
        with np.errstate(divide="ignore", invalid="ignore"):
            w = np.where(cnt[:, None] > 0, s2 / np.where(cnt > 0, cnt, 1)[:, None], np.float32(1))
        weights[name] = w.astype(np.float32).reshape(-1)
    return ImatrixData(weights, datasets, chunk_count)


def _lround(v: np.ndarray) -> np.ndarray:
    """C ``lround``: nearest integer, halves away from zero."""
    return (np.sign(v) * np.floor(np.abs(v.astype(np.float64)) + 0.5)).astype(np.int64)


def _load_legacy(path: Path) -> ImatrixData:
    data = path.read_bytes()
    pos = 0

    def take(fmt: str) -> tuple:
        nonlocal pos
        size = struct.calcsize(fmt)
        if pos + size > len(data):
            raise ValueError(f"truncated imatrix file {path}")
        vals = struct.unpack_from(fmt, data, pos)
        pos += size
        return vals

    (n_entries,) = take("<i")
    if n_entries < 1:
        raise ValueError(f"no data in file {path}")
    weights: dict[str, np.ndarray] = {}
    for _ in range(n_entries):
        (n,) = take("<i")
        name = data[pos : pos + n].split(b"\0")[0].decode("utf-8")
        pos += n
        ncall, nval = take("<ii")
        if nval < 1:
            raise ValueError(f"bad value count for {name} in {path}")
        vals = np.frombuffer(data, np.float32, nval, pos).copy()
        pos += 4 * nval
        weights[name] = vals / np.float32(ncall) if ncall > 0 else vals
    chunk_count, datasets = 0, []
    if pos + 4 <= len(data):
        (chunk_count,) = take("<i")
        if pos + 4 <= len(data):
            (n,) = take("<i")
            if n > 0 and pos + n <= len(data):
                datasets.append(data[pos : pos + n].split(b"\0")[0].decode("utf-8", errors="replace"))
    return ImatrixData(weights, datasets, chunk_count)
