"""Fuzz target: the server's request parsers on arbitrary bytes: the JSON body, Ollama options and
keep_alive, OpenAI messages, sampling fields and response_format, num_ctx, context ids, stop lists
and the request limits. Only an HTTPError with a 4xx status may escape; anything else would be a 500."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402

TARGET = "requests"

with harness.instrument(__name__, include=["llmedge.server"]):
    from llmedge.server import limits
    from llmedge.server import ollama as ol
    from llmedge.server import openai as oa
    from llmedge.server.scheduler import Scheduler
    from llmedge.server.security import HTTPError, parse_json_body

SCHED = SimpleNamespace(max_ctx=32768)  # what Scheduler.check_ctx reads, without starting a scheduler


def _each(body: dict) -> None:
    steps = [
        lambda: ol.parse_options(body.get("options")),
        lambda: ol.parse_keep_alive(body.get("keep_alive")),
        lambda: oa.parse_messages(body.get("messages")),
        lambda: oa.parse_sampling(body),
        lambda: oa.response_schema(body.get("response_format")),
        lambda: Scheduler.check_ctx(SCHED, body.get("num_ctx")),  # type: ignore[arg-type]
        lambda: limits.check_request(body),
    ]
    for step in steps:
        try:
            step()
        except HTTPError as e:
            assert 400 <= e.status < 500, (e.status, e.message)


def test_one_input(data: bytes) -> None:
    try:
        body = parse_json_body(data, "/api/chat")
    except HTTPError as e:
        assert 400 <= e.status < 500
        return
    _each(body)
    for key in ("options", "body"):
        if isinstance(body.get(key), dict):
            _each(body[key])


def seeds() -> list[bytes]:
    return [b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "options": {"num_ctx": 2048, '
            b'"temperature": 0.5, "stop": ["x"]}, "keep_alive": "5m"}',
            b'{"prompt": "x", "options": {"num_predict": -1, "seed": -1}, "keep_alive": -1, "context": [1, 2]}',
            b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}], "max_tokens": 5, '
            b'"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}}',
            b'{"keep_alive": "1h30m15.5s", "num_ctx": 1e300, "images": ["aGk="]}', b"[1, 2]", b"{"]


if __name__ == "__main__":
    harness.fuzz(TARGET, test_one_input, seeds)
