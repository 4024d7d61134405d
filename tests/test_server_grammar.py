"""Structured output: generations constrained by llguidance validate against their JSON schema on both
real models (the same 20 schemas), end with done_reason "stop", and the candidate-restricted sampler picks
what the full-vocabulary mask would; schemas llguidance cannot compile are refused with the reason."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
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


def test_twenty_schemas_validate_on_gemma3(gemma3_path: Path) -> None:
    _run(gemma3_path, SCHEMAS)  # the 262k-token vocabulary: the mask costs about a millisecond a token


def test_masked_sampling_matches_the_full_vocabulary_reference(smollm2_path: Path) -> None:
    """Greedy with penalties, top log-probs: the sampler over the allowed candidates only gives the token
    and log-probabilities of the plain sampler over the whole vocabulary with disallowed logits at -inf."""
    import llguidance

    from llmedge.gguf import GGUFFile
    from llmedge.sampling import Sampler, SamplingOptions
    from llmedge.server.grammar import RequestSampler, compile_schema, ll_tokenizer
    from llmedge.tokenizer import Tokenizer

    tok = Tokenizer.from_metadata(GGUFFile(smollm2_path).metadata)
    opts = SamplingOptions(temperature=0.0, repeat_penalty=1.5, presence_penalty=0.5, frequency_penalty=0.3,
                           repeat_last_n=6)
    grammar = compile_schema(SCHEMAS[8])
    fast = RequestSampler(opts, tok, grammar, top_logprobs=4)
    ref = llguidance.LLMatcher(ll_tokenizer(tok), grammar)
    rng = np.random.default_rng(3)
    history = tok.encode('{"user": {"id": 12, "nick": "ab"}}', add_bos=False)  # penalized, not consumed
    n_penalized = 0
    for _ in range(200):
        logits = (rng.standard_normal(tok.n_vocab) * 2).astype(np.float32)
        logits[history[-6:]] += 4.0  # recent tokens lead, so the penalties decide
        allowed = np.frombuffer(ref.compute_logit_bias(), dtype=np.uint8)[: tok.n_vocab] != 0
        masked = np.where(allowed, logits, -np.inf)
        want = Sampler(opts).sample(masked, history)
        n_penalized += want != int(np.argmax(masked))
        assert fast.sample(logits, history) == want
        x = masked.astype(np.float64)
        lp = x - (x.max() + np.log(np.exp(x - x.max()).sum()))
        rec = fast.records[-1]
        assert rec["logprob"] == pytest.approx(lp[want], abs=1e-9)
        assert [t for t, _ in rec["top"]] == list(np.argsort(-lp, kind="stable")[: len(rec["top"])])
        assert len(rec["top"]) == min(4, int(allowed.sum()))
        assert ref.consume_token(want)
        history.append(want)
        if tok.is_eog(want):
            break
    else:
        pytest.fail("the grammar never completed")
    assert n_penalized > 0 and len(fast.records) > 10
    jsonschema.validate(json.loads(tok.decode(history[-len(fast.records):-1])), SCHEMAS[8])


def test_uncompilable_schemas_are_refused_with_the_reason() -> None:
    from llmedge.server.grammar import compile_schema
    from llmedge.server.security import HTTPError

    for bad in ({"type": "strin"}, "{not json", [1, 2], {"$ref": "#/nowhere"}):
        with pytest.raises(HTTPError) as e:
            compile_schema(bad)
        assert e.value.status == 400 and e.value.message


def test_forced_tokens_and_completion(smollm2_path: Path) -> None:
    """The grammar's forced tokens come without sampling (within the limit, never with log-probs), and
    the sampler says when the grammar is complete; then only an end-of-generation token is sampled."""
    from llmedge.gguf import GGUFFile
    from llmedge.sampling import SamplingOptions
    from llmedge.server.grammar import RequestSampler, compile_schema
    from llmedge.tokenizer import Tokenizer

    tok = Tokenizer.from_metadata(GGUFFile(smollm2_path).metadata)
    grammar = compile_schema(SCHEMAS[8])
    opts = SamplingOptions(temperature=0.0)
    head = RequestSampler(opts, tok, grammar).forced(100)
    assert tok.decode(head) == '{"user": {"id": '
    assert RequestSampler(opts, tok, grammar, logprobs=True).forced(100) == []
    s = RequestSampler(opts, tok, grammar)
    assert s.forced(2) == head[:2] and s.forced(100) == head[2:] and s.forced(100) == []
    for t in tok.encode('42, "nick": "ab"}}', add_bos=False):
        assert not s.finished
        logits = np.zeros(tok.n_vocab, dtype=np.float32)
        logits[t] = 5.0
        assert s.sample(logits) == t
    assert s.finished
    assert tok.is_eog(s.sample(np.zeros(tok.n_vocab, dtype=np.float32)))


def test_a_schema_that_makes_the_grammar_compiler_panic_is_a_bad_request() -> None:
    """Found by fuzz/fuzz_grammar.py: llguidance panics (a Rust panic, pyo3's PanicException, not an
    Exception) slicing its error message inside a multi-byte character; that is one 400, not a crash."""
    from llmedge.server.errors import BadRequest
    from llmedge.server.grammar import compile_schema

    schema = '{"$ref":{"x": {"pe": "\ufffdool' + "\ufffd" * 57 + 'ean"}}}'
    with pytest.raises(BadRequest, match="cannot be compiled"):
        compile_schema(schema)
