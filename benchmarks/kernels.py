"""Micro-benchmark of the native matrix-vector and matrix-matrix kernels, per GGUF type.

For each type it times ``NativeBackend.matmul`` on the decode shapes of the two reference models
(SmolLM2-135M Q4_1 and Gemma-3-270M Q4_K_M), cycling through enough copies of the weight that
every call reads it from memory as a real forward pass does, and reports:

* ``us/call`` and ``GB/s`` of weight bytes streamed (decode is bound by memory bandwidth);
* ``tok/s eq``: tokens per second if a whole model of ``--model-mb`` megabytes of weights of this
  type were read at that speed (the decode ceiling the kernel allows);
* the same for the NumPy reference backend (float32 weights dequantized once, ``x @ W.T``);
* with ``--prefill N``, the GEMM rate in GFLOP/s for N activation rows.

Run: ``python benchmarks/kernels.py [--threads 2] [--types Q4_1,Q8_0] [--isa avx2] [--prefill 512]``
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from llmedge.backends.native import NativeBackend, NativeWeight
from llmedge.backends.numpy_ref import NumpyBackend
from llmedge.gguf import TensorInfo
from llmedge.quant import GGMLQuantizationType as T
from llmedge.quant import quantize, traits

# (type, m, k): decode shapes of the two models (m output rows of k values)
SHAPES = {
    T.Q4_1: [(576, 576), (1536, 576), (576, 1536)],
    T.Q8_0: [(49152, 576), (256, 640)],
    T.Q5_0: [(2048, 640), (1024, 640), (256, 640)],
    T.Q4_K: [(640, 1024), (640, 2048)],
    T.Q6_K: [(640, 2048)],
    T.F32: [(576, 576)],
    T.F16: [(576, 576), (2048, 640)],
    T.BF16: [(576, 576)],
    T.Q4_0: [(1536, 576)],
    T.Q5_1: [(1536, 576)],
    T.Q2_K: [(2048, 768)],
    T.Q3_K: [(2048, 768)],
    T.Q5_K: [(2048, 768)],
    T.IQ4_NL: [(1536, 576)],
    T.IQ4_XS: [(2048, 768)],
}


def make_tensor(name: str, t: T, m: int, k: int, raw: np.ndarray) -> TensorInfo:
    """A TensorInfo over synthetic bytes: m rows of k values of type t."""
    flat = np.ascontiguousarray(raw).reshape(-1)
    return TensorInfo(name=name, ggml_type=int(t), dims=(k, m), offset=0, n_bytes=flat.size, _buffer=flat)


def random_weight(t: T, m: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Raw rows of type ``t``: quantized from Gaussian values where llmedge has an encoder, else
    random bytes with sane F16 scales (the kernels' speed does not depend on the values)."""
    tr = traits(t)
    if tr.quantize_ref is not None:
        x = rng.standard_normal((m, k)).astype(np.float32) * 0.05
        return np.ascontiguousarray(quantize(x, t).reshape(m, -1))
    nb = m * k // tr.block_size
    raw = rng.integers(0, 256, size=(nb, tr.type_size), dtype=np.uint8)
    scale = np.full(nb, 0.01, np.float16).view(np.uint8).reshape(nb, 2)
    if t in (T.Q2_K,):
        raw[:, -4:-2] = scale
        raw[:, -2:] = scale
    elif t in (T.Q3_K, T.Q6_K):
        raw[:, -2:] = scale
    else:
        raw[:, 0:2] = scale
        if t in (T.Q4_K, T.Q5_K):
            raw[:, 2:4] = scale
    return np.ascontiguousarray(raw.reshape(m, -1))


def time_calls(fn, seconds: float) -> float:
    """Median seconds per call of ``fn`` over about ``seconds`` of wall time."""
    fn()
    samples = []
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end or len(samples) < 5:
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return float(np.median(samples))


def bench_shape(be: NativeBackend, ref: NumpyBackend, t: T, m: int, k: int, args: argparse.Namespace,
                rng: np.random.Generator) -> str:
    """One table line: decode (and optionally prefill) timings of an m x k weight of type t."""
    raw = random_weight(t, m, k, rng)
    copies = max(1, int(args.working_set_mb * 2**20 // raw.nbytes))
    weights = [NativeWeight(make_tensor(f"w{i}", t, m, k, raw.copy())) for i in range(copies)]
    x = rng.standard_normal((1, k)).astype(np.float32)
    out = np.empty((1, m), np.float32)
    state = {"i": 0}

    def native_call() -> None:
        state["i"] = (state["i"] + 1) % copies
        be.matmul(x, weights[state["i"]], out=out)

    sec = time_calls(native_call, args.seconds)
    gbs = raw.nbytes / sec / 1e9
    line = f"{t.name:7s} {f'{m}x{k}':>12s} {sec * 1e6:9.1f} {gbs:7.2f} {gbs * 1e3 / args.model_mb:9.1f}"
    if not args.no_numpy:
        nw = ref.prepare(make_tensor("ref", t, m, k, raw))
        ref.matmul(x, nw)  # dequantizes the weight once (the reference backend caches it)
        nsec = time_calls(lambda: ref.matmul(x, nw), min(args.seconds, 0.3))
        line += f" {nsec * 1e6:9.1f} {raw.nbytes / nsec / 1e9:10.2f} {nsec / sec:8.1f}"
    if args.prefill:
        xp = rng.standard_normal((args.prefill, k)).astype(np.float32)
        op = np.empty((args.prefill, m), np.float32)
        psec = time_calls(lambda: be.matmul(xp, weights[0], out=op), args.seconds)
        line += f" {2 * m * k * args.prefill / psec / 1e9:10.1f} {args.prefill / psec:10.0f}"
    return line


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=None, help="native threads (default: physical cores)")
    ap.add_argument("--types", default="", help="comma-separated GGUF types (default: all)")
    ap.add_argument("--isa", default=None, help="force scalar|avx2|avx512")
    ap.add_argument("--seconds", type=float, default=0.5, help="time per measurement")
    ap.add_argument("--working-set-mb", type=float, default=128, help="bytes cycled through, > last-level cache")
    ap.add_argument("--model-mb", type=float, default=100, help="model size for the tok/s equivalent")
    ap.add_argument("--prefill", type=int, default=0, help="also time n-row GEMM (e.g. 512)")
    ap.add_argument("--no-numpy", action="store_true", help="skip the NumPy reference")
    args = ap.parse_args(argv)

    be = NativeBackend(args.threads)
    if args.isa:
        be.set_isa(args.isa)
    ref = NumpyBackend()
    types = [T[s.strip()] for s in args.types.split(",") if s.strip()] or list(SHAPES)
    rng = np.random.default_rng(0)
    print(f"native isa={be.isa} threads={be.n_threads}; working set {args.working_set_mb:.0f} MB; "
          f"tok/s eq for a {args.model_mb:.0f} MB model")
    hdr = f"{'type':7s} {'m x k':>12s} {'us/call':>9s} {'GB/s':>7s} {'tok/s eq':>9s}"
    if not args.no_numpy:
        hdr += f" {'numpy us':>9s} {'numpy GB/s':>10s} {'speedup':>8s}"
    if args.prefill:
        hdr += f" {'pp GFLOP/s':>10s} {'pp rows/s':>10s}"
    print(hdr)
    for t in types:
        for m, k in SHAPES[t]:
            print(bench_shape(be, ref, t, m, k, args, rng), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
