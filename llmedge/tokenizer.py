"""Tokenizers built from GGUF metadata alone, token for token like llama.cpp.

This module owns text <-> token id conversion: the two tokenizer models llama.cpp builds from
``tokenizer.ggml.model`` (``llama``: SentencePiece-style merges by score with byte fallback;
``gpt2``: byte-level BPE with merge ranks and the pre-tokenizer regexes llama.cpp selects from
``tokenizer.ggml.pre``), special-token partitioning, the add-BOS/EOS rules, the end-of-generation
token set, detokenization and a streaming UTF-8-safe decoder.

Every rule follows llama.cpp's ``src/llama-vocab.cpp`` and ``src/unicode.cpp``:

- token attributes come from ``tokenizer.ggml.token_type``; tokens whose text marks them as
  end-of-turn (``<|im_end|>``, ``<end_of_turn>``, ...) are forced to CONTROL and join the EOG set;
- special tokens (CONTROL, USER_DEFINED, UNKNOWN) are split out of the text first, longest text
  first (``tokenizer_st_partition``); USER_DEFINED tokens are split out even with ``special=False``;
- SPM merges the highest-scoring adjacent pair first (ties: leftmost) over the whole fragment and
  falls back to ``<0xNN>`` byte tokens (``llm_tokenizer_spm``);
- BPE splits with the pre-tokenizer regexes (Unicode categories through the ``regex`` package,
  whitespace exactly llama.cpp's set), byte-encodes each word GPT-2 style and merges the
  lowest-rank pair first (``llm_tokenizer_bpe``);
- ``decode`` concatenates ``token_to_piece`` outputs like llama-cpp-python's ``detokenize``
  (which drops one leading space when the first id is BOS).

``detokenize_llama`` is llama.cpp's ``llama_detokenize`` itself (``add_space_prefix`` space and
``clean_up_tokenization_spaces`` passes), what its server's /detokenize endpoint returns.

Speed: BPE results are cached per pre-tokenized word; SPM is run per chunk of text that no
vocabulary token can cross (split before a U+2581 that no token has on its left), which is exact
and lets results be cached per chunk.

Unicode: the categories (``\\p{L}``, ``\\p{N}``, ...) are the ``regex`` package's. llama.cpp's own
tables are Unicode 15.1; code points assigned later (about 23,000: new scripts, CJK extension J,
a few punctuation marks) are "undefined" to llama.cpp, so BPE pre-tokenization of text using them
can differ unless ``regex`` is a Unicode 15.1 release (2024.7.24 gives identical categories).
"""

from __future__ import annotations

import codecs
import heapq
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import regex

from llmedge.errors import TokenizerError

__all__ = ["StreamDecoder", "TokenAttr", "TokenType", "Tokenizer"]


class TokenType:
    """Values of ``tokenizer.ggml.token_type`` (llama.h ``llama_token_type``)."""

    UNDEFINED = 0
    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


class TokenAttr:
    """Token attribute bits (llama.h ``llama_token_attr``)."""

    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5
    NORMALIZED = 1 << 6
    LSTRIP = 1 << 7
    RSTRIP = 1 << 8
    SINGLE_WORD = 1 << 9


_TYPE_TO_ATTR = np.array(
    [
        TokenAttr.UNDEFINED,  # UNDEFINED
        TokenAttr.NORMAL,
        TokenAttr.UNKNOWN,
        TokenAttr.CONTROL,
        TokenAttr.USER_DEFINED,
        TokenAttr.UNUSED,
        TokenAttr.BYTE,
    ],
    dtype=np.int32,
)

_ATTR_SPECIAL = TokenAttr.UNKNOWN | TokenAttr.CONTROL
_SPACE = "\u2581"  # SentencePiece's escaped space
_C_SPACE = " \t\n\v\f\r"  # C isspace() in the "C" locale

# Texts that llama.cpp treats as end of generation (llama_vocab::impl::load); they are forced CONTROL.
_EOG_TEXTS = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",
)
_EOT_TEXTS = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", "<\uff5cend\u2581of\u2581sentence\uff5c>", "<end_of_utterance>",
)
_EOM_TEXTS = ("<|eom_id|>",)
_FIM_TEXTS = {
    "pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\uff5cfim\u2581begin\uff5c>", "<PRE>",
            "\u2581<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\uff5cfim\u2581hole\uff5c>", "<SUF>",
            "\u2581<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\uff5cfim\u2581end\uff5c>", "<MID>",
            "\u2581<MID>", "<|code_middle|>", "<|middle|>"),
    "pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "sep": ("<|file_sep|>",),
}

# ---------------------------------------------------------------------------------------------
# Pre-tokenizers (BPE): llama.cpp's regex lists per tokenizer.ggml.pre, translated for `regex`.
# ---------------------------------------------------------------------------------------------

# llama.cpp's whitespace set (unicode-data.cpp unicode_set_whitespace); `\s` means exactly this.
_WS_CLASS = "\\t\\n\\x0b\\x0c\\r \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000"

# llama.cpp shows every non-ASCII whitespace code point to its regexes as U+000B (unicode_regex_split),
# so literal ranges in a pattern never match them
_WS_TO_VT = {c: "\x0b" for c in (0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F,
                                  0x3000)}

_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_RX_GPT2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
_RX_LLAMA3 = (_CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
              "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
_RX_QWEN2 = (_CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
             "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
_RX_QWEN35 = (_CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*"
              "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
_RX_GPT4O = (
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+" + _CONTRACTIONS + "?"
    "|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*" + _CONTRACTIONS + "?"
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
)
_RX_TEKKEN = (
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+"
    "|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*"
    "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
)
_CJK_DEEPSEEK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"

# regex lists per llama.cpp pre-tokenizer kind (llm_tokenizer_bpe constructor)
_PRE_REGEXES: dict[str, tuple[str, ...]] = {
    "default": ("[\\p{P}\\$\\+<=>\\^~\\|]+", _RX_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"),
    "llama3": (_RX_LLAMA3,),
    "deepseek-llm": (
        "[\\r\\n]",
        ("\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
         "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
         "\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba"
         "\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45"
         "\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
         "\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc"
         "\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134"
         "\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee"
         "\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf"
         "\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
         "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
         "\U0001e900-\U0001e943]+"),
        "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
        "\\s+$",
        _CJK_DEEPSEEK,
        "\\p{N}+",
    ),
    "deepseek-coder": ("[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", _CJK_DEEPSEEK, "\\p{N}"),
    "deepseek3": (
        "\\p{N}{1,3}",
        "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
        ("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
         "| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"),
    ),
    "falcon": (
        "[\\p{P}\\$\\+<=>\\^~\\|`]+",
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
        "[0-9][0-9][0-9]",
    ),
    "starcoder": ("\\p{N}", _RX_GPT2),
    "gpt2": (_RX_GPT2,),
    "qwen2": (_RX_QWEN2,),
    "qwen35": (_RX_QWEN35,),
    "bloom": (" ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+",),
    "chatglm4": (_RX_LLAMA3,),
    "viking": (" ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+", "\\p{N}"),
    "tekken": (_RX_TEKKEN,),
    "gpt4o": (_RX_GPT4O,),
    "seed-coder": (
        _CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+"
        "|\\s+(?!\\S)|\\s+",
    ),
    "bailingmoe": (
        ("'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
         "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"),
    ),
}

# tokenizer.ggml.pre -> (regex kind, flags) as llama_vocab::impl::load sets them for BPE vocabs.
# flags: clean_spaces (default True for BPE), ignore_merges, add_bos, bos_null
_F = dict
_PRE_TYPES: dict[str, tuple[str, dict[str, bool]]] = {
    "default": ("default", _F()),
    **{name: ("llama3", _F(ignore_merges=True, add_bos=True)) for name in (
        "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
        "jina-v5-nano")},
    "dbrx": ("llama3", _F()),
    "smaug-bpe": ("llama3", _F()),
    "deepseek-llm": ("deepseek-llm", _F(clean_spaces=False)),
    "deepseek-coder": ("deepseek-coder", _F(clean_spaces=False)),
    "deepseek-v3": ("deepseek3", _F(clean_spaces=False)),
    "hunyuan-dense": ("deepseek3", _F(clean_spaces=False)),
    "falcon": ("falcon", _F()),
    "mpt": ("gpt2", _F()),
    "starcoder": ("starcoder", _F()),
    **{name: ("gpt2", _F()) for name in (
        "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0",
        "mellum", "modern-bert", "olmo", "jais", "exaone4")},
    "refact": ("starcoder", _F()),
    "command-r": ("starcoder", _F(clean_spaces=False)),
    **{name: ("qwen2", _F(clean_spaces=False)) for name in (
        "qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "solar-open")},
    "qwen35": ("qwen35", _F(clean_spaces=False)),
    "megrez": ("qwen2", _F()),
    "stablelm2": ("qwen2", _F()),
    "poro-chat": ("bloom", _F(clean_spaces=False)),
    "bloom": ("bloom", _F()),
    "gpt3-finnish": ("bloom", _F()),
    "chatglm-bpe": ("chatglm4", _F(bos_null=True)),
    "glm4": ("chatglm4", _F(bos_null=True, ignore_merges=True)),
    "glm5": ("chatglm4", _F(bos_null=True, ignore_merges=True)),
    "viking": ("viking", _F(clean_spaces=False)),
    "tekken": ("tekken", _F(clean_spaces=False, ignore_merges=True, add_bos=True)),
    "smollm": ("starcoder", _F(clean_spaces=False)),
    "codeshell": ("starcoder", _F()),
    "exaone": ("starcoder", _F()),
    "minerva-7b": ("starcoder", _F()),
    "mellum2": ("starcoder", _F()),
    **{name: ("gpt4o", _F(clean_spaces=False)) for name in ("gpt-4o", "llama4", "kanana2", "talkie",
                                                             "minimax-m2")},
    "trillion": ("gpt2", _F(clean_spaces=False)),
    "granite-docling": ("gpt2", _F(clean_spaces=False)),
    "seed-coder": ("seed-coder", _F(clean_spaces=False)),
    **{name: ("bailingmoe", _F(clean_spaces=False)) for name in ("bailingmoe", "bailingmoe2", "llada-moe")},
}


def _translate_regex(expr: str) -> str:
    """Rewrite one llama.cpp pre-tokenizer regex for the ``regex`` package.

    ``\\s``/``\\S`` become llama.cpp's exact whitespace set, ``\\d`` becomes ASCII digits (as in
    ECMAScript) and ``$`` means the end of the fragment only. Unicode categories ``\\p{..}`` are
    left to ``regex``.
    """
    out: list[str] = []
    inside = False
    i = 0
    n = len(expr)
    while i < n:
        c = expr[i]
        if c == "\\" and i + 1 < n:
            e = expr[i + 1]
            if e == "s":
                out.append(_WS_CLASS if inside else "[" + _WS_CLASS + "]")
            elif e == "S":
                if inside:
                    raise TokenizerError(f"unsupported pre-tokenizer regex {expr!r}")
                out.append("[^" + _WS_CLASS + "]")
            elif e == "d":
                out.append("0-9" if inside else "[0-9]")
            else:
                out.append(expr[i:i + 2])
            i += 2
            continue
        if c == "[" and not inside:
            inside = True
        elif c == "]" and inside:
            inside = False
        elif c == "$" and not inside:
            out.append("\\Z")
            i += 1
            continue
        out.append(c)
        i += 1
    result = "".join(out)
    if expr == _RX_GPT2:
        # llama.cpp's hand-written splitter for this regex also takes a trailing `\s+`
        result += "|[" + _WS_CLASS + "]+"
    return result


_COMPILED_PRE: dict[str, list[Any]] = {}


def _pre_patterns(kind: str) -> list[Any]:
    pats = _COMPILED_PRE.get(kind)
    if pats is None:
        pats = [regex.compile(_translate_regex(r), regex.V0) for r in _PRE_REGEXES[kind]]
        _COMPILED_PRE[kind] = pats
    return pats


def _bytes_to_unicode() -> list[str]:
    """GPT-2's byte -> printable character table (llama.cpp unicode_byte_to_utf8_map)."""
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table = [""] * 256
    for b in keep:
        table[b] = chr(b)
    n = 0
    for b in range(256):
        if not table[b]:
            table[b] = chr(256 + n)
            n += 1
    return table


_BYTE_TO_UNI = _bytes_to_unicode()
_LATIN1_TO_UNI = {b: _BYTE_TO_UNI[b] for b in range(256)}  # str.translate table over latin-1 text
_UNI_TO_BYTE = {c: b for b, c in enumerate(_BYTE_TO_UNI)}

_CACHE_LIMIT = 200_000


def _prefix_tree(specials: list[tuple[int, str, bool, bool]], k: int) -> list[Any]:
    """Group special tokens by prefixes of doubling length, so that one ``prefix in text`` test
    rules out every token below it."""
    groups: dict[str, list[tuple[int, str, bool, bool]]] = {}
    for item in specials:
        groups.setdefault(item[1][:k], []).append(item)
    nodes: list[Any] = []
    for prefix, items in groups.items():
        if len(items) == 1:
            nodes.append((items[0][1], [items[0][0]], []))
            continue
        done = [it[0] for it in items if len(it[1]) <= k]
        rest = [it for it in items if len(it[1]) > k]
        nodes.append((prefix, done, _prefix_tree(rest, 2 * k) if rest else []))
    return nodes


def _find_present(text: str, nodes: list[Any], out: set[int]) -> None:
    """Ids of the special tokens (of a :func:`_prefix_tree`) whose text occurs in ``text``."""
    for prefix, done, children in nodes:
        if prefix in text:
            out.update(done)
            if children:
                _find_present(text, children, out)


def _meta_int(meta: Mapping[str, Any], key: str) -> int | None:
    v = meta.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TokenizerError(f"metadata {key} must be an integer, got {type(v).__name__}")
    return int(v)


def _meta_bool(meta: Mapping[str, Any], key: str) -> bool | None:
    v = meta.get(key)
    if v is None:
        return None
    if not isinstance(v, (bool, np.bool_)):
        raise TokenizerError(f"metadata {key} must be a bool, got {type(v).__name__}")
    return bool(v)


class Tokenizer:
    """A GGUF vocabulary with llama.cpp's tokenize / token_to_piece / detokenize.

    Build it with :meth:`from_metadata`. ``encode(text, add_bos, special)`` equals
    ``llama_tokenize(text, add_special=add_bos, parse_special=special)``.
    """

    def __init__(
        self,
        *,
        model: str,
        pre: str,
        tokens: list[str],
        token_types: np.ndarray,
        attrs: np.ndarray,
        scores: list[float] | None,
        merges: Sequence[str] | None,
        special_ids: dict[str, int | None],
        add_bos: bool,
        add_eos: bool,
        add_space_prefix: bool,
        clean_spaces: bool,
        ignore_merges: bool,
        eog_ids: frozenset[int],
        token_to_id: dict[str, int] | None = None,
    ) -> None:
        self._model = model
        self._pre = pre
        self._tokens = tokens
        self._token_types = token_types
        self._attrs: list[int] = attrs.tolist()
        self._scores = scores
        self._special_ids = special_ids
        self._add_bos = add_bos
        self._add_eos = add_eos
        self._add_space_prefix = add_space_prefix
        self._clean_spaces = clean_spaces
        self._ignore_merges = ignore_merges
        self._eog_ids = eog_ids
        n = len(tokens)
        # last duplicate wins, as `token_to_id[word] = i` in llama.cpp
        self._token_to_id: dict[str, int] = (
            token_to_id if token_to_id is not None else dict(zip(tokens, range(n)))
        )
        self._pieces: list[bytes | None] = [None] * n

        # special tokens cache: CONTROL | USER_DEFINED | UNKNOWN, longest (in UTF-8 bytes) first
        attr_list = self._attrs
        special = np.flatnonzero(attrs & (_ATTR_SPECIAL | TokenAttr.USER_DEFINED)).tolist()
        special.sort(key=lambda i: -len(tokens[i].encode("utf-8")))
        self._special_all = [
            (i, tokens[i], bool(attr_list[i] & TokenAttr.LSTRIP), bool(attr_list[i] & TokenAttr.RSTRIP))
            for i in special
        ]
        self._special_user = [s for s in self._special_all if not attr_list[s[0]] & _ATTR_SPECIAL]
        self._special_trees = {False: _prefix_tree(self._special_user, 1), True: _prefix_tree(self._special_all, 1)}

        self._cache: dict[str, tuple[int, ...]] = {}
        if model == "bpe":
            kind = _PRE_TYPES[pre][0] if pre in _PRE_TYPES else pre
            self._pre_patterns = _pre_patterns(kind)
            ranks: dict[tuple[str, str], int] = {}
            if merges is not None:
                keys = []
                for m in merges:
                    p = m.find(" ", 1)
                    keys.append((m[:p], m[p + 1:]) if p >= 0 else ("", ""))
                # std::unordered_map::emplace keeps the first rank of a duplicated pair
                ranks = dict(zip(reversed(keys), range(len(keys) - 1, -1, -1)))
            self._ranks = ranks
        else:
            self._pre_patterns = []
            self._ranks = {}
        self._spm_splitter = self._make_spm_splitter() if model == "spm" else None

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any]) -> Tokenizer:
        """Build the tokenizer llama.cpp builds from a GGUF file's metadata dict."""
        model_name = meta.get("tokenizer.ggml.model")
        if not isinstance(model_name, str):
            raise TokenizerError("GGUF metadata has no tokenizer.ggml.model")
        tokens = meta.get("tokenizer.ggml.tokens")
        if tokens is None:
            raise TokenizerError("GGUF metadata has no tokenizer.ggml.tokens")
        tokens = list(tokens)
        n = len(tokens)
        if n == 0:
            raise TokenizerError("tokenizer.ggml.tokens is empty")
        if set(map(type, tokens)) != {str}:
            raise TokenizerError("tokenizer.ggml.tokens holds values that are not strings")
        token_to_id = dict(zip(tokens, range(n)))
        if "" in token_to_id:
            for i, t in enumerate(tokens):
                if not t:
                    tokens[i] = f"[EMPTY_{i}]"
            token_to_id = dict(zip(tokens, range(n)))

        pre = meta.get("tokenizer.ggml.pre")
        if pre is not None and not isinstance(pre, str):
            raise TokenizerError("tokenizer.ggml.pre must be a string")
        flags: dict[str, bool] = {}
        merges: Sequence[str] | None = None
        if model_name == "llama":
            model = "spm"
            pre_name = "default"
            defaults: dict[str, int | None] = {"bos": 1, "eos": 2, "unk": 0}
            add_space_prefix, clean_spaces, add_bos, add_eos, ignore_merges = True, False, True, False, False
        elif model_name == "gpt2":
            model = "bpe"
            merges = meta.get("tokenizer.ggml.merges")
            if merges is None:
                raise TokenizerError("cannot find tokenizer merges (tokenizer.ggml.merges) in model file")
            merges = list(merges)
            pre_name = pre or "default"
            if pre_name not in _PRE_TYPES:
                raise TokenizerError(f"unsupported pre-tokenizer type: {pre_name!r}")
            flags = _PRE_TYPES[pre_name][1]
            defaults = {"bos": 11, "eos": 11, "unk": None}
            if flags.get("bos_null"):
                defaults["bos"] = None
            add_space_prefix = False
            clean_spaces = flags.get("clean_spaces", True)
            add_bos = flags.get("add_bos", False)
            add_eos = False
            ignore_merges = flags.get("ignore_merges", False)
        else:
            raise TokenizerError(f"unsupported tokenizer model: {model_name!r} (supported: llama, gpt2)")

        v = _meta_bool(meta, "tokenizer.ggml.add_space_prefix")
        if v is not None:
            add_space_prefix = v

        scores = None
        raw_scores = meta.get("tokenizer.ggml.scores")
        if raw_scores is not None:
            arr = np.asarray(raw_scores)
            if arr.ndim != 1 or len(arr) < n:
                raise TokenizerError(f"tokenizer.ggml.scores has {arr.size} entries for {n} tokens")
            scores = arr[:n].astype(np.float32).tolist()
        elif model == "spm":
            scores = [0.0] * n

        raw_types = meta.get("tokenizer.ggml.token_type")
        if raw_types is not None:
            types = np.asarray(raw_types, dtype=np.int64)
            if types.ndim != 1 or len(types) < n:
                raise TokenizerError(f"tokenizer.ggml.token_type has {types.size} entries for {n} tokens")
            types = types[:n].astype(np.int32)
            safe = np.where((types >= 0) & (types <= 6), types, 0)
            attrs = _TYPE_TO_ATTR[safe]
        else:
            types = np.full(n, TokenType.NORMAL, dtype=np.int32)
            attrs = np.full(n, TokenAttr.NORMAL, dtype=np.int32)

        # special token ids: defaults, out-of-range defaults disabled, then metadata overrides
        ids: dict[str, int | None] = {
            "bos": defaults.get("bos"), "eos": defaults.get("eos"), "eot": None, "eom": None,
            "unk": defaults.get("unk"), "sep": None, "pad": None, "mask": None,
            "fim_pre": None, "fim_suf": None, "fim_mid": None, "fim_pad": None, "fim_rep": None,
            "fim_sep": None,
        }
        keys = [
            ("bos", "bos_token_id"), ("eos", "eos_token_id"), ("eot", "eot_token_id"),
            ("eom", "eom_token_id"), ("unk", "unknown_token_id"), ("sep", "seperator_token_id"),
            ("pad", "padding_token_id"), ("mask", "mask_token_id"), ("fim_pre", "fim_pre_token_id"),
            ("fim_suf", "fim_suf_token_id"), ("fim_mid", "fim_mid_token_id"),
            ("fim_pad", "fim_pad_token_id"), ("fim_rep", "fim_rep_token_id"),
            ("fim_sep", "fim_sep_token_id"), ("fim_pre", "prefix_token_id"),
            ("fim_suf", "suffix_token_id"), ("fim_mid", "middle_token_id"),
        ]
        for name, key in keys:
            cur = ids[name]
            if cur is not None and cur >= n:
                ids[name] = cur = None
            new = _meta_int(meta, "tokenizer.ggml." + key)
            if new is not None and 0 <= new < n:
                ids[name] = new

        v = _meta_bool(meta, "tokenizer.ggml.add_bos_token")
        if v is not None:
            add_bos = v
        v = _meta_bool(meta, "tokenizer.ggml.add_eos_token")
        if v is not None:
            add_eos = v

        def force_control(tid: int) -> None:
            attrs[tid] |= TokenAttr.CONTROL

        # auto-detect EOT/EOM/FIM tokens by text (llama.cpp walks an unordered_map; we take the lowest id)
        def detect(texts: Iterable[str]) -> int | None:
            found = [token_to_id[t] for t in texts if t in token_to_id]
            return min(found) if found else None

        for name, texts in (("eot", _EOT_TEXTS), ("eom", _EOM_TEXTS)):
            if ids[name] is None:
                tid = detect(texts)
                if tid is not None:
                    ids[name] = tid
                    force_control(tid)
        for short, texts in _FIM_TEXTS.items():
            name = "fim_" + short
            if ids[name] is None:
                tid = detect(texts)
                if tid is not None:
                    ids[name] = tid
                    force_control(tid)

        # control tokens with "unused" in their text are unused
        for i in np.flatnonzero(attrs & TokenAttr.CONTROL).tolist():
            if "unused" in tokens[i]:
                attrs[i] |= TokenAttr.UNUSED

        eog: set[int] = set()
        for name in ("fim_pad", "fim_rep", "fim_sep"):
            if ids[name] is not None:
                eog.add(ids[name])  # type: ignore[arg-type]
        for t in _EOG_TEXTS:
            tid = token_to_id.get(t)
            if tid is not None:
                eog.add(tid)
                force_control(tid)
        for t in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):  # gpt-oss
            tid = token_to_id.get(t)
            if tid is not None:
                attrs[tid] = TokenAttr.USER_DEFINED
        for name in ("eos", "eot", "eom"):
            if ids[name] is not None:
                eog.add(ids[name])  # type: ignore[arg-type]
        texts_in_eog = {tokens[i]: i for i in eog}
        if "<|end|>" in texts_in_eog and (
            ("<|return|>" in texts_in_eog and ("<|call|>" in texts_in_eog or "<|calls|>" in texts_in_eog))
            or (("<|call|>" in texts_in_eog or "<|calls|>" in texts_in_eog) and "<|flush|>" in texts_in_eog)
        ):
            end_id = texts_in_eog["<|end|>"]
            eog.discard(end_id)
            attrs[end_id] = TokenAttr.USER_DEFINED
        if "</s>" in texts_in_eog and ("<|tool_response>" in texts_in_eog or "<|plamo:eos|>" in texts_in_eog):
            s_id = texts_in_eog["</s>"]
            eog.discard(s_id)
            attrs[s_id] = TokenAttr.NORMAL

        # per-model token attributes that GGUF does not store (llama.cpp hard-codes them by name)
        general_name = str(meta.get("general.name", "") or "").lower()
        arch = str(meta.get("general.architecture", "") or "")
        if any(s in (pre or "") for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or any(
            s in arch for s in ("nomic-bert-moe", "jina-bert-v3")
        ):
            if "<mask>" in token_to_id:
                attrs[token_to_id["<mask>"]] |= TokenAttr.LSTRIP
        elif "phi-3" in general_name or "phi3" in general_name:
            attrs[(attrs & (_ATTR_SPECIAL | TokenAttr.USER_DEFINED)) != 0] |= TokenAttr.RSTRIP
            for t, on in (("</s>", True), ("<unk>", False), ("<s>", False), ("<|endoftext|>", False)):
                if t in token_to_id:
                    tid = token_to_id[t]
                    if on:
                        attrs[tid] |= TokenAttr.RSTRIP
                    else:
                        attrs[tid] &= ~TokenAttr.RSTRIP
        elif "modern-bert" in general_name and "[MASK]" in token_to_id:
            attrs[token_to_id["[MASK]"]] |= TokenAttr.LSTRIP

        return cls(
            model=model,
            pre=pre_name,
            tokens=tokens,
            token_types=types,
            attrs=attrs,
            scores=scores,
            merges=merges,
            special_ids=ids,
            add_bos=add_bos,
            add_eos=add_eos,
            add_space_prefix=add_space_prefix,
            clean_spaces=clean_spaces,
            ignore_merges=ignore_merges,
            eog_ids=frozenset(eog),
            token_to_id=token_to_id,
        )

    # ------------------------------------------------------------------ properties

    @property
    def n_vocab(self) -> int:
        """Number of tokens in the vocabulary."""
        return len(self._tokens)

    @property
    def tokens(self) -> list[str]:
        """Token texts by id (as stored in GGUF; empty texts replaced by ``[EMPTY_i]``)."""
        return self._tokens

    @property
    def token_types(self) -> np.ndarray:
        """``tokenizer.ggml.token_type`` as an int32 array (NORMAL when the file has none)."""
        return self._token_types

    @property
    def model(self) -> str:
        """``"spm"`` (tokenizer.ggml.model = llama) or ``"bpe"`` (gpt2)."""
        return self._model

    @property
    def pre(self) -> str:
        """The pre-tokenizer name in effect (``default`` for SPM)."""
        return self._pre

    @property
    def bos_id(self) -> int | None:
        return self._special_ids["bos"]

    @property
    def eos_id(self) -> int | None:
        return self._special_ids["eos"]

    @property
    def eot_id(self) -> int | None:
        return self._special_ids["eot"]

    @property
    def unk_id(self) -> int | None:
        return self._special_ids["unk"]

    @property
    def pad_id(self) -> int | None:
        return self._special_ids["pad"]

    @property
    def eog_ids(self) -> frozenset[int]:
        """Token ids that end generation (llama.cpp ``special_eog_ids``)."""
        return self._eog_ids

    @property
    def add_bos(self) -> bool:
        """Whether ``encode(add_bos=True)`` prepends BOS (``tokenizer.ggml.add_bos_token``)."""
        return self._add_bos

    @property
    def add_eos(self) -> bool:
        """Whether ``encode(add_bos=True)`` appends EOS (``tokenizer.ggml.add_eos_token``)."""
        return self._add_eos

    @property
    def add_space_prefix(self) -> bool:
        return self._add_space_prefix

    def is_eog(self, token_id: int) -> bool:
        """True if generating ``token_id`` ends generation."""
        return token_id in self._eog_ids

    def is_control(self, token_id: int) -> bool:
        """True for CONTROL tokens (after llama.cpp's text-based overrides)."""
        return bool(self._attrs[token_id] & TokenAttr.CONTROL)

    def token_attr(self, token_id: int) -> int:
        """llama.cpp's attribute bits (:class:`TokenAttr`) for ``token_id``."""
        return self._attrs[token_id]

    def token_id(self, text: str) -> int | None:
        """Id of the token whose text is exactly ``text``, or None."""
        return self._token_to_id.get(text)

    # ------------------------------------------------------------------ encode

    def encode(self, text: str, add_bos: bool = False, special: bool = False,
               space_prefix: bool = True) -> list[int]:
        """Token ids of ``text`` exactly as ``llama_tokenize(text, add_bos, special)``.

        ``add_bos`` adds the model's special tokens per its metadata (BOS if add_bos_token, EOS if
        add_eos_token), like llama.cpp's ``add_special``. ``special`` parses special-token texts
        written in ``text`` (``<|im_start|>``, ``<start_of_turn>``) into their single ids.
        ``space_prefix=False`` tokenizes ``text`` as the continuation of a sequence: no SentencePiece
        space prefix (what a grammar engine needs for the bytes it forces mid-answer).
        """
        if not isinstance(text, str):
            raise TokenizerError(f"text must be str, not {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise TokenizerError(f"text is not valid Unicode: {e}") from None
        out: list[int] = []
        if add_bos and self._add_bos:
            if self.bos_id is None:
                raise TokenizerError("the model asks for a BOS token but has none")
            out.append(self.bos_id)
        frags = self._partition(text, special)
        if self._model == "spm":
            prev_special = True
            for frag in frags:
                if type(frag) is int:
                    out.append(frag)
                    prev_special = True
                    continue
                if self._add_space_prefix and prev_special and space_prefix:
                    frag = " " + frag
                self._encode_spm(frag, out)
                prev_special = False
        else:
            for frag in frags:
                if type(frag) is int:
                    out.append(frag)
                else:
                    self._encode_bpe(frag, out)
        if add_bos and self._add_eos:
            if self.eos_id is None:
                raise TokenizerError("the model asks for an EOS token but has none")
            out.append(self.eos_id)
        return out

    def _partition(self, text: str, special: bool) -> list[str | int]:
        """Split special-token texts out of ``text`` (llama.cpp tokenizer_st_partition)."""
        if not text:
            return []
        frags: list[str | int] = [text]
        specials = self._special_all if special else self._special_user
        if not specials:
            return frags
        present: set[int] = set()
        _find_present(text, self._special_trees[special], present)
        for tid, stext, lstrip, rstrip in specials:
            if tid not in present:
                continue
            new: list[str | int] = []
            for frag in frags:
                if type(frag) is int or stext not in frag:
                    new.append(frag)
                    continue
                s: str = frag  # type: ignore[assignment]
                while True:
                    m = s.find(stext)
                    if m < 0:
                        new.append(s)
                        break
                    left = s[:m]
                    if lstrip:
                        left = left.rstrip(_C_SPACE)
                    if left:
                        new.append(left)
                    new.append(tid)
                    s = s[m + len(stext):]
                    if rstrip:
                        s = s.lstrip(_C_SPACE)
                    if not s:
                        break
            frags = new
        return frags

    # SPM ----------------------------------------------------------------

    def _make_spm_splitter(self) -> Any:
        """Split points no token can cross: before a U+2581 whose left neighbour never precedes
        U+2581 inside any vocabulary token."""
        # drop every token's leading U+2581; the ones left are interior (after "\x00": a second one)
        joined = ("\x00" + "\x00".join(self._tokens)).replace("\x00" + _SPACE, "\x00")
        left: set[str] = set()
        i = joined.find(_SPACE)
        while i >= 0:
            c = joined[i - 1]
            left.add(_SPACE if c == "\x00" else c)
            i = joined.find(_SPACE, i + 1)
        if left:
            cls = "".join(regex.escape(c) for c in sorted(left))
            pat = f"(?<=[^{cls}])(?={_SPACE})"
        else:
            pat = f"(?<=.)(?={_SPACE})"
        return regex.compile(pat, regex.V1 | regex.DOTALL)

    def _encode_spm(self, frag: str, out: list[int]) -> None:
        text = frag.replace(" ", _SPACE)
        cache = self._cache
        for chunk in self._spm_splitter.split(text):
            if not chunk:
                continue
            ids = cache.get(chunk)
            if ids is None:
                ids = self._spm_chunk(chunk)
                if len(cache) >= _CACHE_LIMIT:
                    cache.clear()
                cache[chunk] = ids
            out.extend(ids)

    def _spm_chunk(self, text: str) -> tuple[int, ...]:
        """llm_tokenizer_spm_session::tokenize on one chunk (symbols are code points)."""
        get = self._token_to_id.get
        scores = self._scores
        assert scores is not None
        n = len(text)
        if n == 0:
            return ()
        length = [1] * n
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        heap: list[tuple[float, int, int, int]] = []
        for i in range(n - 1):
            tid = get(text[i:i + 2])
            if tid is not None:
                heap.append((-scores[tid], i, i + 1, 2))
        heapq.heapify(heap)
        push = heapq.heappush
        pop = heapq.heappop
        while heap:
            _, left, right, size = pop(heap)
            ll = length[left]
            rl = length[right]
            if ll == 0 or rl == 0 or ll + rl != size:
                continue
            length[left] = size
            length[right] = 0
            nx = nxt[right]
            nxt[left] = nx
            if nx >= 0:
                prv[nx] = left
            p = prv[left]
            if p >= 0:
                pl = length[p] + size
                tid = get(text[p:p + pl])
                if tid is not None:
                    push(heap, (-scores[tid], p, left, pl))
            if nx >= 0:
                nl = size + length[nx]
                tid = get(text[left:left + nl])
                if tid is not None:
                    push(heap, (-scores[tid], left, nx, nl))
        result: list[int] = []
        i = 0
        while i != -1:
            piece = text[i:i + length[i]]
            tid = get(piece)
            if tid is not None:
                result.append(tid)
            else:
                for b in piece.encode("utf-8"):
                    result.append(self._byte_to_token(b))
            i = nxt[i]
        return tuple(result)

    def _byte_to_token(self, b: int) -> int:
        tid = self._token_to_id.get(f"<0x{b:02X}>")
        if tid is None:
            tid = self._token_to_id.get(chr(b)) if b < 0x80 else None
        if tid is None:
            raise TokenizerError(f"vocabulary has no byte token for 0x{b:02X}")
        return tid

    # BPE ----------------------------------------------------------------

    def _pretokenize(self, text: str) -> list[str]:
        """unicode_regex_split: each regex splits every current piece; matches and the text between
        them both become pieces."""
        view = text.translate(_WS_TO_VT)
        spans = [(0, len(text))]
        for pat in self._pre_patterns:
            new: list[tuple[int, int]] = []
            for lo, hi in spans:
                start = lo
                for m in pat.finditer(view, lo, hi):
                    a, b = m.span()
                    if a == b:
                        continue
                    if a > start:
                        new.append((start, a))
                    new.append((a, b))
                    start = b
                if start < hi:
                    new.append((start, hi))
            spans = new
        return [text[a:b] for a, b in spans]

    def _encode_bpe(self, frag: str, out: list[int]) -> None:
        cache = self._cache
        for word in self._pretokenize(frag):
            ids = cache.get(word)
            if ids is None:
                ids = self._bpe_word(word.encode("utf-8").decode("latin-1").translate(_LATIN1_TO_UNI))
                if len(cache) >= _CACHE_LIMIT:
                    cache.clear()
                cache[word] = ids
            out.extend(ids)

    def _bpe_word(self, word: str) -> tuple[int, ...]:
        """llm_tokenizer_bpe_session::tokenize for one byte-encoded word."""
        get = self._token_to_id.get
        if self._ignore_merges:
            tid = get(word)
            if tid is not None:
                return (tid,)
        ranks = self._ranks
        sym = list(word)
        n = len(sym)
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        heap: list[tuple[int, int, int, str]] = []
        for i in range(n - 1):
            r = ranks.get((sym[i], sym[i + 1]))
            if r is not None:
                heap.append((r, i, i + 1, sym[i] + sym[i + 1]))
        heapq.heapify(heap)
        push = heapq.heappush
        pop = heapq.heappop
        while heap:
            _, left, right, merged = pop(heap)
            ls = sym[left]
            rs = sym[right]
            if not ls or not rs or ls + rs != merged:
                continue
            sym[left] = merged
            sym[right] = ""
            nx = nxt[right]
            nxt[left] = nx
            if nx >= 0:
                prv[nx] = left
            p = prv[left]
            if p >= 0:
                r = ranks.get((sym[p], merged))
                if r is not None:
                    push(heap, (r, p, left, sym[p] + merged))
            if nx >= 0:
                r = ranks.get((merged, sym[nx]))
                if r is not None:
                    push(heap, (r, left, nx, merged + sym[nx]))
        result: list[int] = []
        i = 0
        while i != -1:
            s = sym[i]
            tid = get(s)
            if tid is not None:
                result.append(tid)
            else:
                # llama.cpp looks every UTF-8 byte up as a one-byte token and drops misses
                for b in s.encode("utf-8"):
                    if b < 0x80:
                        bt = get(chr(b))
                        if bt is not None:
                            result.append(bt)
            i = nxt[i]
        return tuple(result)

    # ------------------------------------------------------------------ decode

    def token_to_piece(self, token_id: int, special: bool = False) -> bytes:
        """The bytes llama.cpp's ``llama_token_to_piece(id, lstrip=0, special)`` writes."""
        if not 0 <= token_id < len(self._tokens):
            raise TokenizerError(f"token id {token_id} is out of range (vocabulary of {len(self._tokens)})")
        attr = self._attrs[token_id]
        if not special and attr & _ATTR_SPECIAL:
            return b""
        piece = self._pieces[token_id]
        if piece is None:
            piece = self._make_piece(token_id, attr)
            self._pieces[token_id] = piece
        return piece

    def _make_piece(self, token_id: int, attr: int) -> bytes:
        text = self._tokens[token_id]
        if attr & (_ATTR_SPECIAL | TokenAttr.USER_DEFINED):
            return text.encode("utf-8")
        if attr & TokenAttr.NORMAL:
            if self._model == "spm":
                return text.replace(_SPACE, " ").encode("utf-8")
            out = bytearray()
            for c in text:
                b = _UNI_TO_BYTE.get(c)
                if b is None:
                    out += b"[UNK_BYTE_0x" + c.encode("utf-8").hex().encode() + text.encode("utf-8") + b"]"
                else:
                    out.append(b)
            return bytes(out)
        if attr & TokenAttr.BYTE:
            try:
                return bytes([int(text[3:5], 16)])
            except ValueError:
                return b"\x00"
        return b""

    def decode_bytes(self, ids: Iterable[int], special: bool = False) -> bytes:
        """Concatenated pieces, minus one leading space after a leading BOS (llama-cpp-python)."""
        ids = list(ids)
        out = b"".join([self.token_to_piece(int(i), special) for i in ids])
        if ids and self.bos_id is not None and ids[0] == self.bos_id and out[:1] == b" ":
            out = out[1:]
        return out

    def decode(self, ids: Iterable[int], special: bool = False) -> str:
        """The text llama.cpp renders for ``ids`` (llama-cpp-python ``detokenize`` as UTF-8, invalid
        bytes replaced). ``special`` renders control tokens such as ``<|im_end|>``."""
        return self.decode_bytes(ids, special).decode("utf-8", errors="replace")

    def detokenize_llama(self, ids: Iterable[int], remove_special: bool = False,
                         unparse_special: bool = False) -> str:
        """llama.cpp's ``llama_detokenize`` (what its server's /detokenize returns): drops the
        ``add_space_prefix`` space, optionally the BOS/EOS the model adds, and applies the
        ``clean_up_tokenization_spaces`` passes of BPE vocabularies that ask for them."""
        ids = [int(i) for i in ids]
        remove_space = self._add_space_prefix
        if remove_special and self._add_bos and ids and ids[0] == self.bos_id:
            remove_space = False
            ids = ids[1:]
        if remove_special and self._add_eos and ids and ids[-1] == self.eos_id:
            ids = ids[:-1]
        text = bytearray()
        for tid in ids:
            piece = self.token_to_piece(tid, unparse_special)
            if remove_space and piece[:1] == b" ":
                piece = piece[1:]
            remove_space = False
            text += piece
        if self._clean_spaces:
            _clean_spaces(text)
        return text.decode("utf-8", errors="replace")

    def stream_decoder(self, special: bool = False) -> StreamDecoder:
        """An incremental decoder whose outputs concatenate to ``decode(all_ids)``."""
        return StreamDecoder(self, special)


def _clean_spaces(text: bytearray) -> None:
    """llama_detokenize's three in-place clean-up passes (" ?" -> "?", " ' " -> "'", " 's" -> "'s")."""
    sp, ap = 0x20, 0x27
    total1 = len(text)
    total = 1 if total1 else 0
    for i in range(1, total1):
        x = text[i]
        if text[i - 1] == sp and x in b"?!.,":
            total -= 1
        text[total] = x
        total += 1
    total2 = total
    total = 1 if total2 else 0
    i = 1
    while i < total2:
        x = text[i]
        if x == ap and i + 1 < total2 and text[i - 1] == sp and text[i + 1] == sp:
            total -= 1
            i += 1
            text[i] = 0
        text[total] = x
        total += 1
        i += 1
    total3 = total
    total = 1 if total3 else 0
    for i in range(1, total3):
        x = text[i]
        if text[i - 1] == sp and x == ap and i + 1 < total3:
            x1 = text[i + 1]
            if x1 in b"sm":
                total -= 1
            elif x1 not in b"td" and i + 2 < total3:
                x2 = text[i + 2]
                if (x1, x2) in ((0x72, 0x65), (0x76, 0x65)):  # "re", "ve"
                    total -= 1
        text[total] = x
        total += 1
    del text[total:]


class StreamDecoder:
    """Turns generated ids into text as they arrive, holding back incomplete UTF-8.

    ``"".join(push(i) for i in ids) + flush() == tokenizer.decode(ids, special)``: a replacement
    character appears only where the complete text has one.
    """

    def __init__(self, tokenizer: Tokenizer, special: bool = False) -> None:
        self._tok = tokenizer
        self._special = special
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._first = True
        self._strip_space = False

    def push(self, token_id: int) -> str:
        """Add one id; return the text it completes (possibly "")."""
        piece = self._tok.token_to_piece(token_id, self._special)
        if self._first:
            self._first = False
            self._strip_space = token_id == self._tok.bos_id
        if self._strip_space and piece:
            self._strip_space = False
            if piece[:1] == b" ":
                piece = piece[1:]
        return self._decoder.decode(piece)

    def flush(self) -> str:
        """Return what is held back (incomplete UTF-8 becomes U+FFFD) and reset."""
        text = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        self._first = True
        self._strip_space = False
        return text
