"""The NumPy reference backend: every op written plainly in NumPy.

It is the correctness baseline the other backends are tested against, not a fast path. Weights are
dequantized once, on first use, into a float32 copy that the handle keeps (a deliberate memory-for-
simplicity trade of the reference; the native backend keeps the GGUF blocks instead).

The reference gives the same float32 results on every CPU. It rounds where ggml rounds (activations
quantized to the weight type's partner, F16 caches and probabilities, ggml's F16 GELU table), and
in between computes in float64: every sum (matrix products, attention scores and mixes, RMS norms)
and every transcendental (exp, tanh, sin, cos), rounded once to float32. Float32 sums through BLAS,
and NumPy's float32 exp/sin/cos, take CPU-specific kernels (OpenBLAS picks Haswell- or SkylakeX-class
kernels at run time, NumPy has AVX-512 SVML loops) whose rounding differs by machine; a float64
result differs between kernels by ~1e-16 relative, which survives the rounding to float32 only when
it lies that close to a float32 rounding boundary (about one element in 10^8, and then by one ulp).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from llmedge.backends.base import GluKind
from llmedge.gguf import TensorInfo
from llmedge.quant import GGMLQuantizationType as T
from llmedge.quant import dequantize, quantize, traits


class NumpyWeight:
    """A weight tensor with its float32 dequantization made lazily and cached."""

    def __init__(self, tensor: TensorInfo) -> None:
        self.tensor = tensor
        self.shape = tensor.shape
        self.vec_dot_type = traits(tensor.ggml_type).vec_dot_type
        self._f32: np.ndarray | None = None

    @property
    def f32(self) -> np.ndarray:
        if self._f32 is None:
            self._f32 = dequantize(self.tensor.data, self.tensor.ggml_type, self.shape)
        return self._f32

    @functools.cached_property
    def block_mins(self) -> np.ndarray:
        """The F16 ``m`` of each block of a Q4_1/Q5_1 weight (bytes 2-3 of the block), [rows, blocks]."""
        raw = self.tensor.rows()
        bs = traits(self.tensor.ggml_type).type_size
        return raw.reshape(raw.shape[0], -1, bs)[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float32)

    def rows(self, ids: np.ndarray) -> np.ndarray:
        if self._f32 is not None:
            return self._f32[ids]
        raw = self.tensor.rows()[ids]
        return dequantize(raw, self.tensor.ggml_type, (len(ids), self.shape[-1]))


def round_activations(x: np.ndarray, vec_dot_type: T) -> np.ndarray:
    """Activations as ggml's CPU product sees them: quantized to the weight type's partner
    (Q8_0/Q8_1/Q8_K, or rounded to F16/BF16) and back, so the reference rounds where llama.cpp does."""
    if vec_dot_type == T.F32:
        return x
    x = np.ascontiguousarray(x, dtype=np.float32)
    return dequantize(quantize(x, vec_dot_type, variant="x86"), vec_dot_type, x.shape)


def q8_1_product(x: np.ndarray, w: NumpyWeight) -> np.ndarray:
    """x times a Q4_1/Q5_1 weight as ggml computes it: per block ``d_w*d_x*sum(q_w*q_x) + m_w*s_x``,
    where the activation block sum ``s_x`` is stored as F16 in the Q8_1 block (not the exact sum)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    n, k = x.shape
    blocks = quantize(x, T.Q8_1, variant="x86").reshape(n, k // 32, 36)
    xq = dequantize(blocks, T.Q8_1, x.shape)
    s16 = blocks[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    exact = xq.reshape(n, k // 32, 32).sum(axis=2, dtype=np.float64)
    out = f64_product(xq, w.f32, keep_f64=True)
    out += f64_product(s16 - exact, w.block_mins, keep_f64=True)
    return out.astype(np.float32)


_F64_CHUNK_ELEMENTS = 1 << 22  # weight rows converted to float64 at a time: 32 MiB


def f64_product(a: np.ndarray, b: np.ndarray, keep_f64: bool = False) -> np.ndarray:
    """``a @ b.T`` accumulated in float64 and rounded once to float32 (see the module docstring:
    the same result on every CPU). ``b`` [m, k] is converted in row chunks, so a large float32
    weight never has a whole float64 copy."""
    a64 = np.asarray(a, dtype=np.float64)
    m, k = b.shape
    out = np.empty((a64.shape[0], m), dtype=np.float64 if keep_f64 else np.float32)
    step = max(1, _F64_CHUNK_ELEMENTS // max(1, k))
    for s in range(0, m, step):
        out[:, s : s + step] = a64 @ b[s : s + step].astype(np.float64).T
    return out


def f64_op(fn, x: np.ndarray) -> np.ndarray:
    """A transcendental ``fn`` evaluated in float64 and rounded once to float32."""
    return fn(np.asarray(x, dtype=np.float64)).astype(np.float32)


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(_SQRT_2_OVER_PI * x * (1.0 + 0.044715 * x * x)))


def gelu_ggml(x: np.ndarray) -> np.ndarray:
    """ggml's CPU GELU: input and output pass through F16 (its lookup table), identity past +-10."""
    x16 = x.astype(np.float16).astype(np.float64)
    y = gelu_tanh(x16).astype(np.float16).astype(np.float32)
    return np.where(x <= -10.0, np.float32(0.0), np.where(x >= 10.0, x, y))


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x), in float64 when given float32 (rounded back by the caller)."""
    x = np.asarray(x, dtype=np.float64) if np.asarray(x).dtype == np.float32 else x
    return x / (1.0 + np.exp(-x))


def rope_angles(positions: np.ndarray, n_rot: int, freq_base: float, freq_scale: float,
                freq_factors: np.ndarray | None = None, ext_factor: float = 0.0,
                corr_dims: tuple[float, float] = (0.0, 0.0)) -> np.ndarray:
    """theta[p, i] = pos * freq_scale * base^(-2i/n_rot), float32 [n, n_rot/2], computed as ggml does:
    the per-pair factor advances by repeated float32 multiplication (ggml_rope_cache_init). With YaRN's
    ``ext_factor``, pair i mixes the interpolated angle with the extrapolated one (ggml's rope_yarn):
    ramp = 1 - clamp((i - lo) / max(0.001, hi - lo), 0, 1), mix = ramp * ext_factor."""
    f32 = np.float32
    theta_scale = f32(f32(freq_base) ** f32(-2.0 / n_rot))
    theta = positions.astype(np.float32)
    out = np.empty((len(positions), n_rot // 2), dtype=np.float32)
    ff = None if freq_factors is None else np.asarray(freq_factors, dtype=np.float32).reshape(-1)
    lo, hi = f32(corr_dims[0]), f32(corr_dims[1])
    for i in range(n_rot // 2):
        extrap = theta if ff is None else theta / ff[i]
        out[:, i] = f32(freq_scale) * extrap
        if ext_factor != 0.0:
            y = (f32(i) - lo) / max(f32(0.001), f32(hi - lo))
            mix = f32(f32(1.0) - min(f32(1.0), max(f32(0.0), y))) * f32(ext_factor)
            out[:, i] = out[:, i] * (f32(1.0) - mix) + extrap * mix
        theta = theta * theta_scale
    return out


class NumpyBackend:
    """The reference implementation of :class:`llmedge.backends.base.Backend`."""

    name = "numpy"

    def __init__(self, n_threads: int | None = None) -> None:
        self.n_threads = n_threads

    def prepare(self, tensor: TensorInfo) -> NumpyWeight | np.ndarray:
        if len(tensor.dims) == 1:
            return dequantize(tensor.data, tensor.ggml_type, tensor.shape)
        return NumpyWeight(tensor)

    def matmul(self, x: np.ndarray, w: NumpyWeight) -> np.ndarray:
        if w.vec_dot_type == T.Q8_1:
            return q8_1_product(x, w)
        return f64_product(round_activations(x, w.vec_dot_type), w.f32)

    def get_rows(self, w: NumpyWeight, ids: np.ndarray) -> np.ndarray:
        return w.rows(np.asarray(ids, dtype=np.int64))

    def rms_norm(self, x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
        ms = np.mean(np.square(x, dtype=np.float64), axis=-1, keepdims=True)
        return (x / np.sqrt(ms + eps)).astype(np.float32) * weight

    def rope(self, x: np.ndarray, positions: np.ndarray, n_rot: int, freq_base: float,
             freq_scale: float, neox: bool, freq_factors: np.ndarray | None = None,
             attn_factor: float = 1.0, ext_factor: float = 0.0,
             corr_dims: tuple[float, float] = (0.0, 0.0)) -> np.ndarray:
        """ggml's rope_ext: ``freq_factors`` divide each pair's angle, ``ext_factor`` and ``corr_dims``
        are YaRN's ramp (:func:`rope_angles`), ``attn_factor`` is the final multiplier of cos and sin
        (YaRN's mscale already folded in by the caller, see ``models.spec.yarn_mscale``)."""
        theta = rope_angles(positions, n_rot, freq_base, freq_scale, freq_factors, ext_factor,
                            corr_dims)[:, None, :]
        cos, sin = f64_op(np.cos, theta), f64_op(np.sin, theta)
        if attn_factor != 1.0:  # ggml's rope_yarn: mscale multiplies cos and sin
            cos, sin = cos * np.float32(attn_factor), sin * np.float32(attn_factor)
        out = x.copy()
        if neox:
            half = n_rot // 2
            x0, x1 = x[..., :half], x[..., half:n_rot]
            out[..., :half] = x0 * cos - x1 * sin
            out[..., half:n_rot] = x0 * sin + x1 * cos
        else:
            x0, x1 = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
            out[..., 0:n_rot:2] = x0 * cos - x1 * sin
            out[..., 1:n_rot:2] = x0 * sin + x1 * cos
        return out

    def attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, q_pos: np.ndarray,
                  k_pos: np.ndarray, scale: float, window: int | None = None,
                  softcap: float | None = None) -> np.ndarray:
        n, n_head, d = q.shape
        n_kv_head = k.shape[1]
        group = n_head // n_kv_head
        visible = (k_pos[None, :] <= q_pos[:, None]) & (k_pos[None, :] >= 0)
        if window is not None:
            visible &= (q_pos[:, None] - k_pos[None, :]) < window
        out = np.empty((n, n_head, v.shape[2]), dtype=np.float32)
        kf = k.astype(np.float64)
        vf = v.astype(np.float64)
        # ggml multiplies an F16 cache by activations rounded to F16 (its F16 vec_dot partner)
        if k.dtype == np.float16:
            def half(a: np.ndarray) -> np.ndarray:
                return a.astype(np.float16).astype(np.float64)
        else:
            def half(a: np.ndarray) -> np.ndarray:
                return a.astype(np.float32).astype(np.float64)
        q = half(q)
        for h in range(n_kv_head):
            qh = q[:, h * group : (h + 1) * group, :].transpose(1, 0, 2)  # [group, n, d]
            # scores and softmax in float64, rounded to float32 where ggml's softmax input is
            s = (qh @ kf[:, h, :].T).astype(np.float32).astype(np.float64)  # [group, n, t]
            if softcap:  # llama.cpp without flash attention: cap the raw scores, then scale
                s = np.tanh(s / softcap).astype(np.float32).astype(np.float64) * softcap
            s = s * scale
            s = np.where(visible[None], s, -np.inf)
            s = s - s.max(axis=-1, keepdims=True)
            p = np.exp(s)
            p /= p.sum(axis=-1, keepdims=True)
            out[:, h * group : (h + 1) * group, :] = (half(p) @ vf[:, h, :]).transpose(1, 0, 2)  # rounds to f32
        return out

    def glu(self, gate: np.ndarray, up: np.ndarray, kind: GluKind) -> np.ndarray:
        act = silu(gate).astype(np.float32) if kind == "silu" else gelu_ggml(gate)
        return (act * up).astype(np.float32)
