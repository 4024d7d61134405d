"""Hugging Face pulls through huggingface_hub against a fake Hub on loopback (tests/fake_hub.py):
file choice by quant, download into the HF cache, a link (not a copy) in llmedge's store, no second
download, offline runs from the cache, and a missing template supplied by the repo."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from fake_hub import COMMIT, FakeHub, serve
from tiny_gguf import write_tiny_llama

from llmedge.errors import StoreError
from llmedge.hf_source import choose_file

REPO = "Org/Tiny-GGUF"
JINJA = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    d = tmp_path_factory.mktemp("hub")
    return {
        "tiny-Q4_K_M.gguf": write_tiny_llama(d / "a.gguf", seed=5).read_bytes(),
        "tiny-Q8_0.gguf": write_tiny_llama(d / "b.gguf", seed=6).read_bytes(),
        "mmproj-tiny-Q4_K_M.gguf": b"GGUF-not-a-model",
        "README.md": b"# tiny\n",
        "notemplate.gguf": write_tiny_llama(d / "c.gguf", seed=7, template=None).read_bytes(),
    }


@pytest.fixture
def hub(files: dict[str, bytes]):
    h = FakeHub(repos={REPO: {k: v for k, v in files.items() if k != "notemplate.gguf"},
                       "org/bare": {"model.gguf": files["notemplate.gguf"], "chat_template.jinja": JINJA.encode()}})
    server = serve(h)
    yield h, server
    server.shutdown()
    server.server_close()


def cli(tmp_path: Path, hub_url: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "LLMEDGE_MODELS": str(tmp_path / "store"), "OLLAMA_MODELS": str(tmp_path / "ollama"),
            "HF_ENDPOINT": hub_url, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_DISABLE_TELEMETRY": "1", **env}
    for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HUB_OFFLINE", "HF_TOKEN"):
        if key not in env:
            full.pop(key, None)
    return subprocess.run([sys.executable, "-m", "llmedge.cli.main", *args], capture_output=True, text=True,
                          env=full, timeout=120, stdin=subprocess.DEVNULL)


def ok(p: subprocess.CompletedProcess) -> str:
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_choose_file_by_quant_filename_and_default() -> None:
    fs = ["a/M-IQ4_K_M.gguf", "a/M-Q4_K_M.gguf", "a/M-Q8_0.gguf", "mmproj-Q4_K_M.gguf", "README.md"]
    assert choose_file(fs, "q4_k_m", "r") == "a/M-Q4_K_M.gguf"
    assert choose_file(fs, "Q8_0", "r") == "a/M-Q8_0.gguf"
    assert choose_file(fs, "m-q8_0.gguf", "r") == "a/M-Q8_0.gguf"
    assert choose_file(fs, None, "r") == "a/M-Q4_K_M.gguf"
    assert choose_file(["x-Q8_0.gguf", "x-F16.gguf"], "latest", "r") == "x-Q8_0.gguf"
    assert choose_file(["only.gguf"], None, "r") == "only.gguf"
    with pytest.raises(StoreError, match="has no GGUF file for 'q2_k'; it has: M-IQ4_K_M.gguf"):
        choose_file(fs, "q2_k", "r")
    split = ["m-Q4_K_M-00002-of-00002.gguf", "m-Q4_K_M-00001-of-00002.gguf"]
    assert choose_file(split, "q4_k_m", "r") == "m-Q4_K_M-00001-of-00002.gguf"


def test_pull_links_from_the_hf_cache_and_second_pull_downloads_nothing(tmp_path: Path, hub, files) -> None:
    h, _ = hub
    out = ok(cli(tmp_path, h.url, "pull", f"hf.co/{REPO}:q4_k_m"))
    assert "pulled hf.co/" in out and h.gets("tiny-Q4_K_M.gguf") == 1
    hf_blobs = list((tmp_path / "hf" / "hub" / "models--Org--Tiny-GGUF" / "blobs").iterdir())
    assert [p.read_bytes() for p in hf_blobs] == [files["tiny-Q4_K_M.gguf"]]
    from llmedge.store import Store

    source = Store(tmp_path / "store").manifest(f"hf.co/{REPO}:q4_k_m")["source"]
    assert source["repo"] == REPO and source["file"] == "tiny-Q4_K_M.gguf" and source["commit"] == COMMIT
    listing = ok(cli(tmp_path, h.url, "list")).splitlines()
    assert listing[1].startswith("hf.co/org/tiny-gguf:q4_k_m")
    link = next((tmp_path / "store" / "blobs").iterdir())
    assert link.is_symlink() and link.resolve() == hf_blobs[0].resolve()  # a link, not a second copy
    ok(cli(tmp_path, h.url, "pull", f"huggingface.co/{REPO}:Q4_K_M"))
    ok(cli(tmp_path, h.url, "pull", f"hf://{REPO}:q4_k_m"))
    assert h.gets("tiny-Q4_K_M.gguf") == 1  # no second download
    ok(cli(tmp_path, h.url, "rm", f"hf.co/{REPO}:q4_k_m"))
    assert not link.exists() and not link.is_symlink() and hf_blobs[0].read_bytes() == files["tiny-Q4_K_M.gguf"]


def test_run_pulls_on_first_use_and_runs_offline_from_the_cache(tmp_path: Path, hub) -> None:
    h, server = hub
    first = ok(cli(tmp_path, h.url, "run", f"hf.co/{REPO}", "hi", "--temperature", "0", "--num-predict", "3"))
    assert h.gets("tiny-Q4_K_M.gguf") == 1  # no tag: Q4_K_M
    server.shutdown()
    server.server_close()
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "hf").symlink_to(tmp_path / "hf")
    again = cli(fresh, "http://127.0.0.1:9", "run", f"hf.co/{REPO}:Q4_K_M", "hi", "--temperature", "0",
                "--num-predict", "3", HF_HUB_OFFLINE="1")
    assert ok(again) == first
    refused = cli(fresh, "http://127.0.0.1:9", "pull", f"hf.co/{REPO}:q8_0", HF_HUB_OFFLINE="1")
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1


def test_missing_template_comes_from_the_repo(tmp_path: Path, hub, monkeypatch: pytest.MonkeyPatch) -> None:
    h, _ = hub
    monkeypatch.setenv("HF_ENDPOINT", h.url)
    ok(cli(tmp_path, h.url, "pull", "hf.co/org/bare"))
    monkeypatch.setenv("LLMEDGE_MODELS", str(tmp_path / "store"))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    import llmedge

    m = llmedge.load("hf.co/org/bare", backend="numpy")
    assert m.template_origin.startswith("modelfile") and m.apply_chat_template(
        [{"role": "user", "content": "x"}]) == "[user] x\n"


def test_missing_repo_and_wrong_quant_are_one_line(tmp_path: Path, hub) -> None:
    h, _ = hub
    for name, text in ((f"hf.co/{REPO}:q2_k", "no GGUF file for 'q2_k'"),
                       ("hf.co/org/nope", "hf.co/org/nope: no such repository on the Hub (a private one needs HF_TOKEN)"),
                       ("hf.co/org", "invalid Hugging Face name 'hf.co/org': use hf.co/ORG/REPO[:QUANT]")):
        p = cli(tmp_path, h.url, "pull", name)
        assert p.returncode == 1 and p.stderr.count("\n") == 1 and text in p.stderr, p.stderr


def test_an_unreachable_hub_is_one_line_at_once(tmp_path: Path) -> None:
    import socket
    import time

    with socket.socket() as s:  # a loopback port nobody listens on: connection refused
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    for args in (("pull", f"hf.co/{REPO}:q4_k_m"), ("convert", f"hf.co/{REPO}", "-o", str(tmp_path / "x.gguf"))):
        start = time.monotonic()
        p = cli(tmp_path, url, *args)
        assert time.monotonic() - start < 15, "retried a refused connection"  # huggingface_hub's: ~24 s
        assert p.returncode == 1 and p.stderr.count("\n") == 1, p.stderr
        assert "cannot reach" in p.stderr and "connection refused" in p.stderr and "HF_HUB_OFFLINE" in p.stderr
    assert not (tmp_path / "store" / "manifests").exists() and not (tmp_path / "x.gguf").exists()


def test_a_real_model_pulled_from_the_hub_runs(tmp_path: Path, smollm2_path: Path) -> None:
    repo = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"
    h = FakeHub(repos={repo: {"smollm2-135m-instruct-q4_1.gguf": smollm2_path, "README.md": b"hi"}})
    server = serve(h)
    try:
        ok(cli(tmp_path, h.url, "pull", f"hf.co/{repo}:Q4_1"))
        out = ok(cli(tmp_path, h.url, "run", f"hf.co/{repo}:q4_1", "Why is the sky blue?", "--temperature", "0",
                     "--num-predict", "8"))
    finally:
        server.shutdown()
        server.server_close()
    assert out.strip() and h.gets(".gguf") == 1
    link = next((tmp_path / "store" / "blobs").iterdir())
    assert link.name == smollm2_path.name and link.is_symlink()
    assert link.resolve().parent.parent.name == "models--HuggingFaceTB--SmolLM2-135M-Instruct-GGUF"


def test_a_split_model_is_assembled_into_one_gguf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    whole = write_tiny_llama(tmp_path / "whole.gguf", seed=9)
    write_tiny_llama(tmp_path / "m-Q8_0.gguf", seed=9, split_max_tensors=5)
    parts = sorted(tmp_path.glob("m-Q8_0-0000?-of-00003.gguf"))
    assert len(parts) == 3
    h = FakeHub(repos={"org/split": {p.name: p.read_bytes() for p in parts}})
    server = serve(h)
    try:
        ok(cli(tmp_path, h.url, "pull", "hf.co/org/split:q8_0"))
        ok(cli(tmp_path, h.url, "pull", "hf.co/org/split:q8_0"))
    finally:
        server.shutdown()
        server.server_close()
    assert h.gets(".gguf") == 3
    monkeypatch.setenv("LLMEDGE_MODELS", str(tmp_path / "store"))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    import llmedge
    from llmedge.gguf import GGUFFile
    from llmedge.store import Store

    merged = GGUFFile(Store().resolve("hf.co/org/split:q8_0"))
    ref = GGUFFile(whole)
    assert list(merged.tensors) == list(ref.tensors)
    assert all(bytes(merged.tensor(n).data) == bytes(ref.tensor(n).data) for n in ref.tensors)
    assert not any(k.startswith("split.") for k in merged.metadata)
    a = [c.token for c in llmedge.load("hf.co/org/split:q8_0", backend="numpy").generate("hi", max_tokens=4,
                                                                                     temperature=0)]
    b = [c.token for c in llmedge.load(str(whole), backend="numpy").generate("hi", max_tokens=4, temperature=0)]
    assert a == b


def test_split_parts_out_of_order_or_missing_are_refused(tmp_path: Path) -> None:
    from llmedge.splits import merge_splits, split_siblings

    write_tiny_llama(tmp_path / "m.gguf", seed=9, split_max_tensors=5)
    parts = sorted(tmp_path.glob("m-0000?-of-00003.gguf"))
    with pytest.raises(StoreError, match=r"m-00002-of-00003.gguf is not part 1 of 3"):
        merge_splits([parts[1], parts[0], parts[2]], tmp_path / "out.gguf")
    with pytest.raises(StoreError, match="part m-00003-of-00003.gguf is missing"):
        split_siblings(parts[0].name, [p.name for p in parts[:2]])
    assert split_siblings("x.gguf", ["x.gguf"]) is None


def test_hf_token_and_hub_cache_are_honoured(tmp_path: Path, files) -> None:
    h = FakeHub(repos={REPO: {"tiny-Q8_0.gguf": files["tiny-Q8_0.gguf"]}}, token="hf_secret")
    server = serve(h)
    try:
        denied = cli(tmp_path, h.url, "pull", f"hf.co/{REPO}")
        assert denied.returncode == 1 and denied.stderr.count("\n") == 1, denied.stderr
        cache = tmp_path / "elsewhere"
        ok(cli(tmp_path, h.url, "pull", f"hf.co/{REPO}", HF_TOKEN="hf_secret", HF_HUB_CACHE=str(cache)))
    finally:
        server.shutdown()
        server.server_close()
    blob = next((cache / "models--Org--Tiny-GGUF" / "blobs").iterdir())
    assert blob.read_bytes() == files["tiny-Q8_0.gguf"]  # no Q4_K_M in this repo: the next default
    assert next((tmp_path / "store" / "blobs").iterdir()).resolve() == blob.resolve()


def test_a_dropped_download_is_retried_and_verified(tmp_path: Path, files) -> None:
    h = FakeHub(repos={REPO: {"tiny-Q4_K_M.gguf": files["tiny-Q4_K_M.gguf"]}}, drop_after=30000)
    server = serve(h)
    try:
        first = cli(tmp_path, h.url, "pull", f"hf.co/{REPO}")  # huggingface_hub retries within the pull
    finally:
        server.shutdown()
        server.server_close()
    assert first.returncode == 0, first.stderr
    assert h.gets("tiny-Q4_K_M.gguf") == 2
    assert next((tmp_path / "store" / "blobs").iterdir()).read_bytes() == files["tiny-Q4_K_M.gguf"]


def test_bytes_that_do_not_match_the_hub_sha256_are_refused(tmp_path: Path, files) -> None:
    h = FakeHub(repos={REPO: {"tiny-Q4_K_M.gguf": files["tiny-Q4_K_M.gguf"]}}, corrupt=True)
    server = serve(h)
    try:
        p = cli(tmp_path, h.url, "pull", f"hf.co/{REPO}")
    finally:
        server.shutdown()
        server.server_close()
    assert p.returncode == 1 and p.stderr.count("\n") == 1 and "sha256 mismatch" in p.stderr, p.stderr
    assert not (tmp_path / "store" / "manifests").exists() or not any((tmp_path / "store" / "manifests").iterdir())
