"""Tests of llmedge.quant: the trait table, the reference decoders and the reference encoders.

Oracles: ``gguf.quants`` (dequantize, and quantize where it has one) and the bytes llama.cpp's own
encoders wrote for fixed inputs (``fixtures/quant_llamacpp.json``, made by
``fixtures/make_quant_fixtures.py``). Results are compared bit for bit.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T
from gguf import quants as gguf_quants

from llmedge.quant import (
    BLOCK_SIZES,
    DEQUANTIZABLE,
    QUANTIZABLE,
    TRAITS,
    dequantize,
    dequantize_rows,
    fp32_to_bf16_bits,
    fp32_to_fp16_bits,
    quantize,
    row_nbytes,
    traits,
)

FIXTURE = Path(__file__).parent / "fixtures" / "quant_llamacpp.json"

WEIGHT_TYPES = [
    T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0,
    T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS,
]  # fmt: skip

# Byte offsets of the f16 scales inside one block, per type (ggml-common.h block structs).
F16_FIELDS = {
    T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q5_1: (0, 2), T.Q8_0: (0,),
    T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,),
    T.IQ4_NL: (0,), T.IQ4_XS: (0,),
}  # fmt: skip

LLAMACPP_NAMES = {T.Q4_0: "q4_0", T.Q4_1: "q4_1", T.Q5_0: "q5_0", T.Q5_1: "q5_1", T.Q8_0: "q8_0"}
LLAMACPP_NAMES |= {T.Q8_1: "q8_1", T.Q8_K: "q8_K"}


def bits(a: np.ndarray) -> np.ndarray:
    """float32 values as their bit patterns, so that NaNs and signed zeros compare exactly."""
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def finite_normal_f16(rng: np.random.Generator, n: int) -> np.ndarray:
    """Random finite normal f16 values (any sign, any exponent), as their uint16 bit patterns."""
    sign = rng.integers(0, 2, n, dtype=np.uint16) << 15
    exponent = rng.integers(1, 31, n, dtype=np.uint16) << 10
    return sign | exponent | rng.integers(0, 1024, n, dtype=np.uint16)


def random_tensor_bytes(rng: np.random.Generator, t: T, n_rows: int, n_per_row: int) -> np.ndarray:
    """Random blocks of type ``t`` whose f16 scales are finite normal numbers: uint8 [rows, bytes]."""
    block, size = BLOCK_SIZES[t]
    n_blocks = n_rows * n_per_row // block
    raw = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
    for at in F16_FIELDS.get(t, ()):
        raw[:, at : at + 2] = finite_normal_f16(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(n_rows, row_nbytes(t, n_per_row))


@pytest.fixture(scope="module")
def llamacpp() -> dict:
    fx = json.loads(FIXTURE.read_text(encoding="utf-8"))

    def arr(b64: str, dtype: type) -> np.ndarray:
        return np.frombuffer(base64.b64decode(b64), dtype=dtype)

    row = fx["row"]
    return {
        "machine": fx["machine"],
        "finite": arr(fx["inputs"]["finite"]["f32"], np.float32).reshape(-1, row),
        "specials": arr(fx["inputs"]["specials"]["f32"], np.float32).reshape(-1, row),
        "out": {k: arr(v, np.uint8) for k, v in fx["outputs"].items()},
        "importance_row": arr(fx["inputs"]["importance_row"], np.float32),
    }


# ---- trait table --------------------------------------------------------------------------------


def test_trait_table_covers_every_gguf_type_with_ggml_block_sizes() -> None:
    assert set(TRAITS) == set(T)
    for t in T:
        tr = TRAITS[t]
        assert tr.ggml_type is t and tr.name == t.name
        if t == T.Q8_1:
            # ggml's block_q8_1 is {half d; half s; int8 qs[32]}; gguf-py still lists 2 floats (40).
            assert (tr.block_size, tr.type_size) == (32, 36)
        else:
            assert (tr.block_size, tr.type_size) == GGML_QUANT_SIZES[t], t.name


def test_traits_accepts_enum_int_and_name_and_rejects_unknown_types() -> None:
    assert traits(T.Q4_K) is traits(12) is traits("q4_k") is TRAITS[T.Q4_K]
    for bad in (4, 5, 31, 36, 1000, -1, "Q9_K"):
        with pytest.raises(ValueError):
            traits(bad)


def test_vec_dot_types_follow_ggml_cpu() -> None:
    expected = {
        T.F32: T.F32, T.F16: T.F16, T.BF16: T.BF16,
        T.Q4_0: T.Q8_0, T.Q5_0: T.Q8_0, T.Q8_0: T.Q8_0, T.IQ4_NL: T.Q8_0, T.MXFP4: T.Q8_0,
        T.Q4_1: T.Q8_1, T.Q5_1: T.Q8_1,
        T.Q2_K: T.Q8_K, T.Q3_K: T.Q8_K, T.Q4_K: T.Q8_K, T.Q5_K: T.Q8_K, T.Q6_K: T.Q8_K,
        T.IQ2_XXS: T.Q8_K, T.IQ2_XS: T.Q8_K, T.IQ2_S: T.Q8_K, T.IQ3_XXS: T.Q8_K, T.IQ3_S: T.Q8_K,
        T.IQ1_S: T.Q8_K, T.IQ1_M: T.Q8_K, T.IQ4_XS: T.Q8_K, T.TQ1_0: T.Q8_K, T.TQ2_0: T.Q8_K,
        T.Q8_K: None, T.I8: None, T.I32: None, T.F64: None,
    }  # fmt: skip
    for t, vdt in expected.items():
        assert traits(t).vec_dot_type == vdt, t.name


def test_is_quantized_only_for_block_types() -> None:
    plain = {T.F32, T.F16, T.BF16, T.F64, T.I8, T.I16, T.I32, T.I64}
    for t, tr in TRAITS.items():
        assert tr.is_quantized == (t not in plain), t.name
        assert tr.is_quantized == (tr.block_size > 1), t.name


def test_reference_functions_exist_exactly_for_supported_types() -> None:
    for t in WEIGHT_TYPES:
        assert traits(t).dequantize_ref is not None, t.name
    for t in (*WEIGHT_TYPES, T.Q8_1, T.Q8_K):
        assert traits(t).quantize_ref is not None, t.name
    for t in (T.IQ2_XXS, T.TQ1_0, T.MXFP4, T.I32):
        assert traits(t).dequantize_ref is None and traits(t).quantize_ref is None
    assert {t for t, tr in TRAITS.items() if tr.dequantize_ref} == set(DEQUANTIZABLE)
    assert {t for t, tr in TRAITS.items() if tr.quantize_ref} == set(QUANTIZABLE)


def test_row_nbytes_counts_blocks_and_rejects_partial_blocks() -> None:
    assert row_nbytes(T.Q8_0, 640) == 20 * 34
    assert row_nbytes(T.Q6_K, 2048) == 8 * 210
    assert row_nbytes(T.F32, 3) == 12
    assert row_nbytes("BF16", 5) == 10
    for t, n in ((T.Q4_K, 640), (T.Q4_0, 33), (T.IQ4_XS, 128)):
        with pytest.raises(ValueError):
            row_nbytes(t, n)


# ---- dequantization -----------------------------------------------------------------------------


@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=lambda t: t.name)
def test_dequantize_random_blocks_equals_gguf(t: T) -> None:
    rng = np.random.default_rng(int(t))
    block = BLOCK_SIZES[t][0]
    for n_rows, blocks_per_row in ((1, 1), (3, 5), (7, 3), (33, 2)):
        n = block * blocks_per_row
        raw = random_tensor_bytes(rng, t, n_rows, n)
        expected = gguf_quants.dequantize(raw, t).reshape(n_rows, n)
        got = dequantize(raw, t, (n_rows, n))
        assert got.dtype == np.float32 and got.shape == (n_rows, n)
        assert np.array_equal(bits(got), bits(expected)), f"{t.name} {n_rows}x{n}"
    # Any byte layout of the same bytes and any result rank.
    raw = random_tensor_bytes(rng, t, 6, block * 2)
    got3 = dequantize(raw.reshape(-1), t, (2, 3, block * 2))
    assert np.array_equal(bits(got3.reshape(6, -1)), bits(dequantize(raw, t, (6, block * 2))))


def test_dequantize_uses_trait_table_reference() -> None:
    rng = np.random.default_rng(7)
    raw = random_tensor_bytes(rng, T.Q4_K, 3, 512)
    assert np.array_equal(
        bits(traits(T.Q4_K).dequantize_ref(raw, (3, 512))), bits(dequantize(raw, 12, (3, 512)))
    )


def test_dequantize_activation_types_match_ggml_formulas() -> None:
    # Q8_1 and Q8_K have no gguf dequantizer: ggml's is y = d * qs (f16 d for Q8_1, f32 for Q8_K).
    rng = np.random.default_rng(8)
    x = rng.standard_normal((3, 512)).astype(np.float32)
    for t, d_of in (
        (T.Q8_1, lambda b: b[:, 0:2].view(np.float16).astype(np.float32)),
        (T.Q8_K, lambda b: b[:, 0:4].view(np.float32)),
    ):
        q = quantize(x, t)
        block, size = BLOCK_SIZES[t]
        blocks = q.reshape(-1, size)
        off = 4
        qs = blocks[:, off : off + block].view(np.int8).astype(np.float32)
        expected = (d_of(blocks) * qs).reshape(3, 512)
        assert np.array_equal(bits(dequantize(q, t, (3, 512))), bits(expected))


def test_dequantize_rows_picks_rows_of_the_full_result() -> None:
    rng = np.random.default_rng(9)
    raw = random_tensor_bytes(rng, T.Q6_K, 11, 512)
    full = dequantize(raw, T.Q6_K, (11, 512))
    ids = np.array([10, 0, 3, 3, 7])
    assert np.array_equal(bits(dequantize_rows(raw, T.Q6_K, 512, ids)), bits(full[ids]))


def test_dequantize_rejects_bad_sizes_and_unsupported_types() -> None:
    raw = np.zeros(34 * 4, np.uint8)
    with pytest.raises(ValueError):
        dequantize(raw, T.Q8_0, (5, 32))  # byte count does not match the shape
    with pytest.raises(ValueError):
        dequantize(raw, T.Q8_0, (2, 48))  # row length not a multiple of the block size
    with pytest.raises(ValueError):
        dequantize(np.zeros(66, np.uint8), T.IQ2_XXS, (256,))  # no decoder for this type
    with pytest.raises(ValueError):
        dequantize(raw, T.Q8_0, ())


def _real_tensor_cases(
    path: Path, expected_types: set[str]
) -> list[tuple[str, T, np.ndarray, tuple[int, ...]]]:
    """A handful of tensors of every type in the file: the 3 smallest per type plus row slices of
    the largest (which may be a 262144-row embedding), as (name, type, raw bytes, shape)."""
    reader = gguf.GGUFReader(path)
    by_type: dict[T, list] = {}
    for t in reader.tensors:
        by_type.setdefault(T(int(t.tensor_type)), []).append(t)
    assert {t.name for t in by_type} == expected_types
    cases = []
    for t, tensors in by_type.items():
        tensors.sort(key=lambda x: int(x.n_bytes))
        picked = {info.name: info for info in [*tensors[:3], tensors[-1]]}
        for info in picked.values():
            shape = tuple(int(s) for s in reversed(info.shape))
            raw = np.asarray(info.data).view(np.uint8).reshape(-1, row_nbytes(t, shape[-1]))
            if len(raw) > 4096:  # a big matrix (a 262144-row embedding): both ends and middle rows
                rows = np.r_[0:128, len(raw) // 2 : len(raw) // 2 + 64, len(raw) - 128 : len(raw)]
                raw, shape = raw[rows], (len(rows), shape[-1])
            cases.append((info.name, t, np.ascontiguousarray(raw), shape))
    return cases


@pytest.mark.parametrize(
    ("model", "types"),
    [("smollm2", {"Q4_1", "Q8_0", "F32"}), ("gemma3", {"Q5_0", "Q4_K", "Q6_K", "Q8_0", "F32"})],
)
def test_dequantize_real_model_tensors_equals_gguf(
    model: str, types: set[str], request: pytest.FixtureRequest
) -> None:
    path = request.getfixturevalue(f"{model}_path")
    cases = _real_tensor_cases(path, types)
    assert len(cases) >= 2 * len(types)
    for name, t, raw, shape in cases:
        expected = gguf_quants.dequantize(raw, t).reshape(shape)
        got = dequantize(raw, t, shape)
        assert np.array_equal(bits(got), bits(expected)), f"{model} {name} ({t.name})"


# ---- quantization -------------------------------------------------------------------------------


def _random_rows(rng: np.random.Generator, n_rows: int, n: int) -> np.ndarray:
    scale = 10.0 ** rng.uniform(-1, 3, (n_rows, 1))  # f16 scales stay normal numbers
    return (rng.standard_normal((n_rows, n)) * scale).astype(np.float32)


@pytest.mark.parametrize(
    "t", [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.BF16, T.F16, T.F32], ids=lambda t: t.name
)
def test_quantize_equals_gguf(t: T, llamacpp: dict) -> None:
    rng = np.random.default_rng(100 + int(t))
    for x in (_random_rows(rng, 7, 512), _random_rows(rng, 1, 256), llamacpp["finite"]):
        with np.errstate(over="ignore"):
            expected = np.ascontiguousarray(gguf_quants.quantize(x, t)).view(np.uint8).reshape(len(x), -1)
        got = quantize(x, t)
        assert got.dtype == np.uint8 and got.shape == (len(x), row_nbytes(t, x.shape[1]))
        assert np.array_equal(got, expected), t.name
    assert np.array_equal(traits(t).quantize_ref(x), quantize(x, t))


@pytest.mark.parametrize("t", list(LLAMACPP_NAMES), ids=lambda t: t.name)
def test_quantize_equals_llamacpp_reference(t: T, llamacpp: dict) -> None:
    x = llamacpp["finite"]
    with np.errstate(over="ignore"):
        got = quantize(x, t)
    expected = llamacpp["out"][f"{LLAMACPP_NAMES[t]}_ref"].reshape(got.shape)
    for r in range(len(x)):
        assert np.array_equal(got[r], expected[r]), f"{t.name} input row {r}"


@pytest.mark.parametrize("backend", ["numba", "numpy"])
@pytest.mark.parametrize("t", [t for t in WEIGHT_TYPES if t != T.F32], ids=lambda t: t.name)
def test_quantize_equals_llamacpp_quantize_chunk(t: T, backend: str, llamacpp: dict) -> None:
    # ggml_quantize_chunk without imatrix: what llama-quantize writes (the searching K-quant and
    # IQ4 encoders included); the Numba and NumPy searches must both give its bytes.
    from llmedge.quant.kquants import search_backend

    x = llamacpp["finite"]
    with np.errstate(over="ignore"), search_backend(backend):
        got = quantize(x, t)
    expected = llamacpp["out"][f"chunk_{t.name}"].reshape(got.shape)
    for r in range(len(x)):
        assert np.array_equal(got[r], expected[r]), f"{t.name} input row {r}"


@pytest.mark.parametrize("t", [t for t in WEIGHT_TYPES if t != T.F32], ids=lambda t: t.name)
def test_quantize_with_importance_row_equals_llamacpp_quantize_chunk(t: T, llamacpp: dict) -> None:
    # ggml_quantize_chunk given an imatrix row: the weighted *_impl searches (types without one
    # ignore the weights, as ggml does).
    x = llamacpp["finite"]
    with np.errstate(over="ignore"):
        got = quantize(x, t, quant_weights=llamacpp["importance_row"])
    expected = llamacpp["out"][f"chunkw_{t.name}"].reshape(got.shape)
    for r in range(len(x)):
        assert np.array_equal(got[r], expected[r]), f"{t.name} input row {r}"


@pytest.mark.parametrize("t", [T.Q8_0, T.Q8_1, T.Q8_K], ids=lambda t: t.name)
def test_quantize_x86_variant_equals_llamacpp_cpu_from_float(t: T, llamacpp: dict) -> None:
    # The fixture's *_cpu bytes come from ggml-cpu's SIMD from_float on the machine that made it.
    assert llamacpp["machine"] in ("x86_64", "AMD64")
    x = llamacpp["finite"]
    got = quantize(x, t, variant="x86")
    expected = llamacpp["out"][f"{LLAMACPP_NAMES[t]}_cpu"].reshape(got.shape)
    for r in range(len(x)):
        assert np.array_equal(got[r], expected[r]), f"{t.name} input row {r}"
    if t != T.Q8_K:  # the fixture has exact ties and scale-sensitive blocks where the paths differ
        assert not np.array_equal(got, quantize(x, t, variant="ref"))


def test_quantize_arm_variant_rounds_ties_to_even_with_reference_scale(llamacpp: dict) -> None:
    x = llamacpp["finite"]
    ref, arm = quantize(x, T.Q8_0), quantize(x, T.Q8_0, variant="arm")
    blocks = x.reshape(-1, 32)
    d = np.abs(blocks).max(axis=1) / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    v = blocks * inv[:, None]
    expected_qs = np.rint(v).astype(np.int8)
    assert np.array_equal(arm.reshape(-1, 34)[:, 2:].view(np.int8), expected_qs)
    assert np.array_equal(arm.reshape(-1, 34)[:, :2], ref.reshape(-1, 34)[:, :2])
    tie = (np.abs(v) % 1) == 0.5
    assert tie.any()
    same_blocks = ~tie.any(axis=1)
    assert np.array_equal(arm.reshape(-1, 34)[same_blocks], ref.reshape(-1, 34)[same_blocks])


def test_float_conversions_equal_ggml(llamacpp: dict) -> None:
    x = np.concatenate([llamacpp["finite"], llamacpp["specials"]])
    out = llamacpp["out"]
    f16, bf16 = fp32_to_fp16_bits(x), fp32_to_bf16_bits(x)
    assert np.array_equal(f16, out["f16_ref"].view(np.uint16).reshape(x.shape))
    assert np.array_equal(bf16, out["bf16_ref"].view(np.uint16).reshape(x.shape))
    assert np.array_equal(bf16, out["bf16_cpu"].view(np.uint16).reshape(x.shape))
    # The CPU's hardware f16 conversion keeps NaN payloads; every other value rounds the same way.
    finite_or_inf = ~np.isnan(x)
    assert np.array_equal(f16[finite_or_inf], out["f16_cpu"].view(np.uint16).reshape(x.shape)[finite_or_inf])
    assert np.array_equal(quantize(x, T.F16).view(np.uint16), f16)
    assert np.array_equal(quantize(x, T.BF16).view(np.uint16), bf16)


def test_q8_1_stores_scaled_sum_and_q8_k_stores_block_sums() -> None:
    x = _random_rows(np.random.default_rng(11), 5, 512)
    q81 = quantize(x, T.Q8_1).reshape(-1, 36)
    qs = q81[:, 4:].view(np.int8)
    # s = fp16(sum(qs) * d), d the float32 scale amax / 127 (not its f16 rounding).
    d32 = np.abs(x.reshape(-1, 32)).max(axis=1) / np.float32(127)
    s = (qs.sum(axis=1).astype(np.float32) * d32).astype(np.float16)
    assert np.array_equal(q81[:, 2:4].view(np.float16)[:, 0].view(np.uint16), s.view(np.uint16))
    assert np.array_equal(q81[:, 0:2].view(np.float16)[:, 0], d32.astype(np.float16))
    q8k = quantize(x, T.Q8_K).reshape(-1, 292)
    qk = q8k[:, 4:260].view(np.int8)
    assert np.array_equal(q8k[:, 260:].view(np.int16), qk.reshape(-1, 16, 16).sum(axis=2))
    assert qk.min() >= -127
    assert (np.abs(qk).max(axis=1) == 127).all()


@pytest.mark.parametrize("t", [T.Q8_0, T.Q8_1, T.Q8_K, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1], ids=lambda t: t.name)
def test_quantize_round_trip_error_is_bounded_by_the_step(t: T) -> None:
    rng = np.random.default_rng(200 + int(t))
    x = _random_rows(rng, 9, 512)
    block = BLOCK_SIZES[t][0]
    xb = x.reshape(-1, block)
    err = np.abs(dequantize(quantize(x, t), t, x.shape).reshape(-1, block) - xb).max(axis=1)
    amax = np.abs(xb).max(axis=1)
    if t in (T.Q4_1, T.Q5_1):  # min + d * q, d = (max - min) / (2^bits - 1): half a step
        allowed = 0.5 * (xb.max(axis=1) - xb.min(axis=1)) / (15 if t == T.Q4_1 else 31)
    elif t in (T.Q4_0, T.Q5_0):  # d = max / -8 (-16): values opposite the max clip at 7 (15) steps
        allowed = amax / (8 if t == T.Q4_0 else 16)
    else:  # symmetric 8-bit: d = amax / 127
        allowed = 0.5 * amax / 127
    # Plus the rounding of the scale (and min) to f16.
    assert np.all(err <= allowed * 1.01 + amax * 2e-3), t.name


def test_quantize_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        quantize(np.zeros((2, 48), np.float32), T.Q8_0)
    with pytest.raises(ValueError):
        quantize(np.zeros((2, 256), np.float32), T.IQ2_XXS)  # no encoder
    with pytest.raises(ValueError):
        quantize(np.zeros((2, 32), np.float32), T.Q8_0, variant="neon")  # type: ignore[arg-type]
