"""The declarative architecture spec: what a family is, read once from the GGUF, used by every backend.

A family (``models/<arch>.py``) is a :class:`Family`: the features its layers use (Q/K/V biases,
per-head Q/K norms, fused QKV / gate-up tensors, post-norms, GLU kind, RoPE layout, scaling (linear,
YaRN) and frequency factors, sliding-window pattern, soft-caps, embedding scale, query scaling). :class:`HParams` is the
one shared reader of hyper-parameters (keys and defaults as llama.cpp's loader reads them).
:func:`layer_specs` combines the two into one :class:`LayerSpec` per layer, and
:func:`layer_tensors` lists each layer's tensors (typed as weight / bias / norm, optional ones
explicit). The op-by-op forward (``models.base``), hence the numba and NumPy backends, and the
native fused stack all read the :class:`LayerSpec`; the fused stack declines a spec it does not
fully encode (``llmedge.backends.native._StackPlan.decline_reason``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from llmedge.backends.base import GluKind
from llmedge.errors import ModelError
from llmedge.gguf import GGUFFile

Need = Literal["none", "optional", "required"]
RopeFactors = Literal["none", "freqs", "longrope"]
QScale = Literal["none", "head_dim"]


@dataclass
class HParams:
    """Hyper-parameters of any family, read by one reader with llama.cpp's keys and defaults."""

    arch: str
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_head: int
    n_kv_head: int
    head_dim: int
    n_ff: int
    n_rot: int
    eps: float
    rope_base: float
    rope_base_swa: float | None
    rope_scaling: str  # none | linear | yarn | longrope
    rope_scale: float  # freq_scale = 1 / factor (linear, yarn), else 1
    rope_attn_factor: float  # ggml's attn_factor (llama.cpp's cparams.yarn_attn_factor): scales cos and sin
    n_ctx_orig: int  # rope.scaling.original_context_length: LongRoPE's long factors beyond it, YaRN's corr dims
    window: int | None
    swa_pattern: int | list[bool] | None
    attn_softcap: float | None
    final_softcap: float | None
    embedding_scale: float = 0.0  # Granite's multipliers (0: none), read when the family declares them
    residual_scale: float = 0.0
    attention_scale: float = 0.0  # replaces 1/sqrt(head_dim) as the attention score scale
    logit_scale: float = 0.0  # logits are divided by it
    rope_ext_factor: float = 0.0  # YaRN's extrapolation mix (1 for rope.scaling.type yarn, else 0)
    yarn_beta_fast: float = 32.0  # YaRN's correction-range betas (llama.cpp's defaults; these families
    yarn_beta_slow: float = 1.0  # do not read rope.scaling.yarn_beta_* from the file)

    @classmethod
    def read(cls, g: GGUFFile, family: Family) -> HParams:
        a = g.architecture
        n_embd = g.get_int(f"{a}.embedding_length")
        n_head = g.get_int(f"{a}.attention.head_count")
        head_dim = g.get_int(f"{a}.attention.key_length", n_embd // n_head)
        n_ctx_train = g.get_int(f"{a}.context_length")
        kind = g.get(f"{a}.rope.scaling.type", "linear")  # llama.cpp's default: a bare factor scales linearly
        factor = g.get(f"{a}.rope.scaling.factor", None) or g.get(f"{a}.rope.scale_linear", 0.0) or 0.0
        if kind not in ("none", "linear", "yarn", "longrope"):
            raise ModelError(f"RoPE scaling '{kind}' is not supported (supported: none, linear, yarn, longrope)")
        freq_scale = 1.0 / factor if kind != "none" and factor > 0 else 1.0
        attn_factor = float(g.get(f"{a}.rope.scaling.attn_factor", 1.0) or 1.0)
        ext_factor = 1.0 if kind == "yarn" else 0.0
        if ext_factor:
            attn_factor = yarn_attn_factor(freq_scale, attn_factor)
        pattern = g.get(f"{a}.attention.sliding_window_pattern")
        scales = {}
        if family.file_scales:
            scales = {"embedding_scale": g.get_float(f"{a}.embedding_scale", 0.0),
                      "residual_scale": g.get_float(f"{a}.residual_scale", 0.0),
                      "attention_scale": g.get_float(f"{a}.attention.scale", 0.0),
                      "logit_scale": g.get_float(f"{a}.logit_scale")}
        return cls(
            arch=a,
            n_vocab=len(g.get_array("tokenizer.ggml.tokens")),
            n_ctx_train=n_ctx_train,
            n_embd=n_embd,
            n_layer=g.get_int(f"{a}.block_count"),
            n_head=n_head,
            n_kv_head=g.get_int(f"{a}.attention.head_count_kv", n_head),
            head_dim=head_dim,
            n_ff=g.get_int(f"{a}.feed_forward_length"),
            n_rot=g.get_int(f"{a}.rope.dimension_count", head_dim),
            eps=g.get_float(f"{a}.attention.layer_norm_rms_epsilon"),
            rope_base=g.get_float(f"{a}.rope.freq_base", family.rope_base),
            rope_base_swa=g.get(f"{a}.rope.freq_base_swa"),
            rope_scaling=kind,
            rope_scale=freq_scale,
            rope_attn_factor=attn_factor,
            rope_ext_factor=ext_factor,
            n_ctx_orig=int(g.get(f"{a}.rope.scaling.original_context_length", 0) or n_ctx_train),
            window=g.get(f"{a}.attention.sliding_window", family.default_window),
            swa_pattern=pattern if pattern is None or isinstance(pattern, int) else [bool(x) for x in pattern],
            attn_softcap=(g.get(f"{a}.attn_logit_softcapping", family.attn_softcap) if family.attn_softcap
                          else None),
            final_softcap=(g.get(f"{a}.final_logit_softcapping", family.final_softcap) if family.final_softcap
                           else None),
            **scales,
        )


def yarn_attn_factor(freq_scale: float, rope_attn_factor: float = 1.0) -> float:
    """llama.cpp's ``cparams.yarn_attn_factor`` for a YaRN file (float32 as its context computes it):
    get_mscale(factor) = 1 + 0.1 ln(factor), divided by the 1 + 0.1 ln(factor) that ggml's rope_yarn
    multiplies in again, times ``rope.scaling.attn_factor``. (``yarn_log_multiplier`` is DeepSeek-2's
    only; llama.cpp's qwen2/qwen3/llama loaders read no other YaRN key.)"""
    f32 = np.float32
    factor = f32(1.0) / f32(freq_scale)
    if factor <= f32(1.0):
        m = f32(1.0)
    else:
        m = f32(f32(0.1) * f32(1.0)) * _logf(factor) + f32(1.0)
    m = f32(m * (f32(1.0) / (f32(1.0) + f32(0.1) * _logf(factor))))
    return float(f32(m * f32(rope_attn_factor)))


def yarn_mscale(attn_factor: float, freq_scale: float) -> float:
    """ggml's rope_yarn magnitude when ext_factor != 0: attn_factor * (1 + 0.1 ln(1 / freq_scale))."""
    f32 = np.float32
    return float(f32(f32(attn_factor) * (f32(1.0) + f32(0.1) * _logf(f32(1.0) / f32(freq_scale)))))


def yarn_corr_dims(n_dims: int, n_ctx_orig: int, freq_base: float, beta_fast: float,
                   beta_slow: float) -> tuple[float, float]:
    """ggml_rope_yarn_corr_dims (float32): the pair range [start, end] over which YaRN ramps from
    extrapolated to interpolated frequencies."""
    f32 = np.float32

    def corr_dim(beta: float) -> np.float32:
        ratio = f32(f32(n_ctx_orig) / f32(f32(f32(beta) * f32(2.0)) * f32(math.pi)))
        return f32(f32(f32(n_dims) * _logf(ratio)) / f32(f32(2.0) * _logf(f32(freq_base))))

    start, end = math.floor(corr_dim(beta_fast)), math.ceil(corr_dim(beta_slow))
    return float(max(0.0, start)), float(min(n_dims - 1.0, end))


def _logf(x: float) -> np.float32:
    return np.float32(math.log(float(np.float32(x))))


@dataclass(frozen=True)
class Family:
    """The features one ``general.architecture`` uses; a new family that combines them is one file."""

    name: str
    neox: bool  # RoPE pairs (i, i + n_rot/2) ("neox") or adjacent (2i, 2i+1) ("normal")
    glu: GluKind = "silu"
    rope_base: float = 10000.0  # when the file has no rope.freq_base
    qkv_bias: Need = "none"
    o_bias: Need = "none"
    qk_norm: bool = False  # RMSNorm over each head of Q and K before RoPE
    fused_qkv: Need = "none"  # attn_qkv (Q, K, V rows stacked) instead of attn_q/k/v
    fused_gate_up: bool = False  # ffn_up holds gate rows then up rows (2 * n_ff)
    post_norms: bool = False  # RMSNorm on the attention and FFN outputs before each residual
    embd_scale: bool = False  # embeddings times sqrt(n_embd)
    q_scale: QScale = "none"  # "head_dim": Q * 1/sqrt(head_dim) before attention, which then uses scale 1
    rope_factors: RopeFactors = "none"  # reads rope_freqs (Llama 3) or LongRoPE's long/short factors
    swa: Callable[[HParams], list[bool]] | None = None  # which layers use the sliding window
    swa_rope_base: float | None = None  # RoPE base of sliding-window layers when the file has none
    default_window: int | None = None
    attn_softcap: float | None = None  # default when the family soft-caps attention scores
    final_softcap: float | None = None  # default when the family soft-caps the logits
    file_scales: bool = False  # Granite: embedding, residual, attention and logit scales from the file


def swa_every(period: int) -> Callable[[HParams], list[bool]]:
    """llama.cpp's ``set_swa_pattern(n)``: layer il slides unless il % n == n - 1; a per-layer list or a
    period in the file (``attention.sliding_window_pattern``) wins over ``period``."""

    def pattern(hp: HParams) -> list[bool]:
        p = hp.swa_pattern
        if isinstance(p, list):
            return (p + [False] * hp.n_layer)[: hp.n_layer]
        n = p if isinstance(p, int) and p > 0 else period
        return [il % n < n - 1 for il in range(hp.n_layer)]

    return pattern


@dataclass
class LayerSpec:
    """How one layer computes (every backend reads this; mutable so tests can shrink a window)."""

    n_head: int
    n_kv_head: int
    head_dim: int
    n_rot: int
    n_ff: int
    rope_base: float
    rope_scale: float
    neox: bool
    scale: float  # attention score scale (after soft-capping)
    eps: float
    glu: GluKind = "silu"
    window: int | None = None
    softcap: float | None = None
    q_scale: float = 1.0  # multiplies Q after RoPE, before the cache-typed product (Gemma's query scaling)
    rope_factors: RopeFactors = "none"
    rope_attn_factor: float = 1.0  # the final multiplier of cos and sin (YaRN's mscale folded in)
    rope_ext_factor: float = 0.0  # YaRN: angle = interp * (1 - ramp * ext) + extrap * ramp * ext
    rope_corr_dims: tuple[float, float] = (0.0, 0.0)  # YaRN's ramp range over pair indices
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    fused_qkv: bool = False
    fused_gate_up: bool = False
    post_norms: bool = False
    residual_scale: float = 1.0  # multiplies the attention and FFN outputs before each residual add

    @property
    def rope(self) -> tuple[int, float, float, bool]:
        """What a context shift needs to re-rotate this layer's keys (plus factors and YaRN's
        :attr:`yarn` when used, see ``models.base.cache_rope``)."""
        return (self.n_rot, self.rope_base, self.rope_scale, self.neox)

    @property
    def yarn(self) -> tuple[float, float, float] | None:
        """(ext_factor, corr_lo, corr_hi) of a YaRN layer, else None."""
        return (self.rope_ext_factor, *self.rope_corr_dims) if self.rope_ext_factor != 0.0 else None

    def used_features(self) -> list[str]:
        """The declared features this layer uses (names as ``llmedge show`` and the stack plan say them)."""
        yarn = self.rope_ext_factor != 0.0
        names = [("qkv_bias", self.qkv_bias), ("o_bias", self.o_bias), ("qk_norm", self.qk_norm),
                 ("fused_qkv", self.fused_qkv), ("fused_gate_up", self.fused_gate_up),
                 ("post_norms", self.post_norms), ("sliding_window", self.window is not None),
                 ("attn_softcap", self.softcap is not None), ("q_scale", self.q_scale != 1.0),
                 (f"rope_{self.rope_factors}", self.rope_factors != "none"), ("rope_yarn", yarn),
                 ("rope_attn_factor", self.rope_attn_factor != 1.0 and not yarn),
                 ("rope_linear", self.rope_scale != 1.0 and not yarn),
                 ("residual_scale", self.residual_scale != 1.0)]
        return [n for n, on in names if on]


@dataclass(frozen=True)
class TensorDecl:
    """One tensor of a layer: GGUF suffix after ``blk.N.``, its kind and whether the file must have it."""

    name: str
    kind: Literal["weight", "bias", "norm"]
    required: bool = True

    @property
    def key(self) -> str:
        """The layer dict key: the short name for weights and norms, ``<short>.bias`` for biases."""
        return self.name[: -len(".weight")] if self.name.endswith(".weight") else self.name


def layer_tensors(f: Family) -> tuple[TensorDecl, ...]:
    """The tensors a layer of family ``f`` may have (optional ones marked), in load order."""
    W, B, N = "weight", "bias", "norm"
    out = [TensorDecl("attn_norm.weight", N)]
    if f.fused_qkv != "none":
        out.append(TensorDecl("attn_qkv.weight", W, f.fused_qkv == "required"))
    qkv_req = f.fused_qkv == "none"
    out += [TensorDecl(f"attn_{x}.weight", W, qkv_req) for x in "qkv"]
    if f.qkv_bias != "none":
        out += [TensorDecl(f"attn_{x}.bias", B, f.qkv_bias == "required") for x in "qkv"]
    if f.qk_norm:
        out += [TensorDecl("attn_q_norm.weight", N), TensorDecl("attn_k_norm.weight", N)]
    out.append(TensorDecl("attn_output.weight", W))
    if f.o_bias != "none":
        out.append(TensorDecl("attn_output.bias", B, f.o_bias == "required"))
    if f.post_norms:
        out.append(TensorDecl("post_attention_norm.weight", N))
    out.append(TensorDecl("ffn_norm.weight", N))
    if not f.fused_gate_up:
        out.append(TensorDecl("ffn_gate.weight", W))
    out += [TensorDecl("ffn_up.weight", W), TensorDecl("ffn_down.weight", W)]
    if f.post_norms:
        out.append(TensorDecl("post_ffw_norm.weight", N))
    return tuple(out)


def layer_specs(f: Family, hp: HParams, present: Callable[[str], bool]) -> list[LayerSpec]:
    """One :class:`LayerSpec` per layer; ``present(name)`` says whether the file has a tensor."""
    swa = f.swa(hp) if f.swa else [False] * hp.n_layer
    if any(swa) and not hp.window:
        raise ModelError(f"{hp.arch}: sliding-window layers but no attention.sliding_window")
    q_scale = 1.0 / math.sqrt(hp.head_dim) if f.q_scale == "head_dim" else 1.0
    scale = 1.0 if f.q_scale == "head_dim" else hp.attention_scale or 1.0 / math.sqrt(hp.head_dim)
    base_swa = f.swa_rope_base or hp.rope_base_swa or hp.rope_base
    factors: RopeFactors = "none"
    if f.rope_factors != "none" and present("rope_freqs.weight"):
        factors = "freqs"
    elif f.rope_factors != "none" and present("rope_factors_long.weight"):
        factors = "longrope"
    specs = []
    for il in range(hp.n_layer):
        s = swa[il]
        fused = f.fused_qkv != "none" and present(f"blk.{il}.attn_qkv.weight")
        base = base_swa if s else hp.rope_base
        fscale = 1.0 if s and f.swa_rope_base else hp.rope_scale
        mscale, corr = hp.rope_attn_factor, (0.0, 0.0)
        if hp.rope_ext_factor != 0.0:  # YaRN (ggml_rope_ext with ext_factor): ramp range and magnitude
            corr = yarn_corr_dims(hp.n_rot, hp.n_ctx_orig, base, hp.yarn_beta_fast, hp.yarn_beta_slow)
            mscale = yarn_mscale(hp.rope_attn_factor, fscale)
        specs.append(LayerSpec(
            hp.n_head, hp.n_kv_head, hp.head_dim, hp.n_rot, hp.n_ff,
            rope_base=base,
            rope_scale=fscale,
            neox=f.neox, scale=scale, eps=hp.eps, glu=f.glu,
            window=hp.window if s else None, softcap=hp.attn_softcap, q_scale=q_scale,
            rope_factors=factors, rope_attn_factor=mscale, rope_ext_factor=hp.rope_ext_factor,
            rope_corr_dims=corr,
            qkv_bias=f.qkv_bias != "none" and present(f"blk.{il}.attn_q.bias"),
            o_bias=f.o_bias != "none" and present(f"blk.{il}.attn_output.bias"),
            qk_norm=f.qk_norm, fused_qkv=fused, fused_gate_up=f.fused_gate_up, post_norms=f.post_norms,
            residual_scale=hp.residual_scale or 1.0,
        ))
    return specs
