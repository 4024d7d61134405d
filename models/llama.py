"""The llama architecture (Llama 2/3, SmolLM2, Mistral-style dense models): RMSNorm, RoPE, GQA, SwiGLU."""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmedge.backends.base import Backend
from llmedge.gguf import GGUFFile
from llmedge.kvcache import SequenceCache
from llmedge.models.base import AttentionSpec, Decoder, Weights, make_sequence_cache, rope_scale_from


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
    n_rot: int
    eps: float
    rope_base: float
    rope_scale: float

    @classmethod
    def from_gguf(cls, g: GGUFFile) -> Params:
        a = g.architecture
        n_embd = g.get_int(f"{a}.embedding_length")
        n_head = g.get_int(f"{a}.attention.head_count")
        head_dim = g.get_int(f"{a}.attention.key_length", n_embd // n_head)
        return cls(
            n_vocab=len(g.get_array("tokenizer.ggml.tokens")),
            n_ctx_train=g.get_int(f"{a}.context_length"),
            n_embd=n_embd,
            n_layer=g.get_int(f"{a}.block_count"),
            n_head=n_head,
            n_kv_head=g.get_int(f"{a}.attention.head_count_kv", n_head),
            head_dim=head_dim,
            n_ff=g.get_int(f"{a}.feed_forward_length"),
            n_rot=g.get_int(f"{a}.rope.dimension_count", head_dim),
            eps=g.get_float(f"{a}.attention.layer_norm_rms_epsilon"),
            rope_base=g.get_float(f"{a}.rope.freq_base", 10000.0),
            rope_scale=rope_scale_from(g, a),
        )


class Model(Decoder):
    """Llama: pre-norm blocks, SwiGLU, RoPE with adjacent pairs."""

    glu_kind = "silu"

    def __init__(self, gguf: GGUFFile, backend: Backend) -> None:
        self.params = p = Params.from_gguf(gguf)
        self.backend = backend
        wt = Weights(gguf, backend)
        self.token_embd = wt.get("token_embd.weight")
        self.layers = [
            wt.layer(i, ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate",
                         "ffn_up", "ffn_down"))
            for i in range(p.n_layer)
        ]
        self.output_norm = wt.get("output_norm.weight")
        self.output = wt.output()
        self.attn = AttentionSpec(p.n_head, p.n_kv_head, p.head_dim, p.n_rot, p.rope_base, p.rope_scale,
                                  neox=False, scale=1.0 / math.sqrt(p.head_dim), eps=p.eps)
        self.specs = [self.attn] * p.n_layer

    def make_cache(self, n_ctx: int, kv_type: str = "f16", max_batch: int = 512) -> SequenceCache:
        p = self.params
        return make_sequence_cache(p.n_layer, n_ctx, p.n_kv_head, p.head_dim, kv_type, [None] * p.n_layer,
                                   max_batch)
