"""Tests of the native C kernels (llmedge._native through NativeBackend), on every ISA this CPU runs.

Oracles: ``llmedge.quant`` (NumPy dequantization and the activation quantizers, bit-exact with
ggml's ``*_ref``) and float64 NumPy products / ops. Dequantization and activation quantization must
match bit for bit; products must match the float64 product of the dequantized operands up to
float32 rounding, and the float64 product of the unquantized operands within the bounds of
llama.cpp's test-quantize-fns. Random weights use odd row counts; real tensors come from both
reference models.
"""

from __future__ import annotations

import ast
import base64
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import skip_or_fail
from llmedge.backends.native import ISA_NAMES, NativeBackend, NativeWeight
from llmedge.gguf import GGUFFile, TensorInfo
from llmedge.quant import GGMLQuantizationType as T
from llmedge.quant import dequantize, quantize, traits

WEIGHT_TYPES = [
    T.Q4_1, T.Q8_0, T.Q5_0, T.Q4_K, T.Q6_K, T.F32, T.F16,
    T.Q4_0, T.Q5_1, T.Q2_K, T.Q3_K, T.Q5_K, T.IQ4_NL, T.IQ4_XS, T.BF16,
]  # fmt: skip

# byte offsets of the f16 scales inside one block (ggml-common.h)
F16_FIELDS = {
    T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q5_1: (0, 2), T.Q8_0: (0,),
    T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,),
    T.IQ4_NL: (0,), T.IQ4_XS: (0,),
}  # fmt: skip

ISAS = None  # filled lazily: the ISAs this CPU can run


@pytest.fixture(scope="module")
def be() -> NativeBackend:
    assert NativeBackend.available(), NativeBackend.unavailable_reason
    backend = NativeBackend(2)
    yield backend
    backend.set_isa(backend.available_isas()[-1])


def available_isas() -> list[str]:
    global ISAS
    if ISAS is None:
        ISAS = NativeBackend.available_isas()
    return ISAS


def tiers_here() -> list[str]:
    """Every kernel tier this machine executes (``LLMEDGE_ISA`` hides the tiers above the one it names,
    so ``LLMEDGE_ISA=avx2`` runs these tests as on an AVX2-only machine)."""
    return NativeBackend.available_isas() if NativeBackend.available() else ["scalar"]


@pytest.fixture(params=tiers_here())
def isa(request: pytest.FixtureRequest, be: NativeBackend) -> str:
    """Each test runs on every tier of this CPU: scalar, then avx2 / avx512 or neon."""
    be.set_isa(request.param)
    yield request.param
    be.set_isa(available_isas()[-1])


def make_tensor(raw: np.ndarray, t: T, m: int, k: int, name: str = "w") -> TensorInfo:
    flat = np.ascontiguousarray(raw).reshape(-1)
    return TensorInfo(name=name, ggml_type=int(t), dims=(k, m), offset=0, n_bytes=flat.size, _buffer=flat)


def random_weight(t: T, m: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Raw rows of type ``t``: random bits everywhere (every quant pattern) but moderate f16 scales."""
    tr = traits(t)
    if t == T.F32:
        return rng.standard_normal((m, k)).astype(np.float32).view(np.uint8)
    if t == T.F16:
        return rng.standard_normal((m, k)).astype(np.float16).view(np.uint8)
    if t == T.BF16:
        return quantize(rng.standard_normal((m, k)).astype(np.float32), T.BF16).reshape(m, -1)
    nb = m * k // tr.block_size
    raw = rng.integers(0, 256, size=(nb, tr.type_size), dtype=np.uint8)
    for off in F16_FIELDS[t]:
        raw[:, off : off + 2] = rng.uniform(-0.05, 0.05, nb).astype(np.float16).view(np.uint8).reshape(nb, 2)
    return raw.reshape(m, -1)


def act_variant() -> str:
    from llmedge._native import lib

    return ("ref", "x86", "arm")[lib.lle_act_rounding_mode()]


def act_roundtrip(x: np.ndarray, vt: T) -> np.ndarray:
    """Activations as the kernels see them: quantized with the library's rounding variant and back."""
    return x if vt == T.F32 else dequantize(quantize(x, vt, act_variant()), vt, x.shape)


def q8_1_s_correction(raw_w: np.ndarray, t: T, x: np.ndarray) -> np.ndarray:
    """The Q4_1/Q5_1 x Q8_1 kernel adds m * s with s = fp16(d * sum(q)) stored in the activation
    block; the exact product of the dequantized operands has m * d * sum(q). Returns the difference
    [n, m] so the comparison with the float64 product can be tight."""
    m_rows = raw_w.shape[0]
    tsz = traits(t).type_size
    mins = raw_w.reshape(m_rows, -1, tsz)[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
    n, k = x.shape
    q = quantize(x, T.Q8_1, act_variant()).reshape(n, k // 32, 36)
    d = q[:, :, 0:2].copy().view(np.float16)[..., 0].astype(np.float64)
    s = q[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
    qs = q[:, :, 4:].view(np.int8).astype(np.float64).sum(axis=-1)
    return (s - d * qs) @ mins.T


def assert_close_to_dequantized(be: NativeBackend, t: T, raw: np.ndarray, m: int, k: int, x: np.ndarray) -> None:
    """Native matmul vs float64(dequantized weights) @ float64(activations as the kernel sees them)."""
    w = be.prepare(make_tensor(raw, t, m, k))
    out = be.matmul(x, w)
    wd = dequantize(raw, t, (m, k)).astype(np.float64)
    vt = traits(t).vec_dot_type
    xd = act_roundtrip(x, vt).astype(np.float64)
    ref = xd @ wd.T
    if t in (T.Q4_1, T.Q5_1):
        ref += q8_1_s_correction(raw, t, x)
    # float32 rounding of per-block partial sums: a few ulps of the sum of absolute terms
    scale = np.abs(xd) @ np.abs(wd).T
    if t in (T.Q4_1, T.Q5_1):
        scale += np.abs(q8_1_s_correction(raw, t, x)) + 1e-30
    bound = 5e-7 * scale + 1e-30
    err = np.abs(out.astype(np.float64) - ref)
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


# ----------------------------------------------------------------------------- library state


def test_isa_reported_and_selectable(be: NativeBackend) -> None:
    isas = available_isas()
    assert isas[0] == "scalar"
    for name in isas:
        assert be.set_isa(name) == name and be.isa == name
    with pytest.raises(Exception, match="not available"):
        be.set_isa("nonexistent")


def test_llmedge_isa_variable_forces_a_lower_isa() -> None:
    code = "from llmedge.backends.native import NativeBackend as B; print(B(1).isa)"
    for want in available_isas():
        env = dict(os.environ, LLMEDGE_ISA=want)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == want


def test_show_names_the_kernel_tier_in_use(smollm2_path: Path) -> None:
    for want in (available_isas()[-1], "scalar"):
        env = dict(os.environ, LLMEDGE_ISA=want, LLMEDGE_BACKEND="native")
        r = subprocess.run([sys.executable, "-m", "llmedge.cli.main", "show", str(smollm2_path)], env=env,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        line = next(ln for ln in r.stdout.splitlines() if ln.strip().startswith("kernel tier"))
        assert line.split()[2] == want, line


def test_llmedge_isa_naming_a_tier_this_cpu_cannot_run_is_refused(smollm2_path: Path) -> None:
    """LLMEDGE_ISA=avx512 on a CPU without AVX-512 (or a tier of another architecture, or no tier at
    all) is an error with one line saying so, not a silent run on another tier."""
    # a tier the hardware lacks: under a forced LLMEDGE_ISA (the suite run as a lower tier) the tiers
    # above it are hidden but runnable, so then the other architecture's
    if os.environ.get("LLMEDGE_ISA"):
        missing = "neon" if platform.machine().lower() in ("x86_64", "amd64", "i386", "i686") else "avx2"
    else:
        missing = next(t for t in ISA_NAMES if t not in available_isas())
    for bad in (missing, "avx9"):
        env = dict(os.environ, LLMEDGE_ISA=bad, LLMEDGE_BACKEND="native")
        r = subprocess.run([sys.executable, "-m", "llmedge.cli.main", "show", str(smollm2_path)], env=env,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 1, r.stdout
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and f"LLMEDGE_ISA={bad}" in lines[0], r.stderr
        assert ("cannot run" if bad == missing else "not a kernel tier") in lines[0], lines[0]


def test_every_weight_type_has_a_kernel(be: NativeBackend) -> None:
    for t in WEIGHT_TYPES:
        assert NativeBackend.supports(int(t)), t.name


# ----------------------------------------------------------------------------- quantization


@pytest.mark.parametrize("vt", [T.Q8_0, T.Q8_1, T.Q8_K, T.F16, T.BF16])
@pytest.mark.parametrize("variant", ["ref", "x86", "arm"])
def test_activation_quantization_is_bit_exact(be: NativeBackend, isa: str, vt: T, variant: str) -> None:
    """Q8 activations match llmedge.quant (ggml's encoders) in each rounding variant of ggml."""
    from llmedge._native import ffi, lib

    rng = np.random.default_rng(1)
    k = 512
    x = np.concatenate([
        rng.standard_normal((4, k)).astype(np.float32) * 3,
        np.zeros((1, k), np.float32),
        (rng.integers(-127, 127, (2, k)) + 0.5).astype(np.float32),  # exact .5 ties once amax = 127
        (rng.standard_normal((2, k)) * 1e-4).astype(np.float32),
    ])
    x[5:7, ::32] = 127.0
    x[1, 7] = -np.abs(x[1]).max()  # an abs-max tie with opposite signs (Q8_K picks the first)
    ref = quantize(x, vt, variant).reshape(x.shape[0], -1)
    out = np.zeros_like(ref)
    prev = lib.lle_act_rounding_mode()
    assert lib.lle_set_act_rounding(("ref", "x86", "arm").index(variant)) >= 0
    try:
        assert lib.lle_quantize_act(int(vt), ffi.from_buffer("float[]", x), x.shape[0], k, ffi.from_buffer(out)) == 0
    finally:
        lib.lle_set_act_rounding(prev)
    assert np.array_equal(out, ref)


def test_default_activation_rounding_is_the_hosts() -> None:
    """llama.cpp rounds activations the way its own CPU path does; llmedge follows the host."""
    from llmedge._native import lib

    machine = platform.machine().lower()
    want = 1 if machine in ("x86_64", "amd64", "i686") else 2 if machine in ("aarch64", "arm64") else 0
    assert lib.lle_act_rounding_mode() == want


# ----------------------------------------------------------------------------- get_rows


@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=lambda t: t.name)
def test_get_rows_equals_reference_dequantization(be: NativeBackend, isa: str, t: T) -> None:
    rng = np.random.default_rng(int(t))
    k = 512 if traits(t).block_size == 256 else 96
    m = 37
    raw = random_weight(t, m, k, rng)
    w = be.prepare(make_tensor(raw, t, m, k))
    ids = np.array([5, 0, 36, 5, 17], dtype=np.int32)
    out = be.get_rows(w, ids)
    ref = dequantize(raw[ids], t, (len(ids), k))
    assert np.array_equal(out.view(np.uint32), ref.astype(np.float32).view(np.uint32))
    with pytest.raises(IndexError):
        be.get_rows(w, np.array([37]))
    with pytest.raises(IndexError):
        be.get_rows(w, np.array([3, -1]))
    many = np.arange(100, dtype=np.int32) % m  # more ids than check_row_ids' short-list path takes
    assert np.array_equal(be.get_rows(w, many).view(np.uint32),
                          dequantize(raw[many], t, (len(many), k)).astype(np.float32).view(np.uint32))
    many[60] = m
    with pytest.raises(IndexError):
        be.get_rows(w, many)


# ----------------------------------------------------------------------------- matmul


@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=lambda t: t.name)
def test_matmul_matches_dequantized_product(be: NativeBackend, isa: str, t: T) -> None:
    rng = np.random.default_rng(100 + int(t))
    k = 768 if traits(t).block_size == 256 else 352
    for m in (67, 5):
        raw = random_weight(t, m, k, rng)
        for n in (1, 3, 17):
            x = rng.standard_normal((n, k)).astype(np.float32)
            assert_close_to_dequantized(be, t, raw, m, k, x)


@pytest.mark.parametrize("t", WEIGHT_TYPES, ids=lambda t: t.name)
def test_matmul_error_vs_unquantized_activations_is_bounded(be: NativeBackend, isa: str, t: T) -> None:
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
def test_dot_product_error_within_test_quantize_fns_bound(be: NativeBackend, isa: str, t: T) -> None:
    size = 32 * 128
    a, b = generate_data(0.0, size), generate_data(1.0, size)
    raw = quantize(a, t).reshape(1, -1)
    out = be.matmul(b.reshape(1, -1), be.prepare(make_tensor(raw, t, 1, size)))[0, 0]
    dot_ref = float(np.dot(a.astype(np.float64), b.astype(np.float64)))
    assert abs(float(out) - dot_ref) / size < 0.02  # MAX_DOT_PRODUCT_ERROR


@pytest.mark.parametrize("t", [T.Q4_1, T.Q8_0, T.Q5_0, T.Q4_0, T.Q5_1, T.Q4_K, T.Q6_K, T.Q2_K, T.IQ4_XS],
                         ids=lambda t: t.name)
def test_batched_rows_equal_single_rows_bitwise(be: NativeBackend, isa: str, t: T) -> None:
    """Prefill tiles compute each row exactly like the decode kernel, whatever the thread count.
    (Like llama.cpp, K-quants switch to another summation order from 8 rows on, and Q4_K with a
    multiple of 8 rows to the repacked kernels' orders: those are checked against llama.cpp itself
    in test_ops_reproduce_llamacpp_outputs.)"""
    rng = np.random.default_rng(300 + int(t))
    k = 512 if traits(t).block_size == 256 else 320
    m = 70
    n = 7 if traits(t).block_size == 256 else 9
    raw = random_weight(t, m, k, rng)
    w = be.prepare(make_tensor(raw, t, m, k))
    x = rng.standard_normal((n, k)).astype(np.float32)
    batched = be.matmul(x, w)
    single = np.concatenate([be.matmul(x[i : i + 1], w) for i in range(n)])
    assert np.array_equal(batched, single)
    one = NativeBackend(1)
    try:
        assert np.array_equal(one.matmul(x, w), batched)
    finally:
        NativeBackend(2)


def packed_here(t: T) -> bool:
    """Whether the best tier here makes a packed copy of type ``t`` (AVX-512: Q4_K, Q6_K, Q4_1, Q8_0; AVX2:
    Q4_1, Q8_0)."""
    isas = available_isas()
    return "avx2" in isas if t in (T.Q4_1, T.Q8_0) else "avx512" in isas


def unpacked_matmul(t: T, raw: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The product of the weight bytes ``raw`` with ``x`` by the unpacked kernels: a fresh copy of the
    bytes, so no packed copy is found for its address."""
    from llmedge._native import ffi, lib

    raw = raw.copy()
    m, k = raw.shape[0], x.shape[1]
    out = np.empty((x.shape[0], m), dtype=np.float32)
    assert lib.lle_matmul(int(t), ffi.from_buffer("char[]", raw), raw.shape[1], m, k,
                          ffi.from_buffer("float[]", x), x.shape[0], ffi.from_buffer("float[]", out), m) == 0
    return out


@pytest.mark.parametrize("t", [T.Q4_K, T.Q6_K, T.Q4_1, T.Q8_0], ids=lambda t: t.name)
def test_packed_weights_give_the_unpacked_products_bitwise(be: NativeBackend, t: T) -> None:
    """On the AVX-512 tier a Q4_K, Q6_K, Q4_1 or Q8_0 weight with a multiple of 16 rows gets a packed
    copy at prepare (16 rows interleaved, native/packed.c), on the AVX2 tier a Q4_1 or Q8_0 weight; its products
    equal the unpacked ones of the AVX2 tier bit for bit (Q4_K: decode and both repacked prefill
    orders, 4-row groups then the n % 4 rows; Q6_K: the tiled order of 8+ rows; Q4_1 and Q8_0: their
    one order everywhere), and so do the row-exact batches (each row as the one-row product; the C self-test
    also checks the grouped decode products); the copy is freed with the weight. Elsewhere nothing is
    packed."""
    import gc

    from llmedge._native import lib

    rng = np.random.default_rng(17)
    m, k = 96, 1024
    raw = random_weight(t, m, k, rng)
    xs = [rng.standard_normal((n, k)).astype(np.float32) for n in (1, 3, 4, 7, 8, 69)]
    before = lib.lle_packed_count()
    w = be.prepare(make_tensor(raw, t, m, k))
    assert w.packed == packed_here(t)
    if not w.packed:
        return
    assert lib.lle_packed_count() == before + 1
    try:
        packed = [be.matmul(x, w) for x in xs]
        rows = [be.matmul_rows(x, w) for x in xs]
        be.set_isa("avx2")
        unpacked = [unpacked_matmul(t, raw, x) for x in xs]
        one_row = [np.stack([unpacked_matmul(t, raw, r[None])[0] for r in x]) for x in xs]
    finally:
        be.set_isa(available_isas()[-1])
    for x, p, u, r, o in zip(xs, packed, unpacked, rows, one_row):
        assert np.array_equal(p.view(np.uint32), u.view(np.uint32)), f"{x.shape[0]} rows"
        assert np.array_equal(r.view(np.uint32), o.view(np.uint32)), f"{x.shape[0]} rows, row-exact"
    del w
    gc.collect()
    assert lib.lle_packed_count() == before


def gguf_with_one_tensor(path: Path, raw: np.ndarray, t: T, m: int) -> None:
    """A GGUF file holding the raw rows of type ``t`` as tensor "w" (read back through its mapping)."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("w", raw.reshape(m, -1), raw_dtype=gguf.GGMLQuantizationType(int(t)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def weight_in_a_file(tmp_path: Path, t: T, m: int, k: int, seed: int) -> tuple[np.ndarray, np.random.Generator, Path]:
    """Random rows of type ``t`` (m x k), the generator that made them, and a GGUF file holding them."""
    rng = np.random.default_rng(seed)
    raw = random_weight(t, m, k, rng)
    path = tmp_path / "w.gguf"
    gguf_with_one_tensor(path, raw, t, m)
    return raw, rng, path


def rss_file_kb() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssFile:"))


def resident_pages(arr: np.ndarray) -> int:
    """How many of the pages under ``arr`` this process has mapped (/proc/self/pagemap's present bit,
    readable unprivileged): exact, where RssFile also moves with every other mapping's faults."""
    page = os.sysconf("SC_PAGE_SIZE")
    first, end = arr.ctypes.data // page, -(-(arr.ctypes.data + arr.nbytes) // page)
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(first * 8)
        entries = np.frombuffer(f.read((end - first) * 8), dtype=np.uint64)
    return int(np.count_nonzero(entries >> np.uint64(63)))


def drop_whole_mapping(g: GGUFFile) -> None:
    """Unmap every page of ``g``'s file, the partial pages at a packed weight's ends too. The kernel does
    this itself where the page cache holds the file in huge folios (ext4, XFS on Linux 6.x): releasing
    part of a 2 MB mapping unmaps all of it, and the next read of any byte in it maps the 2 MB again."""
    import mmap

    g._mmap.madvise(mmap.MADV_DONTNEED)


def test_packing_a_file_mapped_weight_drops_its_pages_as_it_copies(be: NativeBackend, tmp_path: Path) -> None:
    """Packing reads the weight from the GGUF file's mapping and writes a copy; told that the source is
    such a mapping, the packer drops each slice's pages from the resident set as soon as it is copied
    (a large output head never holds both resident), and the products, read from the copy, are still
    the unpacked ones. Anonymous memory is never released (MADV_DONTNEED would zero it)."""

    from llmedge._native import ffi, lib

    if not sys.platform.startswith("linux"):
        skip_or_fail("RssFile is Linux's")
    if not packed_here(T.Q4_1):
        skip_or_fail("no packed kernels on this CPU")
    m, k = 4096, 2048  # 5 MB of Q4_1
    raw, rng, path = weight_in_a_file(tmp_path, T.Q4_1, m, k, 23)

    x = rng.standard_normal((3, k)).astype(np.float32)
    with GGUFFile(path) as g:
        data = g.tensor("w").data
        assert int(data.view(np.uint8).sum(dtype=np.uint64)) > 0  # every page resident
        before = rss_file_kb()
        ptr = ffi.from_buffer("char[]", data)
        rs = raw.nbytes // m
        assert lib.lle_pack_weight(int(T.Q4_1), ptr, rs, m, k, 1) == 1
        try:
            assert before - rss_file_kb() > 0.9 * (raw.nbytes >> 10), "the copied pages stayed resident"
            drop_whole_mapping(g)
            out = np.empty((3, m), dtype=np.float32)
            for rows in (3, 1):  # a prompt's product and a decode's: each finds the copy, reading no source byte
                assert lib.lle_matmul(int(T.Q4_1), ptr, rs, m, k, ffi.from_buffer("float[]", x), rows,
                                      ffi.from_buffer("float[]", out), m) == 0
                assert np.array_equal(out[:rows], unpacked_matmul(T.Q4_1, raw, x[:rows]))
            assert resident_pages(data) == 0, "finding the copy faulted the released file back in"
        finally:
            lib.lle_unpack_weight(ptr)
        del ptr, data
    anon = raw.copy()
    ptr = ffi.from_buffer("char[]", anon)
    assert lib.lle_pack_weight(int(T.Q4_1), ptr, anon.shape[1], m, k, 0) == 1
    lib.lle_unpack_weight(ptr)
    assert np.array_equal(anon, raw)


@pytest.mark.parametrize("t", [T.Q4_K, T.Q6_K, T.Q4_1, T.Q8_0], ids=lambda t: t.name)
def test_released_file_pages_are_never_read_again(be: NativeBackend, isa: str, t: T, tmp_path: Path) -> None:
    """A weight packed from a file mapping gives up its pages only where the copy serves every product
    (lle_pack_weight returns 1): then no product reads the file again, neither the decode of one row,
    the row-exact decode of several sequences, nor a prompt's rows, and none faults a released page
    back in (each would cost the process the memory it had given back, and the server's /api/ps would
    undercount it). Where the copy serves only the products of 8+ rows (2: AVX-512's Q6_K decodes from
    the file), the pages stay. The products equal the unpacked ones either way."""

    from llmedge._native import ffi, lib

    if not sys.platform.startswith("linux"):
        skip_or_fail("/proc/self/pagemap is Linux's")
    m, k = 512, 1024
    raw, rng, path = weight_in_a_file(tmp_path, t, m, k, 25)
    x = rng.standard_normal((9, k)).astype(np.float32)
    rs = raw.nbytes // m
    with GGUFFile(path) as g:
        data = g.tensor("w").data
        assert int(data.view(np.uint8).sum(dtype=np.uint64)) > 0  # every page resident
        ptr = ffi.from_buffer("char[]", data)
        rc = lib.lle_pack_weight(int(t), ptr, rs, m, k, 1)
        packs = isa == "avx512" or (isa == "avx2" and t in (T.Q4_1, T.Q8_0))  # the tiers' packed kernels
        assert rc == (0 if not packs else 2 if t == T.Q6_K else 1)
        try:
            if rc == 2:
                assert resident_pages(data) > 0.9 * data.nbytes / os.sysconf("SC_PAGE_SIZE"), "a source still read was released"
            if rc == 1:
                drop_whole_mapping(g)
            out = np.empty((9, m), dtype=np.float32)
            for n in (1, 2, 3, 9):
                for product in (lib.lle_matmul, lib.lle_matmul_rows):
                    assert product(int(t), ptr, rs, m, k, ffi.from_buffer("float[]", x), n,
                                   ffi.from_buffer("float[]", out), m) == 0
                    ref = unpacked_matmul(t, raw, x[:n]) if product is lib.lle_matmul else \
                        np.concatenate([unpacked_matmul(t, raw, x[i : i + 1]) for i in range(n)])
                    assert np.array_equal(out[:n], ref), (n, product)
            if rc == 1:
                assert resident_pages(data) == 0, "a product read the released file"
        finally:
            if rc:
                lib.lle_unpack_weight(ptr)
        del ptr, data


@pytest.mark.parametrize("t", [T.Q8_0, T.Q4_1])
def test_rows_of_a_packed_weight_come_from_its_copy(be: NativeBackend, isa: str, t: T, tmp_path: Path) -> None:
    """A tied embedding is both the output head (packed, its file pages released) and the table that
    get_rows reads. Its rows are read back from the copy, on every tier's layout: the same values as the
    file's blocks, and the released pages stay out of the resident set (each row from the file would
    fault its page back in, with readahead)."""

    from llmedge._native import ffi, lib

    if not sys.platform.startswith("linux"):
        skip_or_fail("RssFile is Linux's")
    m, k = 8192, 640
    raw, rng, path = weight_in_a_file(tmp_path, t, m, k, 24)

    ids = np.concatenate([[0, 15, 16, 8191], rng.integers(0, m, 300)]).astype(np.int32)
    ref = dequantize(raw.reshape(-1), t, (m, k))[ids]
    with GGUFFile(path) as g:
        data = g.tensor("w").data
        ptr = ffi.from_buffer("char[]", data)
        packed = lib.lle_pack_weight(int(t), ptr, raw.nbytes // m, m, k, 1) == 1
        assert packed == (isa in ("avx2", "avx512"))  # the x86 tiers pack Q8_0 and Q4_1
        try:
            drop_whole_mapping(g)
            out = np.empty((ids.size, k), dtype=np.float32)
            assert lib.lle_get_rows(int(t), ptr, raw.nbytes // m, k, ffi.from_buffer("int[]", ids), ids.size,
                                    ffi.from_buffer("float[]", out)) == 0
            grown = resident_pages(data)
        finally:
            lib.lle_unpack_weight(ptr)
        del ptr, data
    assert np.array_equal(out, ref)
    if packed:
        assert grown == 0, f"reading rows brought {grown} pages of the released file back"


HUGE_PAGE_PROBE = """
import numpy as np
from llmedge._native import ffi, lib

def hg_mappings():  # (start, Rss KB) of the mappings advised into huge pages
    out, cur = [], None
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            cur = [int(head.split("-")[0], 16), 0, int(head.split("-")[1], 16) - int(head.split("-")[0], 16)]
        elif head == "Rss:":
            cur[1] = int(line.split()[1])
        elif head == "VmFlags:" and "hg" in line.split():
            out.append(tuple(cur))
    return out

m, k = 1536, 576
raw = np.random.default_rng(5).integers(0, 256, size=(m, k // 32 * 20), dtype=np.uint8)
raw.view(np.float16)[:, ::10] = 0.01  # moderate scales (d, m of each block)
raw.view(np.float16)[:, 1::10] = 0.01
before = hg_mappings()
ptrs = [ffi.from_buffer("char[]", raw.copy()) for _ in range(8)]  # eight 0.53 MB copies: 4.2 MB of one slab
assert all(lib.lle_pack_weight(3, p, raw.shape[1], m, k, 0) == 1 for p in ptrs)
slabs = [s for s in hg_mappings() if s not in before]
print("slabs", [(size >> 20, rss) for _, rss, size in slabs])
for p in ptrs:
    lib.lle_unpack_weight(p)
print("after", len([s for s in hg_mappings() if s not in before]))
"""


def test_packed_copies_sit_in_huge_pages_and_go_back_with_their_weights(be: NativeBackend) -> None:
    """On Linux the packed copies are carved from 32 MB slabs, and each 2 MB extent is advised into a huge
    page once wholly written (khugepaged merges it later: a decode streams every copy per token, with
    fewer TLB misses; the load never waits for compaction). Small copies share a slab, only their pages
    are resident, and the slab is unmapped with its last copy, so unloading a model returns all of its
    memory. In a fresh process, so that no other test's copies share the slab."""
    if not sys.platform.startswith("linux") or not os.path.exists("/sys/kernel/mm/transparent_hugepage"):
        skip_or_fail("huge pages are Linux's (with transparent huge pages)")
    if not packed_here(T.Q4_1):
        skip_or_fail("no packed kernels on this CPU")
    r = subprocess.run([sys.executable, "-c", HUGE_PAGE_PROBE], capture_output=True, text=True, check=True)
    slabs_line, after_line = r.stdout.splitlines()
    slabs = ast.literal_eval(slabs_line.split(" ", 1)[1])  # [(MB, Rss KB)]
    # one slab; of its first 4.2 MB written, the two whole 2 MB extents advised, all resident
    assert slabs == [(4, 4096)], slabs
    assert after_line == "after 0", "the slab outlived its copies"


def test_thread_pool_survives_fork(be: NativeBackend) -> None:
    """A forked child (multiprocessing, servers) gets a working pool; the parent keeps its own."""
    if not hasattr(os, "fork"):
        skip_or_fail("os.fork is POSIX-only")
    rng = np.random.default_rng(9)
    raw = random_weight(T.Q8_0, 4096, 256, rng)
    w = be.prepare(make_tensor(raw, T.Q8_0, 4096, 256))
    x = rng.standard_normal((3, 256)).astype(np.float32)
    ref = be.matmul(x, w)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        ok = np.array_equal(be.matmul(x, w), ref) and np.array_equal(be.matmul(x[:1], w), ref[:1])
        os._exit(0 if ok else 3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert np.array_equal(be.matmul(x, w), ref)


def test_core_round_trip_is_measured_between_two_pool_threads_and_not_with_one(be: NativeBackend) -> None:
    """The probe bench and benchmarks/server_concurrency.py print (a cache line bounced between thread 0
    and a worker): a time with two threads, None with one (nobody to bounce it to)."""
    from llmedge.backends.native import core_round_trip_ns

    ns = core_round_trip_ns(200)
    assert ns is not None and 0 < ns < 1e7, ns
    try:
        NativeBackend(1)
        assert core_round_trip_ns(200) is None
    finally:
        NativeBackend(2)
    assert core_round_trip_ns(200) is not None


def test_core_round_trip_without_the_native_library_is_none(monkeypatch) -> None:
    """llmedge bench records the probe whatever the backend: where the C build is missing it has no value
    (it raised AttributeError on the missing library before)."""
    from llmedge import bench
    from llmedge.backends import native

    monkeypatch.setattr(native, "lib", None)
    assert native.core_round_trip_ns() is None and bench.core_round_trip() is None


def test_matmul_out_buffer_and_leading_dims(be: NativeBackend) -> None:
    rng = np.random.default_rng(7)
    raw = random_weight(T.Q8_0, 40, 64, rng)
    w = be.prepare(make_tensor(raw, T.Q8_0, 40, 64))
    x = rng.standard_normal((2, 3, 64)).astype(np.float32)
    out = np.empty((2, 3, 40), np.float32)
    assert be.matmul(x, w, out=out) is out
    assert np.array_equal(out.reshape(6, 40), be.matmul(x.reshape(6, 64), w))
    with pytest.raises(ValueError):
        be.matmul(x, w, out=np.empty((6, 40), np.float32))
    with pytest.raises(ValueError):
        be.matmul(np.zeros((1, 63), np.float32), w)


def test_type_without_native_kernel_falls_back_to_dequantized_weights(be: NativeBackend) -> None:
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 256)).astype(np.float32)
    raw = quantize(rng.standard_normal((3, 256)).astype(np.float32), T.Q8_K).reshape(3, -1)
    w = be.prepare(make_tensor(raw, T.Q8_K, 3, 256))
    assert isinstance(w, NativeWeight) and w.fallback is not None
    np.testing.assert_allclose(be.matmul(x, w), x @ dequantize(raw, T.Q8_K, (3, 256)).T, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- real tensors


def real_tensors(path) -> dict[T, TensorInfo]:
    """One 2-D tensor of each GGML type in the file (the first in file order)."""
    g = GGUFFile(path)
    found: dict[T, TensorInfo] = {}
    for info in g.tensors.values():
        t = T(info.ggml_type)
        if len(info.dims) == 2 and t not in found:
            found[t] = info
    return found


def check_real_tensor(be: NativeBackend, info: TensorInfo, rng: np.random.Generator) -> None:
    t = T(info.ggml_type)
    k = info.dims[0]
    rows = info.rows()
    # a multiple of 8 rows, like the whole tensors: Q4_K then takes the same (repacked) order in both
    sel = np.sort(rng.choice(rows.shape[0], size=min(rows.shape[0], 96), replace=False))
    raw = np.ascontiguousarray(rows[sel])
    m = raw.shape[0]
    w = be.prepare(info)
    assert np.array_equal(be.get_rows(w, sel).view(np.uint32),
                          dequantize(raw, t, (m, k)).astype(np.float32).view(np.uint32))
    for n in (1, 3):
        x = rng.standard_normal((n, k)).astype(np.float32)
        assert_close_to_dequantized(be, t, raw, m, k, x)
        full_rows = be.matmul(x, w)[:, sel]
        sub = be.matmul(x, be.prepare(make_tensor(raw, t, m, k)))
        assert np.array_equal(full_rows, sub)


def test_real_smollm2_tensors(be: NativeBackend, isa: str, smollm2_path) -> None:
    found = real_tensors(smollm2_path)
    assert {T.Q4_1, T.Q8_0} <= set(found)
    rng = np.random.default_rng(11)
    for info in found.values():
        check_real_tensor(be, info, rng)


def test_real_gemma3_tensors(be: NativeBackend, isa: str, gemma3_path) -> None:
    found = real_tensors(gemma3_path)
    assert {T.Q5_0, T.Q4_K, T.Q6_K, T.Q8_0} <= set(found)
    rng = np.random.default_rng(12)
    for info in found.values():
        check_real_tensor(be, info, rng)


# ----------------------------------------------------------------------------- llama.cpp's own outputs

GGML_FIXTURE = Path(__file__).parent / "fixtures" / "native_ggml_ops.json"  # ggml's AVX2 build
GGML_FIXTURE_AVX512 = Path(__file__).parent / "fixtures" / "native_ggml_ops_avx512.json"  # its AVX-512 build

def ggml_case_key(case: dict) -> str:
    """The op of a fixture case: "mul_mat:F32", "glu:silu", "rope"."""
    sub = case.get("type", case.get("kind"))
    return f"{case['op']}:{sub}" if sub else case["op"]


def fixture_cases_for(isa: str) -> list[tuple[dict, str]]:
    """(case, fixture name) the tier must reproduce: avx512 the AVX-512 build's outputs (what
    llama.cpp and Ollama compute on an AVX-512 CPU), every other tier the AVX2 build's."""
    avx2 = json.loads(GGML_FIXTURE.read_text(encoding="utf-8"))["cases"]
    if isa != "avx512":
        return [(c, GGML_FIXTURE.name) for c in avx2]
    avx512 = json.loads(GGML_FIXTURE_AVX512.read_text(encoding="utf-8"))["cases"]
    assert [ggml_case_key(c) for c in avx512] == [ggml_case_key(c) for c in avx2]
    return [(c, GGML_FIXTURE_AVX512.name) for c in avx512]


def dec(d: dict) -> np.ndarray:
    return np.frombuffer(base64.b64decode(d["b64"]), dtype=d["dtype"]).reshape(d["shape"])


def run_ggml_case(be: NativeBackend, case: dict) -> np.ndarray:
    op = case["op"]
    if op == "mul_mat":
        t = T[case["type"]]
        raw, x = dec(case["w"]), dec(case["x"])
        m, k = raw.shape[0], x.shape[1]
        return be.matmul(x, be.prepare(make_tensor(raw, t, m, k)))
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


def test_ops_reproduce_llamacpp_outputs(be: NativeBackend, isa: str) -> None:
    """On x86 SIMD the kernels reproduce llama.cpp's CPU ops bit for bit (same activation rounding,
    same reduction orders, same contracted multiply-adds), each tier those of ggml built for it (avx2:
    its AVX2 build, avx512: its AVX-512 build); the scalar kernels stay within float rounding."""
    from llmedge._native import lib

    bitwise = isa in ("avx2", "avx512") and platform.machine().lower() in ("x86_64", "amd64")
    prev = lib.lle_act_rounding_mode()
    lib.lle_set_act_rounding(1)  # the fixture was made by ggml's x86 quantizers
    differ = []
    try:
        for case, fixture in fixture_cases_for(isa):
            ref = dec(case["out"])
            out = run_ggml_case(be, case)
            what = f"{case['op']} {case.get('type', case.get('kind', ''))} shape {ref.shape} ({fixture})"
            if bitwise:
                if not np.array_equal(out.view(np.uint8), ref.view(np.uint8)):
                    differ.append(f"{what}: {int(np.sum(out != ref))} values differ")
            else:
                out, ref = out.astype(np.float32), ref.astype(np.float32)
                np.testing.assert_allclose(out, ref, rtol=2e-3, atol=2e-3 * float(np.abs(ref).max()), err_msg=what)
    finally:
        lib.lle_set_act_rounding(prev)
    assert not differ, "\n".join(differ)


# ----------------------------------------------------------------------------- float ops


def test_rms_norm(be: NativeBackend, isa: str) -> None:
    rng = np.random.default_rng(20)
    x = rng.standard_normal((3, 4, 576)).astype(np.float32) * 5
    w = rng.standard_normal(576).astype(np.float32)
    out = be.rms_norm(x, w, 1e-5)
    x64 = x.astype(np.float64)
    ref = x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(out, ref, rtol=2e-6, atol=1e-6)
    np.testing.assert_allclose(be.rms_norm(x, None, 1e-5), ref / w, rtol=2e-6, atol=1e-6)


def ggml_rope_theta(pos: np.ndarray, n_rot: int, base: float, freq_scale: float, ff: np.ndarray | None) -> np.ndarray:
    """Angles exactly as ggml computes them: float32 theta advanced by repeated multiplication."""
    theta_scale = np.float32(np.power(np.float32(base), np.float32(-2.0) / np.float32(n_rot), dtype=np.float32))
    out = np.empty((pos.size, n_rot // 2), np.float32)
    theta = pos.astype(np.float32)
    for i in range(n_rot // 2):
        f = np.float32(1.0) if ff is None else ff[i]
        out[:, i] = np.float32(freq_scale) * (theta / f)
        theta = (theta * theta_scale).astype(np.float32)
    return out.astype(np.float64)


@pytest.mark.parametrize("neox", [False, True])
def test_rope(be: NativeBackend, isa: str, neox: bool) -> None:
    rng = np.random.default_rng(21)
    n, heads, hd, n_rot = 5, 3, 64, 48
    x = rng.standard_normal((n, heads, hd)).astype(np.float32)
    pos = np.array([0, 1, 7, 513, 4000], dtype=np.int32)
    ff = rng.uniform(1.0, 4.0, n_rot // 2).astype(np.float32)
    for freq_factors, scale in ((None, 1.0), (ff, 0.25)):
        out = be.rope(x, pos, n_rot, 10000.0, scale, neox, freq_factors=freq_factors)
        theta = ggml_rope_theta(pos, n_rot, 10000.0, scale, freq_factors)[:, None, :]
        cos, sin = np.cos(theta), np.sin(theta)
        x64 = x.astype(np.float64)
        ref = x64.copy()
        if neox:
            a, b = x64[..., : n_rot // 2], x64[..., n_rot // 2 : n_rot]
            ref[..., : n_rot // 2], ref[..., n_rot // 2 : n_rot] = a * cos - b * sin, a * sin + b * cos
        else:
            a, b = x64[..., 0:n_rot:2], x64[..., 1:n_rot:2]
            ref[..., 0:n_rot:2], ref[..., 1:n_rot:2] = a * cos - b * sin, a * sin + b * cos
        np.testing.assert_allclose(out, ref, rtol=0, atol=2e-6 * np.abs(x).max())
        assert np.array_equal(out[..., n_rot:], x[..., n_rot:])
    inplace = x.copy()
    assert be.rope(inplace, pos, n_rot, 10000.0, 1.0, neox, out=inplace) is inplace
    assert np.array_equal(inplace, be.rope(x, pos, n_rot, 10000.0, 1.0, neox))


def test_rope_reuses_a_table_only_for_the_same_positions_and_parameters(be: NativeBackend, isa: str) -> None:
    """The native rope keeps its last cos/sin tables (a decode step ropes the same positions with the same
    parameters in every layer): three parameter sets in turn (more than it keeps), changed positions,
    and frequency factors changed in place at the same address must each get their own angles, and a
    repeated call the first call's values bit for bit."""
    rng = np.random.default_rng(23)
    n, heads, hd, n_rot = 4, 2, 32, 32
    x = rng.standard_normal((n, heads, hd)).astype(np.float32)
    ff = rng.uniform(1.0, 4.0, n_rot // 2).astype(np.float32)

    def ref(pos: np.ndarray, base: float, scale: float, factors: np.ndarray | None) -> np.ndarray:
        theta = ggml_rope_theta(pos, n_rot, base, scale, factors)[:, None, :]
        a, b = x.astype(np.float64)[..., 0::2], x.astype(np.float64)[..., 1::2]
        out = np.empty(x.shape)
        out[..., 0::2], out[..., 1::2] = a * np.cos(theta) - b * np.sin(theta), a * np.sin(theta) + b * np.cos(theta)
        return out

    pos = np.array([5, 6, 90, 91], dtype=np.int32)
    sets = [(10000.0, 1.0, None), (500000.0, 0.5, None), (10000.0, 1.0, ff)]
    first = {}
    for _ in range(2):
        for i, (base, scale, factors) in enumerate(sets):
            out = be.rope(x, pos, n_rot, base, scale, False, freq_factors=factors)
            np.testing.assert_allclose(out, ref(pos, base, scale, factors), rtol=0, atol=2e-6 * np.abs(x).max())
            assert np.array_equal(out, first.setdefault(i, out))
    moved = pos.copy()
    moved[2] += 1
    out = be.rope(x, moved, n_rot, 10000.0, 1.0, False, freq_factors=ff)
    np.testing.assert_allclose(out, ref(moved, 10000.0, 1.0, ff), rtol=0, atol=2e-6 * np.abs(x).max())
    ff[3] *= 2
    out = be.rope(x, moved, n_rot, 10000.0, 1.0, False, freq_factors=ff)
    np.testing.assert_allclose(out, ref(moved, 10000.0, 1.0, ff), rtol=0, atol=2e-6 * np.abs(x).max())
    # a kept table's buffers sized for (rows, n_rot) reused for more rows of a smaller n_rot (the same
    # floats): the positions need their own room
    for rows, rot in ((1, 2048), (1, 4), (1024, 2), (2, 8), (4096, 2), (3, 16)):
        xs = rng.standard_normal((rows, 1, rot)).astype(np.float32)
        ps = np.arange(rows, dtype=np.int32) % 700 * 3
        out = be.rope(xs, ps, rot, 10000.0, 1.0, False)
        theta = ggml_rope_theta(ps, rot, 10000.0, 1.0, None)[:, None, :]
        a, b = xs.astype(np.float64)[..., 0::2], xs.astype(np.float64)[..., 1::2]
        np.testing.assert_allclose(out[..., 0::2], a * np.cos(theta) - b * np.sin(theta), rtol=0, atol=2e-6 * 8)
        np.testing.assert_allclose(out[..., 1::2], a * np.sin(theta) + b * np.cos(theta), rtol=0, atol=2e-6 * 8)


def test_softmax(be: NativeBackend, isa: str) -> None:
    rng = np.random.default_rng(22)
    x = (rng.standard_normal((4, 333)) * 10).astype(np.float32)
    out = be.softmax(x, scale=0.5)
    z = x.astype(np.float64) * 0.5
    ref = np.exp(z - z.max(axis=-1, keepdims=True))
    ref /= ref.sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(out, ref, rtol=2e-6, atol=1e-9)


def attention_ref(q, k, v, q_pos, k_pos, scale, window, softcap):
    """llama.cpp's attention without flash-attention, in float64: Q rounded to the cache type,
    scores soft-capped then scaled, softmax, probabilities rounded to the cache type, P @ V.
    Also returns the float64 sum of |P| |V| that bounds the effect of one f16 ulp per probability."""
    n, n_head, d = q.shape
    group = n_head // k.shape[1]
    f16 = k.dtype == np.float16
    q64 = (q.astype(np.float16) if f16 else q).astype(np.float64)
    k64, v64 = k.astype(np.float64), v.astype(np.float64)
    out, mag = np.zeros((n, n_head, d)), np.zeros((n, n_head, d))
    for i in range(n):
        vis = (k_pos >= 0) & (k_pos <= q_pos[i])
        if window:
            vis &= q_pos[i] - k_pos < window
        if not vis.any():
            continue
        for h in range(n_head):
            s = k64[:, h // group, :] @ q64[i, h]
            if softcap:
                s = softcap * np.tanh(s / softcap)
            s = np.where(vis, s * scale, -np.inf)
            p = np.exp(s - s.max())
            p /= p.sum()
            if f16:
                p = p.astype(np.float16).astype(np.float64)
            out[i, h] = p @ v64[:, h // group, :]
            mag[i, h] = p @ np.abs(v64[:, h // group, :])
    return out, mag


@pytest.mark.parametrize("kv_dtype", [np.float16, np.float32])
def test_attention_masks_gqa_softcap(be: NativeBackend, isa: str, kv_dtype) -> None:
    rng = np.random.default_rng(23)
    n_head, n_kv, d, cells = 6, 2, 64, 48
    cache_k = rng.standard_normal((cells, n_kv, d)).astype(kv_dtype)
    cache_v = rng.standard_normal((cells, n_kv, d)).astype(kv_dtype)
    t = 40  # attend over the first t cells of the cache (a strided view when the cache is sliced)
    k_pos = np.arange(t, dtype=np.int32)
    k_pos[[3, 17]] = -1  # empty cells
    k_pos = np.roll(k_pos, 5)  # ring-buffer order
    for n, window, softcap in ((1, None, None), (7, None, 30.0), (7, 8, None), (3, 1, 5.0)):
        q = rng.standard_normal((n, n_head, d)).astype(np.float32)
        q_pos = np.sort(rng.choice(np.arange(20, 45), n, replace=False)).astype(np.int32)
        out = be.attention(q, cache_k[:t], cache_v[:t], q_pos, k_pos, 0.125, window, softcap)
        ref, mag = attention_ref(q, cache_k[:t], cache_v[:t], q_pos, k_pos, 0.125, window, softcap)
        # a probability may round to the neighbouring f16 value: one f16 ulp (2^-10 relative) each
        bound = 2e-5 + (2.0**-10 * mag if kv_dtype == np.float16 else 0)
        assert np.all(np.abs(out - ref) <= bound)
    # a head-major view (strided in both leading axes) gives the same result
    k_hm = np.ascontiguousarray(cache_k[:t].transpose(1, 0, 2)).transpose(1, 0, 2)
    v_hm = np.ascontiguousarray(cache_v[:t].transpose(1, 0, 2)).transpose(1, 0, 2)
    q = rng.standard_normal((2, n_head, d)).astype(np.float32)
    q_pos = np.array([30, 31], np.int32)
    assert np.array_equal(be.attention(q, k_hm, v_hm, q_pos, k_pos, 0.125),
                          be.attention(q, cache_k[:t], cache_v[:t], q_pos, k_pos, 0.125))
    # a query that sees no key gets zeros
    out = be.attention(q[:1], cache_k[:t], cache_v[:t], np.array([-5], np.int32), k_pos, 0.125)
    assert np.array_equal(out, np.zeros_like(out))


def test_glu_silu(be: NativeBackend, isa: str) -> None:
    rng = np.random.default_rng(24)
    g = (rng.standard_normal(5000) * 6).astype(np.float32)
    u = rng.standard_normal(5000).astype(np.float32)
    out = be.glu(g, u, "silu")
    g64 = g.astype(np.float64)
    ref = g64 / (1 + np.exp(-g64)) * u
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-7)


def test_glu_gelu_uses_ggml_f16_table(be: NativeBackend, isa: str) -> None:
    rng = np.random.default_rng(25)
    g = np.concatenate([(rng.standard_normal(5000) * 4), [-12.0, -10.0, 10.0, 12.5]]).astype(np.float32)
    u = rng.standard_normal(g.size).astype(np.float32)
    out = be.glu(g, u, "gelu").astype(np.float64)
    gh = g.astype(np.float16).astype(np.float64)
    gelu = 0.5 * gh * (1 + np.tanh(np.sqrt(2 / np.pi) * gh * (1 + 0.044715 * gh * gh)))
    table = gelu.astype(np.float16).astype(np.float64)
    ref = np.where(g <= -10, 0.0, np.where(g >= 10, g.astype(np.float64), table)) * u
    # the table entry may differ from the float64 GELU rounded to f16 by one f16 ulp
    ulp = np.abs(table) * 2.0**-10 + 2.0**-24
    assert np.all(np.abs(out - ref) <= ulp * np.abs(u) + 1e-7)


def test_add_scale_softcap(be: NativeBackend, isa: str) -> None:
    rng = np.random.default_rng(26)
    a = rng.standard_normal(100_003).astype(np.float32)
    b = rng.standard_normal(100_003).astype(np.float32)
    assert np.array_equal(be.add(a, b), a + b)
    assert np.array_equal(be.scale(a, 0.37), a * np.float32(0.37))
    np.testing.assert_allclose(be.softcap(a * 40, 30.0), np.tanh(a.astype(np.float64) * 40 / 30) * 30, rtol=1e-6,
                               atol=1e-6)


# ----------------------------------------------------------------------------- C self-test

NATIVE = Path(__file__).resolve().parent.parent / "native"


def _build_selftest(cc: str, out: Path, extra: list[str]) -> None:
    sources = sorted(str(p) for p in NATIVE.glob("[a-z]*.c"))
    cmd = [cc, "-O2", "-std=gnu11", "-ffp-contract=off", "-pthread", *extra, *sources, "-lm", "-o", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def test_c_selftest_simd_against_scalar(tmp_path: Path) -> None:
    """native/selftest.c: every SIMD kernel of this CPU against the scalar ones, outside Python."""
    exe = tmp_path / "selftest"
    _build_selftest(os.environ.get("CC", "cc"), exe, [])
    res = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "PASSED" in res.stdout, res.stdout


def test_c_selftest_avx512_through_simde_equals_avx2_bitwise(tmp_path: Path) -> None:
    """The AVX-512 kernels and float ops compiled against SIMDe (native/selftest_simde.c,
    selftest_simde_ops.c), so that CPUs without AVX-512 check them too: every product (decode, prefill
    tiles, row-exact rows kernels, odd float tails) equal to the AVX2 tier's bit for bit, except where
    ggml's AVX-512 build sums otherwise (F32, F16, BF16 products, IQ4_NL's decode): there equal to
    selftest.c's scalar copy of that build's order; the float ops (which follow ggml's AVX-512 build)
    against the scalar ones, and the attention's row, grouped-head and wide paths against each other
    bit for bit. test_ops_reproduce_llamacpp_outputs holds them to that build's own outputs."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        skip_or_fail("the AVX-512 tier is compared with the AVX2 kernels, which need an x86 CPU")
    exe = tmp_path / "selftest_simde"
    try:
        _build_selftest(os.environ.get("CC", "cc"), exe, ["-DLLE_SELFTEST_SIMDE", "-Wno-psabi"])
    except subprocess.CalledProcessError as e:
        if "simde/" in e.stderr and "No such file" in e.stderr:
            pytest.fail("needs SIMDe's headers (Debian: libsimde-dev; scripts/test.sh installs it)")
        raise AssertionError(e.stderr[-2000:]) from None
    res = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert "avx512 kernels: SIMDe" in res.stdout and "testing avx512's products against avx2's" in res.stdout, res.stdout
    assert "testing avx512 against scalar" in res.stdout and "wide decode attention" in res.stdout, res.stdout
    assert res.returncode == 0 and "PASSED" in res.stdout, res.stdout


def test_avx512_registration_runs_on_cpus_without_avx512() -> None:
    """The AVX-512 kernel table is filled at start-up on every x86 CPU, so the function that fills it
    must hold no AVX-512 instruction: compiled under the kernels' target, GCC copied the table with
    zmm moves and importing the module died with SIGILL on AVX2-only CPUs. Read from the built
    module's code, so an AVX-512 machine (where it would not crash) catches it too."""
    import shutil

    import llmedge._native as native_module

    if platform.machine().lower() not in ("x86_64", "amd64"):
        skip_or_fail("the AVX-512 registration exists only in x86 builds")
    objdump = shutil.which("objdump")
    if objdump is None:
        skip_or_fail("needs objdump (Debian: binutils, which gcc depends on)")
    res = subprocess.run([objdump, "-d", "--no-show-raw-insn", "--disassemble=lle_register_avx512",
                          native_module.__file__], capture_output=True, text=True, check=True)
    code = [line for line in res.stdout.splitlines() if line.startswith(" ") and ":\t" in line]
    assert len(code) > 20, res.stdout[-2000:]  # the function was found and disassembled
    avx512 = [line for line in code if "zmm" in line or "%k" in line or "{" in line]
    assert not avx512, "\n".join(avx512[:10])


def test_c_selftest_neon_under_qemu(tmp_path: Path) -> None:
    """The NEON kernels, cross-compiled for aarch64 and run under qemu-aarch64, against the scalar ones."""
    import shutil

    cc, qemu = shutil.which("aarch64-linux-gnu-gcc"), shutil.which("qemu-aarch64")
    if platform.machine().lower() not in ("aarch64", "arm64") and not (cc and qemu):
        # scripts/test.sh installs both
        skip_or_fail("needs aarch64-linux-gnu-gcc and qemu-aarch64 (Debian: gcc-aarch64-linux-gnu qemu-user)")
    exe = tmp_path / "selftest_arm"
    native_arm = platform.machine().lower() in ("aarch64", "arm64")
    _build_selftest(os.environ.get("CC", "cc") if native_arm else cc, exe, [] if native_arm else ["-static"])
    res = subprocess.run([str(exe)] if native_arm else [qemu, str(exe)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "testing neon" in res.stdout and "PASSED" in res.stdout, res.stdout
