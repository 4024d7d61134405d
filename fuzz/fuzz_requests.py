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
        lambda: ol.generate_request(body, "m", "m", None),
        lambda: ol.chat_request(body, "m", "m", None),
        lambda: oa.chat_request(body, "m", "m", None),
        lambda: oa.completion_request(body, "m", "m", None),
    ]
    for step in steps:
        try:
            step()
        except HTTPError as e:
            assert 400 <= e.status < 500, (e.status, e.message)


_FIELDS = ["model", "prompt", "messages", "options", "keep_alive", "images", "context", "format", "stream",
           "num_ctx", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "n", "stop",
           "response_format", "input", "top_logprobs", "logprobs", "raw", "system", "tools", "role", "content",
           "type", "text", "json_schema", "schema", "num_predict", "top_k", "min_p", "repeat_penalty",
           "repeat_last_n", "num_keep", "presence_penalty", "frequency_penalty", "typical_p", "mirostat",
           "tool_choice", "parallel_tool_calls", "function", "name", "parameters", "arguments", "tool_calls",
           "think", "reasoning_effort", "verbose", "dimensions"]


class _Bytes:
    def __init__(self, data: bytes) -> None:
        self.data, self.i = data, 0

    def byte(self) -> int:
        b = self.data[self.i] if self.i < len(self.data) else 0
        self.i += 1
        return b

    def pick(self, options: list) -> object:
        return options[self.byte() % len(options)]


def build_value(b: _Bytes, depth: int = 0) -> object:
    """A JSON value of any shape, leaning towards the field names and edge values parsers meet."""
    kind = b.byte() % (9 if depth < 4 else 6)
    if kind == 0:
        return b.pick([0, 1, -1, -2, 7, 2**31, 2**63, -(2**63) - 1, 10**30, 8, 4096, 32768, 32769])
    if kind == 1:
        return b.pick([0.5, -0.0, 1e308, -1e308, 1.5, float("nan"), float("inf"), 1e-320, 2.0])
    if kind == 2:
        return b.pick(["", "5m", "-1", "1h30m", "0", "x", "-1s", "1e400", "99999999999h", "json", "developer",
                       "user", "system", "text", "json_schema", "json_object", "aGk=", "µs", "1.5.5s"])
    if kind == 3:
        return b.pick([True, False, None])
    if kind == 4:
        return bytes(b.byte() for _ in range(b.byte() % 8)).decode("latin-1")
    if kind == 5:
        return b.pick(_FIELDS)
    if kind in (6, 7):
        return {str(b.pick(_FIELDS)): build_value(b, depth + 1) for _ in range(b.byte() % 5)}
    return [build_value(b, depth + 1) for _ in range(b.byte() % 5)]


def test_one_input(data: bytes) -> None:
    if data[:1] and data[0] & 1 == 0:
        import json

        obj = build_value(_Bytes(data[1:]), 3 if data[0] & 2 else 0)
        data = json.dumps(obj if isinstance(obj, dict) or data[0] & 4 else {"x": obj}).encode()
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
    return [b"\x00" + bytes(range(64)), b"\x02" + bytes(range(7, 90, 3)), b"\x01" + b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "options": {"num_ctx": 2048, '
            b'"temperature": 0.5, "stop": ["x"]}, "keep_alive": "5m"}',
            b'{"prompt": "x", "options": {"num_predict": -1, "seed": -1}, "keep_alive": -1, "context": [1, 2]}',
            b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}], "max_tokens": 5, '
            b'"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}}',
            b'{"keep_alive": "1h30m15.5s", "num_ctx": 1e300, "images": ["aGk="]}', b"[1, 2]", b"{"]


if __name__ == "__main__":
    harness.fuzz(TARGET, test_one_input, seeds)
