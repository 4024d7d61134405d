"""Computing an importance matrix the way ``llama-imatrix`` does, and writing its GGUF format.

This module owns ``llmedge imatrix``: the text is tokenized (with BOS when the model adds one),
cut into chunks of ``n_ctx`` tokens (the first token of each chunk replaced by BOS), each chunk
evaluated in a fresh context; for every matrix product of a ``blk.*`` weight (and
``output.weight`` with ``process_output``) over at least 16 rows, the squares of the input
activations are summed per column and the rows counted. The result is written as llama-imatrix
writes it: ``<name>.in_sum2`` [ne0, 1] and ``<name>.counts`` [1, 1] F32 tensors in name order,
and ``general.type``, ``imatrix.datasets``, ``imatrix.chunk_count``, ``imatrix.chunk_size``.

The activations come from llmedge's NumPy reference backend, observed through a recording proxy
around its ``prepare`` / ``matmul`` (the model code is not touched); they agree with llama.cpp's
to float rounding, not bit for bit, so the sums do too.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["ImatrixStats", "collect_imatrix", "write_imatrix_gguf"]

MIN_ROWS = 16  # llama-imatrix ignores products over fewer rows


@dataclass
class ImatrixStats:
    """Per weight name: float32 sums of squared inputs [ne0] and the number of rows seen."""

    sums: dict[str, np.ndarray] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    chunk_size: int = 512
    n_chunks: int = 0


class _Recorder:
    """A backend proxy: every protocol call goes to ``inner``; ``matmul`` inputs are recorded."""

    def __init__(self, inner: Any, stats: ImatrixStats, process_output: bool) -> None:
        self._inner, self._stats, self._output = inner, stats, process_output
        self._names: dict[int, str] = {}

    def prepare(self, tensor: Any) -> Any:
        handle = self._inner.prepare(tensor)
        self._names[id(handle)] = tensor.name
        return handle

    def matmul(self, x: np.ndarray, w: Any, *args: Any, **kwargs: Any) -> np.ndarray:
        name = self._names.get(id(w))
        if name and (name.startswith("blk.") or (self._output and name == "output.weight")):
            rows = np.asarray(x, dtype=np.float32).reshape(-1, x.shape[-1])
            if len(rows) >= MIN_ROWS:
                acc = self._stats.sums.setdefault(name, np.zeros(rows.shape[1], np.float32))
                for r in rows:  # llama-imatrix adds row after row, in float32
                    acc += r * r
                self._stats.counts[name] = self._stats.counts.get(name, 0) + len(rows)
        return self._inner.matmul(x, w, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@contextmanager
def _recording_backend(stats: ImatrixStats, process_output: bool):  # noqa: ANN202
    import llmedge.api as api

    original = api.make_backend

    def make(name: str | None = "auto", n_threads: int | None = None) -> Any:
        return _Recorder(original(name, n_threads), stats, process_output)

    api.make_backend = make
    try:
        yield
    finally:
        api.make_backend = original


def collect_imatrix(
    model_path: str | Path,
    tokens: Sequence[int] | None = None,
    text: str | None = None,
    n_ctx: int = 512,
    n_chunks: int | None = None,
    process_output: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> ImatrixStats:
    """Run the model over ``text`` (or ``tokens``, used as given) and collect the statistics."""
    from llmedge.api import Model

    stats = ImatrixStats(chunk_size=n_ctx)
    with _recording_backend(stats, process_output):
        model = Model(Path(model_path), backend="numpy", n_ctx=n_ctx, n_batch=n_ctx)
    if tokens is None:
        tokens = model.tokenize(text or "", add_bos=model.tokenizer.add_bos)
    tokens = list(tokens)
    if len(tokens) < 2 * n_ctx:
        raise ValueError(f"you need at least {2 * n_ctx} tokens for a context of {n_ctx} tokens, got {len(tokens)}")
    total = len(tokens) // n_ctx if n_chunks is None else min(n_chunks, len(tokens) // n_ctx)
    bos = model.tokenizer.bos_id if model.tokenizer.add_bos else None  # may be None: then kept
    for i in range(total):
        chunk = tokens[i * n_ctx : (i + 1) * n_ctx]
        if bos is not None:
            chunk[0] = bos
        model.logits(chunk)
        stats.n_chunks = i + 1
        if progress is not None:
            progress(i + 1, total)
    return stats


def _kv_str(key: str, value: str) -> bytes:
    k, v = key.encode(), value.encode()
    return struct.pack("<Q", len(k)) + k + struct.pack("<IQ", 8, len(v)) + v


def _kv_u32(key: str, value: int) -> bytes:
    k = key.encode()
    return struct.pack("<Q", len(k)) + k + struct.pack("<II", 4, value)


def _kv_str_array(key: str, values: list[str]) -> bytes:
    k = key.encode()
    body = b"".join(struct.pack("<Q", len(v.encode())) + v.encode() for v in values)
    return struct.pack("<Q", len(k)) + k + struct.pack("<IIQ", 9, 8, len(values)) + body


def write_imatrix_gguf(path: str | Path, stats: ImatrixStats, datasets: list[str]) -> None:
    """Write ``stats`` in llama-imatrix's GGUF layout (what ``llmedge quantize --imatrix`` reads)."""
    kvs = [
        _kv_str("general.type", "imatrix"),
        _kv_str_array("imatrix.datasets", datasets),
        _kv_u32("imatrix.chunk_count", stats.n_chunks),
        _kv_u32("imatrix.chunk_size", stats.chunk_size),
    ]
    tensors: list[tuple[str, np.ndarray]] = []
    for name in sorted(stats.sums):
        tensors.append((name + ".in_sum2", stats.sums[name].astype(np.float32)))
        tensors.append((name + ".counts", np.array([stats.counts[name]], np.float32)))
    infos, offset = [], 0
    for name, data in tensors:
        b = name.encode()
        ne = (len(data), 1)
        infos.append(struct.pack("<Q", len(b)) + b + struct.pack("<I", 2) + struct.pack("<2Q", *ne))
        infos[-1] += struct.pack("<IQ", 0, offset)
        offset += (data.nbytes + 31) // 32 * 32
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs) + b"".join(infos)
    from llmedge.fsutil import atomic_write

    with atomic_write(Path(path)) as f:  # a killed run never leaves half a file
        f.write(head + b"\0" * (-len(head) % 32))
        for _, data in tensors:
            f.write(data.tobytes() + b"\0" * (-data.nbytes % 32))
