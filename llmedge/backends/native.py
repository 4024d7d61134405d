"""The native backend: llmedge's C SIMD kernels (``llmedge._native``, built by cffi at install time).

Weights stay in their GGUF blocks (zero copy from the memory map); activations are quantized on
the fly to each weight type's partner format (Q8_0, Q8_1, Q8_K, F16, BF16) and multiplied with
integer dot products, as llama.cpp does. On x86 with AVX2 the products, norms, RoPE, GLUs, softmax
and attention reproduce llama.cpp's CPU results bit for bit: same activation rounding, the same
summation order in each of llama.cpp's code paths (ggml's vec_dot, llamafile's tinyBLAS, the tiled
K-quant GEMM for 8+ rows, the repacked Q4_K GEMV/GEMM) and the same fused multiply-adds; see
tests/test_native_kernels.py. Not yet reproduced: llama.cpp's repacked Q4_0 and IQ4_NL kernels.
Where the selected tier has packed kernels for a type (AVX-512: Q4_K, Q6_K, Q4_1 and Q8_0; AVX2: Q4_1 and Q8_0; 16 rows interleaved), each
weight gets a packed copy in C at load (``NativeWeight._pack``), with the same results.

The C library holds one process-wide thread pool and one kernel table chosen from CPUID
(``LLMEDGE_ISA=scalar|avx2|avx512|neon`` forces a tier and hides the ones above it); every ``NativeBackend`` shares them,
and the last one created sets the thread count. Every op accepts an optional ``out=`` buffer so
callers can avoid per-token allocations. The prefetch hint of the weight streams follows the bytes of
the weights alive in the process (:func:`keep_weights_cached`, ``LLMEDGE_WEIGHT_PREFETCH``).
"""

from __future__ import annotations

import os
import weakref
from typing import Any, ClassVar

import numpy as np

from llmedge.backends.base import (
    GluKind,
    check_attention,
    check_matmul,
    check_norm_weight,
    check_rope,
    check_row_ids,
    check_same_shape,
    unencoded_feature,
)
from llmedge.backends.base import as_f32c as _f32c
from llmedge.backends.base import out_array as _out
from llmedge.backends.cpu import physical_cores, shared_cache_bytes
from llmedge.errors import LlmedgeError
from llmedge.gguf import TensorInfo, prepare_release, release_resident_pages
from llmedge.models.base import cache_rope

try:
    from llmedge._native import ffi, lib

    _IMPORT_ERROR: str | None = None
except ImportError as e:  # the C build failed or was skipped at install time
    ffi = lib = None
    _IMPORT_ERROR = f"llmedge._native is not built ({e})"

ISA_NAMES = ("scalar", "avx2", "avx512", "neon")
ROUNDING = ("ref", "x86", "arm")
_GLU_KINDS = {"silu": 0, "gelu": 1}
_F32, _F16 = np.dtype(np.float32), np.dtype(np.float16)


if ffi is not None:
    _FLOATS = ffi.typeof("float[]")
    _INTS = ffi.typeof("int[]")
    _BYTES = ffi.typeof("uint8_t[]")
    _from_buffer = ffi.from_buffer


def _fptr(a: np.ndarray) -> Any:
    return _from_buffer(_FLOATS, a)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise LlmedgeError(f"native {what} failed (code {rc})")


def forced_isa_refusal() -> str | None:
    """Why ``LLMEDGE_ISA`` cannot be honoured here (a name that is no tier, or a tier this CPU cannot
    run, such as avx512 on an AVX2-only CPU), or None. The C library would otherwise ignore it and run
    the best tier, so a run asked for one tier would silently measure or test another."""
    want = os.environ.get("LLMEDGE_ISA", "").strip().lower()
    if not want:
        return None
    have = ", ".join(NativeBackend.available_isas())
    if want not in ISA_NAMES:
        return f"LLMEDGE_ISA={want} is not a kernel tier (choose from {', '.join(ISA_NAMES)}; this CPU runs {have})"
    if not lib.lle_isa_available(ISA_NAMES.index(want)):
        return f"LLMEDGE_ISA={want}: this CPU cannot run the {want} kernels (it runs {have})"
    return None


# ---------------------------------------------------------------------- weight prefetch hint

WEIGHT_PREFETCH_ENV = "LLMEDGE_WEIGHT_PREFETCH"
_CPU_AMD = 1 << 13  # LLE_CPU_AMD (native/common.h)
_live_weight_bytes = 0  # bytes of the distinct weights alive
_weight_users: dict[int, int] = {}  # weight bytes' address: how many NativeWeights use them


def keep_weights_cached(weight_bytes: int) -> bool:
    """Whether the kernels' prefetches ahead of a weight stream should keep the lines in the caches
    (T0) rather than stream them past (NTA), for ``weight_bytes`` of weights alive in the process.

    ``LLMEDGE_WEIGHT_PREFETCH=keep|stream`` forces one; by default (``auto``) llmedge keeps them,
    except on AMD CPUs when the weights exceed half the last-level cache. Measured:
    - Intel Xeon (AVX-512, 300 MB of L3). NTA lines are not kept in the L3, so a step read every
      weight from memory again: SmolLM2's decode went from 8.4 to 3.3-6.4 ms per token with T0.
      Even for 421 MB of Q4_1 weights, more than the L3, T0 was faster: 31 vs 38 us per 1536x576
      product, and 42 vs 62 us for 4 rows.
    - AMD Zen 4 (32 MB of L3). The ~100 MB a step reads evicted the K/V cache and activations with
      T0: a 1-sequence step took 4.33-4.65 ms, against 3.93-4.39 with NTA.
    - AMD Zen 5 (32 MB of L3 per CCD). SmolLM2, in-process, 30 rounds of each hint alternated, both
      orders: the 4-sequence step 2818 and 3038 us with NTA against 2879 and 3089 with T0, the
      1-sequence step the same (2189 and 2362 against 2197 and 2329 us).

    The cache is the one a core shares (:func:`shared_cache_bytes`), not the package's total.
    """
    mode = os.environ.get(WEIGHT_PREFETCH_ENV, "").strip().lower() or "auto"
    if mode not in ("auto", "keep", "stream"):
        raise LlmedgeError(f"{WEIGHT_PREFETCH_ENV}={mode} is not a prefetch mode (choose from auto, keep, stream)")
    if mode != "auto":
        return mode == "keep"
    if not lib.lle_cpu_features() & _CPU_AMD:
        return True
    return 2 * weight_bytes <= last_level_cache_bytes()


def last_level_cache_bytes() -> int:
    """The last-level cache a core shares, in bytes: sysfs's where Linux has it, else the C library's
    (``lle_llc_bytes``); 0 when neither knows."""
    return shared_cache_bytes() or int(lib.lle_llc_bytes())


KV_PREFETCH_ENV = "LLMEDGE_KV_PREFETCH"
_ZEN5_FAMILY = 0x1A  # AMD's CPUID family of Zen 5


def kv_prefetch_wanted() -> bool:
    """Whether a decode step's matrix products prefetch the next layer's K/V cells (native/layer.c).

    ``LLMEDGE_KV_PREFETCH=on|off`` forces it; by default (``auto``) it is on, except on AMD CPUs of
    Zen 5's family (1Ah) and later. Measured (in-process A/B, steps alternated):
    - AMD Zen 4 EPYC (32 MB of L3; commit 4246656): 4 SmolLM2 sequences 6.11-6.59 ms per step with it
      against 6.28-6.90 without, one sequence 4.42-4.46 against 4.49-4.57.
    - AMD Zen 5 EPYC (32 MB of L3; SmolLM2, medians of 128 steps): without it, one sequence 2.154 ->
      2.119 ms at 100 cells, 2.320 -> 2.220 at 300, 2.567 -> 2.487 at 600, 3.692 -> 3.639 at 1000;
      4 sequences 3.251 -> 3.162 at 100, 3.787 -> 3.712 at 300, 4.783 -> 4.761 at 600, even at 1000;
      Gemma 3, 4 sequences at 300 cells 9.95 -> 9.76. Prefetching into L2 (T1/T2 hints) or a quarter
      of the lines measured in between.
    """
    mode = os.environ.get(KV_PREFETCH_ENV, "").strip().lower() or "auto"
    if mode not in ("auto", "on", "off"):
        raise LlmedgeError(f"{KV_PREFETCH_ENV}={mode} is not a K/V prefetch mode (choose from auto, on, off)")
    if mode != "auto":
        return mode == "on"
    return not (lib.lle_cpu_features() & _CPU_AMD and lib.lle_cpu_family() >= _ZEN5_FAMILY)


def core_round_trip_ns(rounds: int = 2000) -> float | None:
    """The round trip of a cache line between two threads of the native pool, in nanoseconds (the median
    of 9 batches of ``rounds``), or None without the native library, with one thread, or when no worker
    joined in time.

    Every phase of a decode step of several sequences ends in such hand-offs (a phase's results, read by
    the other thread), so this is the machine state that decides how well batching scales. Where the two
    cores share a cache it is tens of nanoseconds; where the line crosses between caches, several times
    that. Measured on the 2-vCPU AMD EPYC (Zen 5) VM llmedge is developed on, which moves between both
    states every few minutes: 34-60 ns while its vCPUs shared a CCD, 354-366 while they sat on different
    CCDs, when 4 SmolLM2 sequences' aggregate rate over one sequence's went from about 3.2x to 2.6-2.9x
    (``benchmarks/server_concurrency.py``, which prints this probe with every round)."""
    if not NativeBackend.available():
        return None
    ns = float(lib.lle_core_round_trip_ns(int(rounds)))
    return ns if ns > 0 else None


def _weights_changed(address: int, nbytes: int, delta: int) -> None:
    """Count one more (``delta`` 1) or one fewer (-1) weight over the ``nbytes`` at ``address`` (a tied
    output head and the embeddings are one tensor, counted once), and set the prefetch hint for the
    new total."""
    global _live_weight_bytes
    users = _weight_users.get(address, 0) + delta
    if users > 0:
        _weight_users[address] = users
    else:
        _weight_users.pop(address, None)
    if users == (1 if delta > 0 else 0):
        _live_weight_bytes += delta * nbytes
        if lib is not None:
            lib.lle_set_weight_prefetch(int(keep_weights_cached(_live_weight_bytes)))


def weight_prefetch() -> str:
    """The weight streams' prefetch hint in use: "keep" (T0) or "stream" (NTA)."""
    return "keep" if lib.lle_weight_prefetch() else "stream"


class NativeWeight:
    """A 2-D weight: the raw GGUF rows (a view into the model's memory map) and their geometry.

    Types without a native kernel keep a float32 copy and are multiplied with NumPy instead.
    """

    __slots__ = ("name", "ggml_type", "m", "k", "row_bytes", "data", "ptr", "shape", "fallback", "packed",
                 "__weakref__")

    def __init__(self, tensor: TensorInfo) -> None:
        self.name = tensor.name
        self.ggml_type = int(tensor.ggml_type)
        self.k = int(tensor.dims[0])
        self.m = tensor.n_elements // self.k if self.k else 0
        self.shape = (self.m, self.k)
        self.fallback: np.ndarray | None = None
        self.data = tensor.data
        if not self.data.flags.c_contiguous:
            self.data = np.ascontiguousarray(self.data)
        self.row_bytes = int(lib.lle_row_size(self.ggml_type, self.k)) if lib.lle_type_supported(self.ggml_type) else -1
        if self.row_bytes <= 0 or self.row_bytes * self.m != self.data.size:
            from llmedge.quant import dequantize

            self.fallback = dequantize(self.data, self.ggml_type, self.shape)
            self.ptr = None
        else:
            self.ptr = ffi.from_buffer(_BYTES, self.data)
        self.packed = False
        if self.ptr is not None and self.m > 0:
            self._pack()
            address = self.data.ctypes.data
            _weights_changed(address, self.data.nbytes, 1)
            weakref.finalize(self, _weights_changed, address, self.data.nbytes, -1)

    def _pack(self) -> None:
        """A packed copy in C for the selected kernel tier where it has packed kernels (AVX-512:
        Q4_K, Q6_K, Q4_1, Q8_0; AVX2: Q4_1, Q8_0), found by address at every product and freed with this object; results
        unchanged. Where the copy serves every product, the file's pages under the weight leave the resident set as they
        are copied, so a packed model costs no more memory than an unpacked one; where it serves only the products of 8+
        rows (AVX-512's Q6_K: a decode reads the file), they stay, and the copy is the price of faster prompts."""
        rc = lib.lle_pack_weight(self.ggml_type, self.ptr, self.row_bytes, self.m, self.k, prepare_release(self.data))
        if rc < 0:
            raise LlmedgeError(f"native: packing {self.name} failed (code {rc})")
        if rc in (1, 2):  # 2: the copy serves the products of 8+ rows only; decoding still reads the file
            self.packed = True
            if rc == 1:
                release_resident_pages(self.data)
            # the finalizer keeps the mapped bytes alive until the copy is gone
            weakref.finalize(self, lib.lle_unpack_weight, self.ptr)

    def __repr__(self) -> str:
        return f"NativeWeight({self.name!r}, type={self.ggml_type}, shape={self.shape})"


class NativeBackend:
    """:class:`llmedge.backends.base.Backend` on the C kernels."""

    name = "native"
    unavailable_reason: ClassVar[str] = _IMPORT_ERROR or ""

    def __init__(self, n_threads: int | None = None) -> None:
        if not self.available():
            raise LlmedgeError(f"the native backend is unavailable: {self.unavailable_reason}")
        refusal = forced_isa_refusal()
        if refusal:
            raise LlmedgeError(refusal)
        keep_weights_cached(_live_weight_bytes)  # a bad LLMEDGE_WEIGHT_PREFETCH fails here, before any load
        lib.lle_set_kv_prefetch(int(kv_prefetch_wanted()))  # and a bad LLMEDGE_KV_PREFETCH
        self.n_threads = int(n_threads) if n_threads else physical_cores()
        if self.n_threads < 1:
            raise ValueError("n_threads must be at least 1")
        self.n_threads = int(lib.lle_init(self.n_threads))

    # ------------------------------------------------------------------ library state

    @classmethod
    def available(cls) -> bool:
        """True when ``llmedge._native`` was built and loads on this CPU."""
        if lib is None:
            cls.unavailable_reason = _IMPORT_ERROR or "llmedge._native is not built"
            return False
        try:
            lib.lle_isa()
        except Exception as e:  # pragma: no cover - a broken build
            cls.unavailable_reason = f"llmedge._native failed to initialise ({e})"
            return False
        return True

    @property
    def isa(self) -> str:
        """The instruction set whose kernels are in use: scalar, avx2, avx512 or neon."""
        return ISA_NAMES[lib.lle_isa()]

    @staticmethod
    def available_isas() -> list[str]:
        return [name for i, name in enumerate(ISA_NAMES) if lib.lle_isa_available(i)]

    @staticmethod
    def set_isa(isa: str) -> str:
        """Switch every kernel to ``isa`` (process-wide); raises if this CPU cannot run it."""
        if isa not in ISA_NAMES or lib.lle_set_isa(ISA_NAMES.index(isa)) < 0:
            raise LlmedgeError(f"ISA {isa!r} is not available here (have: {', '.join(NativeBackend.available_isas())})")
        return isa

    @staticmethod
    def kernel_isa(ggml_type: int) -> str | None:
        """The ISA of the dot-product kernel selected for a weight type (None if unsupported)."""
        i = lib.lle_kernel_isa(int(ggml_type))
        return ISA_NAMES[i] if i >= 0 else None

    @staticmethod
    def supports(ggml_type: int) -> bool:
        return bool(lib.lle_type_supported(int(ggml_type)))

    @staticmethod
    def act_rounding() -> str:
        """How Q8_0/Q8_1 activations are rounded: "ref" (ggml's *_ref), "x86" or "arm" (the SIMD
        paths of llama.cpp's CPU backend). The default is the host's, so products agree with a
        llama.cpp build on the same machine bit for bit."""
        return ROUNDING[lib.lle_act_rounding_mode()]

    @staticmethod
    def set_act_rounding(variant: str) -> None:
        if variant not in ROUNDING:
            raise ValueError(f"rounding variant must be one of {', '.join(ROUNDING)}")
        lib.lle_set_act_rounding(ROUNDING.index(variant))

    @staticmethod
    def set_spin_us(us: int) -> None:
        """How long idle pool threads spin (microseconds) before sleeping."""
        lib.lle_set_spin_us(int(us))

    # ------------------------------------------------------------------ weights

    def prepare(self, tensor: TensorInfo) -> NativeWeight | np.ndarray:
        if len(tensor.dims) == 1:
            from llmedge.quant import dequantize

            return np.ascontiguousarray(dequantize(tensor.data, tensor.ggml_type, tensor.shape), dtype=np.float32)
        return NativeWeight(tensor)

    def matmul(self, x: np.ndarray, w: NativeWeight, out: np.ndarray | None = None) -> np.ndarray:
        """``x`` [..., k] times the transposed weight: float32 [..., m]."""
        k = w.k
        check_matmul(x, k, w.name)
        if x.dtype != _F32 or not x.flags["C_CONTIGUOUS"]:
            x = np.ascontiguousarray(x, dtype=np.float32)
        shape = x.shape[:-1] + (w.m,)
        if w.fallback is not None:
            res = (x.reshape(-1, k) @ w.fallback.T).reshape(shape)
            if out is None:
                return res
            _out(out, shape)[...] = res
            return out
        o = np.empty(shape, dtype=np.float32) if out is None else _out(out, shape)
        if lib.lle_matmul(w.ggml_type, w.ptr, w.row_bytes, w.m, k, _from_buffer(_FLOATS, x), x.size // k,
                          _from_buffer(_FLOATS, o), w.m):
            raise LlmedgeError(f"native matmul failed for {w.name}")
        return o

    def matmul_rows(self, x: np.ndarray, w: NativeWeight, out: np.ndarray | None = None) -> np.ndarray:
        """As :meth:`matmul`, but every row of ``x`` multiplied exactly as a one-row ``matmul`` would
        (the decode kernel's summation order, bit for bit), the weights still read once for all rows."""
        if w.fallback is not None:  # NumPy rows one by one: a row alone is a row alone
            x2 = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, w.k)
            res = np.stack([self.matmul(r[None], w)[0] for r in x2]) if len(x2) else x2 @ w.fallback.T
            res = res.reshape(x.shape[:-1] + (w.m,))
            if out is None:
                return res
            _out(out, res.shape)[...] = res
            return out
        k = w.k
        check_matmul(x, k, w.name)
        if x.dtype != _F32 or not x.flags["C_CONTIGUOUS"]:
            x = np.ascontiguousarray(x, dtype=np.float32)
        shape = x.shape[:-1] + (w.m,)
        o = np.empty(shape, dtype=np.float32) if out is None else _out(out, shape)
        if lib.lle_matmul_rows(w.ggml_type, w.ptr, w.row_bytes, w.m, k, _from_buffer(_FLOATS, x), x.size // k,
                               _from_buffer(_FLOATS, o), w.m):
            raise LlmedgeError(f"native matmul failed for {w.name}")
        return o

    def get_rows(self, w: NativeWeight, ids: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        ids = np.ascontiguousarray(ids, dtype=np.int32).reshape(-1)
        check_row_ids(ids, w.m, w.name)
        o = _out(out, (ids.size, w.k))
        if w.fallback is not None:
            o[...] = w.fallback[ids]
            return o
        if ids.size:
            _check(lib.lle_get_rows(w.ggml_type, w.ptr, w.row_bytes, w.k, ffi.from_buffer("int[]", ids),
                                    ids.size, _fptr(o)), "get_rows")
        return o

    # ------------------------------------------------------------------ float ops

    def rms_norm(self, x: np.ndarray, weight: np.ndarray | None, eps: float,
                 out: np.ndarray | None = None) -> np.ndarray:
        x = _f32c(x)
        d = x.shape[-1]
        o = _out(out, x.shape)
        wp = ffi.NULL
        if weight is not None:
            weight = _f32c(weight)
            check_norm_weight(weight, d)
            wp = _fptr(weight)
        _check(lib.lle_rms_norm(_fptr(x), wp, x.size // d if d else 0, d, eps, _fptr(o)), "rms_norm")
        return o

    def rope(self, x: np.ndarray, positions: np.ndarray, n_rot: int, freq_base: float,
             freq_scale: float, neox: bool, freq_factors: np.ndarray | None = None,
             out: np.ndarray | None = None, attn_factor: float = 1.0, ext_factor: float = 0.0,
             corr_dims: tuple[float, float] = (0.0, 0.0)) -> np.ndarray:
        """Rotate ``x`` [n, heads, head_dim]; ``out`` may be ``x`` itself (in place). ``freq_factors``
        divide each pair's angle, ``ext_factor``/``corr_dims`` are YaRN's ramp, ``attn_factor`` scales
        cos and sin (ggml's rope_ext; YaRN's mscale folded in by the caller)."""
        x = _f32c(x)
        n, n_head, head_dim = x.shape
        pos = np.ascontiguousarray(positions, dtype=np.int32)
        if freq_factors is not None:
            freq_factors = _f32c(freq_factors)
        check_rope(pos, n, freq_factors, n_rot)
        o = _out(out, x.shape)
        ff = ffi.NULL if freq_factors is None else _fptr(freq_factors)
        if ext_factor != 0.0:
            _check(lib.lle_rope_yarn(_fptr(x), ffi.from_buffer("int[]", pos), n, n_head, head_dim, int(n_rot),
                                     freq_base, freq_scale, 1 if neox else 0, ff, attn_factor, ext_factor,
                                     corr_dims[0], corr_dims[1], _fptr(o)), "rope")
            return o
        _check(lib.lle_rope_ext(_fptr(x), ffi.from_buffer("int[]", pos), n, n_head, head_dim, int(n_rot),
                                freq_base, freq_scale, 1 if neox else 0, ff, attn_factor, _fptr(o)), "rope")
        return o

    def softmax(self, x: np.ndarray, scale: float = 1.0, out: np.ndarray | None = None) -> np.ndarray:
        x = _f32c(x)
        d = x.shape[-1]
        o = _out(out, x.shape)
        _check(lib.lle_softmax(_fptr(x), x.size // d if d else 0, d, scale, _fptr(o)), "softmax")
        return o

    def attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, q_pos: np.ndarray,
                  k_pos: np.ndarray, scale: float, window: int | None = None,
                  softcap: float | None = None, out: np.ndarray | None = None) -> np.ndarray:
        """See :meth:`llmedge.backends.base.Backend.attention`. ``k``/``v`` may be strided views
        (e.g. the first ``t`` cells of a cache) as long as the last axis is contiguous.

        Numerics are llama.cpp's attention without flash-attention: with an F16 cache, Q and the
        probabilities are rounded to F16; scores are soft-capped (``cap * tanh(s / cap)``) and then
        multiplied by ``scale``; one query row uses ggml's vec_dot order, several rows llamafile's
        order. Cell j lands in the same SIMD lane as in llama.cpp when the cache keeps cells in
        llama.cpp's order (cell index = array index)."""
        q = _f32c(q)
        check_attention(q, k, v, q_pos, k_pos)
        n, n_head, d = q.shape
        t, n_kv, _ = k.shape
        item = k.dtype.itemsize
        for a in (k, v):
            if a.strides[2] != item or a.strides[0] % item or a.strides[1] % item:
                raise ValueError("attention: the last axis of k and v must be contiguous")
        qp = np.ascontiguousarray(q_pos, dtype=np.int32)
        kp = np.ascontiguousarray(k_pos, dtype=np.int32)
        o = _out(out, (n, n_head, d))
        if t == 0:
            o[...] = 0
            return o
        kb = ffi.from_buffer("uint8_t[]", k, require_writable=False) if k.flags.c_contiguous else _base_ptr(k)
        vb = ffi.from_buffer("uint8_t[]", v, require_writable=False) if v.flags.c_contiguous else _base_ptr(v)
        rc = lib.lle_attention(_fptr(q), n, n_head, d, kb, vb, 1 if k.dtype == _F16 else 0, t, n_kv,
                               k.strides[0] // item, k.strides[1] // item, v.strides[0] // item,
                               v.strides[1] // item, ffi.from_buffer("int[]", qp), ffi.from_buffer("int[]", kp),
                               scale, int(window or 0), float(softcap or 0.0), _fptr(o))
        _check(rc, "attention")
        return o

    def glu(self, gate: np.ndarray, up: np.ndarray, kind: GluKind, out: np.ndarray | None = None) -> np.ndarray:
        gate, up = _f32c(gate), _f32c(up)
        check_same_shape("glu", gate, up, ("gate", "up"))
        o = _out(out, gate.shape)
        row = gate.shape[-1] if gate.ndim else 1  # ggml's vector loops restart at every row
        _check(lib.lle_glu(_fptr(gate), _fptr(up), gate.size, max(row, 1), _GLU_KINDS[kind], _fptr(o)), "glu")
        return o

    def add(self, a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        a, b = _f32c(a), _f32c(b)
        check_same_shape("add", a, b)
        o = _out(out, a.shape)
        _check(lib.lle_add(_fptr(a), _fptr(b), a.size, _fptr(o)), "add")
        return o

    def scale(self, x: np.ndarray, s: float, out: np.ndarray | None = None) -> np.ndarray:
        x = _f32c(x)
        o = _out(out, x.shape)
        _check(lib.lle_scale(_fptr(x), s, x.size, _fptr(o)), "scale")
        return o

    def decoder_layers(self, model: Any, x: np.ndarray, step: Any) -> bool:
        """Run every layer of ``model`` (a :class:`llmedge.models.base.Decoder`) over the rows ``x``
        of ``step`` in place, in one C call, which also claims and writes the K/V cells.

        Returns False (nothing done) when the op-by-op path must run instead: a weight without a
        native kernel."""
        plan = getattr(model, "_native_stack", None)
        if plan is None:
            plan = model._native_stack = _StackPlan(model) if _StackPlan.decline_reason(model) is None else False
        if plan is False or x.dtype != _F32 or not x.flags["C_CONTIGUOUS"]:
            return False
        batches = step.batches
        if any(b.cache.kv_type not in _KV_TYPE_CODES or len(b.cache.layers) != plan.n_layer for b in batches):
            return False
        n_seqs, n_layer = len(batches), plan.n_layer
        kv = ffi.new("lle_kv *[]", [_kv_block(b.cache, model) for b in batches])
        pos = np.ascontiguousarray(step.positions, dtype=np.int32)
        rows = np.array([0] + [e for _, e in step.bounds], dtype=np.int32)
        layers_fn = lib.lle_decoder_layers_rows if step.row_exact else lib.lle_decoder_layers
        rc = layers_fn(plan.c, n_layer, _fptr(x), x.shape[0], ffi.from_buffer("int[]", pos), n_seqs,
                       ffi.from_buffer("int[]", rows), kv)
        if rc == -3:  # a layer had no room for its rows; nothing was claimed
            raise ValueError(next((why for b in batches for layer in b.cache.layers
                                   if (why := layer.room_error(len(b.tokens)))), "KV cache full"))
        _check(rc, "decoder layers")
        return True

    @staticmethod
    def stack_supported(model: Any) -> bool:
        """True when :meth:`decoder_layers` runs ``model`` (its fused stack encodes every layer)."""
        return _StackPlan.decline_reason(model) is None

    def softcap(self, x: np.ndarray, cap: float, out: np.ndarray | None = None) -> np.ndarray:
        """``tanh(x / cap) * cap`` (logit soft-capping)."""
        x = _f32c(x)
        o = _out(out, x.shape)
        _check(lib.lle_softcap(_fptr(x), cap, x.size, _fptr(o)), "softcap")
        return o


class _StackPlan:
    """A model's layers as the C ``lle_layer`` array (built once; keeps the weights it points to alive).

    The C stack encodes these :class:`llmedge.models.spec.LayerSpec` features: Q/K/V and output
    biases, per-head Q/K norms, fused QKV and fused gate/up weights, post-norms, SiLU/GELU GLUs,
    RoPE (both layouts, linear scaling, YaRN, frequency factors, attn_factor), sliding windows, attention
    soft-capping, Q scaling and residual scaling. A model using anything else runs op by op."""

    ENCODED = frozenset({"qkv_bias", "o_bias", "qk_norm", "fused_qkv", "fused_gate_up", "post_norms",
                         "sliding_window", "attn_softcap", "q_scale", "rope_freqs", "rope_longrope",
                         "rope_attn_factor", "rope_linear", "rope_yarn", "residual_scale"})

    def __init__(self, model: Any) -> None:
        layers, specs = model.layers, model.specs
        self.n_layer = len(layers)
        self.c = ffi.new("lle_layer[]", max(1, self.n_layer))
        self.keep: list[Any] = []
        ff = model.rope_ff
        for il, (w, spec) in enumerate(zip(layers, specs)):
            L = self.c[il]
            for field, name in _WEIGHT_FIELDS:
                if name in w and not (field == "wq" and spec.fused_qkv):
                    self._weight(L, field, w[name])
            if spec.fused_qkv:
                self._weight(L, "wq", w["attn_qkv"])
            for field, name in _FLOAT_FIELDS:
                if name in w:
                    setattr(L, field, self._floats(w[name]))
            if ff is not None:
                L.rope_factors = self._floats(ff)
            L.n_embd, L.n_ff = w["attn_output"].m, spec.n_ff
            L.n_head, L.n_kv_head, L.head_dim, L.n_rot = spec.n_head, spec.n_kv_head, spec.head_dim, spec.n_rot
            L.neox, L.glu_kind, L.window = int(spec.neox), _GLU_KINDS[spec.glu], int(spec.window or 0)
            L.eps, L.rope_base, L.rope_scale = spec.eps, spec.rope_base, spec.rope_scale
            L.q_scale, L.attn_scale, L.softcap = spec.q_scale, spec.scale, float(spec.softcap or 0.0)
            L.rope_attn_factor = spec.rope_attn_factor
            L.rope_ext_factor = spec.rope_ext_factor
            L.rope_corr_lo, L.rope_corr_hi = spec.rope_corr_dims
            L.fused_qkv, L.fused_gate_up = int(spec.fused_qkv), int(spec.fused_gate_up)
            L.residual_scale = spec.residual_scale

    @staticmethod
    def _weight(L: Any, field: str, nw: NativeWeight) -> None:
        cw = getattr(L, field)
        cw.type, cw.data, cw.row_bytes, cw.m, cw.k = nw.ggml_type, nw.ptr, nw.row_bytes, nw.m, nw.k

    def _floats(self, a: np.ndarray) -> Any:
        a = _f32c(a)
        self.keep.append(a)
        return _fptr(a)

    @classmethod
    def decline_reason(cls, model: Any) -> str | None:
        """None when the C stack encodes every feature and weight of ``model``; else why not, in a few
        words (``llmedge show`` prints it)."""
        reason = unencoded_feature(model, cls.ENCODED, "the fused stack")
        if reason is not None:
            return reason
        for il, w in enumerate(model.layers):
            for name in ("attn_q", "attn_k", "attn_v", "attn_qkv", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
                nw = w.get(name)
                if nw is not None and not (isinstance(nw, NativeWeight) and nw.fallback is None):
                    t = getattr(nw, "ggml_type", "?")
                    return f"layer {il} {name} has weight type {t} without a native kernel"
        return None

    @classmethod
    def supported(cls, model: Any) -> bool:
        return cls.decline_reason(model) is None


_WEIGHT_FIELDS = (("wq", "attn_q"), ("wk", "attn_k"), ("wv", "attn_v"), ("wo", "attn_output"),
                  ("gate", "ffn_gate"), ("up", "ffn_up"), ("down", "ffn_down"))
_FLOAT_FIELDS = (("attn_norm", "attn_norm"), ("q_norm", "attn_q_norm"), ("k_norm", "attn_k_norm"),
                 ("post_attn_norm", "post_attention_norm"), ("ffn_norm", "ffn_norm"),
                 ("post_ffn_norm", "post_ffw_norm"), ("bq", "attn_q.bias"), ("bk", "attn_k.bias"),
                 ("bv", "attn_v.bias"), ("bo", "attn_output.bias"))


def stack_decline_reason(model: Any) -> str | None:
    """Why the native fused stack would not run ``model`` (None: it would)."""
    return _StackPlan.decline_reason(model)


_KV_TYPE_CODES = {"f32": 0, "f16": 1, "q8_0": 2}


def _kv_block(cache: Any, model: Any) -> Any:
    """The C descriptors (lle_kv) of every layer cache of sequence ``cache``, made once and kept on it
    (the cells, positions and cursors they point at live as long as the cache): the C stack claims
    each step's cells itself, so a step runs no Python per layer."""
    held = cache.__dict__.get("_native_kv")
    if held is not None and held[0] is cache.layers and len(held[1]) == len(cache.layers):
        return held[1]
    block = ffi.new("lle_kv[]", len(cache.layers))
    keep: list[Any] = []
    for il, layer in enumerate(cache.layers):
        if layer.rope is None:
            layer.rope = cache_rope(model.specs[il], model.rope_ff)
        e = block[il]
        k, v = layer.k.arrays, layer.v.arrays
        ptrs = [ffi.from_buffer("uint8_t[]", k[0]), ffi.from_buffer("uint8_t[]", v[0]),
                ffi.from_buffer("int[]", layer.pos), ffi.from_buffer("long long[]", layer.cursor)]
        keep += ptrs
        e.k, e.v, e.pos, e.cursor = ptrs
        if len(k) > 1:  # q8_0: the block scales
            scales = [ffi.from_buffer("uint8_t[]", k[1]), ffi.from_buffer("uint8_t[]", v[1])]
            keep += scales
            e.k_d, e.v_d = scales
        e.kv_type = _KV_TYPE_CODES[layer.kv_type]
        e.capacity, e.ring = layer.capacity, int(layer.ring)
        e.window = layer.window if layer.window is not None else 0
    cache._native_kv = (cache.layers, block, keep)
    return block


def _base_ptr(a: np.ndarray) -> Any:
    """A pointer to the first element of a strided (non-contiguous) array view."""
    return ffi.cast("void *", a.__array_interface__["data"][0])
