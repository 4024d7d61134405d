"""``llmedge bench``: llama-bench's tests, statistics and output formats, optionally side by side
with llama.cpp (through llama-cpp-python) in the same process.

What it owns: the prompt-processing test (``ppN``: N random token ids evaluated as one prompt in
``n_batch`` chunks, on an empty cache), the generation test (``tgN``: after an empty cache, N
single-token decode steps starting from BOS), either at a depth (llama-bench's ``-d``: ``tg128 @ d2048``
runs after 2048 random tokens were evaluated, untimed, in the cache), the parallel generation test
(``-np``, llama-batched-bench's parallel sequences: ``tg128 x4`` decodes 4 sequences together, each
with its own cache and its own tokens, one token per sequence per step, and reports their aggregate
tokens per second; each is filled to the depth first, untimed), the warm-up runs, mean and sample standard deviation
exactly as llama-bench computes them, the records with llama-bench's field names, and the
``md``/``json``/``jsonl``/``csv`` printers. A :class:`Runner` is one runtime under test: llmedge
(:class:`LlmedgeRunner`, through ``llmedge.load`` and ``engine.forward``) or llama.cpp
(:class:`LlamaCppRunner`, through llama-cpp-python's low-level ``llama_decode``). With several runners
every repetition runs once per runner, alternating which goes first, with the same token ids.

Besides tokens per second it reports the model load time, the part of it the backend spent compiling
or loading its JIT kernels from the disk cache (``compile_ns``: the numba backend's
``compile_seconds``; 0 for the others), the time of the first forward call (first touch of the
mapped weights) and the peak resident set size. The peak RSS of
one process that holds two runtimes says nothing about either, so when comparing, each runtime's
peak is measured in a fresh child process running the same tests once (``python -m llmedge.bench
--probe``).
"""

from __future__ import annotations

import csv
import ctypes
import gc
import io
import json
import os
import platform
import re
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from llmedge.errors import LlmedgeError

OUTPUT_FORMATS = ("md", "json", "jsonl", "csv")
MAX_PARALLEL = 64  # sequences of a parallel generation test (-np)
COMPARE_TARGETS = ("llama.cpp",)

# llama-bench's record fields, in its order (tools/llama-bench/llama-bench.cpp, test::get_fields)
LLAMA_BENCH_FIELDS = (
    "build_commit", "build_number", "cpu_info", "gpu_info", "backends",
    "model_filename", "model_type", "model_size", "model_n_params", "n_batch",
    "n_ubatch", "n_threads", "cpu_mask", "cpu_strict", "poll",
    "type_k", "type_v", "n_gpu_layers", "n_cpu_moe", "split_mode",
    "main_gpu", "no_kv_offload", "flash_attn", "devices", "tensor_split",
    "tensor_buft_overrides", "load_mode", "embeddings",
    "no_op_offload", "no_host", "fit_target", "fit_min_ctx",
    "n_prompt", "n_gen", "n_depth",
    "test_time", "avg_ns", "stddev_ns", "avg_ts", "stddev_ts",
)
# what llmedge adds after them
EXTRA_FIELDS = ("runtime", "isa", "load_ns", "compile_ns", "first_call_ns", "warmup_ns", "peak_rss_bytes", "ratio",
                "load_avg", "core_rtt_ns", "n_parallel")
_BOOL_FIELDS = {"cpu_strict", "no_kv_offload", "embeddings", "no_host"}

# llama.cpp's llama_ftype names (llama_model_ftype_name), keyed by general.file_type
FTYPE_NAMES = {
    0: "all F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1",
    10: "Q2_K - Medium", 11: "Q3_K - Small", 12: "Q3_K - Medium", 13: "Q3_K - Large",
    14: "Q4_K - Small", 15: "Q4_K - Medium", 16: "Q5_K - Small", 17: "Q5_K - Medium", 18: "Q6_K",
    19: "IQ2_XXS - 2.0625 bpw", 20: "IQ2_XS - 2.3125 bpw", 21: "Q2_K - Small", 22: "IQ3_XS - 3.3 bpw",
    23: "IQ3_XXS - 3.0625 bpw", 24: "IQ1_S - 1.5625 bpw", 25: "IQ4_NL - 4.5 bpw", 26: "IQ3_S - 3.4375 bpw",
    27: "IQ3_S mix - 3.66 bpw", 28: "IQ2_S - 2.5 bpw", 29: "IQ2_M - 2.7 bpw", 30: "IQ4_XS - 4.25 bpw",
    31: "IQ1_M - 1.75 bpw", 32: "BF16", 36: "TQ1_0 - 1.69 bpw ternary", 37: "TQ2_0 - 2.06 bpw ternary",
    38: "MXFP4 MoE",
}

# pause between two timed runs of different runtimes, so one runtime's spinning worker threads
# (OpenMP's, llmedge's pool) have gone to sleep before the other starts its clock
_SWITCH_PAUSE_S = 0.02


# ---------------------------------------------------------------------------------------------
# parameters and tests


@dataclass(frozen=True)
class BenchTest:
    """One llama-bench test: ``n_prompt`` tokens as a prompt, or ``n_gen`` single-token decodes, after
    ``n_depth`` tokens already in the cache (evaluated before the clock starts); a generation test of
    ``n_parallel`` sequences decodes them together, one token of each per step."""

    n_prompt: int = 0
    n_gen: int = 0
    n_depth: int = 0
    n_parallel: int = 1

    @property
    def name(self) -> str:
        if self.n_prompt and not self.n_gen:
            name = f"pp{self.n_prompt}"
        elif self.n_gen and not self.n_prompt:
            name = f"tg{self.n_gen}"
        else:
            name = f"pp{self.n_prompt}+tg{self.n_gen}"
        if self.n_parallel > 1:
            name += f" x{self.n_parallel}"
        return f"{name} @ d{self.n_depth}" if self.n_depth else name

    @property
    def n_ctx(self) -> int:
        """Cells of each sequence's cache."""
        return self.n_depth + self.n_prompt + self.n_gen

    @property
    def n_tokens(self) -> int:
        """Tokens a repetition evaluates in its timed part (every sequence's)."""
        return self.n_prompt + self.n_gen * self.n_parallel


@dataclass
class BenchParams:
    """What to run: llama-bench's defaults (``-p 512 -n 128 -r 5 -b 2048 -ub 512``)."""

    n_prompt: list[int] = field(default_factory=lambda: [512])
    n_gen: list[int] = field(default_factory=lambda: [128])
    n_depth: list[int] = field(default_factory=lambda: [0])
    n_parallel: list[int] = field(default_factory=lambda: [1])  # sequences decoded together (tg tests)
    n_threads: list[int] = field(default_factory=list)  # empty: physical cores
    n_batch: int = 2048
    n_ubatch: int = 512
    reps: int = 5
    backend: str = "auto"
    kv_type: str = "f16"
    warmup: bool = True
    seed: int = 1
    compare: str | None = None
    rss_probe: bool = True

    def tests(self) -> list[BenchTest]:
        """llama-bench's order: every prompt test, then every generation test (zeros skipped), each
        at every depth; a generation test once per ``n_parallel`` value."""
        return [BenchTest(n_prompt=p, n_depth=d) for p in self.n_prompt if p > 0 for d in self.n_depth] + \
               [BenchTest(n_gen=g, n_depth=d, n_parallel=k) for g in self.n_gen if g > 0 for k in self.n_parallel
                for d in self.n_depth]

    def validate(self) -> None:
        if self.reps < 1:
            raise LlmedgeError("the number of repetitions (-r) must be at least 1")
        if self.n_batch < 1 or self.n_ubatch < 1:
            raise LlmedgeError("the batch sizes (-b, -ub) must be at least 1")
        if any(t < 1 for t in self.n_threads):
            raise LlmedgeError("thread counts (-t) must be at least 1")
        if any(n < 0 for n in self.n_prompt + self.n_gen + self.n_depth):
            raise LlmedgeError("token counts (-p, -n, -d) cannot be negative")
        if not self.n_parallel or any(k < 1 or k > MAX_PARALLEL for k in self.n_parallel):
            raise LlmedgeError(f"parallel sequences (-np) must be from 1 to {MAX_PARALLEL}")
        if not self.n_depth:
            raise LlmedgeError("no depth to run at: give -d at least one value (0: an empty cache)")
        if not self.tests():
            raise LlmedgeError("nothing to run: every -p and -n value is 0")
        if self.compare is not None and self.compare not in COMPARE_TARGETS:
            raise LlmedgeError(f"cannot compare with '{self.compare}' (supported: {', '.join(COMPARE_TARGETS)})")


def parse_int_list(text: str | int | Sequence[int], what: str = "value") -> list[int]:
    """llama-bench's integer lists: ``512``, ``128,256``, ranges ``first-last`` with ``+step`` or ``*step``."""
    if isinstance(text, int):
        return [text]
    if not isinstance(text, str):
        return [int(v) for v in text]
    out: list[int] = []
    for part in text.split(","):
        m = _RANGE.fullmatch(part.strip())
        if m is None:
            raise LlmedgeError(f"invalid {what} list '{text}' (expected N, N,M or first-last[+step|*step])")
        first = int(m[1])
        last = int(m[2]) if m[2] else first
        op, step = m[3] or "+", int(m[4]) if m[4] else 1
        i = first
        while i <= last:
            out.append(i)
            nxt = i + step if op == "+" else i * step
            if nxt <= i:
                raise LlmedgeError(f"invalid {what} range '{part}'")
            i = nxt
    return out


_RANGE = re.compile(r"(\d+)(?:-(\d+)(?:([+*])(\d+))?)?")


# ---------------------------------------------------------------------------------------------
# statistics (as llama-bench: integer mean of nanoseconds, sample standard deviation)


def _avg(v: Sequence[float]) -> float:
    return sum(v) / len(v) if v else 0.0


def _stdev(v: Sequence[float]) -> float:
    n = len(v)
    if n <= 1:
        return 0.0
    mean = _avg(v)
    var = sum((x - mean) ** 2 for x in v) / (n - 1)
    return var ** 0.5


# ---------------------------------------------------------------------------------------------
# results


@dataclass
class RuntimeInfo:
    """What a runtime says about itself and the loaded model (the constant part of a record)."""

    runtime: str  # "llmedge" or "llama.cpp"
    backend: str  # llama-bench's "backends": native, numba, numpy; "CPU" for llama.cpp
    model_filename: str
    model_type: str
    model_size: int
    model_n_params: int
    build_commit: str
    build_number: int = 0
    flash_attn: int = 0
    isa: str = ""
    n_threads: int = 1
    load_ns: int = 0
    compile_ns: int = 0  # JIT compile or cache load of the backend's kernels (numba), part of load_ns
    first_call_ns: int = 0
    peak_rss_bytes: int = 0


@dataclass
class BenchResult:
    """One row: a test run ``reps`` times by one runtime."""

    info: RuntimeInfo
    test: BenchTest
    n_batch: int
    n_ubatch: int
    kv_type: str
    test_time: str
    samples_ns: list[int] = field(default_factory=list)
    warmup_ns: int = 0
    ratio: float | None = None  # llmedge t/s over the compared runtime's, on llmedge's rows
    load_avg: float | None = None  # the system's 1-minute load average when the test started
    core_rtt_ns: float | None = None  # a cache line's round trip between two cores then (core_round_trip)

    @property
    def avg_ns(self) -> int:
        return int(sum(self.samples_ns) // len(self.samples_ns)) if self.samples_ns else 0

    @property
    def stddev_ns(self) -> int:
        return int(_stdev([float(s) for s in self.samples_ns]))

    @property
    def samples_ts(self) -> list[float]:
        return [1e9 * self.test.n_tokens / s for s in self.samples_ns if s > 0]

    @property
    def avg_ts(self) -> float:
        return _avg(self.samples_ts)

    @property
    def stddev_ts(self) -> float:
        return _stdev(self.samples_ts)

    def fields(self) -> dict[str, Any]:
        """llama-bench's fields in its order, then llmedge's extras (typed as in llama-bench's JSON)."""
        i = self.info
        rec: dict[str, Any] = {
            "build_commit": i.build_commit, "build_number": i.build_number, "cpu_info": cpu_info(),
            "gpu_info": "", "backends": i.backend, "model_filename": i.model_filename,
            "model_type": i.model_type, "model_size": i.model_size, "model_n_params": i.model_n_params,
            "n_batch": self.n_batch, "n_ubatch": self.n_ubatch, "n_threads": i.n_threads,
            "cpu_mask": "0x0", "cpu_strict": False, "poll": 50, "type_k": self.kv_type, "type_v": self.kv_type,
            "n_gpu_layers": 0, "n_cpu_moe": 0, "split_mode": "layer", "main_gpu": 0, "no_kv_offload": False,
            "flash_attn": i.flash_attn, "devices": "none", "tensor_split": "0.00", "tensor_buft_overrides": "none",
            "load_mode": "mmap", "embeddings": False, "no_op_offload": 0, "no_host": False,
            "fit_target": 0, "fit_min_ctx": 0,
            "n_prompt": self.test.n_prompt, "n_gen": self.test.n_gen, "n_depth": self.test.n_depth,
            "test_time": self.test_time, "avg_ns": self.avg_ns, "stddev_ns": self.stddev_ns,
            "avg_ts": self.avg_ts, "stddev_ts": self.stddev_ts,
            "runtime": i.runtime, "isa": i.isa, "load_ns": i.load_ns, "compile_ns": i.compile_ns,
            "first_call_ns": i.first_call_ns,
            "warmup_ns": self.warmup_ns, "peak_rss_bytes": i.peak_rss_bytes, "ratio": self.ratio,
            "load_avg": self.load_avg, "core_rtt_ns": self.core_rtt_ns, "n_parallel": self.test.n_parallel,
        }
        assert tuple(rec) == LLAMA_BENCH_FIELDS + EXTRA_FIELDS
        return rec


def cpu_info() -> str:
    """The CPU's model name, as llama-bench's ``cpu_info`` (from /proc/cpuinfo where there is one)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def peak_rss_bytes() -> int:
    """This process's peak resident set size so far.

    Linux: ``VmHWM`` of /proc/self/status. ``getrusage``'s ``ru_maxrss`` is not used there because a
    child started with vfork/exec inherits its parent's peak in it. Elsewhere: ``getrusage``.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(r) if sys.platform == "darwin" else int(r) * 1024


def load_average() -> float | None:
    """The 1-minute system load average (a busy machine makes every timing here noisy)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def core_round_trip() -> float | None:
    """A cache line's round trip between two cores (two threads of llmedge's native pool), in ns; None
    without the native library or with one thread. Where it is several times its low, the cores do not
    share a cache and multi-sequence steps (``-np``) scale less (:func:`llmedge.backends.native.core_round_trip_ns`)."""
    from llmedge.backends.native import core_round_trip_ns

    return core_round_trip_ns()


# ---------------------------------------------------------------------------------------------
# runtimes


class Runner(Protocol):
    """One runtime under test, holding one loaded model."""

    info: RuntimeInfo
    n_vocab: int
    bos: int | None  # the token that starts a sequence (None: the model adds no BOS)

    def first_call(self) -> int:
        """Decode one token in a fresh context; its wall time in ns (compiles, first touch of weights)."""
        ...

    def begin(self, test: BenchTest, n_batch: int, n_ubatch: int) -> None:
        """Make the context (cache) a test runs in: ``test.n_ctx`` cells for each of its ``n_parallel``
        sequences."""
        ...

    def clear(self) -> None:
        """Empty the context's KV cache (every sequence's)."""
        ...

    def decode(self, tokens: np.ndarray, seq: int = 0) -> None:
        """Evaluate ``tokens`` (at most ``n_batch``) after what sequence ``seq`` holds; wait for the result."""
        ...

    def decode_parallel(self, tokens: np.ndarray) -> None:
        """One step of every sequence: ``tokens[s]`` after what sequence ``s`` holds, in one batch."""
        ...

    def end(self) -> None:
        """Free the test's context."""
        ...

    def close(self) -> None:
        ...


def _model_type(gguf: Any) -> str:
    """llama.cpp's ``llama_model_desc`` shape: architecture, size label, file type name."""
    arch = gguf.architecture
    label = gguf.get("general.size_label") or _size_label(sum(t.n_elements for t in gguf.tensors.values()))
    ftype = gguf.get("general.file_type")
    ftype_name = FTYPE_NAMES.get(int(ftype), f"ftype {ftype}") if ftype is not None else "?"
    return f"{arch} {label} {ftype_name}"


def _size_label(n: int) -> str:
    return f"{n / 1e9:.0f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


class LlmedgeRunner:
    """llmedge through its public API: ``llmedge.load``, ``make_cache`` and ``engine.forward``."""

    def __init__(self, model: str | os.PathLike[str], backend: str = "auto", n_threads: int | None = None,
                 kv_type: str = "f16", n_ctx: int = 512) -> None:
        import llmedge

        t0 = time.perf_counter_ns()
        self.model = llmedge.load(str(model), backend=backend, n_ctx=max(8, n_ctx), n_threads=n_threads,
                                  kv_type=kv_type)
        load_ns = time.perf_counter_ns() - t0
        m = self.model
        self.kv_type = kv_type
        self.n_vocab = m.params.n_vocab
        tok = m.tokenizer
        self.bos = tok.bos_id if tok.add_bos and tok.bos_id is not None else None
        be = m.backend
        g = m.gguf
        self.info = RuntimeInfo(
            runtime="llmedge", backend=m.backend_name, model_filename=str(m.path), model_type=_model_type(g),
            model_size=sum(int(t.n_bytes) for t in g.tensors.values()),
            model_n_params=sum(int(t.n_elements) for t in g.tensors.values()),
            build_commit=f"llmedge-{llmedge.__version__}", isa=str(getattr(be, "isa", "") or ""),
            n_threads=int(getattr(be, "n_threads", n_threads or 0) or 0), load_ns=load_ns,
            compile_ns=int(1e9 * float(getattr(be, "compile_seconds", 0.0) or 0.0)))
        self.caches: list[Any] = []

    def first_call(self) -> int:
        cache = self.model.model.make_cache(8, self.kv_type, 8)
        tok = self.bos if self.bos is not None else 0
        t0 = time.perf_counter_ns()
        self.model.engine.forward(cache, [tok])
        return time.perf_counter_ns() - t0

    def begin(self, test: BenchTest, n_batch: int, n_ubatch: int) -> None:
        chunk = max(1, min(n_batch, n_ubatch))
        self.model.engine.n_batch = chunk  # the physical batch: engine.forward evaluates in chunks of this
        self.caches = [self.model.model.make_cache(test.n_ctx, self.kv_type, chunk) for _ in range(test.n_parallel)]

    def clear(self) -> None:
        for c in self.caches:
            c.clear()

    def decode(self, tokens: np.ndarray, seq: int = 0) -> None:
        self.model.engine.forward(self.caches[seq], tokens.tolist())

    def decode_parallel(self, tokens: np.ndarray) -> None:
        self.model.engine.forward_parallel(self.caches, tokens.tolist())

    def end(self) -> None:
        self.caches = []

    def close(self) -> None:
        self.caches = []
        self.model = None


def llama_cpp_available() -> tuple[bool, str]:
    """Whether llama-cpp-python can be imported here, and if not, why."""
    try:
        import llama_cpp  # noqa: F401
    except Exception as e:  # ImportError, or its shared library failing to load
        return False, f"llama-cpp-python is not importable ({type(e).__name__}: {e})"
    return True, "llama-cpp-python " + getattr(sys.modules["llama_cpp"], "__version__", "?")


class LlamaCppRunner:
    """llama.cpp through llama-cpp-python's C API, at its best CPU settings (flash attention on).

    Tests run as llama-bench runs them: a context of ``n_prompt + n_gen`` cells per test,
    ``llama_memory_clear`` before every repetition, ``llama_decode`` of ``llama_batch_get_one``. A
    parallel test runs as llama-batched-bench's: a context of that many cells per sequence
    (``n_seq_max`` sequences), each step one ``llama_batch`` of one token per sequence, every row's
    logits asked for.
    """

    def __init__(self, path: str | os.PathLike[str], n_threads: int, flash_attn: bool = True) -> None:
        import llama_cpp as L

        self.L = L
        self.n_threads = n_threads
        self.flash_attn = flash_attn
        L.llama_backend_init()
        # keep a reference: ctypes callbacks must outlive their registration
        self._log_cb = L.llama_log_callback(lambda level, text, user_data: None)
        L.llama_log_set(self._log_cb, ctypes.c_void_p(0))
        mp = L.llama_model_default_params()
        t0 = time.perf_counter_ns()
        self.lmodel = L.llama_model_load_from_file(str(path).encode(), mp)
        load_ns = time.perf_counter_ns() - t0
        if not self.lmodel:
            raise LlmedgeError(f"llama.cpp failed to load {path}")
        vocab = L.llama_model_get_vocab(self.lmodel)
        self.n_vocab = int(L.llama_vocab_n_tokens(vocab))
        self.bos = int(L.llama_vocab_bos(vocab)) if L.llama_vocab_get_add_bos(vocab) else None
        buf = ctypes.create_string_buffer(256)
        L.llama_model_desc(self.lmodel, buf, ctypes.sizeof(buf))
        self.info = RuntimeInfo(
            runtime="llama.cpp", backend="CPU", model_filename=str(path),
            model_type=buf.value.decode("utf-8", "replace"), model_size=int(L.llama_model_size(self.lmodel)),
            model_n_params=int(L.llama_model_n_params(self.lmodel)),
            build_commit=f"llama-cpp-python-{getattr(L, '__version__', '?')}",
            flash_attn=1 if flash_attn else 0, isa=_llama_cpp_isa(L), n_threads=n_threads, load_ns=load_ns)
        self.ctx = None
        self.batch: Any = None  # a parallel test's llama_batch
        self.n_seq = 1
        self.pos = [0]  # each sequence's next position (a parallel test's batches name them)

    def _new_context(self, n_ctx: int, n_batch: int, n_ubatch: int, n_seq: int = 1) -> Any:
        L = self.L
        cp = L.llama_context_default_params()
        cp.n_ctx = n_ctx * n_seq  # split evenly between the sequences (llama.cpp's per-sequence KV)
        cp.n_seq_max = n_seq
        cp.n_batch = n_batch
        cp.n_ubatch = n_ubatch
        cp.n_threads = cp.n_threads_batch = self.n_threads
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED if self.flash_attn else L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cp.type_k = cp.type_v = 1  # GGML_TYPE_F16, llama-bench's default
        cp.no_perf = True
        ctx = L.llama_init_from_model(self.lmodel, cp)
        if not ctx:
            raise LlmedgeError("llama.cpp failed to create a context")
        return ctx

    def first_call(self) -> int:
        ctx = self._new_context(8, 8, 8)
        try:
            tok = self.bos if self.bos is not None else 0
            arr = (self.L.llama_token * 1)(tok)
            t0 = time.perf_counter_ns()
            self._decode(ctx, arr, 1)
            return time.perf_counter_ns() - t0
        finally:
            self.L.llama_free(ctx)

    def begin(self, test: BenchTest, n_batch: int, n_ubatch: int) -> None:
        self.n_seq = test.n_parallel
        self.ctx = self._new_context(test.n_ctx, n_batch, n_ubatch, self.n_seq)
        self.mem = self.L.llama_get_memory(self.ctx)
        if self.n_seq > 1:
            self.batch = self.L.llama_batch_init(max(n_batch, self.n_seq), 0, 1)
        self.pos = [0] * self.n_seq

    def clear(self) -> None:
        self.L.llama_memory_clear(self.mem, False)
        self.pos = [0] * self.n_seq

    def _submit(self, ctx: Any, batch: Any) -> None:
        """``llama_decode`` of ``batch``, and wait for its result."""
        rc = self.L.llama_decode(ctx, batch)
        if rc != 0:
            raise LlmedgeError(f"llama_decode failed (code {rc})")
        self.L.llama_synchronize(ctx)

    def _decode(self, ctx: Any, arr: Any, n: int) -> None:
        self._submit(ctx, self.L.llama_batch_get_one(arr, n))

    def decode(self, tokens: np.ndarray, seq: int = 0) -> None:
        n = len(tokens)
        if self.n_seq == 1:
            self._decode(self.ctx, (self.L.llama_token * n)(*tokens.tolist()), n)
        else:
            self._decode_rows([(int(t), seq) for t in tokens], last_only=True)

    def decode_parallel(self, tokens: np.ndarray) -> None:
        self._decode_rows([(int(t), s) for s, t in enumerate(tokens)], last_only=False)

    def _decode_rows(self, rows: list[tuple[int, int]], last_only: bool) -> None:
        """One ``llama_batch`` of (token, sequence) rows at each sequence's next position; logits of its
        last row (a prompt chunk) or of every row (a parallel step)."""
        b = self.batch
        for i, (tok, seq) in enumerate(rows):
            b.token[i] = tok
            b.pos[i] = self.pos[seq]
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq
            b.logits[i] = not last_only or i == len(rows) - 1
            self.pos[seq] += 1
        b.n_tokens = len(rows)
        self._submit(self.ctx, b)

    def end(self) -> None:
        if self.batch is not None:
            self.L.llama_batch_free(self.batch)
        self.batch = None
        if self.ctx:
            self.L.llama_free(self.ctx)
        self.ctx = None

    def close(self) -> None:
        self.end()
        if self.lmodel:
            self.L.llama_model_free(self.lmodel)
        self.lmodel = None


def _llama_cpp_isa(L: Any) -> str:
    try:
        info = L.llama_print_system_info().decode()
    except Exception:
        return ""
    for isa in ("AVX512_VNNI", "AVX512", "AVX2", "DOTPROD", "NEON"):
        if f"{isa} = 1" in info:
            return isa.lower()
    return ""


# ---------------------------------------------------------------------------------------------
# the tests themselves (llama-bench's test_prompt and test_gen)


def prompt_tokens(rng: np.random.Generator, n: int, n_vocab: int, bos: int | None) -> np.ndarray:
    """``n`` random token ids, the first being BOS when the model adds one (as llama-bench)."""
    ids = rng.integers(0, n_vocab, size=n, dtype=np.int64)
    if bos is not None and n:
        ids[0] = bos
    return ids


def run_prompt(runner: Runner, tokens: np.ndarray, n_batch: int, seq: int = 0) -> None:
    """llama-bench ``test_prompt``: the prompt in chunks of ``n_batch`` tokens (into sequence ``seq``)."""
    for start in range(0, len(tokens), n_batch):
        runner.decode(tokens[start : start + n_batch], seq)


def run_gen(runner: Runner, tokens: np.ndarray) -> None:
    """llama-bench ``test_gen``: one decode call per token."""
    for i in range(len(tokens)):
        runner.decode(tokens[i : i + 1])


def run_parallel_gen(runner: Runner, tokens: np.ndarray) -> None:
    """llama-batched-bench's generation: one decode call per step, one token of each sequence
    (``tokens`` is [steps, sequences])."""
    for row in tokens:
        runner.decode_parallel(row)


def _run_once(runner: Runner, test: BenchTest, tokens: np.ndarray, n_batch: int) -> int:
    """One timed repetition on a cleared cache (filled to the test's depth untimed, as llama-bench);
    wall time in ns."""
    runner.clear()
    if test.n_parallel > 1:  # every sequence filled to the depth, then the steps (tokens: _test_tokens')
        k, d = test.n_parallel, test.n_depth
        for s in range(k if d else 0):
            run_prompt(runner, tokens[s * d : (s + 1) * d], n_batch, s)
        gc.collect()
        t0 = time.perf_counter_ns()
        run_parallel_gen(runner, tokens[k * d :].reshape(test.n_gen, k))
        return time.perf_counter_ns() - t0
    if test.n_depth:
        run_prompt(runner, tokens[: test.n_depth], n_batch)
        tokens = tokens[test.n_depth :]
    gc.collect()
    t0 = time.perf_counter_ns()
    if test.n_prompt:
        run_prompt(runner, tokens[: test.n_prompt], n_batch)
    if test.n_gen:
        run_gen(runner, tokens[test.n_prompt :])
    return time.perf_counter_ns() - t0


def _test_tokens(rng: np.random.Generator, test: BenchTest, n_vocab: int, bos: int | None) -> np.ndarray:
    """The depth's tokens, the prompt's, then the generation's: BOS (when the model adds one) first. A
    parallel test's: each sequence's depth (its own, BOS first), then the steps' tokens, step by step."""
    if test.n_parallel > 1:
        k = test.n_parallel
        depths = [prompt_tokens(rng, test.n_depth, n_vocab, bos) for _ in range(k)] if test.n_depth else []
        gen = prompt_tokens(rng, test.n_gen * k, n_vocab, None)
        if not depths and bos is not None:
            gen[:k] = bos  # each sequence starts from BOS, as a one-sequence tg test
        return np.concatenate([*depths, gen])
    parts = []
    for n in (test.n_depth, test.n_prompt, test.n_gen):
        if n:
            parts.append(prompt_tokens(rng, n, n_vocab, None if parts else bos))
    return np.concatenate(parts)


def run_tests(runners: Sequence[Runner], tests: Sequence[BenchTest], params: BenchParams,
              progress: Callable[[str], None] | None = None) -> list[BenchResult]:
    """Run every test on every runner, interleaved repetition by repetition.

    Each repetition gives all runners the same token ids; the order alternates between
    repetitions (A B, B A, ...) so a drift in machine speed does not favour one runtime.
    Results come in test order, runner order within a test.
    """
    say = progress or (lambda msg: None)
    n_vocab = min(r.n_vocab for r in runners)
    bos = runners[0].bos
    rng = np.random.default_rng(params.seed)
    results: list[BenchResult] = []
    for ti, test in enumerate(tests):
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        load, rtt = load_average(), core_round_trip()
        rows = [BenchResult(r.info, test, params.n_batch, params.n_ubatch, params.kv_type, stamp, load_avg=load,
                            core_rtt_ns=rtt) for r in runners]
        for r in runners:
            r.begin(test, params.n_batch, params.n_ubatch)
        try:
            if params.warmup:
                for r, row in zip(runners, rows):
                    say(f"test {ti + 1}/{len(tests)} {test.name}: {r.info.runtime} warm-up")
                    # llama-bench: the whole prompt test, or one generation step (at no depth)
                    warm = BenchTest(n_prompt=test.n_prompt) if test.n_prompt else \
                        BenchTest(n_gen=1, n_parallel=test.n_parallel)
                    row.warmup_ns = _run_once(r, warm, _test_tokens(rng, warm, n_vocab, bos), params.n_batch)
                    time.sleep(_SWITCH_PAUSE_S)
            for rep in range(params.reps):
                tokens = _test_tokens(rng, test, n_vocab, bos)
                order = list(range(len(runners)))
                if rep % 2:
                    order.reverse()
                for k in order:
                    say(f"test {ti + 1}/{len(tests)} {test.name}: {runners[k].info.runtime} run {rep + 1}/{params.reps}")
                    rows[k].samples_ns.append(_run_once(runners[k], test, tokens, params.n_batch))
                    if len(runners) > 1:
                        time.sleep(_SWITCH_PAUSE_S)
        finally:
            for r in runners:
                r.end()
        if len(rows) > 1 and rows[1].avg_ts > 0:
            rows[0].ratio = rows[0].avg_ts / rows[1].avg_ts
        results.extend(rows)
    return results


# ---------------------------------------------------------------------------------------------
# driving a whole benchmark


def make_runner(kind: str, model_path: str, params: BenchParams, n_threads: int, n_ctx: int) -> Runner:
    if kind == "llmedge":
        return LlmedgeRunner(model_path, backend=params.backend, n_threads=n_threads, kv_type=params.kv_type,
                             n_ctx=n_ctx)
    if kind == "llama.cpp":
        return LlamaCppRunner(model_path, n_threads=n_threads)
    raise LlmedgeError(f"unknown runtime '{kind}'")


def run_bench(model: str | os.PathLike[str], params: BenchParams,
              progress: Callable[[str], None] | None = None) -> list[BenchResult]:
    """The whole benchmark: for each thread count, load the runtime(s), run the tests, fill in
    load time, first-call time and peak RSS. ``model`` is a catalog name, a store name or a path."""
    from llmedge.backends.cpu import physical_cores
    from llmedge.store import Store

    params.validate()
    say = progress or (lambda msg: None)
    kinds = ["llmedge"]
    if params.compare:
        ok, why = llama_cpp_available()
        if not ok:
            raise LlmedgeError(f"--compare {params.compare}: {why}")
        kinds.append(params.compare)
    path = str(Store().resolve(str(model), pull=True))
    tests = params.tests()
    n_ctx = max(t.n_ctx for t in tests)
    results: list[BenchResult] = []
    for n_threads in params.n_threads or [physical_cores()]:
        runners: list[Runner] = []
        try:
            for kind in kinds:
                say(f"{kind}: loading {path} ({n_threads} threads)")
                r = make_runner(kind, path, params, n_threads, n_ctx)
                runners.append(r)
                r.info.first_call_ns = r.first_call()
            rows = run_tests(runners, tests, params, progress)
        finally:
            for r in runners:
                r.close()
            runners.clear()
            gc.collect()
        if len(kinds) > 1 and params.rss_probe:
            for kind in kinds:
                say(f"{kind}: measuring peak RSS in a fresh process")
                peak = probe_peak_rss(kind, path, params, n_threads)
                for row in rows:
                    if row.info.runtime == kind:
                        row.info.peak_rss_bytes = peak
        elif len(kinds) == 1:
            for row in rows:
                row.info.peak_rss_bytes = peak_rss_bytes()
        results.extend(rows)
    return results


def probe_peak_rss(kind: str, model_path: str, params: BenchParams, n_threads: int) -> int:
    """Peak RSS of a fresh process that loads ``kind`` and runs every test once (same context sizes)."""
    spec = {"kind": kind, "model": model_path, "n_threads": n_threads, "backend": params.backend,
            "kv_type": params.kv_type, "n_batch": params.n_batch, "n_ubatch": params.n_ubatch,
            "n_prompt": params.n_prompt, "n_gen": params.n_gen, "n_depth": params.n_depth, "seed": params.seed,
            "n_parallel": params.n_parallel}
    env = dict(os.environ)
    extra = [str(Path(sys.modules[m].__file__).resolve().parent.parent)
             for m in ("llama_cpp", "llmedge") if m in sys.modules and getattr(sys.modules[m], "__file__", None)]
    env["PYTHONPATH"] = os.pathsep.join(extra + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    try:
        out = subprocess.run([sys.executable, "-m", "llmedge.bench", "--probe", json.dumps(spec)],
                             capture_output=True, text=True, env=env, timeout=3600, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        raise LlmedgeError(f"the peak-RSS probe for {kind} failed to start: {e}") from None
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise LlmedgeError(f"the peak-RSS probe for {kind} failed: {tail}")
    return int(json.loads(lines[-1])["peak_rss_bytes"])


def _probe_main(spec_json: str) -> None:
    spec = json.loads(spec_json)
    params = BenchParams(n_prompt=spec["n_prompt"], n_gen=spec["n_gen"], n_depth=spec["n_depth"],
                         n_parallel=spec.get("n_parallel", [1]), n_batch=spec["n_batch"],
                         n_ubatch=spec["n_ubatch"], reps=1, backend=spec["backend"], kv_type=spec["kv_type"],
                         warmup=False, seed=spec["seed"])
    tests = params.tests()
    r = make_runner(spec["kind"], spec["model"], params, spec["n_threads"], max(t.n_ctx for t in tests))
    r.first_call()
    run_tests([r], tests, params)
    sys.stdout.write(json.dumps({"peak_rss_bytes": peak_rss_bytes()}) + "\n")


# ---------------------------------------------------------------------------------------------
# printers


def _md_row(cells: Sequence[tuple[str, int]]) -> str:
    """``| a | b |`` with printf's ``%*s``: positive widths right-align, negative left-align."""
    out = "|"
    for value, width in cells:
        out += f" {value:>{width}} |" if width > 0 else f" {value:<{-width}} |"
    return out


def _md_rule(widths: Sequence[int]) -> str:
    return "|" + "".join(f" {'-' * (abs(w) - 1)}{':' if w > 0 else '-'} |" for w in widths)


def _size_str(n: int) -> str:
    return f"{n / 1024 / 1024:.2f} MiB" if n < 1024 ** 3 else f"{n / 1024 ** 3:.2f} GiB"


def _params_str(n: int) -> str:
    return f"{n / 1e6:.2f} M" if n < 1e9 else f"{n / 1e9:.2f} B"


def format_md(results: Sequence[BenchResult], params: BenchParams | None = None) -> str:
    """llama-bench's markdown table; with a comparison, a ratio table; then load/RSS lines and the build."""
    cols = [("model", -30), ("size", 10), ("params", 10), ("backend", -10), ("threads", 7)]
    if params is not None and params.n_batch != BenchParams.n_batch:
        cols.append(("n_batch", 7))
    if params is not None and params.n_ubatch != BenchParams.n_ubatch:
        cols.append(("n_ubatch", 8))
    cols += [("test", 15), ("t/s", 20)]
    lines = [_md_row([(name, w) for name, w in cols]), _md_rule([w for _, w in cols])]
    for r in results:
        values = {"model": r.info.model_type, "size": _size_str(r.info.model_size),
                  "params": _params_str(r.info.model_n_params), "backend": _md_backend(r.info),
                  "threads": str(r.info.n_threads), "n_batch": str(r.n_batch), "n_ubatch": str(r.n_ubatch),
                  "test": r.test.name, "t/s": f"{r.avg_ts:.2f} ± {r.stddev_ts:.2f}"}
        lines.append(_md_row([(values[name], w) for name, w in cols]))
    compared = [(a, b) for a, b in zip(results, results[1:]) if a.ratio is not None and a.info.runtime == "llmedge"]
    if compared:
        lines += ["", _md_row([("model", -30), ("backend", -10), ("threads", 7), ("test", 15),
                               ("llmedge t/s", 20), ("llama.cpp t/s", 20), ("ratio", 7)]),
                  _md_rule([-30, -10, 7, 15, 20, 20, 7])]
        for a, b in compared:
            lines.append(_md_row([(a.info.model_type, -30), (_md_backend(a.info), -10), (str(a.info.n_threads), 7),
                                  (a.test.name, 15), (f"{a.avg_ts:.2f} ± {a.stddev_ts:.2f}", 20),
                                  (f"{b.avg_ts:.2f} ± {b.stddev_ts:.2f}", 20), (f"{a.ratio:.2f}x", 7)]))
    lines.append("")
    seen: set[str] = set()
    for r in results:
        i = r.info
        what = ", ".join(x for x in (i.backend if i.runtime == "llmedge" else "", i.isa, f"{i.n_threads} threads") if x)
        rss = f"{i.peak_rss_bytes / 1024 / 1024:.1f} MiB" if i.peak_rss_bytes else "not measured"
        jit = f" (of which kernel compile/cache load {i.compile_ns / 1e6:.1f} ms)" if i.compile_ns else ""
        line = (f"{i.runtime} ({what}): load {i.load_ns / 1e6:.1f} ms{jit}, first call {i.first_call_ns / 1e6:.1f} ms, "
                f"peak RSS {rss}")
        if line not in seen:  # one line per runner (several tests share one)
            seen.add(line)
            lines.append(line)
    loads = [r.load_avg for r in results if r.load_avg is not None]
    if loads:
        lines.append(f"system load average (1 min) during the tests: {min(loads):.2f} to {max(loads):.2f}")
        n_cpu = os.cpu_count() or 1
        if max(loads) > n_cpu:
            lines.append(f"warning: the load average exceeded the {n_cpu} CPUs: other processes competed for the "
                         "cores and these timings are not reliable (llama.cpp's OpenMP threads suffer most)")
    rtts = [r.core_rtt_ns for r in results if r.core_rtt_ns is not None]
    if rtts:
        lines.append(f"a cache line's round trip between two cores: {min(rtts):.0f} to {max(rtts):.0f} ns "
                     "(tens of ns where they share a cache; several times that across caches, where -np scales less)")
    builds = sorted({r.info.build_commit for r in results})
    lines += ["", f"build: {', '.join(builds)}"]
    return "\n".join(lines) + "\n"


def _md_backend(info: RuntimeInfo) -> str:
    return info.backend if info.runtime == "llmedge" else info.runtime


def _json_record(r: BenchResult) -> dict[str, Any]:
    rec = r.fields()
    rec["samples_ns"] = list(r.samples_ns)
    rec["samples_ts"] = r.samples_ts
    return rec


def format_json(results: Sequence[BenchResult]) -> str:
    """A JSON array of records: llama-bench's fields, llmedge's extras, ``samples_ns``, ``samples_ts``."""
    return json.dumps([_json_record(r) for r in results], indent=2) + "\n"


def format_jsonl(results: Sequence[BenchResult]) -> str:
    return "".join(json.dumps(_json_record(r)) + "\n" for r in results)


def _csv_value(name: str, v: Any) -> str:
    """Values as llama-bench writes them: booleans 0/1, floats with std::to_string's six decimals."""
    if v is None:
        return ""
    if isinstance(v, bool) or name in _BOOL_FIELDS:
        return str(int(bool(v)))
    if isinstance(v, float):
        return f"{v:f}"
    return str(v)


def format_csv(results: Sequence[BenchResult]) -> str:
    """llama-bench's CSV: a header of field names, every value quoted (plus llmedge's extra columns)."""
    buf = io.StringIO()
    w = csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n")
    buf.write(",".join(LLAMA_BENCH_FIELDS + EXTRA_FIELDS) + "\n")
    for r in results:
        w.writerow([_csv_value(k, v) for k, v in r.fields().items()])
    return buf.getvalue()


def format_results(results: Sequence[BenchResult], fmt: str, params: BenchParams | None = None) -> str:
    if fmt == "md":
        return format_md(results, params)
    if fmt == "json":
        return format_json(results)
    if fmt == "jsonl":
        return format_jsonl(results)
    if fmt == "csv":
        return format_csv(results)
    raise LlmedgeError(f"unknown output format '{fmt}' (choose from {', '.join(OUTPUT_FORMATS)})")


# ---------------------------------------------------------------------------------------------
# the speculative test: plain decoding against prompt lookup (and a draft model), interleaved

SPEC_PARAGRAPH = ("The committee met on Tuesday to review the budget for the coming year. After a long discussion, "
                  "the members agreed to increase funding for the public library, to repair the roads near the "
                  "school, and to hire two new teachers. The mayor thanked everyone for their hard work and said "
                  "that the town would publish the full report on its website before the end of the month.")
SPEC_CODE = """def total_price(items, tax_rate):
    total = 0
    for item in items:
        total += item["price"] * item["quantity"]
    total = total * (1 + tax_rate)
    return round(total, 2)
"""
SPEC_PROMPTS = {
    "rewrite": f"Repeat the following paragraph exactly, but write 'Monday' instead of 'Tuesday'.\n\n{SPEC_PARAGRAPH}",
    "code-edit": f"Add a docstring to this Python function. Return the whole function.\n\n```python\n{SPEC_CODE}```",
}


@dataclass
class SpecResult:
    """One speculative test row: a task, a mode, its best decode rate and what the drafts did."""

    task: str
    mode: str
    tokens_per_s: float
    speedup: float
    n_gen: int
    draft_tokens: int
    draft_accepted: int
    tokens_per_forward: float
    same_text: bool

    def fields(self) -> dict[str, Any]:
        return dict(self.__dict__)


def speculative_bench(model: str | os.PathLike[str], n_gen: int = 128, reps: int = 3, backend: str = "auto",
                      n_threads: int | None = None, draft_model: str | None = None,
                      lookup: int = 3, progress: Callable[[str], None] | None = None) -> list[SpecResult]:
    """Greedy decode rate on copy-heavy tasks, plain against ``lookup`` (and ``draft_model``), runs
    interleaved, caches cleared before each; the best of ``reps`` per mode. Every speculative text is
    checked against the plain one (``same_text``)."""
    import llmedge

    if reps < 1:
        raise LlmedgeError("the number of repetitions (-r) must be at least 1")
    if n_gen < 1:
        raise LlmedgeError("nothing to run: the speculative test needs -n of at least 1 generated token")
    if n_threads is not None and n_threads < 1:
        raise LlmedgeError("thread counts (-t) must be at least 1")
    say = progress or (lambda msg: None)
    m = llmedge.load(str(model), backend=backend, n_threads=n_threads, n_ctx=2048)
    modes: dict[str, dict[str, Any]] = {"plain": {}, f"lookup={lookup}": {"lookup": lookup}}
    if draft_model:
        modes["draft"] = {"draft_model": draft_model}
        m.spec_config(draft_model=draft_model)  # load (and check) it before timing
    out: list[SpecResult] = []
    for task, prompt in SPEC_PROMPTS.items():
        best: dict[str, tuple[float, list[int], dict[str, float], int]] = {}
        for rep in range(reps):
            for mode, opts in modes.items():
                say(f"{task} {mode} run {rep + 1}/{reps}")
                m.engine.cache.clear()
                m.engine.prefix_cache.clear()
                ids = [c.token for c in m.generate(prompt, max_tokens=n_gen, temperature=0, **opts)]
                t = m.timings
                rate = t.eval_count / (t.eval_duration / 1e9) if t.eval_duration else 0.0
                if mode not in best or rate > best[mode][0]:
                    best[mode] = (rate, ids, dict(t.extra), t.eval_count)
        base_rate, base_ids = best["plain"][0], best["plain"][1]
        for mode, (rate, ids, extra, n) in best.items():
            forwards = int(extra.get("decode_forwards", n)) or 1
            out.append(SpecResult(task, mode, rate, rate / base_rate if base_rate else 0.0, n,
                                  int(extra.get("draft_tokens", 0)), int(extra.get("draft_accepted", 0)),
                                  n / forwards, ids == base_ids))
    return out


def format_speculative(rows: Sequence[SpecResult], fmt: str = "md") -> str:
    if fmt in ("json", "jsonl"):
        items = [r.fields() for r in rows]
        return json.dumps(items, indent=2) + "\n" if fmt == "json" else "".join(json.dumps(i) + "\n" for i in items)
    if fmt == "csv":
        keys = list(SpecResult.__dataclass_fields__)
        return ",".join(keys) + "\n" + "".join(",".join(str(r.fields()[k]) for k in keys) + "\n" for r in rows)
    head = "| task | mode | t/s | speed-up | accepted / drafted | tokens / forward | same text |\n"
    head += "| --- | --- | ---: | ---: | ---: | ---: | --- |\n"
    body = "".join(f"| {r.task} | {r.mode} | {r.tokens_per_s:.2f} | {r.speedup:.2f}x | "
                   f"{r.draft_accepted} / {r.draft_tokens} | {r.tokens_per_forward:.2f} | "
                   f"{'yes' if r.same_text else 'NO'} |\n" for r in rows)
    return head + body


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--probe":
        _probe_main(sys.argv[2])
    else:
        sys.stderr.write("usage: llmedge bench MODEL (this module's own entry is the peak-RSS probe)\n")
        sys.exit(2)
