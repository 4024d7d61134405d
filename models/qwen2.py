"""The qwen2 architecture (Qwen 2 / 2.5, DeepSeek-R1-Distill-Qwen): llama's blocks with biases on the
Q/K/V projections and RoPE on NeoX pairs (i, i + n_rot/2)."""

from __future__ import annotations

from llmedge.models.base import Decoder
from llmedge.models.spec import Family

FAMILY = Family("qwen2", neox=True, qkv_bias="required")


class Model(Decoder):
    family = FAMILY
