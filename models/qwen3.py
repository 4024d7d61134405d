"""The qwen3 architecture (dense Qwen 3): RMSNorm over each head of Q and K before RoPE, no biases,
RoPE on NeoX pairs."""

from __future__ import annotations

from llmedge.models.base import Decoder
from llmedge.models.spec import Family

FAMILY = Family("qwen3", neox=True, qk_norm=True)


class Model(Decoder):
    family = FAMILY
