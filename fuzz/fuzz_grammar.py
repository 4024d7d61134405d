"""Fuzz target: the JSON-schema-to-grammar path (``compile_schema``: JSON parsing, closing objects,
llguidance's compiler and validator). Only an HTTPError with a 400 may escape.

llguidance is native code the fuzzer cannot see into, so most inputs are not raw text (mostly invalid
JSON) but a schema *built* from the input bytes: nested objects, arrays, strings with patterns and
formats, numbers with bounds, enums, consts, anyOf/oneOf/allOf/not and $refs, with odd and extreme
values. The first byte chooses: even builds a schema, odd feeds the rest as schema text."""

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


class _Bytes:
    """Values drawn from the input, deterministic, never running out (zeros after the end)."""

    def __init__(self, data: bytes) -> None:
        self.data, self.i = data, 0

    def byte(self) -> int:
        b = self.data[self.i] if self.i < len(self.data) else 0
        self.i += 1
        return b

    def pick(self, options: list) -> object:
        return options[self.byte() % len(options)]

    def int(self) -> int:
        return self.pick([0, 1, -1, 2, 3, 7, 100, -100, 2**31, -(2**53), 2**64, self.byte() - 128])

    def text(self) -> str:
        n = self.byte() % 12
        raw = bytes(self.byte() for _ in range(n))
        return self.pick([raw.decode("latin-1"), "a", "", "^[a-z]+$", "(a|b)*c", "\\d{2,4}", "[", "(?=x)",
                          ".*", "a{1000}", "\\p{L}+", "x" * 40, "(a*)*b", "[^\\x00-\\x7f]"])


_FORMATS = ["date", "time", "date-time", "email", "uuid", "uri", "ipv4", "hostname", "bogus"]


def build_schema(b: _Bytes, depth: int = 0) -> object:
    kind = b.pick(["object", "array", "string", "number", "integer", "boolean", "null", "anyOf", "oneOf",
                   "allOf", "enum", "const", "ref", "not", True, False, "multi"]) if depth < 6 else "string"
    if isinstance(kind, bool):
        return kind
    if kind == "object":
        props = {b.text(): build_schema(b, depth + 1) for _ in range(b.byte() % 4)}
        out: dict = {"type": "object", "properties": props}
        if props and b.byte() & 1:
            out["required"] = [k for k in props if b.byte() & 1] + ([b.text()] if b.byte() % 5 == 0 else [])
        if b.byte() % 3 == 0:
            out["additionalProperties"] = build_schema(b, depth + 1) if b.byte() & 1 else bool(b.byte() & 1)
        if b.byte() % 4 == 0:
            out["minProperties"], out["maxProperties"] = b.int(), b.int()
        return out
    if kind == "array":
        out = {"type": "array", "items": build_schema(b, depth + 1)}
        if b.byte() & 1:
            out["minItems"], out["maxItems"] = b.int(), b.int()
        if b.byte() % 4 == 0:
            out["prefixItems"] = [build_schema(b, depth + 1) for _ in range(b.byte() % 3)]
        return out
    if kind == "string":
        out = {"type": "string"}
        for key in ("minLength", "maxLength"):
            if b.byte() & 1:
                out[key] = b.int()
        if b.byte() % 3 == 0:
            out["pattern"] = b.text()
        if b.byte() % 4 == 0:
            out["format"] = b.pick(_FORMATS)
        return out
    if kind in ("number", "integer"):
        out = {"type": kind}
        for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"):
            if b.byte() % 3 == 0:
                out[key] = b.int() if b.byte() & 1 else b.int() / 7
        return out
    if kind in ("boolean", "null"):
        return {"type": kind}
    if kind in ("anyOf", "oneOf", "allOf"):
        return {kind: [build_schema(b, depth + 1) for _ in range(b.byte() % 4)]}
    if kind == "enum":
        return {"enum": [b.pick([b.text(), b.int(), None, True, [1], {"a": 1}]) for _ in range(b.byte() % 5)]}
    if kind == "const":
        return {"const": b.pick([b.text(), b.int(), None, False, {"k": [1, "x"]}])}
    if kind == "ref":
        name = b.pick(["a", "b", "missing"])
        return {"$defs": {"a": build_schema(b, depth + 1), "b": {"$ref": "#/$defs/a"}}, "$ref": f"#/$defs/{name}"}
    if kind == "not":
        return {"not": build_schema(b, depth + 1)}
    return {"type": [b.pick(["string", "number", "null", "object", "array", "integer", "bogus"])
                     for _ in range(1 + b.byte() % 3)]}


def test_one_input(data: bytes) -> None:
    if data[:1] and data[0] & 1:
        schema: object = data[1:].decode("utf-8", "replace")
    else:
        schema = build_schema(_Bytes(data[1:]))
    try:
        grammar = compile_schema(schema)
    except HTTPError as e:
        assert e.status == 400, e.status
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
    return [b"\x01" + json.dumps(s).encode() for s in schemas] + [bytes([0, i]) + bytes(range(40)) for i in range(17)]


if __name__ == "__main__":
    harness.fuzz(TARGET, test_one_input, seeds)
