"""The gemma3 architecture: sliding-window layers (5 of every 6) with a local RoPE base, per-head
Q/K RMSNorm, norms before and after attention and FFN, GELU-gated FFN, scaled and tied embeddings."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from llmedge.backends.base import Backend
from llmedge.gguf import GGUFFile
from llmedge.kvcache import SequenceCache
from llmedge.models.base import AttentionSpec, Decoder, Weights, make_sequence_cache, rope_scale_from

SWA_PATTERN = 6  # llama.cpp: every 6th layer is global, the others use the sliding window
LOCAL_ROPE_BASE = 10000.0


@dataclass
class Params:
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_head: int
    n_kv_head: int
    head_dim: int
    n_ff: int
    eps: float
    rope_base: float
    rope_scale: float
    window: int
    swa_layers: list[bool]

    @classmethod
    def from_gguf(cls, g: GGUFFile) -> Params:
        a = g.architecture
        n_layer = g.get_int(f"{a}.block_count")
        pattern = g.get(f"{a}.attention.sliding_window_pattern")
        if pattern is not None and not isinstance(pattern, int):
            swa = [bool(x) for x in pattern][:n_layer]
        else:
            period = pattern if isinstance(pattern, int) and pattern > 0 else SWA_PATTERN
            swa = [il % period < period - 1 for il in range(n_layer)]
        n_embd = g.get_int(f"{a}.embedding_length")
        n_head = g.get_int(f"{a}.attention.head_count")
        return cls(
            n_vocab=len(g.get_array("tokenizer.ggml.tokens")),
            n_ctx_train=g.get_int(f"{a}.context_length"),
            n_embd=n_embd,
            n_layer=n_layer,
            n_head=n_head,
            n_kv_head=g.get_int(f"{a}.attention.head_count_kv", n_head),
            head_dim=g.get_int(f"{a}.attention.key_length", n_embd // n_head),
            n_ff=g.get_int(f"{a}.feed_forward_length"),
            eps=g.get_float(f"{a}.attention.layer_norm_rms_epsilon"),
            rope_base=g.get_float(f"{a}.rope.freq_base", 1_000_000.0),
            rope_scale=rope_scale_from(g, a),
            window=g.get_int(f"{a}.attention.sliding_window"),
            swa_layers=swa,
        )


class Model(Decoder):
    """Gemma 3: norms before and after each block, GELU-gated FFN, scaled embeddings."""

    glu_kind = "gelu"

    def __init__(self, gguf: GGUFFile, backend: Backend) -> None:
        self.params = p = Params.from_gguf(gguf)
        self.backend = backend
        wt = Weights(gguf, backend)
        self.token_embd = wt.get("token_embd.weight")
        self.layers = [
            wt.layer(i, ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_q_norm", "attn_k_norm", "attn_output",
                         "post_attention_norm", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down", "post_ffw_norm"))
            for i in range(p.n_layer)
        ]
        self.output_norm = wt.get("output_norm.weight")
        self.output = wt.output()
        self.embd_scale = np.float32(math.sqrt(p.n_embd))
        # llama.cpp scales Q itself (then attends with scale 1): the F16 rounding of Q sees the
        # scaled values, which matters for Gemma's tiny query components
        q_scale = 1.0 / math.sqrt(p.head_dim)
        self.specs = [
            AttentionSpec(p.n_head, p.n_kv_head, p.head_dim, p.head_dim,
                          LOCAL_ROPE_BASE if swa else p.rope_base, 1.0 if swa else p.rope_scale,
                          neox=True, scale=1.0, eps=p.eps, window=p.window if swa else None,
                          q_scale=q_scale)
            for swa in p.swa_layers
        ]

    def make_cache(self, n_ctx: int, kv_type: str = "f16", max_batch: int = 512) -> SequenceCache:
        p = self.params
        windows = [p.window if swa else None for swa in p.swa_layers]
        return make_sequence_cache(p.n_layer, n_ctx, p.n_kv_head, p.head_dim, kv_type, windows, max_batch)
