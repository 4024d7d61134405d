"""Every family's BPE pre-tokenizer splits text exactly as llama.cpp does, on tiny vocabularies.

One small byte-level BPE vocabulary (stored in fixtures/llamacpp_family_tokenizers.json with llama.cpp's
ids, made by fixtures/make_family_tokenizer_fixtures.py) is written as a vocab-only GGUF per
(family, ``tokenizer.ggml.pre``) of tests/tiny_vocabs.py and loaded the way llmedge loads any model's
tokenizer. Texts: tokenizer_corpus.json plus ones where the pre-tokenizers differ (digit grouping,
contractions and case, CJK, newlines and whitespace runs, code). No download is needed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import tiny_vocabs as tv

from conftest import load_fixture
from llmedge.errors import TokenizerError
from llmedge.gguf import GGUFFile
from llmedge.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def oracle() -> dict:
    return load_fixture("llamacpp_family_tokenizers.json")


def _tokenizer(tmp: Path, arch: str, pre: str, oracle: dict) -> Tokenizer:
    path = tv.write(tmp / f"{arch}-{pre}.gguf", arch, pre, oracle["tokens"], oracle["merges"])
    return Tokenizer.from_metadata(GGUFFile(path).metadata)


def test_the_fixture_covers_every_family_pre_tokenizer(oracle: dict) -> None:
    assert [(c["arch"], c["pre"]) for c in oracle["cases"]] == tv.cases()
    assert oracle["texts"][-len(tv.EXTRA_TEXTS):] == list(tv.EXTRA_TEXTS)


def test_the_pre_tokenizers_differ_on_these_texts(oracle: dict) -> None:
    """The corpus separates the regex kinds: each pair of different kinds disagrees on some text."""
    by_kind: dict[str, list] = {}
    for c in oracle["cases"]:
        by_kind.setdefault(str(c["ids"]["bos=0,special=0"]), []).append(c["pre"])
    # qwen2 = deepseek-r1-qwen (one regex), smollm = refact (starcoder's); every other pre on its own
    assert sorted(sorted(set(v)) for v in by_kind.values()) == sorted(
        [["llama-bpe"], ["refact", "smollm"], ["tekken"], ["default"], ["deepseek-r1-qwen", "qwen2"], ["gpt-4o"]])


@pytest.mark.parametrize(("arch", "pre"), tv.cases())
def test_family_pre_tokenizer_ids_equal_llamacpp(arch: str, pre: str, oracle: dict, tmp_path: Path) -> None:
    tok = _tokenizer(tmp_path, arch, pre, oracle)
    case = next(c for c in oracle["cases"] if (c["arch"], c["pre"]) == (arch, pre))
    wrong = []
    for key in tv.ids_keys():
        for text, want in zip(oracle["texts"], case["ids"][key]):
            got = tok.encode(text, **tv.flags(key))
            if got != want:
                wrong.append((key, text[:40], got[:12], want[:12]))
    assert not wrong, f"{len(wrong)} texts differ, first: {wrong[0]}"


def test_an_unsupported_pre_tokenizer_fails_at_load_with_one_line(oracle: dict, tmp_path: Path) -> None:
    path = tv.write(tmp_path / "odd.gguf", "qwen2", "mystery-bpe", oracle["tokens"], oracle["merges"])
    with pytest.raises(TokenizerError) as e:
        Tokenizer.from_metadata(GGUFFile(path).metadata)
    assert str(e.value) == "unsupported pre-tokenizer type: 'mystery-bpe'"
    r = subprocess.run([sys.executable, "-m", "llmedge.cli.main", "show", str(path)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "mystery-bpe" in lines[0], r.stderr
