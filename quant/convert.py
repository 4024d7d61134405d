"""Hugging Face safetensors checkpoints to GGUF, as llama.cpp's convert_hf_to_gguf.py writes them.

Owns ``llmedge convert``'s work, with numpy only (no torch, no transformers): the per-family table
(HF architecture -> GGUF architecture, hyper-parameter keys, tensor rewrites such as Llama's Q/K
row permutation and Gemma's ``norm + 1``), reading ``config.json`` and the (sharded) safetensors
files through ``np.memmap``, and writing with ``gguf.GGUFWriter`` one tensor at a time: the tensor
table is declared first (names, shapes, types are known from the headers), then each tensor is
read, converted and written before the next is touched, so memory holds about one tensor.

Tensor names go through ``gguf``'s own ``TensorNameMap``; output types follow the converter:
1-D tensors, norms and non-``.weight`` tensors stay F32, the rest take ``--outtype`` (``auto``: BF16
when the first 2-D source tensor is BF16, else F16); Q8_0 is encoded by ``llmedge.quant.quantize``
(byte for byte ggml's reference), a row not a multiple of 32 falls back to F16 as llama.cpp's does.
The vocabulary is :mod:`llmedge.quant.convert_vocab`'s; ``general.*`` comes from ``gguf.Metadata``.

The reference is convert_hf_to_gguf.py as of mid-2025 (one file, before its split into modules); the
quirks kept on purpose are noted where they occur (Llama 3's ``original_max_position_embeddings`` read
at the top level of config.json, Q8_0 falling back to F16 for rows not a multiple of 32).
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from .convert_vocab import Vocab, VocabError, bpe_vocab, read_json, spm_vocab

A = gguf.MODEL_ARCH
T = gguf.GGMLQuantizationType
FT = gguf.LlamaFileType

OUTTYPES: dict[str, Any] = {"f32": FT.ALL_F32, "f16": FT.MOSTLY_F16, "bf16": FT.MOSTLY_BF16,
                            "q8_0": FT.MOSTLY_Q8_0, "auto": None}
_QTYPE = {FT.ALL_F32: T.F32, FT.MOSTLY_F16: T.F16, FT.MOSTLY_BF16: T.BF16, FT.MOSTLY_Q8_0: T.Q8_0}
_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64}
CHUNK_BYTES = 32 << 20  # float32 bytes converted at a time: a larger tensor is streamed in row ranges


class ConvertError(ValueError):
    """Input the converter refuses (one line for the user)."""


# ----------------------------------------------------------------------------- safetensors


@dataclass(frozen=True)
class SourceTensor:
    """One tensor of a safetensors file: where its bytes are, and how to read them lazily."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    path: Path
    offset: int
    nbytes: int

    def load(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows ``start:stop`` of the tensor as float32 (a fresh array; only those bytes are mapped)."""
        if not self.shape:
            start, stop, shape = 0, 1, ()
        else:
            stop = self.shape[0] if stop is None else stop
            shape = (stop - start, *self.shape[1:])
        n = math.prod(shape)
        if n == 0:
            return np.zeros(shape, np.float32)
        item = np.dtype(_ST_DTYPES[self.dtype]).itemsize
        row = math.prod(self.shape[1:]) if self.shape else 1
        raw = np.memmap(self.path, mode="r", dtype=_ST_DTYPES[self.dtype], offset=self.offset + start * row * item,
                        shape=shape)
        if self.dtype == "BF16":
            out = (raw.astype(np.uint32) << 16).view(np.float32)
        else:
            out = np.array(raw, dtype=np.float32)
        del raw  # unmapped now: the resident pages of this tensor go with it
        return out


def read_safetensors_header(path: Path) -> list[SourceTensor]:
    """The tensors of one safetensors file, sorted by name (as the safetensors package lists them)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if n <= 0 or 8 + n > size:
                raise ConvertError(f"{path.name} is not a safetensors file (header of {n} bytes)")
            header = json.loads(f.read(n))
    except (OSError, ValueError) as e:
        if isinstance(e, ConvertError):
            raise
        raise ConvertError(f"cannot read {path.name}: {e}") from None
    out = []
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        dtype = meta.get("dtype")
        if dtype not in _ST_DTYPES:
            raise ConvertError(f"{path.name}: tensor {name} has dtype {dtype}, only F32/F16/BF16/F64 are converted")
        start, end = meta["data_offsets"]
        shape = tuple(int(d) for d in meta["shape"])
        if end - start != math.prod(shape) * np.dtype(_ST_DTYPES[dtype]).itemsize or 8 + n + end > size:
            raise ConvertError(f"{path.name}: tensor {name} has a size that does not match its shape")
        out.append(SourceTensor(name, dtype, shape, path, 8 + n + start, end - start))
    return sorted(out, key=lambda t: t.name)


def source_tensors(folder: Path) -> list[SourceTensor]:
    """Every tensor of ``model*.safetensors`` (one file, or the shards the index names), in llama.cpp's order."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError) as e:
            raise ConvertError(f"cannot read {index.name}: {e}") from None
        parts = sorted(set(weight_map.values()))
        for p in parts:
            if "/" in p or "\\" in p or p.startswith("."):
                raise ConvertError(f"{index.name} names a part outside the folder: {p!r}")
        missing = [p for p in parts if not (folder / p).is_file()]
        if missing:
            raise ConvertError(f"missing safetensors part(s): {', '.join(missing)}")
    else:
        parts = sorted(p.name for p in folder.glob("model*.safetensors"))
        weight_map = None
    if not parts:
        raise ConvertError(f"{folder} has no model*.safetensors file")
    tensors = [t for p in parts for t in read_safetensors_header(folder / p)]
    if weight_map is not None and set(weight_map) != {t.name for t in tensors}:
        gone = sorted(set(weight_map) - {t.name for t in tensors})[:3]
        raise ConvertError(f"the safetensors parts do not hold the tensors the index lists (e.g. {gone})")
    return tensors


# ------------------------------------------------------------------------------- families


def _base_params(hp: dict[str, Any], w: gguf.GGUFWriter) -> None:
    """TextModel.set_gguf_parameters (without the file type, written by the caller)."""
    w.add_block_count(hp["num_hidden_layers"])
    for keys, add in ((("max_position_embeddings", "n_ctx", "n_positions"), w.add_context_length),
                      (("hidden_size", "n_embd", "dim"), w.add_embedding_length),
                      (("intermediate_size", "n_inner", "hidden_dim"), w.add_feed_forward_length),
                      (("num_attention_heads", "n_head", "n_heads"), w.add_head_count)):
        v = next((hp[k] for k in keys if k in hp), None)
        if v is not None:
            add(v)
    if (v := hp.get("num_key_value_heads")) is not None:
        w.add_head_count_kv(v)
    if (v := hp.get("rope_theta")) is not None:
        w.add_rope_freq_base(v)
    if (v := hp.get("rms_norm_eps")) is not None:
        w.add_layer_norm_rms_eps(v)
    if (v := next((hp[k] for k in ("layer_norm_eps", "layer_norm_epsilon", "norm_epsilon") if k in hp), None)):
        w.add_layer_norm_eps(v)
    if (v := hp.get("head_dim")) is not None:
        w.add_key_length(v)
        w.add_value_length(v)


def _rope_type(hp: dict[str, Any]) -> str | None:
    rs = hp.get("rope_scaling") or {}
    return rs.get("rope_type", rs.get("type"))


def _llama_params(hp: dict[str, Any], w: gguf.GGUFWriter) -> None:
    _base_params(hp, w)
    w.add_vocab_size(hp["vocab_size"])
    w.add_rope_dimension_count(hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"])
    if _rope_type(hp) == "linear" and "factor" in hp["rope_scaling"]:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(hp["rope_scaling"]["factor"])


def _granite_params(hp: dict[str, Any], w: gguf.GGUFWriter) -> None:
    _llama_params({k: v for k, v in hp.items() if k != "head_dim"}, w)
    for key, add in (("attention_multiplier", w.add_attention_scale), ("embedding_multiplier", w.add_embedding_scale),
                     ("residual_multiplier", w.add_residual_scale), ("logits_scaling", w.add_logit_scale)):
        if hp.get(key):
            add(hp[key])


def _qwen2_params(hp: dict[str, Any], w: gguf.GGUFWriter) -> None:
    _base_params(hp, w)
    rs = hp.get("rope_scaling") or {}
    if _rope_type(hp) == "yarn" and "factor" in rs:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rs["factor"])
        w.add_rope_scaling_orig_ctx_len(rs["original_max_position_embeddings"])


def _gemma_common(hp: dict[str, Any], w: gguf.GGUFWriter, defaults: bool = False) -> None:
    w.add_context_length(hp.get("max_position_embeddings", 131072) if defaults else hp["max_position_embeddings"])
    w.add_embedding_length(hp["hidden_size"])
    w.add_block_count(hp["num_hidden_layers"])
    w.add_feed_forward_length(hp["intermediate_size"])
    w.add_head_count(hp.get("num_attention_heads", 8) if defaults else hp["num_attention_heads"])
    if not defaults:
        w.add_head_count_kv(hp.get("num_key_value_heads", hp["num_attention_heads"]))
    w.add_layer_norm_rms_eps(hp.get("rms_norm_eps", 1e-6) if defaults else hp["rms_norm_eps"])
    w.add_key_length(hp.get("head_dim", 256) if defaults else hp["head_dim"])
    w.add_value_length(hp.get("head_dim", 256) if defaults else hp["head_dim"])


def _gemma2_params(hp: dict[str, Any], w: gguf.GGUFWriter) -> None:
    _gemma_common(hp, w)
    w.add_attn_logit_softcapping(hp["attn_logit_softcapping"])
    w.add_final_logit_softcapping(hp["final_logit_softcapping"])
    w.add_sliding_window(hp["sliding_window"])


def _gemma3_params(hp: dict[str, Any], w: gguf.GGUFWriter) -> None:
    _gemma_common(hp, w, defaults=True)
    w.add_rope_freq_base(hp.get("rope_theta", 1_000_000.0))
    if hp.get("attn_logit_softcapping") is not None or hp.get("final_logit_softcapping") is not None:
        raise ConvertError("a gemma3 config with logit soft-capping is not one llama.cpp converts")
    w.add_sliding_window(hp["sliding_window"])
    w.add_head_count_kv(hp.get("num_key_value_heads", 4))
    if hp.get("rope_scaling") is not None:
        if hp["rope_scaling"].get("rope_type") != "linear":
            raise ConvertError(f"gemma3 rope_scaling {hp['rope_scaling'].get('rope_type')!r} is not supported")
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(hp["rope_scaling"]["factor"])


def _phi3_params(hp: dict[str, Any], w: gguf.GGUFWriter) -> None:
    n_embd, n_head = hp["hidden_size"], hp["num_attention_heads"]
    w.add_context_length(hp.get("n_positions", hp.get("max_position_embeddings")))
    w.add_rope_scaling_orig_ctx_len(hp["original_max_position_embeddings"])
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(hp["intermediate_size"])
    w.add_block_count(hp["num_hidden_layers"])
    w.add_head_count(n_head)
    w.add_head_count_kv(hp["num_key_value_heads"])
    w.add_layer_norm_rms_eps(hp["rms_norm_eps"])
    w.add_rope_dimension_count(int(hp.get("partial_rotary_factor", 1.0) * n_embd) // n_head)
    w.add_rope_freq_base(hp["rope_theta"])


def _phi3_sliding_window(hp: dict[str, Any], w: gguf.GGUFWriter) -> None:
    w.add_sliding_window(hp.get("sliding_window") or 0)  # written after the file type, as llama.cpp does


@dataclass(frozen=True)
class Family:
    """How one HF architecture converts (see the module docstring)."""

    arch: Any  # gguf.MODEL_ARCH
    params: Callable[[dict[str, Any], gguf.GGUFWriter], None]
    vocab: str = "auto"  # "auto": tokenizer.model when present, else tokenizer.json; "spm"; "phi3"
    permute_qk: bool = False
    norm_plus_one: bool = False
    skip_lm_head: bool = False
    trim_embd: bool = False
    after_ftype: Callable[[dict[str, Any], gguf.GGUFWriter], None] | None = None
    gemma_vocab: int = 0  # 1: CodeGemma's extra special ids; 2 and 3: only add_space_prefix False


_LLAMA = Family(A.LLAMA, _llama_params, permute_qk=True)
FAMILIES: dict[str, Family] = {
    "LlamaForCausalLM": _LLAMA,
    "LLaMAForCausalLM": _LLAMA,
    "MistralForCausalLM": _LLAMA,
    "GraniteForCausalLM": Family(A.GRANITE, _granite_params, permute_qk=True),
    "Qwen2ForCausalLM": Family(A.QWEN2, _qwen2_params),
    "Qwen3ForCausalLM": Family(A.QWEN3, _qwen2_params),
    "GemmaForCausalLM": Family(A.GEMMA, lambda hp, w: _gemma_common(hp, w), vocab="spm", norm_plus_one=True,
                               skip_lm_head=True, gemma_vocab=1),
    "Gemma2ForCausalLM": Family(A.GEMMA2, _gemma2_params, vocab="spm", norm_plus_one=True, skip_lm_head=True,
                                gemma_vocab=2),
    "Gemma3ForCausalLM": Family(A.GEMMA3, _gemma3_params, vocab="spm", norm_plus_one=True, trim_embd=True,
                                gemma_vocab=3),
    "Gemma3ForConditionalGeneration": Family(A.GEMMA3, _gemma3_params, vocab="spm", norm_plus_one=True,
                                             trim_embd=True, gemma_vocab=3),
    "Phi3ForCausalLM": Family(A.PHI3, _phi3_params, vocab="phi3", after_ftype=_phi3_sliding_window),
}


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: HF's rotate-half rows to GGML's interleaved RoPE pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """The inverse of :func:`permute` (GGUF rows back to HF's layout)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# ----------------------------------------------------------------------------- conversion


@dataclass
class _Out:
    """One output tensor: its GGUF name, shape and type, and how to make rows ``start:stop`` of it."""

    name: str
    src: SourceTensor | None
    shape: tuple[int, ...]
    qtype: Any
    make: Callable[[int, int], np.ndarray]
    group: int = 1  # chunks start at multiples of this many rows (a head's rows, for the permutation)

    def chunks(self, budget: int | None = None) -> Iterator[tuple[int, int]]:
        """Row ranges of about ``budget`` (default CHUNK_BYTES) float32 bytes each."""
        budget = CHUNK_BYTES if budget is None else budget
        rows = self.shape[0] if self.shape else 1
        row_bytes = 4 * (math.prod(self.shape[1:]) if self.shape else 1)
        step = max(self.group, budget // max(row_bytes, 1) // self.group * self.group)
        for start in range(0, rows, step):
            yield start, min(rows, start + step)


class _Streamed:
    """What GGUFWriter.write_tensor_data needs of a tensor (``nbytes``, ``tofile``), made chunk by chunk."""

    def __init__(self, out: _Out) -> None:
        self.out = out
        self.nbytes = _nbytes(out.shape, out.qtype)

    def tofile(self, fout: Any) -> None:
        written = 0
        for start, stop in self.out.chunks():
            data = _encode(self.out.make(start, stop), self.out.qtype)
            fout.write(data.tobytes())
            written += data.nbytes
            del data
        if written != self.nbytes:
            raise ConvertError(f"{self.out.name}: wrote {written} bytes, expected {self.nbytes}")


def _load_config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    if not path.is_file():
        raise ConvertError(f"{folder} has no config.json (not a Hugging Face model folder)")
    try:
        hp = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConvertError(f"cannot read config.json: {e}") from None
    if not isinstance(hp, dict):
        raise ConvertError("config.json does not hold an object")
    if isinstance(hp.get("text_config"), dict):
        hp = {**hp, **hp["text_config"]}
    return hp


def family_of(hp: dict[str, Any]) -> tuple[str, Family]:
    """The (HF architecture, family) of a config, or a one-line error naming the supported ones."""
    archs = hp.get("architectures") or []
    for a in archs:
        if a in FAMILIES:
            return a, FAMILIES[a]
    shown = ", ".join(archs) if archs else "none"
    raise ConvertError(f"unsupported architecture {shown} (supported: {', '.join(sorted(set(FAMILIES)))})")


def _guess_ftype(tensors: list[SourceTensor]) -> Any:
    for t in tensors:
        if len(t.shape) >= 2:
            return FT.MOSTLY_BF16 if t.dtype == "BF16" else FT.MOSTLY_F16
    return FT.MOSTLY_F16


def _llama3_rope_factors(hp: dict[str, Any]) -> np.ndarray:
    rs = hp["rope_scaling"]
    base = hp.get("rope_theta", 10000.0)
    dim = hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"]
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor, lo, hi = rs.get("factor", 8.0), rs.get("low_freq_factor", 1.0), rs.get("high_freq_factor", 4.0)
    old = hp.get("original_max_position_embeddings", 8192)  # top level, as llama.cpp reads it
    lo_wl, hi_wl = old / lo, old / hi
    out = []
    for f in freqs:
        wl = 2 * math.pi / f
        if wl < hi_wl:
            out.append(1.0)
        elif wl > lo_wl:
            out.append(factor)
        else:
            smooth = (old / wl - lo) / (hi - lo)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def _out_type(name: str, n_dims: int, ftype: Any, row: int) -> Any:
    if n_dims <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight"):
        return T.F32
    qt = _QTYPE[ftype]
    if qt == T.Q8_0 and row % 32 != 0:
        return T.F16  # gguf.quants raises QuantError, llama.cpp falls back to F16
    return qt


def _phi3_longrope(hp: dict[str, Any]) -> tuple[float, np.ndarray, np.ndarray]:
    """Phi3MiniModel.generate_extra_tensors: (attention factor, long factors, short factors)."""
    rs = hp["rope_scaling"]
    kind = str(rs.get("rope_type", rs.get("type", ""))).lower()
    if kind not in ("su", "longrope"):
        raise ConvertError(f"phi3 rope_scaling {kind or 'without a type'!r} is not supported (only longrope)")
    n_ctx = hp.get("n_positions", hp.get("max_position_embeddings"))
    orig = hp["original_max_position_embeddings"]
    scale = n_ctx / orig
    attn = math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1.0 else 1.0
    dims = int(hp.get("partial_rotary_factor", 1.0) * hp["hidden_size"]) // hp["num_attention_heads"]
    long, short = rs.get("long_factor"), rs.get("short_factor")
    if long is None or short is None or len(long) != len(short) or len(long) != dims / 2:
        raise ConvertError(f"phi3 rope_scaling needs long_factor and short_factor of {dims // 2} values each")
    return attn, np.asarray(long, np.float32), np.asarray(short, np.float32)


def _extra_tensor(kind: Any, values: np.ndarray) -> _Out:
    return _Out(gguf.TENSOR_NAMES[kind] + ".weight", None, values.shape, T.F32, lambda a, b, v=values: v[a:b])


def _plan(folder: Path, hp: dict[str, Any], fam: Family, ftype: Any, vocab: Vocab,
          early: list[Callable[[gguf.GGUFWriter], None]]) -> list[_Out]:
    """The output tensors in llama.cpp's order (generated ones first); ``early`` gets the metadata that
    llama.cpp's converter adds while generating them (before general.*)."""
    n_layer = hp["num_hidden_layers"]
    tmap = gguf.get_tensor_name_map(fam.arch, n_layer)
    n_head, n_kv = hp.get("num_attention_heads"), hp.get("num_key_value_heads")
    outs: list[_Out] = []
    if fam.arch in (A.LLAMA, A.GRANITE) and _rope_type(hp) == "llama3":
        outs.append(_extra_tensor(gguf.MODEL_TENSOR.ROPE_FREQS, _llama3_rope_factors(hp)))
    if fam.arch == A.PHI3 and hp.get("rope_scaling") is not None:
        attn, long, short = _phi3_longrope(hp)
        early.append(lambda w: w.add_rope_scaling_attn_factors(attn))
        outs += [_extra_tensor(gguf.MODEL_TENSOR.ROPE_FACTORS_LONG, long),
                 _extra_tensor(gguf.MODEL_TENSOR.ROPE_FACTORS_SHORT, short)]
    for t in source_tensors(folder):
        name = t.name
        if name.endswith((".attention.masked_bias", ".attention.bias", ".rotary_emb.inv_freq")):
            continue
        if name.startswith("language_model."):
            name = name[len("language_model."):]
        elif name.startswith("model.language_model."):
            name = "model." + name[len("model.language_model."):]
        if name.startswith(("vision_tower.", "vision_model.", "multi_modal_projector.", "multimodal_projector.",
                            "model.vision_tower.", "model.multi_modal_projector.")):
            continue
        if fam.skip_lm_head and name == "lm_head.weight":
            continue
        new = tmap.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None:
            raise ConvertError(f"cannot map tensor {t.name!r} of a {fam.arch.name.lower()} model to a GGUF name")
        shape = t.shape
        if fam.trim_embd and "embed_tokens.weight" in name:
            shape = (min(shape[0], len(vocab.tokens)), *shape[1:])

        heads = None
        if fam.permute_qk and name.endswith(("q_proj.weight", "q_proj.bias")):
            heads = n_head
        elif fam.permute_qk and name.endswith(("k_proj.weight", "k_proj.bias")):
            heads = n_kv if n_kv is not None else n_head
        plus_one = fam.norm_plus_one and name.endswith("norm.weight")

        def make(start: int, stop: int, t: SourceTensor = t, heads: int | None = heads,
                 plus_one: bool = plus_one) -> np.ndarray:
            x = t.load(start, stop) if t.shape else t.load()
            if heads is not None:  # chunks hold whole heads (see _chunks), so each permutes alone
                x = permute(x, heads * (stop - start) // t.shape[0])
            if plus_one:
                x = x + np.float32(1)
            return x

        group = shape[0] // heads if heads else 1
        outs.append(_Out(new, t, shape, _out_type(new, len(shape), ftype, shape[-1] if shape else 1), make, group))
    return outs


def _encode(x: np.ndarray, qt: Any) -> np.ndarray:
    from .quantize import quantize

    if qt == T.F32:
        return np.ascontiguousarray(x, dtype=np.float32)
    if qt == T.F16:
        return np.ascontiguousarray(x, dtype=np.float32).astype(np.float16)
    return quantize(np.ascontiguousarray(x, dtype=np.float32), qt)


def _nbytes(shape: tuple[int, ...], qt: Any) -> int:
    block, size = gguf.GGML_QUANT_SIZES[qt]
    return math.prod(shape) // block * size


def load_vocab(folder: Path, hp: dict[str, Any], fam: Family) -> Vocab:
    """The GGUF vocabulary of the folder, the way the family's set_vocab builds it."""
    n_vocab = hp.get("vocab_size")
    spm_file = (folder / "tokenizer.model").is_file()
    if fam.vocab == "phi3":
        cfg = folder / "tokenizer_config.json"
        if cfg.is_file() and read_json(cfg).get("tokenizer_class") == "GPT2Tokenizer":
            vocab = bpe_vocab(folder, n_vocab)
        elif not spm_file:
            raise VocabError(f"{folder} has no tokenizer.model (phi3 needs it)")
        else:
            vocab = spm_vocab(folder, n_vocab, phi3=True)
    elif fam.vocab == "spm" or spm_file:
        if not spm_file:
            raise VocabError(f"{folder} has no tokenizer.model (a SentencePiece vocabulary is needed)")
        vocab = spm_vocab(folder, n_vocab)
    else:
        vocab = bpe_vocab(folder, n_vocab)
    if fam.gemma_vocab == 1:
        extra = gguf.SpecialVocab(folder, load_merges=False,
                                  special_token_types=["prefix", "suffix", "middle", "fsep", "eot"])
        for typ, tid in (("prefix", 67), ("suffix", 69), ("middle", 68), ("fsep", 70), ("eot", 107)):
            extra._set_special_token(typ, tid)
        extra.chat_template = None
        vocab.more_special = extra
    if fam.gemma_vocab:
        vocab.extra["add_add_space_prefix"] = False
    if fam.arch in (A.LLAMA, A.GRANITE):
        cfg = folder / "tokenizer_config.json"
        if cfg.is_file():
            tc = read_json(cfg)
            if "add_prefix_space" in tc:
                vocab.extra["add_add_space_prefix"] = tc["add_prefix_space"]
        if n_vocab == 49152:
            vocab.extra["add_add_bos_token"] = False
    return vocab


@dataclass
class ConvertResult:
    """What :func:`convert` wrote."""

    path: Path
    arch: str
    n_tensors: int
    ftype: str
    nbytes: int


def convert(folder: Path, out: Path, outtype: str = "auto", model_name: str | None = None,
            progress: Callable[[int, int, str, Any], None] | None = None) -> ConvertResult:
    """Convert the Hugging Face model in ``folder`` to the GGUF file ``out`` (see the module docstring)."""
    folder = Path(folder)
    if outtype not in OUTTYPES:
        raise ConvertError(f"unknown --outtype {outtype!r} (one of {', '.join(OUTTYPES)})")
    if not folder.is_dir():
        raise ConvertError(f"{folder} is not a folder")
    out = Path(out)
    if not out.is_dir():
        refuse_source_as_output(folder, out)  # before any work; again below for a folder's default name
    hp = _load_config(folder)
    _, fam = family_of(hp)
    if "num_hidden_layers" not in hp:
        raise ConvertError("config.json has no num_hidden_layers")
    for noisy in ("gguf", "gguf.vocab", "gguf.gguf_writer", "metadata"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    try:
        vocab = load_vocab(folder, hp, fam)
    except VocabError as e:
        raise ConvertError(str(e)) from None
    tensors = source_tensors(folder)
    ftype = OUTTYPES[outtype] if OUTTYPES[outtype] is not None else _guess_ftype(tensors)
    early: list[Callable[[gguf.GGUFWriter], None]] = []
    plan = _plan(folder, hp, fam, ftype, vocab, early)

    w = gguf.GGUFWriter(path=None, arch=gguf.MODEL_ARCH_NAMES[fam.arch])
    for add in early:
        add(w)
    for o in plan:
        w.add_tensor_info(o.name, o.shape, np.dtype(np.float32), _nbytes(o.shape, o.qtype), raw_dtype=o.qtype)
    meta = _write_metadata(w, folder, hp, fam, ftype, model_name)
    if out.is_dir():  # llama.cpp's default file name, e.g. SmolLM2-135M-Instruct-F16.gguf
        out = out / (gguf.naming_convention(meta.name, meta.basename, meta.finetune, meta.version,
                                            meta.size_label, ftype.name.partition("_")[2]) + ".gguf")
    refuse_source_as_output(folder, out)
    vocab.add_to_gguf(w)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    try:
        w.write_header_to_file(path=tmp)
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for i, o in enumerate(plan):
            if progress is not None:
                progress(i, len(plan), o.name, o.qtype)
            w.write_tensor_data(_Streamed(o))  # type: ignore[arg-type]
        w.close()
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return ConvertResult(out, gguf.MODEL_ARCH_NAMES[fam.arch], len(plan), ftype.name, out.stat().st_size)


def refuse_source_as_output(folder: Path, out: Path) -> None:
    """ConvertError when ``out`` is one of the source folder's files (itself, a hard link or a symlink
    to one): writing it would replace the model being converted. A GGUF in the folder (an earlier
    conversion) may be overwritten."""
    if not out.exists():
        return
    for f in folder.iterdir():
        if f.name.endswith(".gguf") or not f.is_file():
            continue
        try:
            same = os.path.samefile(out, f)
        except OSError:
            continue
        if same:
            raise ConvertError(f"the output {out} is the source file {f}; converting would overwrite it "
                               "(choose another output file)")


def _write_metadata(w: gguf.GGUFWriter, folder: Path, hp: dict[str, Any], fam: Family, ftype: Any,
                    model_name: str | None) -> Any:
    """general.* (gguf.Metadata, as prepare_metadata), the hyper-parameters, the quantization version."""
    total, shared, expert, n_expert = w.get_total_parameter_count()
    meta = gguf.Metadata.load(None, folder, None, total)
    if model_name:
        meta.name = model_name
    if meta.name is None:
        meta.name = folder.name
    if meta.size_label is None and total > 0:
        meta.size_label = gguf.size_label(total, shared, expert, n_expert)
    w.add_type(gguf.GGUFType.MODEL)
    meta.set_gguf_meta_model(w)
    fam.params(hp, w)
    w.add_file_type(ftype)
    if fam.after_ftype is not None:
        fam.after_ftype(hp, w)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    return meta

