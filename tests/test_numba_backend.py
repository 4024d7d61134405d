"""Tests of the Numba backend (llmedge.backends.numba_cpu).

Oracles: ``llmedge.quant`` (NumPy dequantization and activation quantizers, bit-exact with ggml),
float64 NumPy products, the NumPy reference backend, llama.cpp's own op outputs (the fixture
``native_ggml_ops.json``) and, where it is built, the native backend. Dequantization must match bit
for bit; products must match the float64 product of the dequantized operands up to float32
rounding and the unquantized product within llama.cpp test-quantize-fns' bounds; on x86 with AVX2
the kernels that follow ggml's AVX2 order (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q5_K/Q6_K below 8 rows, every
K-quant from 8 rows in the tiled GEMM's order, and Q4_K in every llama.cpp order: vec_dot, repacked
GEMV/GEMM, tiled) and every float op reproduce llama.cpp bit for bit.

The kernels compile on first use and are cached on disk (``$NUMBA_CACHE_DIR``, else
``<user cache>/llmedge/numba/<digest of the sources>``): the first run on a machine (or after an edit) spends
about 40 s compiling (on 2 cores), later runs load them in half a second.
"""

from __future__ import annotations

import base64
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from backend_checks import assert_attention_matches_reference
from conftest import skip_or_fail
from llmedge.backends import choose_backend, make_backend, native_status
from llmedge.backends.numba_cpu import _X86_AVX2, FAST_ROWS, NumbaBackend, NumbaWeight
from llmedge.backends.numpy_ref import NumpyBackend
from llmedge.errors import LlmedgeError
from llmedge.gguf import GGUFFile, TensorInfo
from llmedge.quant import GGMLQuantizationType as T
from llmedge.quant import dequantize, quantize, traits

WEIGHT_TYPES = [
    T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0,
    T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS,
]  # fmt: skip

# byte offsets of the f16 scales inside one block (ggml-common.h)
F16_FIELDS = {
    T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q5_1: (0, 2), T.Q8_0: (0,),
    T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,),
    T.IQ4_NL: (0,), T.IQ4_XS: (0,),
}  # fmt: skip

# the product kernels that follow ggml's AVX2 summation order (decode and up to 7 rows)
GGML_ORDER = {T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K}
# from 8 activation rows llama.cpp (and native's lle_matmul_impl) sums every K-quant product without a
# repacked kernel in its tiled GEMM order: per block r = d * s1 (- dmin * s2), buf += r * d8
TILED_TYPES = (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS)
BITWISE_HERE = _X86_AVX2 and FAST_ROWS and platform.machine().lower() in ("x86_64", "amd64")


@pytest.fixture(scope="module")
def be() -> NumbaBackend:
    backend = NumbaBackend(2)
    backend.warmup()
    return backend


def make_tensor(raw: np.ndarray, t: T, m: int, k: int, name: str = "w") -> TensorInfo:
    flat = np.ascontiguousarray(raw).reshape(-1)
    return TensorInfo(name=name, ggml_type=int(t), dims=(k, m), offset=0, n_bytes=flat.size, _buffer=flat)


def random_weight(t: T, m: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Raw rows of type ``t``: quantized random data where llmedge.quant has a quantizer, else random
    bits everywhere (every quant pattern) with moderate f16 scales."""
    tr = traits(t)
    if t == T.F32:
        return rng.standard_normal((m, k)).astype(np.float32).view(np.uint8)
    if t in (T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1) or (t == T.Q8_0 and m % 2):
        return quantize(rng.standard_normal((m, k)).astype(np.float32), t).reshape(m, -1)
    nb = m * k // tr.block_size
    raw = rng.integers(0, 256, size=(nb, tr.type_size), dtype=np.uint8)
    for off in F16_FIELDS[t]:
        raw[:, off : off + 2] = rng.uniform(-0.05, 0.05, nb).astype(np.float16).view(np.uint8).reshape(nb, 2)
    return raw.reshape(m, -1)


def act_roundtrip(x: np.ndarray, vt: T) -> np.ndarray:
    """Activations as the kernels see them: quantized with ggml's x86 rounding and back."""
    return x if vt == T.F32 else dequantize(quantize(x, vt, "x86"), vt, x.shape)


def q8_1_s_correction(raw_w: np.ndarray, t: T, x: np.ndarray) -> np.ndarray:
    """Q4_1/Q5_1 kernels add m * s with the activation block's f16 s = fp16(d * sum(q)); the exact
    product of the dequantized operands has m * d * sum(q). Returns the difference [n, m]."""
    tsz = traits(t).type_size
    mins = raw_w.reshape(raw_w.shape[0], -1, tsz)[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
    n, k = x.shape
    q = quantize(x, T.Q8_1, "x86").reshape(n, k // 32, 36)
    d = q[:, :, 0:2].copy().view(np.float16)[..., 0].astype(np.float64)
    s = q[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
    qs = q[:, :, 4:].view(np.int8).astype(np.float64).sum(axis=-1)
    return (s - d * qs) @ mins.T


def assert_close_to_dequantized(out: np.ndarray, t: T, raw: np.ndarray, m: int, k: int, x: np.ndarray) -> None:
    """``out`` vs float64(dequantized weights) @ float64(activations as the kernel sees them)."""
    wd = dequantize(raw, t, (m, k)).astype(np.float64)
    xd = act_roundtrip(x, traits(t).vec_dot_type).astype(np.float64)
    ref = xd @ wd.T
    scale = np.abs(xd) @ np.abs(wd).T + 1e-30
    if t in (T.Q4_1, T.Q5_1):
        corr = q8_1_s_correction(raw, t, x)
        ref += corr
        scale += np.abs(corr)
    err = np.abs(out.astype(np.float64) - ref)
    bound = 5e-7 * scale
    assert out.shape == (x.shape[0], m) and out.dtype == np.float32
    assert np.all(err <= bound), f"{t.name}: max err {err.max():.3g}, worst ratio {(err / bound).max():.3g}"


def activation_error_bound(x: np.ndarray, wd: np.ndarray, vt: T) -> np.ndarray:
    """Rigorous bound of |W.(x_q - x)| from the rounding of each activation block."""
    n, k = x.shape
    if vt == T.F32:
        delta = np.zeros_like(x, dtype=np.float64)
    elif vt == T.F16:
        delta = np.abs(x).astype(np.float64) * 2.0**-11 + 2.0**-24
    elif vt == T.BF16:
        delta = np.abs(x).astype(np.float64) * 2.0**-8
    else:
        bs = 256 if vt == T.Q8_K else 32
        amax = np.abs(x.reshape(n, k // bs, bs)).max(axis=-1).astype(np.float64)
        delta = np.repeat(amax / 254.0 * 1.001, bs, axis=1)
    return delta @ np.abs(wd).T


def native_or_none():
    ok, _ = native_status()
    if not ok:
        return None
    from llmedge.backends.native import NativeBackend

    return NativeBackend(2)


@pytest.fixture(scope="module", autouse=True)
def native_on_its_avx2_tier():
    """The native backend on its AVX2 tier for this module's comparisons: numba follows ggml's AVX2
    build, and native's AVX-512 tier follows ggml's AVX-512 build (other float ops). Restored after."""
    native = native_or_none()
    if native is None or "avx2" not in native.available_isas():
        yield
        return
    before = native.isa
    native.set_isa("avx2")
    try:
        yield
    finally:
        native.set_isa(before)


# ----------------------------------------------------------------------------- weights and products


@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=lambda t: t.name)
def test_get_rows_equals_reference_dequantization(be: NumbaBackend, t: T) -> None:
    rng = np.random.default_rng(10 + int(t))
    k = 512 if traits(t).block_size == 256 else 96
    m = 33
    raw = random_weight(t, m, k, rng)
    w = be.prepare(make_tensor(raw, t, m, k))
    assert isinstance(w, NumbaWeight) and not w.u8.flags.writeable
    ids = np.array([0, 32, 7, 7, 16], dtype=np.int32)
    ref = dequantize(raw, t, (m, k))[ids]
    assert np.array_equal(be.get_rows(w, ids).view(np.uint32), ref.view(np.uint32))
    with pytest.raises(IndexError):
        be.get_rows(w, np.array([m]))


@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=lambda t: t.name)
def test_matmul_matches_dequantized_product_and_reference(be: NumbaBackend, t: T) -> None:
    rng = np.random.default_rng(100 + int(t))
    k = 768 if traits(t).block_size == 256 else 352
    ref_be = NumpyBackend()
    for m in (33, 5):
        raw = random_weight(t, m, k, rng)
        info = make_tensor(raw, t, m, k)
        w, wr = be.prepare(info), ref_be.prepare(info)
        for n in (1, 7, 9):
            x = rng.standard_normal((n, k)).astype(np.float32)
            out = be.matmul(x, w)
            assert_close_to_dequantized(out, t, raw, m, k, x)
            ref = ref_be.matmul(x, wr)
            scale = np.abs(act_roundtrip(x, traits(t).vec_dot_type)) @ np.abs(wr.f32).T
            assert np.all(np.abs(out - ref) <= 1e-6 * scale + 1e-30)


@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=lambda t: t.name)
def test_matmul_error_vs_unquantized_activations_is_bounded(be: NumbaBackend, t: T) -> None:
    rng = np.random.default_rng(200 + int(t))
    k, m, n = 1024, 33, 3
    raw = random_weight(t, m, k, rng)
    x = rng.standard_normal((n, k)).astype(np.float32)
    out = be.matmul(x, be.prepare(make_tensor(raw, t, m, k))).astype(np.float64)
    wd = dequantize(raw, t, (m, k)).astype(np.float64)
    ref = x.astype(np.float64) @ wd.T
    bound = activation_error_bound(x, wd, traits(t).vec_dot_type) + 1e-5 * (np.abs(x) @ np.abs(wd).T)
    assert np.all(np.abs(out - ref) <= bound)


def generate_data(offset: float, n: int) -> np.ndarray:
    """llama.cpp test-quantize-fns: 0.1 + 2 cos(i + offset)."""
    return (0.1 + 2 * np.cos(np.arange(n, dtype=np.float32) + np.float32(offset))).astype(np.float32)


@pytest.mark.parametrize("t", [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.F16, T.BF16, T.F32], ids=lambda t: t.name)
def test_dot_product_error_within_test_quantize_fns_bound(be: NumbaBackend, t: T) -> None:
    size = 32 * 128
    a, b = generate_data(0.0, size), generate_data(1.0, size)
    raw = quantize(a, t).reshape(1, -1)
    out = be.matmul(b.reshape(1, -1), be.prepare(make_tensor(raw, t, 1, size)))[0, 0]
    dot_ref = float(np.dot(a.astype(np.float64), b.astype(np.float64)))
    assert abs(float(out) - dot_ref) / size < 0.02  # MAX_DOT_PRODUCT_ERROR


def test_batched_rows_equal_single_rows_and_thread_counts(be: NumbaBackend) -> None:
    rng = np.random.default_rng(300)
    for t in (T.Q4_1, T.Q8_0, T.Q5_0, T.Q4_K, T.Q6_K, T.IQ4_XS):
        k = 512 if traits(t).block_size == 256 else 320
        m = 71
        w = be.prepare(make_tensor(random_weight(t, m, k, rng), t, m, k))
        x = rng.standard_normal((9, k)).astype(np.float32)
        batched = be.matmul(x, w)
        single = np.concatenate([be.matmul(x[i : i + 1], w) for i in range(9)])
        if t in TILED_TYPES:  # llama.cpp sums K-quant prompts of 8 rows and more in its tiled order
            assert not np.array_equal(batched, single) or not BITWISE_HERE, t.name
            assert np.array_equal(be.matmul(x[:7], w), single[:7]), t.name
        else:
            assert np.array_equal(batched, single), t.name
        one = NumbaBackend(1)
        try:
            assert np.array_equal(one.matmul(x, w), batched), t.name
        finally:
            NumbaBackend(2)


def test_matmul_out_buffer_and_leading_dims(be: NumbaBackend) -> None:
    rng = np.random.default_rng(5)
    w = be.prepare(make_tensor(random_weight(T.Q4_1, 9, 64, rng), T.Q4_1, 9, 64))
    x = rng.standard_normal((2, 3, 64)).astype(np.float32)
    out = np.empty((2, 3, 9), np.float32)
    assert be.matmul(x, w, out=out) is out
    assert np.array_equal(out.reshape(6, 9), be.matmul(x.reshape(6, 64), w))
    with pytest.raises(ValueError):
        be.matmul(x[..., :32], w)


# ----------------------------------------------------------------------------- real tensors


def real_tensors(path: Path, layers: tuple[int, ...] = (0, 1)) -> dict[T, list]:
    g = GGUFFile(path)
    found: dict[T, list] = {}
    for name, info in g.tensors.items():
        if len(info.dims) != 2:
            continue
        if name.startswith("blk.") and int(name.split(".")[1]) not in layers:
            continue
        found.setdefault(T(int(info.ggml_type)), []).append(info)
    return found


def check_real(be: NumbaBackend, native, found: dict[T, list], rng: np.random.Generator) -> None:
    for t, infos in found.items():
        for info in infos[:3]:
            k = int(info.dims[0])
            rows = info.rows()
            sel = np.unique(np.concatenate([[0, rows.shape[0] - 1], rng.integers(0, rows.shape[0], 37)]))
            raw = np.ascontiguousarray(rows[sel])
            m = raw.shape[0]
            w = be.prepare(info)
            assert np.array_equal(be.get_rows(w, sel).view(np.uint32), dequantize(raw, t, (m, k)).view(np.uint32))
            sub = be.prepare(make_tensor(raw, t, m, k, info.name))
            for n in (1, 3):
                x = rng.standard_normal((n, k)).astype(np.float32)
                out = be.matmul(x, sub)
                assert_close_to_dequantized(out, t, raw, m, k, x)
                if native is not None and BITWISE_HERE and t in GGML_ORDER:
                    nat = native.matmul(x, native.prepare(make_tensor(raw, t, m, k)))
                    assert np.array_equal(out, nat), f"{info.name}: differs from llama.cpp's order"


def test_real_smollm2_tensors(be: NumbaBackend, smollm2_path: Path) -> None:
    found = real_tensors(smollm2_path)
    assert {T.Q4_1, T.Q8_0} <= set(found)
    check_real(be, native_or_none(), found, np.random.default_rng(11))


def test_real_gemma3_tensors(be: NumbaBackend, gemma3_path: Path) -> None:
    found = real_tensors(gemma3_path)
    assert {T.Q5_0, T.Q4_K, T.Q6_K, T.Q8_0} <= set(found)
    check_real(be, native_or_none(), found, np.random.default_rng(12))


# Q4_K follows llama.cpp's per-product kernel choice (lle_matmul_impl in native/api.c): with a
# multiple of 8 weight rows the repacked GEMV order, and for prompts of more than 3 rows the repacked
# GEMM order (with its own Q8_K scale-sign rule) on the first n - n % 4 rows; else the tiled order
# from 8 rows and ggml's vec_dot below. The native backend reproduces llama.cpp there bit for bit.
Q4_K_ROWS = (1, 3, 4, 5, 8, 13)


def require_bitwise_native():
    native = native_or_none()
    if native is None or not BITWISE_HERE:
        skip_or_fail(f"bit-exact comparison needs the native backend and x86 AVX2 (native built: "
                     f"{native is not None}, AVX2 with fast f16: {BITWISE_HERE})")
    return native


def test_q4_k_products_equal_native_on_random_weights(be: NumbaBackend) -> None:
    native = require_bitwise_native()
    rng = np.random.default_rng(400)
    checked = set()
    for m in (16, 40, 33, 7):
        k = 512
        raw = random_weight(T.Q4_K, m, k, rng)
        w, wn = be.prepare(make_tensor(raw, T.Q4_K, m, k)), native.prepare(make_tensor(raw, T.Q4_K, m, k))
        for n in Q4_K_ROWS:
            x = rng.standard_normal((n, k)).astype(np.float32)
            out = be.matmul(x, w)
            assert np.array_equal(out, native.matmul(x, wn)), (m, n)
            checked.add((m % 8 == 0, n))
    # the vec_dot, repacked GEMV, repacked GEMM and tiled orders all ran
    assert checked == {(r8, n) for r8 in (True, False) for n in Q4_K_ROWS}


def test_q4_k_products_equal_native_on_gemma3_tensors(be: NumbaBackend, gemma3_path: Path) -> None:
    native = require_bitwise_native()
    rng = np.random.default_rng(401)
    infos = real_tensors(gemma3_path, layers=(0, 5))[T.Q4_K]
    assert len(infos) >= 3
    for info in infos:
        w, wn = be.prepare(info), native.prepare(info)
        for n in Q4_K_ROWS:
            x = (3 * rng.standard_normal((n, w.k))).astype(np.float32)
            assert np.array_equal(be.matmul(x, w), native.matmul(x, wn)), (info.name, n)


@pytest.mark.parametrize("t", TILED_TYPES)
def test_k_quant_prompt_products_equal_native_in_the_tiled_order(be: NumbaBackend, t: T) -> None:
    native = require_bitwise_native()
    rng = np.random.default_rng(402 + int(t))
    for m in (40, 33):  # 33: Q4_K not repacked, so tiled
        k = 768  # three blocks: the float sums run across blocks
        raw = random_weight(t, m, k, rng)
        w, wn = be.prepare(make_tensor(raw, t, m, k)), native.prepare(make_tensor(raw, t, m, k))
        for n in (8, 13, 18):  # groups of four rows and a rest of one or two
            x = (3 * rng.standard_normal((n, k))).astype(np.float32)
            np.testing.assert_array_equal(be.matmul(x, w), native.matmul(x, wn), err_msg=f"{t.name} m={m} n={n}")


def test_gemma3_q6_k_prompt_products_equal_native(be: NumbaBackend, gemma3_path: Path) -> None:
    """Gemma 3's Q6_K weights (the output head and the FFN's down rows) in prompts: the products
    that made numba's Gemma perplexity differ from native's."""
    native = require_bitwise_native()
    rng = np.random.default_rng(403)
    infos = real_tensors(gemma3_path, layers=(0, 5))[T.Q6_K]
    assert infos
    for info in infos[:3]:
        rows = info.rows()
        sel = np.unique(rng.integers(0, rows.shape[0], 64))
        raw = np.ascontiguousarray(rows[sel])
        m, k = raw.shape[0], int(info.dims[0])
        w, wn = be.prepare(make_tensor(raw, T.Q6_K, m, k)), native.prepare(make_tensor(raw, T.Q6_K, m, k))
        for n in (8, 11):
            x = (3 * rng.standard_normal((n, k))).astype(np.float32)
            np.testing.assert_array_equal(be.matmul(x, w), native.matmul(x, wn), err_msg=f"{info.name} n={n}")


# ----------------------------------------------------------------------------- float ops


def test_rms_norm_matches_reference(be: NumbaBackend) -> None:
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((5, 3, 96)) * 4).astype(np.float32)
    w = rng.standard_normal(96).astype(np.float32)
    out = be.rms_norm(x, w, 1e-6)
    ref = NumpyBackend().rms_norm(x, w, 1e-6)
    np.testing.assert_allclose(out, ref, rtol=2e-6, atol=1e-6)
    big = rng.standard_normal((300, 640)).astype(np.float32)  # the parallel path
    np.testing.assert_array_equal(be.rms_norm(big, None, 1e-6)[:3], be.rms_norm(big[:3], None, 1e-6))


@pytest.mark.parametrize("neox", [False, True], ids=["normal", "neox"])
def test_rope_matches_reference(be: NumbaBackend, neox: bool) -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((7, 3, 64)).astype(np.float32)
    pos = np.array([0, 1, 2, 17, 300, 4095, 12000], dtype=np.int32)
    out = be.rope(x, pos, 48, 10000.0, 1.0, neox)
    ref = NumpyBackend().rope(x, pos, 48, 10000.0, 1.0, neox)
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-5)
    assert np.array_equal(out[..., 48:], x[..., 48:])
    same = be.rope(x.copy(), pos, 48, 10000.0, 1.0, neox, out=x)
    assert np.array_equal(same, out)


@pytest.mark.parametrize("kv_dtype", [np.float16, np.float32], ids=["f16", "f32"])
def test_attention_masks_gqa_softcap(be: NumbaBackend, kv_dtype) -> None:
    # one f16 ulp of each probability (the rounding ggml applies)
    assert_attention_matches_reference(be, kv_dtype, f16_prob_ulps=1)


@pytest.mark.parametrize("kind", ["silu", "gelu"])
def test_glu_matches_reference(be: NumbaBackend, kind: str) -> None:
    rng = np.random.default_rng(4)
    g = (rng.standard_normal((3, 1001)) * 4).astype(np.float32)
    g[0, :4] = [-12.0, 12.0, 0.0, -0.0]
    u = rng.standard_normal((3, 1001)).astype(np.float32)
    out = be.glu(g, u, kind)
    ref = NumpyBackend().glu(g, u, kind)
    # ggml's GELU table is built with a fused multiply-add (the reference's without): 1 f16 ulp apart
    np.testing.assert_allclose(out, ref, rtol=2e-3 if kind == "gelu" else 2e-6, atol=1e-6)
    big = (rng.standard_normal(70000) * 3).astype(np.float32)  # the parallel path
    np.testing.assert_array_equal(be.glu(big, big, kind)[:1001], be.glu(big[:1001], big[:1001], kind))


def test_softmax_softcap_add_scale(be: NumbaBackend) -> None:
    rng = np.random.default_rng(6)
    x = (rng.standard_normal((4, 203)) * 5).astype(np.float32)
    p = be.softmax(x, 0.5)
    e = np.exp((x * 0.5).astype(np.float64) - (x * 0.5).max(axis=1, keepdims=True))
    np.testing.assert_allclose(p, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(be.softcap(x, 3.0), np.tanh(x / 3.0) * 3.0, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(be.add(x, x), x + x)
    np.testing.assert_array_equal(be.scale(x, 0.25), x * np.float32(0.25))


GGML_FIXTURE = Path(__file__).parent / "fixtures" / "native_ggml_ops.json"


def dec(d: dict) -> np.ndarray:
    return np.frombuffer(base64.b64decode(d["b64"]), dtype=d["dtype"]).reshape(d["shape"]).copy()


def run_ggml_case(be: NumbaBackend, case: dict) -> np.ndarray:
    op = case["op"]
    if op == "mul_mat":
        t = T[case["type"]]
        raw, x = dec(case["w"]), dec(case["x"])
        return be.matmul(x, be.prepare(make_tensor(raw, t, raw.shape[0], x.shape[1])))
    if op == "rms_norm":
        return be.rms_norm(dec(case["x"]), dec(case["w"]), case["eps"])
    if op == "rope":
        return be.rope(dec(case["x"]), dec(case["pos"]), case["n_rot"], case["freq_base"], case["freq_scale"],
                       case["neox"])
    if op == "softmax":
        return be.softmax(dec(case["x"]), case["scale"])
    if op == "glu":
        return be.glu(dec(case["gate"]), dec(case["up"]), case["kind"])
    if op == "gelu_table":
        v = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
        gate = v[np.isfinite(v) & (np.abs(v) < 10)].reshape(1, -1)
        return be.glu(gate, np.ones_like(gate), "gelu").astype(np.float16)
    if op == "attention":
        return be.attention(dec(case["q"]), dec(case["k"]), dec(case["v"]), dec(case["q_pos"]), dec(case["k_pos"]),
                            case["scale"])
    raise AssertionError(f"unknown fixture op {op}")


def test_ops_reproduce_llamacpp_outputs(be: NumbaBackend) -> None:
    """llama.cpp's own outputs (x86 AVX2 build): every float op and the products of the types in
    ggml's AVX2 order (below 8 rows, where llama.cpp switches K-quants to tiled kernels; Q4_K in all
    of llama.cpp's orders, repacked ones included) bit for bit; the other products within float32
    rounding."""
    doc = json.loads(GGML_FIXTURE.read_text(encoding="utf-8"))
    n_exact = 0
    for case in doc["cases"]:
        ref = dec(case["out"])
        out = run_ggml_case(be, case)
        what = f"{case['op']} {case.get('type', case.get('kind', ''))} shape {ref.shape}"
        t = T[case["type"]] if case["op"] == "mul_mat" else None
        exact = t is None or (t in GGML_ORDER and (ref.shape[0] < 8 or t == T.Q4_K))
        if BITWISE_HERE and exact:
            assert np.array_equal(out.view(np.uint8), ref.view(np.uint8)), what
            n_exact += 1
        else:
            out, ref = out.astype(np.float32), ref.astype(np.float32)
            np.testing.assert_allclose(out, ref, rtol=2e-3, atol=2e-6 * float(np.abs(ref).max()) + 1e-30,
                                       err_msg=what)
    assert n_exact > 30 or not BITWISE_HERE


# ----------------------------------------------------------------------------- selection, compile time


def test_warmup_records_compile_seconds(be: NumbaBackend) -> None:
    assert be.name == "numba"
    assert isinstance(be.compile_seconds, float) and be.compile_seconds >= 0
    assert NumbaBackend.compile_seconds_total > 0
    again = NumbaBackend(1)
    assert again.warmup() == 0.0  # compiled once per process
    NumbaBackend(2)


@pytest.mark.parametrize("value", ["avx2", "sse9"])
def test_llmedge_isa_is_named_once_as_the_native_backends(value: str, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """LLMEDGE_ISA picks a native kernel tier; numba has none to pick, so any value (a tier or not)
    gives one line saying so, once per process, and the backend works on."""
    monkeypatch.setattr(NumbaBackend, "_isa_noted", False)
    monkeypatch.delenv("LLMEDGE_ISA", raising=False)
    NumbaBackend(2)
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("LLMEDGE_ISA", value)
    be = NumbaBackend(2)
    NumbaBackend(2)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and f"LLMEDGE_ISA={value} applies to the native backend only" in err[0], err
    x = np.ones((1, 64), np.float32)
    np.testing.assert_array_equal(be.rms_norm(x, None, 0.0), x)


def test_backend_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    import llmedge.backends as backends

    assert choose_backend("numba") == ("numba", "requested")
    monkeypatch.setenv("LLMEDGE_BACKEND", "numba")
    assert choose_backend("auto") == ("numba", "chosen by LLMEDGE_BACKEND=numba")
    monkeypatch.delenv("LLMEDGE_BACKEND")
    monkeypatch.setattr(backends, "native_status", lambda: (False, "native kernels not built (test)"))
    name, why = choose_backend("auto")
    assert name == "numba" and why.startswith("native kernels not built (test); numba ") and "JIT" in why
    assert isinstance(make_backend("auto", 1), NumbaBackend)
    NumbaBackend(2)


def test_a_bad_backend_from_the_environment_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    import llmedge.backends as backends

    monkeypatch.setenv("LLMEDGE_BACKEND", "nunba")
    with pytest.raises(LlmedgeError, match=r"^LLMEDGE_BACKEND=nunba: unknown backend 'nunba' \(choose from"):
        choose_backend("auto")
    monkeypatch.setenv("LLMEDGE_BACKEND", "numba")
    monkeypatch.setattr(backends, "numba_status", lambda: (False, "numba is not importable (test)"))
    with pytest.raises(LlmedgeError, match=r"^LLMEDGE_BACKEND=numba: the numba backend is unavailable: numba is not"):
        choose_backend("auto")
    assert choose_backend("native")[0] == "native" or not native_status()[0]  # a flag still overrides it


@pytest.mark.parametrize(("args", "env", "line"), [
    (["--backend", "nunba"], {}, "Error: unknown backend 'nunba' (choose from auto, native, numba, mlx, numpy)"),
    ([], {"LLMEDGE_BACKEND": "nunba"}, "Error: LLMEDGE_BACKEND=nunba: unknown backend 'nunba' (choose from auto, "
                                       "native, numba, mlx, numpy)"),
])
def test_serve_refuses_a_bad_backend_at_startup(args: list[str], env: dict[str, str], line: str) -> None:
    """Not a server that answers every request with the error: one line and exit status 1 (before,
    it started and ran until the timeout)."""
    r = subprocess.run([sys.executable, "-m", "llmedge.cli.main", "serve", "--port", "18739", *args],
                       capture_output=True, text=True, timeout=60, env={**os.environ, **env})
    assert (r.returncode, r.stderr.strip(), r.stdout) == (1, line, "")


def test_cli_show_and_run_on_numba(smollm2_path: Path) -> None:
    env = {**os.environ, "LLMEDGE_BACKEND": "numba"}
    r = subprocess.run([sys.executable, "-m", "llmedge.cli.main", "show", str(smollm2_path)],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr
    assert "numba (chosen by LLMEDGE_BACKEND=numba)" in r.stdout
    r = subprocess.run([sys.executable, "-m", "llmedge.cli.main", "run", str(smollm2_path), "The capital of France is",
                        "--raw", "--temperature", "0", "--num-predict", "4", "--backend", "numba"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout


# ----------------------------------------------------------------------------- whole models


def _agreed_prefix(margins: list[float], tie: float) -> int:
    """Tokens up to (and including) the first margin below ``tie``, where the order of float sums
    may decide between llama.cpp's top two tokens."""
    for i, m in enumerate(margins):
        if m < tie:
            return i
    return len(margins)


# The products are llama.cpp's bit for bit (Gemma's Q6_K prompt products too, in its tiled order), as
# the native backend's: token for token up to the first near-tie (< 0.1), as test_conformance holds
# the native backend.
GREEDY_TIE = {"smollm2": 0.1, "gemma3": 0.1}


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_greedy_continuations_agree_with_llamacpp(name: str, model_paths: dict[str, Path]) -> None:
    """llama.cpp's greedy continuations (the conformance module holds the numba backend's logits
    and perplexity)."""
    import llmedge

    fx = json.loads((Path(__file__).parent / "fixtures" / f"llamacpp_{name}.json").read_text(encoding="utf-8"))
    model = llmedge.load(str(model_paths[name]), backend="numba", n_ctx=512, n_threads=2)
    assert model.backend_name == "numba"
    checked = 0
    for g in fx["greedy"]:
        n = _agreed_prefix(g["margins"], GREEDY_TIE[name])
        mine = [c.token for c in model.generate(g["prompt_ids"], temperature=0, max_tokens=max(n, 1))]
        assert mine[:n] == g["tokens"][:n], g["name"]
        checked += n
    assert checked >= (100 if name == "smollm2" else 10)


@pytest.mark.parametrize(("n", "t", "d", "n_kv"), [(1, 37, 64, 3), (5, 37, 64, 3), (7, 70, 256, 1), (3, 9, 80, 2)])
def test_attention_equals_native_bitwise(be: NumbaBackend, n: int, t: int, d: int, n_kv: int) -> None:
    """The vector inner loops (keys four at a time, F16 rows widened by fpext) keep llama.cpp's
    order: with an F16 cache the output equals the native backend's bit for bit, masked keys,
    a sliding window and a softcap included."""
    native = require_bitwise_native()
    rng = np.random.default_rng(n * 1000 + t)
    n_head = 2 * n_kv
    q = rng.standard_normal((n, n_head, d)).astype(np.float32)
    k = rng.standard_normal((t, n_kv, d)).astype(np.float16)
    v = rng.standard_normal((t, n_kv, d)).astype(np.float16)
    k_pos = np.arange(t, dtype=np.int32)
    k_pos[3] = -1  # an empty cell
    q_pos = np.arange(t - n, t, dtype=np.int32)
    for window, softcap in ((0, 0.0), (t // 2, 0.0), (0, 30.0)):
        args = (q, k, v, q_pos, k_pos, 1.0 / np.sqrt(d), window or None, softcap or None)
        np.testing.assert_array_equal(be.attention(*args), native.attention(*args))


def test_half_conversions_equal_the_integer_versions() -> None:
    """_f2h/_h2f take the one-instruction hardware path where there is one (F16C, ARM64): every
    half value and a million float32 bit patterns (all exponents, ties, subnormals, overflow,
    infinities, NaNs) convert exactly as the integer-only versions (ggml's scalar conversions)."""
    from numba import njit

    from llmedge.backends.numba_cpu.intrinsics import _f2h, _f2h_soft, _h2f, _h2f_soft

    @njit
    def both(hs, fs, out_h, out_f):
        for i in range(hs.shape[0]):
            out_f[0, i] = _h2f(hs[i])
            out_f[1, i] = _h2f_soft(hs[i])
        for i in range(fs.shape[0]):
            out_h[0, i] = _f2h(fs[i])
            out_h[1, i] = _f2h_soft(fs[i])

    hs = np.arange(65536, dtype=np.uint16)
    rng = np.random.default_rng(5)
    bits = rng.integers(0, 1 << 32, 1_000_000, dtype=np.uint64).astype(np.uint32)
    ties = (np.arange(65536, dtype=np.uint32) << 13) | (1 << 12)  # exactly halfway between halves
    fs = np.concatenate([bits, ties, ties ^ 0x80000000, hs.view(np.float16).astype(np.float32).view(np.uint32),
                         np.array([0x7F800000, 0xFF800000, 0x7FC00001, 0xFF812345, 0x477FF000, 0x477FEFFF,
                                   0x33000000, 0x33000001, 0x387FC000], np.uint32)]).view(np.float32)
    out_h = np.empty((2, fs.size), np.uint16)
    out_f = np.empty((2, hs.size), np.float32)
    both(hs, fs, out_h, out_f)
    np.testing.assert_array_equal(out_h[0], out_h[1])
    np.testing.assert_array_equal(out_f[0].view(np.uint32), out_f[1].view(np.uint32))


@pytest.mark.parametrize("t", [T.Q4_0, T.Q5_0, T.Q6_K])
def test_prompt_products_from_rows_decoded_once_equal_four_rows_at_a_time(be: NumbaBackend, t: T) -> None:
    """From 8 activation rows a Q4_0 / Q5_0 weight row is decoded once into Q8_0 blocks and a Q6_K
    row into its six-bit values, and the first n - n % 4 rows are multiplied four at a time; every
    product must equal the one of the same row taken alone (the rest rows, and for Q4_0 / Q5_0 the
    kernels that unpack the weights themselves): reordering the rows moves each between the two."""
    rng = np.random.default_rng(21)
    m, k = 40, 768  # three blocks of 256: the sums run across blocks; 18 rows: groups of 4 and a rest
    w = be.prepare(make_tensor(random_weight(t, m, k, rng), t, m, k))
    x = rng.standard_normal((18, k)).astype(np.float32)
    whole = be.matmul(x, w)
    if t != T.Q6_K:  # Q4_0 / Q5_0 keep ggml's order at any row count
        fours = np.concatenate([be.matmul(x[i : i + 4], w) for i in range(0, 18, 4)])
        np.testing.assert_array_equal(whole, fours)
    for perm in (np.roll(np.arange(18), 2), np.roll(np.arange(18), -5)):
        np.testing.assert_array_equal(be.matmul(x[perm], w), whole[perm])
