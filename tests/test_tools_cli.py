"""`llmedge perplexity --chunks` and its final "+/-" (against llama.cpp's), and `llmedge show`'s Ollama
fields (--parameters, --license, --system, --template) and its KV cache figure at a model's num_ctx,
run as a user runs them: in a subprocess, on a store in a temporary folder."""

from __future__ import annotations

import math
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tiny_gguf

import llmedge
from conftest import FIXTURES, load_fixture
from llmedge.perplexity import perplexity, scored_logits, uncertainty
from llmedge.server.manage import parameters_text

TEXT_FILE = FIXTURES / "texts" / "gpl3_30k.txt"
TEXT = TEXT_FILE.read_text(encoding="utf-8")[:240]
CTX = 128


def llmedge_cmd(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "LLMEDGE_MODELS": str(tmp_path / "store"), "OLLAMA_MODELS": str(tmp_path / "ollama"),
           "LLMEDGE_PYPI_URL": "http://127.0.0.1:9/"}  # nothing may be downloaded
    return subprocess.run([sys.executable, "-m", "llmedge.cli.main", *args], capture_output=True, text=True,
                          env=env, timeout=300, stdin=subprocess.DEVNULL)


def ok(p: subprocess.CompletedProcess) -> str:
    assert p.returncode == 0, p.stderr
    return p.stdout


def one_line_error(p: subprocess.CompletedProcess, text: str) -> None:
    assert p.returncode == 1 and p.stdout == "", (p.stdout, p.stderr)
    assert p.stderr.startswith("Error: ") and p.stderr.count("\n") == 1 and text in p.stderr, p.stderr


# ----------------------------------------------------------------------------------------- perplexity
def test_uncertainty_is_the_standard_error_of_the_mean_nll_times_the_perplexity() -> None:
    """llama-perplexity's +/-: the sample standard deviation of the per-token NLLs over sqrt(count),
    times exp(mean), recomputed here with the statistics module; none where llama.cpp prints none."""
    rng = np.random.default_rng(1)
    for v in ([1.0, 2.0, 3.0, 4.0], list(rng.gamma(2.0, 1.5, 777))):
        want = statistics.stdev(v) / math.sqrt(len(v)) * math.exp(statistics.fmean(v))
        got = uncertainty(sum(v), sum(x * x for x in v), len(v))
        assert got == pytest.approx(want, rel=1e-9)
    assert uncertainty(1.5, 2.25, 1) is None  # one token: no spread to speak of (llama.cpp divides by zero)
    assert uncertainty(6.0, 12.0, 3) is None  # equal NLLs: llama.cpp prints no estimate


def test_the_api_accumulates_every_scored_tokens_nll(tmp_path: Path) -> None:
    """perplexity(...).uncertainty from the per-token NLLs recomputed in float64 from the scored logits."""
    path = tiny_gguf.write_tiny_llama(tmp_path / "tiny.gguf", seed=3)
    m = llmedge.load(str(path), backend="numpy", n_ctx=CTX)
    r = perplexity(m, TEXT, CTX)
    ids = m.tokenizer.encode(TEXT, add_bos=True, special=False)
    nll = []
    for c in range(r.n_chunks):
        chunk = ids[c * CTX : (c + 1) * CTX]
        x = scored_logits(m, chunk).astype(np.float64)  # the rows scored (BOS first, as llama.cpp)
        logp = x - x.max(1, keepdims=True) - np.log(np.exp(x - x.max(1, keepdims=True)).sum(1, keepdims=True))
        nll += list(-logp[np.arange(len(x)), chunk[CTX // 2 + 1 :]])
    assert r.n_chunks == 2 and r.n_scored == len(nll)
    assert r.ppl == pytest.approx(math.exp(statistics.fmean(nll)), rel=1e-6)
    assert r.uncertainty == pytest.approx(statistics.stdev(nll) / math.sqrt(len(nll)) * r.ppl, rel=1e-6)
    first = perplexity(m, TEXT, CTX, n_chunks=1)
    assert (first.n_chunks, first.n_scored) == (1, len(nll) // 2)
    assert first.uncertainty == pytest.approx(statistics.stdev(nll[: len(nll) // 2]) / math.sqrt(len(nll) // 2)
                                              * first.ppl, rel=1e-6)
    assert perplexity(m, TEXT, CTX, n_chunks=99).n_chunks == 2  # more than the text holds: all of them


@pytest.mark.parametrize("chunks", [0, -1, True, 1.5])
def test_a_number_of_chunks_that_scores_nothing_is_refused(tmp_path: Path, chunks) -> None:
    """perplexity(n_chunks=0) divided by zero after scoring nothing."""
    path = tiny_gguf.write_tiny_llama(tmp_path / "tiny.gguf", seed=3)
    m = llmedge.load(str(path), backend="numpy", n_ctx=CTX)
    with pytest.raises(ValueError, match=r"n_chunks \(the first chunks to score\) must be an integer of at least 1"):
        perplexity(m, TEXT, CTX, n_chunks=chunks)


@pytest.mark.parametrize("chunks", ["0", "-1"])
def test_cli_chunks_zero_or_negative_is_one_line_before_anything_is_read(tmp_path: Path, chunks: str) -> None:
    # the model and the text do not exist: the option is checked first
    p = llmedge_cmd(tmp_path, "perplexity", str(tmp_path / "none.gguf"), "-f", str(tmp_path / "none.txt"),
                    f"--chunks={chunks}")
    one_line_error(p, f"--chunks (the first chunks to score) must be an integer of at least 1, not {chunks}")


def test_final_estimates_of_the_llamacpp_fixture_follow_from_its_sums() -> None:
    """The fixture's +/- (perplexity.cpp's formula, transcribed in its maker) is what uncertainty() gives."""
    fx = load_fixture("llamacpp_perplexity_uncertainty.json")
    for m in fx["models"].values():
        got = uncertainty(sum(m["chunk_nll"]), sum(m["chunk_nll2"]), m["n_scored"])
        assert got == pytest.approx(m["plus_minus"], rel=1e-5)
        assert math.exp(sum(m["chunk_nll"]) / m["n_scored"]) == pytest.approx(m["ppl"], rel=1e-6)


def test_cli_chunks_and_plus_minus_agree_with_llamacpp(tmp_path: Path, smollm2_path: Path) -> None:
    """`perplexity --chunks 2` scores the first two chunks only, and its final line carries llama.cpp's
    +/-: both within llama.cpp's own spread across builds (its AVX2 and AVX-512 builds differ by 0.75%
    on these two chunks; fixtures/llamacpp_perplexity_chunks.json and _uncertainty.json)."""
    fx = load_fixture("llamacpp_perplexity_uncertainty.json")
    want = fx["models"]["smollm2"]
    p = llmedge_cmd(tmp_path, "perplexity", str(smollm2_path), "-f", str(TEXT_FILE), "--ctx", str(fx["n_ctx"]),
                    "--chunks", str(fx["n_chunks"]))
    out = ok(p)
    m = re.fullmatch(r"Final estimate: PPL = (\d+\.\d{4}) \+/- (\d+\.\d{5}) \((\d+) chunks of 512, (\d+) tokens "
                     r"scored\)\n", out)
    assert m, out
    ppl, plus_minus, n_chunks, n_scored = float(m[1]), float(m[2]), int(m[3]), int(m[4])
    assert (n_chunks, n_scored) == (fx["n_chunks"], want["n_scored"])
    assert abs(ppl / want["ppl"] - 1) < 0.01, (ppl, want["ppl"])
    assert abs(plus_minus / want["plus_minus"] - 1) < 0.02, (plus_minus, want["plus_minus"])
    assert p.stderr.count("\n") == fx["n_chunks"]  # a progress line per chunk scored


# ----------------------------------------------------------------------------------------------- show
MODELFILE = '''FROM ./tiny.gguf
PARAMETER num_ctx 64
PARAMETER temperature 0.7
PARAMETER top_p 1
PARAMETER min_p 0.123456789
PARAMETER seed 12345678
PARAMETER penalize_newline false
PARAMETER stop "<|user|>"
PARAMETER stop "say \\"hi\\""
SYSTEM """You are
terse."""
LICENSE "MIT License"
LICENSE """Second
part"""
'''


@pytest.fixture
def store(tmp_path: Path) -> Path:
    tiny_gguf.write_tiny_llama(tmp_path / "tiny.gguf")
    (tmp_path / "Modelfile").write_text(MODELFILE)
    ok(llmedge_cmd(tmp_path, "create", "terse", "-f", str(tmp_path / "Modelfile")))
    return tmp_path


def test_show_prints_each_ollama_field_as_ollama_does(store: Path) -> None:
    """ollama show --parameters/--license print the field and a newline; --system and --template
    print it as it is (Go's fmt.Print): nothing around it."""
    assert ok(llmedge_cmd(store, "show", "terse", "--parameters")) == (
        "num_ctx                        64\n"
        "temperature                    0.7\n"
        "top_p                          1\n"
        "min_p                          0.12345679\n"  # a float32, as Ollama's create parses it
        "seed                           1.2345678e+07\n"  # Ollama's JSON: a float64, %v
        "penalize_newline               false\n"
        'stop                           "<|user|>"\n'
        'stop                           "say \\"hi\\""\n')
    assert ok(llmedge_cmd(store, "show", "terse", "--license")) == "MIT License\nSecond\npart\n"
    assert ok(llmedge_cmd(store, "show", "terse", "--system")) == "You are\nterse."
    assert ok(llmedge_cmd(store, "show", "terse", "--template")) == tiny_gguf.TEMPLATE


def test_api_show_parameters_are_the_text_show_prints(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """/api/show's parameters printed Python's values (1.0, 12345678, False, stop strings unescaped)
    where Ollama prints Go's %#v, and Modelfile floats as float64 where Ollama's create parses float32s:
    now the server's text is what `show --parameters` prints (as `ollama show` prints the server's)."""
    import httpx
    from test_server_api import running_server

    monkeypatch.setenv("LLMEDGE_MODELS", str(store / "store"))
    printed = ok(llmedge_cmd(store, "show", "terse", "--parameters"))
    with running_server(parallel=1) as url:
        r = httpx.post(url + "/api/show", json={"model": "terse"}, timeout=30)
        assert r.status_code == 200, r.text
        assert r.json()["parameters"] + "\n" == printed
        r = httpx.post(url + "/api/create", json={"model": "derived", "from": "terse", "modelfile":
                                                  "FROM terse\nPARAMETER temperature 3.3333333333"}, timeout=30)
        assert r.status_code == 200, r.text
        shown = httpx.post(url + "/api/show", json={"model": "derived"}, timeout=30).json()["parameters"]
        assert f"{'temperature':<30} 3.3333333\n" in shown, shown  # float32 digits
        r = httpx.post(url + "/api/create", json={"model": "json", "from": "terse",
                                                  "parameters": {"temperature": 3.3333333333}}, timeout=30)
        assert r.status_code == 200, r.text  # JSON parameters are float64s in Ollama too
        shown = httpx.post(url + "/api/show", json={"model": "json"}, timeout=30).json()["parameters"]
        assert f"{'temperature':<30} 3.3333333333\n" in shown, shown


def test_show_fields_of_a_bare_gguf(store: Path, smollm2_path: Path) -> None:
    """No Modelfile: no parameters (an empty line, as Ollama's Println("")), no system; the license is
    the GGUF's general.license when it has one (SmolLM2's: apache-2.0)."""
    bare = store / "tiny.gguf"
    assert ok(llmedge_cmd(store, "show", str(bare), "--parameters")) == "\n"
    assert ok(llmedge_cmd(store, "show", str(bare), "--system")) == ""
    assert ok(llmedge_cmd(store, "show", str(bare), "--license")) == "\n"
    assert ok(llmedge_cmd(store, "show", str(smollm2_path), "--license")) == "apache-2.0\n"


@pytest.mark.parametrize("flags", [["--license", "--system"], ["--parameters", "--template"],
                                   ["--modelfile", "--parameters"]])
def test_show_takes_one_field_flag_with_ollamas_message(store: Path, flags: list[str]) -> None:
    one_line_error(llmedge_cmd(store, "show", "terse", *flags),
                   "only one of '--license', '--modelfile', '--parameters', '--system', or '--template' "
                   "can be specified")
    one_line_error(llmedge_cmd(store, "show", "terse", "--json", flags[0]), f"cannot be combined with {flags[0]}")


def test_show_kv_cache_is_at_the_models_num_ctx_unless_ctx_is_given(store: Path) -> None:
    """show gave the KV cache at 4096 tokens (capped at the model's 256) for a model whose Modelfile
    sets num_ctx 64."""
    def kv(*args: str) -> str:
        return next(line for line in ok(llmedge_cmd(store, "show", *args)).splitlines() if "kv cache" in line)

    created, given = kv("terse"), kv("terse", "--ctx", "64")
    assert "at 64 tokens (the model's num_ctx)" in created and "at 64 tokens (--ctx)" in given
    assert created.split(" at ")[0] == given.split(" at ")[0]  # the same bytes
    assert "at 128 tokens (--ctx)" in kv("terse", "--ctx", "128")
    assert "at 256 tokens (the default)" in kv(str(store / "tiny.gguf"))  # 4096, the model's 256 at most


def test_parameters_print_as_go_prints_ollamas_json_decoded_values() -> None:
    """Ollama's params are JSON: every number is a float64, printed by %#v (shortest %g, exponent form
    below 1e-4 and from 1e+06); strings are Go-quoted."""
    cases = [(4096, "4096"), (0.7, "0.7"), (1.0, "1"), (100000, "100000"), (1048576, "1.048576e+06"),
             (1e6, "1e+06"), (0.0001, "0.0001"), (0.00001, "1e-05"), (1.5e-7, "1.5e-07"), (-2, "-2"), (0, "0"),
             (0.05, "0.05"), (True, "true"), (False, "false")]
    for value, want in cases:
        assert parameters_text({"x": value}) == f"{'x':<30} {want}", value
    assert parameters_text({"stop": ["a\"b", "tab\there\n", "\x01", "é"]}).splitlines() == [
        f"{'stop':<30} " + s for s in ('"a\\"b"', '"tab\\there\\n"', '"\\x01"', '"é"')]


def test_perplexity_chunks_are_c_not_the_models_num_ctx(store: Path) -> None:
    """perplexity's chunk size is llama-perplexity's -c (512 unless given, as llama.cpp's tools), never
    the model's num_ctx PARAMETER (terse sets 64): perplexities only compare at one chunk size. It took
    only --ctx, where llama-perplexity and llmedge imatrix take -c too."""
    text = store / "text.txt"
    text.write_text(TEXT_FILE.read_text(encoding="utf-8")[:3000])
    assert "chunks of 32," in ok(llmedge_cmd(store, "perplexity", "terse", "-f", str(text), "-c", "32"))
    assert "chunks of 512," in ok(llmedge_cmd(store, "perplexity", "terse", "-f", str(text)))
