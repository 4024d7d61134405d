"""The gemma architecture (Gemma 1): GELU-gated FFN, embeddings scaled by sqrt(n_embd) and tied, Q
scaled by 1/sqrt(head_dim) before attention, RoPE on NeoX pairs."""

from __future__ import annotations

from llmedge.models.base import Decoder
from llmedge.models.spec import Family

FAMILY = Family("gemma", neox=True, glu="gelu", embd_scale=True, q_scale="head_dim")


class Model(Decoder):
    family = FAMILY
