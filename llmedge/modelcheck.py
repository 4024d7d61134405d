"""Model-level validation of a parsed GGUF file, before any architecture code or kernel sees it.

The reader (:mod:`llmedge.gguf`) proves the bytes are a well-formed GGUF; this module proves the
metadata and tensor shapes describe a model the kernels can run without reading out of bounds: layer
and head counts in range, the embedding and output matrices as wide as the vocabulary, and every
standard per-layer tensor of the shape its hyperparameters imply (llama.cpp's ``create_tensor``
shape checks). Each problem is one :class:`~llmedge.errors.ModelError` line naming it.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from llmedge.errors import GGUFError, ModelError
from llmedge.gguf import GGUFFile, _q

MAX_LAYERS = 512  # LLAMA_MAX_LAYERS
MAX_DIM = 1 << 20  # no embedding, feed-forward or head size is near this
BYTE_TYPE = 6  # LLAMA_TOKEN_TYPE_BYTE
_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def check_model_file(g: GGUFFile) -> None:
    """Raise ModelError (one line, with the file name) when the model's metadata or shapes are unusable."""
    try:
        _check(g)
    except GGUFError as e:
        raise ModelError(str(e)) from None
    except ModelError as e:
        raise ModelError(f"{g.path}: {e}") from None


def _count(g: GGUFFile, key: str, lo: int, hi: int, default: int | None = None) -> int:
    v = g.get_int(key) if default is None else g.get_int(key, default)
    if not lo <= v <= hi:
        raise ModelError(f"metadata {key} = {v} is out of range ({lo}..{hi})")
    return v


def _check(g: GGUFFile) -> None:
    from llmedge.models import model_class

    a = g.architecture
    # an unsupported architecture is reported as such, before its keys are looked up
    family = getattr(model_class(a), "family", None)
    fused_gate_up = bool(getattr(family, "fused_gate_up", False))
    tokens = g.get("tokenizer.ggml.tokens")
    if tokens is None or not hasattr(tokens, "__len__"):
        raise ModelError("the model has no vocabulary (tokenizer.ggml.tokens)")
    n_vocab = len(tokens)
    _check_vocab(g, tokens, n_vocab)
    n_layer = _count(g, f"{a}.block_count", 1, MAX_LAYERS)
    n_embd = _count(g, f"{a}.embedding_length", 1, MAX_DIM)
    _count(g, f"{a}.context_length", 1, 1 << 24)
    n_head = _count(g, f"{a}.attention.head_count", 1, n_embd * 64)
    n_kv = _count(g, f"{a}.attention.head_count_kv", 1, n_head, default=n_head)
    if n_head % n_kv:
        raise ModelError(f"{n_head} attention heads cannot be shared by {n_kv} KV heads")
    head_k = _count(g, f"{a}.attention.key_length", 1, MAX_DIM, default=max(1, n_embd // n_head))
    head_v = _count(g, f"{a}.attention.value_length", 1, MAX_DIM, default=head_k)
    n_ff = _count(g, f"{a}.feed_forward_length", 1, MAX_DIM)
    _shape(g, "token_embd.weight", (n_embd, n_vocab), "vocabulary")
    if "output.weight" in g.tensors:
        _shape(g, "output.weight", (n_embd, n_vocab), "vocabulary")
    _shape(g, "output_norm.weight", (n_embd,))
    expected = {
        "attn_norm": (n_embd,), "ffn_norm": (n_embd,), "post_attention_norm": (n_embd,),
        "post_ffw_norm": (n_embd,), "attn_q_norm": (head_k,), "attn_k_norm": (head_k,),
        "attn_q": (n_embd, n_head * head_k), "attn_k": (n_embd, n_kv * head_k),
        "attn_v": (n_embd, n_kv * head_v), "attn_output": (n_head * head_v, n_embd),
        "attn_qkv": (n_embd, n_head * head_k + n_kv * (head_k + head_v)),
        "ffn_gate": (n_embd, n_ff), "ffn_up": (n_embd, 2 * n_ff if fused_gate_up else n_ff),
        "ffn_down": (n_ff, n_embd),
    }
    for i in range(n_layer):
        for name, dims in expected.items():
            _shape(g, f"blk.{i}.{name}.weight", dims)


def _check_vocab(g: GGUFFile, tokens: Any, n_vocab: int) -> None:
    for key, v in g.metadata.items():
        if key.startswith("tokenizer.ggml.") and key.endswith("_token_id") and not isinstance(v, bool) \
                and isinstance(v, int) and not 0 <= v < n_vocab:
            raise ModelError(f"metadata {_q(key)} = {v} is not a token id (the vocabulary has {n_vocab} tokens)")
    for key in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        v = g.get(key)
        if v is not None and (not isinstance(v, np.ndarray) or v.ndim != 1 or len(v) != n_vocab):
            n = len(v) if hasattr(v, "__len__") else 1
            raise ModelError(f"{key} has {n} entries for {n_vocab} tokens")
    types = g.get("tokenizer.ggml.token_type")
    if types is None:
        return
    for i in np.flatnonzero(types == BYTE_TYPE):
        text = tokens[int(i)]
        if not isinstance(text, str) or not _BYTE_TOKEN.fullmatch(text):
            raise ModelError(f"byte token {int(i)} is {str(text)[:40]!r}, not of the form <0xNN>")


def _shape(g: GGUFFile, name: str, dims: tuple[int, ...], what: str = "") -> None:
    t = g.tensors.get(name)
    if t is None:
        return  # a missing tensor is the architecture's to report (some are optional)
    got = tuple(t.dims) + (1,) * (len(dims) - len(t.dims))
    if got[: len(dims)] != dims or any(d != 1 for d in got[len(dims):]):
        if what == "vocabulary" and got[:1] == dims[:1] and len(got) > 1:
            raise ModelError(f"tensor '{name}' has {got[1]} rows but the vocabulary has {dims[1]} tokens")
        raise ModelError(f"tensor '{name}' has shape {list(t.dims)}, expected {list(dims)}")
