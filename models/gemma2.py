"""The gemma2 architecture: Gemma with norms after attention and FFN, sliding-window attention on every
other layer (window 4096 unless the file says), attention scores soft-capped (50) and logits
soft-capped (30) unless the file gives other caps."""

from __future__ import annotations

from llmedge.models.base import Decoder
from llmedge.models.spec import Family, swa_every

FAMILY = Family("gemma2", neox=True, glu="gelu", embd_scale=True, q_scale="head_dim", post_norms=True,
                swa=swa_every(2), default_window=4096, attn_softcap=50.0, final_softcap=30.0)


class Model(Decoder):
    family = FAMILY
