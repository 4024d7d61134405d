"""Vocabularies of Hugging Face checkpoints as llama.cpp's convert_hf_to_gguf.py writes them.

Owns the ``tokenizer.ggml.*`` part of a conversion, without transformers or sentencepiece:

- **BPE** (``tokenizer.json`` with a byte-level BPE model, written as ``gpt2``): tokens in id order
  from the model's vocab and ``added_tokens`` (ids beyond them up to ``config.vocab_size`` become
  ``[PAD{i}]``, UNUSED), added tokens CONTROL when special or when they look special
  (``<|...|>``, ``<unusedN>``...), else USER_DEFINED; merges, special ids, add-BOS/EOS flags and the
  chat template through ``gguf.SpecialVocab`` (the code llama.cpp's converter itself uses).
- **SentencePiece** (``tokenizer.model``, written as ``llama``): the protobuf is read by a small
  reader of the three fields that matter (piece, score, type); ``added_tokens.json`` and
  ``tokenizer_config.json``'s ``added_tokens_decoder`` override pieces as llama.cpp does.

The BPE pre-tokenizer name (``tokenizer.ggml.pre``). llama.cpp names it by hashing the ids that
the Hugging Face tokenizer gives a fixed check text. Without transformers we do it in two steps:
the ``pre_tokenizer`` section of ``tokenizer.json`` is matched against the configurations of the
pre-tokenizers llmedge implements (a Split regex plus ByteLevel, or Digits plus ByteLevel, or plain
ByteLevel); each name that configuration admits is then tried: llmedge's own tokenizer (which is
llama.cpp's, id for id) encodes the check text with the converted vocabulary, and a hash that equals
one of llama.cpp's known hashes for that name decides (so SmolLM2 is ``smollm``, Qwen2 ``qwen2``,
Llama 3 ``llama-bpe``, exactly the names llama.cpp writes). A known configuration whose vocabulary
is not one of those models (a fine-tune with new tokens, a test vocabulary) takes the
configuration's first name, which pre-tokenizes identically. A configuration that matches none
fails with one line.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path
from typing import Any

import gguf

TT = gguf.TokenType

CHKTXT = (
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) ✅ "
    "🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ "
    "------======= нещо на Български ''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, "
    "'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL"
)

# llama.cpp's hashes of the check text's ids (convert_hf_to_gguf.py, get_vocab_base_pre), per name
KNOWN_HASHES: dict[str, str] = {
    "0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5": "llama-bpe",
    "c136ed14d01c2745d4f60a9596ae66800e2b61fa45643e72436041855ad4089d": "smaug-bpe",
    "855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249": "smollm",
    "35d91631860c815f952d711435f48d356ebac988362536bed955d43bfa436e34": "starcoder",
    "6221ad2852e85ce96f791f476e0b390cf9b474c9e3d1362f53a24a06dc8220ff": "refact",
    "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea": "qwen2",
    "b3f499bb4255f8ca19fccd664443283318f2fd2414d5e0b040fbdd0cc195d6c5": "deepseek-r1-qwen",
    "3ce83efda5659b07b1ad37ca97ca5797ea4285d9b9ab0dc679e4a720c9da7454": "gpt-2",
    "fcace8b9cac38ce847670c970cd5892031a753a1ef381abd1d9af00f713da085": "phi-2",
}

_CONTRACTIONS_CI = "(?i:'s|'t|'re|'ve|'m|'ll|'d)"
_HF_LLAMA3 = (_CONTRACTIONS_CI + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
              "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
_HF_QWEN2 = (_CONTRACTIONS_CI + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
             "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")

# a normalized pre_tokenizer configuration -> the llama.cpp names it admits, the fallback first
_PRE_CONFIGS: dict[str, tuple[str, ...]] = {
    "bytelevel": ("gpt-2", "phi-2"),
    "digits+bytelevel": ("starcoder", "smollm", "refact"),
    "split:" + _HF_LLAMA3 + "+bytelevel": ("llama-bpe", "smaug-bpe"),
    "split:" + _HF_QWEN2 + "+bytelevel": ("qwen2", "deepseek-r1-qwen"),
}


class VocabError(ValueError):
    """A tokenizer the converter cannot turn into a GGUF vocabulary (one line for the user)."""


@dataclass
class Vocab:
    """The tokenizer metadata of one converted model, written by :meth:`add_to_gguf`."""

    model: str  # "gpt2" or "llama"
    pre: str
    tokens: list[str]
    toktypes: list[int]
    scores: list[float] | None = None
    special: gguf.SpecialVocab | None = None
    more_special: gguf.SpecialVocab | None = None  # CodeGemma's FIM ids, added after the first
    extra: dict[str, Any] = field(default_factory=dict)  # add_space_prefix and such, GGUFWriter method -> value

    def add_to_gguf(self, w: gguf.GGUFWriter) -> None:
        w.add_tokenizer_model(self.model)
        w.add_tokenizer_pre(self.pre)
        w.add_token_list(self.tokens)
        if self.scores is not None:
            w.add_token_scores(self.scores)
        w.add_token_types(self.toktypes)
        for sv in (self.special, self.more_special):
            if sv is not None:
                sv.add_to_gguf(w, quiet=True)
        for method, value in self.extra.items():
            getattr(w, method)(value)


def looks_special(token: str) -> bool:
    """convert_hf_to_gguf's does_token_look_special."""
    return (token in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
            or (token.startswith("<|") and token.endswith("|>"))
            or (token.startswith("<｜") and token.endswith("｜>"))
            or (token.startswith("<unused") and token.endswith(">")))


def read_json(path: Path) -> Any:
    """A JSON file's value; an unreadable file is a VocabError (one line)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise VocabError(f"cannot read {path.name}: {e}") from None


# ---------------------------------------------------------------------------------------- BPE


def bpe_vocab(folder: Path, vocab_size: int | None) -> Vocab:
    """The ``gpt2`` vocabulary of ``folder/tokenizer.json`` (byte-level BPE)."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise VocabError(f"{folder} has neither tokenizer.model nor tokenizer.json")
    tj = read_json(path)
    model = tj.get("model") or {}
    if model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict):
        raise VocabError(f"tokenizer.json holds a {model.get('type')!r} model, not a byte-level BPE")
    ids: dict[int, str] = {int(i): t for t, i in model["vocab"].items()}
    added: dict[int, dict[str, Any]] = {}
    for a in tj.get("added_tokens") or []:
        ids[int(a["id"])] = a["content"]
        added[int(a["id"])] = a
    n = vocab_size if vocab_size is not None else max(ids) + 1
    if max(ids) >= n:
        raise VocabError(f"tokenizer.json has token id {max(ids)}, beyond config.json's vocab_size {n}")
    tokens: list[str] = []
    types: list[int] = []
    for i in range(n):
        if i not in ids:
            tokens.append(f"[PAD{i}]")
            types.append(TT.UNUSED)
            continue
        tok = ids[i]
        if i in added:
            if added[i].get("special") or looks_special(tok):
                types.append(TT.CONTROL)
            else:
                tok = tok.replace("\u2581", " ")
                types.append(TT.USER_DEFINED)
        else:
            types.append(TT.NORMAL)
        tokens.append(tok)
    special = gguf.SpecialVocab(folder, load_merges=True)
    vocab = Vocab("gpt2", "", tokens, types, special=special)
    vocab.pre = detect_pre(tj, vocab)
    return vocab


def pre_config_key(tj: dict[str, Any]) -> str:
    """tokenizer.json's pre_tokenizer, reduced to what decides the split (see _PRE_CONFIGS)."""
    pt = tj.get("pre_tokenizer")
    if not isinstance(pt, dict):
        return "none"
    steps = pt.get("pretokenizers") if pt.get("type") == "Sequence" else [pt]
    parts: list[str] = []
    for s in steps or []:
        kind = s.get("type")
        if kind == "ByteLevel":
            if s.get("add_prefix_space"):
                parts.append("bytelevel-prefix")
            else:
                parts.append("bytelevel" if s.get("use_regex", True) or parts else "bytelevel-noregex")
        elif kind == "Digits":
            parts.append("digits" if s.get("individual_digits") else "digits-grouped")
        elif kind == "Split":
            pat = (s.get("pattern") or {}).get("Regex")
            if pat is None or s.get("behavior") != "Isolated" or s.get("invert"):
                parts.append("split-other")
            else:
                parts.append("split:" + pat)
        else:
            parts.append(str(kind).lower())
    return "+".join(parts)


def _chk_hash(vocab: Vocab, pre: str) -> str:
    from llmedge.tokenizer import Tokenizer

    sv = vocab.special
    meta: dict[str, Any] = {
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": vocab.tokens,
        "tokenizer.ggml.token_type": vocab.toktypes, "tokenizer.ggml.merges": sv.merges if sv else [],
    }
    for typ, tid in (sv.special_token_ids if sv else {}).items():
        meta[f"tokenizer.ggml.{typ}_token_id"] = tid
    add_bos = bool(sv and sv.add_special_token.get("bos"))
    ids = Tokenizer.from_metadata(meta).encode(CHKTXT, add_bos=add_bos, special=False)
    return sha256(str(list(ids)).encode()).hexdigest()


def detect_pre(tj: dict[str, Any], vocab: Vocab) -> str:
    """The ``tokenizer.ggml.pre`` llama.cpp would write (see the module docstring)."""
    key = pre_config_key(tj)
    names = _PRE_CONFIGS.get(key)
    if names is None:
        shown = key if len(key) < 120 else key[:117] + "..."
        raise VocabError(f"unknown BPE pre-tokenizer in tokenizer.json ({shown}); llama.cpp would not name it either")
    for name in names:
        try:
            h = _chk_hash(vocab, name)
        except Exception:  # noqa: BLE001 - a vocabulary llmedge cannot build gets the fallback name
            break
        if KNOWN_HASHES.get(h) == name:
            return name
    return names[0]


# ------------------------------------------------------------------------------ SentencePiece


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if i >= len(buf):
            raise VocabError("tokenizer.model is truncated")
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7


def _fields(buf: bytes) -> list[tuple[int, int, Any]]:
    """Top-level protobuf fields of ``buf``: (number, wire type, int or bytes)."""
    out = []
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _varint(buf, i)
        elif wt == 1:
            v, i = buf[i:i + 8], i + 8
        elif wt == 2:
            n, i = _varint(buf, i)
            v, i = buf[i:i + n], i + n
        elif wt == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise VocabError(f"tokenizer.model: unsupported protobuf wire type {wt}")
        if i > len(buf):
            raise VocabError("tokenizer.model is truncated")
        out.append((num, wt, v))
    return out


# sentencepiece's ModelProto.SentencePiece.Type -> GGUF token type (the same numbers)
_SP_TYPES = {int(t): int(t) for t in (TT.NORMAL, TT.UNKNOWN, TT.CONTROL, TT.USER_DEFINED, TT.UNUSED, TT.BYTE)}
_F32 = struct.Struct("<f")


def _piece(v: bytes) -> tuple[str, float, int]:
    """One SentencePiece message: (piece, score, type). The layout sentencepiece writes (piece, score,
    then type unless NORMAL, all short) is read directly; anything else field by field."""
    n = len(v)
    if n >= 2 and v[0] == 0x0A and v[1] < 0x80:
        end = 2 + v[1]
        if end + 5 <= n and v[end] == 0x15:
            j = end + 5
            if j == n:
                return v[2:end].decode("utf-8"), _F32.unpack_from(v, end + 1)[0], 1
            if j + 2 == n and v[j] == 0x18 and v[j + 1] < 0x80:
                return v[2:end].decode("utf-8"), _F32.unpack_from(v, end + 1)[0], v[j + 1]
    piece, score, kind = "", 0.0, 1
    for n2, w2, v2 in _fields(v):
        if n2 == 1 and w2 == 2:
            piece = v2.decode("utf-8")
        elif n2 == 2 and w2 == 5:
            score = _F32.unpack(v2)[0]
        elif n2 == 3 and w2 == 0:
            kind = v2
    return piece, score, kind


def read_sentencepiece(path: Path) -> tuple[list[str], list[float], list[int], bool]:
    """(pieces, scores, types, add_dummy_prefix) of a SentencePiece ``tokenizer.model``."""
    try:
        buf = path.read_bytes()
    except OSError as e:
        raise VocabError(f"cannot read {path.name}: {e}") from None
    pieces: list[str] = []
    scores: list[float] = []
    types: list[int] = []
    add_dummy_prefix = True
    for num, wt, v in _fields(buf):
        if num == 1 and wt == 2:
            piece, score, kind = _piece(v)
            pieces.append(piece)
            scores.append(score)
            types.append(_SP_TYPES.get(kind, 1))
        elif num == 3 and wt == 2:  # normalizer_spec
            for n2, w2, v2 in _fields(v):
                if n2 == 3 and w2 == 0:
                    add_dummy_prefix = bool(v2)
    if not pieces:
        raise VocabError(f"{path.name} holds no SentencePiece pieces")
    return pieces, scores, types, add_dummy_prefix


def spm_vocab(folder: Path, vocab_size: int | None, phi3: bool = False) -> Vocab:
    """The ``llama`` vocabulary of ``folder/tokenizer.model``, as _create_vocab_sentencepiece builds it.

    ``phi3``: Phi3MiniModel.set_vocab's variant (added tokens are CONTROL only when marked special,
    spaces are kept, and tokenizer.json's ``added_tokens`` are applied too).
    """
    pieces, sp_scores, sp_types, _ = read_sentencepiece(folder / "tokenizer.model")
    n = vocab_size if vocab_size is not None else len(pieces)
    tokens = [f"[PAD{i}]" for i in range(n)]
    scores = [-10000.0] * n
    types = [int(TT.UNUSED)] * n
    for i, (p, s, t) in enumerate(zip(pieces, sp_scores, sp_types)):
        if i < n:
            tokens[i], scores[i], types[i] = p, s, int(t)
    added = folder / "added_tokens.json"
    if added.is_file():
        for key, tid in read_json(added).items():
            if isinstance(tid, int) and 0 <= tid < n:
                tokens[tid], scores[tid], types[tid] = key, -1000.0, int(TT.USER_DEFINED)
    overrides: list[dict[str, Any]] = []
    cfg = folder / "tokenizer_config.json"
    if cfg.is_file():
        for tid_s, data in (read_json(cfg).get("added_tokens_decoder") or {}).items():
            overrides.append({**data, "id": int(tid_s)})
    tj = folder / "tokenizer.json"
    if phi3 and tj.is_file():
        overrides.extend(read_json(tj).get("added_tokens") or [])
    for data in overrides:
        tid = int(data["id"])
        if not 0 <= tid < n:
            continue
        tok = data["content"]
        if data.get("special") or (not phi3 and looks_special(tok)):
            types[tid] = int(TT.CONTROL)
        else:
            if not phi3:
                tok = tok.replace("\u2581", " ")
            types[tid] = int(TT.USER_DEFINED)
        scores[tid] = -1000.0
        tokens[tid] = tok
    special = gguf.SpecialVocab(folder, n_vocab=len(tokens))
    return Vocab("llama", "default", tokens, types, scores=scores, special=special)
