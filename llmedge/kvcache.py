"""The KV cache: per sequence and layer, the keys and values attention reads.

A layer cache holds ``capacity`` cells of K and V in the cache type (``f16`` by default, ``f32``,
or ``q8_0``: blocks of 32 int8 values with one f16 scale, as ggml stores them) and the position of
each cell (-1 when empty). Full-attention layers have ``n_ctx`` cells and append; sliding-window
layers (``ring``) keep about ``window + max_batch`` cells (:func:`ring_capacity`), so their memory does
not grow with ``n_ctx``. Attention masks by the stored positions, so both share one attention op.

A sliding-window layer does not wrap around: its rows go in position order, and when the next rows
would pass its last cell, the cells they still read move to the front first (:meth:`LayerCache.make_room`),
to a cell index congruent to their position modulo ``CELL_ALIGN``. Attention walks cells by index and
llama.cpp keeps its sums in lanes of the cell index (up to 64 of them): llama-cpp-python's SWA cache
(``swa_full``, its default) puts position p in cell p, so these cells give the same sums, bit for bit,
in a window's worth of memory; a wrapping ring walked the window in another order and drifted.

Positions are token indices of the sequence (0 .. len(tokens) - 1): a context shift renumbers the
kept cells and re-rotates their keys by the position delta (RoPE is a rotation, so rotating by -d
moves a key d positions back), which keeps that invariant. Every operation that drops cells
(trim, shift, state load) leaves the kept cells sorted by position near the front of the buffer.

All layer buffers of a sequence are views into one arena (one allocation, its size is
``SequenceCache.nbytes``). A ``q8_0`` cache is dequantized to float32 before attention reads it,
into a scratch buffer shared by the layers of the sequence (the attention kernels read f16/f32).
"""

from __future__ import annotations

import contextlib
import mmap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from llmedge.errors import LlmedgeError

KV_TYPES = ("f16", "f32", "q8_0")
KV_DTYPES = {"f16": np.float16, "f32": np.float32}  # the float cache types and their NumPy dtypes
QK8_0 = 32  # values per q8_0 block
_ALIGN = 64
# a sliding-window layer keeps cell index = position (mod CELL_ALIGN): the attention kernels' lanes
# (V sums: 64 on AVX-512, 32 on AVX2; softmax chunks of 16) then see llama.cpp's linear layout
CELL_ALIGN = 64

Alloc = Callable[[tuple[int, ...], Any], np.ndarray]
RopeSpec = tuple  # n_rot, freq_base, freq_scale, neox[, freq_factors or None[, (ext_factor, corr_lo, corr_hi)]]


class RopeBackend(Protocol):
    def rope(self, x: np.ndarray, positions: np.ndarray, n_rot: int, freq_base: float,
             freq_scale: float, neox: bool) -> np.ndarray: ...


def check_kv_type(kv_type: str) -> str:
    """``kv_type`` if llmedge supports it, else a one-line error naming the supported ones."""
    if kv_type not in KV_TYPES:
        raise LlmedgeError(f"unsupported KV cache type '{kv_type}' (supported: {', '.join(KV_TYPES)})")
    return kv_type


def _kv_type_name(kv_type: str | np.dtype | type) -> str:
    if isinstance(kv_type, str):
        return check_kv_type(kv_type)
    dt = np.dtype(kv_type)
    for name, d in KV_DTYPES.items():
        if np.dtype(d) == dt:
            return name
    raise LlmedgeError(f"unsupported KV cache dtype {dt}")


# -- q8_0 --------------------------------------------------------------------------------------------
def quantize_q8_0(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 [..., d] -> (int8 quants [..., d], f16 scales [..., d/32]) as ggml's x86 CPU path writes
    them (d = amax/127 stored as f16, quants = round-half-even(x * 127/amax))."""
    shape = x.shape
    xb = np.asarray(x, dtype=np.float32).reshape(*shape[:-1], shape[-1] // QK8_0, QK8_0)
    amax = np.abs(xb).max(axis=-1)
    d = (amax / np.float32(127)).astype(np.float16)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(xb * inv[..., None]).astype(np.int8)
    return q.reshape(shape), d


def dequantize_q8_0(qs: np.ndarray, d: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """(int8 [..., n], f16 [..., n/32]) -> float32 [..., n]."""
    shape = qs.shape
    blocks = qs.reshape(*shape[:-1], shape[-1] // QK8_0, QK8_0)
    scale = d.astype(np.float32)[..., None]
    if out is None:
        return (blocks * scale).reshape(shape).astype(np.float32, copy=False)
    np.multiply(blocks, scale, out=out.reshape(blocks.shape))
    return out


# -- storage -----------------------------------------------------------------------------------------
class Arena:
    """One zeroed allocation carved into aligned views (pages are committed as they are written).

    The memory is an anonymous mapping with transparent huge pages declined: NumPy asks for huge pages
    on large arrays, and then the first write into each layer's cells (its positions set to -1 at
    creation, a token's K/V row) zeroes a whole 2 MB page, so a fresh 4096-cell SmolLM2 cache cost
    164 ms, most of a model load, instead of the few pages a short chat writes."""

    def __init__(self, nbytes: int) -> None:
        self.buffer = _anonymous_zeros(max(nbytes, 1))
        self.nbytes = nbytes
        self._used = 0

    @staticmethod
    def size(shape: tuple[int, ...], dtype: Any) -> int:
        n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        return (n + _ALIGN - 1) // _ALIGN * _ALIGN

    def alloc(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        dt = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        if self._used + n > self.nbytes:
            raise MemoryError("KV arena exhausted (planning error)")
        view = self.buffer[self._used : self._used + n].view(dt).reshape(shape)
        self._used += self.size(shape, dt)
        return view


def _anonymous_zeros(nbytes: int) -> np.ndarray:
    """``nbytes`` zero bytes from a private anonymous mapping (a read of an unwritten page maps the shared
    zero page; a shared mapping would commit it), small pages only where the OS allows the choice."""
    if not hasattr(mmap, "MAP_PRIVATE") or not hasattr(mmap, "MAP_ANONYMOUS"):
        return np.zeros(nbytes, dtype=np.uint8)
    try:
        mem = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (OSError, ValueError):
        return np.zeros(nbytes, dtype=np.uint8)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        with contextlib.suppress(OSError):
            mem.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(mem, dtype=np.uint8)


def _zeros(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    return np.zeros(shape, dtype=dtype)


class Scratch:
    """Float32 buffers a q8_0 cache dequantizes into before attention; shared by a sequence's layers."""

    def __init__(self) -> None:
        self.buffers: dict[str, np.ndarray] = {}

    def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        buf = self.buffers.get(name)
        n = int(np.prod(shape))
        if buf is None or buf.size < n:
            size = max(n, 2 * buf.size if buf is not None else 0)
            buf = self.buffers[name] = np.empty(size, dtype=np.float32)
        return buf[:n].reshape(shape)

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buffers.values())


class Cells:
    """K or V of one layer: ``capacity`` rows of [n_head, dim] values in the cache type."""

    def __init__(self, capacity: int, n_head: int, dim: int, kv_type: str, alloc: Alloc = _zeros) -> None:
        self.kv_type = kv_type
        self.shape = (capacity, n_head, dim)
        if kv_type == "q8_0":
            if dim % QK8_0:
                raise LlmedgeError(f"a q8_0 KV cache needs head sizes that are multiples of {QK8_0}, not {dim}")
            self.arrays: tuple[np.ndarray, ...] = (alloc(self.shape, np.int8),
                                                   alloc((capacity, n_head, dim // QK8_0), np.float16))
        else:
            self.arrays = (alloc(self.shape, KV_DTYPES[kv_type]),)

    @staticmethod
    def plan(capacity: int, n_head: int, dim: int, kv_type: str) -> list[tuple[tuple[int, ...], Any]]:
        if kv_type == "q8_0":
            return [((capacity, n_head, dim), np.int8), ((capacity, n_head, dim // QK8_0), np.float16)]
        return [((capacity, n_head, dim), KV_DTYPES[kv_type])]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays)

    def write(self, start: int, x: np.ndarray) -> None:
        """Store float32 rows ``x`` [n, n_head, dim] at cells start .. start+n."""
        end = start + len(x)
        if self.kv_type == "q8_0":
            qs, d = quantize_q8_0(x)
            self.arrays[0][start:end] = qs
            self.arrays[1][start:end] = d
        else:
            self.arrays[0][start:end] = x

    def fetch(self, n: int, scratch: Scratch | None, name: str) -> np.ndarray:
        """The first ``n`` cells as attention reads them (a view, or dequantized into ``scratch``)."""
        if self.kv_type != "q8_0":
            return self.arrays[0][:n]
        qs, d = self.arrays
        out = scratch.get(name, (n,) + self.shape[1:]) if scratch is not None else None
        return dequantize_q8_0(qs[:n], d[:n], out)

    def take(self, idx: np.ndarray | slice) -> tuple[np.ndarray, ...]:
        """Copies of the raw arrays at cells ``idx``."""
        return tuple(np.array(a[idx]) for a in self.arrays)

    def put(self, start: int, raw: tuple[np.ndarray, ...]) -> None:
        n = len(raw[0])
        for a, r in zip(self.arrays, raw):
            a[start : start + n] = r

    def to_f32(self, raw: tuple[np.ndarray, ...]) -> np.ndarray:
        return raw_to_f32(raw, self.kv_type)

    def from_f32(self, x: np.ndarray) -> tuple[np.ndarray, ...]:
        if self.kv_type == "q8_0":
            return quantize_q8_0(x)
        return (x.astype(KV_DTYPES[self.kv_type]),)


def raw_to_f32(raw: tuple[np.ndarray, ...], kv_type: str) -> np.ndarray:
    """Raw cell arrays of ``kv_type`` as float32."""
    if kv_type == "q8_0":
        return dequantize_q8_0(raw[0], raw[1])
    return raw[0].astype(np.float32)


# -- states ------------------------------------------------------------------------------------------
@dataclass
class LayerState:
    """The valid cells of one layer, sorted by position: positions and raw K/V arrays (copies)."""

    pos: np.ndarray  # int32 [m]
    k: tuple[np.ndarray, ...]
    v: tuple[np.ndarray, ...]

    @property
    def nbytes(self) -> int:
        return self.pos.nbytes + sum(a.nbytes for a in self.k + self.v)


@dataclass
class SequenceState:
    """A sequence's tokens and every layer's cells: what prefix reuse keeps and state files hold."""

    tokens: list[int]
    kv_type: str
    layers: list[LayerState]

    @property
    def nbytes(self) -> int:
        return sum(st.nbytes for st in self.layers) + 4 * len(self.tokens)


def ring_capacity(window: int, max_batch: int) -> int:
    """Cells of a sliding-window layer: the window, a batch and the slack that aligning cells to
    positions (mod CELL_ALIGN) needs, in whole CELL_ALIGN blocks. Windows shorter than CELL_ALIGN
    (no real model's; tests' small ones) keep window + max_batch cells, unaligned."""
    if window < CELL_ALIGN:
        return window + max_batch
    n = window + max_batch + CELL_ALIGN - 2
    return -(-n // CELL_ALIGN) * CELL_ALIGN


def _needed(n: int, window: int | None) -> tuple[int, int]:
    """Positions [lo, n) the query at position ``n`` (and every later one) may read."""
    return (0 if window is None else max(0, n - window + 1)), n


def _holds(pos: np.ndarray, lo: int, hi: int) -> bool:
    """Whether the valid positions ``pos`` include every position in [lo, hi)."""
    if hi <= lo:
        return True
    inside = pos[(pos >= lo) & (pos < hi)]
    return len(np.unique(inside)) == hi - lo


# -- one layer ---------------------------------------------------------------------------------------
class LayerCache:
    """K/V cells of one layer of one sequence.

    ``window`` is the layer's attention window (None: global attention); ``ring`` means the buffer
    holds only the cells the window still needs (sliding-window layers when :func:`ring_capacity`
    is below ``n_ctx``): :meth:`make_room` moves them to the front when the next rows would not fit. ``rope`` (n_rot, base, scale, neox) is how the layer rotates keys;
    the model sets it, and a context shift uses it to re-rotate the kept keys.
    """

    def __init__(self, capacity: int, n_kv_head: int, head_dim_k: int, head_dim_v: int,
                 kv_type: str | np.dtype | type = "f16", window: int | None = None, ring: bool | None = None,
                 alloc: Alloc = _zeros, scratch: Scratch | None = None) -> None:
        self.kv_type = _kv_type_name(kv_type)
        self.capacity = capacity
        self.window = window
        self.ring = bool(window is not None if ring is None else ring)
        if self.ring and (window is None or capacity < window):
            raise ValueError(f"a sliding-window ring needs at least window={window} cells, not {capacity}")
        self.n_kv_head, self.head_dim_k, self.head_dim_v = n_kv_head, head_dim_k, head_dim_v
        self.k = Cells(capacity, n_kv_head, head_dim_k, self.kv_type, alloc)
        self.v = Cells(capacity, n_kv_head, head_dim_v, self.kv_type, alloc)
        self.pos = alloc((capacity,), np.int32)
        self.pos[:] = -1
        self.scratch = scratch
        self.rope: RopeSpec | None = None
        # (used, head) in one array, so that a native stack can claim cells without Python per layer:
        # cells [0, used) may hold data (all of them once a ring wrapped), head is the cell written next
        self.cursor = np.zeros(2, dtype=np.int64)

    @property
    def used(self) -> int:
        return int(self.cursor[0])

    @used.setter
    def used(self, n: int) -> None:
        self.cursor[0] = n

    @property
    def head(self) -> int:
        return int(self.cursor[1])

    @head.setter
    def head(self, n: int) -> None:
        self.cursor[1] = n

    @staticmethod
    def plan(capacity: int, n_kv_head: int, head_dim_k: int, head_dim_v: int, kv_type: str
             ) -> list[tuple[tuple[int, ...], Any]]:
        """The arrays a layer allocates (shape, dtype), for arena sizing."""
        return (Cells.plan(capacity, n_kv_head, head_dim_k, kv_type)
                + Cells.plan(capacity, n_kv_head, head_dim_v, kv_type) + [((capacity,), np.int32)])

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes + self.pos.nbytes

    @property
    def offset(self) -> int:
        """The next position: one past the highest position held (0 when empty)."""
        return int(self.pos[: self.used].max()) + 1 if self.used else 0

    def valid_positions(self) -> np.ndarray:
        p = self.pos[: self.used]
        return p[p >= 0]

    # -- the hot path ------------------------------------------------------------------------------
    def room_error(self, n: int) -> str | None:
        """Why ``n`` more rows do not fit (:meth:`reserve` refuses them), or None. The native stack
        claims cells by the same rules in C (native/layer.c kv_reserve)."""
        if not self.ring:
            if self.used + n > self.capacity:
                return f"KV cache full: {self.used} + {n} tokens > {self.capacity} cells"
        elif self.window is not None and n > self.capacity - self.window + 1:
            return f"batch of {n} rows exceeds the sliding-window ring of {self.capacity}"
        return None

    def reserve(self, positions: np.ndarray) -> tuple[int, int, int]:
        """Claim cells for ``positions`` (n rows) and record their positions, without writing K/V.

        Returns (start, first, used): rows [0, first) go to cells start.., rows [first, n) to cells
        0.. (a ring wrapping around, which :meth:`make_room` avoids), and attention then reads cells
        [0, used)."""
        n = len(positions)
        why = self.room_error(n)
        if why:
            raise ValueError(why)
        if self.ring and n:
            self.make_room(n, int(positions[0]))
        if not self.ring:
            start = self.used
            self.pos[start : start + n] = positions
            self.used = self.head = start + n
            return start, n, self.used
        start = self.head
        first = min(n, self.capacity - start)
        self.pos[start : start + first] = positions[:first]
        if first < n:
            self.pos[: n - first] = positions[first:]
            self.used = self.capacity
        else:
            self.used = max(self.used, start + n)
        self.head = (start + n) % self.capacity
        return start, first, self.used

    def update_and_fetch(self, k: np.ndarray, v: np.ndarray, positions: np.ndarray
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Store k, v [n, n_kv_head, d] (float32) at ``positions``; return the K, V and positions
        attention reads (the first ``used`` cells: views for f16/f32, dequantized copies for q8_0)."""
        start, first, u = self.reserve(positions)
        self.k.write(start, k[:first])
        self.v.write(start, v[:first])
        if first < len(positions):
            self.k.write(0, k[first:])
            self.v.write(0, v[first:])
        return self.k.fetch(u, self.scratch, "k"), self.v.fetch(u, self.scratch, "v"), self.pos[:u]

    def make_room(self, n: int, first: int) -> None:
        """Before a ring takes ``n`` rows from position ``first``: when they would pass its last cell,
        keep the cells they read (positions > first - window) plus half the spare room of history
        (what a later trim may need) and move them to the front, at the cell index congruent to their
        position mod CELL_ALIGN (the rows then follow in order). The native stack claims cells in C
        and never moves them: the model calls this first."""
        end = self.head or (self.capacity if self.used else 0)
        if not self.ring or end + n <= self.capacity or self.room_error(n):
            return  # (rows that do not fit are refused by reserve, with nothing dropped)
        history = max(0, self.capacity - self.window - (CELL_ALIGN - 1) - n) // 2
        p = self.pos[: self.used]
        keep = np.flatnonzero((p >= 0) & (p > first - self.window - history))
        keep = keep[np.argsort(p[keep], kind="stable")]
        self._compact(keep, at=self._aligned(int(p[keep[0]]) if len(keep) else first, len(keep) + n))

    def _aligned(self, first_pos: int, m: int) -> int:
        """The cell where a ring's kept run (``m`` cells from ``first_pos``) starts: congruent to the
        position mod CELL_ALIGN when that leaves room, else 0 (a small ring: correct, not aligned)."""
        if not self.ring:
            return 0
        at = first_pos % CELL_ALIGN
        return at if at + m <= self.capacity else 0

    # -- dropping cells ----------------------------------------------------------------------------
    def holds(self, positions_lo: int, positions_hi: int) -> bool:
        return _holds(self.valid_positions(), positions_lo, positions_hi)

    def can_trim_to(self, n: int) -> bool:
        """Whether keeping positions < n leaves everything the query at position ``n`` reads."""
        return self.holds(*_needed(n, self.window))

    def trim_to(self, n: int) -> None:
        """Forget every cell at position >= n."""
        p = self.pos[: self.used]
        if not self.ring and (self.used < 2 or bool(np.all(p[1:] > p[:-1]))):
            m = int(np.searchsorted(p, n))
            self.pos[m : self.used] = -1
            self.used = self.head = m
            return
        keep = np.flatnonzero((p >= 0) & (p < n))
        keep = keep[np.argsort(p[keep], kind="stable")]
        self._compact(keep, at=self._aligned(int(p[keep[0]]) if len(keep) else 0, len(keep)))

    def rollback(self, n: int) -> None:
        """Forget the ``n`` cells written last (the newest positions, e.g. rejected speculative rows).

        Unlike :meth:`trim_to` a ring is rewound in place (its head moves back, no cell moves), so the
        cells keep the order decoding one token at a time would have left: attention sums them in
        the same order. The cells those rows overwrote held positions outside the window."""
        if n <= 0:
            return
        if not self.ring:
            self.pos[self.used - n : self.used] = -1
            self.used = self.head = self.used - n
            return
        cells = (self.head - 1 - np.arange(n)) % self.capacity
        self.pos[cells] = -1
        self.head = (self.head - n) % self.capacity
        self.used = self.capacity if bool((self.pos[self.head :] >= 0).any()) else self.head

    def _compact(self, order: np.ndarray, new_pos: np.ndarray | None = None,
                 k_raw: tuple[np.ndarray, ...] | None = None, at: int = 0) -> None:
        """Keep cells ``order`` (in that order) from cell ``at``; optionally with new positions / keys."""
        m = len(order)
        k = k_raw if k_raw is not None else self.k.take(order)
        v = self.v.take(order)
        pos = new_pos if new_pos is not None else self.pos[order].copy()
        self.pos[:] = -1
        self.k.put(at, k)
        self.v.put(at, v)
        self.pos[at : at + m] = pos
        self.used = at + m
        self.head = (at + m) % self.capacity

    def clear(self) -> None:
        self.pos[: self.used] = -1
        self.used = self.head = 0

    def shift(self, n_keep: int, n_discard: int, backend: RopeBackend) -> None:
        """Drop positions [n_keep, n_keep + n_discard), move later cells back by ``n_discard`` and
        rotate their keys by -n_discard."""
        p = self.pos[: self.used]
        valid = np.flatnonzero(p >= 0)
        order = valid[np.argsort(p[valid], kind="stable")]
        ps = p[order]
        keep = order[ps < n_keep]
        moved = order[ps >= n_keep + n_discard]
        if len(moved) and self.rope is None:
            raise LlmedgeError("cannot shift a KV cache layer whose RoPE parameters are unknown")
        k_keep, k_moved = self.k.take(keep), self.k.take(moved)
        if len(moved):
            n_rot, base, scale, neox, *extra = self.rope
            kf = self.k.to_f32(k_moved)
            delta = np.full(len(moved), -n_discard, dtype=np.int32)
            # frequency factors (Llama 3, LongRoPE) and YaRN's ramp: a pure rotation by the same angles.
            # (llama.cpp's K-shift also multiplies by attn_factor / YaRN's mscale again; keys already
            # carry it once.)
            kw: dict[str, Any] = {}
            if extra and extra[0] is not None:
                kw["freq_factors"] = extra[0]
            if len(extra) > 1 and extra[1] is not None:
                kw["ext_factor"], kw["corr_dims"] = extra[1][0], (extra[1][1], extra[1][2])
            kf = backend.rope(np.ascontiguousarray(kf), delta, n_rot, base, scale, neox, **kw)
            k_moved = self.k.from_f32(np.asarray(kf, dtype=np.float32))
        new_pos = np.concatenate([p[keep], p[moved] - n_discard]).astype(np.int32)
        k_raw = tuple(np.concatenate([a, b]) for a, b in zip(k_keep, k_moved))
        at = self._aligned(int(new_pos[0]) if len(new_pos) else 0, len(new_pos))
        self._compact(np.concatenate([keep, moved]), new_pos, k_raw, at)

    # -- state -------------------------------------------------------------------------------------
    def state(self) -> LayerState:
        """Copies of the valid cells, sorted by position."""
        p = self.pos[: self.used]
        valid = np.flatnonzero(p >= 0)
        order = valid[np.argsort(p[valid], kind="stable")]
        if len(order) and np.array_equal(order, np.arange(order[0], order[0] + len(order))):
            order = slice(int(order[0]), int(order[0]) + len(order))  # in order: copy contiguous rows
        return LayerState(np.array(p[order], dtype=np.int32), self.k.take(order), self.v.take(order))

    def check_state(self, st: LayerState, kv_type: str, n_tokens: int) -> str | None:
        """Why ``st`` (of ``kv_type``) cannot be loaded into this layer, or None."""
        m = len(st.pos)
        for raw, cells in ((st.k, self.k), (st.v, self.v)):
            want = Cells.plan(m, cells.shape[1], cells.shape[2], kv_type)
            if len(raw) != len(want) or any(a.shape != shape or a.dtype != np.dtype(dt)
                                            for a, (shape, dt) in zip(raw, want)):
                got = ", ".join(f"{a.dtype}{list(a.shape)}" for a in raw)
                return f"its {kv_type} K/V arrays ({got}) do not match this model's heads {cells.shape[1:]}"
        if m > self.capacity and not self.ring:
            return f"it holds {m} cells, more than this context's {self.capacity}"
        pos = st.pos[-self.capacity:] if m > self.capacity else st.pos
        if len(pos) and (int(pos.min()) < 0 or int(pos.max()) >= n_tokens or np.any(pos[1:] <= pos[:-1])):
            return "its cell positions are inconsistent"
        if not _holds(pos, *_needed(n_tokens, self.window)):
            return "it lacks cells this layer needs to continue"
        return None

    def load_state(self, st: LayerState, kv_type: str | None = None) -> None:
        """Replace the contents by ``st`` (check it first with :meth:`check_state`)."""
        kv_type = kv_type or self.kv_type
        m = len(st.pos)
        cut = max(0, m - self.capacity)
        k, v = tuple(a[cut:] for a in st.k), tuple(a[cut:] for a in st.v)
        if kv_type != self.kv_type:
            k, v = self.k.from_f32(raw_to_f32(k, kv_type)), self.v.from_f32(raw_to_f32(v, kv_type))
        at = self._aligned(int(st.pos[cut]) if m > cut else 0, m - cut)
        self.pos[:] = -1
        self.k.put(at, k)
        self.v.put(at, v)
        self.pos[at : at + m - cut] = st.pos[cut:]
        self.used = at + m - cut
        self.head = self.used % self.capacity


# -- one sequence ------------------------------------------------------------------------------------
@dataclass
class SequenceCache:
    """All layer caches of one sequence plus the token ids they hold (position i holds tokens[i])."""

    layers: list[LayerCache]
    tokens: list[int] = field(default_factory=list)
    arena: Arena | None = None
    scratch: Scratch | None = None

    @property
    def offset(self) -> int:
        return len(self.tokens)

    @property
    def kv_type(self) -> str:
        return self.layers[0].kv_type if self.layers else "f16"

    @property
    def nbytes(self) -> int:
        """Bytes of K/V cells (and their positions) allocated for this sequence."""
        return self.arena.nbytes if self.arena is not None else sum(layer.nbytes for layer in self.layers)

    @property
    def scratch_bytes(self) -> int:
        return self.scratch.nbytes if self.scratch is not None else 0

    def can_trim_to(self, n: int) -> bool:
        return n <= self.offset and all(layer.can_trim_to(n) for layer in self.layers)

    def trim(self, n: int) -> int:
        """Drop the last ``n`` tokens (mlx-lm's ``trim``); returns how many were dropped (all of them,
        clearing the cache, when a ring no longer holds what the remaining ones need)."""
        before = self.offset
        self.trim_to(max(0, before - n))
        return before - self.offset

    def trim_to(self, n: int) -> bool:
        """Keep the first ``n`` tokens; return False (and clear) when a ring lost what they need."""
        if n >= self.offset:
            return True
        if self.can_trim_to(n):
            for layer in self.layers:
                layer.trim_to(n)
            del self.tokens[n:]
            return True
        self.clear()
        return False

    def rollback(self, n: int) -> None:
        """Drop the last ``n`` tokens, which the last forward wrote (rejected speculative rows): every
        layer rewinds its newest cells in place (see :meth:`LayerCache.rollback`)."""
        n = max(0, min(n, self.offset))
        if n == 0:
            return
        for layer in self.layers:
            layer.rollback(n)
        del self.tokens[len(self.tokens) - n :]

    def clear(self) -> None:
        for layer in self.layers:
            layer.clear()
        self.tokens.clear()

    def make_room(self, n: int, first: int) -> None:
        """Before ``n`` rows from position ``first``: every ring makes room for them in order
        (:meth:`LayerCache.make_room`); a step calls it before any backend claims cells."""
        for layer in self.layers:
            if layer.ring:
                layer.make_room(n, first)

    # -- context shift -----------------------------------------------------------------------------
    def can_shift(self, n_keep: int, n_discard: int) -> bool:
        """Whether every layer still holds what the next query reads after the shift."""
        n_new = self.offset - n_discard
        for layer in self.layers:
            lo, hi = _needed(n_new, layer.window)
            if hi <= lo:
                continue
            new = np.arange(lo, hi)
            old = np.where(new < n_keep, new, new + n_discard)
            if not np.all(np.isin(old, layer.valid_positions())):
                return False
            if layer.rope is None and np.any(layer.valid_positions() >= n_keep + n_discard):
                return False
        return True

    def shift(self, n_keep: int, n_discard: int, backend: RopeBackend) -> bool:
        """Context shift: keep the first ``n_keep`` tokens, drop the next ``n_discard``, move the rest
        back and re-rotate their keys. False (nothing changed) when a layer cannot be shifted in place
        (a ring already lost cells that would come back into its window); the caller re-evaluates."""
        if not 0 <= n_keep or n_discard <= 0 or n_keep + n_discard > self.offset:
            raise ValueError(f"bad context shift: keep {n_keep}, discard {n_discard} of {self.offset} tokens")
        if not self.can_shift(n_keep, n_discard):
            return False
        for layer in self.layers:
            layer.shift(n_keep, n_discard, backend)
        del self.tokens[n_keep : n_keep + n_discard]
        return True

    # -- state -------------------------------------------------------------------------------------
    def state(self) -> SequenceState:
        """A copy of the tokens and of every layer's valid cells."""
        return SequenceState(list(self.tokens), self.kv_type, [layer.state() for layer in self.layers])

    def check_state(self, st: SequenceState) -> str | None:
        """Why ``st`` cannot be loaded into this cache, or None."""
        if len(st.layers) != len(self.layers):
            return f"it has {len(st.layers)} layers, this model has {len(self.layers)}"
        if st.kv_type not in KV_TYPES:
            return f"its KV type '{st.kv_type}' is unknown"
        for i, (layer, ls) in enumerate(zip(self.layers, st.layers)):
            why = layer.check_state(ls, st.kv_type, len(st.tokens))
            if why:
                return f"layer {i}: {why}"
        return None

    def can_resume(self, st: SequenceState, n: int) -> bool:
        """Whether ``st`` cut to its first ``n`` tokens holds what every layer of this cache needs."""
        return len(st.layers) == len(self.layers) and all(
            _holds(ls.pos, *_needed(n, layer.window)) for ls, layer in zip(st.layers, self.layers))

    def load_state(self, st: SequenceState) -> None:
        """Replace the contents by ``st``; raises LlmedgeError (leaving this cache as it was) when
        ``st`` does not fit."""
        why = self.check_state(st)
        if why:
            raise LlmedgeError(f"the saved KV state does not fit this model: {why}")
        for layer, ls in zip(self.layers, st.layers):
            layer.load_state(ls, st.kv_type)
        self.tokens[:] = [int(t) for t in st.tokens]


def plan_sequence_cache(specs: Sequence[tuple[int, int, int, int, str]]) -> int:
    """Arena bytes for layers given as (capacity, n_kv_head, head_dim_k, head_dim_v, kv_type)."""
    return sum(Arena.size(shape, dt) for s in specs for shape, dt in LayerCache.plan(*s))


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x = np.asarray(a[:n], dtype=np.int64)
    y = np.asarray(b[:n], dtype=np.int64)
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if len(diff) else n
