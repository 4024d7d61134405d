"""The phi3 architecture (Phi-3 / 3.5 / 4-mini): fused QKV (``attn_qkv``) and fused gate/up
(``ffn_up`` holds 2 * n_ff rows, gate first) weights, RoPE on NeoX pairs with LongRoPE's
``rope_factors_long`` / ``rope_factors_short`` (long ones when the context exceeds
``rope.scaling.original_context_length``) and its ``rope.scaling.attn_factor``, Q scaled by
1/sqrt(head_dim). llama.cpp ignores Phi's sliding window, and so does this."""

from __future__ import annotations

from llmedge.models.base import Decoder
from llmedge.models.spec import Family

FAMILY = Family("phi3", neox=True, fused_qkv="optional", fused_gate_up=True, q_scale="head_dim",
                rope_factors="longrope")


class Model(Decoder):
    family = FAMILY
