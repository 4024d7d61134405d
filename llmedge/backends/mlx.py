"""The MLX backend: the Backend op set on Apple's MLX (Apple Silicon's GPU; MLX's CPU build elsewhere).

Weights come from llmedge's GGUF reader (never ``mx.load``) and are mapped once, at ``prepare``,
onto MLX's affine quantized format where the math allows (see :mod:`llmedge.backends.mlx_quant`);
``mx.quantized_matmul`` then multiplies float32 activations by them. RMS norm, RoPE and attention
use ``mx.fast``. The protocol's ops take and return NumPy arrays (the op-by-op path); the whole
stack of a step runs in :meth:`MlxBackend.decoder_layers` on MLX arrays. A decode step (one row per
sequence, f16/f32 cache) is one compiled function over every layer and the head, evaluated once:
each layer's past cells go in (padded, so the trace is reused for 256 tokens), the new K/V rows
come out and are written to llmedge's own KV cache, and the model's following head calls get the
step's results back. Prompts and q8_0 caches run two compiled functions per layer (before and after
attention) with one evaluation per layer. Either way the KV cache stays llmedge's (its ring, shift,
trim, state and q8_0 cells stay one implementation for every backend).

On MLX's CPU device (its Linux build), a step of at least ``WIDE_ROWS`` rows (a prompt) runs the
same layer functions with their products and attention in float32 through NumPy's BLAS, on the very
values of the MLX-form weights (:mod:`llmedge.backends.mlx_wide` says why and what it costs); decode
steps, short steps and everything on the GPU stay on MLX.

Unlike llama.cpp, which quantizes activations to Q8 for its products, MLX computes in float32: the
agreement with llama.cpp is held to tolerances, not bit-exactness.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from llmedge.backends import mlx_wide
from llmedge.backends.base import GluKind, as_f32c
from llmedge.backends.mlx_quant import GROUP, MAPPINGS, REQUANTIZED, affine_rows
from llmedge.gguf import TensorInfo
from llmedge.quant import GGMLQuantizationType as T
from llmedge.quant import dequantize

_CHUNK_VALUES = 1 << 21  # values converted per slice of rows at load (bounds the NumPy temporaries)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def device_name() -> str:
    """``gpu`` or ``cpu``: where MLX runs by default here."""
    return "gpu" if mx.default_device() == mx.gpu else "cpu"


@dataclass
class MlxWeight:
    """A 2-D weight [m, k] in MLX form: affine-quantized codes with scales and biases, or a float matrix."""

    name: str
    ggml_type: int
    shape: tuple[int, int]
    became: str  # what ``llmedge show`` prints: e.g. "affine q4 g32 (exact)"
    w: mx.array
    scales: mx.array | None = None
    biases: mx.array | None = None
    bits: int = 0
    mins: mx.array | None = None  # Q2_K: dmin*m per 16 values, subtracted as x's 16-sums times mins

    def matmul(self, x: mx.array) -> mx.array:
        if self.scales is None:
            return (x.astype(self.w.dtype) @ self.w.T).astype(mx.float32)
        y = mx.quantized_matmul(x, self.w, self.scales, self.biases, transpose=True, group_size=GROUP,
                                bits=self.bits)
        if self.mins is not None:
            y = y - x.reshape(*x.shape[:-1], -1, 16).sum(axis=-1) @ self.mins.T
        return y

    def rows(self, ids: mx.array) -> mx.array:
        if self.scales is None:
            return self.w[ids].astype(mx.float32)
        out = mx.dequantize(self.w[ids], self.scales[ids], self.biases[ids], group_size=GROUP, bits=self.bits)
        if self.mins is not None:
            out = out - mx.repeat(self.mins[ids], 16, axis=-1)
        return out


_FLOAT_DTYPES = {T.F32: mx.float32, T.F16: mx.float16, T.BF16: mx.bfloat16}


def _float_weight(tensor: TensorInfo, m: int, k: int) -> MlxWeight:
    t = T(tensor.ggml_type)
    raw = tensor.rows()
    if t == T.BF16:
        w = mx.array(raw.view(np.uint16).reshape(m, k)).view(mx.bfloat16)
    else:
        w = mx.array(raw.view(np.float32 if t == T.F32 else np.float16).reshape(m, k))
    return MlxWeight(tensor.name, tensor.ggml_type, (m, k), f"{t.name.lower()} (as stored)", w)


def _chunks(m: int, k: int) -> range:
    return range(0, m, max(1, _CHUNK_VALUES // max(k, 1)))


def _affine_weight(tensor: TensorInfo, m: int, k: int) -> MlxWeight:
    t = T(tensor.ggml_type)
    raw = tensor.rows()
    step = max(1, _CHUNK_VALUES // k)
    parts = [affine_rows(raw[i : i + step], t, k) for i in _chunks(m, k)]
    q, s, b = (mx.array(np.concatenate([p[j] for p in parts])) for j in range(3))
    mins = mx.array(np.concatenate([p[3] for p in parts])) if parts[0][3] is not None else None
    bits = MAPPINGS[t].bits
    how = "exact" if bits == traits_bits(t) else "exact, wider codes"
    if mins is not None:
        how = "exact, with per-16 mins"
    return MlxWeight(tensor.name, tensor.ggml_type, (m, k), f"affine q{bits} g{GROUP} ({how})", q, s, b, bits, mins)


def traits_bits(t: T) -> int:
    """The nominal code width of a GGML type (4 for Q4_*, 5 for Q5_*, ...)."""
    return {T.Q4_0: 4, T.Q4_1: 4, T.Q5_0: 5, T.Q5_1: 5, T.Q8_0: 8, T.Q4_K: 4, T.Q5_K: 5}.get(t, 0)


def _fallback_weight(tensor: TensorInfo, m: int, k: int, how: str) -> MlxWeight:
    """A type with no exact affine form: dequantized by the reference, then re-quantized by MLX to
    8-bit codes (``how='q8'``) or kept as float (``'f16'``, ``'bf16'``, ``'f32'``: exact)."""
    t = T(tensor.ggml_type)
    raw = tensor.rows()
    step = max(1, _CHUNK_VALUES // k)
    parts = []
    for i in _chunks(m, k):
        f = mx.array(dequantize(raw[i : i + step], t, (len(raw[i : i + step]), k)))
        part = mx.quantize(f, group_size=GROUP, bits=8) if how == "q8" else (f.astype(_HOW_DTYPES[how]),)
        mx.eval(part)
        parts.append(part)
    arrays = [mx.concatenate([p[j] for p in parts]) for j in range(len(parts[0]))]
    if how != "q8":
        return MlxWeight(tensor.name, tensor.ggml_type, (m, k), f"{how} (dequantized)", arrays[0])
    q, s, b = arrays
    return MlxWeight(tensor.name, tensor.ggml_type, (m, k), f"affine q8 g{GROUP} (re-quantized)", q, s, b, 8)


_HOW_DTYPES = {"f16": mx.float16, "bf16": mx.bfloat16, "f32": mx.float32}


class MlxBackend:
    """:class:`llmedge.backends.base.Backend` on MLX."""

    name = "mlx"

    def __init__(self, n_threads: int | None = None, fallback: dict[T, str] | None = None) -> None:
        self.n_threads = n_threads
        self.device = device_name()
        self.isa = f"device {self.device} (mlx {mx.__version__})"  # what bench reports
        self.fallback = {**REQUANTIZED, **(fallback or {})}
        # steps of this many rows or more multiply through NumPy's BLAS (llmedge.backends.mlx_wide)
        self.wide_rows: int | None = mlx_wide.WIDE_ROWS if self.device == "cpu" else None
        self._prepared: dict[tuple[Any, ...], tuple[Any, MlxWeight]] = {}

    # -- weights -----------------------------------------------------------------------------------
    def prepare(self, tensor: TensorInfo) -> MlxWeight | mx.array:
        if len(tensor.dims) == 1:
            return mx.array(dequantize(tensor.data, tensor.ggml_type, tensor.shape))
        # tied embeddings/output share one conversion; the entry keeps its buffer, so an id reused
        # by a later buffer (after this one is freed) can never return a stale weight
        key = (id(tensor._buffer), tensor.offset, tensor.ggml_type, tuple(tensor.dims))
        hit = self._prepared.get(key)
        if hit is None or hit[0] is not tensor._buffer:
            hit = self._prepared[key] = (tensor._buffer, self._convert(tensor))
        return hit[1]

    def _convert(self, tensor: TensorInfo) -> MlxWeight:
        k = tensor.dims[0]
        m = tensor.n_elements // k
        t = T(tensor.ggml_type)
        if t in _FLOAT_DTYPES:
            return _float_weight(tensor, m, k)
        if k % GROUP:
            raise ValueError(f"{tensor.name}: rows of {k} values do not split into MLX groups of {GROUP}")
        if t in MAPPINGS:
            return _affine_weight(tensor, m, k)
        return _fallback_weight(tensor, m, k, self.fallback.get(t, "q8"))

    def wide(self, n_rows: int) -> bool:
        """Whether a step of ``n_rows`` rows runs its products and attention through NumPy."""
        return self.wide_rows is not None and n_rows >= self.wide_rows

    def weight_report(self) -> dict[str, str]:
        """Per prepared tensor name, what it became (``llmedge show``)."""
        return {w.name: w.became for _, w in self._prepared.values()}

    # -- the protocol's ops (NumPy in, NumPy out) ---------------------------------------------------
    def matmul(self, x: np.ndarray, w: MlxWeight) -> np.ndarray:
        head = getattr(self, "_head", None)
        if head is not None and w is head.output and _same(x, head.normed):
            return head.logits.copy()
        if self.wide(x.shape[0]):
            return mlx_wide.matmul(as_f32c(x), w)
        return _np(w.matmul(mx.array(as_f32c(x))))

    def get_rows(self, w: MlxWeight, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= w.shape[0]):
            raise IndexError(f"row id out of range for {w.name} with {w.shape[0]} rows")
        return _np(w.rows(mx.array(ids.astype(np.int32))))

    def rms_norm(self, x: np.ndarray, weight: mx.array | np.ndarray | None, eps: float) -> np.ndarray:
        head = getattr(self, "_head", None)
        if head is not None and weight is head.norm and float(eps) == head.eps and _same(x, head.x):
            return head.normed.copy()
        w = None if weight is None else mx.array(weight)
        return _np(mx.fast.rms_norm(mx.array(as_f32c(x)), w, eps))

    def rope(self, x: np.ndarray, positions: np.ndarray, n_rot: int, freq_base: float,
             freq_scale: float, neox: bool, freq_factors: np.ndarray | None = None,
             attn_factor: float = 1.0, ext_factor: float = 0.0,
             corr_dims: tuple[float, float] = (0.0, 0.0)) -> np.ndarray:
        if freq_factors is not None or attn_factor != 1.0 or ext_factor != 0.0:
            # per-pair frequency factors (Llama 3, LongRoPE), YaRN's ramp and the YaRN/LongRoPE magnitude
            # factor are rare and cheap at the RoPE step: the reference computes them exactly
            from llmedge.backends.numpy_ref import NumpyBackend

            return NumpyBackend().rope(as_f32c(x), np.asarray(positions), n_rot, freq_base, freq_scale, neox,
                                       freq_factors=freq_factors, attn_factor=attn_factor, ext_factor=ext_factor,
                                       corr_dims=corr_dims)
        return _np(rope(mx.array(as_f32c(x)), mx.array(np.asarray(positions, dtype=np.int32)), n_rot,
                        freq_base, freq_scale, neox))

    def attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, q_pos: np.ndarray,
                  k_pos: np.ndarray, scale: float, window: int | None = None,
                  softcap: float | None = None) -> np.ndarray:
        mask = visible(np.asarray(q_pos), np.asarray(k_pos), window)
        if self.wide(len(q)):
            return mlx_wide.attention(as_f32c(q), np.asarray(k), np.asarray(v), mask, scale, softcap)
        mask = mx.array(mask)
        return _np(attention(mx.array(as_f32c(q)), mx.array(k), mx.array(v), mask, scale, softcap))

    def glu(self, gate: np.ndarray, up: np.ndarray, kind: GluKind) -> np.ndarray:
        return _np(glu(mx.array(as_f32c(gate)), mx.array(as_f32c(up)), kind))

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return _np(mx.array(as_f32c(a)) + mx.array(as_f32c(b)))

    def scale(self, x: np.ndarray, s: float) -> np.ndarray:
        return _np(mx.array(as_f32c(x)) * s)

    def softcap(self, x: np.ndarray, cap: float) -> np.ndarray:
        """``tanh(x / cap) * cap`` (logit soft-capping)."""
        return _np(mx.tanh(mx.array(as_f32c(x)) / cap) * cap)

    # -- the fused stack ---------------------------------------------------------------------------
    def decoder_layers(self, model: Any, x: np.ndarray, step: Any) -> bool:
        """Every layer of ``model`` over the rows ``x`` of ``step``, in place, on MLX arrays. Returns
        False (nothing done) for a layer spec this backend does not know: the op-by-op path runs."""
        plan = getattr(model, "_mlx_stack", None)
        if plan is None:
            plan = model._mlx_stack = _Stack(model) if _Stack.supported(model) else False
        if plan is False:
            return False
        self._head = None
        if plan.decodes(step):
            x[...], self._head = plan.decode(x, step)
        else:
            x[...] = _np(plan.run(mx.array(x), step, self.wide(step.n_rows)))
        return True


def _np(a: mx.array) -> np.ndarray:
    return np.array(a, copy=True)


# ---- the ops on MLX arrays (shared by the protocol methods and the fused stack) -------------------


def rope(x: mx.array, positions: mx.array, n_rot: int, base: float, scale: float, neox: bool) -> mx.array:
    """x [n, heads, d] rotated at ``positions`` [n]: each row is a batch of one at its own offset."""
    n, h, d = x.shape
    y = mx.fast.rope(x.reshape(n, h, 1, d), n_rot, traditional=not neox, base=base, scale=scale,
                     offset=positions)
    return y.reshape(n, h, d)


def visible(q_pos: np.ndarray, k_pos: np.ndarray, window: int | None) -> np.ndarray:
    """The boolean attention mask [n, t]: causal, empty cells (k_pos < 0) hidden, sliding window."""
    m = (k_pos[None, :] <= q_pos[:, None]) & (k_pos[None, :] >= 0)
    if window is not None:
        m &= (q_pos[:, None] - k_pos[None, :]) < window
    return m


def attention(q: mx.array, k: mx.array, v: mx.array, mask: mx.array, scale: float,
              softcap: float | None) -> mx.array:
    """q [n, H, d] over k, v [t, Hkv, d] with a boolean mask [n, t]; float32 [n, H, dv]."""
    if k.dtype == mx.float16:  # ggml multiplies an f16 cache by the query rounded to f16
        q = _f16(q)
    qh = q.transpose(1, 0, 2)[None]
    kh = k.astype(mx.float32).transpose(1, 0, 2)[None]
    vh = v.astype(mx.float32).transpose(1, 0, 2)[None]
    if softcap:  # scores capped before scaling, as llama.cpp without flash attention: not in sdpa
        group = q.shape[1] // k.shape[1]
        kh, vh = mx.repeat(kh, group, axis=1), mx.repeat(vh, group, axis=1)
        s = mx.tanh((qh @ kh.transpose(0, 1, 3, 2)) / softcap) * softcap * scale
        s = mx.where(mask, s, -mx.inf)
        o = mx.softmax(s, axis=-1, precise=True) @ vh
    else:
        o = mx.fast.scaled_dot_product_attention(qh, kh, vh, scale=scale, mask=mask)
    o = o[0].transpose(1, 0, 2)
    return mx.where(mask.any(axis=-1)[:, None, None], o, 0.0)  # a query that sees no key reads zeros


def _f16(x: mx.array) -> mx.array:
    return x.astype(mx.float16).astype(mx.float32)


def gelu_ggml(x: mx.array) -> mx.array:
    """ggml's GELU (tanh form): input and output through f16 (its lookup table), identity past +-10."""
    h = _f16(x)
    y = _f16(0.5 * h * (1.0 + mx.tanh(_SQRT_2_OVER_PI * h * (1.0 + 0.044715 * h * h))))
    return mx.where(x <= -10.0, 0.0, mx.where(x >= 10.0, x, y))


def glu(gate: mx.array, up: mx.array, kind: GluKind) -> mx.array:
    if kind == "silu":
        return gate * mx.sigmoid(gate) * up
    return gelu_ggml(gate) * up


# ---- the whole stack of a step ------------------------------------------------------------------

_KNOWN_WEIGHTS = {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_q_norm", "attn_k_norm", "attn_output",
                  "post_attention_norm", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down", "post_ffw_norm"}
# the layer features (LayerSpec.used_features) the compiled per-layer functions encode; a layer
# using any other (biases, fused tensors, RoPE factors, residual scales) runs op by op
_STACK_FEATURES = {"qk_norm", "post_norms", "sliding_window", "attn_softcap", "q_scale", "rope_linear"}


class _Stack:
    """A model's layers as MLX functions: per layer, a compiled pre-attention part (norm, Q/K/V,
    Q/K norms, RoPE) and post-attention part (output projection, norms, residuals, gated FFN)."""

    @staticmethod
    def supported(model: Any) -> bool:
        layers, specs = getattr(model, "layers", None), getattr(model, "specs", None)
        if not layers or not specs or getattr(model, "glu_kind", None) not in ("silu", "gelu"):
            return False
        for w, spec in zip(layers, specs):
            if not set(w) <= _KNOWN_WEIGHTS or not hasattr(spec, "used_features"):
                return False
            if set(spec.used_features()) - _STACK_FEATURES or spec.glu != model.glu_kind:
                return False
            if not all(isinstance(w[n], MlxWeight) for n in ("attn_q", "attn_k", "attn_v", "attn_output",
                                                            "ffn_gate", "ffn_up", "ffn_down")):
                return False
        return True

    def __init__(self, model: Any) -> None:
        self.eps = float(model.params.eps)
        self.glu_kind = model.glu_kind
        self.layers = list(zip(model.layers, model.specs))
        self._pre = [self._pre_fn(w, s, _mlx_product) for w, s in self.layers]
        self._post = [self._post_fn(w, _mlx_product) for w, _ in self.layers]
        self.pre = [mx.compile(f) for f in self._pre]
        self.post = [mx.compile(f) for f in self._post]
        # wide steps on the CPU device: the same functions with NumPy's products, not compiled
        self.wide_pre = [self._pre_fn(w, s, _numpy_product) for w, s in self.layers]
        self.wide_post = [self._post_fn(w, _numpy_product) for w, _ in self.layers]
        self.norm, self.output = model.output_norm, model.output
        self._decode = mx.compile(self._decode_fn) if isinstance(self.output, MlxWeight) else None

    def _pre_fn(self, w: dict[str, Any], spec: Any, product: Any):
        eps = self.eps

        def pre(x: mx.array, pos: mx.array) -> tuple[mx.array, mx.array, mx.array]:
            n = x.shape[0]
            h = mx.fast.rms_norm(x, w["attn_norm"], eps)
            q = product(w["attn_q"], h).reshape(n, spec.n_head, spec.head_dim)
            k = product(w["attn_k"], h).reshape(n, spec.n_kv_head, spec.head_dim)
            v = product(w["attn_v"], h).reshape(n, spec.n_kv_head, -1)
            if "attn_q_norm" in w:
                q = mx.fast.rms_norm(q, w["attn_q_norm"], eps)
                k = mx.fast.rms_norm(k, w["attn_k_norm"], eps)
            q = rope(q, pos, spec.n_rot, spec.rope_base, spec.rope_scale, spec.neox)
            if spec.q_scale != 1.0:
                q = q * spec.q_scale
            k = rope(k, pos, spec.n_rot, spec.rope_base, spec.rope_scale, spec.neox)
            return q, k, v

        return pre

    def _post_fn(self, w: dict[str, Any], product: Any):
        eps, kind = self.eps, self.glu_kind

        def post(x: mx.array, o: mx.array) -> mx.array:
            h = product(w["attn_output"], o.reshape(x.shape[0], -1))
            if "post_attention_norm" in w:
                h = mx.fast.rms_norm(h, w["post_attention_norm"], eps)
            x = x + h
            h = mx.fast.rms_norm(x, w["ffn_norm"], eps)
            h = product(w["ffn_down"], glu(product(w["ffn_gate"], h), product(w["ffn_up"], h), kind))
            if "post_ffw_norm" in w:
                h = mx.fast.rms_norm(h, w["post_ffw_norm"], eps)
            return x + h

        return post

    def run(self, x: mx.array, step: Any, wide: bool = False) -> mx.array:
        """A step that is not a compiled decode step, layer by layer; ``wide``: the products and
        attention through NumPy (:mod:`llmedge.backends.mlx_wide`)."""
        positions = np.asarray(step.positions)
        pos = mx.array(positions.astype(np.int32))
        pre, post = (self.wide_pre, self.wide_post) if wide else (self.pre, self.post)
        for il, (_, spec) in enumerate(self.layers):
            q, k, v = pre[il](x, pos)
            mx.eval(q, k, v)
            q_np, k_np, v_np = np.asarray(q), np.asarray(k), np.asarray(v)
            parts = []
            for (s, e), b in zip(step.bounds, step.batches):
                layer = b.cache.layers[il]
                if layer.rope is None:  # what a context shift needs to re-rotate this layer's keys
                    from llmedge.models.base import cache_rope

                    layer.rope = cache_rope(spec, None)
                k_all, v_all, k_pos = layer.update_and_fetch(k_np[s:e], v_np[s:e], positions[s:e])
                mask = visible(positions[s:e], k_pos, spec.window)
                if wide:
                    parts.append(mx.array(mlx_wide.attention(q_np[s:e], k_all, v_all, mask, spec.scale, spec.softcap)))
                else:
                    parts.append(attention(q[s:e], mx.array(k_all), mx.array(v_all), mx.array(mask), spec.scale,
                                           spec.softcap))
            o = parts[0] if len(parts) == 1 else mx.concatenate(parts)
            x = post[il](x, o)
        return x

    # -- one decode step: every layer and the head in one compiled function, one evaluation ---------
    def decodes(self, step: Any) -> bool:
        """Whether ``step`` is a decode step the compiled whole-step function encodes: one row per
        sequence, f16 or f32 caches (a q8_0 cache rounds the new row through its own quantizer)."""
        if self._decode is None or step.n_rows != len(step.batches):
            return False
        return all(layer.kv_type in _CACHE_DTYPES for b in step.batches for layer in b.cache.layers)

    def _decode_fn(self, x: mx.array, pos: mx.array, pasts: list) -> tuple:
        """x [B, n_embd] at positions pos [B] (one row per sequence); ``pasts[il][b]`` = (K, V, their
        positions, the cell claimed for the new row) of sequence b's cache at layer il before this
        step (padded with position -1). The new K/V rows are rounded to the cache's type and put in
        their cell, so attention reads the cells as the cache would return them. Returns x, the normed final rows, the logits and each layer's new K, V."""
        new_kv = []
        for il, (_, spec) in enumerate(self.layers):
            q, k, v = self._pre[il](x, pos)
            dt = pasts[il][0][0].dtype
            k, v = k.astype(dt), v.astype(dt)
            parts = []
            for b, (k_past, v_past, kp_past, cell) in enumerate(pasts[il]):
                qp = pos[b : b + 1]
                new = mx.arange(k_past.shape[0]) == cell  # the cell claimed for this row, in cache order
                kp = mx.where(new, qp, kp_past)
                mask = (kp[None, :] <= qp[:, None]) & (kp[None, :] >= 0)
                if spec.window is not None:
                    mask = mask & ((qp[:, None] - kp[None, :]) < spec.window)
                new = new[:, None, None]
                parts.append(attention(q[b : b + 1], mx.where(new, k[b : b + 1], k_past),
                                       mx.where(new, v[b : b + 1], v_past), mask, spec.scale, spec.softcap))
            x = self._post[il](x, parts[0] if len(parts) == 1 else mx.concatenate(parts))
            new_kv.append((k, v))
        h = mx.fast.rms_norm(x, self.norm, self.eps)
        return x, h, self.output.matmul(h), new_kv

    def decode(self, x_np: np.ndarray, step: Any) -> tuple[np.ndarray, _Head]:
        """The decode step (see :meth:`decodes`): claims each cache's cell, runs the compiled
        function with one ``mx.eval``, then writes the new K/V rows into llmedge's cache."""
        positions = np.asarray(step.positions, dtype=np.int32)
        pasts, cells = [], []
        for il, (_, spec) in enumerate(self.layers):
            per_layer, per_cells = [], []
            for bi, b in enumerate(step.batches):
                layer = b.cache.layers[il]
                if layer.rope is None:  # what a context shift needs to re-rotate this layer's keys
                    from llmedge.models.base import cache_rope

                    layer.rope = cache_rope(spec, None)
                start, _, u = layer.reserve(positions[bi : bi + 1])
                per_cells.append((layer, start))
                per_layer.append(_past(layer, u, start))
            pasts.append(per_layer)
            cells.append(per_cells)
        out = self._decode(mx.array(x_np), mx.array(positions), pasts)
        mx.eval(out)
        x, h, logits, new_kv = out
        for (k, v), per_cells in zip(new_kv, cells):
            k_np, v_np = np.asarray(k), np.asarray(v)
            for bi, (layer, start) in enumerate(per_cells):
                layer.k.write(start, k_np[bi : bi + 1])
                layer.v.write(start, v_np[bi : bi + 1])
        x_out = _np(x)
        rows = step.output_rows()
        h_np, logits_np = _np(h), _np(logits)
        if rows is not None:
            h_np, logits_np, x_rows = h_np[rows], logits_np[rows], x_out[rows]
        else:
            x_rows = x_out
        return x_out, _Head(self.norm, self.eps, self.output, x_rows, h_np, logits_np)


def _mlx_product(w: MlxWeight, x: mx.array) -> mx.array:
    return w.matmul(x)


def _numpy_product(w: MlxWeight, x: mx.array) -> mx.array:
    return mx.array(mlx_wide.matmul(np.asarray(x), w))


_CACHE_DTYPES = {"f16": mx.float16, "f32": mx.float32}
_PAD = 256  # past cells are padded to a multiple of this: the compiled step retraces once per 256 tokens


def _past(layer: Any, used: int, new_cell: int) -> tuple[mx.array, mx.array, mx.array, mx.array]:
    """A cache layer's cells [0, used) before this step's row, padded to a multiple of _PAD: K, V,
    positions (the cell just claimed for the new row, stale in a ring, hidden) and that cell."""
    n = -(-used // _PAD) * _PAD
    kp = np.full(n, -1, dtype=np.int32)
    kp[:used] = layer.pos[:used]
    kp[new_cell] = -1
    k = np.zeros((n,) + layer.k.shape[1:], dtype=layer.k.arrays[0].dtype)
    v = np.zeros((n,) + layer.v.shape[1:], dtype=layer.v.arrays[0].dtype)
    k[:used] = layer.k.arrays[0][:used]
    v[:used] = layer.v.arrays[0][:used]
    return mx.array(k), mx.array(v), mx.array(kp), mx.array(np.int32(new_cell))


@dataclass
class _Head:
    """The head a decode step computed: what the model's following ``rms_norm(x, output_norm)`` and
    ``matmul(h, output)`` return when called with these very values (checked, never assumed)."""

    norm: Any
    eps: float
    output: MlxWeight
    x: np.ndarray
    normed: np.ndarray
    logits: np.ndarray


def _same(a: Any, b: np.ndarray) -> bool:
    return isinstance(a, np.ndarray) and a.shape == b.shape and bool(np.array_equal(a, b))
