"""``llmedge bench``: llama-bench's command line (``-p -n -d -r -t -b -ub -o``, and llama-batched-bench's
parallel sequences ``-np``) over :mod:`llmedge.bench`."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from llmedge.cli.options import ModelArg


def bench(
    model: ModelArg,
    n_prompt: Annotated[str, typer.Option("-p", "--n-prompt", help="Prompt tokens per pp test (list: 128,512).")]
    = "512",
    n_gen: Annotated[str, typer.Option("-n", "--n-gen", help="Generated tokens per tg test (list: 64,128).")]
    = "128",
    n_depth: Annotated[str, typer.Option(
        "-d", "--n-depth", help="Tokens already in the cache when a test starts (list: 0,2048).")] = "0",
    n_parallel: Annotated[str, typer.Option(
        "-np", "--n-parallel", help="Sequences decoded together in each tg test (list: 1,4): tgN xP reports "
                                    "their aggregate t/s.")] = "1",
    repetitions: Annotated[int, typer.Option("-r", "--repetitions", help="Timed runs of each test.")] = 5,
    threads: Annotated[str | None, typer.Option(
        "-t", "--threads", help="Thread counts (list: 1,2; default: physical cores).")] = None,
    batch_size: Annotated[int, typer.Option("-b", "--batch-size", help="Tokens per decode call (logical batch).")]
    = 2048,
    ubatch_size: Annotated[int, typer.Option("-ub", "--ubatch-size", help="Tokens per forward (physical batch).")]
    = 512,
    backend: Annotated[str, typer.Option("--backend", help="llmedge backend: auto, native, numba, mlx or numpy.")]
    = "auto",
    output: Annotated[str, typer.Option("-o", "--output", help="md, json, jsonl or csv.")] = "md",
    compare: Annotated[str | None, typer.Option(
        "--compare", help="Also run llama.cpp (llama-cpp-python), interleaved, and print ratios.")] = None,
    warmup: Annotated[bool, typer.Option("--warmup/--no-warmup", help="Run each test once untimed first.")] = True,
    rss_probe: Annotated[bool, typer.Option(
        "--rss-probe/--no-rss-probe",
        help="With --compare: measure each runtime's peak RSS in a fresh process.")] = True,
    progress: Annotated[bool, typer.Option("--progress", help="Print progress lines on stderr.")] = False,
    speculative: Annotated[bool, typer.Option(
        "--speculative", help="Instead: greedy decode rate on copy-heavy tasks, plain vs --lookup (and "
                              "--draft-model), with accepted tokens per forward. Its prompts are fixed: it takes "
                              "one -n and one -t value, -r, --backend, -o and --progress, and refuses the rest "
                              "(-p, -d, -np, -b, -ub, --compare, --no-warmup, --rss-probe).")] = False,
    draft_model: Annotated[str | None, typer.Option("--draft-model", help="With --speculative: a draft model.")]
    = None,
    context: typer.Context = None,
) -> None:
    """Benchmark prompt processing (ppN) and generation (tgN) as llama-bench does."""
    from llmedge.bench import OUTPUT_FORMATS, BenchParams, format_results, parse_int_list, run_bench
    from llmedge.errors import LlmedgeError

    if output not in OUTPUT_FORMATS:
        raise LlmedgeError(f"unknown output format '{output}' (choose from {', '.join(OUTPUT_FORMATS)})")
    if draft_model is not None and not speculative:
        raise LlmedgeError("--draft-model is for the speculative test: add --speculative")
    if speculative:
        from llmedge.bench import format_speculative, speculative_bench

        _refuse_for_speculative(context)
        gens, counts = parse_int_list(n_gen, "-n"), parse_int_list(threads, "-t") if threads else [None]
        for flag, values in (("-n", gens), ("-t", counts)):
            if len(values) > 1:
                raise LlmedgeError(f"--speculative takes one {flag} value, not a list of {len(values)}")

        def note(msg: str) -> None:
            if progress:
                sys.stderr.write(f"llmedge bench: {msg}\n")

        rows = speculative_bench(model, n_gen=gens[0], reps=repetitions, backend=backend, n_threads=counts[0],
                                 draft_model=draft_model, progress=note)
        sys.stdout.write(format_speculative(rows, output))
        return
    params = BenchParams(
        n_prompt=parse_int_list(n_prompt, "-p"), n_gen=parse_int_list(n_gen, "-n"), n_depth=parse_int_list(n_depth, "-d"),
        n_parallel=parse_int_list(n_parallel, "-np"),
        n_threads=parse_int_list(threads, "-t") if threads else [], n_batch=batch_size, n_ubatch=ubatch_size,
        reps=repetitions, backend=backend, warmup=warmup, compare=compare, rss_probe=rss_probe)

    def say(msg: str) -> None:
        sys.stderr.write(f"llmedge bench: {msg}\n")
        sys.stderr.flush()

    results = run_bench(model, params, progress=say if progress else None)
    sys.stdout.write(format_results(results, output, params))
    sys.stdout.flush()


# the llama-bench options the speculative test has no use for: its prompts and batches are its own
_NOT_SPECULATIVE = {"n_prompt": "-p", "n_depth": "-d", "n_parallel": "-np", "batch_size": "-b", "ubatch_size": "-ub",
                    "compare": "--compare", "warmup": "--warmup/--no-warmup",
                    "rss_probe": "--rss-probe/--no-rss-probe"}


def _refuse_for_speculative(context: typer.Context | None) -> None:
    """One line naming the first option given that --speculative would otherwise ignore."""
    from llmedge.errors import LlmedgeError

    if context is None:
        return
    for name, flag in _NOT_SPECULATIVE.items():
        source = context.get_parameter_source(name)  # typer may bundle its own click: match the enum by name
        if source is not None and source.name != "DEFAULT":
            raise LlmedgeError(f"{flag} does not apply to --speculative (it decodes its own copy-heavy prompts, "
                               "with -n, -r and -t); leave it out, or run the llama-bench tests without --speculative")
