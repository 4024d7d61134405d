"""`llmedge ps` and `llmedge stop` as a user runs them (subprocesses) against a real `llmedge serve` on
loopback, with a tiny random-weight model loaded through the Ollama API."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from test_server_api import running_server
from test_store_cli import llmedge_cmd, ok, one_line_error
from tiny_gguf import write_tiny_llama

from llmedge.cli.running import _duration, _size, _until
from llmedge.store import Store

MODEL = "tiny:1"
KEY = "s3cret-key"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    root = tmp_path_factory.mktemp("running")
    Store(root / "store").create(MODEL, write_tiny_llama(root / "tiny.gguf", seed=5))
    saved = os.environ.get("LLMEDGE_MODELS")
    os.environ["LLMEDGE_MODELS"] = str(root / "store")
    try:
        with running_server(parallel=1, max_queue=4, api_key=KEY) as url:
            yield {"url": url, "root": root, "env": {"LLMEDGE_HOST": url.removeprefix("http://"),
                                                     "LLMEDGE_API_KEY": KEY}}
    finally:
        if saved is None:
            os.environ.pop("LLMEDGE_MODELS", None)
        else:
            os.environ["LLMEDGE_MODELS"] = saved


def _load(server: dict, keep_alive) -> None:
    r = httpx.post(server["url"] + "/api/generate", json={"model": MODEL, "keep_alive": keep_alive},
                   headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    assert r.status_code == 200 and r.json()["done_reason"] == "load", r.text


def _rows(out: str) -> list[dict[str, str]]:
    """ps's table as one dict per model, cut at the header's column starts."""
    lines = out.splitlines()
    names = ["NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "UNTIL"]
    assert lines[0].split() == names
    starts = [lines[0].index(n) for n in names] + [None]
    return [{n: line[starts[i]:starts[i + 1]].strip() for i, n in enumerate(names)} for line in lines[1:]]


def test_ps_lists_the_loaded_model_and_stop_unloads_it(server: dict, tmp_path: Path) -> None:
    env = server["env"]
    assert _rows(ok(llmedge_cmd(tmp_path, "ps", env=env))) == []
    _load(server, -1)
    [row] = _rows(ok(llmedge_cmd(tmp_path, "ps", env=env)))
    [entry] = Store(server["root"] / "store").list()
    assert row["NAME"] == MODEL and row["ID"] == entry.digest.split(":")[-1][:12], row
    [api] = httpx.get(server["url"] + "/api/ps", headers={"Authorization": f"Bearer {KEY}"}).json()["models"]
    assert row["SIZE"] == _size(api["size"]) and row["SIZE"].endswith(" KB"), row
    assert row["PROCESSOR"] == "100% CPU" and row["CONTEXT"] == str(api["context_length"]), row
    assert row["UNTIL"] == "Forever", row
    _load(server, "4m")
    [row] = _rows(ok(llmedge_cmd(tmp_path, "ps", env=env)))
    assert row["UNTIL"] in ("3 minutes from now", "4 minutes from now"), row
    # stop takes the name as the user spells it (case, no tag means latest: not this one)
    one_line_error(llmedge_cmd(tmp_path, "stop", "tiny", env=env), "model 'tiny' is not running (running: tiny:1)")
    ok(llmedge_cmd(tmp_path, "stop", "TINY:1", env=env))
    deadline = time.time() + 10
    while _rows(ok(llmedge_cmd(tmp_path, "ps", env=env))) and time.time() < deadline:
        time.sleep(0.2)
    assert _rows(ok(llmedge_cmd(tmp_path, "ps", env=env))) == []


def test_ps_errors_are_one_line(server: dict, tmp_path: Path) -> None:
    no_key = {**server["env"], "LLMEDGE_API_KEY": ""}
    one_line_error(llmedge_cmd(tmp_path, "ps", env=no_key), "refused the request (401): set LLMEDGE_API_KEY")
    closed = {"LLMEDGE_HOST": "127.0.0.1:9"}
    one_line_error(llmedge_cmd(tmp_path, "ps", env=closed), "could not connect to llmedge serve at http://127.0.0.1:9")
    one_line_error(llmedge_cmd(tmp_path, "stop", "tiny:1", env=closed), "is it running?")
    one_line_error(llmedge_cmd(tmp_path, "ps", env={"LLMEDGE_HOST": "localhost:port"}),
                   "LLMEDGE_HOST='localhost:port' is not HOST, HOST:PORT")
    one_line_error(llmedge_cmd(tmp_path, "ps", env={"LLMEDGE_HOST": "localhost:70000"}), "out of range")


def test_until_reads_ollama_times() -> None:
    now = 1_700_000_000.0
    assert _until("2318-11-26T00:00:00.000000000Z", now) == "Forever"
    assert _until("2023-11-14T22:13:20.123456789Z", now) == "Less than a second from now"
    assert _until("2023-11-14T22:12:20Z", now) == "Stopping..."
    assert _until("2023-11-14T22:17:21+00:00", now) == "4 minutes from now"
    assert _until("garbage", now) == "Unknown" and _until(None, now) == "Unknown"
    assert [_duration(s) for s in (0.5, 1, 59, 60, 3599, 3600, 7200, 3 * 86400)] == [
        "Less than a second", "1 second", "59 seconds", "About a minute", "59 minutes", "About an hour",
        "2 hours", "3 days"]
    assert [_size(n) for n in (512, 865_923, 1_500_000, 12_900_000, 2_000_000_000)] == [
        "512 B", "865 KB", "1.5 MB", "12 MB", "2 GB"]
