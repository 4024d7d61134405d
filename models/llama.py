"""The llama architecture (Llama 2/3/3.1/3.2, SmolLM, Mistral, TinyLlama): pre-norm blocks, SwiGLU,
RoPE on adjacent pairs with Llama 3's optional ``rope_freqs`` factors (or LongRoPE's when the file says
so), optional attention biases, tied or separate output."""

from __future__ import annotations

from llmedge.models.base import Decoder
from llmedge.models.spec import Family

FAMILY = Family("llama", neox=False, qkv_bias="optional", o_bias="optional", rope_factors="freqs")


class Model(Decoder):
    family = FAMILY
