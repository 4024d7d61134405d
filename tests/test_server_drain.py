"""SIGTERM drains: `llmedge serve` stops accepting, lets the request in flight finish its stream (to its
final `done` line), then exits within its deadline."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import soak  # noqa: E402


def test_sigterm_finishes_the_stream_in_flight_then_exits(tmp_path: Path) -> None:
    models, name = soak.tiny_store(tmp_path)
    server = soak.Server(models, parallel=1, max_queue=1, backend="numpy")
    try:
        body = {"model": name, "prompt": "hello the a", "raw": True,
                "options": {"num_predict": 200, "temperature": 0, "num_ctx": 256}}
        with httpx.Client(timeout=30) as client, client.stream("POST", server.url + "/api/generate",
                                                                json=body) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            first = json.loads(next(lines))
            assert first["done"] is False
            t0 = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            rest = [json.loads(line) for line in lines if line]
        assert rest and rest[-1]["done"] is True  # the answer in flight was completed, not cut
        assert server.proc.wait(timeout=20) in (0, -signal.SIGTERM)
        assert time.monotonic() - t0 < 15
        try:
            httpx.get(server.url + "/", timeout=2)
            raise AssertionError("still accepting after SIGTERM")
        except httpx.TransportError:
            pass
    finally:
        log = server.stop()
    assert "Traceback" not in log
