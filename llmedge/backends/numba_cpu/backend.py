"""The Numba backend class: :class:`NumbaWeight` (views of a weight's GGUF rows) and
:class:`NumbaBackend`, which checks arguments, picks serial or parallel kernels and warms the
compile cache. ``LLMEDGE_ISA`` picks the native backend's kernel tier only: numba compiles its
kernels for this CPU (:attr:`NumbaBackend.isa`), so it says so in one line and goes on."""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, ClassVar

import numba
import numpy as np

from llmedge.backends.base import (
    GluKind,
    check_attention,
    check_matmul,
    check_norm_weight,
    check_rope,
    check_row_ids,
    check_same_shape,
)
from llmedge.backends.base import as_f32c as _f32c
from llmedge.backends.base import out_array as _out
from llmedge.backends.cpu import physical_cores
from llmedge.backends.numba_cpu.common import (
    _Q8_0_FAMILY,
    _Q8_1_FAMILY,
    _Q8_K_FAMILY,
    F32,
    SUPPORTED,
    TBF16,
    TF32,
    TQ4_K,
)
from llmedge.backends.numba_cpu.matrix import (
    _get_rows,
    _mm_f32,
    _mm_half,
    _mm_q4_k,
    _mm_q8_0,
    _mm_q8_1,
    _mm_q8_k,
)
from llmedge.backends.numba_cpu.ops import (
    _attention,
    _build_gelu_table,
    _glu_par,
    _glu_ser,
    _rms_norm_par,
    _rms_norm_rows,
    _rope_par,
    _rope_ser,
    _softcap,
    _softmax_rows,
)
from llmedge.errors import LlmedgeError
from llmedge.gguf import TensorInfo
from llmedge.quant import GGMLQuantizationType as T
from llmedge.quant import row_nbytes

# ---------------------------------------------------------------------------------------------
# the backend


class NumbaWeight:
    """A 2-D weight: read-only uint8 and int8 views of its GGUF rows, and its geometry."""

    __slots__ = ("name", "ggml_type", "m", "k", "shape", "u8", "i8", "f32", "u16")

    def __init__(self, tensor: TensorInfo) -> None:
        t = T(int(tensor.ggml_type))
        if t not in SUPPORTED:
            raise LlmedgeError(f"the numba backend has no kernels for {t.name} weights ({tensor.name})")
        self.name = tensor.name
        self.ggml_type = int(t)
        self.k = int(tensor.dims[0])
        self.m = tensor.n_elements // self.k if self.k else 0
        self.shape = (self.m, self.k)
        rb = row_nbytes(t, self.k)
        data = tensor.data
        if not data.flags.c_contiguous:
            data = np.ascontiguousarray(data)
        u8 = data.reshape(self.m, rb).view()
        u8.flags.writeable = False
        self.u8 = u8
        self.i8 = u8.view(np.int8)
        self.f32 = u8.view(np.float32) if t == T.F32 else None
        self.u16 = u8.view(np.uint16) if t in (T.F16, T.BF16) else None

    def __repr__(self) -> str:
        return f"NumbaWeight({self.name!r}, type={T(self.ggml_type).name}, shape={self.shape})"


_F32 = np.dtype(np.float32)
_F16 = np.dtype(np.float16)
_tls = threading.local()
_GELU_TABLE: np.ndarray | None = None
_EMPTY_F32 = np.zeros(1, np.float32)


def _gelu_table() -> np.ndarray:
    global _GELU_TABLE
    if _GELU_TABLE is None:
        _GELU_TABLE = _build_gelu_table()
    return _GELU_TABLE


class NumbaBackend:
    """:class:`llmedge.backends.base.Backend` on Numba kernels."""

    name = "numba"
    #: seconds spent compiling (or loading from the disk cache) kernels, summed over the process
    compile_seconds_total: ClassVar[float] = 0.0
    _warm: ClassVar[bool] = False
    _isa_noted: ClassVar[bool] = False

    def __init__(self, n_threads: int | None = None) -> None:
        n = int(n_threads) if n_threads else physical_cores()
        if n < 1:
            raise ValueError("n_threads must be at least 1")
        self.n_threads = min(n, numba.config.NUMBA_NUM_THREADS)
        self.compile_seconds = 0.0
        self.isa = _llvm_cpu()
        self._set_threads()
        self._note_forced_isa()

    # ------------------------------------------------------------------ setup

    def _note_forced_isa(self) -> None:
        """One line on stderr, once per process, when ``LLMEDGE_ISA`` is set: it selects the native
        backend's kernel tier, which numba has no counterpart of (its kernels are compiled for this CPU)."""
        want = os.environ.get("LLMEDGE_ISA", "").strip()
        if want and not NumbaBackend._isa_noted:
            NumbaBackend._isa_noted = True
            print(f"llmedge: LLMEDGE_ISA={want} applies to the native backend only; numba compiles its kernels "
                  f"for this CPU ({self.isa or 'host'})", file=sys.stderr)

    def _set_threads(self) -> None:
        if getattr(_tls, "n", None) != self.n_threads:
            numba.set_num_threads(self.n_threads)
            _tls.n = self.n_threads

    def warmup(self) -> float:
        """Compile (or load from the disk cache) every kernel once; returns the seconds it took and
        records them in :attr:`compile_seconds`. Later calls in the same process cost nothing."""
        if NumbaBackend._warm:
            return self.compile_seconds
        t0 = time.perf_counter()
        self._set_threads()
        _gelu_table()
        rng = np.random.default_rng(0)
        for n in (1, 8):
            x = rng.standard_normal((n, 256), dtype=np.float32)
            for t in SUPPORTED:
                w = _random_weight(t, 33, 256, rng)
                self.matmul(x, w)
                self.get_rows(w, np.array([0, 32], np.int32))
            xn = rng.standard_normal((n, 2, 64), dtype=np.float32)
            self.rms_norm(xn, np.ones(64, np.float32), 1e-6)
            self.rope(xn, np.arange(n, dtype=np.int32), 64, 10000.0, 1.0, n == 1)
            g = rng.standard_normal((n, 64), dtype=np.float32)
            self.glu(g, g, "silu")
            self.glu(g, g, "gelu")
            self.softmax(g)
            for dt in (np.float16, np.float32):
                kv = rng.standard_normal((4, 1, 64)).astype(dt)
                self.attention(xn, kv, kv, np.arange(n, dtype=np.int32) + 3, np.arange(4, dtype=np.int32), 0.125)
                self.attention(xn, kv[:3], kv[:3], np.arange(n, dtype=np.int32) + 3, np.arange(3, dtype=np.int32),
                               0.125, window=2, softcap=30.0)
        self.softcap(g, 30.0)
        NumbaBackend._warm = True
        self.compile_seconds = time.perf_counter() - t0
        NumbaBackend.compile_seconds_total += self.compile_seconds
        return self.compile_seconds

    # ------------------------------------------------------------------ weights

    def prepare(self, tensor: TensorInfo) -> NumbaWeight | np.ndarray:
        if len(tensor.dims) == 1:
            from llmedge.quant import dequantize

            return np.ascontiguousarray(dequantize(tensor.data, tensor.ggml_type, tensor.shape), dtype=np.float32)
        return NumbaWeight(tensor)

    def matmul(self, x: np.ndarray, w: NumbaWeight, out: np.ndarray | None = None) -> np.ndarray:
        """``x`` [..., k] times the transposed weight: float32 [..., m]."""
        k = w.k
        check_matmul(x, k, w.name)
        shape = x.shape[:-1] + (w.m,)
        x2 = _f32c(x).reshape(-1, k)
        o = _out(out, shape)
        o2 = o.reshape(-1, w.m)
        if x2.shape[0] == 0 or w.m == 0:
            return o
        self._set_threads()
        t = w.ggml_type
        if t in _Q8_0_FAMILY:
            _mm_q8_0(x2, w.u8, w.i8, t, o2)
        elif t in _Q8_1_FAMILY:
            _mm_q8_1(x2, w.u8, t, o2)
        elif t == TQ4_K:
            _mm_q4_k(x2, w.u8, w.i8, o2)
        elif t in _Q8_K_FAMILY:
            _mm_q8_k(x2, w.u8, w.i8, t, o2)
        elif t == TF32:
            _mm_f32(x2, w.f32, o2)
        else:
            _mm_half(x2, w.u16, t == TBF16, o2)
        return o

    def get_rows(self, w: NumbaWeight, ids: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        check_row_ids(ids, w.m, w.name)
        o = _out(out, (ids.size, w.k))
        if ids.size:
            self._set_threads()
            _get_rows(w.u8, w.i8, w.ggml_type, ids, o)
        return o

    # ------------------------------------------------------------------ float ops

    def rms_norm(self, x: np.ndarray, weight: np.ndarray | None, eps: float,
                 out: np.ndarray | None = None) -> np.ndarray:
        x = _f32c(x)
        d = x.shape[-1]
        o = _out(out, x.shape)
        x2, o2 = x.reshape(-1, d), o.reshape(-1, d)
        wv = _EMPTY_F32 if weight is None else _f32c(weight).reshape(-1)
        if weight is not None:
            check_norm_weight(wv, d)
        if x2.shape[0] * d >= 1 << 16:
            self._set_threads()
            _rms_norm_par(x2, wv, weight is not None, F32(eps), o2)
        else:
            _rms_norm_rows(x2, wv, weight is not None, F32(eps), o2, 0, x2.shape[0])
        return o

    def rope(self, x: np.ndarray, positions: np.ndarray, n_rot: int, freq_base: float,
             freq_scale: float, neox: bool, freq_factors: np.ndarray | None = None,
             out: np.ndarray | None = None, attn_factor: float = 1.0, ext_factor: float = 0.0,
             corr_dims: tuple[float, float] = (0.0, 0.0)) -> np.ndarray:
        """Rotate ``x`` [n, heads, head_dim] at ``positions``; ``out`` may be ``x`` itself.
        ``freq_factors`` divide each pair's angle, ``ext_factor``/``corr_dims`` are YaRN's ramp,
        ``attn_factor`` scales cos and sin (ggml's rope_ext; YaRN's mscale folded in by the caller)."""
        x = _f32c(x)
        n = x.shape[0]
        pos = np.ascontiguousarray(positions, dtype=np.int32).reshape(-1)
        ff = _EMPTY_F32 if freq_factors is None else _f32c(freq_factors).reshape(-1)
        check_rope(pos, n, None if freq_factors is None else ff, n_rot)
        if n_rot % 2 or n_rot > x.shape[2]:
            raise ValueError(f"rope: n_rot {n_rot} must be even and at most the head size {x.shape[2]}")
        o = _out(out, x.shape)
        theta_scale = F32(F32(freq_base) ** (F32(-2.0) / F32(n_rot)))
        args = (x, pos, int(n_rot), F32(freq_scale), theta_scale, bool(neox), ff, freq_factors is not None,
                F32(attn_factor), F32(ext_factor), F32(corr_dims[0]), F32(corr_dims[1]), o)
        if x.size >= 1 << 15:
            self._set_threads()
            _rope_par(*args)
        else:
            _rope_ser(*args)
        return o

    def attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, q_pos: np.ndarray,
                  k_pos: np.ndarray, scale: float, window: int | None = None,
                  softcap: float | None = None, out: np.ndarray | None = None) -> np.ndarray:
        """See :meth:`llmedge.backends.base.Backend.attention` (llama.cpp's numerics without flash
        attention, as the native backend: Q and the probabilities rounded to F16 with an F16 cache)."""
        q = _f32c(q)
        n, n_head, d = q.shape
        t = k.shape[0]
        qp = np.ascontiguousarray(q_pos, dtype=np.int32).reshape(-1)
        kp = np.ascontiguousarray(k_pos, dtype=np.int32).reshape(-1)
        check_attention(q, k, v, qp, kp)
        o = _out(out, (n, n_head, d))
        if t == 0:
            o[...] = 0
            return o
        f16 = k.dtype == _F16
        if f16:
            k, v = k.view(np.uint16), v.view(np.uint16)
        if not k.flags.c_contiguous:
            k = np.ascontiguousarray(k)
        if not v.flags.c_contiguous:
            v = np.ascontiguousarray(v)
        self._set_threads()
        _attention(q, k, v, f16, qp, kp, F32(scale), int(window or 0), F32(softcap or 0.0), o)
        return o

    def glu(self, gate: np.ndarray, up: np.ndarray, kind: GluKind, out: np.ndarray | None = None) -> np.ndarray:
        """``act(gate) * up``: SiLU with ggml's vectorized expf, or GELU through ggml's F16 table."""
        gate, up = _f32c(gate), _f32c(up)
        check_same_shape("glu", gate, up, ("gate", "up"))
        if kind not in ("silu", "gelu"):
            raise ValueError(f"glu: unknown kind {kind!r}")
        o = _out(out, gate.shape)
        args = (gate.reshape(-1), up.reshape(-1), 0 if kind == "silu" else 1, _gelu_table(), o.reshape(-1),
                max(1, gate.shape[-1] if gate.ndim else 1))
        if gate.size >= 1 << 16:
            self._set_threads()
            _glu_par(*args)
        else:
            _glu_ser(*args)
        return o

    def softmax(self, x: np.ndarray, scale: float = 1.0, out: np.ndarray | None = None) -> np.ndarray:
        x = _f32c(x)
        d = x.shape[-1]
        o = _out(out, x.shape)
        _softmax_rows(x.reshape(-1, d), F32(scale), o.reshape(-1, d))
        return o

    def add(self, a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        a, b = _f32c(a), _f32c(b)
        check_same_shape("add", a, b)
        return np.add(a, b, out=_out(out, a.shape))

    def scale(self, x: np.ndarray, s: float, out: np.ndarray | None = None) -> np.ndarray:
        x = _f32c(x)
        return np.multiply(x, F32(s), out=_out(out, x.shape))

    def decoder_layers(self, model: Any, x: np.ndarray, step: Any) -> bool:
        """Every layer of ``model`` over the rows ``x`` of ``step`` in place, in one compiled call
        (:mod:`llmedge.backends.numba_cpu.fused`); False when the op-by-op path must run instead."""
        from llmedge.backends.numba_cpu.fused import decoder_layers

        return decoder_layers(self, model, x, step)

    def softcap(self, x: np.ndarray, cap: float, out: np.ndarray | None = None) -> np.ndarray:
        """``tanh(x / cap) * cap`` (logit soft-capping)."""
        x = _f32c(x)
        o = _out(out, x.shape)
        _softcap(x.reshape(-1), F32(cap), o.reshape(-1))
        return o


def _llvm_cpu() -> str:
    """The CPU name LLVM compiles the kernels for (e.g. ``znver3``)."""
    try:
        import llvmlite.binding as llvm

        return str(llvm.get_host_cpu_name())
    except Exception:  # pragma: no cover - llvmlite always has it
        return ""


def _random_weight(t: T, m: int, k: int, rng: np.random.Generator) -> NumbaWeight:
    """A small weight of type ``t`` with random bytes (finite scales), for warm-up compiles."""
    rb = row_nbytes(t, k)
    raw = rng.integers(0, 256, size=(m, rb), dtype=np.uint8)
    if t == T.F32:
        raw = rng.standard_normal((m, k), dtype=np.float32).view(np.uint8)
    elif t in (T.F16, T.BF16):
        raw = (rng.standard_normal((m, k), dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
        if t == T.F16:
            raw = rng.standard_normal((m, k)).astype(np.float16).view(np.uint8)
    info = TensorInfo(name=f"warmup.{t.name}", ggml_type=int(t), dims=(k, m), offset=0, n_bytes=raw.size,
                      _buffer=np.ascontiguousarray(raw).reshape(-1))
    return NumbaWeight(info)
