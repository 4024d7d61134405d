"""Shared plumbing of the fuzz targets: run one target under atheris (coverage-guided, libFuzzer) with
bounded time, memory and per-input time, over its committed seed corpus and regression inputs.

Each target module defines ``test_one_input(data: bytes) -> None`` (raising only for a real bug) and
``seeds() -> list[bytes]``; ``python fuzz/<target>.py [libFuzzer flags]`` fuzzes it, and
tests/test_fuzz_regressions.py replays its seeds and regressions without atheris.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def corpus_dir(target: str) -> Path:
    return HERE / "corpus" / target


def regression_inputs(target: str) -> list[bytes]:
    """Inputs that once crashed ``target`` (fuzz/regressions/<target>/*), each now a fixed bug."""
    d = HERE / "regressions" / target
    return [p.read_bytes() for p in sorted(d.glob("*")) if p.is_file()] if d.is_dir() else []


def instrument(module_name: str, include: list[str]) -> Any:
    """Coverage instrumentation of the imports in the block when fuzzing (the target runs as
    ``__main__``); nothing when a test imports the target to replay inputs."""
    if module_name != "__main__":
        return contextlib.nullcontext()
    import atheris

    return atheris.instrument_imports(include=include)


def fuzz(target: str, one_input: Callable[[bytes], None], seeds: Callable[[], list[bytes]]) -> None:
    """Fuzz ``one_input`` with atheris; libFuzzer flags come from the command line (see fuzz/run.sh)."""
    import atheris

    work = corpus_dir(target)
    work.mkdir(parents=True, exist_ok=True)
    for i, s in enumerate(seeds() + regression_inputs(target)):
        p = work / f"seed-{i:03d}"
        if not p.exists():
            p.write_bytes(s)
    args = [sys.argv[0], *sys.argv[1:]]
    if not any(not a.startswith("-") for a in args[1:]):
        args.append(str(work))
    atheris.Setup(args, one_input)
    atheris.Fuzz()


def scratch_file(name: str) -> Path:
    """A per-process file on a RAM disk when there is one, for targets that need a path."""
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(os.environ.get("TMPDIR", "/tmp"))
    return base / f"llmedge-fuzz-{name}-{os.getpid()}"
