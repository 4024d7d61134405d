"""Tokenizer conformance with llama.cpp, and the tokenizer's own contracts.

The expected ids, texts, pieces and vocabulary facts were produced by llama.cpp (through
llama-cpp-python) with ``tests/fixtures/make_tokenizer_fixtures.py``; these tests only need the two
real model files (``smollm2_path``, ``gemma3_path``), not llama.cpp.
"""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import regex

from llmedge.errors import TokenizerError
from llmedge.gguf import GGUFFile
from llmedge.tokenizer import TokenAttr, Tokenizer

FIXTURES = Path(__file__).parent / "fixtures"
MODELS = ("smollm2", "gemma3")
COMBOS = [(b, s) for b in (False, True) for s in (False, True)]


def _load(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def paths(smollm2_path: Path, gemma3_path: Path) -> dict[str, Path]:
    return {"smollm2": smollm2_path, "gemma3": gemma3_path}


@pytest.fixture(scope="module")
def metas(paths: dict[str, Path]) -> dict[str, dict[str, Any]]:
    return {name: dict(GGUFFile(path).metadata) for name, path in paths.items()}


@pytest.fixture(scope="module")
def toks(metas: dict[str, dict[str, Any]]) -> dict[str, Tokenizer]:
    return {name: Tokenizer.from_metadata(meta) for name, meta in metas.items()}


@pytest.fixture(scope="module")
def fixtures() -> dict[str, dict[str, Any]]:
    return {name: _load(f"tokenizer_{name}.json") for name in MODELS}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


# ------------------------------------------------------------------------- conformance with llama.cpp


@pytest.mark.parametrize("model", MODELS)
def test_fixture_was_made_from_this_model_file(model: str, paths: dict[str, Path], fixtures: dict) -> None:
    assert _sha256(paths[model]) == fixtures[model]["model_sha256"]


def test_corpus_covers_the_required_kinds_of_text(fixtures: dict) -> None:
    texts = [c["text"] for c in fixtures["smollm2"]["cases"]]
    assert len(texts) >= 40
    joined = "".join(texts)
    for probe in ("\u4eca", "\uc548", "\u041f", "\u0645", "\u0928", "\u0e2a", "\U0001f3fd", "\u200d",
                  "\U0001f1fa", "def ", '{"', "\r\n", "\t", "\u00a0", "\u2003", "     ", "\n\n\n",
                  "1,234,567", "I'm", "<|im_start|>", "<start_of_turn>"):
        assert probe in joined, probe
    assert "" in texts


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize(("add_bos", "special"), COMBOS)
def test_encode_equals_llama_cpp_on_the_corpus(
    model: str, add_bos: bool, special: bool, toks: dict[str, Tokenizer], fixtures: dict
) -> None:
    tok = toks[model]
    key = f"bos={int(add_bos)},special={int(special)}"
    wrong = []
    for case in fixtures[model]["cases"]:
        got = tok.encode(case["text"], add_bos=add_bos, special=special)
        if got != case["ids"][key]:
            wrong.append((case["text"][:60], got[:20], case["ids"][key][:20]))
    assert not wrong, f"{len(wrong)} texts differ from llama.cpp, first: {wrong[0]}"


@pytest.mark.parametrize("model", MODELS)
def test_decode_equals_llama_cpp_on_the_corpus(model: str, toks: dict[str, Tokenizer], fixtures: dict) -> None:
    tok = toks[model]
    wrong = []
    for case in fixtures[model]["cases"]:
        full = case["ids"]["bos=1,special=1"]
        got = {
            "plain": tok.decode(case["ids"]["bos=0,special=0"]),
            "full_special=0": tok.decode(full),
            "full_special=1": tok.decode(full, special=True),
        }
        for k, v in got.items():
            if v != case["detok"][k]:
                wrong.append((case["text"][:40], k, v[:40], case["detok"][k][:40]))
    assert not wrong, f"{len(wrong)} detokenizations differ, first: {wrong[0]}"


@pytest.mark.parametrize("model", MODELS)
def test_token_to_piece_equals_llama_cpp(model: str, toks: dict[str, Tokenizer], fixtures: dict) -> None:
    tok = toks[model]
    pieces = fixtures[model]["pieces"]
    assert len(pieces) > 1000
    wrong = [
        t for t, (plain, special) in pieces.items()
        if tok.token_to_piece(int(t)).hex() != plain or tok.token_to_piece(int(t), special=True).hex() != special
    ]
    assert not wrong, f"pieces differ for ids {wrong[:10]}"


@pytest.mark.parametrize("model", MODELS)
def test_vocabulary_facts_equal_llama_cpp(model: str, toks: dict[str, Tokenizer], fixtures: dict) -> None:
    tok = toks[model]
    v = fixtures[model]["vocab"]
    assert tok.n_vocab == v["n_vocab"] == len(tok.tokens) == len(tok.token_types)
    assert (tok.bos_id, tok.eos_id, tok.eot_id) == (v["bos"], v["eos"], v["eot"])
    assert (tok.add_bos, tok.add_eos) == (v["add_bos"], v["add_eos"])
    assert sorted(tok.eog_ids) == v["eog_ids"]
    expected = np.zeros(v["n_vocab"], dtype=np.int64)
    runs = v["attrs_rle"]
    for (start, attr), nxt in zip(runs, runs[1:] + [[v["n_vocab"], 0]]):
        expected[start:nxt[0]] = attr
    got = np.array([tok.token_attr(i) for i in range(tok.n_vocab)])
    bad = np.flatnonzero(got != expected)
    assert bad.size == 0, f"attributes differ at ids {bad[:10].tolist()}"


def test_smollm2_eog_and_special_tokens(toks: dict[str, Tokenizer]) -> None:
    tok = toks["smollm2"]
    im_end = tok.token_id("<|im_end|>")
    assert tok.is_eog(im_end) and tok.is_eog(tok.token_id("<|endoftext|>"))
    assert not tok.is_eog(tok.token_id("<|im_start|>")) and not tok.is_eog(tok.token_id("Hello"))
    assert tok.encode("<|im_start|>", special=True) == [tok.token_id("<|im_start|>")] == [1]
    assert len(tok.encode("<|im_start|>")) > 1
    assert tok.model == "bpe" and tok.pre == "smollm"


def test_gemma3_eog_and_special_tokens(toks: dict[str, Tokenizer]) -> None:
    tok = toks["gemma3"]
    eot = tok.token_id("<end_of_turn>")
    assert tok.is_eog(eot) and tok.is_eog(tok.eos_id)
    assert tok.encode("<start_of_turn>", special=True) == [tok.token_id("<start_of_turn>")] == [105]
    assert len(tok.encode("<start_of_turn>")) > 1
    assert tok.encode("", add_bos=True) == [tok.bos_id] == [2]
    assert tok.model == "spm"
    # user-defined tokens (newline runs) are split out even without special parsing
    assert tok.encode("\n\n") == [tok.token_id("\n\n")]


def test_texts_round_trip_exactly_where_llama_cpp_round_trips(toks: dict[str, Tokenizer], fixtures: dict) -> None:
    # llama.cpp's BPE drops a merged symbol that is not in the vocabulary (here "\x1c\x1d" in
    # SmolLM2): that text does not survive, in llama.cpp or here; every other text does
    for model in MODELS:
        tok = toks[model]
        lost = [c["text"] for c in fixtures[model]["cases"] if tok.decode(tok.encode(c["text"])) != c["text"]]
        lost_by_llama_cpp = [c["text"] for c in fixtures[model]["cases"] if c["detok"]["plain"] != c["text"]]
        assert lost == lost_by_llama_cpp
        assert len(lost) <= 1


# ------------------------------------------------------------------------- other tokenizer settings


@pytest.fixture(scope="module")
def variants() -> dict[str, Any]:
    return _load("tokenizer_variants.json")


def test_variants_cover_the_issue_pre_tokenizers(variants: dict) -> None:
    pres = {v["overrides"].get("tokenizer.ggml.pre") for v in variants["variants"]}
    assert {"default", "llama-bpe", "qwen2", "gpt-2", "deepseek-llm"} <= pres


def test_other_pre_tokenizers_and_spm_flags_equal_llama_cpp(
    variants: dict, metas: dict[str, dict[str, Any]]
) -> None:
    corpus = _load("tokenizer_corpus.json")["texts"]
    wrong = []
    for variant in variants["variants"]:
        meta = dict(metas[variant["base"]])
        meta.update(variant["overrides"])
        tok = Tokenizer.from_metadata(meta)
        for case in variant["cases"]:
            text = corpus[case["text_index"]]
            for key, ids in case["ids"].items():
                got = tok.encode(text, add_bos="bos=1" in key, special="special=1" in key)
                if got != ids:
                    wrong.append((variant["overrides"], key, text[:40]))
            for key, want in case.get("detok", {}).items():
                if tok.decode(case["ids"]["bos=1,special=1"], special=key.endswith("1")) != want:
                    wrong.append((variant["overrides"], key, text[:40]))
            rich = case["ids"].get("bos=1,special=1", case["ids"]["bos=0,special=1"])
            for key, want in case["llama_detokenize"].items():
                flag = key.endswith("=1")
                if tok.detokenize_llama(rich, remove_special=flag, unparse_special=flag) != want:
                    wrong.append((variant["overrides"], key, text[:40]))
    assert not wrong, f"{len(wrong)} differences, first: {wrong[0]}"


def test_llama_detokenize_cleans_spaces_where_the_vocabulary_asks(
    variants: dict, metas: dict[str, dict[str, Any]]
) -> None:
    corpus = _load("tokenizer_corpus.json")["texts"]
    variant = next(v for v in variants["variants"] if v["overrides"] == {"tokenizer.ggml.pre": "gpt-2"})
    meta = dict(metas["smollm2"])
    meta.update(variant["overrides"])
    tok = Tokenizer.from_metadata(meta)
    case = next(c for c in variant["cases"] if corpus[c["text_index"]].startswith("Wait , what ?"))
    ids = case["ids"]["bos=0,special=1"]
    cleaned = tok.detokenize_llama(ids)
    assert cleaned == case["llama_detokenize"]["remove_special=0,unparse_special=0"]
    assert cleaned == "Wait, what? No! Yes. It's fine'tis he's I'm we're you've they 'll she 'd'quoted'end 'x"
    assert tok.decode(ids) == corpus[case["text_index"]]  # the plain concatenation keeps every space


@pytest.mark.parametrize("model", MODELS)
def test_detokenize_llama_equals_llama_detokenize(model: str, toks: dict[str, Tokenizer], fixtures: dict) -> None:
    tok = toks[model]
    for case in fixtures[model]["cases"]:
        full = case["ids"]["bos=1,special=1"]
        want = case["llama_detokenize"]
        assert tok.detokenize_llama(full) == want["full_special=0"]
        assert tok.detokenize_llama(full, unparse_special=True) == want["full_special=1"]


HF_REGEXES = {
    # the pre-tokenizer patterns as written in the models' tokenizer.json files
    "llama-bpe": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
                 "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    "qwen2": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
             "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    "gpt-2": "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+",
}


@pytest.mark.parametrize("pre", sorted(HF_REGEXES))
def test_pre_tokenizer_splits_like_the_hugging_face_regex(pre: str, metas: dict[str, dict[str, Any]]) -> None:
    meta = dict(metas["smollm2"])
    meta["tokenizer.ggml.pre"] = pre
    tok = Tokenizer.from_metadata(meta)
    hf = regex.compile(HF_REGEXES[pre])
    texts = ["Hello world, it's 2024! I'LL go  now.\n\n  Done\t\tx", "  a1234567b  c\r\n\r\nd's'S 'T ",
             "\u4eca\u5929 \u041f\u0440\u0438\u0432\u0435\u0442 e\u0301 \U0001f44d\U0001f3fd!!", "$$$ 3.14 ...   "]
    for text in texts:
        assert tok._pretokenize(text) == hf.findall(text), text


# ------------------------------------------------------------------------- streaming decoder


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("special", [False, True])
def test_stream_decoder_concatenates_to_decode(
    model: str, special: bool, toks: dict[str, Tokenizer], fixtures: dict
) -> None:
    tok = toks[model]
    for case in fixtures[model]["cases"]:
        ids = case["ids"]["bos=1,special=1"]
        full = tok.decode(ids, special=special)
        dec = tok.stream_decoder(special=special)
        shown = ""
        for tid in ids:
            shown += dec.push(tid)
            assert full.startswith(shown), (case["text"][:40], shown[-10:])
        shown += dec.flush()
        assert shown == full


def test_stream_decoder_holds_back_a_split_emoji(toks: dict[str, Tokenizer]) -> None:
    tok = toks["smollm2"]
    ids = tok.encode("a\U0001f44d\U0001f3fdb")
    assert len(ids) > 3  # the emoji arrives as several byte-level tokens
    dec = tok.stream_decoder()
    outs = [dec.push(t) for t in ids]
    assert all("\ufffd" not in o for o in outs)
    assert "" in outs  # some tokens complete no character
    assert "".join(outs) + dec.flush() == "a\U0001f44d\U0001f3fdb"


def test_stream_decoder_matches_decode_on_random_bytes(toks: dict[str, Tokenizer]) -> None:
    tok = toks["gemma3"]
    byte_ids = [tok.token_id(f"<0x{b:02X}>") for b in range(256)]
    rng = random.Random(7)
    for _ in range(300):
        data = [rng.choice([rng.randrange(256), rng.randrange(0x80, 0xC0), rng.randrange(0xE0, 0xF5)])
                for _ in range(rng.randrange(1, 12))]
        ids = [byte_ids[b] for b in data]
        dec = tok.stream_decoder()
        text = "".join(dec.push(t) for t in ids) + dec.flush()
        assert text == tok.decode(ids) == bytes(data).decode("utf-8", errors="replace")


def test_decode_drops_one_leading_space_after_bos_like_llama_cpp_python(toks: dict[str, Tokenizer]) -> None:
    tok = toks["gemma3"]
    ids = [tok.bos_id, *tok.encode(" Hello")]
    assert tok.decode(ids) == "Hello"
    assert tok.decode(ids, special=True) == "<bos> Hello"
    dec = tok.stream_decoder()
    assert "".join(dec.push(t) for t in ids) + dec.flush() == "Hello"
    assert tok.decode(tok.encode(" Hello")) == " Hello"


# ------------------------------------------------------------------------- exactness of the speed-ups


def test_spm_chunking_equals_one_pass_over_the_whole_text(toks: dict[str, Tokenizer], fixtures: dict) -> None:
    tok = toks["gemma3"]
    for case in fixtures["gemma3"]["cases"]:
        for frag in tok._partition(case["text"], False):
            if isinstance(frag, str):
                whole = list(tok._spm_chunk(frag.replace(" ", "\u2581")))
                chunked: list[int] = []
                tok._encode_spm(frag, chunked)
                assert chunked == whole, case["text"][:40]


def test_results_do_not_depend_on_the_cache(toks: dict[str, Tokenizer], fixtures: dict) -> None:
    for model in MODELS:
        tok = toks[model]
        texts = [c["text"] for c in fixtures[model]["cases"]]
        warm = [tok.encode(t, special=True) for t in reversed(texts)]
        tok._cache.clear()
        cold = [tok.encode(t, special=True) for t in reversed(texts)]
        assert warm == cold


# ------------------------------------------------------------------------- errors and synthetic vocabularies


def _spm_meta(tokens: list[tuple[str, float, int]], **extra: Any) -> dict[str, Any]:
    byte_tokens = [(f"<0x{b:02X}>", 0.0, 6) for b in range(256)]
    allt = [("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3)] + byte_tokens + tokens
    meta = {
        "general.architecture": "llama",
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": [t for t, _, _ in allt],
        "tokenizer.ggml.scores": np.array([s for _, s, _ in allt], dtype=np.float32),
        "tokenizer.ggml.token_type": np.array([k for _, _, k in allt], dtype=np.int32),
    }
    meta.update(extra)
    return meta


def test_spm_merges_best_score_first_and_falls_back_to_bytes() -> None:
    tok = Tokenizer.from_metadata(_spm_meta([
        ("\u2581", -1.0, 1), ("a", -1.0, 1), ("b", -1.0, 1), ("ab", -2.0, 1), ("\u2581a", -0.5, 1),
        ("\u2581ab", -3.0, 1), ("<|sep|>", 0.0, 4),
    ]))
    tid = tok.token_id
    # default SPM: BOS added, a space prefixed to the text and after each special token
    assert tok.add_bos and tok.add_space_prefix and tok.bos_id == 1 and tok.eos_id == 2
    # "▁ab": "▁a" (-0.5) beats "ab" (-2); then "▁a"+"b" = "▁ab" exists
    assert tok.encode("ab", add_bos=True) == [1, tid("\u2581ab")]
    # "c" is not in the vocabulary: its UTF-8 byte, then "é" as two bytes
    assert tok.encode("ac\u00e9") == [tid("\u2581a"), tid("<0x63>"), tid("<0xC3>"), tid("<0xA9>")]
    # user-defined tokens are split out; the text after a special token gets a space prefix again
    assert tok.encode("a<|sep|>b") == [tid("\u2581a"), tid("<|sep|>"), tid("\u2581"), tid("b")]
    assert tok.decode([1, tid("\u2581ab")]) == "ab"
    assert tok.decode([tid("<0xC3>"), tid("<0xA9>")]) == "\u00e9"


def test_rstrip_tokens_eat_the_following_whitespace_for_phi3() -> None:
    tokens = [("\u2581", -1.0, 1), ("a", -1.0, 1), ("<|end|>", 0.0, 3), ("<|user|>", 0.0, 4)]
    meta = _spm_meta(tokens, **{"general.name": "Phi-3 mini", "tokenizer.ggml.add_space_prefix": False})
    meta["tokenizer.ggml.tokens"] = meta["tokenizer.ggml.tokens"] + ["<|endoftext|>"]
    meta["tokenizer.ggml.scores"] = np.append(meta["tokenizer.ggml.scores"], 0.0).astype(np.float32)
    meta["tokenizer.ggml.token_type"] = np.append(meta["tokenizer.ggml.token_type"], 3).astype(np.int32)
    tok = Tokenizer.from_metadata(meta)
    tid = tok.token_id
    assert tok.token_attr(tid("<|end|>")) & TokenAttr.RSTRIP
    assert not tok.token_attr(tid("<|endoftext|>")) & TokenAttr.RSTRIP
    assert tok.encode("a<|end|> \n a", special=True) == [tid("a"), tid("<|end|>"), tid("a")]
    assert tok.encode("a<|user|>  a") == [tid("a"), tid("<|user|>"), tid("a")]
    assert tok.encode("a<|endoftext|> a", special=True) == [tid("a"), tid("<|endoftext|>"), tid("\u2581"),
                                                             tid("a")]
    # without special parsing, control tokens are text
    assert tid("<|end|>") not in tok.encode("a<|end|> a")


def test_eog_tokens_are_found_by_text_and_forced_control() -> None:
    tok = Tokenizer.from_metadata(_spm_meta([("<end_of_turn>", 0.0, 1), ("<|im_end|>", 0.0, 4)]))
    eot = tok.token_id("<end_of_turn>")
    assert tok.eot_id == eot
    assert {eot, tok.token_id("<|im_end|>"), tok.eos_id} <= tok.eog_ids
    assert tok.is_control(eot)
    assert tok.decode([eot]) == "" and tok.decode([eot], special=True) == "<end_of_turn>"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"tokenizer.ggml.model": "bert"}, "unsupported tokenizer model"),
        ({"tokenizer.ggml.model": None}, "tokenizer.ggml.model"),
        ({"tokenizer.ggml.tokens": None}, "tokenizer.ggml.tokens"),
        ({"tokenizer.ggml.pre": "no-such-pre"}, "pre-tokenizer"),
        ({"tokenizer.ggml.merges": None}, "merges"),
        ({"tokenizer.ggml.token_type": np.zeros(3, dtype=np.int32)}, "token_type"),
        ({"tokenizer.ggml.bos_token_id": "1"}, "bos_token_id"),
    ],
)
def test_bad_metadata_raises_tokenizer_error(change: dict, message: str, metas: dict) -> None:
    meta = dict(metas["smollm2"])
    for k, v in change.items():
        if v is None:
            meta.pop(k, None)
        else:
            meta[k] = v
    with pytest.raises(TokenizerError, match=message):
        Tokenizer.from_metadata(meta)


def test_bad_input_raises_tokenizer_error(toks: dict[str, Tokenizer]) -> None:
    tok = toks["smollm2"]
    with pytest.raises(TokenizerError, match="out of range"):
        tok.decode([tok.n_vocab])
    with pytest.raises(TokenizerError, match="out of range"):
        tok.token_to_piece(-1)
    with pytest.raises(TokenizerError, match="Unicode"):
        tok.encode("bad \ud800 surrogate")
    with pytest.raises(TokenizerError):
        tok.encode(b"bytes")  # type: ignore[arg-type]


def test_construction_does_not_keep_views_of_the_file(metas: dict) -> None:
    tok = Tokenizer.from_metadata(metas["gemma3"])
    assert not np.shares_memory(tok.token_types, metas["gemma3"]["tokenizer.ggml.token_type"])
    assert tok.token_types.dtype == np.int32


def test_speed_benchmark_runs(smollm2_path: Path) -> None:
    # speed is measured by benchmarks/tokenize_speed.py, never asserted; this only keeps it working
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "tokenize_speed.py"
    out = subprocess.run([sys.executable, str(script), str(smollm2_path), "--kb", "4"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert "document: " in out and "encode cold" in out and "decode" in out


@pytest.mark.parametrize("model", MODELS)
def test_the_tokenize_command_gives_llama_cpp_ids_for_each_flag_and_from_stdin(model: str, paths, fixtures) -> None:
    """`llmedge tokenize` as a user runs it: --bos and --special map to llama.cpp's add_special and
    parse_special, '-' reads the text from stdin, and --pieces prints each id with its text."""
    from typer.testing import CliRunner

    from llmedge.cli.main import app

    case = next(c for c in fixtures[model]["cases"] if c["text"].startswith(" <|im_end|> spaced <start_of_turn>"))
    for bos, special in COMBOS:
        flags = ["--bos"] * bos + ["--special"] * special
        for text, stdin in ((case["text"], None), ("-", case["text"])):
            r = CliRunner().invoke(app, ["tokenize", str(paths[model]), text, *flags], input=stdin)
            assert r.exit_code == 0, (r.output, r.exception)
            assert json.loads(r.stdout) == case["ids"][f"bos={int(bos)},special={int(special)}"], (flags, stdin)
    want = case["ids"]["bos=1,special=1"]
    r = CliRunner().invoke(app, ["tokenize", str(paths[model]), case["text"], "--bos", "--special", "--pieces"])
    assert r.exit_code == 0, (r.output, r.exception)
    rows = [line.split(None, 1) for line in r.stdout.splitlines()]
    assert [int(i) for i, _ in rows] == want
    tok = Tokenizer.from_metadata(GGUFFile(paths[model]).metadata)
    assert "".join(json.loads(p) for _, p in rows) == tok.decode(want, special=True)
