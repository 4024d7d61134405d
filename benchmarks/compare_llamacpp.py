"""The speed report of issue 5: ``llmedge bench --compare llama.cpp`` over models x backends x threads.

Runs :func:`llmedge.bench.run_bench` for every combination in one process (llama-cpp-python must be
importable: install it, or put a venv's site-packages on PYTHONPATH) and prints the markdown tables
one after another, then one summary table of the ratios. Example::

    PYTHONPATH=/path/to/llamaenv/lib/python3.11/site-packages \\
        python benchmarks/compare_llamacpp.py smollm2:135m gemma3:270m --backends native,numpy -t 1,2

Timings on a shared machine are noisy; the ratios come from interleaved runs, and the report
gives the load average seen during each table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from llmedge.bench import BenchParams, format_md, parse_int_list, run_bench


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", help="catalog names, store names or .gguf paths")
    ap.add_argument("--backends", default="native,numpy", help="comma-separated llmedge backends")
    ap.add_argument("-t", "--threads", default="2", help="thread counts, llama-bench syntax (1,2)")
    ap.add_argument("-p", "--n-prompt", default="512")
    ap.add_argument("-n", "--n-gen", default="128")
    ap.add_argument("-r", "--repetitions", type=int, default=5)
    ap.add_argument("--no-rss-probe", action="store_true", help="skip the per-runtime peak-RSS processes")
    args = ap.parse_args(argv)

    summary: list[tuple[str, str, int, str, float, float, float]] = []
    for model in args.models:
        for backend in args.backends.split(","):
            params = BenchParams(n_prompt=parse_int_list(args.n_prompt), n_gen=parse_int_list(args.n_gen),
                                 n_threads=parse_int_list(args.threads), reps=args.repetitions, backend=backend,
                                 compare="llama.cpp", rss_probe=not args.no_rss_probe)
            print(f"### {model}, llmedge {backend} vs llama.cpp\n", flush=True)
            results = run_bench(model, params, progress=lambda m: print(f"  .. {m}", file=sys.stderr, flush=True))
            print(format_md(results, params), flush=True)
            for a, b in zip(results, results[1:]):
                if a.info.runtime == "llmedge" and a.ratio is not None:
                    summary.append((Path(model).name, backend, a.info.n_threads, a.test.name, a.avg_ts, b.avg_ts, a.ratio))
    print("### Summary (llmedge t/s / llama.cpp t/s)\n")
    print("| model | backend | threads | test | llmedge t/s | llama.cpp t/s | ratio |")
    print("| --- | --- | ---: | --- | ---: | ---: | ---: |")
    for model, backend, nt, test, ts_a, ts_b, ratio in summary:
        print(f"| {model} | {backend} | {nt} | {test} | {ts_a:.2f} | {ts_b:.2f} | {ratio:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
