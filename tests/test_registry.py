"""Pulls from an Ollama registry: a fake one on loopback (tests/fake_registry.py) serving tiny GGUFs,
with a CDN redirect, a token challenge, dropped connections, wrong digests, missing tags, a slow
server killed midway, and concurrent pulls of one blob."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from fake_registry import FakeRegistry, digest, serve
from tiny_gguf import write_tiny_llama

import llmedge
from llmedge.errors import StoreError
from llmedge.store import Store


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return write_tiny_llama(tmp_path_factory.mktemp("m") / "tiny.gguf", seed=3).read_bytes()


@pytest.fixture
def registry():
    regs: list[FakeRegistry] = []
    servers = []

    def make(**kw) -> FakeRegistry:
        reg = FakeRegistry(**kw)
        servers.append(serve(reg))
        regs.append(reg)
        return reg

    yield make
    for s in servers:
        s.shutdown()
        s.server_close()


def store_at(tmp_path: Path, insecure: bool = True) -> Store:
    return Store(tmp_path / "store", catalog={}, insecure=insecure, ollama_root=tmp_path / "ollama",
                 retry_delay=0.01)


PARAMS = {"temperature": 0, "num_predict": 4, "stop": ["<|user|>"]}


def test_pull_applies_params_and_system_layers(tmp_path: Path, registry, gguf: bytes,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    reg = registry()
    reg.add_model("library/tiny", "1b", gguf, params=PARAMS, system="Be brief.",
                  template="{{ if .System }}<|system|>{{ .System }}{{ end }}{{ .Prompt }}")
    store = store_at(tmp_path)
    events: list[str] = []
    blob = store.pull(f"{reg.host}/library/tiny:1b", lambda s, **kw: events.append(s))
    assert blob.read_bytes() == gguf and blob.name == "sha256-" + digest(gguf)[7:]
    assert events[0] == "pulling manifest" and events[-3:] == ["verifying sha256 digest", "writing manifest",
                                                               "success"]
    name = f"{reg.host}/library/tiny:1b"
    assert store.config(name)["parameters"] == PARAMS and store.config(name)["system"] == "Be brief."
    assert [e.name for e in store.list()] == [name]
    monkeypatch.setenv("LLMEDGE_MODELS", str(store.root))
    m = llmedge.load(name, backend="numpy")
    assert m.template_origin.startswith("modelfile (the model's Go template")
    assert m.apply_chat_template(m._with_defaults([{"role": "user", "content": "x"}])) == "<|system|>Be brief.x"
    assert len(list(m.generate("x"))) <= 4


def test_library_names_go_to_the_library_namespace_and_blobs_follow_a_redirect(tmp_path: Path, registry,
                                                                               gguf: bytes) -> None:
    cdn = registry()
    reg = registry(redirect_to=cdn, require_token=True)
    reg.add_model("library/tiny", "latest", gguf)
    store = store_at(tmp_path)
    blob = store.pull(f"{reg.host}/library/tiny")  # tag latest
    assert blob.read_bytes() == gguf
    assert reg.count("/token") == 1 and cdn.count("/cdn/") == 1  # CDN saw no Authorization (else 400)
    assert store.manifest(f"{reg.host}/library/tiny:latest")["source"]["repository"] == "library/tiny"


def test_http_registry_needs_insecure(tmp_path: Path, registry, gguf: bytes) -> None:
    reg = registry()
    reg.add_model("library/tiny", "1", gguf)
    with pytest.raises(StoreError, match=r"^https://127\.0\.0\.1:\d+/v2/library/tiny/manifests/1: .*"
                       r"\(a registry that speaks plain http needs `llmedge pull --insecure`\)$"):
        store_at(tmp_path, insecure=False).pull(f"{reg.host}/library/tiny:1")
    assert reg.requests == []


def test_a_dropped_connection_is_resumed_with_a_range_request(tmp_path: Path, registry, gguf: bytes) -> None:
    reg = registry(drop_after=30000)
    d = reg.add_model("library/tiny", "1", gguf)
    blob = store_at(tmp_path).pull(f"{reg.host}/library/tiny:1")
    assert blob.read_bytes() == gguf
    ranges = [r for path, r in reg.requests if d in path]
    assert ranges == [None, "bytes=30000-"]


def test_a_wrong_digest_leaves_nothing_visible(tmp_path: Path, registry, gguf: bytes) -> None:
    reg = registry(corrupt=True)
    reg.add_model("library/tiny", "1", gguf)
    store = store_at(tmp_path)
    with pytest.raises(StoreError, match="failed verification"):
        store.pull(f"{reg.host}/library/tiny:1")
    assert store.list() == [] and [p.name for p in store.blobs_dir.iterdir() if not p.name.endswith(".lock")] == []


def test_a_disk_that_fills_up_midway_is_one_line_and_the_next_pull_resumes(tmp_path: Path, registry, gguf: bytes,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    import llmedge.registry as reg_mod

    real = reg_mod.sequential_fill

    def full_disk(read, size):
        def fill(part: Path, report) -> None:
            with open(part, "ab") as out:
                out.write(next(read(0, None))[:1000])
            raise OSError(errno.ENOSPC, "No space left on device")
        return fill

    reg = registry()
    reg.add_model("library/tiny", "1", gguf)
    store = store_at(tmp_path)
    monkeypatch.setattr(reg_mod, "sequential_fill", full_disk)
    with pytest.raises(StoreError) as e:
        store.pull(f"{reg.host}/library/tiny:1")
    assert str(e.value) == f"cannot write into the model store's blobs {store.blobs_dir}: No space left on device"
    assert store.list() == []
    monkeypatch.setattr(reg_mod, "sequential_fill", real)
    assert store.pull(f"{reg.host}/library/tiny:1").read_bytes() == gguf
    assert [r for path, r in reg.requests if "/blobs/" in path][-1] == "bytes=1000-"  # resumed


def test_a_missing_tag_is_one_line(tmp_path: Path, registry, gguf: bytes) -> None:
    reg = registry()
    reg.add_model("library/tiny", "1", gguf)
    with pytest.raises(StoreError, match=r"^model '127.0.0.1:\d+/library/tiny:2' not found in registry"):
        store_at(tmp_path).pull(f"{reg.host}/library/tiny:2")


def test_second_pull_downloads_no_blob(tmp_path: Path, registry, gguf: bytes) -> None:
    reg = registry()
    d = reg.add_model("library/tiny", "1", gguf)
    store = store_at(tmp_path)
    store.pull(f"{reg.host}/library/tiny:1")
    store.pull(f"{reg.host}/library/tiny:1")
    assert reg.count(d) == 1 and reg.count("/manifests/") == 2


def test_concurrent_pulls_of_one_blob_agree(tmp_path: Path, registry, gguf: bytes) -> None:
    reg = registry(throttle=0.002)
    d = reg.add_model("library/tiny", "1", gguf)
    reg.add_model("library/twin", "1", gguf)
    store = store_at(tmp_path)
    errors: list[BaseException] = []

    def pull(name: str) -> None:
        try:
            Store(store.root, catalog={}, insecure=True).pull(f"{reg.host}/library/{name}:1")
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=pull, args=(n,)) for n in ("tiny", "twin", "tiny")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert store.blob_path(d).read_bytes() == gguf and reg.count(d) == 1
    store.remove(f"{reg.host}/library/tiny:1")
    assert store.blob_path(d).is_file()  # twin still uses it


def test_killed_pull_resumes_and_verifies(tmp_path: Path, registry, gguf: bytes) -> None:
    reg = registry(throttle=0.02)
    d = reg.add_model("library/tiny", "1", gguf, params=PARAMS)
    name = f"{reg.host}/library/tiny:1"
    env = {**os.environ, "LLMEDGE_MODELS": str(tmp_path / "store"), "OLLAMA_MODELS": str(tmp_path / "ollama")}
    cmd = [sys.executable, "-m", "llmedge.cli.main", "pull", name, "--insecure"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    partial = tmp_path / "store" / "blobs" / f".partial-sha256-{d[7:]}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not partial.exists() or partial.stat().st_size < 20000):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    proc.kill()
    proc.wait()
    got = partial.stat().st_size
    assert 0 < got < len(gguf)
    store = Store(tmp_path / "store", catalog={}, ollama_root=tmp_path / "ollama")
    assert store.list() == []  # nothing half-pulled is visible
    reg.throttle = 0
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    ranges = [r for path, r in reg.requests if d in path]
    assert ranges[0] is None and ranges[-1] is not None and int(ranges[-1][6:-1]) >= got
    assert store.resolve(name).read_bytes() == gguf and not partial.exists()
    assert store.config(name)["parameters"] == PARAMS


def test_a_manifest_with_a_bad_digest_is_refused_before_any_path_is_built(tmp_path: Path, registry,
                                                                          gguf: bytes) -> None:
    reg = registry()
    reg.add_model("library/tiny", "1", gguf)
    reg.manifests["library/tiny:1"] = reg.manifests["library/tiny:1"].replace(
        digest(gguf).encode(), b"sha256:../../../../etc/passwd")
    store = store_at(tmp_path)
    with pytest.raises(StoreError, match=r"^invalid digest 'sha256:\.\./\.\./"):
        store.pull(f"{reg.host}/library/tiny:1")
    assert not store.blobs_dir.exists() or list(store.blobs_dir.iterdir()) == []
    for bad in ("127.0.0.1:1/../x:1", "127.0.0.1:1/library/x:../1", "evil.com/a/b/c:1"):
        with pytest.raises(StoreError, match="invalid model name"):
            store.pull(bad)
    assert reg.count("/v2/") == 1


def test_parallel_ranges_assemble_the_blob_and_resume_a_dropped_range(tmp_path: Path, registry,
                                                                      gguf: bytes) -> None:
    reg = registry(drop_after=5000)
    d = reg.add_model("library/tiny", "1", gguf)
    store = Store(tmp_path / "store", catalog={}, insecure=True, part_size=16384, retry_delay=0.01)
    assert store.pull(f"{reg.host}/library/tiny:1").read_bytes() == gguf
    ranges = sorted(r for path, r in reg.requests if d in path)
    starts = {int(r[6:].split("-")[0]) for r in ranges}
    assert len(ranges) == 6 and len(starts) == 6  # 5 ranges of ~16.6 KB, one resumed after the drop
    assert not list(store.blobs_dir.glob(".partial-*.ranges"))


def test_killed_parallel_pull_resumes_every_range(tmp_path: Path, registry, gguf: bytes) -> None:
    reg = registry(throttle=0.03)
    d = reg.add_model("library/tiny", "1", gguf)
    name = f"{reg.host}/library/tiny:1"
    code = ("import sys; from llmedge.store import Store; "
            "Store(sys.argv[1], catalog={}, insecure=True, part_size=16384).pull(sys.argv[2])")
    root = tmp_path / "store"
    proc = subprocess.Popen([sys.executable, "-c", code, str(root), name])
    state = root / "blobs" / f".partial-sha256-{d[7:]}.ranges"

    def progress() -> list[list[int]]:
        try:
            return json.loads(state.read_text())
        except (OSError, ValueError):
            return []

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (progress() and all(r[2] > 0 for r in progress())):
        assert proc.poll() is None
        time.sleep(0.01)
    proc.kill()
    proc.wait()
    recorded = progress()
    assert len(recorded) == 5 and sum(r[2] for r in recorded) < len(gguf)
    n_before = len(reg.requests)
    reg.throttle = 0
    store = Store(root, catalog={}, insecure=True, part_size=16384)
    assert store.list(include_ollama=False) == []
    assert store.pull(name).read_bytes() == gguf
    resumed = sorted(int(r[6:].split("-")[0]) for path, r in reg.requests[n_before:] if d in path)
    want = sorted(r[0] + r[2] for r in recorded if r[2] < r[1] - r[0])
    assert resumed == want  # every unfinished range continued where the killed pull recorded it
    assert not state.exists()


def test_run_pulls_a_registry_model_on_first_use(tmp_path: Path, registry, gguf: bytes) -> None:
    reg = registry()
    reg.add_model("library/tiny", "1", gguf, params=PARAMS, system="Be brief.")
    env = {**os.environ, "LLMEDGE_MODELS": str(tmp_path / "store"), "OLLAMA_MODELS": str(tmp_path / "ollama")}
    cmd = [sys.executable, "-m", "llmedge.cli.main", "run", f"{reg.host}/library/tiny:1", "hi"]
    refused = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1 and reg.requests == []
    first = subprocess.run([*cmd, "--insecure"], env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0 and first.stdout.strip(), first.stderr
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)  # local now
    assert again.stdout == first.stdout  # PARAMETER temperature 0 from the params layer
    assert reg.count("/manifests/") == 1


def test_a_manifest_announcing_more_bytes_than_the_disk_has_is_refused(tmp_path: Path, registry,
                                                                       gguf: bytes) -> None:
    reg = registry()
    reg.add_model("library/tiny", "1", gguf)
    reg.manifests["library/tiny:1"] = reg.manifests["library/tiny:1"].replace(
        f'"size": {len(gguf)}'.encode(), b'"size": 1000000000000000000', 1)
    store = store_at(tmp_path)
    with pytest.raises(StoreError, match="^not enough disk space for a 1000000000000000000 byte model"):
        store.pull(f"{reg.host}/library/tiny:1")
    assert [p.name for p in store.blobs_dir.iterdir()] == []
