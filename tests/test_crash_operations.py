"""Crash consistency of the long operations: `kill -9` at 24 or more exact points of a pull (from the
fake registry on loopback, sequential and by parallel byte ranges, and from the fake Hugging Face Hub),
a `create` (the CLI command, and /api/blobs + /api/create of the app `llmedge serve` runs) and a
quantize leaves the store and the output file either old or new, never torn; the next run repairs:
a killed pull is resumed, completes and verifies, the killed writers' temporary files are swept.

The kill points are those of `crash_points`: every file operation and byte offsets over everything
the operation writes, each in a forked child that SIGKILLs itself there (forked from a fresh
interpreter, `crash_points.ForkServer`, where a library cannot be forked from the test process).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from crash_points import ForkServer, in_child, kill_points, points_for, unlimited
from fake_registry import FakeRegistry, serve
from tiny_gguf import write_tiny_llama

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
from tiny_quant_model import write_tiny_llama as write_quant_input  # noqa: E402


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def hidden_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob(".*") if p.is_file())


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("models")
    return write_tiny_llama(d / "old.gguf", seed=11), write_tiny_llama(d / "new.gguf", seed=12)


# -- quantize --------------------------------------------------------------------------------------
def test_kill_during_quantize_leaves_the_old_output_or_the_new(tmp_path: Path) -> None:
    """`quantize in.gguf out.gguf Q8_0` killed anywhere: out.gguf is the previous file or the complete
    Q8_0 output; the next run sweeps the killed runs' temp files."""
    out, ref = tmp_path / "out", tmp_path / "ref"
    out.mkdir()
    ref.mkdir()
    src, dst = ref / "in.gguf", out / "out.gguf"
    write_quant_input(src, "f16")
    old = write_tiny_llama(ref / "old.gguf", seed=5).read_bytes()  # a previous output (small: rewritten per point)
    dst.write_bytes(old)
    setup = (f"from llmedge.quant.gguf_quantize import quantize_gguf\n"
             f"from llmedge.quant.mix import MixParams\n"
             f"src, dst = {str(src)!r}, {str(dst)!r}\n"
             f"quantize_gguf(src, {str(ref / 'new.gguf')!r}, MixParams('Q8_0'))\n")  # compiled before forking
    server = ForkServer(setup, "quantize_gguf(src, dst, MixParams('Q8_0'))")
    try:
        points = server.kill_points()
        new = (ref / "new.gguf").read_bytes()
        assert dst.read_bytes() == new
        mode = dst.stat().st_mode
        seen, temps = set(), []
        for budget in points:
            dst.write_bytes(old)
            sig, _ = server.run(budget)
            assert sig == signal.SIGKILL, budget
            got = dst.read_bytes()  # never a partial GGUF under the final name
            assert got in (old, new), f"{budget}: torn output ({len(got)} bytes)"
            seen.add(got == new)
            temps = [p for p in out.iterdir() if p.name != "out.gguf"]
            assert all(p.name.startswith(".out.gguf.") and p.name.endswith(".tmp") for p in temps)
            if budget is not points[-1]:  # every kill point starts from the same files (the next run's
                for p in temps:  # sweep would otherwise shift the later points by one operation)
                    p.unlink()
        print(f"quantize: {len(points)} kill points")
        assert seen == {False, True}  # killed before and after the rename
        assert temps  # the last killed run's temp file...
        dst.write_bytes(old)
        assert server.run(unlimited())[0] == 0
    finally:
        server.close()
    assert dst.read_bytes() == new and dst.stat().st_mode == mode
    assert [p.name for p in out.iterdir()] == ["out.gguf"]  # ...swept by the next run


def test_a_failed_quantize_keeps_the_previous_output(tmp_path: Path) -> None:
    from llmedge.quant import gguf_quantize
    from llmedge.quant.mix import MixParams

    src, dst = tmp_path / "in.gguf", tmp_path / "out.gguf"
    write_quant_input(src, "f16")
    dst.write_bytes(b"previous")

    def boom(*a: Any, **k: Any) -> None:
        raise OSError(28, "No space left on device")

    real = gguf_quantize._write_body
    gguf_quantize._write_body = boom
    try:
        with pytest.raises(OSError):
            gguf_quantize.quantize_gguf(src, dst, MixParams("Q8_0"))
    finally:
        gguf_quantize._write_body = real
    assert dst.read_bytes() == b"previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.gguf", "out.gguf"]


def test_quantize_into_a_missing_folder_is_one_line(tmp_path: Path) -> None:
    import subprocess

    src = tmp_path / "in.gguf"
    write_quant_input(src, "f16")
    r = subprocess.run([sys.executable, "-c", "from llmedge.cli.main import main; main()", "quantize", str(src),
                        str(tmp_path / "no" / "out.gguf"), "Q8_0", "-q"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert r.stderr.strip() == f"Error: {tmp_path / 'no' / 'out.gguf'}: No such file or directory", r.stderr


# -- pull ------------------------------------------------------------------------------------------
@pytest.fixture
def registry() -> Iterator[FakeRegistry]:
    reg = FakeRegistry()
    server = serve(reg)
    yield reg
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("ranged,repair_ranged", [(False, False), (True, True), (True, False), (False, True)],
                         ids=["sequential", "parallel-ranges", "ranges-then-sequential", "sequential-then-ranges"])
def test_kill_during_pull_leaves_old_or_new_and_the_next_pull_resumes(
        tmp_path: Path, registry: FakeRegistry, ggufs: tuple[Path, Path], ranged: bool, repair_ranged: bool) -> None:
    """A pull killed anywhere: the name resolves to the old model or the new one, complete; the next
    pull (by ranges or not, whichever the killed one used) completes and verifies, continuing the
    killed one's download, and leaves no partial, progress or lock file behind."""
    from llmedge.blobs import _split
    from llmedge.registry import MAX_PARTS
    from llmedge.store import Store, digest_of

    old, new = (p.read_bytes() for p in ggufs)
    name = f"{registry.host}/library/tiny:1b"
    root, pristine = tmp_path / "store", tmp_path / "pristine"
    def store(ranged: bool = ranged) -> Store:
        return Store(root, catalog={}, insecure=True, ollama_root=tmp_path / "ollama", retry_delay=0.01,
                     part_size=len(new) // 4 if ranged else 1 << 30)

    registry.add_model("library/tiny", "1b", old, system="old")
    store().pull(name)
    shutil.copytree(root, pristine)
    registry.add_model("library/tiny", "1b", new, system="new")  # the tag moves to a new model

    def pull() -> None:
        store().pull(name)

    def reset() -> None:
        shutil.rmtree(root)
        shutil.copytree(pristine, root)

    seen, resumed = set(), 0
    parts = min(MAX_PARTS, len(new) // store(repair_ranged).part_size)
    fresh_starts = {start for start, _, _ in _split(len(new), parts)} if parts > 1 else {0}
    points = kill_points(pull, main_thread_ops=ranged)  # range workers record progress a varying number of times
    reset()
    for budget in points:
        sig, _ = in_child(pull, budget)
        assert sig == signal.SIGKILL, budget
        s = store()
        digest = digest_of(s.resolve(name))  # resolves, to a complete blob that matches its manifest
        assert digest in (sha(old), sha(new)), budget
        assert s.config(name)["system"] == ("old" if digest == sha(old) else "new")
        seen.add(digest)
        n_requests = len(registry.requests)
        store(repair_ranged).pull(name)  # the next pull completes and verifies
        assert digest_of(s.resolve(name)) == sha(new) and s.config(name)["system"] == "new"
        starts = {int(r[6:].partition("-")[0]) for _, r in registry.requests[n_requests:] if r}
        resumed += bool(starts - fresh_starts)  # a range that continues where the killed pull stopped
        assert hidden_files(root) == [], budget  # nothing left: partial files became the blob
        reset()
    print(f"pull ({'ranged' if ranged else 'sequential'}): {len(points)} kill points, {resumed} repairs resumed")
    assert seen == {sha(old), sha(new)}
    assert resumed >= 4 or (ranged and not repair_ranged)  # several repairs continued a partial download instead of starting over


def test_kill_during_hf_pull_leaves_nothing_or_the_model_and_the_next_pull_completes(
        tmp_path: Path, ggufs: tuple[Path, Path]) -> None:
    """An `hf.co/...` pull (huggingface_hub into its cache, then a link and a manifest in the store)
    killed anywhere: the name is absent or resolves to the complete file; the next pull completes."""
    from fake_hub import FakeHub
    from fake_hub import serve as serve_hub

    from llmedge.store import Store, digest_of

    data = ggufs[1].read_bytes()
    hub = FakeHub(repos={"Org/Tiny-GGUF": {"tiny-Q4_K_M.gguf": data}})
    server = serve_hub(hub)
    root, hf = tmp_path / "store", tmp_path / "hf"
    env: dict[str, str | None] = {"HF_ENDPOINT": hub.url, "HF_HOME": str(hf), "HF_HUB_DISABLE_TELEMETRY": "1",
                                  "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_HUB_CACHE": None,
                                  "HUGGINGFACE_HUB_CACHE": None, "HF_HUB_OFFLINE": None, "HF_TOKEN": None}
    setup = (f"import shutil\nfrom llmedge.store import Store\n"
             f"pull = lambda: Store({str(root)!r}, catalog={{}}, ollama_root={str(tmp_path / 'ollama')!r}).pull("
             f"'hf.co/Org/Tiny-GGUF:Q4_K_M')\n"
             f"pull()\n"  # once, unkilled: what it imports lazily (huggingface_hub, numpy) is loaded before forking
             f"shutil.rmtree({str(root)!r}); shutil.rmtree({str(hf)!r})\n")
    fork = ForkServer(setup, "pull()", env)
    name = "hf.co/Org/Tiny-GGUF:Q4_K_M"
    try:
        points = fork.kill_points(byte_points=8)  # every operation, and byte offsets up to 24 points in all
        present = 0
        for budget in points:
            shutil.rmtree(root, ignore_errors=True)
            shutil.rmtree(hf, ignore_errors=True)
            sig, _ = fork.run(budget)
            assert sig == signal.SIGKILL, budget
            s = Store(root, catalog={}, ollama_root=tmp_path / "ollama")
            if [e.name for e in s.list(include_ollama=False)]:
                assert digest_of(s.resolve(name)) == sha(data), budget  # listed: complete and verified
                present += 1
            else:
                assert not s._find(name), budget
            assert fork.run(unlimited())[0] == 0, budget  # the next pull completes
            assert digest_of(s.resolve(name)) == sha(data)
            assert hidden_files(root) == [], budget
        print(f"hf pull: {len(points)} kill points, model present after {present}")
        assert 0 < present < len(points)
    finally:
        fork.close()
        server.shutdown()
        server.server_close()


# -- create ----------------------------------------------------------------------------------------
def _modelfile(d: Path, gguf: Path, system: str) -> Path:
    mf = d / f"Modelfile.{system}"
    mf.write_text(f"FROM {gguf}\nPARAMETER temperature 0.25\nSYSTEM {system}\n")
    return mf


@pytest.mark.parametrize("how", ["copy", "from-name"])  # by hard link: test_kill_during_store_import_...
def test_kill_during_cli_create_leaves_old_or_new(tmp_path: Path, ggufs: tuple[Path, Path], how: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """`llmedge create m -f Modelfile` killed anywhere: `m` is the old model with its old defaults or
    the new one with the new defaults; the next create repairs and sweeps."""
    import typer

    from llmedge.cli.main import app as typer_app
    from llmedge.store import Store, digest_of

    app = typer.main.get_command(typer_app).main  # the CLI, its command tree built once, not per kill point
    root, pristine = tmp_path / "store", tmp_path / "pristine"
    monkeypatch.setenv("LLMEDGE_MODELS", str(root))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    old_file, new_file = ggufs
    app(["create", "m:latest", "-f", str(_modelfile(tmp_path, old_file, "old"))], standalone_mode=False)
    if how == "from-name":
        app(["create", "base:new", "-f", str(_modelfile(tmp_path, new_file, "base"))], standalone_mode=False)
        new_mf = tmp_path / "Modelfile.new"
        new_mf.write_text("FROM base:new\nSYSTEM new\n")
    else:
        new_mf = _modelfile(tmp_path, new_file, "new")
    shutil.copytree(root, pristine)

    def create() -> None:
        if how == "copy":  # another file system: no hard link, the bytes are copied
            def no_link(*a: Any, **k: Any) -> None:
                raise OSError(18, "Invalid cross-device link")
            os.link = no_link  # type: ignore[assignment]
        app(["create", "m:latest", "-f", str(new_mf)], standalone_mode=False)

    def state() -> str:
        s = Store(root)
        digest = digest_of(s.resolve("m:latest"))
        system = s.config("m:latest")["system"]
        assert (digest, system) in ((sha(old_file.read_bytes()), "old"), (sha(new_file.read_bytes()), "new"))
        return system

    seen = set()
    points = kill_points(create)
    for budget in points:
        shutil.rmtree(root)
        shutil.copytree(pristine, root)
        sig, _ = in_child(create, budget)
        assert sig == signal.SIGKILL, budget
        seen.add(state())
        in_child(create, unlimited())  # the next create: new, and the killed one's temp files gone
        assert state() == "new" and hidden_files(root) == [], budget
        assert sorted(e.name for e in Store(root).list()) == sorted(["m:latest"] + ["base:new"] * (how == "from-name"))
    print(f"cli create ({how}): {len(points)} kill points")
    assert seen == {"old", "new"}


def _uvicorn_config() -> Any:
    """`llmedge serve`'s app under uvicorn, loaded (imports done) in the test process once; each kill
    point's child then only starts serving it."""
    import uvicorn

    from llmedge.server.app import config_from_env, create_app

    config = uvicorn.Config(create_app(config_from_env(host="127.0.0.1", backend="numpy")), log_level="error",
                            lifespan="on")
    config.load()
    return config


def _serve_in_child(config: Any, sock: socket.socket) -> Any:
    def action() -> None:
        import uvicorn

        server = uvicorn.Server(config)
        # the test's "done, exit" (uvicorn re-raises a SIGTERM it drained, which would end the child
        # before it reports what it did)
        signal.signal(signal.SIGUSR1, lambda *_: setattr(server, "should_exit", True))
        server.run(sockets=[sock])

    return action


def test_kill_during_http_create_leaves_old_or_new(tmp_path: Path, ggufs: tuple[Path, Path],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A `llmedge serve` killed anywhere in POST /api/blobs + POST /api/create: the model is old or new
    (never a manifest naming a missing or partial blob); the next upload and create repair and sweep."""
    import httpx

    from llmedge.store import Store, digest_of

    root, pristine = tmp_path / "store", tmp_path / "pristine"
    monkeypatch.setenv("LLMEDGE_MODELS", str(root))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    old_file, new_file = ggufs
    Store(root).create("m:latest", old_file, {"system": "old"})
    shutil.copytree(root, pristine)
    new = new_file.read_bytes()
    holder: dict[str, socket.socket] = {}
    config = _uvicorn_config()

    def client(pid: int) -> None:
        sock = holder.pop("sock")
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        sock.close()  # only the child listens now: when it dies, connecting fails instead of hanging
        try:
            with httpx.Client(base_url=url, timeout=20) as c:
                r = c.post(f"/api/blobs/{sha(new)}", content=new)
                assert r.status_code == 201, r.text
                r = c.post("/api/create", json={"model": "m:latest", "files": {"new.gguf": sha(new)},
                                                "system": "new", "stream": False})
                assert r.status_code == 200 and r.json()["status"] == "success", r.text
        except httpx.TransportError:
            return  # the server was killed
        os.kill(pid, signal.SIGUSR1)  # it served both: let it shut down and report

    def run(budget: Any) -> tuple[int, dict[str, int]]:
        sock = socket.create_server(("127.0.0.1", 0))
        holder["sock"] = sock
        try:
            return in_child(_serve_in_child(config, sock), budget, client)
        finally:
            holder.pop("sock", None)
            sock.close()

    def state() -> str:
        s = Store(root)
        digest = digest_of(s.resolve("m:latest"))
        system = s.config("m:latest")["system"]
        assert (digest, system) in ((sha(old_file.read_bytes()), "old"), (sha(new), "new"))
        return system

    sig, usage = run(unlimited())
    assert sig == 0 and usage, f"the unkilled server run failed ({sig})"
    shutil.rmtree(root)
    shutil.copytree(pristine, root)
    assert state() == "old"
    seen = set()
    points = points_for(usage)
    print(f"http create: {len(points)} kill points")
    for budget in points:
        shutil.rmtree(root)
        shutil.copytree(pristine, root)
        assert run(budget)[0] == signal.SIGKILL, budget
        seen.add(state())
        assert [e.name for e in Store(root).list()] == ["m:latest"]
    assert seen == {"old", "new"}
    assert hidden_files(root)  # the last kill left a temp file...
    assert run(unlimited())[0] == 0
    assert state() == "new" and hidden_files(root) == []  # ...which the next server run swept
