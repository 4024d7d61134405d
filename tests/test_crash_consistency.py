"""Crash consistency: `kill -9` at every write and file operation of a state save, a chat `/save` and a
store import leaves each file either the old or the new version, never torn, and the next save or
import cleans up what the killed one left.

Kill points are exact, not timing guesses: the save runs in a forked child whose file writes and
file-system operations (replace, link, fsync, unlink, chmod) count down a budget; when it runs out the
child SIGKILLs itself, mid-write (after part of the buffer) or just before the operation. The points
are every operation plus at least 16 byte offsets spread over everything written (24 or more per save).
"""

from __future__ import annotations

import builtins
import io
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent / "malformed"))
from gguf_bytes import tiny_model  # noqa: E402

OPS = ("replace", "rename", "link", "fsync", "unlink", "chmod")
BYTE_POINTS = 16


class _Budget:
    def __init__(self, n_bytes: float, n_ops: float) -> None:
        self.bytes, self.ops = n_bytes, n_ops
        self.used_bytes = self.used_ops = 0


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class _KillingFile:
    def __init__(self, f: Any, budget: _Budget) -> None:
        self._f, self._budget = f, budget

    def write(self, data: Any) -> int:
        b = self._budget
        n = len(data)
        if b.bytes < n:
            self._f.write(data[: int(b.bytes)])
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

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


def _install(budget: _Budget) -> None:
    real_open, real_fdopen = io.open, os.fdopen

    def opener(real: Callable[..., Any]) -> Callable[..., Any]:
        def open_(file: Any, mode: str = "r", *args: Any, **kw: Any) -> Any:
            f = real(file, mode, *args, **kw)
            return _KillingFile(f, budget) if any(c in mode for c in "wax+") else f

        return open_

    builtins.open = io.open = opener(real_open)  # type: ignore[assignment]
    os.fdopen = opener(real_fdopen)  # type: ignore[assignment]
    for name in OPS:
        real = getattr(os, name)

        def op(*args: Any, _real: Callable[..., Any] = real, **kw: Any) -> Any:
            if budget.ops <= 0:
                _die()
            budget.ops -= 1
            budget.used_ops += 1
            return _real(*args, **kw)

        setattr(os, name, op)


def _in_child(action: Callable[[], None], budget: _Budget) -> tuple[int, dict[str, int]]:
    """Fork; the child runs ``action`` under ``budget``; returns (signal or -exit code, usage)."""
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
            code = 3
        os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        report = f.read()
    _, status = os.waitpid(pid, 0)
    usage = json.loads(report) if report else {}
    return (os.WTERMSIG(status) if os.WIFSIGNALED(status) else -os.WEXITSTATUS(status)), usage


def kill_points(action: Callable[[], None]) -> list[_Budget]:
    """A full run's totals, then one budget per operation and per byte offset."""
    sig, usage = _in_child(action, _Budget(float("inf"), float("inf")))
    assert sig == 0 and usage, "the unkilled run failed"
    points = [_Budget(float("inf"), k) for k in range(usage["ops"])]
    total, n = usage["bytes"], max(BYTE_POINTS, 24 - len(points))
    points += [_Budget(total * i // n + 1, float("inf")) for i in range(n)]
    assert len(points) >= 20
    return points


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    from llmedge.api import Model

    path = tiny_model().write(tmp_path_factory.mktemp("crash") / "tiny.gguf")
    return Model(path, backend="numpy", n_ctx=128)


def _strays(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.startswith("."))


def test_kill_during_state_save_leaves_old_or_new(tiny: Any, tmp_path: Path) -> None:
    from llmedge.state import read_state

    m = tiny
    list(m.generate("hello", raw=True, max_tokens=3, temperature=0))
    path = tmp_path / "s.state"
    m.save_state(path, extra={"v": "old"})
    old_n = read_state(path, m.digest)[0].tokens
    old_bytes = path.read_bytes()
    list(m.generate("hello the a", raw=True, max_tokens=3, temperature=0))

    def save() -> None:
        m.save_state(path, extra={"v": "new"})

    seen = set()
    for budget in kill_points(save):
        sig, _ = _in_child(save, budget)
        assert sig == signal.SIGKILL
        state, extra = read_state(path, m.digest)  # never torn: always readable and verified
        assert extra["v"] in ("old", "new")
        assert (extra["v"] == "old") == (list(state.tokens) == list(old_n))
        seen.add(extra["v"])
        path.write_bytes(old_bytes)  # the next kill starts from the old file again
    assert seen == {"old", "new"}
    m.save_state(path, extra={"v": "final"})  # the next save repairs: the killed saves' temp files go
    assert read_state(path, m.digest)[1]["v"] == "final"
    assert _strays(tmp_path) == []


def test_kill_during_chat_save_leaves_old_or_new(tiny: Any, tmp_path: Path) -> None:
    from rich.console import Console

    from llmedge.cli.chat import ChatSession
    from llmedge.state import read_state

    out = io.StringIO()
    s = ChatSession(tiny, Console(file=out, width=100, color_system=None), sessions=tmp_path, out=out)
    s.handle("/set parameter num_predict 3")
    s.handle("/set parameter temperature 0")
    s.ask("hello")
    s.save("lunch")
    old = json.loads((tmp_path / "lunch.json").read_text())
    backup = {p: p.read_bytes() for p in (tmp_path / "lunch.json", tmp_path / "lunch.state")}
    s.ask("the a")
    assert len(s.messages) == 4

    points = kill_points(lambda: s.save("lunch"))
    kinds = set()
    for budget in points:
        sig, _ = _in_child(lambda: s.save("lunch"), budget)
        assert sig == signal.SIGKILL
        data = json.loads((tmp_path / "lunch.json").read_text())  # parses: never torn
        assert data["messages"] in (old["messages"], s.messages)
        kinds.add(len(data["messages"]))
        state, extra = read_state(tmp_path / "lunch.state", tiny.digest)
        assert extra == {"session": "lunch"} and len(state.tokens) > 0
        for p, b in backup.items():
            p.write_bytes(b)
    assert kinds == {2, 4}  # killed before and after the session file was replaced
    s.save("lunch")
    assert _strays(tmp_path) == []
    fresh = ChatSession(tiny, Console(file=io.StringIO(), width=100), sessions=tmp_path, out=io.StringIO())
    fresh.handle("/load lunch")
    assert fresh.messages == s.messages


def test_kill_during_store_import_leaves_old_or_new(tmp_path: Path) -> None:
    from llmedge.store import Store, digest_of

    root = tmp_path / "store"
    old_file = tiny_model(seed=1).write(tmp_path / "old.gguf")
    new_file = tiny_model(seed=2).write(tmp_path / "new.gguf")
    Store(root).create("m:latest", old_file)
    old_digest, new_digest = digest_of(old_file), digest_of(new_file)

    def create() -> None:
        Store(root).create("m:latest", new_file)

    seen = set()
    for budget in kill_points(create):
        sig, _ = _in_child(create, budget)
        assert sig == signal.SIGKILL
        blob = Store(root).resolve("m:latest")  # resolves, to a complete blob
        digest = digest_of(blob)
        assert digest in (old_digest, new_digest)
        seen.add(digest)
        if digest == new_digest:
            Store(root).create("m:latest", old_file)
    assert seen == {old_digest, new_digest}
    create()
    assert digest_of(Store(root).resolve("m:latest")) == new_digest
    leftovers = [p for p in root.rglob("*") if p.is_file() and p.name.startswith(".")]
    print("left by killed imports:", sorted({p.parent.name + "/" + p.name[:9] for p in leftovers}))
    assert all(p.name.startswith((".partial-", ".tmp-")) for p in leftovers)  # only recognizable temp files
    assert [e.name for e in Store(root).list()] == ["m:latest"]  # and none of them shows up as a model
