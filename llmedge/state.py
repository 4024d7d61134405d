"""Sequence state files: a sequence's tokens and KV cache written to disk and read back.

Layout (little-endian)::

    magic      8 bytes   b"LLMEKVST"
    version    u32       FORMAT_VERSION
    header_len u32
    header     JSON      model digest, architecture, KV type, token count, per-layer array shapes and
                         dtypes, payload size, caller's ``extra`` (e.g. chat messages)
    payload              tokens int32[n]; per layer: positions int32[m], K arrays, V arrays
    checksum   32 bytes  sha256 of everything before it

Reading checks, in order: magic, version, header, size (truncation), checksum (corruption), model
digest (another model), array geometry. Every failure is one line (:class:`LlmedgeError`); nothing
is loaded into a cache until the whole file has passed. The model digest is the ``sha256:`` of the
GGUF file: a store blob's name already is it, any other file is hashed once per process.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from llmedge.errors import LlmedgeError
from llmedge.fsutil import remove_stale_temps
from llmedge.kvcache import KV_TYPES, LayerState, SequenceState

MAGIC = b"LLMEKVST"
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<8sII")
_SUM = 32
_DTYPES = {"<i4": np.dtype("<i4"), "<f2": np.dtype("<f2"), "<f4": np.dtype("<f4"), "|i1": np.dtype("i1")}
_BLOB_RE = re.compile(r"sha256-([0-9a-f]{64})")
_DIGESTS: dict[tuple[str, int, int], str] = {}


def model_digest(path: str | os.PathLike[str]) -> str:
    """``sha256:<hex>`` of a GGUF file: from a store blob's name, else hashed (once per process)."""
    p = Path(path)
    m = _BLOB_RE.fullmatch(p.name)
    if m:
        return f"sha256:{m.group(1)}"
    try:
        st = p.stat()
    except OSError as e:
        raise LlmedgeError(f"cannot read {p}: {e.strerror or e}") from None
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _DIGESTS:
        from llmedge.store import digest_of

        _DIGESTS[key] = digest_of(p)
    return _DIGESTS[key]


def _dtype_name(a: np.ndarray) -> str:
    name = a.dtype.newbyteorder("<").str if a.dtype.byteorder == ">" else a.dtype.str
    name = {"=i4": "<i4", "=f2": "<f2", "=f4": "<f4"}.get(name, name)
    if name not in _DTYPES:
        raise LlmedgeError(f"cannot save a KV array of dtype {a.dtype}")
    return name


def write_state(path: str | os.PathLike[str], state: SequenceState, model_digest: str, architecture: str,
                extra: dict[str, Any] | None = None) -> int:
    """Write ``state`` to ``path`` atomically; returns the file size in bytes."""
    arrays: list[np.ndarray] = [np.asarray(state.tokens, dtype="<i4")]
    layers = []
    for ls in state.layers:
        group = [ls.pos.astype("<i4"), *ls.k, *ls.v]
        arrays.extend(group)
        layers.append({"n_k": len(ls.k), "n_v": len(ls.v),
                       "arrays": [[list(a.shape), _dtype_name(a)] for a in group]})
    header = {
        "format": "llmedge-kv-state",
        "model_digest": model_digest,
        "architecture": architecture,
        "kv_type": state.kv_type,
        "n_tokens": len(state.tokens),
        "layers": layers,
        "payload_bytes": sum(a.nbytes for a in arrays),
        "extra": extra or {},
    }
    try:
        head = json.dumps(header, separators=(",", ":")).encode("utf-8")
    except (TypeError, ValueError) as e:
        raise LlmedgeError(f"the state's extra data is not JSON-serializable: {e}") from None
    path = Path(path)
    h = hashlib.sha256()
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():  # else mkstemp's error names its temporary file, not the user's path
        raise LlmedgeError(f"cannot write state file {path}: no such folder {directory}")
    remove_stale_temps(directory, ".llmedge-state-")  # what a killed save left behind
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".llmedge-state-{os.getpid()}-", dir=directory)
    except OSError as e:  # e.g. a read-only folder
        raise LlmedgeError(f"cannot write state file {path}: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            for part in (_PREFIX.pack(MAGIC, FORMAT_VERSION, len(head)), head):
                f.write(part)
                h.update(part)
            for a in arrays:
                b = np.ascontiguousarray(a).tobytes()
                f.write(b)
                h.update(b)
            f.write(h.digest())
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise LlmedgeError(f"cannot write state file {path}: {e.strerror or e}") from None
    return path.stat().st_size


def read_state(path: str | os.PathLike[str], model_digest: str | None) -> tuple[SequenceState, dict[str, Any]]:
    """Read and verify a state file; ``model_digest`` None skips the model check (inspection only)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise LlmedgeError(f"cannot read state file {path}: {e.strerror or e}") from None
    if len(data) < _PREFIX.size or data[:8] != MAGIC:
        raise LlmedgeError(f"{path}: not an llmedge state file")
    _, version, head_len = _PREFIX.unpack_from(data)
    if version != FORMAT_VERSION:
        raise LlmedgeError(f"{path}: state file version {version} is not supported (this llmedge reads "
                           f"version {FORMAT_VERSION})")
    body = _PREFIX.size + head_len
    if len(data) < body + _SUM:
        raise LlmedgeError(f"{path}: truncated state file ({len(data)} bytes)")
    try:
        header = json.loads(data[_PREFIX.size : body].decode("utf-8"))
        payload = int(header["payload_bytes"])
    except (UnicodeDecodeError, ValueError, KeyError, TypeError):
        header, payload = None, -1
    if header is not None and len(data) < body + payload + _SUM:
        raise LlmedgeError(f"{path}: truncated state file ({len(data)} of {body + payload + _SUM} bytes)")
    if header is None or len(data) != body + payload + _SUM or \
            hashlib.sha256(memoryview(data)[: body + payload]).digest() != data[body + payload :]:
        raise LlmedgeError(f"{path}: corrupted state file (checksum mismatch)")
    theirs = header.get("model_digest")
    if model_digest is not None and theirs != model_digest:
        arch = header.get("architecture", "?")
        raise LlmedgeError(f"{path}: saved from another model ({arch}, {str(theirs)[:19]}...), not this one "
                           f"({model_digest[:19]}...)")
    try:
        state = _decode(header, memoryview(data)[body : body + payload])
    except (KeyError, TypeError, ValueError) as e:
        raise LlmedgeError(f"{path}: inconsistent state file ({e})") from None
    extra = header.get("extra") or {}
    return state, extra if isinstance(extra, dict) else {}


def _decode(header: dict[str, Any], payload: memoryview) -> SequenceState:
    kv_type = header["kv_type"]
    if kv_type not in KV_TYPES:
        raise ValueError(f"unknown KV type {kv_type!r}")
    at = 0

    def take(shape: list[int], dtype: str) -> np.ndarray:
        nonlocal at
        dt = _DTYPES[dtype]
        if not all(isinstance(d, int) and d >= 0 for d in shape):
            raise ValueError(f"bad array shape {shape}")
        n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        if at + n > len(payload):
            raise ValueError("arrays overrun the payload")
        a = np.frombuffer(payload, dtype=dt, count=n // dt.itemsize, offset=at).reshape(shape)
        at += n
        return a

    n_tokens = int(header["n_tokens"])
    tokens = take([n_tokens], "<i4")
    layers = []
    for lh in header["layers"]:
        n_k, n_v = int(lh["n_k"]), int(lh["n_v"])
        arrays = [take(shape, dt) for shape, dt in lh["arrays"]]
        if len(arrays) != 1 + n_k + n_v or arrays[0].ndim != 1:
            raise ValueError("bad layer layout")
        m = len(arrays[0])
        if any(len(a) != m for a in arrays[1:]):
            raise ValueError("layer arrays of different lengths")
        layers.append(LayerState(arrays[0].astype(np.int32), tuple(arrays[1 : 1 + n_k]),
                                 tuple(arrays[1 + n_k :])))
    if at != len(payload):
        raise ValueError("payload size does not match its arrays")
    return SequenceState([int(t) for t in tokens], kv_type, layers)
