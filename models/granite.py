"""The granite architecture (IBM Granite 3.x dense): llama's blocks with the file's multipliers:
embeddings times ``embedding_scale``, attention and FFN outputs times ``residual_scale`` before each
residual add, ``attention.scale`` as the attention score scale, logits divided by ``logit_scale``."""

from __future__ import annotations

from llmedge.models.base import Decoder
from llmedge.models.spec import Family

FAMILY = Family("granite", neox=False, o_bias="optional", rope_factors="freqs", file_scales=True)


class Model(Decoder):
    family = FAMILY
