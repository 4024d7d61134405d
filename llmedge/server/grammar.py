"""Structured output and per-token log-probabilities: the server's sampler.

:class:`RequestSampler` is the project's :class:`~llmedge.sampling.Sampler` plus two optional steps:
a grammar mask from llguidance (JSON schema, or any JSON object for ``format: "json"``) that restricts
the chain to the tokens the grammar allows, and recording the log-probability of each sampled token and
its top alternatives. With a grammar it also offers the tokens the grammar forces next
(:meth:`RequestSampler.forced`) and says when the grammar is complete (:attr:`RequestSampler.finished`).
The llguidance tokenizer is built once per model from the GGUF vocabulary bytes.
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
from llmedge.server.errors import BadRequest

JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ANY_JSON_OBJECT: dict[str, Any] = {"type": "object"}

_tokenizers: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_tok_lock = threading.Lock()


def compile_schema(schema: Any) -> str:
    """An llguidance grammar for a JSON schema (a dict, or a JSON string of one); BadRequest with the
    compiler's reason when it is not a schema llguidance accepts."""
    import llguidance

    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as e:
            raise BadRequest(f"invalid JSON schema: {e}") from None
        except RecursionError:
            raise BadRequest("invalid JSON schema: nested too deeply") from None
    if isinstance(schema, bool):
        schema = {} if schema else {"not": {}}
    if not isinstance(schema, dict):
        raise BadRequest("a JSON schema must be an object")
    try:
        schema = close_objects(schema)
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS)  # type: ignore[arg-type]
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    except (ValueError, TypeError) as e:
        raise BadRequest(f"invalid JSON schema: {e}") from None
    except RecursionError:
        raise BadRequest("invalid JSON schema: nested too deeply") from None
    except BaseException as e:  # a Rust panic inside llguidance (pyo3's PanicException is a BaseException)
        if type(e).__name__ != "PanicException":
            raise
        raise BadRequest("the JSON schema cannot be compiled: the grammar compiler failed on it") from None
    if is_error:
        raise BadRequest(f"the JSON schema cannot be compiled: {messages[0] if messages else 'unknown'}")
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
        return self._tok.encode(text, space_prefix=False)  # forced bytes continue the answer


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
    """One request's sampler: an optional grammar mask, the option chain, optional log-prob records.

    With a grammar, llguidance writes the set of allowed tokens into a preallocated bitmask (one bit a
    token, computed without the GIL); the option chain then runs only over the allowed candidates, so a
    large vocabulary costs nothing when few tokens fit. A single allowed token (a forced brace, quote or
    key) is returned without running the chain.
    """

    def __init__(self, options: SamplingOptions, tokenizer: Any = None, grammar: str | None = None,
                 logprobs: bool = False, top_logprobs: int = 0) -> None:
        super().__init__(options)
        self.tokenizer = tokenizer
        self.matcher = None
        self._mask = np.zeros(0, dtype="<u4")
        if grammar is not None:
            import llguidance

            lltok = ll_tokenizer(tokenizer)
            self.matcher = llguidance.LLMatcher(lltok, grammar, log_level=0)
            if self.matcher.is_error():
                raise BadRequest(f"the grammar cannot be used: {self.matcher.get_error()}")
            self._mask = np.zeros((lltok.vocab_size + 31) // 32, dtype="<u4")
        self.logprobs = logprobs or top_logprobs > 0
        self.top_logprobs = max(0, min(int(top_logprobs), 20))
        self.records: list[dict[str, Any]] = []

    def sample(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        if self.matcher is None:
            token = super().sample(logits, history)
            if self.logprobs:
                self._record(logits, None, token)
            return token
        allowed = self.allowed(len(logits))
        if len(allowed) == 0:
            raise BadRequest(f"the grammar allows no token here: {self.matcher.get_error()}")
        if len(allowed) == 1:
            token = int(allowed[0])
        elif len(allowed) == len(logits):
            token = super().sample(logits, history)
            allowed = None
        else:
            token = int(allowed[super().sample(logits[allowed], self._local_history(allowed, history))])
        if self.logprobs:
            self._record(logits, allowed, token)
        if not self.matcher.consume_token(token):
            raise BadRequest(f"the grammar rejected token {token}: {self.matcher.get_error()}")
        return token

    @property
    def finished(self) -> bool:
        """True once the grammar is complete: nothing but the end of generation may follow."""
        return self.matcher is not None and self.matcher.is_stopped()

    def forced(self, limit: int) -> list[int]:
        """Up to ``limit`` tokens the grammar forces next (llguidance's fast-forward tokens, which never
        end a token the model could still extend), consumed as if sampled, so an engine can evaluate them
        in one forward after the sampled token. Empty without a grammar or while log-probabilities are
        recorded (those need the logits of every position)."""
        if self.matcher is None or self.logprobs or limit <= 0:
            return []
        ff = self.matcher.compute_ff_tokens()[:limit]
        if ff and not self.matcher.consume_tokens(ff):
            raise BadRequest(f"the grammar rejected its forced tokens: {self.matcher.get_error()}")
        return ff

    def allowed(self, n_logits: int) -> np.ndarray:
        """The sorted ids (below ``n_logits``) the grammar allows next. A sparse bitmask has only its nonzero
        words unpacked, so the cost follows the number of allowed tokens, not the vocabulary."""
        assert self.matcher is not None
        mask = self._mask
        self.matcher.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
        words = np.flatnonzero(mask)
        if len(words) * 4 > len(mask):  # dense (inside a string): unpack it all
            ids = np.flatnonzero(np.unpackbits(mask.view(np.uint8), bitorder="little"))
        else:
            bit = np.flatnonzero(np.unpackbits(mask[words].view(np.uint8), bitorder="little"))
            ids = words[bit >> 5] * 32 + (bit & 31)
        return ids[ids < n_logits] if len(ids) and ids[-1] >= n_logits else ids

    def _local_history(self, allowed: np.ndarray, history: Sequence[int]) -> Sequence[int]:
        """The penalty window of ``history`` in candidate positions (-1 for tokens the grammar excludes:
        they stay at -inf whatever their penalty), so the chain on candidates penalizes as on the vocabulary."""
        if not self.penalized:
            return ()
        o = self.options
        n = len(history) if o.repeat_last_n < 0 else o.repeat_last_n
        if n == 0 or len(history) == 0:
            return ()
        recent = np.asarray(history[max(0, len(history) - n):], dtype=np.int64)
        pos = np.minimum(np.searchsorted(allowed, recent), len(allowed) - 1)
        return np.where(allowed[pos] == recent, pos, -1).tolist()

    def _record(self, logits: np.ndarray, allowed: np.ndarray | None, token: int) -> None:
        """Log-probabilities of the model's distribution (restricted to ``allowed`` when masked)."""
        x = (logits if allowed is None else logits[allowed]).astype(np.float64)
        m = np.max(x)
        lp = x - (m + np.log(np.sum(np.exp(x - m))))
        where = token if allowed is None else int(np.searchsorted(allowed, token))
        rec: dict[str, Any] = {"id": token, "logprob": _finite(lp[where])}
        if self.top_logprobs:
            k = min(self.top_logprobs, len(lp))
            top = np.argpartition(-lp, k - 1)[:k]
            top = top[np.argsort(-lp[top], kind="stable")]
            ids = top if allowed is None else allowed[top]
            rec["top"] = [(int(i), _finite(lp[t])) for i, t in zip(ids, top, strict=True) if np.isfinite(lp[t])]
        self.records.append(rec)

    def piece(self, token: int) -> bytes:
        return self.tokenizer.token_to_piece(token) if self.tokenizer is not None else b""


def _finite(x: float) -> float:
    return float(x) if np.isfinite(x) else -9999.0
