"""llama-quantize's per-tensor type rules: which GGML type each tensor of a file gets for a mix.

This module owns the decisions of llama.cpp's ``llama-quant.cpp`` (``llama_tensor_get_type``):
the file types (``LLAMA_FTYPE_*``) and their default tensor type, which tensors may be quantized
at all, the output / token-embedding choices, the attn_v / ffn_down / attn_output bumps of the
K-quant mixes (counted in llama.cpp's tensor order), ``--pure``, ``--tensor-type`` overrides and
the fallbacks for rows that the block size does not divide. It decides types only; encoding and
writing live in :mod:`.gguf_quantize`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gguf.constants import GGMLQuantizationType as T

from .layout import BLOCK_SIZES

__all__ = ["FTYPES", "MixParams", "ModelInfo", "TypePlanner", "ftype_from_name", "parse_type", "tensor_order_key"]

#: llama.h's ``llama_ftype`` values by llama-quantize's name, with the default tensor type.
FTYPES: dict[str, tuple[int, T]] = {
    "F32": (0, T.F32), "F16": (1, T.F16), "BF16": (32, T.BF16),
    "Q4_0": (2, T.Q4_0), "Q4_1": (3, T.Q4_1), "Q5_0": (8, T.Q5_0), "Q5_1": (9, T.Q5_1), "Q8_0": (7, T.Q8_0),
    "Q2_K": (10, T.Q2_K), "Q2_K_S": (21, T.Q2_K),
    "Q3_K_S": (11, T.Q3_K), "Q3_K_M": (12, T.Q3_K), "Q3_K_L": (13, T.Q3_K),
    "Q4_K_S": (14, T.Q4_K), "Q4_K_M": (15, T.Q4_K), "Q5_K_S": (16, T.Q5_K), "Q5_K_M": (17, T.Q5_K),
    "Q6_K": (18, T.Q6_K), "IQ4_NL": (25, T.IQ4_NL), "IQ4_XS": (30, T.IQ4_XS),
}  # fmt: skip
_ALIASES = {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M"}
_FT = {name: value for name, (value, _) in FTYPES.items()}

# The tensor categories of llama-quant.cpp's tensor_get_category, by substring, in its order.
_CATEGORIES = (
    ("attn_qkv.weight", "qkv"), ("attn_kv_b.weight", "kv_b"), ("attn_v.weight", "v"), ("attn_k.weight", "k"),
    ("attn_q.weight", "q"), ("attn_output.weight", "attn_output"), ("ffn_up", "ffn_up"),
    ("ffn_gate", "ffn_gate"), ("ffn_down", "ffn_down"),
)  # fmt: skip
_ATTN_V = ("v", "qkv", "kv_b")
# Substrings of names that are never quantized (besides 1-D tensors and *_norm.weight).
_KEEP = (
    "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel", "per_layer_model_proj",
    "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight", "indexer.q_proj.weight",
    "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight", "time_mix_w2.weight",
    "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight", "time_mix_a0.weight",
    "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight", "time_mix_g2.weight",
    "time_mix_decay_w1.weight", "time_mix_decay_w2.weight", "time_mix_lerp_fused.weight",
    "attn_rel_b.weight", ".position_embd", "sam.pos_embd", "sam.neck.", "sam.net_", ".rel_pos",
    ".patch_embd", ".patch_merger", "a.rvq.codebook", "mm.a.code_embd",
)  # fmt: skip
_FALLBACK = {T.IQ4_XS: T.IQ4_NL, T.Q2_K: T.Q4_0, T.Q3_K: T.Q4_0, T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0}
_UNQUANTIZED = frozenset({T.F32, T.F16, T.BF16, T.F64, T.I8, T.I16, T.I32, T.I64})


def ftype_from_name(name: str) -> str:
    """llama-quantize's mix name for ``name`` (case-insensitive, ``Q4_K`` means ``Q4_K_M``)."""
    key = name.upper()
    key = _ALIASES.get(key, key)
    if key not in FTYPES:
        raise ValueError(f"unknown quantization type {name!r} (one of: {', '.join(FTYPES)})")
    return key


def parse_type(name: str) -> T:
    """A GGML tensor type by name, as ``--output-tensor-type`` and ``--tensor-type`` take it."""
    try:
        return T[name.upper()]
    except KeyError:
        raise ValueError(f"unknown tensor type {name!r}") from None


def tensor_order_key(name: str) -> tuple[int, str]:
    """llama.cpp's weight_name_comparer: block number (-1 outside blocks), then the name."""
    m = re.match(r"blk\.(-?\d+)\.", name)
    return (int(m.group(1)) if m else -1, name)


def category(name: str) -> str:
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    for needle, cat in _CATEGORIES:
        if needle in name:
            return cat
    return "other"


@dataclass(frozen=True)
class ModelInfo:
    """The hyper-parameters the rules read: architecture, layers, heads, KV heads, experts."""

    arch: str
    n_layer: int
    n_head: int
    n_head_kv: int
    n_expert: int = 0

    @property
    def n_gqa(self) -> int:
        return self.n_head // self.n_head_kv if self.n_head_kv else 0

    @property
    def is_70b(self) -> bool:
        return self.arch == "llama" and self.n_layer == 80 and self.n_head != self.n_head_kv


@dataclass
class MixParams:
    """The options of ``llama_model_quantize_params`` that decide types."""

    ftype: str
    output_tensor_type: T | None = None
    token_embedding_type: T | None = None
    quantize_output_tensor: bool = True
    pure: bool = False
    tensor_types: list[tuple[str, T]] = field(default_factory=list)
    has_imatrix: bool = False


def _pattern(p: str) -> re.Pattern[str]:
    """A tensor-type regex; a bad one is a ValueError naming it (re.error is not a ValueError)."""
    try:
        return re.compile(p)
    except re.error as e:
        raise ValueError(f"bad tensor-type pattern {p!r}: {e}") from None


class TypePlanner:
    """Chooses each tensor's type; call :meth:`target_type` once per tensor in llama.cpp's order."""

    def __init__(self, model: ModelInfo, params: MixParams, names: list[str]) -> None:
        self.m, self.p = model, params
        self.ft = _FT[params.ftype]
        self.default = FTYPES[params.ftype][1]
        self.patterns = [(_pattern(p), t) for p, t in params.tensor_types]
        cats = [category(n) for n in names]
        self.n_attention_wv = sum(c in _ATTN_V for c in cats)
        self.tied = "output" not in cats
        self.i_attention_wv = self.i_ffn_down = self.i_ffn_gate = self.i_ffn_up = 0
        self.n_fallback = 0

    def allows_quantization(self, name: str, n_dims: int) -> bool:
        if n_dims < 2 or not name.endswith("weight") or "_norm.weight" in name:
            return False
        if not self.p.quantize_output_tensor and name == "output.weight":
            return False
        if name in ("position_embd.weight", "token_types.weight"):
            return False
        return not any(s in name for s in _KEEP)

    def requires_imatrix(self, name: str, t: T) -> bool:
        if category(name) in ("token_embd", "output"):
            return False
        return t == T.Q2_K and self.ft == _FT["Q2_K_S"]

    def target_type(self, name: str, cur: T, shape: list[int]) -> T:
        """The type llama-quantize gives tensor ``name`` (current type ``cur``, ggml ne order)."""
        n_dims = max([i + 1 for i, d in enumerate(shape) if d != 1], default=1)
        if not self.allows_quantization(name, n_dims):
            return cur
        cat = category(name)
        if self.p.token_embedding_type is not None and cat == "token_embd":
            if not (name == "per_layer_token_embd.weight" and any(r.search(name) for r, _ in self.patterns)):
                return self.p.token_embedding_type
        if self.p.output_tensor_type is not None and cat == "output":
            return self.p.output_tensor_type
        new = self.default
        if new in _UNQUANTIZED:
            return new
        manual = False
        for rx, t in self.patterns:
            if rx.search(name):
                new, manual = t, True
                break
        if not manual and not self.p.pure:
            new = self._mix_type(new, name, cat, shape)
        return self._fallback(new, shape[0])

    def _fallback(self, t: T, ncols: int) -> T:
        block = BLOCK_SIZES[t][0]
        if ncols % block == 0:
            return t
        self.n_fallback += 1
        if t in _FALLBACK:
            out = _FALLBACK[t]
        elif block <= 32:
            out = t
        else:
            raise ValueError(f"no tensor type fallback is defined for type {t.name}")
        return out if ncols % BLOCK_SIZES[out][0] == 0 else T.F16

    @staticmethod
    def _more_bits(i: int, n: int) -> bool:
        return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2

    def _layer(self, i: int, name: str) -> int:
        if max(1, self.m.n_expert) > 1:
            m = re.match(r"blk\.(\d+)\.", name)
            if not m or int(m.group(1)) >= self.m.n_layer:
                raise ValueError(f"failed to determine layer for tensor {name}")
            return int(m.group(1))
        return i

    def _mix_type(self, new: T, name: str, cat: str, shape: list[int]) -> T:
        ft, F, m = self.ft, _FT, self.m
        falcon = m.arch == "falcon"
        if cat == "output" or (self.tied and cat == "token_embd"):
            if self.p.output_tensor_type is not None:
                return self.p.output_tensor_type
            if falcon or shape[0] % BLOCK_SIZES[new][0] != 0:
                return T.Q8_0
            return new if new == T.Q8_0 else T.Q6_K
        if cat == "token_embd":
            if self.p.token_embedding_type is not None:
                return self.p.token_embedding_type
            return new
        if cat in _ATTN_V:
            if ft == F["Q2_K"]:
                new = T.Q4_K if m.n_gqa >= 4 else T.Q3_K
            elif ft == F["Q2_K_S"] and m.n_gqa >= 4:
                new = T.Q4_K
            elif ft == F["Q3_K_M"]:
                new = T.Q5_K if self.i_attention_wv < 2 else T.Q4_K
            elif ft == F["Q3_K_L"]:
                new = T.Q5_K
            elif ft in (F["IQ4_NL"], F["IQ4_XS"]) and m.n_gqa >= 4:
                new = T.Q5_K
            elif ft in (F["Q4_K_M"], F["Q5_K_M"]) and self._more_bits(self.i_attention_wv, self.n_attention_wv):
                new = T.Q6_K
            elif ft == F["Q4_K_S"] and self.i_attention_wv < 4:
                new = T.Q5_K
            if m.is_70b and new in (T.Q3_K, T.Q4_K):
                new = T.Q5_K
            if m.n_expert == 8:
                new = T.Q8_0
            self.i_attention_wv += 1
        elif cat == "k":
            if m.n_expert == 8:
                new = T.Q8_0
        elif cat == "ffn_down":
            new = self._ffn_down(new, name)
        elif cat == "attn_output":
            new = self._attn_output(new)
        elif cat == "qkv":  # unreachable: attn_qkv is attn_v-like (kept for llama.cpp parity)
            pass
        elif cat == "ffn_gate":
            self._layer(self.i_ffn_gate, name)
            self.i_ffn_gate += 1
        elif cat == "ffn_up":
            self._layer(self.i_ffn_up, name)
            self.i_ffn_up += 1
        return new

    def _ffn_down(self, new: T, name: str) -> T:
        ft, F, m = self.ft, _FT, self.m
        i, n = self._layer(self.i_ffn_down, name), self.m.n_layer
        falcon = m.arch == "falcon"
        if ft == F["Q2_K"]:
            new = T.Q3_K
        elif ft == F["Q2_K_S"]:
            if i < n // 8:
                new = T.Q4_K
        elif ft == F["Q3_K_M"]:
            new = T.Q5_K if i < n // 16 else (T.Q4_K if not falcon or self._more_bits(i, n) else T.Q3_K)
        elif ft == F["Q3_K_L"]:
            new = T.Q4_K if falcon else T.Q5_K
        elif ft == F["Q4_K_M"]:
            if falcon:
                new = T.Q6_K if i < n // 16 else (T.Q5_K if self._more_bits(i, n) else T.Q4_K)
            elif self._more_bits(i, n):
                new = T.Q6_K
        elif i < n // 8 and ft in (F["IQ4_NL"], F["IQ4_XS"]) and not self.p.has_imatrix:
            new = T.Q5_K
        elif ft == F["Q5_K_M"] and self._more_bits(i, n):
            new = T.Q6_K
        elif ft == F["Q4_K_S"] and not falcon and i < n // 8:
            new = T.Q5_K
        elif ft in (F["Q4_0"], F["Q5_0"]) and self.p.has_imatrix and i < n // 8:
            new = T.Q4_1 if ft == F["Q4_0"] else T.Q5_1
        self.i_ffn_down += 1
        return new

    def _attn_output(self, new: T) -> T:
        ft, F, m = self.ft, _FT, self.m
        if m.arch != "falcon":
            if m.n_expert == 8:
                if ft in (F["Q2_K"], F["Q3_K_S"], F["Q3_K_M"], F["IQ4_NL"], F["Q4_K_S"], F["Q4_K_M"], F["IQ4_XS"]):
                    new = T.Q5_K
            elif ft == F["Q2_K"]:
                new = T.Q3_K
            elif ft == F["Q3_K_M"]:
                new = T.Q4_K
            elif ft == F["Q3_K_L"]:
                new = T.Q5_K
        elif ft == F["Q3_K_L"]:
            new = T.Q4_K
        return new
