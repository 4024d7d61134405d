"""Structured output: generations constrained by llguidance validate against their JSON schema on both
real models; schemas llguidance cannot compile are refused with the reason."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

S = {"type": "string", "maxLength": 12}
N = {"type": "number", "minimum": -100, "maximum": 100}  # bounded: a small model may repeat digits forever
INT = {"type": "integer", "minimum": 0, "maximum": 999}
SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "properties": {"name": S}, "required": ["name"]},
    {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 150}}, "required": ["age"]},
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"]},
    {"type": "object", "properties": {"tags": {"type": "array", "items": S, "minItems": 1, "maxItems": 3}},
     "required": ["tags"]},
    {"type": "object", "properties": {"x": N, "y": N}, "required": ["x", "y"]},
    {"type": "object", "properties": {"city": S, "country": S}, "required": ["city", "country"]},
    {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 9}, "minItems": 2, "maxItems": 4},
    {"type": "object", "properties": {"user": {"type": "object", "properties": {"id": INT,
                                                                                "nick": S},
                                               "required": ["id", "nick"]}}, "required": ["user"]},
    {"type": "object", "properties": {"status": {"const": "done"}}, "required": ["status"]},
    {"type": "object", "properties": {"value": {"anyOf": [INT, {"type": "null"}]}},
     "required": ["value"]},
    {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}[0-9]{2}$"}},
     "required": ["code"]},
    {"type": "object", "properties": {"items": {"type": "array", "maxItems": 2, "items": {
        "type": "object", "properties": {"n": INT}, "required": ["n"]}}}, "required": ["items"]},
    {"type": "object", "properties": {"title": S, "year": {"type": "integer", "minimum": 1900, "maximum": 2100}},
     "required": ["title", "year"]},
    {"type": "string", "enum": ["yes", "no", "maybe"]},
    {"type": "object", "properties": {"email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.com$"}},
     "required": ["email"]},
    {"type": "object", "properties": {"scores": {"type": "array", "items": N, "maxItems": 3}},
     "required": ["scores"]},
    {"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "null"}}, "required": ["a", "b"]},
    {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}, "legs": {"type": "integer", "minimum": 0,
                                                                                  "maximum": 4}},
     "required": ["kind", "legs"]},
    {"type": "object", "properties": {"answer": {"type": "string", "minLength": 1, "maxLength": 8}},
     "additionalProperties": False, "required": ["answer"]},
]


def _run(path: Path, schemas: list[dict[str, Any]]) -> None:
    from llmedge.api import Model
    from llmedge.sampling import SamplingOptions
    from llmedge.server.grammar import RequestSampler, compile_schema

    m = Model(path, n_ctx=512, prefix_cache_bytes=0)  # each schema from a clean sequence
    for schema in schemas:
        sampler = RequestSampler(SamplingOptions(temperature=0.7, seed=7), m.tokenizer, compile_schema(schema))
        ids = m.prompt_ids("Reply in JSON: " + json.dumps(schema))
        text = "".join(c.text for c in m.engine.generate(ids, sampler, max_tokens=96))
        assert m.timings.done_reason == "stop", (schema, text)
        jsonschema.validate(json.loads(text), schema)


def test_twenty_schemas_validate_on_smollm2(smollm2_path: Path) -> None:
    assert len(SCHEMAS) == 20
    _run(smollm2_path, SCHEMAS)


def test_schemas_validate_on_gemma3(gemma3_path: Path) -> None:
    _run(gemma3_path, SCHEMAS[::3])  # a third of them: the 262k-token vocabulary makes each token slower


def test_uncompilable_schemas_are_refused_with_the_reason() -> None:
    from llmedge.server.grammar import compile_schema
    from llmedge.server.security import HTTPError

    for bad in ({"type": "strin"}, "{not json", [1, 2], {"$ref": "#/nowhere"}):
        with pytest.raises(HTTPError) as e:
            compile_schema(bad)
        assert e.value.status == 400 and e.value.message
