"""Structured output and per-token log-probabilities: the server's sampler.

:class:`RequestSampler` is the project's :class:`~llmedge.sampling.Sampler` plus two optional steps:
a grammar mask from llguidance (JSON schema, or any JSON object for ``format: "json"``) applied to the
logits before the chain, and recording the log-probability of each sampled token and its top
alternatives. The llguidance tokenizer is built once per model from the GGUF vocabulary bytes.
A schema llguidance cannot compile is refused with the reason (:func:`compile_schema`), never
silently ignored.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from llmedge.sampling import Sampler, SamplingOptions
from llmedge.server.security import HTTPError

JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ANY_JSON_OBJECT: dict[str, Any] = {"type": "object"}

_tokenizers: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_tok_lock = threading.Lock()


def compile_schema(schema: Any) -> str:
    """An llguidance grammar for a JSON schema (a dict, or a JSON string of one); HTTPError 400 with the
    compiler's reason when it is not a schema llguidance accepts."""
    import llguidance

    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as e:
            raise HTTPError(400, f"invalid JSON schema: {e}") from None
    if isinstance(schema, bool):
        schema = {} if schema else {"not": {}}
    if not isinstance(schema, dict):
        raise HTTPError(400, "a JSON schema must be an object")
    schema = close_objects(schema)
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS)  # type: ignore[arg-type]
    except (ValueError, TypeError) as e:
        raise HTTPError(400, f"invalid JSON schema: {e}") from None
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise HTTPError(400, f"the JSON schema cannot be compiled: {messages[0] if messages else 'unknown'}")
    return grammar


def close_objects(schema: Any) -> Any:
    """The schema with ``additionalProperties: false`` on objects that list properties and say nothing
    about others: every output still validates against the original, and generation ends."""
    if isinstance(schema, list):
        return [close_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: (v if k in ("enum", "const", "default", "examples", "required") else close_objects(v))
           for k, v in schema.items()}
    if "properties" in out and "additionalProperties" not in out and "patternProperties" not in out \
            and "unevaluatedProperties" not in out:
        out["additionalProperties"] = False
    return out


class _GGUFVocab:
    """What llguidance's TokenizerWrapper needs from a tokenizer: token bytes, BOS/EOS, encode."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        eog = sorted(tokenizer.eog_ids) or [tokenizer.eos_id or 0]
        self.eos_token_id = eog[0]
        self.bos_token_id = tokenizer.bos_id
        tokens = []
        specials = []
        for i in range(tokenizer.n_vocab):
            piece = tokenizer.token_to_piece(i, special=True)
            if tokenizer.is_control(i) or (piece.startswith(b"<") and piece.endswith(b">")
                                           and _user_defined(tokenizer, i)):
                piece = b"\xff" + piece
                specials.append(i)
            tokens.append(piece)
        self.tokens = tokens
        self.special_token_ids = specials
        self.eog = eog

    def __call__(self, s: bytes | str) -> list[int]:
        text = s.decode("utf-8", errors="replace") if isinstance(s, bytes) else s
        return self._tok.encode(text)


def _user_defined(tokenizer: Any, i: int) -> bool:
    from llmedge.tokenizer import TokenAttr

    return bool(tokenizer.token_attr(i) & getattr(TokenAttr, "USER_DEFINED", 0))


def ll_tokenizer(tokenizer: Any) -> Any:
    """The llguidance tokenizer for a model's tokenizer (built once, ~1 s for a large vocabulary)."""
    import llguidance

    with _tok_lock:
        tok = _tokenizers.get(tokenizer)
        if tok is None:
            vocab = _GGUFVocab(tokenizer)
            tok = llguidance.LLTokenizer(llguidance.TokenizerWrapper(vocab), n_vocab=tokenizer.n_vocab,
                                         eos_token=vocab.eog)
            _tokenizers[tokenizer] = tok
        return tok


class RequestSampler(Sampler):
    """One request's sampler: an optional grammar mask, the option chain, optional log-prob records."""

    def __init__(self, options: SamplingOptions, tokenizer: Any = None, grammar: str | None = None,
                 logprobs: bool = False, top_logprobs: int = 0) -> None:
        super().__init__(options)
        self.tokenizer = tokenizer
        self.matcher = None
        if grammar is not None:
            import llguidance

            self.matcher = llguidance.LLMatcher(ll_tokenizer(tokenizer), grammar, log_level=0)
            if self.matcher.is_error():
                raise HTTPError(400, f"the grammar cannot be used: {self.matcher.get_error()}")
        self.logprobs = logprobs or top_logprobs > 0
        self.top_logprobs = max(0, min(int(top_logprobs), 20))
        self.records: list[dict[str, Any]] = []

    def sample(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        if self.matcher is not None:
            allowed = np.frombuffer(self.matcher.compute_logit_bias(), dtype=np.uint8)[: len(logits)] != 0
            if not allowed.any():
                raise HTTPError(400, f"the grammar allows no token here: {self.matcher.get_error()}")
            masked = np.full(len(logits), -np.inf, dtype=np.float64)
            masked[: len(allowed)][allowed] = logits[: len(allowed)][allowed]
            logits = masked
        token = super().sample(logits, history)
        if self.logprobs:
            self._record(logits, token)
        if self.matcher is not None:
            self.matcher.consume_token(token)
        return token

    def _record(self, logits: np.ndarray, token: int) -> None:
        x = logits.astype(np.float64)
        m = np.max(x)
        logz = m + np.log(np.sum(np.exp(x - m)))
        lp = x - logz
        rec: dict[str, Any] = {"id": token, "logprob": _finite(lp[token])}
        if self.top_logprobs:
            k = self.top_logprobs
            top = np.argpartition(-lp, k - 1)[:k]
            top = top[np.argsort(-lp[top], kind="stable")]
            rec["top"] = [(int(t), _finite(lp[t])) for t in top if np.isfinite(lp[t])]
        self.records.append(rec)

    def piece(self, token: int) -> bytes:
        return self.tokenizer.token_to_piece(token) if self.tokenizer is not None else b""


def _finite(x: float) -> float:
    return float(x) if np.isfinite(x) else -9999.0
