"""Crash consistency: `kill -9` at every write and file operation of a state save, a chat `/save` and a
store import leaves each file either the old or the new version, never torn, and the next save or
import cleans up what the killed one left.

Kill points are exact, not timing guesses: the save runs in a forked child whose file writes and
file-system operations (replace, link, fsync, unlink, chmod) count down a budget; when it runs out the
child SIGKILLs itself, mid-write (after part of the buffer) or just before the operation. The points
are every operation plus at least 16 byte offsets spread over everything written (24 or more per save).
"""

from __future__ import annotations

import io
import json
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from crash_points import Budget, kill_points
from crash_points import in_child as _in_child
from crash_points import strays as _strays

sys.path.insert(0, str(Path(__file__).parent / "malformed"))
from gguf_bytes import tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    from llmedge.api import Model

    path = tiny_model().write(tmp_path_factory.mktemp("crash") / "tiny.gguf")
    return Model(path, backend="numpy", n_ctx=128)


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
    # the import copies the file, so nearly every byte written is the blob's: the last point is a kill
    # a few bytes into the manifest's temp file, after the whole blob
    in_manifest = Budget(new_file.stat().st_size + 10, float("inf"))
    for budget in [*kill_points(create), in_manifest]:
        sig, _ = _in_child(create, budget)
        assert sig == signal.SIGKILL
        blob = Store(root).resolve("m:latest")  # resolves, to a complete blob
        digest = digest_of(blob)
        assert digest in (old_digest, new_digest)
        seen.add(digest)
        if digest == new_digest:
            Store(root).create("m:latest", old_file)
    assert seen == {old_digest, new_digest}
    leftovers = [p for p in root.rglob("*") if p.is_file() and p.name.startswith(".")]
    assert all(p.name.startswith((".partial-", ".tmp-")) for p in leftovers)  # only recognizable temp files
    assert any(p.name.endswith(".json") for p in leftovers)  # a killed manifest write's temp file
    assert [e.name for e in Store(root).list()] == ["m:latest"]  # and none of them shows up as a model
    create()  # the next import repairs: the killed imports' temp files (blobs and manifests) are swept
    assert digest_of(Store(root).resolve("m:latest")) == new_digest
    assert [p.name for p in root.rglob("*") if p.name.startswith(".")] == []


def test_sweep_keeps_live_writers_and_resumable_pulls(tmp_path: Path) -> None:
    import os

    from llmedge.store import Store

    store = Store(tmp_path / "store", catalog={}, ollama_root=tmp_path / "ollama")
    store._ensure_dirs()
    dead = _dead_pid()
    mine = os.getpid()
    folder = store.manifests_dir / "registry.ollama.ai" / "library" / "m"
    folder.mkdir(parents=True)
    names = {
        store.blobs_dir / f".partial-{dead}-abc": False,  # a killed import's blob: swept
        store.blobs_dir / f".partial-{dead}-upload-0123-9": False,  # a killed upload: swept
        store.blobs_dir / f".partial-{mine}-abc": True,  # a live import (this process): kept
        store.blobs_dir / f".partial-sha256-{'a' * 64}": True,  # a pull to resume: kept
        folder / f".tmp-{dead}-xyz.json": False,  # a killed manifest write: swept
        folder / f".tmp-{mine}-xyz.json": True,
    }
    for p in names:
        p.write_bytes(b"x")
    assert store.sweep() == 3
    assert {p: p.exists() for p in names} == names


def _dead_pid() -> int:
    import subprocess

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid
