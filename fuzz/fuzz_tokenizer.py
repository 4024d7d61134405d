"""Fuzz target: the tokenizer of both real vocabularies (SmolLM2's byte-level BPE and Gemma 3's
SentencePiece) on arbitrary bytes: encode (plain and with special tokens), decode of arbitrary ids,
and the piece of every id produced.

The first input byte picks the vocabulary and the flags; the rest is the text (UTF-8 with errors
replaced, so every code point including lone surrogates' replacements is reachable) or, for decoding,
little-endian u32 ids (out of range ones included). Only a TokenizerError may escape; ids must be in
range and decoding what was encoded must not fail.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402

TARGET = "tokenizer"
MODELS = ("smollm2:135m", "gemma3:270m")

with harness.instrument(__name__, include=["llmedge.tokenizer"]):
    from llmedge.tokenizer import Tokenizer

from llmedge.errors import TokenizerError  # noqa: E402

_TOKENIZERS: list[Tokenizer] = []


def tokenizers(paths: list[Path] | None = None) -> list[Tokenizer]:
    """Both real tokenizers, built once from the models' metadata (pulled through the store)."""
    if not _TOKENIZERS:
        from llmedge.gguf import GGUFFile
        from llmedge.store import Store

        for p in paths or [Store().resolve(m, pull=True) for m in MODELS]:
            _TOKENIZERS.append(Tokenizer.from_metadata(GGUFFile(p).metadata))
    return _TOKENIZERS


def test_one_input(data: bytes) -> None:
    if not data:
        return
    flags, rest = data[0], data[1:]
    tok = tokenizers()[flags & 1]
    n = tok.n_vocab
    if flags & 8:  # decode arbitrary ids
        ids = [int.from_bytes(rest[i:i + 4], "little") % (n + 16) for i in range(0, len(rest) - 3, 4)]
        try:
            tok.decode(ids)
        except TokenizerError:
            pass
        return
    text = rest.decode("utf-8", "replace")
    ids = tok.encode(text, add_bos=bool(flags & 2), special=bool(flags & 4))
    assert all(isinstance(t, int) and 0 <= t < n for t in ids)
    tok.decode(ids)
    for t in ids[:64]:
        tok.token_to_piece(t, special=bool(flags & 4))


def seeds() -> list[bytes]:
    texts = ["Hello world", " leading space", "日本語のテキスト", "emoji 😀👍🏽", "tabs\tand\nnewlines\r\n",
             "<|im_start|>user\nhi<|im_end|>", "<start_of_turn>user\nhi<end_of_turn>", "   ", "\x00\x01",
             "ﬁ ligature Ǆ", "1234567890 3.14159", "<0x41>"]
    return [bytes([f]) + t.encode() for t in texts for f in (0, 1, 6, 7)] + [b"\x08" + bytes(range(64)),
                                                                            b"\x09" + b"\xff" * 64]


if __name__ == "__main__":
    tokenizers()
    harness.fuzz(TARGET, test_one_input, seeds)
