"""A tiny random-weight llama GGUF (about 100 KB) that every store verb can pull, show and run.

SentencePiece-style vocabulary (three specials, the 256 byte tokens and a few words), one layer, an
embedding of 32, F32 weights and a ChatML-like Jinja template, so `llmedge run` answers in a blink.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
WORDS = ["▁hi", "▁the", "▁a", "▁sky", "▁is", "▁blue", "hi", "the"]


def write_tiny_llama(path: Path, seed: int = 0, name: str = "tiny", template: str | None = TEMPLATE,
                     split_max_tensors: int = 0) -> Path:
    """Write the tiny model to `path` (different seeds give different bytes; `template=None` leaves the
    chat template out; `split_max_tensors` writes `<stem>-0000i-of-0000n.gguf` parts instead) and return
    `path`."""
    rng = np.random.default_rng(seed)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)] + WORDS
    types = [2, 3, 3] + [6] * 256 + [1] * len(WORDS)
    n_vocab, n_embd, n_ff, n_head = len(tokens), 32, 64, 2
    w = gguf.GGUFWriter(str(path), "llama", split_max_tensors=split_max_tensors)
    w.add_name(name)
    w.add_context_length(256)
    w.add_embedding_length(n_embd)
    w.add_block_count(1)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * 259 + [-float(i) for i in range(len(WORDS))])
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    if template is not None:
        w.add_chat_template(template)

    def t(name: str, *shape: int) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * 0.2).astype(np.float32))

    t("token_embd.weight", n_vocab, n_embd)
    w.add_tensor("output_norm.weight", np.ones(n_embd, np.float32))
    for part in ("attn_norm", "ffn_norm"):
        w.add_tensor(f"blk.0.{part}.weight", np.ones(n_embd, np.float32))
    for part in ("attn_q", "attn_k", "attn_v", "attn_output"):
        t(f"blk.0.{part}.weight", n_embd, n_embd)
    t("blk.0.ffn_gate.weight", n_ff, n_embd)
    t("blk.0.ffn_up.weight", n_ff, n_embd)
    t("blk.0.ffn_down.weight", n_embd, n_ff)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
