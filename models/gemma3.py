"""The gemma3 architecture (text): sliding-window layers (5 of every 6) with a local RoPE base of
10000, per-head Q/K RMSNorm, norms before and after attention and FFN, GELU-gated FFN, embeddings
scaled by sqrt(n_embd) and tied, Q scaled by 1/sqrt(head_dim) before attention."""

from __future__ import annotations

from llmedge.models.base import Decoder
from llmedge.models.spec import Family, swa_every

FAMILY = Family("gemma3", neox=True, glu="gelu", rope_base=1_000_000.0, qk_norm=True, post_norms=True,
                embd_scale=True, q_scale="head_dim", swa=swa_every(6), swa_rope_base=10000.0)


class Model(Decoder):
    family = FAMILY
