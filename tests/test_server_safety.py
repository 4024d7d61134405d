"""The server refuses bad input with 4xx in Ollama's or OpenAI's error shape (never a 500), checks the
Host header, CORS origins and the API key, bounds bodies, num_ctx and the queue, frees a slot when a
client disconnects, refuses an open bind without a key, and shuts down on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from test_server_api import MODEL, free_port, running_server, store_root  # noqa: F401  (fixture)


@pytest.fixture(scope="module")
def url(store_root: Path) -> Iterator[str]:  # noqa: F811
    with running_server(parallel=1, max_queue=1, max_body=64 * 1024, max_ctx=32768) as base:
        yield base


def post(url: str, path: str, body: object, **kw: object) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(url + path, content=content, timeout=60, headers={"content-type": "application/json"},
                      **kw)  # type: ignore[arg-type]


def assert_ollama_error(r: httpx.Response, status: int) -> None:
    assert r.status_code == status, r.text
    assert isinstance(r.json()["error"], str) and r.json()["error"]


def assert_openai_error(r: httpx.Response, status: int) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["type"]


def test_malformed_json_wrong_types_and_unknown_model_are_4xx(url: str) -> None:
    assert_ollama_error(post(url, "/api/generate", b"{not json"), 400)
    assert_ollama_error(post(url, "/api/generate", b"[1, 2]"), 400)
    assert_ollama_error(post(url, "/api/chat", {"model": MODEL, "messages": "hi"}), 400)
    assert_ollama_error(post(url, "/api/generate", {"model": MODEL, "prompt": 5}), 400)
    assert_ollama_error(post(url, "/api/generate", {"model": MODEL, "prompt": "x", "stream": "yes"}), 400)
    assert_ollama_error(post(url, "/api/generate", {"model": MODEL, "prompt": "x",
                                                    "options": {"temperature": "hot"}}), 400)
    assert_ollama_error(post(url, "/api/generate", {"model": MODEL, "prompt": "x",
                                                    "options": {"bogus_option": 1}}), 400)
    assert_ollama_error(post(url, "/api/generate", {"model": "nosuch:model", "prompt": "x"}), 404)
    assert_ollama_error(post(url, "/api/generate", {"model": "../../etc/passwd", "prompt": "x"}), 400)
    assert_ollama_error(post(url, "/api/show", {"model": "nosuch"}), 404)
    assert_openai_error(post(url, "/v1/chat/completions", {"model": "nosuch", "messages": [
        {"role": "user", "content": "x"}]}), 404)
    assert_openai_error(post(url, "/v1/chat/completions", b"{"), 400)
    assert_openai_error(post(url, "/v1/chat/completions", {"model": MODEL, "messages": [{"role": 1}]}), 400)
    assert_openai_error(post(url, "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": "many"}), 400)
    assert_ollama_error(httpx.get(url + "/api/nothing"), 404)


def test_absurd_num_ctx_and_out_of_range_token_ids_are_400(url: str) -> None:
    for n in (10**12, -5, 0, 1.5):
        assert_ollama_error(post(url, "/api/generate", {"model": MODEL, "prompt": "x",
                                                        "options": {"num_ctx": n}}), 400)
    assert_ollama_error(post(url, "/api/generate", {"model": MODEL, "prompt": "x", "stream": False,
                                                    "context": [10**9]}), 400)
    assert_ollama_error(post(url, "/api/generate", {"model": MODEL, "prompt": "x", "context": [-1]}), 400)
    assert_openai_error(post(url, "/v1/completions", {"model": MODEL, "prompt": [1, 99999999]}), 400)
    r = post(url, "/v1/completions", {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 2})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 3


def test_uncompilable_schema_is_400_with_reason(url: str) -> None:
    r = post(url, "/api/chat", {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                                "format": {"type": "strin"}})
    assert_ollama_error(r, 400)
    assert "strin" in r.json()["error"]
    assert_ollama_error(post(url, "/api/generate", {"model": MODEL, "prompt": "x", "format": 5}), 400)


def test_every_route_survives_garbage_without_a_500(url: str) -> None:
    bodies: list[object] = [b"", b"null", b"\xff\xfe", {"model": None}, {"model": ["x"]}, {"model": MODEL,
                            "messages": [None]}, {"model": MODEL, "prompt": {"a": 1}, "options": []},
                            {"model": MODEL, "keep_alive": "forever"}, {"source": 1, "destination": None}]
    routes = ["/api/generate", "/api/chat", "/api/show", "/api/pull", "/api/copy", "/v1/chat/completions",
              "/v1/completions"]
    for route in routes:
        for i, body in enumerate(bodies):
            r = post(url, route, body)
            assert r.status_code < 500, (route, body, r.status_code, r.text)
            if i < 5:  # malformed for every route
                assert r.status_code >= 400 and "error" in r.json(), (route, body, r.text)
    r = httpx.request("DELETE", url + "/api/delete", content=b"{}", timeout=10)
    assert_ollama_error(r, 400)
    assert httpx.get(url + "/health").json()["status"] == "ok"


def test_host_header_and_cors_origins(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    r = httpx.get(url + "/api/version", headers={"host": "evil.example.com"})
    assert_ollama_error(r, 403)
    assert httpx.get(url + "/api/version", headers={"host": "localhost:11434"}).status_code == 200
    r = httpx.get(url + "/api/version", headers={"origin": "http://localhost:3000"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://localhost:3000"
    assert_ollama_error(httpx.get(url + "/api/version", headers={"origin": "https://evil.example.com"}), 403)
    pre = httpx.options(url + "/v1/models", headers={"origin": "http://127.0.0.1:8080",
                                                     "access-control-request-method": "POST"})
    assert pre.status_code == 204 and pre.headers["access-control-allow-origin"] == "http://127.0.0.1:8080"


def test_extra_origins_and_api_key(store_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    monkeypatch.setenv("LLMEDGE_ORIGINS", "https://*.example.org")
    with running_server(api_key="s3cret") as base:
        assert httpx.get(base + "/").status_code == 200
        assert httpx.get(base + "/health").status_code == 200
        assert_ollama_error(httpx.get(base + "/api/tags"), 401)
        assert_openai_error(httpx.get(base + "/v1/models", headers={"authorization": "Bearer wrong"}), 401)
        ok = {"authorization": "Bearer s3cret"}
        assert httpx.get(base + "/api/tags", headers=ok).status_code == 200
        r = httpx.get(base + "/api/version", headers={**ok, "origin": "https://app.example.org"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://app.example.org"
        import openai

        client = openai.OpenAI(base_url=base + "/v1", api_key="s3cret")
        assert MODEL in [m.id for m in client.models.list()]


def test_body_size_is_bounded(url: str) -> None:
    big = {"model": MODEL, "prompt": "x" * (200 * 1024)}
    assert_ollama_error(post(url, "/api/generate", big), 413)

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted while received
        yield b'{"model": "smollm2:135m", "prompt": "'
        for _ in range(100):
            yield b"y" * 1024
        yield b'"}'

    r = httpx.post(url + "/api/generate", content=chunks(), timeout=30)
    assert_ollama_error(r, 413)


def test_queue_full_is_503_and_disconnect_frees_the_slot(url: str) -> None:
    body = {"model": MODEL, "prompt": "Count from 1 to 1000: 1, 2, 3, 4,", "raw": True,
            "options": {"num_predict": 2000, "temperature": 0}}
    with httpx.Client(timeout=60) as client, client.stream("POST", url + "/api/generate", json=body) as first:
        assert first.status_code == 200
        lines = first.iter_lines()  # keep the iterator: dropping it closes the connection
        next(lines)  # running: the one slot is busy
        assert httpx.get(url + "/health").json()["busy"] == 1
        results: list[int] = []
        waiting = threading.Thread(target=lambda: results.append(
            post(url, "/api/generate", {**body, "options": {"num_predict": 1}}).status_code))
        waiting.start()  # queued: the one queue place is taken
        deadline = time.time() + 10
        while httpx.get(url + "/health").json()["queue"] < 1:
            assert time.time() < deadline
            time.sleep(0.02)
        r = post(url, "/api/generate", body)
        assert_ollama_error(r, 503)
        assert int(r.headers["retry-after"]) >= 1
        refused = post(url, "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 1})
        assert_openai_error(refused, 503)
        assert int(refused.headers["retry-after"]) >= 1
    t0 = time.time()  # the streaming client disconnected: its slot frees, the queued request runs
    waiting.join(30)
    assert results == [200]
    assert time.time() - t0 < 3.0
    deadline = t0 + 5
    while httpx.get(url + "/health").json()["busy"]:
        assert time.time() < deadline
        time.sleep(0.05)
    again = post(url, "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 1})
    assert again.status_code == 200, again.text  # the refused request is served once capacity frees
    metrics = httpx.get(url + "/metrics").text
    assert "llmedge_cancelled_total 1" in metrics or "llmedge_cancelled_total 2" in metrics


def test_non_loopback_bind_needs_a_key_or_insecure(monkeypatch: pytest.MonkeyPatch) -> None:
    from llmedge.cli.serve import serve
    from llmedge.errors import LlmedgeError

    monkeypatch.delenv("LLMEDGE_API_KEY", raising=False)
    with pytest.raises(LlmedgeError, match="LLMEDGE_API_KEY"):
        serve(host="0.0.0.0", port=free_port(), parallel=None, max_queue=None, insecure=False)
    monkeypatch.setenv("LLMEDGE_HOST", "0.0.0.0:1234")
    with pytest.raises(LlmedgeError, match="0.0.0.0"):
        serve(host=None, port=None, parallel=None, max_queue=None, insecure=False)


def test_serve_command_answers_and_stops_on_sigterm(store_root: Path) -> None:  # noqa: F811
    port = free_port()
    code = "import typer; from llmedge.cli.serve import serve; typer.run(serve)"
    env = {**os.environ, "LLMEDGE_MODELS": str(store_root), "LLMEDGE_HOST": f"127.0.0.1:{port}"}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 30
        while True:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/", timeout=1)
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.time() < deadline, proc.stderr.read().decode()
                time.sleep(0.1)
        assert r.status_code == 200 and "running" in r.text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once stopped
        err = proc.stderr.read().decode()
        assert "llmedge: stopped" in err and "Traceback" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
