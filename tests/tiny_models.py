"""Tiny random-weight GGUF models, one per architecture family, written deterministically.

Used by tests/test_families.py (which writes them to a temporary folder) and by
tests/fixtures/make_family_fixtures.py (which writes the same files and stores llama.cpp's logits for
them). Only ``numpy`` and ``gguf`` are imported, so the fixture script runs in llama.cpp's venv.

Weights are generated as float32 from fixed seeds and quantized here with plain NumPy (Q8_0 and
Q4_0 as ggml's reference quantizers do; Q4_K and Q6_K as random valid blocks), so the bytes do not depend on
the ``gguf`` package's version. :func:`fingerprint` hashes every tensor's name, type, shape and bytes:
the fixtures store it, and the tests check that they regenerated the very weights llama.cpp saw.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import numpy as np

T = gguf.GGMLQuantizationType
N_VOCAB = 512
N_EMBD, N_HEAD, N_KV_HEAD, HEAD_DIM, N_FF = 256, 4, 2, 64, 512
N_CTX = 128  # the context both llama.cpp and the tests use (LongRoPE picks its long factors beyond 64)


@dataclass(frozen=True)
class Tiny:
    """One tiny model: its architecture, layer count, weight types and extra metadata / tensors."""

    arch: str
    n_layer: int = 2
    attn_type: Any = T.Q8_0
    ffn_type: Any = T.Q4_K
    embd_type: Any = T.F16
    meta: dict[str, Any] = field(default_factory=dict)
    qkv_bias: bool = False
    qk_norm: bool = False
    post_norms: bool = False
    fused_qkv: bool = False
    fused_gate_up: bool = False
    rope_freqs: bool = False
    longrope: bool = False
    tied: bool = True


MODELS: dict[str, Tiny] = {
    "llama": Tiny("llama", attn_type=T.Q4_0, ffn_type=T.Q4_K, rope_freqs=True, tied=False),
    "llama_f32": Tiny("llama", attn_type=T.F32, ffn_type=T.F16, embd_type=T.F32),
    "qwen2": Tiny("qwen2", attn_type=T.Q8_0, ffn_type=T.Q4_0, qkv_bias=True, meta={"rope.freq_base": 1e6}),
    "qwen3": Tiny("qwen3", attn_type=T.F16, ffn_type=T.Q8_0, qk_norm=True, meta={"rope.freq_base": 1e6},
                  tied=False),
    "gemma": Tiny("gemma", attn_type=T.Q8_0, ffn_type=T.Q4_K),
    "gemma2": Tiny("gemma2", n_layer=3, attn_type=T.Q4_0, ffn_type=T.Q8_0, post_norms=True,
                   meta={"attention.sliding_window": 8, "attn_logit_softcapping": 2.0,
                         "final_logit_softcapping": 8.0}),
    "gemma3": Tiny("gemma3", n_layer=7, attn_type=T.Q8_0, ffn_type=T.Q4_K, qk_norm=True, post_norms=True,
                   meta={"attention.sliding_window": 8, "rope.freq_base": 1e6}),
    "phi3": Tiny("phi3", attn_type=T.Q8_0, ffn_type=T.Q4_K, fused_qkv=True, fused_gate_up=True, longrope=True,
                 tied=False, meta={"rope.scaling.attn_factor": 1.19, "rope.scaling.original_context_length": 64}),
    # YaRN (Qwen 2.5 / Qwen 3 long-context files): factor 4 over an original context of 32, so the
    # 40-token prompt runs past it; the ramp spans pairs [0, 4] at base 1e6
    "qwen3_yarn": Tiny("qwen3", attn_type=T.Q8_0, ffn_type=T.Q8_0, qk_norm=True,
                       meta={"rope.freq_base": 1e6, "rope.scaling.type": "yarn", "rope.scaling.factor": 4.0,
                             "rope.scaling.original_context_length": 32}),
    "granite": Tiny("granite", attn_type=T.Q8_0, ffn_type=T.Q6_K,
                    meta={"embedding_scale": 12.0, "residual_scale": 0.22, "attention.scale": 0.03,
                          "logit_scale": 4.0}),
}


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16)


def _q8_0(w: np.ndarray) -> np.ndarray:
    """ggml's quantize_row_q8_0_ref: per 32 values d = amax / 127, q = round(x / d)."""
    b = w.reshape(-1, 32).astype(np.float32)
    amax = np.abs(b).max(axis=1, keepdims=True)
    d = amax / np.float32(127)
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
    q = np.round(b * inv).astype(np.int8)
    out = np.concatenate([_f16(d).view(np.uint8), q.view(np.uint8)], axis=1)
    return out.reshape(w.shape[0], -1)


def _q4_0(w: np.ndarray) -> np.ndarray:
    """ggml's quantize_row_q4_0_ref: d = max / -8 (signed by the largest magnitude), q = x / d + 8.5."""
    b = w.reshape(-1, 32).astype(np.float32)
    idx = np.abs(b).argmax(axis=1)
    mx = b[np.arange(len(b)), idx][:, None]
    d = mx / np.float32(-8)
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
    q = np.minimum(15, (b * inv + np.float32(8.5)).astype(np.int8)).astype(np.uint8)
    packed = q[:, :16] | (q[:, 16:] << 4)
    out = np.concatenate([_f16(d).view(np.uint8), packed], axis=1)
    return out.reshape(w.shape[0], -1)


def _q4_k(rows: int, k: int, std: float, rng: np.random.Generator) -> np.ndarray:
    """Random valid Q4_K blocks (d, dmin, 12 packed 6-bit scale/min bytes, 128 nibble bytes) whose
    values have about ``std`` spread and mean zero."""
    nb = rows * k // 256
    d = np.full((nb, 1), std / 200.0, dtype=np.float32)
    dmin = d * np.float32(7.5)  # E[scale * q] = 31.5 * 7.5 = 7.5 * E[min]: zero mean
    scales = rng.integers(0, 256, (nb, 12), dtype=np.uint8)
    qs = rng.integers(0, 256, (nb, 128), dtype=np.uint8)
    out = np.concatenate([_f16(d).view(np.uint8), _f16(dmin).view(np.uint8), scales, qs], axis=1)
    return out.reshape(rows, -1)


def _q6_k(rows: int, k: int, std: float, rng: np.random.Generator) -> np.ndarray:
    """Random valid Q6_K blocks (128 low-nibble bytes, 64 high-bit bytes, 16 int8 scales, d) whose
    values d * scale * (q - 32) have about ``std`` spread."""
    nb = rows * k // 256
    ql = rng.integers(0, 256, (nb, 128), dtype=np.uint8)
    qh = rng.integers(0, 256, (nb, 64), dtype=np.uint8)
    scales = rng.integers(-30, 31, (nb, 16)).astype(np.int8)
    d = np.full((nb, 1), std / (17.0 * 18.5), dtype=np.float32)
    out = np.concatenate([ql, qh, scales.view(np.uint8), _f16(d).view(np.uint8)], axis=1)
    return out.reshape(rows, -1)


def _encode(w: np.ndarray, t: Any, rng: np.random.Generator, std: float) -> tuple[np.ndarray, Any]:
    if t == T.F32:
        return w.astype(np.float32), t
    if t == T.F16:
        return _f16(w), t
    if t == T.Q8_0:
        return _q8_0(w), t
    if t == T.Q4_0:
        return _q4_0(w), t
    if t == T.Q4_K:
        return _q4_k(w.shape[0], w.shape[1], std, rng), t
    if t == T.Q6_K:
        return _q6_k(w.shape[0], w.shape[1], std, rng), t
    raise ValueError(f"unsupported tiny weight type {t}")


def _vocab() -> tuple[list[str], list[float], list[int]]:
    """A SentencePiece-style vocabulary: unk, BOS, EOS, the 256 byte tokens, then word pieces."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    letters = "etaoinshrdlucmfwypvbgkjqxz"
    while len(tokens) < N_VOCAB:
        i = len(tokens)
        tokens.append("\u2581" + letters[i % 26] + letters[(i // 26) % 26] + str(i))
        types.append(1)
    scores = [0.0] * 259 + [-float(i) for i in range(N_VOCAB - 259)]
    return tokens, scores, types


def tensors(name: str) -> list[tuple[str, np.ndarray, Any]]:
    """(GGUF name, array as written, GGML type) for every tensor of tiny model ``name``."""
    spec = MODELS[name]
    rng = np.random.default_rng(_seed(name))
    out: list[tuple[str, np.ndarray, Any]] = []

    def add(tname: str, shape: tuple[int, ...], t: Any, std: float, mean: float = 0.0) -> None:
        w = (rng.standard_normal(shape).astype(np.float32) * np.float32(std) + np.float32(mean))
        if len(shape) == 1:
            out.append((tname, w.astype(np.float32), T.F32))
        else:
            arr, tt = _encode(w, t, rng, std)
            out.append((tname, arr, tt))

    add("token_embd.weight", (N_VOCAB, N_EMBD), spec.embd_type, 0.25 if "gemma" not in spec.arch else 0.15)
    add("output_norm.weight", (N_EMBD,), T.F32, 0.1, 1.0)
    if not spec.tied:
        add("output.weight", (N_VOCAB, N_EMBD), spec.embd_type, 0.15)
    nq, nk = N_HEAD * HEAD_DIM, N_KV_HEAD * HEAD_DIM
    if spec.rope_freqs:
        out.append(("rope_freqs.weight", np.linspace(1.0, 8.0, HEAD_DIM // 2).astype(np.float32), T.F32))
    if spec.longrope:
        out.append(("rope_factors_long.weight", np.linspace(1.0, 6.0, HEAD_DIM // 2).astype(np.float32), T.F32))
        out.append(("rope_factors_short.weight", np.linspace(1.0, 1.5, HEAD_DIM // 2).astype(np.float32), T.F32))
    for il in range(spec.n_layer):
        p = f"blk.{il}."
        add(p + "attn_norm.weight", (N_EMBD,), T.F32, 0.1, 1.0)
        if spec.fused_qkv:
            add(p + "attn_qkv.weight", (nq + 2 * nk, N_EMBD), spec.attn_type, 0.08)
        else:
            add(p + "attn_q.weight", (nq, N_EMBD), spec.attn_type, 0.08)
            add(p + "attn_k.weight", (nk, N_EMBD), spec.attn_type, 0.08)
            add(p + "attn_v.weight", (nk, N_EMBD), spec.attn_type, 0.08)
        if spec.qkv_bias:
            add(p + "attn_q.bias", (nq,), T.F32, 0.5)
            add(p + "attn_k.bias", (nk,), T.F32, 0.5)
            add(p + "attn_v.bias", (nk,), T.F32, 0.1)
        if spec.qk_norm:
            add(p + "attn_q_norm.weight", (HEAD_DIM,), T.F32, 0.1, 1.0)
            add(p + "attn_k_norm.weight", (HEAD_DIM,), T.F32, 0.1, 1.0)
        add(p + "attn_output.weight", (N_EMBD, nq), spec.attn_type, 0.06)
        if spec.post_norms:
            add(p + "post_attention_norm.weight", (N_EMBD,), T.F32, 0.1, 1.0)
        add(p + "ffn_norm.weight", (N_EMBD,), T.F32, 0.1, 1.0)
        if spec.fused_gate_up:
            add(p + "ffn_up.weight", (2 * N_FF, N_EMBD), spec.ffn_type, 0.08)
        else:
            add(p + "ffn_gate.weight", (N_FF, N_EMBD), spec.ffn_type, 0.08)
            add(p + "ffn_up.weight", (N_FF, N_EMBD), spec.ffn_type, 0.08)
        add(p + "ffn_down.weight", (N_EMBD, N_FF), spec.ffn_type, 0.06)
        if spec.post_norms:
            add(p + "post_ffw_norm.weight", (N_EMBD,), T.F32, 0.1, 1.0)
    return out


def _seed(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")


def fingerprint(name: str) -> str:
    """sha256 over every tensor's name, type, shape and bytes (independent of the gguf package)."""
    h = hashlib.sha256()
    for tname, arr, t in tensors(name):
        h.update(f"{tname}|{int(t)}|{arr.shape}|".encode())
        h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()


def write(name: str, path: Path) -> Path:
    """Write tiny model ``name`` to ``path`` (a .gguf file) and return the path."""
    spec = MODELS[name]
    a = spec.arch
    w = gguf.GGUFWriter(str(path), a)
    w.add_name("tiny random model")  # not the family: llama.cpp adjusts vocabularies by model name
    w.add_context_length(256)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(spec.n_layer)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_KV_HEAD)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_layer_norm_rms_eps(1e-6)
    for key, value in spec.meta.items():
        full = f"{a}.{key}"
        if isinstance(value, str):
            w.add_string(full, value)
        elif isinstance(value, float):
            w.add_float32(full, value)
        else:
            w.add_uint32(full, int(value))
    tokens, scores, types = _vocab()
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    for tname, arr, t in tensors(name):
        if t in (T.F32, T.F16):
            w.add_tensor(tname, arr)
        else:
            w.add_tensor(tname, arr, raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def prompt_ids(name: str, n: int = 40) -> list[int]:
    """A fixed prompt: BOS then ids from the word pieces (past the sliding windows of 8)."""
    rng = np.random.default_rng(_seed("prompt-" + name))
    return [1] + [int(x) for x in rng.integers(259, N_VOCAB, n - 1)]
