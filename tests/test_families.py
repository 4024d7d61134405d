"""Every architecture family on tiny random-weight models: agreement with llama.cpp on every backend,
the fused native stack equal to the op-by-op path, and clear refusals.

The models are written by tests/tiny_models.py into a temporary folder (a few MB in all); llama.cpp's
logits for them are fixtures/llamacpp_families.json (made by fixtures/make_family_fixtures.py). The
bounds are the issue's: the top-1 token never differs where llama.cpp's top-1 leads by more than 0.5,
and the median |delta log p| over llama.cpp's top-20 tokens is at most 0.08.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tiny_models as tm

from conftest import load_fixture
from llmedge.errors import ModelError
from llmedge.gguf import GGUFFile
from llmedge.models import ARCHITECTURES, model_class
from llmedge.models.base import Batch

BACKENDS = ["native", "numba", "numpy", "mlx"]


@pytest.fixture(scope="module")
def llamacpp() -> dict:
    return load_fixture("llamacpp_families.json")


@pytest.fixture(scope="module")
def tiny_paths(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("tiny")
    return {name: tm.write(name, d / f"{name}.gguf") for name in tm.MODELS}


def _backend(name: str) -> Any:
    from llmedge.backends import make_backend

    return make_backend(name, n_threads=2)


_BACKENDS: dict[str, Any] = {}


def _load(path: Path, backend: str) -> Any:
    if backend not in _BACKENDS:
        _BACKENDS[backend] = _backend(backend)
    g = GGUFFile(path)
    return model_class(g.architecture)(g, _BACKENDS[backend])


def _forward(model: Any, ids: list[int], start: int = 0, cache: Any = None) -> tuple[np.ndarray, Any]:
    cache = cache if cache is not None else model.make_cache(tm.N_CTX)
    pos = np.arange(start, start + len(ids), dtype=np.int32)
    return model.forward(Batch(np.asarray(ids, dtype=np.int32), pos, cache)), cache


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def test_the_tiny_models_are_the_ones_llamacpp_saw(llamacpp: dict) -> None:
    assert set(llamacpp["models"]) == set(tm.MODELS) and llamacpp["n_ctx"] == tm.N_CTX
    for name, fx in llamacpp["models"].items():
        assert tm.fingerprint(name) == fx["fingerprint"], name
        assert tm.prompt_ids(name) == fx["ids"], name


def test_every_declared_family_has_a_tiny_model() -> None:
    assert {spec.arch for spec in tm.MODELS.values()} == set(ARCHITECTURES)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(tm.MODELS))
def test_logits_agree_with_llamacpp(name: str, backend: str, tiny_paths: dict[str, Path], llamacpp: dict) -> None:
    fx = llamacpp["models"][name]
    logits, _ = _forward(_load(tiny_paths[name], backend), fx["ids"])
    mine = log_softmax(logits)
    top_ids = np.asarray(fx["top_ids"])
    ref = np.asarray(fx["top_logprobs"])
    sure = np.asarray(fx["margin"]) > 0.5
    flips = np.nonzero(sure & (mine.argmax(axis=1) != top_ids[:, 0]))[0]
    assert flips.tolist() == [], f"top-1 differs from llama.cpp's where its margin > 0.5: positions {flips}"
    diffs = np.abs(np.take_along_axis(mine, top_ids, axis=1) - ref)
    assert np.median(diffs) <= 0.08, f"median |delta log p| {np.median(diffs):.4f}"
    assert sure.sum() >= 5, "the fixture prompt should have confident positions to check"


@pytest.mark.parametrize("name", list(tm.MODELS))
def test_fused_stack_equals_op_by_op(name: str, tiny_paths: dict[str, Path]) -> None:
    from llmedge.backends.native import stack_decline_reason

    model = _load(tiny_paths[name], "native")
    assert stack_decline_reason(model) is None, "every family's spec is encoded by the fused stack"
    ids = tm.prompt_ids(name)
    runs = []
    for fused in (True, False):
        model._native_stack = None if fused else False
        out, cache = _forward(model, ids[:20])
        outs = [out, _forward(model, ids[20:32], 20, cache)[0]]
        outs += [_forward(model, [t], 32 + i, cache)[0] for i, t in enumerate(ids[32:37])]
        assert bool(model._native_stack) == fused
        runs.append(np.concatenate(outs))
    assert np.array_equal(runs[0], runs[1])


def test_the_stack_declines_a_feature_it_does_not_encode(tiny_paths: dict[str, Path], monkeypatch) -> None:
    from llmedge.backends import native

    model = _load(tiny_paths["qwen2"], "native")
    monkeypatch.setattr(native._StackPlan, "ENCODED", native._StackPlan.ENCODED - {"qkv_bias"})
    reason = native.stack_decline_reason(model)
    assert reason is not None and "qkv_bias" in reason
    ids = tm.prompt_ids("qwen2")
    model._native_stack = None
    out, _ = _forward(model, ids)
    assert model._native_stack is False  # declined: ran op by op
    monkeypatch.undo()
    model._native_stack = None
    fused, _ = _forward(model, ids)
    assert model._native_stack and np.array_equal(out, fused)


def test_an_unsupported_architecture_fails_with_one_line() -> None:
    with pytest.raises(ModelError) as e:
        model_class("mamba")
    msg = str(e.value)
    assert msg.startswith("architecture 'mamba' is not supported; supported: llama, qwen2, qwen3, gemma,")
    assert "\n" not in msg


def test_a_tensor_the_family_does_not_declare_is_refused(tmp_path: Path, monkeypatch) -> None:
    real = tm.tensors

    def with_extra(name: str) -> list:
        return real(name) + [("blk.0.ffn_gate.bias", np.zeros(tm.N_FF, np.float32), tm.T.F32)]

    monkeypatch.setattr(tm, "tensors", with_extra)
    path = tm.write("qwen3", tmp_path / "extra.gguf")
    g = GGUFFile(path)
    with pytest.raises(ModelError, match="blk.0.ffn_gate.bias' is not supported"):
        model_class("qwen3")(g, _backend("numpy"))


def test_an_unsupported_rope_scaling_fails_at_load_with_one_line(tmp_path: Path, monkeypatch) -> None:
    from dataclasses import replace

    odd = replace(tm.MODELS["qwen2"], meta={"rope.scaling.type": "dynamic", "rope.scaling.factor": 4.0})
    monkeypatch.setitem(tm.MODELS, "qwen2_dynamic", odd)
    g = GGUFFile(tm.write("qwen2_dynamic", tmp_path / "dynamic.gguf"))
    with pytest.raises(ModelError, match=r"^RoPE scaling 'dynamic' is not supported "
                                         r"\(supported: none, linear, yarn, longrope\)$"):
        model_class("qwen2")(g, _backend("numpy"))


def test_a_rope_factor_without_a_scaling_type_scales_linearly(tmp_path: Path, monkeypatch) -> None:
    """llama.cpp's loader defaults rope.scaling.type to linear: a bare factor (or the old
    rope.scale_linear key) divides the angles; no factor leaves them alone."""
    from dataclasses import replace

    for meta, scale in (({"rope.scaling.factor": 2.0}, 0.5), ({"rope.scale_linear": 4.0}, 0.25), ({}, 1.0)):
        monkeypatch.setitem(tm.MODELS, "qwen2_bare", replace(tm.MODELS["qwen2"], meta=meta))
        g = GGUFFile(tm.write("qwen2_bare", tmp_path / f"bare{scale}.gguf"))
        spec = model_class("qwen2")(g, _backend("numpy")).specs[0]
        assert (spec.rope_scale, spec.rope_ext_factor) == (scale, 0.0)


def test_yarn_reads_llamacpps_parameters(tiny_paths: dict[str, Path]) -> None:
    """The YaRN file's spec: freq_scale 1/4, ext_factor 1, ggml's correction dims for n_ctx_orig 32 and
    base 1e6 (pairs 0..4 ramp), mscale 1 + 0.1 ln 4 (llama.cpp divides its attn_factor by that factor
    and ggml multiplies it back in float32), and the YaRN angles move the logits far beyond the bounds."""
    model = _load(tiny_paths["qwen3_yarn"], "numpy")
    s = model.specs[0]
    assert (s.rope_scale, s.rope_ext_factor, s.rope_corr_dims) == (0.25, 1.0, (0.0, 4.0))
    assert abs(s.rope_attn_factor - (1 + 0.1 * np.log(4.0))) < 1e-6
    assert "rope_yarn" in model.describe() and "rope_linear" not in model.describe()
    ids = tm.prompt_ids("qwen3_yarn")
    yarn, _ = _forward(model, ids)
    for spec in model.specs:  # the same file read as plain linear scaling
        spec.rope_ext_factor, spec.rope_attn_factor = 0.0, 1.0
    linear, _ = _forward(model, ids)
    assert np.abs(log_softmax(yarn) - log_softmax(linear)).max() > 0.5


def test_llama3_rope_freqs_change_the_logits(tiny_paths: dict[str, Path]) -> None:
    """A Llama 3 file's rope_freqs are applied (the issue's silently-wrong case): dropping them moves
    the logits far beyond the agreement bounds."""
    model = _load(tiny_paths["llama"], "numpy")
    ids = tm.prompt_ids("llama")
    with_ff, _ = _forward(model, ids)
    cache = model.make_cache(tm.N_CTX)
    model.rope_ff = None
    without, _ = _forward(model, ids, cache=cache)
    assert np.abs(log_softmax(with_ff) - log_softmax(without)).max() > 0.5


def test_show_names_the_family_and_the_fused_stack(tiny_paths: dict[str, Path]) -> None:
    r = subprocess.run([sys.executable, "-m", "llmedge.cli.main", "show", str(tiny_paths["phi3"]),
                        "--backend", "native", "--ctx", "128"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "phi3 (fused_gate_up, fused_qkv, q_scale, rope_attn_factor, rope_longrope)" in r.stdout
    assert "fused stack" in r.stdout and "yes" in r.stdout


@pytest.mark.parametrize("name", ["llama", "phi3", "qwen3_yarn"])
def test_a_context_shift_keeps_rope_factors(name: str, tiny_paths: dict[str, Path]) -> None:
    """Shifting keys of a model with RoPE frequency factors (Llama 3's, LongRoPE's with attn_factor)
    or YaRN's ramp rotates them by the same angles: logits after a shift equal a fresh evaluation of the kept
    cells at their new positions, to float32 precision on the reference without ggml's roundings."""
    from llmedge.backends.numpy_ref import NumpyBackend
    from llmedge.kvcache import LayerState

    class Exact(NumpyBackend):
        def matmul(self, x: np.ndarray, w) -> np.ndarray:
            return x @ w.f32.T

    g = GGUFFile(tiny_paths[name])
    model = model_class(g.architecture)(g, Exact())
    ids, n, n_discard = tm.prompt_ids(name), 30, 10
    shifted = model.make_cache(tm.N_CTX, kv_type="f32")
    model.forward(Batch(np.asarray(ids[:n]), np.arange(n), shifted))
    shifted.tokens.extend(ids[:n])
    whole = shifted.state()
    assert shifted.shift(0, n_discard, model.backend)
    follow = np.asarray(ids[n : n + 3])
    got = model.forward(Batch(follow, np.arange(3) + n - n_discard, shifted))
    ref = model.make_cache(tm.N_CTX, kv_type="f32")
    for layer, st in zip(ref.layers, whole.layers):
        keep = st.pos >= n_discard
        layer.load_state(LayerState(st.pos[keep], tuple(x[keep] for x in st.k), tuple(x[keep] for x in st.v)))
    want = model.forward(Batch(follow, np.arange(3) + n, ref))
    assert np.abs(log_softmax(got) - log_softmax(want)).max() <= 2e-3
