"""Prefill and decode speed of one model on each native kernel tier of this CPU, interleaved.

    python benchmarks/compare_tiers.py [--model gemma3:270m] [--threads 2] [--prompt 512] [--tokens 64] [--reps 3]

Every repetition runs each tier in turn (same process, same weights, ``NativeBackend.set_isa``),
so a busy machine slows all tiers alike. Reported per tier: the best wall-clock tokens/s of the
repetitions and the process CPU seconds per token (which a shared machine distorts less than wall
time). The tiers produce identical logits (tests/test_native_kernels.py); only speed differs.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import llmedge


def _timed(eng, cache, chunks: list[list[int]]) -> tuple[float, float]:
    """Wall and process CPU seconds to evaluate ``chunks`` one forward call each."""
    c0, w0 = time.process_time(), time.perf_counter()
    for chunk in chunks:
        eng.forward(cache, chunk)
    return time.perf_counter() - w0, time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gemma3:270m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()

    m = llmedge.load(args.model, backend="native", n_threads=args.threads, n_ctx=args.prompt + args.tokens + 8)
    be, eng = m.model.backend, m.engine
    eng.n_batch = args.prompt
    tiers = [t for t in be.available_isas() if t != "scalar"]
    ids = np.random.default_rng(0).integers(0, m.params.n_vocab, args.prompt + args.tokens).tolist()
    best: dict[tuple[str, str], tuple[float, float]] = {}
    for _ in range(args.reps):
        for tier in tiers:
            be.set_isa(tier)
            cache = eng.new_cache()
            pp = _timed(eng, cache, [ids[: args.prompt]])
            tg = _timed(eng, cache, [[t] for t in ids[args.prompt :]])
            for test, (wall, cpu), n in (("pp", pp, args.prompt), ("tg", tg, args.tokens)):
                cur = (n / wall, cpu / n * 1e3)
                old = best.get((tier, test))
                best[(tier, test)] = cur if old is None else (max(old[0], cur[0]), min(old[1], cur[1]))
    print(f"{args.model}, {args.threads} threads, pp{args.prompt} / tg{args.tokens}, best of {args.reps}")
    print(f"| tier   | test | t/s (wall) | CPU ms/token | vs {tiers[0]} (t/s, CPU) |")
    print("| ------ | ---- | ---------: | -----------: | ------------------: |")
    for test in ("pp", "tg"):
        base = best[(tiers[0], test)]
        for tier in tiers:
            tps, cpu = best[(tier, test)]
            print(f"| {tier:<6} | {test}   | {tps:10.1f} | {cpu:12.2f} | {tps / base[0]:8.2f}x, {base[1] / cpu:.2f}x |")


if __name__ == "__main__":
    main()
