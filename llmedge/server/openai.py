"""OpenAI's API shapes: chat messages (string or text-part content), sampling fields mapped onto
llmedge's options, ``response_format``, and the completion, chunk, usage, logprobs, model and
embedding objects."""

from __future__ import annotations

import secrets
import time
from typing import Any

from llmedge.server import limits
from llmedge.server.ollama import number, parse_stop
from llmedge.server.security import HTTPError


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def parse_messages(messages: Any) -> list[dict[str, Any]]:
    """Chat messages with their content flattened to text (``[{type: text, text}]`` parts joined)."""
    if not isinstance(messages, list) or not messages:
        raise HTTPError(400, "messages must be a non-empty array")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise HTTPError(400, f"messages[{i}] must be an object")
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise HTTPError(400, f"messages[{i}].role must be a string")
        content = m.get("content")
        if content is None:
            content = ""
        elif isinstance(content, list):
            texts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise HTTPError(400, f"messages[{i}].content: only text parts are supported")
                texts.append(part["text"])
            content = "".join(texts)
        elif not isinstance(content, str):
            raise HTTPError(400, f"messages[{i}].content must be a string or an array of text parts")
        msg = {"role": "system" if role == "developer" else role, "content": content}
        out.append(msg)
    return out


def parse_sampling(body: dict[str, Any]) -> dict[str, Any]:
    """OpenAI request fields -> ``{"sampling", "max_tokens", "stop"}`` (only the fields that were set)."""
    sampling: dict[str, Any] = {}
    for key, kind in (("temperature", float), ("top_p", float), ("presence_penalty", float),
                      ("frequency_penalty", float), ("seed", int), ("top_k", int), ("min_p", float),
                      ("repeat_penalty", float)):
        if body.get(key) is not None:
            sampling[key] = number(body[key], key, kind)
            limits.check_range(key, sampling[key])
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None:
        max_tokens = int(number(max_tokens, "max_tokens", int))
        if max_tokens < 0:
            raise HTTPError(400, "max_tokens must not be negative")
        limits.check_range("max_tokens", max_tokens)
    n = body.get("n")
    if n is not None and number(n, "n", int) != 1:
        raise HTTPError(400, "only n=1 is supported")
    return {"sampling": sampling, "max_tokens": max_tokens, "stop": parse_stop(body.get("stop"))}


def response_schema(fmt: Any) -> Any:
    """The JSON schema a ``response_format`` asks for: None (text), ``{"type": "object"}``
    (json_object) or the given schema (json_schema)."""
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise HTTPError(400, "response_format must be an object")
    kind = fmt.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise HTTPError(400, "response_format.json_schema.schema is required")
        return spec["schema"]
    raise HTTPError(400, f"unsupported response_format type {kind!r}")


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def finish_reason(done_reason: str) -> str:
    return "length" if done_reason == "length" else "stop"


def chat_logprobs(records: list[dict[str, Any]], piece: Any) -> dict[str, Any]:
    content = []
    for rec in records:
        b = piece(rec["id"])
        content.append({
            "token": b.decode("utf-8", errors="replace"), "logprob": rec["logprob"], "bytes": list(b),
            "top_logprobs": [{"token": piece(t).decode("utf-8", errors="replace"), "logprob": lp,
                              "bytes": list(piece(t))} for t, lp in rec.get("top", [])],
        })
    return {"content": content, "refusal": None}


def completion_logprobs(records: list[dict[str, Any]], piece: Any) -> dict[str, Any]:
    tokens, lps, tops, offsets = [], [], [], []
    pos = 0
    for rec in records:
        text = piece(rec["id"]).decode("utf-8", errors="replace")
        tokens.append(text)
        lps.append(rec["logprob"])
        tops.append({piece(t).decode("utf-8", errors="replace"): lp for t, lp in rec.get("top", [])})
        offsets.append(pos)
        pos += len(text)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def chat_chunk(cid: str, model: str, created: int, delta: dict[str, Any], finish: str | None,
               logprobs: Any = None) -> dict[str, Any]:
    return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
            "system_fingerprint": "fp_llmedge",
            "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]}


def completion_chunk(cid: str, model: str, created: int, text: str, finish: str | None) -> dict[str, Any]:
    return {"id": cid, "object": "text_completion", "created": created, "model": model,
            "system_fingerprint": "fp_llmedge",
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}


def model_object(name: str, created: float | None = None) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": int(created or time.time()), "owned_by": "library"}
