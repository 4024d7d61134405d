"""Hugging Face-layout model folders for the converter's tests, and a float64 forward in HF's layout.

:func:`write_tiny` writes one tiny random model per family the way a Hugging Face checkpoint looks
(``config.json``, ``model.safetensors`` or shards with ``model.safetensors.index.json``, a byte-level
BPE ``tokenizer.json`` or a SentencePiece ``tokenizer.model``, ``tokenizer_config.json`` with a chat
template, ``generation_config.json``). :func:`hf_forward` runs the model from those very weights in
float64, with transformers' conventions (rotate-half RoPE on unpermuted Q/K rows, Gemma's
``1 + weight`` norms, fused Phi-3 projections), so logits of a converted GGUF that equal it prove the
converter's name map, permutation and rewrites. :func:`export_gguf` goes the other way for a real
model: a GGUF's dequantized tensors back to an HF folder (inverse Q/K permutation included).

Only numpy, json and struct are used (no safetensors, no sentencepiece): the fixture script runs it too.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import numpy as np
from tiny_vocabs import bytes_to_unicode

HIDDEN, N_HEAD, N_KV, HEAD_DIM, FFN, N_LAYER = 64, 4, 2, 16, 128, 2
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
PROMPT = [5, 17, 42, 99, 7, 63, 120, 3, 77, 200, 31, 150, 8, 64]  # token ids every tiny model is run on

# --------------------------------------------------------------------------- safetensors writer

_DT = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16"}


def bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits (round to nearest even), as uint16."""
    u = np.asarray(x, np.float32).view(np.uint32)
    return ((u + (0x7FFF + ((u >> 16) & 1))) >> 16).astype(np.uint16)


def bf16_values(x: np.ndarray) -> np.ndarray:
    return (bf16(x).astype(np.uint32) << 16).view(np.float32)


def write_safetensors(path: Path, tensors: dict[str, np.ndarray], dtype: str = "F32") -> None:
    """A safetensors file (F32, F16 or BF16), tensors in the given order, header padded to 8 bytes."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    blobs = []
    off = 0
    for name, x in tensors.items():
        if dtype == "BF16":
            b = bf16(x).tobytes()
        elif dtype == "F16":
            b = np.asarray(x, np.float16).tobytes()
        else:
            b = np.asarray(x, np.float32).tobytes()
        header[name] = {"dtype": dtype, "shape": list(x.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def write_sharded(folder: Path, tensors: dict[str, np.ndarray], n_shards: int, dtype: str = "F32") -> None:
    names = list(tensors)
    per = math.ceil(len(names) / n_shards)
    weight_map = {}
    for s in range(n_shards):
        fname = f"model-{s + 1:05d}-of-{n_shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[s * per:(s + 1) * per]}
        write_safetensors(folder / fname, part, dtype)
        weight_map.update(dict.fromkeys(part, fname))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


# ------------------------------------------------------------------------------ tokenizers


_SPLITS = {
    "llama3": ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
               "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"),
    "qwen2": ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
              "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"),
}


def pre_tokenizer(kind: str) -> dict[str, Any]:
    """tokenizer.json's pre_tokenizer section as HF writes it for these model families."""
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    if kind == "gpt2":
        return bl
    if kind == "smollm":
        return {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, bl]}
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": _SPLITS[kind]}, "behavior": "Isolated", "invert": False},
        {**bl, "use_regex": False}]}


def bpe_tokenizer_json(tokens: list[str], merges: list[str], specials: dict[int, str], pre: str,
                       bos: str | None = None) -> dict[str, Any]:
    vocab = {t: i for i, t in enumerate(tokens) if i not in specials}
    post = None
    if bos is not None:
        post = {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": bos, "type_id": 0}},
                                                          {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [], "special_tokens": {}}
    return {
        "version": "1.0",
        "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, t in sorted(specials.items())],
        "normalizer": None, "pre_tokenizer": pre_tokenizer(pre), "post_processor": post,
        "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "fuse_unk": False, "byte_fallback": False,
                  "vocab": vocab, "merges": merges},
    }


def tiny_bpe(n_vocab: int) -> tuple[list[str], list[str], dict[int, str]]:
    """A byte-level vocabulary: 3 specials, the 256 byte symbols, then merged pairs up to ``n_vocab``."""
    specials = {0: "<|endoftext|>", 1: "<|im_start|>", 2: "<|im_end|>"}
    byte_syms = list(bytes_to_unicode().values())
    tokens = list(specials.values()) + byte_syms
    merges: list[str] = []
    have = set(tokens)
    for text in ["Ġthe", "Ġa", "in", "er", "on", "Ġt", "he", "an", "re", "Ġs", "at", "en", "or", "es", "Ġw",
                 "Ġo", "it", "is", "Ġc", "al", "ing", "Ġb", "ed", "ar", "Ġf", "ou", "Ġm", "le", "Ġp", "ic",
                 "Ġd", "ion", "Ġh", "as", "ro", "Ġl", "Ġn", "om", "ent", "Ġin"]:
        if len(tokens) >= n_vocab:
            break
        # split into the longest known prefix + the rest
        for k in range(len(text) - 1, 0, -1):
            a, b = text[:k], text[k:]
            if a in have and b in have:
                merges.append(f"{a} {b}")
                tokens.append(text)
                have.add(text)
                break
    while len(tokens) < n_vocab:
        a, b = byte_syms[len(tokens) % 50 + 60], byte_syms[len(tokens) % 37 + 100]
        t = a + b
        if t not in have:
            merges.append(f"{a} {b}")
            have.add(t)
            tokens.append(t)
        else:
            tokens.append(f"<extra_{len(tokens)}>")
            have.add(tokens[-1])
    return tokens, merges, specials


def _pb_varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def _pb_field(num: int, wt: int, payload: bytes | int) -> bytes:
    key = _pb_varint(num << 3 | wt)
    if wt == 0:
        return key + _pb_varint(int(payload))
    if wt == 5:
        return key + payload  # type: ignore[operator]
    return key + _pb_varint(len(payload)) + payload  # type: ignore[arg-type]


def spm_model(n_vocab: int, llama_style: bool = False) -> tuple[bytes, list[str]]:
    """A SentencePiece tokenizer.model (protobuf): Gemma's <pad> <eos> <bos> <unk> (or Llama's <unk> <s>
    </s>), the 256 byte pieces, then word pieces."""
    pieces: list[tuple[str, float, int]] = (
        [("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3)] if llama_style
        else [("<pad>", 0.0, 3), ("<eos>", 0.0, 3), ("<bos>", 0.0, 3), ("<unk>", 0.0, 2)])
    pieces += [(f"<0x{b:02X}>", 0.0, 6) for b in range(256)]
    words = ["▁", "▁the", "▁a", "e", "t", "o", "a", "n", "i", "s", "r", "h", "l", "d", "▁to", "▁of", "in", "er"]
    k = 0
    while len(pieces) < n_vocab:
        w = words[k] if k < len(words) else f"▁w{k}"
        pieces.append((w, -float(k + 1), 1))
        k += 1
    return spm_proto(pieces), [p for p, _, _ in pieces]


def spm_proto(pieces: list[tuple[str, float, int]], add_dummy_prefix: bool = True) -> bytes:
    """sentencepiece's ModelProto bytes: (piece, score, type) entries, BPE trainer spec, normalizer spec."""
    body = b"".join(_pb_field(1, 2, _pb_field(1, 2, p.encode()) + _pb_field(2, 5, struct.pack("<f", s))
                              + _pb_field(3, 0, t)) for p, s, t in pieces)
    body += _pb_field(2, 2, _pb_field(3, 0, 2))  # trainer_spec.model_type = BPE
    body += _pb_field(3, 2, _pb_field(3, 0, int(add_dummy_prefix)))  # normalizer_spec.add_dummy_prefix
    return body


def export_spm_vocab(gguf_path: Path, folder: Path) -> Path:
    """A tiny Gemma 3 HF folder carrying a real GGUF's SentencePiece vocabulary (tokenizer.model from its
    tokens, scores and types; the specials in tokenizer.json's added_tokens, as HF ships them)."""
    from llmedge.gguf import GGUFFile

    md = GGUFFile(gguf_path).metadata
    tokens = list(md["tokenizer.ggml.tokens"])
    scores = [float(x) for x in md["tokenizer.ggml.scores"]]
    types = [int(x) for x in md["tokenizer.ggml.token_type"]]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.model").write_bytes(spm_proto(list(zip(tokens, scores, types)), add_dummy_prefix=False))
    ids = {k: md[f"tokenizer.ggml.{k}_token_id"] for k in ("bos", "eos", "unknown", "padding")}
    added = [{"id": i, "content": t, "special": True} for i, (t, ty) in enumerate(zip(tokens, types)) if ty == 3]
    (folder / "tokenizer.json").write_text(json.dumps({"added_tokens": added, "model": {"type": "BPE", "vocab": {}}}))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "add_bos_token": True, "add_eos_token": False, "bos_token": tokens[ids["bos"]], "eos_token": tokens[ids["eos"]],
        "unk_token": tokens[ids["unknown"]], "pad_token": tokens[ids["padding"]], "chat_template": TEMPLATE}))
    cfg = {**tiny_config("gemma3"), "vocab_size": len(tokens), "bos_token_id": ids["bos"], "eos_token_id": ids["eos"],
           "pad_token_id": ids["padding"]}
    (folder / "config.json").write_text(json.dumps(cfg))
    rng = np.random.default_rng(3)
    w = {k: v for k, v in tiny_weights("gemma3").items() if k != "model.embed_tokens.weight"}
    w["model.embed_tokens.weight"] = (rng.standard_normal((len(tokens), HIDDEN)) * 0.5).astype(np.float32)
    write_safetensors(folder / "model.safetensors", w)
    return folder


# ------------------------------------------------------------------------------ tiny models

# family -> (HF architecture, extra config, tokenizer kind)
FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {"arch": "LlamaForCausalLM", "tok": "llama3", "shards": 2, "cfg": {
        "rope_theta": 10000.0, "tie_word_embeddings": False,
        "original_max_position_embeddings": 64,  # llama.cpp reads it here, transformers in rope_scaling
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 64}}},
    "qwen2": {"arch": "Qwen2ForCausalLM", "tok": "qwen2", "bias": True, "cfg": {
        "rope_theta": 1000000.0, "tie_word_embeddings": True}},
    "qwen3": {"arch": "Qwen3ForCausalLM", "tok": "qwen2", "qk_norm": True, "dtype": "BF16", "cfg": {
        "rope_theta": 1000000.0, "tie_word_embeddings": True, "head_dim": HEAD_DIM}},
    "granite": {"arch": "GraniteForCausalLM", "tok": "gpt2", "cfg": {
        "rope_theta": 10000.0, "tie_word_embeddings": True, "attention_multiplier": 0.2,
        "embedding_multiplier": 6.0, "residual_multiplier": 0.3, "logits_scaling": 4.0}},
    "gemma": {"arch": "GemmaForCausalLM", "tok": "spm", "cfg": {
        "rope_theta": 10000.0, "head_dim": HEAD_DIM, "hidden_activation": "gelu_pytorch_tanh"}},
    "gemma2": {"arch": "Gemma2ForCausalLM", "tok": "spm", "post_norms": True, "cfg": {
        "rope_theta": 10000.0, "head_dim": HEAD_DIM, "hidden_activation": "gelu_pytorch_tanh",
        "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "sliding_window": 6,
        "query_pre_attn_scalar": HEAD_DIM}},
    "gemma3": {"arch": "Gemma3ForCausalLM", "tok": "spm", "post_norms": True, "qk_norm": True, "cfg": {
        "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "head_dim": HEAD_DIM,
        "hidden_activation": "gelu_pytorch_tanh", "sliding_window": 6, "sliding_window_pattern": 6,
        "query_pre_attn_scalar": HEAD_DIM, "rope_scaling": None}},
    "phi3": {"arch": "Phi3ForCausalLM", "tok": "spm-llama", "fused": True, "cfg": {
        "rope_theta": 10000.0, "original_max_position_embeddings": 256, "sliding_window": None,
        "tie_word_embeddings": False, "rope_scaling": None}},
    "phi3_longrope": {"arch": "Phi3ForCausalLM", "tok": "spm-llama", "fused": True, "cfg": {
        "rope_theta": 10000.0, "max_position_embeddings": 1024, "original_max_position_embeddings": 256,
        "sliding_window": None, "tie_word_embeddings": False,
        "rope_scaling": {"type": "longrope", "long_factor": [1.0, 1.5, 2.0, 3.0, 5.0, 8.0, 12.0, 16.0],
                         "short_factor": [1.0, 1.1, 1.3, 1.7, 2.2, 3.0, 4.0, 6.0]}}},
}
N_VOCAB = 320


def tiny_weights(family: str, seed: int = 0) -> dict[str, np.ndarray]:
    """HF-named float32 weights of one tiny model (deterministic)."""
    f = FAMILIES[family]
    rng = np.random.default_rng(seed + sum(map(ord, family)))
    hd = HEAD_DIM

    def w(*shape: int, std: float = 0.08) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        base = 0.0 if family.startswith("gemma") else 1.0  # Gemma stores weight - 1
        return (base + rng.standard_normal(n) * 0.1).astype(np.float32)

    t: dict[str, np.ndarray] = {"model.embed_tokens.weight": w(N_VOCAB, HIDDEN, std=0.5)}
    for i in range(N_LAYER):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm(HIDDEN)
        if f.get("fused"):
            t[p + "self_attn.qkv_proj.weight"] = w((N_HEAD + 2 * N_KV) * hd, HIDDEN)
            t[p + "mlp.gate_up_proj.weight"] = w(2 * FFN, HIDDEN)
        else:
            t[p + "self_attn.q_proj.weight"] = w(N_HEAD * hd, HIDDEN)
            t[p + "self_attn.k_proj.weight"] = w(N_KV * hd, HIDDEN)
            t[p + "self_attn.v_proj.weight"] = w(N_KV * hd, HIDDEN)
            t[p + "mlp.gate_proj.weight"] = w(FFN, HIDDEN)
            t[p + "mlp.up_proj.weight"] = w(FFN, HIDDEN)
        if f.get("bias"):
            t[p + "self_attn.q_proj.bias"] = w(N_HEAD * hd, std=0.3)
            t[p + "self_attn.k_proj.bias"] = w(N_KV * hd, std=0.3)
            t[p + "self_attn.v_proj.bias"] = w(N_KV * hd, std=0.3)
        if f.get("qk_norm"):
            t[p + "self_attn.q_norm.weight"] = norm(hd)
            t[p + "self_attn.k_norm.weight"] = norm(hd)
        t[p + "self_attn.o_proj.weight"] = w(HIDDEN, N_HEAD * hd)
        t[p + "mlp.down_proj.weight"] = w(HIDDEN, FFN)
        t[p + "post_attention_layernorm.weight"] = norm(HIDDEN)
        if f.get("post_norms"):
            t[p + "pre_feedforward_layernorm.weight"] = norm(HIDDEN)
            t[p + "post_feedforward_layernorm.weight"] = norm(HIDDEN)
    t["model.norm.weight"] = norm(HIDDEN)
    if not f["cfg"].get("tie_word_embeddings", True):
        t["lm_head.weight"] = w(N_VOCAB, HIDDEN, std=0.3)
    if f.get("dtype") == "BF16":
        t = {k: bf16_values(v) for k, v in t.items()}
    return t


def tiny_config(family: str) -> dict[str, Any]:
    f = FAMILIES[family]
    cfg = {"architectures": [f["arch"]], "model_type": family, "vocab_size": N_VOCAB, "hidden_size": HIDDEN,
           "intermediate_size": FFN, "num_hidden_layers": N_LAYER, "num_attention_heads": N_HEAD,
           "num_key_value_heads": N_KV, "max_position_embeddings": 256, "rms_norm_eps": 1e-6,
           "bos_token_id": {"spm": 2, "spm-llama": 1}.get(f["tok"], 0),
           "eos_token_id": {"spm": 1, "spm-llama": 2}.get(f["tok"], 2),
           "torch_dtype": "bfloat16" if f.get("dtype") == "BF16" else "float32"}
    cfg.update(f["cfg"])
    return cfg


def write_tiny(family: str, folder: Path, seed: int = 0) -> Path:
    """Write the tiny HF folder of ``family`` into ``folder`` (created) and return it."""
    f = FAMILIES[family]
    folder.mkdir(parents=True, exist_ok=True)
    cfg = tiny_config(family)
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))
    weights = tiny_weights(family, seed)
    dtype = f.get("dtype", "F32")
    if f.get("shards"):
        write_sharded(folder, weights, f["shards"], dtype)
    else:
        write_safetensors(folder / "model.safetensors", weights, dtype)
    tc: dict[str, Any] = {"chat_template": TEMPLATE, "add_bos_token": False, "add_eos_token": False}
    if f["tok"] == "spm":
        body, pieces = spm_model(N_VOCAB)
        (folder / "tokenizer.model").write_bytes(body)
        tc.update(bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>", add_bos_token=True)
        tc["added_tokens_decoder"] = {str(i): {"content": pieces[i], "special": True} for i in range(3)}
    elif f["tok"] == "spm-llama":  # Phi-3's: llama.cpp's vocab loader looks its special pieces up by text
        body, pieces = spm_model(N_VOCAB, llama_style=True)
        (folder / "tokenizer.model").write_bytes(body)
        tc.update(bos_token="<s>", eos_token="<|endoftext|>", unk_token="<unk>", add_bos_token=False)
        tc["added_tokens_decoder"] = {str(N_VOCAB - 1): {"content": "<|endoftext|>", "special": True}}
    else:
        tokens, merges, specials = tiny_bpe(N_VOCAB)
        (folder / "tokenizer.json").write_text(json.dumps(bpe_tokenizer_json(tokens, merges, specials, f["tok"])))
        tc.update(bos_token="<|endoftext|>", eos_token="<|im_end|>")
    (folder / "tokenizer_config.json").write_text(json.dumps(tc))
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": cfg["bos_token_id"],
                                                               "eos_token_id": cfg["eos_token_id"]}))
    return folder


# ------------------------------------------------------------------------------ HF forward


def _rms(x: np.ndarray, w: np.ndarray, eps: float, gemma: bool) -> np.ndarray:
    y = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    return y * ((1.0 + w) if gemma else w)


def _rope(x: np.ndarray, pos: np.ndarray, base: float, inv_div: np.ndarray | None = None) -> np.ndarray:
    d = x.shape[-1]
    inv = 1.0 / base ** (np.arange(0, d, 2, dtype=np.float64) / d)
    if inv_div is not None:
        inv = inv / inv_div
    ang = pos[:, None] * inv[None, :]  # [n, d/2]
    cos = np.concatenate([np.cos(ang)] * 2, -1)[:, None, :]
    sin = np.concatenate([np.sin(ang)] * 2, -1)[:, None, :]
    rot = np.concatenate([-x[..., d // 2:], x[..., : d // 2]], -1)
    return x * cos + rot * sin


def _llama3_divisors(cfg: dict[str, Any], d: int) -> np.ndarray:
    rs = cfg["rope_scaling"]
    inv = 1.0 / cfg["rope_theta"] ** (np.arange(0, d, 2, dtype=np.float64) / d)
    old, lo, hi, fac = rs["original_max_position_embeddings"], rs["low_freq_factor"], rs["high_freq_factor"], rs["factor"]
    out = []
    for f in inv:
        wl = 2 * math.pi / f
        if wl < old / hi:
            out.append(1.0)
        elif wl > old / lo:
            out.append(fac)
        else:
            s = (old / wl - lo) / (hi - lo)
            out.append(1 / ((1 - s) / fac + s))
    return np.array(out)


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def hf_forward(family: str, cfg: dict[str, Any], t: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """float64 logits [len(ids), vocab] of the HF-layout weights ``t``, as transformers computes them."""
    t = {k: v.astype(np.float64) for k, v in t.items()}
    gemma = family.startswith("gemma")
    n, hd = len(ids), cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    nh, nkv, eps = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["rms_norm_eps"]
    pos = np.arange(n, dtype=np.float64)
    x = t["model.embed_tokens.weight"][ids]
    if gemma:
        x = x * math.sqrt(cfg["hidden_size"])
    x = x * cfg.get("embedding_multiplier", 1.0)
    scale = cfg.get("attention_multiplier") or cfg.get("query_pre_attn_scalar", hd) ** -0.5
    rs = cfg.get("rope_scaling") or {}
    divs = _llama3_divisors(cfg, hd) if rs.get("rope_type") == "llama3" else None
    mscale = 1.0
    if rs.get("type") == "longrope":  # transformers' Phi-3: short factors up to the original context
        orig = cfg["original_max_position_embeddings"]
        divs = np.asarray(rs["long_factor"] if n > orig else rs["short_factor"], np.float64)
        mscale = math.sqrt(1 + math.log(cfg["max_position_embeddings"] / orig) / math.log(orig))
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        sliding = ((family == "gemma2" and i % 2 == 0)
                   or (family == "gemma3" and (i + 1) % cfg["sliding_window_pattern"] != 0))
        h = _rms(x, t[p + "input_layernorm.weight"], eps, gemma)
        if p + "self_attn.qkv_proj.weight" in t:
            qkv = h @ t[p + "self_attn.qkv_proj.weight"].T
            q, k, v = np.split(qkv, [nh * hd, (nh + nkv) * hd], axis=-1)
        else:
            q, k, v = (h @ t[p + f"self_attn.{c}_proj.weight"].T + t.get(p + f"self_attn.{c}_proj.bias", 0.0)
                       for c in "qkv")
        q, k, v = q.reshape(n, nh, hd), k.reshape(n, nkv, hd), v.reshape(n, nkv, hd)
        if p + "self_attn.q_norm.weight" in t:
            q = _rms(q, t[p + "self_attn.q_norm.weight"], eps, gemma)
            k = _rms(k, t[p + "self_attn.k_norm.weight"], eps, gemma)
        base = cfg["rope_local_base_freq"] if family == "gemma3" and sliding else cfg["rope_theta"]
        q, k = _rope(q, pos, base, divs) * mscale, _rope(k, pos, base, divs) * mscale
        k, v = np.repeat(k, nh // nkv, axis=1), np.repeat(v, nh // nkv, axis=1)
        s = np.einsum("ihd,jhd->hij", q, k) * scale
        if cfg.get("attn_logit_softcapping"):
            c = cfg["attn_logit_softcapping"]
            s = np.tanh(s / c) * c
        ii, jj = np.arange(n)[:, None], np.arange(n)[None, :]
        allowed = (jj <= ii) & ((ii - jj < cfg["sliding_window"]) if sliding else True)
        s = np.where(allowed[None], s, -np.inf)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        o = np.einsum("hij,jhd->ihd", a, v).reshape(n, nh * hd) @ t[p + "self_attn.o_proj.weight"].T
        if gemma and p + "pre_feedforward_layernorm.weight" in t:
            o = _rms(o, t[p + "post_attention_layernorm.weight"], eps, True)
            x = x + o
            h = _rms(x, t[p + "pre_feedforward_layernorm.weight"], eps, True)
        else:
            x = x + o * cfg.get("residual_multiplier", 1.0)
            h = _rms(x, t[p + "post_attention_layernorm.weight"], eps, gemma)
        if p + "mlp.gate_up_proj.weight" in t:
            g, u = np.split(h @ t[p + "mlp.gate_up_proj.weight"].T, 2, axis=-1)
        else:
            g, u = h @ t[p + "mlp.gate_proj.weight"].T, h @ t[p + "mlp.up_proj.weight"].T
        act = _gelu_tanh(g) if gemma else g / (1 + np.exp(-g))
        m = (act * u) @ t[p + "mlp.down_proj.weight"].T
        if p + "post_feedforward_layernorm.weight" in t:
            m = _rms(m, t[p + "post_feedforward_layernorm.weight"], eps, True)
        x = x + m * cfg.get("residual_multiplier", 1.0)
    x = _rms(x, t["model.norm.weight"], eps, gemma)
    logits = x @ t.get("lm_head.weight", t["model.embed_tokens.weight"]).T
    logits = logits / cfg.get("logits_scaling", 1.0)
    if cfg.get("final_logit_softcapping"):
        c = cfg["final_logit_softcapping"]
        logits = np.tanh(logits / c) * c
    return logits


# --------------------------------------------------------------------- a real model, exported


_LLAMA_NAMES = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
                "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                "ffn_down": "mlp.down_proj"}


def _hf_name(gguf_name: str) -> str:
    if gguf_name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if gguf_name == "output_norm.weight":
        return "model.norm.weight"
    if gguf_name == "output.weight":
        return "lm_head.weight"
    _, bid, kind, suffix = gguf_name.split(".")
    return f"model.layers.{bid}.{_LLAMA_NAMES[kind]}.{suffix}"


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def export_gguf(gguf_path: Path, folder: Path, dtype: str = "F32") -> Path:
    """A llama-architecture GGUF (byte-level BPE vocab) back to an HF folder from its dequantized tensors."""
    from llmedge.gguf import GGUFFile
    from llmedge.quant.dequant import dequantize

    g = GGUFFile(gguf_path)
    md = g.metadata
    a = md["general.architecture"]
    assert a == "llama"
    nh, nkv = md[f"{a}.attention.head_count"], md[f"{a}.attention.head_count_kv"]
    folder.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, np.ndarray] = {}
    for name, ti in g.tensors.items():
        x = dequantize(ti.data, ti.ggml_type, ti.shape).astype(np.float32)
        if name.endswith("attn_q.weight"):
            x = unpermute(x, nh)
        elif name.endswith("attn_k.weight"):
            x = unpermute(x, nkv)
        tensors[_hf_name(name)] = x
    write_safetensors(folder / "model.safetensors", dict(sorted(tensors.items())), dtype)
    tokens = list(md["tokenizer.ggml.tokens"])
    types = list(md["tokenizer.ggml.token_type"])
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": len(tokens),
           "hidden_size": md[f"{a}.embedding_length"], "intermediate_size": md[f"{a}.feed_forward_length"],
           "num_hidden_layers": md[f"{a}.block_count"], "num_attention_heads": nh, "num_key_value_heads": nkv,
           "max_position_embeddings": md[f"{a}.context_length"], "rope_theta": md[f"{a}.rope.freq_base"],
           "rms_norm_eps": md[f"{a}.attention.layer_norm_rms_epsilon"],
           "tie_word_embeddings": "output.weight" not in g.tensors,
           "bos_token_id": md.get("tokenizer.ggml.bos_token_id"), "eos_token_id": md.get("tokenizer.ggml.eos_token_id")}
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))
    specials = {i: t for i, (t, ty) in enumerate(zip(tokens, types)) if ty == 3}
    tj = bpe_tokenizer_json(tokens, list(md["tokenizer.ggml.merges"]), specials, "smollm")
    (folder / "tokenizer.json").write_text(json.dumps(tj))
    tc = {"chat_template": md.get("tokenizer.chat_template"), "add_prefix_space": False,
          "bos_token": tokens[cfg["bos_token_id"]], "eos_token": tokens[cfg["eos_token_id"]],
          "unk_token": tokens[md["tokenizer.ggml.unknown_token_id"]],
          "pad_token": tokens[md["tokenizer.ggml.padding_token_id"]]}
    (folder / "tokenizer_config.json").write_text(json.dumps(tc))
    (folder / "README.md").write_text("---\nlicense: apache-2.0\nbase_model: HuggingFaceTB/SmolLM2-135M\n---\n# SmolLM2-135M-Instruct\n")
    return folder
