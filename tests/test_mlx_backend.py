"""Tests of the MLX backend (llmedge.backends.mlx), on MLX's CPU build here and Apple's GPU on a Mac.

Oracles: ``llmedge.quant``'s NumPy dequantization (every exact mapping must dequantize to it bit for
bit), float64 products of the dequantized weights, the NumPy reference backend's float ops, and
llama.cpp's logits and greedy continuations of the two real models (the fixtures the other backends
meet), held to the MLX issue's tolerances: MLX multiplies float32 activations where llama.cpp
quantizes them to Q8, so agreement is close, not bitwise. On MLX's CPU build prompts run their
products through NumPy (llmedge.backends.mlx_wide; checked against the MLX path here), so every
logits case of the fixtures and the first half of the perplexity text run; decoding stays on MLX's
slow CPU products, so the greedy, chat, server and batching cases generate a few tokens each.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from backend_checks import assert_attention_matches_reference
from conftest import FIXTURES, load_fixture, skip_or_fail
from llmedge.backends import choose_backend
from llmedge.backends.numpy_ref import NumpyBackend
from llmedge.gguf import TensorInfo
from llmedge.quant import GGMLQuantizationType as T
from llmedge.quant import dequantize, quantize, traits

try:
    import mlx.core as mx

    from llmedge.backends.mlx import MlxBackend, MlxWeight
    from llmedge.backends.mlx_quant import MAPPINGS, REQUANTIZED
except ImportError as e:  # pragma: no cover - the test setup installs mlx[cpu]
    skip_or_fail(f"mlx is not importable: {e}")

WEIGHT_TYPES = [
    T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0,
    T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS,
]  # fmt: skip
EXACT = set(MAPPINGS) | {T.F32, T.F16, T.BF16}
# byte offsets of the f16 scales inside one block (ggml-common.h)
F16_FIELDS = {
    T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,),
    T.IQ4_NL: (0,), T.IQ4_XS: (0,), T.Q8_0: (0,),
}  # fmt: skip


@pytest.fixture(scope="module")
def be() -> MlxBackend:
    """The MLX path for every step (on MLX's CPU device, wide steps would go through NumPy)."""
    b = MlxBackend()
    b.wide_rows = None
    return b


def wide_backend() -> MlxBackend:
    """Every step through NumPy's BLAS, as wide steps on MLX's CPU device (llmedge.backends.mlx_wide)."""
    b = MlxBackend()
    b.wide_rows = 1
    return b


PATHS = ["mlx", "wide"]


def make_tensor(raw: np.ndarray, t: T, m: int, k: int, name: str = "w") -> TensorInfo:
    flat = np.ascontiguousarray(raw).reshape(-1)
    return TensorInfo(name=name, ggml_type=int(t), dims=(k, m), offset=0, n_bytes=flat.size, _buffer=flat)


def random_weight(t: T, m: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Raw rows of type ``t``: quantized random data for the types llmedge.quant quantizes cheaply, else
    random bits everywhere (every code, scale and min pattern) with moderate f16 scales."""
    if t == T.F32:
        return rng.standard_normal((m, k)).astype(np.float32).view(np.uint8)
    if t in (T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1):
        return quantize(rng.standard_normal((m, k)).astype(np.float32), t).reshape(m, -1)
    tr = traits(t)
    nb = m * k // tr.block_size
    raw = rng.integers(0, 256, size=(nb, tr.type_size), dtype=np.uint8)
    for off in F16_FIELDS[t]:
        raw[:, off : off + 2] = rng.uniform(-0.05, 0.05, nb).astype(np.float16).view(np.uint8).reshape(nb, 2)
    return raw.reshape(m, -1)


def requantization_bound(wd: np.ndarray) -> np.ndarray:
    """One step of MLX's 8-bit re-quantization of each 32-value group of ``wd``, per value (MLX
    shifts its grid so that the group's larger-magnitude end is exact: the rest may be a step off)."""
    g = wd.reshape(wd.shape[0], -1, 32)
    step = (g.max(axis=-1) - g.min(axis=-1)) / 255.0
    return np.repeat(step * 1.01 + 1e-12, 32, axis=1)


# ----------------------------------------------------------------------------- weights


@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=lambda t: t.name)
def test_weights_map_onto_mlx_exactly_where_the_math_is_exact(be: MlxBackend, t: T) -> None:
    rng = np.random.default_rng(10 + int(t))
    k = 512 if traits(t).block_size == 256 else 96
    m = 33
    raw = random_weight(t, m, k, rng)
    w = be.prepare(make_tensor(raw, t, m, k, name=f"w{t.name}"))
    assert isinstance(w, MlxWeight)
    ids = np.array([0, 32, 7, 7, 16], dtype=np.int32)
    ref = dequantize(raw, t, (m, k))
    got = be.get_rows(w, ids)
    if t in EXACT:
        assert np.array_equal(got, ref[ids]), w.became  # equal values (a zero may differ in sign)
        assert "exact" in w.became or "as stored" in w.became
    else:
        assert t in REQUANTIZED and "re-quantized" in w.became
        assert np.all(np.abs(got - ref[ids]) <= requantization_bound(ref)[ids])
    with pytest.raises(IndexError):
        be.get_rows(w, np.array([m]))
    assert be.weight_report()[f"w{t.name}"] == w.became


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=lambda t: t.name)
def test_matmul_matches_the_float64_product_of_the_dequantized_weights(be: MlxBackend, t: T, path: str) -> None:
    """On MLX (``mx.quantized_matmul``) and through NumPy from the MLX form (wide steps)."""
    rng = np.random.default_rng(100 + int(t))
    k = 768 if traits(t).block_size == 256 else 352
    m = 33
    raw = random_weight(t, m, k, rng)
    be = be if path == "mlx" else wide_backend()
    w = be.prepare(make_tensor(raw, t, m, k))
    wd = dequantize(raw, t, (m, k)).astype(np.float64)
    for n in (1, 7):
        x = rng.standard_normal((n, k)).astype(np.float32)
        out = be.matmul(x, w)
        assert out.shape == (n, m) and out.dtype == np.float32
        ref = x.astype(np.float64) @ wd.T
        scale = np.abs(x).astype(np.float64) @ np.abs(wd).T
        if t == T.F16:  # activations rounded to f16 for the f16 product, as ggml does
            bound = 2.0**-10 * scale
        elif t == T.BF16:
            bound = 2.0**-7 * scale
        elif t in EXACT:
            bound = 2e-6 * scale + 1e-6
        else:
            bound = np.abs(x).astype(np.float64) @ requantization_bound(wd.astype(np.float32)).T + 2e-6 * scale
        assert np.all(np.abs(out - ref) <= bound), (t.name, n, np.abs(out - ref).max())


def test_tied_tensors_are_converted_once(be: MlxBackend) -> None:
    raw = random_weight(T.Q8_0, 8, 64, np.random.default_rng(5))
    info = make_tensor(raw, T.Q8_0, 8, 64)
    assert be.prepare(info) is be.prepare(info)


# ----------------------------------------------------------------------------- float ops


def test_rms_norm_matches_reference(be: MlxBackend) -> None:
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((5, 3, 96)) * 4).astype(np.float32)
    w = rng.standard_normal(96).astype(np.float32)
    np.testing.assert_allclose(be.rms_norm(x, w, 1e-6), NumpyBackend().rms_norm(x, w, 1e-6), rtol=2e-5, atol=1e-5)


@pytest.mark.parametrize("neox", [False, True], ids=["normal", "neox"])
def test_rope_matches_reference_at_any_position(be: MlxBackend, neox: bool) -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((8, 3, 64)).astype(np.float32)
    pos = np.array([0, 1, 2, 17, 300, 4095, 12000, -40], dtype=np.int32)  # negative: a context shift
    for base, fscale in ((10000.0, 1.0), (1e6, 0.25)):
        out = be.rope(x, pos, 48, base, fscale, neox)
        ref = NumpyBackend().rope(x, pos, 48, base, fscale, neox)
        # ggml advances the angle by repeated float32 products, MLX takes powers: the float32 angles
        # of thousands of radians differ in their last bits (1e-3 at position 12000)
        np.testing.assert_allclose(out, ref, rtol=0, atol=3e-3)
        np.testing.assert_allclose(out[:4], ref[:4], rtol=0, atol=2e-5)
        assert np.array_equal(out[..., 48:], x[..., 48:])


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kv_dtype", [np.float16, np.float32], ids=["f16", "f32"])
def test_attention_masks_gqa_window_softcap(be: MlxBackend, kv_dtype, path: str) -> None:
    # the reference rounds q and p to f16 over an f16 cache, as ggml does; MLX stays in float32
    assert_attention_matches_reference(be if path == "mlx" else wide_backend(), kv_dtype, f16_prob_ulps=2)


@pytest.mark.parametrize("kind", ["silu", "gelu"])
def test_glu_matches_reference(be: MlxBackend, kind: str) -> None:
    rng = np.random.default_rng(4)
    g = (rng.standard_normal((3, 1001)) * 4).astype(np.float32)
    u = rng.standard_normal((3, 1001)).astype(np.float32)
    # ggml's GELU goes through an f16 table: a few f16 ulps from the float32 formula
    np.testing.assert_allclose(be.glu(g, u, kind), NumpyBackend().glu(g, u, kind),
                               rtol=4e-3 if kind == "gelu" else 2e-6, atol=2e-3 if kind == "gelu" else 1e-6)


def test_backend_is_chosen_by_name_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert choose_backend("mlx") == ("mlx", "requested")
    monkeypatch.setenv("LLMEDGE_BACKEND", "mlx")
    name, why = choose_backend("auto")
    assert name == "mlx" and "LLMEDGE_BACKEND" in why
    assert MlxBackend().device == ("gpu" if mx.default_device() == mx.gpu else "cpu")


# ----------------------------------------------------------------------------- the real models

_LOADED: dict[str, object] = {}


def _mlx_model(paths: dict[str, Path], name: str):
    import llmedge

    if name not in _LOADED:
        _LOADED[name] = llmedge.load(str(paths[name]), backend="mlx", n_ctx=2048)
    return _LOADED[name]


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


# Measured on this CPU (agreement() over every case, margin 0.5): SmolLM2 no flip (322 positions),
# median 0.033, p95 of the top 20 0.27, worst excess 1.05; Gemma 3 no flip (1,219 positions), median
# 0.027, p95 0.36, worst excess 0.24 (its 1,194-token prompt). SmolLM2's worst excess is at position
# 10 of "multilingual", the prediction after "Le train de nuit pour Vienne part à " whose last token
# is a lone space: a flat distribution (llama.cpp's top token has p = 1.3%, margin 0.055) where
# llama.cpp's own token-by-token path already moves that log-prob by 0.60 and flips its top-1
# (own_flip). The MLX and wide paths agree there to 0.01 (-6.02 vs llama.cpp's -4.38); rounding the
# activations to Q8 as llama.cpp does moves it a further 1.1 nats the other way: an ill-conditioned
# position, not a path error. So the excess is reported, not held to the native backends' 0.35.
@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_logits_agree_with_llamacpp(name: str, model_paths: dict[str, Path]) -> None:
    """Every logits case of llama.cpp's fixtures (Gemma's long one past its 512-token sliding window),
    held to the issue's bounds and to the p95 every backend meets."""
    from test_conformance import agreement

    a = agreement(_mlx_model(model_paths, name), load_fixture(f"llamacpp_{name}.json"), sure_margin=0.5)
    assert a.checked > 300
    assert a.flips == [], f"top-1 differs where llama.cpp's margin > 0.5: {a.flips}"
    assert a.median_top <= 0.08, a
    assert a.p95_top20 <= 0.45, a
    if name == "gemma3":
        assert a.longest > 1024  # past the sliding window


def _forced(backend: MlxBackend, wide_rows: int | None, run):
    saved, backend.wide_rows = backend.wide_rows, wide_rows
    try:
        return run()
    finally:
        backend.wide_rows = saved


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_wide_steps_give_the_mlx_path_logits(name: str, model_paths: dict[str, Path]) -> None:
    """A short prompt forced through MLX's products and through NumPy's (the wide path): the same
    logits to float32 rounding (GELU's f16 table and the f16 cache turn the summation-order
    differences into an occasional f16 ulp, as between the fused and op-by-op paths)."""
    m = _mlx_model(model_paths, name)
    ids = m.tokenize("The capital of France is Paris, and the capital of Italy is", add_bos=True)
    assert len(ids) >= 12
    mlx_path = _forced(m.model.backend, None, lambda: m.logits(ids))
    wide = _forced(m.model.backend, 1, lambda: m.logits(ids))
    np.testing.assert_allclose(wide, mlx_path, rtol=0, atol=2e-3 * np.abs(mlx_path).max())
    assert (wide.argmax(axis=1) == mlx_path.argmax(axis=1)).all()


def test_wide_steps_give_the_mlx_path_logits_for_every_family(tmp_path: Path) -> None:
    """The same on the tiny families: the fused stack (GQA, soft-capping, Q/K norms, post-norms, the
    sliding window) and the op-by-op path the others take (biases, fused tensors, RoPE factors).
    Their f16 embeddings and heads differ by up to an f16 rounding of each logit: MLX's f16 product
    returns f16, NumPy's (like ggml's) float32."""
    import tiny_models as tm

    from llmedge.gguf import GGUFFile
    from llmedge.models import model_class
    from llmedge.models.base import Batch

    be = MlxBackend()
    for name in tm.MODELS:
        g = GGUFFile(tm.write(name, tmp_path / f"{name}.gguf"))
        model = model_class(g.architecture)(g, be)
        ids = np.asarray(tm.prompt_ids(name)[:24], dtype=np.int32)

        def run(model=model, ids=ids) -> np.ndarray:
            return model.forward(Batch(ids, np.arange(len(ids), dtype=np.int32), model.make_cache(64, "f32")))

        mlx_path, wide = _forced(be, None, run), _forced(be, 1, run)
        np.testing.assert_allclose(wide, mlx_path, rtol=0, atol=2e-3 * np.abs(mlx_path).max(), err_msg=name)
        assert (wide.argmax(axis=1) == mlx_path.argmax(axis=1)).all(), name


# The first 6 of the 12 chunks of 512 tokens: measured here, MLX's perplexity is below llama.cpp's
# (float32 activations, where llama.cpp rounds them to Q8) by 0.62% (SmolLM2) and 0.78% (Gemma 3)
# on the first chunk, 0.37% and 0.46% over 6 chunks, 0.42% and 0.32% over all 12 (96 s and 78 s of
# single-threaded CPU for the 12, so half of that here).
PPL_CHUNKS = 6


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_perplexity_within_one_percent_of_llamacpp(name: str, model_paths: dict[str, Path]) -> None:
    """llama-perplexity's method over the first chunks of the text, against llama.cpp's per-chunk
    log-likelihoods (fixtures/make_llamacpp_perplexity_chunks.py), which add up to its whole-text
    perplexity in llamacpp_<model>.json."""
    from llmedge.perplexity import perplexity

    fx = load_fixture("llamacpp_perplexity_chunks.json")
    nll, per_chunk = fx["models"][name]["chunk_nll"], fx["n_scored_per_chunk"]
    whole = load_fixture(f"llamacpp_{name}.json")["perplexity"]
    assert math.isclose(math.exp(sum(nll) / whole["n_scored"]), whole["ppl"], rel_tol=1e-6)
    text = (FIXTURES / fx["text"]).read_text(encoding="utf-8")
    r = perplexity(_mlx_model(model_paths, name), text, fx["n_ctx"], n_chunks=PPL_CHUNKS)
    assert (r.n_chunks, r.n_scored) == (PPL_CHUNKS, PPL_CHUNKS * per_chunk)
    want = math.exp(sum(nll[:PPL_CHUNKS]) / r.n_scored)
    assert abs(r.ppl / want - 1) <= 0.01, (r.ppl, want)


@pytest.mark.parametrize(("name", "case"), [("smollm2", "prose"), ("gemma3", "chat")])
def test_greedy_continuation_agrees_with_llamacpp(name: str, case: str, model_paths: dict[str, Path]) -> None:
    model = _mlx_model(model_paths, name)
    g = next(g for g in load_fixture(f"llamacpp_{name}.json")["greedy"] if g["name"] == case)
    n = next((i for i, m in enumerate(g["margins"]) if m < 0.1), len(g["tokens"]))  # up to the first near-tie
    n = min(n, 8)
    mine = [c.token for c in model.generate(g["prompt_ids"], temperature=0, max_tokens=n)]
    assert mine == g["tokens"][:n]


# A near-tie for MLX: llama.cpp's margin below 0.25 (the bit-exact native backend uses 0.1). MLX
# multiplies float32 activations where llama.cpp rounds them to Q8, which moves a log-prob by 0.03 in
# median and up to ~0.2: measured, Gemma 3's "code" case picks llama.cpp's runner-up at its token 15,
# where llama.cpp's margin is 0.18 (native's own teacher-forced prompt path picks the runner-up at a
# margin of 0.195, "multilingual" token 4).
NEAR_TIE = 0.25


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_every_greedy_continuation_agrees_wherever_llamacpp_is_not_near_a_tie(name: str, model_paths) -> None:
    """Every greedy fixture case, teacher-forced: one forward of the prompt and all of llama.cpp's
    tokens, whose argmax must be llama.cpp's next token at every position where llama.cpp's margin is
    at least NEAR_TIE (forcing llama.cpp's tokens, a close call does not end the comparison). Decoding
    token by token on MLX's CPU build costs ~0.5 s a token, so the generation test above runs 8
    tokens of two cases."""
    model = _mlx_model(model_paths, name)
    compared = 0
    for g in load_fixture(f"llamacpp_{name}.json")["greedy"]:
        p, tokens = len(g["prompt_ids"]), g["tokens"]
        picked = model.logits([*g["prompt_ids"], *tokens[:-1]])[p - 1 :].argmax(axis=1)
        clear = np.asarray(g["margins"]) >= NEAR_TIE
        wrong = [i for i in np.nonzero(clear)[0] if picked[i] != tokens[i]]
        assert wrong == [], f"{g['name']}: not llama.cpp's token at {wrong}"
        compared += int(clear.sum())
    assert compared >= 200


def test_op_by_op_path_equals_the_fused_stack(model_paths) -> None:
    """A layer spec the stack does not know makes it decline: the protocol's ops then run the same
    model (each op a separate evaluation) to the same logits."""
    m = _mlx_model(model_paths, "smollm2")
    ids = m.tokenize("The capital of France is", add_bos=True)
    fused = m.logits(ids)
    stack, m.model._mlx_stack = m.model._mlx_stack, False
    try:
        op_by_op = m.logits(ids)
    finally:
        m.model._mlx_stack = stack
    np.testing.assert_allclose(op_by_op, fused, rtol=0, atol=2e-3 * np.abs(fused).max())
    assert (op_by_op.argmax(axis=1) == fused.argmax(axis=1)).all()


def test_after_a_context_shift_logits_equal_a_fresh_evaluation(smollm2_path: Path) -> None:
    """The shifted keys are re-rotated by the MLX RoPE at negative offsets: the logits after the shift
    equal those of a cache built fresh at the new distances (the relative-position property)."""
    from test_engine import shifted_and_reference, text_ids

    from llmedge.api import Model

    m = Model(smollm2_path, backend="mlx", n_ctx=64, kv_type="f32", n_batch=32)
    ids = text_ids(m, 0, 36)
    got, want = shifted_and_reference(m, ids, 30, 4, 12, ids[30:33])
    assert np.abs(log_softmax(got) - log_softmax(want)).max() <= 2e-3
    assert (got.argmax(axis=1) == want.argmax(axis=1)).all()


# ----------------------------------------------------------------------------- show
# Chat, the command line, the server and batching run with the mlx backend in the tests of their own
# modules, parametrized over it (test_run_cli.py, test_server_batching.py).


def test_show_says_what_each_tensor_became_with_backend_mlx(smollm2_path: Path, tmp_path: Path) -> None:
    env = {**os.environ, "LLMEDGE_MODELS": str(tmp_path / "store")}
    r = subprocess.run([sys.executable, "-m", "llmedge.cli.main", "show", str(smollm2_path), "--backend", "mlx"],
                       capture_output=True, text=True, env=env, timeout=300, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    assert "mlx (requested)" in r.stdout
    assert "Q4_1 -> affine q4 g32 (exact) x210, Q8_0 -> affine q8 g32 (exact) x1" in r.stdout


# ----------------------------------------------------------------------------- the compiled decode step


def _decode_runs(model, ids: list[int], kv_type: str, fused: bool, two: bool = False) -> np.ndarray:
    """Logits of ids[20:] fed one token per step after a 20-token prompt, with the compiled whole-step
    decode (``fused``) or the per-layer compiled path; ``two``: a second sequence decodes beside it."""
    from llmedge.backends.mlx import _Stack
    from llmedge.models.base import Batch, Step

    caches = [model.make_cache(64, kv_type, max_batch=4) for _ in range(2 if two else 1)]
    for c in caches:  # the prompt in batches of 4 rows (the ring's max_batch), on the per-layer path
        for s in range(0, 20, 4):
            model.forward(Batch(np.asarray(ids[s : s + 4], dtype=np.int32), np.arange(s, s + 4, dtype=np.int32), c))
    plan = model._mlx_stack
    assert isinstance(plan, _Stack)
    decodes = plan.decodes
    plan.decodes = decodes if fused else (lambda step: False)
    calls = []
    plan.decode = lambda x, step, f=plan.decode: calls.append(1) or f(x, step)
    try:
        out = []
        for i, t in enumerate(ids[20:], start=20):
            batches = [Batch(np.array([t], dtype=np.int32), np.array([i], dtype=np.int32), c) for c in caches]
            out.append(np.concatenate(model.forward_many(batches)) if two else model.forward(Step(batches)))
    finally:
        plan.decodes = decodes
        del plan.decode
    assert len(calls) == (len(ids) - 20 if fused else 0)
    return np.concatenate(out)


@pytest.mark.parametrize("kv_type", ["f16", "f32"])
def test_compiled_decode_step_gives_the_per_layer_logits_for_every_family(kv_type: str, tmp_path: Path) -> None:
    """One compiled function for all layers and the head, per decode step, over a sliding-window ring
    that wraps (window 8, 12 cells: the claimed cell overwrites the oldest), with GQA, soft-capping,
    Q/K norms and post-norms as the tiny families use them; and two sequences decoding together."""
    import tiny_models as tm

    from llmedge.backends.mlx import _Stack
    from llmedge.gguf import GGUFFile
    from llmedge.models import model_class

    be, tested = MlxBackend(), []
    for name in tm.MODELS:
        g = GGUFFile(tm.write(name, tmp_path / f"{name}.gguf"))
        model = model_class(g.architecture)(g, be)
        if not _Stack.supported(model):  # biases, fused tensors, RoPE factors: op by op, no stack
            continue
        tested.append(name)
        ids = tm.prompt_ids(name)[:36]
        per_layer = _decode_runs(model, ids, kv_type, fused=False)
        fused = _decode_runs(model, ids, kv_type, fused=True)
        tol = 1e-5 * np.abs(per_layer).max()  # equal in practice: the same ops on the cells in cache order
        np.testing.assert_allclose(fused, per_layer, rtol=0, atol=tol, err_msg=name)
        two = _decode_runs(model, ids, kv_type, fused=True, two=True)
        np.testing.assert_allclose(two[0::2], per_layer, rtol=0, atol=tol, err_msg=name)
        np.testing.assert_allclose(two[1::2], per_layer, rtol=0, atol=tol, err_msg=name)
    assert {"llama_f32", "qwen3", "gemma", "gemma2", "gemma3"} <= set(tested), tested


def test_a_decode_step_is_one_evaluation_of_the_compiled_function(tmp_path: Path, monkeypatch) -> None:
    """After the first step traced it, a decode step runs no MLX op from Python: one ``mx.eval`` of
    the compiled function, no product outside it (the head's norm and product come back from it)."""
    import tiny_models as tm

    from llmedge.gguf import GGUFFile
    from llmedge.models import model_class
    from llmedge.models.base import Batch

    g = GGUFFile(tm.write("gemma3", tmp_path / "gemma3.gguf"))
    model = model_class(g.architecture)(g, MlxBackend())
    ids = tm.prompt_ids("gemma3")
    cache = model.make_cache(64, "f16")
    model.forward(Batch(np.asarray(ids[:8], dtype=np.int32), np.arange(8, dtype=np.int32), cache))
    want = model.forward(Batch(np.array([ids[8]], dtype=np.int32), np.array([8], dtype=np.int32), cache))
    evals, products = [], []
    real_eval, real_matmul = mx.eval, MlxWeight.matmul
    monkeypatch.setattr(mx, "eval", lambda *a: evals.append(1) or real_eval(*a))
    monkeypatch.setattr(MlxWeight, "matmul", lambda self, x: products.append(self.name) or real_matmul(self, x))
    for i in (9, 10):
        got = model.forward(Batch(np.array([ids[i]], dtype=np.int32), np.array([i], dtype=np.int32), cache))
    assert evals == [1, 1] and products == []
    assert got.shape == want.shape and np.isfinite(got).all()


def test_bench_reports_the_mlx_backend_and_its_device(tmp_path: Path) -> None:
    import tiny_models as tm

    from llmedge.bench import LlmedgeRunner

    info = LlmedgeRunner(tm.write("gemma3", tmp_path / "gemma3.gguf"), backend="mlx", n_threads=2).info
    device = "gpu" if mx.default_device() == mx.gpu else "cpu"
    assert info.backend == "mlx" and info.isa == f"device {device} (mlx {mx.__version__})"
