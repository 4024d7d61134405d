"""Where a decoded token's time goes, on the native backend.

    python benchmarks/profile_decode.py [--model smollm2:135m] [--threads 2] [--context 128]
                                        [--tokens 128] [--kv-type f16] [--sequences 1]

A context of ``--context`` tokens is evaluated, then ``--tokens`` tokens are decoded one at a time
(``engine.forward``, as ``llmedge bench``'s tg test does). With ``--sequences N`` there are N
sequences of their own random ids, and each step is one forward over the N decode rows, as the
server's continuous batching runs them (row-exact: each row multiplied as a one-row decode); the
figures are then per step (N tokens). Reported per token, in milliseconds and as
a share of the wall time: each op kind inside the fused decoder stack (timed in C by
``lle_stack_profile``: the matrix products by weight group, attention, norms, RoPE, K/V stores,
GLU, residual adds; on decode rows over a float cache RoPE and the K/V stores run inside the
attention job, per KV head, and count as attention), the stack call's own gaps (thread-pool hand-offs between ops), the output head
(final norm and the vocabulary product) and everything else (Python: the engine, cell bookkeeping,
embeddings lookup). Timings include the profiler's clock reads (two per op, ~50 ns each).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import llmedge
from llmedge.backends.native import NativeBackend, ffi, lib
from llmedge.models.base import Batch

OPS = ("norms", "q/k/v products", "rope", "kv store", "attention", "output product", "residual adds",
       "gate/up products", "glu", "down product")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2:135m")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--kv-type", default="f16")
    ap.add_argument("--sequences", type=int, default=1, help="decode rows per forward (one per sequence)")
    args = ap.parse_args()

    m = llmedge.load(args.model, backend="native", n_threads=args.threads, n_ctx=args.context + args.tokens + 8,
                     kv_type=args.kv_type)
    be, net, eng = m.model.backend, m.model, m.engine
    assert isinstance(be, NativeBackend)
    rng = np.random.default_rng(0)
    n_seq = max(1, args.sequences)
    ids = [rng.integers(0, m.params.n_vocab, args.context + args.tokens).tolist() for _ in range(n_seq)]
    caches = [eng.new_cache() for _ in range(n_seq)]
    for cache, seq in zip(caches, ids):
        eng.forward(cache, seq[: args.context])

    def step(k: int) -> None:
        """Decode step ``k``: one row per sequence, in one forward (one row: ``engine.forward``)."""
        if n_seq == 1:
            eng.forward(caches[0], [ids[0][k]])
            return
        pos = caches[0].offset  # every sequence is at the same position
        batches = [Batch(np.array([seq[k]], dtype=np.int64), np.array([pos], dtype=np.int64), cache, np.array([0]),
                         row_exact=True) for cache, seq in zip(caches, ids)]
        eng._forward_batches(batches)
        for cache, seq in zip(caches, ids):
            cache.tokens.append(int(seq[k]))

    stack_ns = [0.0]
    head_ns = [0.0]
    real_stack, real_matmul = be.decoder_layers, be.matmul

    def timed_stack(*a, **k):
        t0 = time.perf_counter_ns()
        r = real_stack(*a, **k)
        stack_ns[0] += time.perf_counter_ns() - t0
        return r

    def timed_matmul(x, w, *a, **k):
        t0 = time.perf_counter_ns()
        r = real_matmul(x, w, *a, **k)
        if w is net.output:
            head_ns[0] += time.perf_counter_ns() - t0
        return r

    real_rows = be.matmul_rows

    def timed_rows(x, w, *a, **k):  # the head of several sequences' rows (row-exact)
        t0 = time.perf_counter_ns()
        r = real_rows(x, w, *a, **k)
        if w is net.output:
            head_ns[0] += time.perf_counter_ns() - t0
        return r

    be.decoder_layers, be.matmul, be.matmul_rows = timed_stack, timed_matmul, timed_rows
    out = ffi.new("double[]", 16)
    lib.lle_stack_profile(1, ffi.NULL, 0)
    t0 = time.perf_counter_ns()
    for k in range(args.context, args.context + args.tokens):
        step(k)
    wall = time.perf_counter_ns() - t0
    n_ops = lib.lle_stack_profile(0, out, 16)
    n = args.tokens
    ops = [out[i] / n for i in range(n_ops)]
    per_token = wall / n
    rows = list(zip(OPS, ops))
    rows.append(("stack gaps (pool hand-offs)", stack_ns[0] / n - sum(ops)))
    rows.append(("output head (vocab product)", head_ns[0] / n))
    rows.append(("python, embeddings, other", per_token - stack_ns[0] / n - head_ns[0] / n))
    print(f"{args.model}: {net.params.n_layer} layers, {be.n_threads} threads, {be.isa}, context {args.context}, "
          f"{n_seq} sequence(s), {n} steps: {per_token / 1e6:.2f} ms/step ({1e9 * n_seq / per_token:.1f} t/s)")
    print(f"| {'where':<30} | {'ms/step':>9} | {'share':>6} |")
    print(f"| {'-' * 30} | {'-' * 9}: | {'-' * 6}: |")
    for name, ns in sorted(rows, key=lambda r: -r[1]):
        print(f"| {name:<30} | {ns / 1e6:9.3f} | {100 * ns / per_token:5.1f}% |")


if __name__ == "__main__":
    main()
