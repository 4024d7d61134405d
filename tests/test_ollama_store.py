"""An existing Ollama store (`OLLAMA_MODELS`, laid out as Ollama lays it out) is listed, shown and run
in place by llmedge, and nothing under it is ever created, changed or removed."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_gguf import write_tiny_llama

from llmedge.errors import StoreError
from llmedge.store import Store

MEDIA = "application/vnd.ollama.image."


def put_blob(root: Path, data: bytes) -> dict:
    d = hashlib.sha256(data).hexdigest()
    (root / "blobs" / f"sha256-{d}").write_bytes(data)
    return {"digest": f"sha256:{d}", "size": len(data)}


def write_ollama_store(root: Path, gguf: bytes) -> None:
    (root / "blobs").mkdir(parents=True)
    layers = [{"mediaType": MEDIA + "model", **put_blob(root, gguf)},
              {"mediaType": MEDIA + "params", **put_blob(root, json.dumps({"temperature": 0,
                                                                            "num_predict": 3}).encode())},
              {"mediaType": MEDIA + "system", **put_blob(root, b"You are tiny.")},
              {"mediaType": MEDIA + "template", **put_blob(root, b"{{ .System }}{{ .Prompt }}")}]
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                           **put_blob(root, b"{}")}, "layers": layers}
    for path in ("registry.ollama.ai/library/tiny/1b", "registry.ollama.ai/someone/other/latest"):
        f = root / "manifests" / path
        f.parent.mkdir(parents=True)
        f.write_text(json.dumps(manifest))
    broken = root / "manifests/registry.ollama.ai/library/broken/latest"
    broken.parent.mkdir(parents=True)
    broken.write_text("{not json")


def snapshot(root: Path) -> dict[str, tuple[int, int, str]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns,
                                       hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "")
            for p in sorted(root.rglob("*"))}


@pytest.fixture
def ollama_dir(tmp_path: Path) -> Path:
    root = tmp_path / "ollama"
    write_ollama_store(root, write_tiny_llama(tmp_path / "t.gguf", seed=11).read_bytes())
    return root


def cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "LLMEDGE_MODELS": str(tmp_path / "store"), "OLLAMA_MODELS": str(tmp_path / "ollama")}
    return subprocess.run([sys.executable, "-m", "llmedge.cli.main", *args], capture_output=True, text=True,
                          env=env, timeout=120, stdin=subprocess.DEVNULL)


def test_list_show_run_cp_in_place_without_writing(tmp_path: Path, ollama_dir: Path) -> None:
    before = snapshot(ollama_dir)
    out = cli(tmp_path, "list")
    assert out.returncode == 0, out.stderr
    rows = [line.split()[0] for line in out.stdout.splitlines()[1:]]
    assert rows == ["someone/other:latest", "tiny:1b"] and "(ollama store)" in out.stdout
    shown = cli(tmp_path, "show", "tiny:1b")
    assert shown.returncode == 0, shown.stderr
    assert str(ollama_dir / "blobs") in shown.stdout and "Go template, rendered as Ollama does" in shown.stdout
    ran = cli(tmp_path, "run", "TINY:1b", "hi")
    assert ran.returncode == 0 and ran.stdout.strip(), ran.stderr
    assert cli(tmp_path, "run", "tiny:1b", "hi").stdout == ran.stdout  # params layer: temperature 0
    assert cli(tmp_path, "cp", "tiny:1b", "mine").returncode == 0
    store = Store(tmp_path / "store", ollama_root=ollama_dir)
    assert store.resolve("mine").resolve() == store.resolve("tiny:1b")
    assert store.config("mine")["system"] == "You are tiny."
    rm = cli(tmp_path, "rm", "tiny:1b")
    assert rm.returncode == 1 and "which llmedge never changes" in rm.stderr and rm.stderr.count("\n") == 1
    assert snapshot(ollama_dir) == before


def test_a_store_model_shadows_the_ollama_one_of_the_same_name(tmp_path: Path, ollama_dir: Path) -> None:
    store = Store(tmp_path / "store", ollama_root=ollama_dir)
    own = write_tiny_llama(tmp_path / "own.gguf", seed=12)
    store.create("tiny:1b", own)
    assert store.resolve("tiny:1b").read_bytes() == own.read_bytes()
    assert [(e.name, e.where) for e in store.list()] == [("tiny:1b", "llmedge"), ("someone/other:latest", "ollama")]


def test_bad_layer_digests_are_not_followed(tmp_path: Path, ollama_dir: Path) -> None:
    f = ollama_dir / "manifests/registry.ollama.ai/library/tiny/1b"
    data = json.loads(f.read_text())
    data["layers"][0]["digest"] = "sha256:../../../etc/passwd"
    f.write_text(json.dumps(data))
    store = Store(tmp_path / "store", ollama_root=ollama_dir)
    assert [e.name for e in store.list()] == ["someone/other:latest"]
    with pytest.raises(StoreError, match="not found"):
        store.resolve("tiny:1b")


def test_names_ollama_kept_in_their_typed_case_are_found_in_any_case(tmp_path: Path, ollama_dir: Path) -> None:
    src = ollama_dir / "manifests/registry.ollama.ai/library/tiny/1b"
    for path in ("hf.co/bartowski/SmolLM2-135M-Instruct-GGUF/Q4_K_M", "registry.ollama.ai/Someone/Mixed/Latest"):
        f = ollama_dir / "manifests" / path  # as `ollama pull hf.co/bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M`
        f.parent.mkdir(parents=True)
        f.write_text(src.read_text())
    before = snapshot(ollama_dir)
    store = Store(tmp_path / "store", ollama_root=ollama_dir)
    names = [e.name for e in store.list()]
    assert "hf.co/bartowski/smollm2-135m-instruct-gguf:q4_k_m" in names and "someone/mixed:latest" in names
    for name in ("hf.co/bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M", "hf.co/bartowski/smollm2-135m-instruct-gguf:q4_k_m",
                 "someone/mixed", "SOMEONE/MIXED:LATEST"):
        assert store.resolve(name) == store.resolve("tiny:1b"), name
    assert store.config("someone/mixed")["system"] == "You are tiny."
    store.copy("hf.co/bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M", "mine")
    assert store.resolve("mine").resolve() == store.resolve("tiny:1b")
    assert snapshot(ollama_dir) == before


def test_a_copy_whose_ollama_file_went_away_says_where_it_came_from(tmp_path: Path, ollama_dir: Path) -> None:
    store = Store(tmp_path / "store", ollama_root=ollama_dir)
    store.copy("tiny:1b", "mine")
    store.resolve("tiny:1b").unlink()  # `ollama rm tiny:1b` (and the other name sharing it) removed the file
    with pytest.raises(StoreError) as e:
        store.resolve("mine")
    assert str(e.value).endswith("it is the Ollama store's 'tiny:1b': `ollama pull tiny:1b` fetches it again")
