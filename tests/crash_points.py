"""Exact kill points for the crash-consistency tests: run an action in a forked child whose file writes
and file-system operations count down a budget, and SIGKILL the child when the budget runs out.

The child's `open`/`os.fdopen` return files whose `write` spends the byte budget (killing after part of
the buffer when it runs out) and the operations in `OPS` spend the operation budget (killing just before
the operation). `kill_points` measures a full run, then gives one budget per operation plus byte offsets
spread over everything written, at least 24 in all. Nothing here is product code: the product is
exercised unchanged, only the process dies where a `kill -9` could have hit it.
"""

from __future__ import annotations

import builtins
import io
import json
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

OPS = ("replace", "rename", "link", "fsync", "unlink", "chmod")
BYTE_POINTS = 16
MIN_POINTS = 24


class Budget:
    """What the child may still do before it is killed (inf: no limit), and what it did."""

    def __init__(self, n_bytes: float, n_ops: float, main_thread_ops: bool = False) -> None:
        self.bytes, self.ops = n_bytes, n_ops
        self.used_bytes = self.used_ops = 0
        # count (and kill at) only the main thread's operations: where worker threads do a varying
        # number of them (progress records of a download), the main thread's stay deterministic
        self.main_thread_ops = main_thread_ops

    def __repr__(self) -> str:
        return f"Budget(bytes={self.bytes}, ops={self.ops})"


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _nbytes(data: Any) -> int:
    try:
        return memoryview(data).nbytes
    except TypeError:
        return len(data)


class _KillingFile:
    def __init__(self, f: Any, budget: Budget) -> None:
        self._f, self._budget = f, budget

    def write(self, data: Any) -> int:
        b = self._budget
        n = _nbytes(data)
        if b.bytes < n:
            if isinstance(data, str):
                self._f.write(data[: int(b.bytes)])
            else:
                self._f.write(memoryview(data).cast("B")[: int(b.bytes)])
            self._f.flush()
            _die()
        b.bytes -= n
        b.used_bytes += n
        return self._f.write(data)

    def __enter__(self) -> _KillingFile:
        self._f.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._f.__exit__(*exc)

    def __iter__(self) -> Any:
        return iter(self._f)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


def _install(budget: Budget) -> None:
    real_open = io.open

    def opener(real: Callable[..., Any]) -> Callable[..., Any]:
        def open_(file: Any, mode: str = "r", *args: Any, **kw: Any) -> Any:
            f = real(file, mode, *args, **kw)
            return _KillingFile(f, budget) if any(c in mode for c in "wax+") else f

        return open_

    builtins.open = io.open = opener(real_open)  # type: ignore[assignment]
    os.fdopen = opener(real_open)  # type: ignore[assignment] # os.fdopen is io.open of a descriptor
    for name in OPS:
        real = getattr(os, name)

        def op(*args: Any, _real: Callable[..., Any] = real, **kw: Any) -> Any:
            if os.environ.get("CRASH_POINTS_TRACE"):
                print("op", _real.__name__, args[:2], file=sys.stderr)
            if budget.main_thread_ops and threading.current_thread() is not threading.main_thread():
                return _real(*args, **kw)
            if budget.ops <= 0:
                _die()
            budget.ops -= 1
            budget.used_ops += 1
            return _real(*args, **kw)

        setattr(os, name, op)


def in_child(action: Callable[[], None], budget: Budget,
             parent: Callable[[int], None] | None = None) -> tuple[int, dict[str, int]]:
    """Fork; the child runs ``action`` under ``budget`` while the parent runs ``parent(child pid)``
    (a client of a server the child runs, say); returns (signal or -exit code, usage)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            os.close(r)
            _install(budget)
            action()
            os.write(w, json.dumps({"bytes": budget.used_bytes, "ops": budget.used_ops}).encode())
        except BaseException:  # noqa: BLE001
            import traceback

            traceback.print_exc()
            code = 3
        os._exit(code)
    os.close(w)
    if parent is not None:
        try:
            parent(pid)
        except BaseException:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(r)
            raise
    with os.fdopen(r, "rb") as f:
        report = f.read()
    _, status = os.waitpid(pid, 0)
    usage = json.loads(report) if report else {}
    return (os.WTERMSIG(status) if os.WIFSIGNALED(status) else -os.WEXITSTATUS(status)), usage


def kill_points(action: Callable[[], None], byte_points: int = BYTE_POINTS,
                parent: Callable[[int], None] | None = None, main_thread_ops: bool = False) -> list[Budget]:
    """A full run's totals, then one budget per operation and per byte offset (at least 24)."""
    sig, usage = in_child(action, unlimited(main_thread_ops), parent)
    assert sig == 0 and usage, f"the unkilled run failed ({sig})"
    return points_for(usage, byte_points, main_thread_ops)


def unlimited(main_thread_ops: bool = False) -> Budget:
    return Budget(float("inf"), float("inf"), main_thread_ops)


def points_for(usage: dict[str, int], byte_points: int = BYTE_POINTS, main_thread_ops: bool = False) -> list[Budget]:
    """One budget per operation of a run that used ``usage``, then byte offsets spread over its writes."""
    points = [Budget(float("inf"), k, main_thread_ops) for k in range(usage["ops"])]
    total, n = usage["bytes"], max(byte_points, MIN_POINTS - len(points))
    points += [Budget(total * i // n + 1, float("inf")) for i in range(n)]
    assert len(points) >= MIN_POINTS
    return points


def strays(d: Path) -> list[str]:
    """The hidden (temporary) files directly in ``d``."""
    return sorted(p.name for p in d.iterdir() if p.name.startswith("."))


class ForkServer:
    """A fresh interpreter (with ``env`` added to the environment) that runs ``setup`` (Python source)
    once, then forks one child per budget running ``action`` (source, in setup's namespace). For
    operations whose libraries read their configuration once per process (huggingface_hub's endpoint)
    or make forking the test process itself unsafe (numba's OpenMP layer aborts a child forked after it
    started):
    the server uses numba's fork-safe `workqueue` layer, and its warm JIT code is shared by every
    child, so each kill point costs a fork, not a compile."""

    def __init__(self, setup: str, action: str, env: dict[str, str | None] | None = None) -> None:
        import subprocess
        import sys

        env = {k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None}  # None: unset
        env = {**env, "NUMBA_THREADING_LAYER": "workqueue",
               "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
        boot = "import sys, crash_points; crash_points._serve(sys.argv[1], sys.argv[2])"
        self.proc = subprocess.Popen([sys.executable, "-c", boot, setup, action], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env, text=True)

    def run(self, budget: Budget) -> tuple[int, dict[str, int]]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        inf = float("inf")
        self.proc.stdin.write(json.dumps([None if budget.bytes == inf else budget.bytes,
                                          None if budget.ops == inf else budget.ops]) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the fork server died ({self.proc.poll()})"
        sig, usage = json.loads(line)
        return sig, usage

    def kill_points(self, byte_points: int = BYTE_POINTS) -> list[Budget]:
        sig, usage = self.run(unlimited())
        assert sig == 0 and usage, f"the unkilled run failed ({sig})"
        return points_for(usage, byte_points)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


def _serve(setup: str, action: str) -> None:
    import sys

    ns: dict[str, Any] = {}
    exec(setup, ns)  # noqa: S102 - the test's own source
    code = compile(action, "<action>", "exec")
    for line in sys.stdin:
        b, o = json.loads(line)
        budget = Budget(float("inf") if b is None else b, float("inf") if o is None else o)
        sys.stdout.flush()
        sig, usage = in_child(lambda: exec(code, ns), budget)  # noqa: S102
        sys.stdout.write(json.dumps([sig, usage]) + "\n")
        sys.stdout.flush()
