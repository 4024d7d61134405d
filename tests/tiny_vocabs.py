"""Tiny byte-level BPE vocabularies, one vocab-only GGUF per family pre-tokenizer, written with
``gguf.GGUFWriter``.

Used by tests/test_family_tokenizers.py and by tests/fixtures/make_family_tokenizer_fixtures.py (which
trains the vocabulary once, stores it with llama.cpp's token ids in
fixtures/llamacpp_family_tokenizers.json; the test rebuilds the same GGUF from that stored vocabulary).
Only ``gguf`` and the standard library are imported, so the fixture script runs in llama.cpp's venv.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import gguf

# family (general.architecture) -> the tokenizer.ggml.pre values llama.cpp's converter writes for the
# BPE vocabularies of that family's popular models
FAMILY_PRE: dict[str, tuple[str, ...]] = {
    "llama": ("llama-bpe", "smollm", "tekken", "default"),  # Llama 3.x, SmolLM, Mistral NeMo, old BPEs
    "qwen2": ("qwen2", "deepseek-r1-qwen"),  # Qwen 2 / 2.5, DeepSeek-R1-Distill-Qwen
    "qwen3": ("qwen2",),
    "phi3": ("gpt-4o",),  # Phi-4-mini (Phi-3 / 3.5 are SentencePiece)
    "granite": ("refact",),  # Granite 3.x
}
# (gemma, gemma2, gemma3 are SentencePiece: covered by tests/test_tokenizer.py's Gemma 3 fixtures)

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>")

# texts where the pre-tokenizers differ: digit grouping, contractions and case, CJK and other scripts,
# newlines and whitespace runs, code, punctuation runs
EXTRA_TEXTS = (
    "1 12 123 1234 12345 123456 1234567 3.14159 1,000,000 0x1F 2024-12-02",
    "I'M don't DON'T you're YOU'RE we'll WE'LL she'd it's IT'S they've o'clock rock'n'roll",
    "中文abc日本語テキスト한국어123混合 text 漢字かなカナ，标点。符号！",
    "a\n\nb\r\n\r\nc \n d\n\n\n   e\t\n\tf\u3000g\u00a0h",
    "for (int i = 0; i < 10; i++) {\n\tx += i * 2; // sum\n}\nif x: return 'y'\n    def f(a,b):\n        pass",
    "CamelCaseWord snake_case_word kebab-case-word ALLCAPS MixedUPPERlower iPhone McDonald's",
    "!!! ??? ... --- *** /// \\\\ ||| $$$ ### @@@ %%% ^^^ &&& ((( ))) [[[ ]]] {{{ }}}",
    "https://example.com/path/to/file.html?q=1&r=2 user@example.org C:\\Users\\x /usr/bin/env",
    "<|im_start|>user\nHi 123<|im_end|>\n<|im_start|>assistant\n<|endoftext|>",
    "Ünïcödé Ωμέγα Привет мир مرحبا नमस्ते ไทย 👍🏽 emoji🙂text",
)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (every byte-level BPE vocabulary's alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def train(texts: list[str], n_merges: int) -> tuple[list[str], list[str]]:
    """A deterministic byte-level BPE: the 256 byte symbols, then ``n_merges`` merges of the most
    frequent adjacent pair (ties by the pair's text) over whitespace-led words. Returns (tokens
    without specials, merges as "a b")."""
    b2u = bytes_to_unicode()
    words = Counter()
    for t in texts:
        for sp in SPECIALS:  # never learn a special token's text as a merge
            t = t.replace(sp, " ")
        for w in re.findall(r" ?[^\s]+|\s+", t):
            words[tuple(b2u[b] for b in w.encode("utf-8"))] += 1
    tokens = [b2u[b] for b in range(256)]
    known = set(tokens)
    merges: list[str] = []
    seqs = {w: list(w) for w in words}
    while len(merges) < n_merges:
        pairs: Counter = Counter()
        for w, c in words.items():
            s = seqs[w]
            for a, b in zip(s, s[1:]):
                pairs[(a, b)] += c
        if not pairs:
            break
        (a, b), _ = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        merges.append(f"{a} {b}")
        if a + b not in known:
            tokens.append(a + b)
            known.add(a + b)
        for w in words:
            s, out, i = seqs[w], [], 0
            while i < len(s):
                if i + 1 < len(s) and s[i] == a and s[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            seqs[w] = out
    return tokens, merges


def write(path: Path, arch: str, pre: str, tokens: list[str], merges: list[str]) -> Path:
    """A vocab-only GGUF (tiny hyper-parameters, no tensors) for ``arch`` with pre-tokenizer ``pre``."""
    all_tokens = list(tokens) + list(SPECIALS)
    if len(set(all_tokens)) != len(all_tokens):
        raise ValueError("duplicate tokens in the tiny vocabulary")
    types = [1] * len(tokens) + [3] * len(SPECIALS)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny vocabulary")
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(1)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(all_tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(all_tokens.index("<|begin_of_text|>"))
    w.add_eos_token_id(all_tokens.index("<|endoftext|>"))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def cases() -> list[tuple[str, str]]:
    """(family, pre) pairs, each family's pre-tokenizers in order."""
    return [(arch, pre) for arch, pres in FAMILY_PRE.items() for pre in pres]


def ids_keys() -> tuple[str, ...]:
    return ("bos=0,special=0", "bos=0,special=1", "bos=1,special=1")


def flags(key: str) -> dict[str, Any]:
    return {"add_bos": "bos=1" in key, "special": "special=1" in key}
