"""``llmedge bench``: llama-bench's tests, statistics, field names and output formats.

The CLI runs on smollm2 with tiny settings (``-p 16 -n 4 -r 2``); nothing here asserts a speed.
The interleaving with llama.cpp is checked with recording runners, so it needs no llama.cpp.
"""

from __future__ import annotations

import csv
import io
import json
import re
import sys
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
from typer.testing import CliRunner

from llmedge.bench import (
    EXTRA_FIELDS,
    LLAMA_BENCH_FIELDS,
    BenchParams,
    BenchResult,
    BenchTest,
    RuntimeInfo,
    format_md,
    parse_int_list,
    run_tests,
)
from llmedge.errors import LlmedgeError

TINY = ["-p", "16", "-n", "4", "-r", "2", "-t", "2"]
INT_FIELDS = ("build_number", "n_batch", "n_ubatch", "n_threads", "poll", "model_size", "model_n_params",
              "n_gpu_layers", "main_gpu", "n_prompt", "n_gen", "n_depth", "avg_ns", "stddev_ns", "no_op_offload",
              "n_cpu_moe", "fit_target", "fit_min_ctx", "flash_attn")
BOOL_FIELDS = ("no_kv_offload", "cpu_strict", "embeddings", "no_host")


def _bench(*args: str) -> str:
    from llmedge.cli.main import app

    result = CliRunner().invoke(app, ["bench", *args])
    assert result.exit_code == 0, (result.output, result.exception)
    return result.stdout


def _file_totals(path: Path) -> tuple[int, int]:
    """Bytes and elements of every tensor, read with the ``gguf`` package (llama_model_size/n_params)."""
    r = gguf.GGUFReader(str(path))
    return sum(int(t.n_bytes) for t in r.tensors), sum(int(t.n_elements) for t in r.tensors)


@pytest.fixture(scope="module")
def json_records(smollm2_path: Path) -> list[dict]:
    return json.loads(_bench(str(smollm2_path), *TINY, "--backend", "native", "-o", "json"))


def test_bench_command_is_registered() -> None:
    from llmedge.cli.main import app

    names = [c.name for c in app.registered_commands]
    assert "bench" in names


def test_markdown_is_llama_bench_table_with_a_row_per_test(smollm2_path: Path) -> None:
    out = _bench(str(smollm2_path), *TINY)
    lines = out.splitlines()
    assert re.fullmatch(r"\| model +\| +size \| +params \| backend +\| threads \| +test \| +t/s \|", lines[0])
    assert lines[1] == ("| ------------------------------ | ---------: | ---------: | ---------- | ------: "
                        "| --------------: | -------------------: |")
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:4]]
    assert [r[5] for r in rows] == ["pp16", "tg4"]
    for model, size, params, backend, threads, _, ts in rows:
        assert model.startswith("llama ") and model.endswith(" Q4_1")
        assert re.fullmatch(r"\d+\.\d\d MiB", size) and re.fullmatch(r"\d+\.\d\d M", params)
        assert backend in ("native", "numba", "numpy") and threads == "2"
        mean, sd = re.fullmatch(r"(\d+\.\d\d) ± (\d+\.\d\d)", ts).groups()
        assert float(mean) > 0
    assert re.search(r"^llmedge \(.*2 threads\): load [\d.]+ ms, first call [\d.]+ ms, peak RSS [\d.]+ MiB$",
                     out, re.M)
    assert re.search(r"^a cache line's round trip between two cores: \d+ to \d+ ns", out, re.M)
    assert re.search(r"^build: llmedge-", out, re.M)


def test_json_has_llama_bench_fields_types_and_samples(json_records: list[dict], smollm2_path: Path) -> None:
    assert [(r["n_prompt"], r["n_gen"]) for r in json_records] == [(16, 0), (0, 4)]
    size, n_params = _file_totals(smollm2_path)
    for r in json_records:
        assert list(r) == [*LLAMA_BENCH_FIELDS, *EXTRA_FIELDS, "samples_ns", "samples_ts"]
        for f in INT_FIELDS:
            assert type(r[f]) is int, f
        for f in BOOL_FIELDS:
            assert type(r[f]) is bool, f
        assert isinstance(r["avg_ts"], float) and isinstance(r["stddev_ts"], float)
        assert r["model_filename"] == str(smollm2_path)
        assert r["model_size"] == size and r["model_n_params"] == n_params
        assert r["model_type"].endswith(" Q4_1")
        assert r["backends"] == "native" and r["runtime"] == "llmedge"
        assert r["n_threads"] == 2 and r["n_batch"] == 2048 and r["n_ubatch"] == 512
        assert r["type_k"] == r["type_v"] == "f16"
        assert r["ratio"] is None
        assert isinstance(r["core_rtt_ns"], float) and r["core_rtt_ns"] > 0  # two threads: measured
        assert r["load_ns"] > 0 and r["first_call_ns"] > 0 and r["warmup_ns"] > 0 and r["peak_rss_bytes"] > 0
        ns = r["samples_ns"]
        assert len(ns) == 2 and all(type(s) is int and s > 0 for s in ns)
        assert r["avg_ns"] == sum(ns) // 2
        n_tok = r["n_prompt"] + r["n_gen"]
        assert r["samples_ts"] == pytest.approx([1e9 * n_tok / s for s in ns])
        assert r["avg_ts"] == pytest.approx(np.mean(r["samples_ts"]))
        assert r["stddev_ts"] == pytest.approx(np.std(r["samples_ts"], ddof=1))
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", r["test_time"])


def test_csv_is_quoted_with_a_header_of_field_names(smollm2_path: Path) -> None:
    out = _bench(str(smollm2_path), *TINY, "-o", "csv")
    lines = out.splitlines()
    assert lines[0] == ",".join(LLAMA_BENCH_FIELDS + EXTRA_FIELDS)
    assert all(line.startswith('"') and line.endswith('"') for line in lines[1:])
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [(r["n_prompt"], r["n_gen"]) for r in rows] == [("16", "0"), ("0", "4")]
    for r in rows:
        assert r["cpu_strict"] == "0" and r["n_threads"] == "2"
        assert float(r["avg_ts"]) > 0 and re.fullmatch(r"\d+\.\d{6}", r["avg_ts"])
        assert int(r["avg_ns"]) > 0


def test_other_backend_and_batch_size_show_in_the_record(smollm2_path: Path) -> None:
    recs = json.loads(_bench(str(smollm2_path), "-p", "4", "-n", "0", "-r", "1", "-t", "1", "-b", "2",
                             "--no-warmup", "--backend", "numpy", "-o", "json"))
    assert len(recs) == 1
    assert recs[0]["backends"] == "numpy" and recs[0]["n_batch"] == 2 and recs[0]["n_threads"] == 1
    assert recs[0]["n_prompt"] == 4 and len(recs[0]["samples_ns"]) == 1 and recs[0]["warmup_ns"] == 0


def test_parallel_sequences_run_through_the_cli(smollm2_path: Path) -> None:
    recs = json.loads(_bench(str(smollm2_path), "-p", "0", "-n", "4", "-np", "1,3", "-r", "1", "-t", "2",
                             "--backend", "native", "-o", "json"))
    assert [(r["n_gen"], r["n_parallel"]) for r in recs] == [(4, 1), (4, 3)]
    assert all(r["avg_ts"] > 0 and len(r["samples_ns"]) == 1 for r in recs)
    out = _bench(str(smollm2_path), "-p", "0", "-n", "2", "-np", "2", "-r", "1", "--backend", "native")
    assert re.search(r"\| +tg2 x2 \|", out)


def test_compare_without_llama_cpp_is_a_one_line_error(smollm2_path: Path, monkeypatch, capsys) -> None:
    from llmedge.cli import main as cli_main

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # makes `import llama_cpp` raise ImportError
    monkeypatch.setattr(sys, "argv", ["llmedge", "bench", str(smollm2_path), *TINY, "--compare", "llama.cpp"])
    with pytest.raises(SystemExit) as exc:
        cli_main.main()
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("Error: --compare llama.cpp: llama-cpp-python is not importable")
    assert err.count("\n") == 1


def test_unknown_output_format_is_an_error(smollm2_path: Path) -> None:
    from llmedge.cli.main import app

    result = CliRunner().invoke(app, ["bench", str(smollm2_path), "-o", "xml"])
    assert result.exit_code != 0
    assert isinstance(result.exception, LlmedgeError) and "xml" in str(result.exception)


# ---- the scheduling, with recording runners (no model) ----------------------------------------


class Recorder:
    """A runner that records what the benchmark asks of it."""

    def __init__(self, name: str, log: list, n_vocab: int = 1000, bos: int | None = 1) -> None:
        self.info = RuntimeInfo(runtime=name, backend=name, model_filename="m.gguf", model_type="t",
                                model_size=1, model_n_params=1, build_commit="x")
        self.n_vocab, self.bos, self.log = n_vocab, bos, log
        self.ctx = None

    def first_call(self) -> int:
        return 1

    def begin(self, test: BenchTest, n_batch: int, n_ubatch: int) -> None:
        self.log.append((self.info.runtime, "begin", test.n_ctx) + ((test.n_parallel,) if test.n_parallel > 1 else ()))

    def clear(self) -> None:
        self.log.append((self.info.runtime, "clear"))

    def decode(self, tokens: np.ndarray, seq: int = 0) -> None:
        self.log.append((self.info.runtime, "decode", tuple(int(t) for t in tokens)) + ((seq,) if seq else ()))

    def decode_parallel(self, tokens: np.ndarray) -> None:
        self.log.append((self.info.runtime, "step", tuple(int(t) for t in tokens)))

    def end(self) -> None:
        self.log.append((self.info.runtime, "end"))

    def close(self) -> None:
        pass


def _runs(log: list, name: str) -> list[list[tuple]]:
    """Each clear-delimited run of ``name``: the token tuples it decoded."""
    runs: list[list[tuple]] = []
    for entry in log:
        if entry[0] != name:
            continue
        if entry[1] == "clear":
            runs.append([])
        elif entry[1] == "decode":
            runs[-1].append(entry[2])
    return runs


def test_prompt_test_is_bos_then_random_ids_in_batch_chunks_same_for_both_runtimes() -> None:
    log: list = []
    a, b = Recorder("llmedge", log), Recorder("llama.cpp", log)
    params = BenchParams(n_prompt=[10], n_gen=[], n_batch=4, reps=3)
    rows = run_tests([a, b], params.tests(), params)
    assert log[:2] == [("llmedge", "begin", 10), ("llama.cpp", "begin", 10)]
    runs_a, runs_b = _runs(log, "llmedge"), _runs(log, "llama.cpp")
    assert len(runs_a) == len(runs_b) == 4  # warm-up + 3 repetitions
    for run in runs_a:
        assert [len(c) for c in run] == [4, 4, 2]
        ids = [t for c in run for t in c]
        assert ids[0] == 1 and all(0 <= t < 1000 for t in ids)
    assert runs_a[1:] == runs_b[1:]  # the timed runs see the same ids
    assert len({tuple(r[0]) for r in runs_a[1:]}) == 3  # fresh random ids each repetition
    assert [len(r.samples_ns) for r in rows] == [3, 3]
    assert rows[0].ratio == pytest.approx(rows[0].avg_ts / rows[1].avg_ts) and rows[1].ratio is None


def test_generation_test_decodes_one_token_at_a_time_and_order_alternates() -> None:
    log: list = []
    a, b = Recorder("llmedge", log), Recorder("llama.cpp", log)
    params = BenchParams(n_prompt=[], n_gen=[5], reps=4)
    run_tests([a, b], params.tests(), params)
    runs = _runs(log, "llmedge")
    assert [len(r) for r in runs] == [1, 5, 5, 5, 5]  # llama-bench warms tg up with one step
    assert all(len(c) == 1 for r in runs for c in r) and all(r[0] == (1,) for r in runs)
    firsts = [e[0] for e in log if e[1] == "clear"][2:]  # after the two warm-ups
    assert firsts == ["llmedge", "llama.cpp", "llama.cpp", "llmedge", "llmedge", "llama.cpp", "llama.cpp",
                      "llmedge"]
    assert [e for e in log if e[1] == "end"] == [("llmedge", "end"), ("llama.cpp", "end")]


class SlowPrompts(Recorder):
    """A runner whose multi-token decodes (a prompt or a depth) take 0.3 s."""

    def decode(self, tokens: np.ndarray, seq: int = 0) -> None:
        super().decode(tokens, seq)
        if len(tokens) > 1:
            time.sleep(0.3)


def test_depth_fills_the_cache_untimed_before_each_repetition() -> None:
    """llama-bench's -d: every repetition clears the cache, evaluates n_depth random tokens (BOS first)
    in batch chunks before the clock starts, then runs the test; warm-ups run at no depth; the test's
    name and record carry the depth; the context holds depth + test tokens."""
    log: list = []
    params = BenchParams(n_prompt=[], n_gen=[3], n_depth=[0, 6], n_batch=4, reps=2)
    tests = params.tests()
    assert [t.name for t in tests] == ["tg3", "tg3 @ d6"]
    runner = SlowPrompts("llmedge", log)
    rows = run_tests([runner], tests, params)
    assert [e for e in log if e[1] == "begin"] == [("llmedge", "begin", 3), ("llmedge", "begin", 9)]
    deep = _runs(log[log.index(("llmedge", "begin", 9)):], "llmedge")
    assert [len(r) for r in deep] == [1, 2 + 3, 2 + 3]  # warm-up: one step; then 4 + 2 depth tokens, 3 steps
    for run in deep[1:]:
        assert [len(c) for c in run] == [4, 2, 1, 1, 1]
        assert run[0][0] == 1  # BOS opens the depth, not the generation
    assert rows[1].fields()["n_depth"] == 6 and rows[0].fields()["n_depth"] == 0
    # the depth's 0.6 s of (slow) prompt decoding is outside the clock
    assert all(ns < 0.25e9 for ns in rows[1].samples_ns), rows[1].samples_ns
    assert rows[1].avg_ts > 0
    with pytest.raises(LlmedgeError, match="-d"):
        BenchParams(n_depth=[-1]).validate()


def test_parallel_generation_steps_every_sequence_after_its_own_depth() -> None:
    """-np (llama-batched-bench's parallel sequences): a tg test per value; each repetition clears every
    sequence, fills each to the depth with its own tokens (BOS first, in batch chunks, untimed), then
    decodes one token of every sequence per step; both runtimes see the same ids; t/s counts every
    sequence's tokens; the name and record carry the count."""
    log: list = []
    params = BenchParams(n_prompt=[4], n_gen=[3], n_depth=[0, 5], n_parallel=[1, 2], n_batch=4, reps=2)
    tests = params.tests()
    assert [t.name for t in tests] == ["pp4", "pp4 @ d5", "tg3", "tg3 @ d5", "tg3 x2", "tg3 x2 @ d5"]
    assert [t.n_tokens for t in tests] == [4, 4, 3, 3, 6, 6]
    a, b = SlowPrompts("llmedge", log), Recorder("llama.cpp", log)
    rows = run_tests([a, b], tests[-1:], params)
    assert log[:2] == [("llmedge", "begin", 8, 2), ("llama.cpp", "begin", 8, 2)]
    runs = {name: [] for name in ("llmedge", "llama.cpp")}
    for entry in log:
        if entry[1] == "clear":
            runs[entry[0]].append([])
        elif entry[1] in ("decode", "step"):
            runs[entry[0]][-1].append(entry[1:])
    warm, *timed = runs["llmedge"]
    assert [e[0] for e in warm] == ["step"] and len(warm[0][1]) == 2  # warm-up: one step, no depth
    assert len(timed) == 2 and runs["llama.cpp"][1:] == timed  # the same ids for both runtimes
    for run in timed:
        depth = [e for e in run if e[0] == "decode"]
        steps = [e[1] for e in run if e[0] == "step"]
        assert [(len(e[1]), e[2] if len(e) > 2 else 0) for e in depth] == [(4, 0), (1, 0), (4, 1), (1, 1)]
        assert depth[0][1][0] == depth[2][1][0] == 1  # BOS opens each sequence's depth
        assert depth[0][1] + depth[1][1] != depth[2][1] + depth[3][1]  # each sequence its own tokens
        assert run[:4] == [tuple(e) for e in depth] and len(steps) == 3 and all(len(t) == 2 for t in steps)
    assert timed[0] != timed[1]  # fresh ids each repetition
    # the depth's slow prompts are outside the clock; t/s counts both sequences' tokens
    assert all(ns < 0.25e9 for ns in rows[0].samples_ns)
    assert rows[0].samples_ts == pytest.approx([6e9 / ns for ns in rows[0].samples_ns])
    assert rows[0].fields()["n_parallel"] == 2 and rows[0].fields()["n_gen"] == 3
    for bad in ([0], [], [65]):
        with pytest.raises(LlmedgeError, match="-np"):
            BenchParams(n_parallel=bad).validate()


def test_parallel_generation_without_depth_starts_each_sequence_from_bos() -> None:
    log: list = []
    params = BenchParams(n_prompt=[], n_gen=[2], n_parallel=[3], reps=1, warmup=False)
    run_tests([Recorder("llmedge", log)], params.tests(), params)
    steps = [e[2] for e in log if e[1] == "step"]
    assert len(steps) == 2 and steps[0] == (1, 1, 1) and all(0 <= t < 1000 for t in steps[1])


def test_no_warmup_and_no_bos() -> None:
    log: list = []
    params = BenchParams(n_prompt=[3], n_gen=[2], reps=1, warmup=False)
    run_tests([Recorder("llmedge", log, n_vocab=5, bos=None)], params.tests(), params)
    runs = _runs(log, "llmedge")
    assert [len(r) for r in runs] == [1, 2]
    assert all(0 <= t < 5 for r in runs for c in r for t in c)


def test_statistics_are_llama_bench_s() -> None:
    info = RuntimeInfo("llmedge", "native", "m", "t", 1, 1, "x")
    r = BenchResult(info, BenchTest(n_gen=100), 2048, 512, "f16", "now", samples_ns=[1_000_000_001, 2_000_000_000,
                                                                                     4_000_000_000])
    assert r.avg_ns == 7_000_000_001 // 3
    assert r.stddev_ns == int(np.std([1_000_000_001, 2_000_000_000, 4_000_000_000], ddof=1))
    assert r.samples_ts == pytest.approx([100 / 1.000000001, 50.0, 25.0])
    assert r.avg_ts == pytest.approx(np.mean(r.samples_ts))
    assert r.stddev_ts == pytest.approx(np.std(r.samples_ts, ddof=1))
    single = BenchResult(info, BenchTest(n_prompt=8), 2048, 512, "f16", "now", samples_ns=[5])
    assert single.stddev_ts == 0.0 and single.stddev_ns == 0


def test_markdown_compare_table_lists_ratios() -> None:
    a = RuntimeInfo("llmedge", "native", "m", "llama 135M Q4_1", 96576768, 134515008, "llmedge-0", n_threads=2)
    b = RuntimeInfo("llama.cpp", "CPU", "m", "llama 256M Q4_1", 96576768, 134515008, "lcp", n_threads=2)
    ra = BenchResult(a, BenchTest(n_gen=128), 2048, 512, "f16", "now", samples_ns=[1_000_000_000] * 2, ratio=2.0)
    rb = BenchResult(b, BenchTest(n_gen=128), 2048, 512, "f16", "now", samples_ns=[2_000_000_000] * 2)
    out = format_md([ra, rb])
    assert "|  92.10 MiB |   134.52 M | native     |       2 |           tg128 |        128.00 ± 0.00 |" in out
    assert "| llama.cpp  |       2 |           tg128 |         64.00 ± 0.00 |" in out
    assert re.search(r"\| native +\| +2 \| +tg128 \| +128\.00 ± 0\.00 \| +64\.00 ± 0\.00 \| +2\.00x \|", out)


def test_int_lists_follow_llama_bench_syntax() -> None:
    assert parse_int_list("512") == [512]
    assert parse_int_list("128,512") == [128, 512]
    assert parse_int_list("1-4") == [1, 2, 3, 4]
    assert parse_int_list("1-8*2") == [1, 2, 4, 8]
    assert parse_int_list("0-10+5") == [0, 5, 10]
    for bad in ("", "a", "1,,2", "4-8*1", "-3"):
        with pytest.raises(LlmedgeError):
            parse_int_list(bad)


def test_invalid_parameters_are_rejected() -> None:
    for params in (BenchParams(reps=0), BenchParams(n_prompt=[0], n_gen=[0]), BenchParams(n_threads=[0]),
                   BenchParams(compare="vllm")):
        with pytest.raises(LlmedgeError):
            params.validate()


@pytest.mark.parametrize(("args", "message"), [
    (["-r", "0"], "repetitions (-r) must be at least 1"),
    (["-n", "0"], "nothing to run"),
    (["-t", "0"], "thread counts (-t) must be at least 1"),
])
def test_speculative_test_refuses_what_it_cannot_run(smollm2_path: Path, args: list[str], message: str) -> None:
    """-r 0 failed with "KeyError: 'plain'" after loading the model, -n 0 printed a table of zeros and
    -t 0 ran where the llama-bench tests refuse it: now one clear error each, before loading."""
    from llmedge.cli.main import app

    result = CliRunner().invoke(app, ["bench", str(smollm2_path), "--speculative", "-r", "1", "-n", "4", *args])
    assert result.exit_code != 0 and result.stdout == ""
    assert isinstance(result.exception, LlmedgeError) and message in str(result.exception)


@pytest.mark.parametrize(("args", "flag"), [
    (["-p", "64"], "-p"), (["-d", "128"], "-d"), (["-np", "4"], "-np"), (["-p", "512"], "-p"), (["-b", "64"], "-b"), (["-ub", "64"], "-ub"),
    (["--compare", "llama.cpp"], "--compare"), (["--no-warmup"], "--warmup/--no-warmup"),
    (["--no-rss-probe"], "--rss-probe/--no-rss-probe"),
])
def test_speculative_test_refuses_the_llama_bench_options_it_would_ignore(smollm2_path: Path, args: list[str],
                                                                          flag: str) -> None:
    """--speculative -p 64 -d 128 ran its own fixed prompts from an empty cache and printed a table as
    if -p and -d had been used: now the option is named and nothing runs (even -p given at its default)."""
    from llmedge.cli.main import app

    result = CliRunner().invoke(app, ["bench", str(smollm2_path), "--speculative", "-r", "1", "-n", "4", *args])
    assert result.exit_code != 0 and result.stdout == ""
    assert isinstance(result.exception, LlmedgeError)
    assert str(result.exception).startswith(f"{flag} does not apply to --speculative")


@pytest.mark.parametrize(("args", "message"), [
    (["--speculative", "-n", "4,8"], "--speculative takes one -n value, not a list of 2"),
    (["--speculative", "-n", "4", "-t", "1,2"], "--speculative takes one -t value, not a list of 2"),
    (["--draft-model", "x.gguf", "-p", "16", "-n", "4"], "--draft-model is for the speculative test"),
])
def test_speculative_lists_and_a_draft_model_without_it_are_refused(smollm2_path: Path, args: list[str],
                                                                     message: str) -> None:
    """Only the first -n and -t values were run; --draft-model without --speculative was ignored."""
    from llmedge.cli.main import app

    result = CliRunner().invoke(app, ["bench", str(smollm2_path), "-r", "1", *args])
    assert result.exit_code != 0 and result.stdout == ""
    assert isinstance(result.exception, LlmedgeError) and message in str(result.exception)
