"""Agreement with llama.cpp on the real models: logits, greedy continuations and perplexity.

The reference numbers are llama.cpp's (llama-cpp-python), stored by fixtures/make_llamacpp_fixtures.py,
together with, per position, how far llama.cpp's own other paths (token-by-token decoding, flash
attention) land from its reference: ``own_spread`` and ``own_flip``. The foundation issue's tolerances
("as close as llama.cpp is to itself") are applied as: top-1 equal wherever llama.cpp's margin exceeds
0.5 and its own paths agree on the top-1; the top token's log-prob within 0.06 in median and, beyond
llama.cpp's own spread at that position, within 0.35 at worst; the top-20 log-probs within 0.45 at
the 95th percentile.
"""

from __future__ import annotations

import gc
import subprocess
import sys
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import llmedge
from conftest import FIXTURES, load_fixture
from llmedge.gguf import GGUFFile
from llmedge.sampling import Sampler, SamplingOptions
from llmedge.tokenizer import Tokenizer

MODELS = ["smollm2", "gemma3"]
BACKENDS = ["native", "numba", "numpy"]


# Loaded models shared by the tests below, only the one in use kept: the reference backend holds a
# float32 copy of every weight (1.1 GB for Gemma), and reloading a native model is a cheap mmap.
_LOADED: OrderedDict[tuple[str, str], llmedge.Model] = OrderedDict()
_KEEP = 1


def _model(paths: dict[str, Path], name: str, backend: str) -> llmedge.Model:
    key = (name, backend)
    if key not in _LOADED:
        while len(_LOADED) >= _KEEP:
            _LOADED.popitem(last=False)
        gc.collect()
        _LOADED[key] = llmedge.load(str(paths[name]), backend=backend, n_ctx=4096)
    _LOADED.move_to_end(key)
    return _LOADED[key]


@pytest.fixture(scope="module", params=[(m, b) for m in MODELS for b in BACKENDS], ids=lambda p: f"{p[0]}-{p[1]}")
def case(request, model_paths: dict[str, Path]):
    name, backend = request.param
    return name, _model(model_paths, name, backend), load_fixture(f"llamacpp_{name}.json")


@dataclass
class Agreement:
    """How a backend's logits compare with llama.cpp's over every fixture case."""

    flips: list[tuple[str, int]]  # positions whose top-1 differs where llama.cpp is sure (margin > sure_margin)
    checked: int  # positions where llama.cpp is sure
    median_top: float  # median |delta log p| of llama.cpp's top token
    worst_excess: float  # worst |delta log p| of the top token beyond llama.cpp's own spread there
    p95_top20: float  # 95th percentile of |delta log p| over llama.cpp's top 20 tokens
    longest: int


def logprobs_at(logits: np.ndarray, ids: np.ndarray, rows_per_chunk: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """Log-probabilities (float64) of ``ids`` [rows, k] under each row of ``logits``, and each row's
    argmax; in row chunks, so a long prompt over a 262k vocabulary needs no float64 copy of it all."""
    out = np.empty(ids.shape, dtype=np.float64)
    for s in range(0, len(logits), rows_per_chunk):
        chunk = logits[s : s + rows_per_chunk].astype(np.float64)
        m = chunk.max(axis=-1, keepdims=True)
        logz = m + np.log(np.exp(chunk - m).sum(axis=-1, keepdims=True))
        out[s : s + rows_per_chunk] = np.take_along_axis(chunk, ids[s : s + rows_per_chunk], axis=1) - logz
    return out, logits.argmax(axis=1)


def agreement(model: llmedge.Model, fx: dict, sure_margin: float, tops: list[dict] | None = None) -> Agreement:
    """``tops``: per logits case, the top-1 tokens and margins of the ggml build the backend reproduces
    when that is not the AVX2 build that made ``fx`` (see _logits_tops); flips are counted against them,
    where both builds are sure."""
    top_token_diffs, excess, top20_diffs, flips, checked = [], [], [], [], 0
    for k, c in enumerate(fx["logits"]):
        top_ids = np.asarray(c["top_ids"])
        ref_lp = np.asarray(c["top_logprobs"])
        margin = np.asarray(c["margin"])
        my_lp, my_top = logprobs_at(model.logits(c["ids"]), top_ids)
        d = np.abs(my_lp[:, 0] - ref_lp[:, 0])
        top_token_diffs.extend(d)
        excess.extend(d - np.asarray(c["own_spread"]))
        top20_diffs.extend(np.abs(my_lp - ref_lp).ravel())
        sure = (margin > sure_margin) & ~np.asarray(c["own_flip"])
        ref_top = top_ids[:, 0]
        if tops is not None:
            assert tops[k]["name"] == c["name"]
            sure &= np.asarray(tops[k]["margin"]) > sure_margin
            ref_top = np.asarray(tops[k]["top1"])
        checked += int(sure.sum())
        wrong = np.nonzero(sure & (my_top != ref_top))[0]
        flips.extend((c["name"], int(i)) for i in wrong)
    return Agreement(flips, checked, float(np.median(top_token_diffs)), float(np.max(excess)),
                     float(np.percentile(top20_diffs, 95)), max(len(c["ids"]) for c in fx["logits"]))


# (sure margin, worst top-token excess) per backend. The native backend reproduces llama.cpp's
# arithmetic (its kernels' rounding and summation orders) and is held to the issue's numbers; so is
# numba, which reproduces llama.cpp's decode-order products and float ops bit for bit.
# The NumPy reference rounds activations where ggml does but sums exactly (float64, so its results
# are the same on every CPU) and skips llama.cpp's kernel-specific roundings (repacked Q4_K tiles,
# fused multiply-adds). Measured (agreement() above, on an AVX-512 Xeon, the same on any CPU):
# SmolLM2 no flip above margin 0.25 (394 positions), worst excess 0.19, median 0.035, p95 0.28;
# Gemma 3 no flip above 0.5 (1,219 positions; six between 0.29 and 0.47 on its long prompt), worst
# excess 0.350 (its 1,194-token prompt), median 0.029, p95 0.41. So it is held to the margin
# 0.5, and to excess 0.5 (the float32-BLAS reference it replaces was held to margin 0.75 and 0.5).
BOUNDS = {"native": (0.5, 0.35), "numba": (0.5, 0.35), "numpy": (0.5, 0.5)}


def test_logits_agree_with_llamacpp(case) -> None:
    name, model, fx = case
    sure_margin, worst_excess = BOUNDS[model.backend_name]
    a = agreement(model, fx, sure_margin, _logits_tops(name, model))
    assert a.checked > 100
    assert a.flips == [], f"top-1 differs where llama.cpp's margin > {sure_margin}: {a.flips[:10]}"
    assert a.median_top <= 0.06, a
    assert a.worst_excess <= worst_excess, f"worst top-token log-prob gap beyond llama.cpp's own: {a}"
    assert a.p95_top20 <= 0.45, a
    if name == "gemma3":
        assert a.longest > 1024  # past the sliding window


def _logits_tops(name: str, model: llmedge.Model) -> list[dict] | None:
    """The top-1 tokens of the logits cases as the ggml build this backend follows computes them: the
    native AVX-512 tier reproduces ggml's AVX-512 build (llamacpp_greedy_avx512.json's logits_top),
    every other backend is held to the AVX2 build that made llamacpp_<name>.json (None). Past Gemma 3's
    sliding window the two builds' top-1 part where the AVX2 build was sure (long:1050, margin 0.61)."""
    if getattr(model.model.backend, "isa", None) != "avx512":
        return None
    return load_fixture("llamacpp_greedy_avx512.json")["logits_top"][name]


def _agreed_prefix(ref_tokens: list[int], margins: list[float]) -> int:
    """Tokens up to (and including) the first near-tie, where llama.cpp itself could go either way."""
    for i, m in enumerate(margins):
        if m < 0.1:
            return i
    return len(ref_tokens)


def _greedy_reference(name: str, model: llmedge.Model, fx: dict) -> list[dict]:
    """llama.cpp's greedy continuations as the ggml build this backend follows computes them: the
    native AVX-512 tier reproduces ggml's AVX-512 build (llamacpp_greedy_avx512.json, the same prompts),
    every other tier the AVX2 build that made llamacpp_<name>.json. The two builds part at steps where
    neither is a near-tie."""
    if getattr(model.model.backend, "isa", None) != "avx512":
        return fx["greedy"]
    other = load_fixture("llamacpp_greedy_avx512.json")["models"][name]
    return [{**g, "tokens": o["tokens"], "margins": o["margins"]} for g, o in zip(fx["greedy"], other, strict=True)]


def _greedy_fresh(model: llmedge.Model, ids: list[int], n: int) -> list[int]:
    """Greedy tokens from an empty cache, the prompt in one batch, as llama.cpp evaluated the
    fixture's: a prefix cached by an earlier prompt would split this one into other batches, whose rows
    llama.cpp's kernels (and llmedge's, which follow them) sum in other orders."""
    eng = model.engine
    gen = eng.begin(ids, Sampler(SamplingOptions(temperature=0)), max_tokens=n, cache=eng.new_cache())
    toks: list[int] = []
    while not gen.done:
        toks.extend(c.token for c in eng.step([gen])[0])
    return toks


@pytest.mark.parametrize("name", MODELS)
def test_greedy_continuations_agree(name: str, model_paths: dict[str, Path]) -> None:
    """Token for token on the default (native) backend, which reproduces llama.cpp's arithmetic. The
    float reference sums in BLAS order, so on sensitive prompts (a lone first word feeding the
    attention sink) it may leave the path early; it is held to the logits tolerances above."""
    model, fx = _model(model_paths, name, "native"), load_fixture(f"llamacpp_{name}.json")
    for g in _greedy_reference(name, model, fx):
        assert model.tokenize(g["prompt"], add_bos=True, special=True) == g["prompt_ids"]
        mine = _greedy_fresh(model, g["prompt_ids"], len(g["tokens"]))
        n = _agreed_prefix(g["tokens"], g["margins"])
        assert mine[:n] == g["tokens"][:n], g["name"]


@pytest.mark.parametrize("name", MODELS)
def test_cli_run_prints_llamacpp_greedy_text(name: str, model_paths: dict[str, Path]) -> None:
    fx = load_fixture(f"llamacpp_{name}.json")
    g = _greedy_reference(name, _model(model_paths, name, "native"), fx)[0]
    r = subprocess.run(
        [sys.executable, "-m", "llmedge.cli.main", "run", str(model_paths[name]), g["prompt"], "--raw",
         "--temperature", "0", "--num-predict", str(len(g["tokens"]))],
        capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stderr
    n = _agreed_prefix(g["tokens"], g["margins"])
    tok = Tokenizer.from_metadata(GGUFFile(model_paths[name]).metadata)
    assert r.stdout.startswith(tok.decode(g["tokens"][:n]))


# Perplexity runs on native (what users get) for both models. The float reference's logits are
# checked above on 2,110 positions of both models; its perplexity over 6,144 tokens took 100 s in
# float64 on 2 cores (the suite's budget is 15 minutes), and numba's is a multi-minute case too.
PERPLEXITY_CASES = [("smollm2", "native"), ("gemma3", "native")]


@pytest.mark.parametrize(("name", "backend"), PERPLEXITY_CASES, ids=lambda v: v)
def test_perplexity_within_half_a_percent(name: str, backend: str, model_paths: dict[str, Path]) -> None:
    from llmedge.perplexity import perplexity

    fx = load_fixture(f"llamacpp_{name}.json")
    p = fx["perplexity"]
    text = (FIXTURES / p["text"]).read_text(encoding="utf-8")
    r = perplexity(_model(model_paths, name, backend), text, p["n_ctx"])
    assert r.n_chunks == p["n_chunks"]
    assert abs(r.ppl / p["ppl"] - 1) <= 0.005, (r.ppl, p["ppl"])
