"""OpenAI's API shapes: chat messages (string or text-part content), sampling fields mapped onto
llmedge's options, ``response_format``, and the completion, chunk, usage, logprobs, model and
embedding objects."""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

from llmedge.server import limits
from llmedge.server.errors import BadRequest, Unsupported
from llmedge.server.generation import Delta, GenerationRenderer, GenerationRequest, GenerationResult
from llmedge.server.ollama import flag, number, parse_stop, parse_think, top_logprobs
from llmedge.server.tools import normalize_tools, tool_names


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def _arguments(value: Any, where: str) -> dict[str, Any]:
    """A tool call's arguments as an object (OpenAI sends a JSON string, Ollama an object)."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError:
            raise BadRequest(f"{where}.arguments must be a JSON object") from None
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise BadRequest(f"{where}.arguments must be a JSON object")
    return value


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """An assistant message's earlier tool calls, in the shape chat templates read:
    ``{"id", "type": "function", "function": {"name", "arguments": {...}}}``."""
    if not isinstance(calls, list):
        raise BadRequest(f"{where}.tool_calls must be an array")
    out = []
    for j, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise BadRequest(f"{where}.tool_calls[{j}].function.name must be a string")
        call = {"type": "function", "function": {"name": fn["name"],
                                                 "arguments": _arguments(fn.get("arguments"), where)}}
        if isinstance(c.get("id"), str):
            call["id"] = c["id"]
        out.append(call)
    return out


# the roles OpenAI's chat API defines ("function": its deprecated form of "tool")
OPENAI_ROLES = ("system", "developer", "user", "assistant", "tool", "function")


def parse_messages(messages: Any, roles: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """Chat messages with their content flattened to text (``[{type: text, text}]`` parts joined), tool
    calls with their arguments as objects, and a tool result's ``tool_call_id`` and name kept.
    ``roles``: the roles accepted (None: any, as Ollama passes any role to the template)."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty array")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise BadRequest(f"messages[{i}] must be an object")
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise BadRequest(f"messages[{i}].role must be a string")
        if roles is not None and role not in roles:
            raise BadRequest(f"messages[{i}].role {role[:100]!r} is not a supported role "
                             f"(one of {', '.join(roles)})")
        content = m.get("content")
        if content is None:
            content = ""
        elif isinstance(content, list):
            texts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise BadRequest(f"messages[{i}].content: only text parts are supported")
                texts.append(part["text"])
            content = "".join(texts)
        elif not isinstance(content, str):
            raise BadRequest(f"messages[{i}].content must be a string or an array of text parts")
        msg: dict[str, Any] = {"role": "system" if role == "developer" else role, "content": content}
        if m.get("tool_calls"):
            msg["tool_calls"] = _tool_calls(m["tool_calls"], f"messages[{i}]")
        for key in ("tool_call_id", "tool_name", "name", "thinking", "reasoning_content"):
            if isinstance(m.get(key), str):
                msg[key] = m[key]
        if role == "tool" and "name" not in msg and "tool_name" in msg:
            msg["name"] = msg["tool_name"]
        if "reasoning_content" in msg and "thinking" not in msg:
            msg["thinking"] = msg["reasoning_content"]
        out.append(msg)
    return out


def refused(field: str, message: str, cls: type[BadRequest] = Unsupported) -> BadRequest:
    """A 400 whose OpenAI error names ``field`` as its ``param`` (code ``unsupported_value``, as
    OpenAI's own refusal of a value a model does not support)."""
    e = cls(message)
    e.param, e.code = field, "unsupported_value"
    return e


# OpenAI request fields this server cannot honour, per endpoint: each is accepted when absent, null or
# one of the listed values (its default: some clients send n=1, best_of=1 and logit_bias={} explicitly)
# and refused otherwise with a 400 naming it, never ignored. llama.cpp's server refuses best_of even
# at 1, which breaks those clients; Ollama ignores them all. Fields that cannot change the answer are
# accepted and ignored: user, metadata, store, service_tier, safety_identifier, prompt_cache_key,
# prompt_cache_retention, and prediction (predicted outputs only make generation faster).
DEFAULT_ONLY: dict[str, dict[str, tuple[tuple[Any, ...], str]]] = {
    "chat": {
        "audio": ((), "no audio output here"),
        "modalities": ((["text"],), 'text output only (["text"])'),
        "functions": (([],), "deprecated by OpenAI; use tools"),
        "function_call": (("none", "auto"), "deprecated by OpenAI; use tool_choice"),
        "web_search_options": ((), "no web search here"),
        "verbosity": (("medium",), 'the model answers at its own length ("medium")'),
    },
    "completion": {
        "best_of": ((1,), "one candidate per request (best_of=1)"),
    },
}


def check_default_only(body: dict[str, Any], endpoint: str) -> None:
    """Refuse a field of DEFAULT_ONLY[endpoint] set to anything but its default (see DEFAULT_ONLY)."""
    for field, (defaults, why) in DEFAULT_ONLY[endpoint].items():
        value = body.get(field)
        if value is None or (not isinstance(value, bool) and any(value == d for d in defaults)):
            continue
        shown = f"={json.dumps(value)[:40]}" if isinstance(value, str | int | float) else ""
        raise refused(field, f"{field}{shown} is not supported: {why}")


def parse_sampling(body: dict[str, Any]) -> dict[str, Any]:
    """OpenAI request fields -> ``{"sampling", "max_tokens", "stop"}`` (only the fields that were set)."""
    sampling: dict[str, Any] = {}
    for key, kind in (("temperature", float), ("top_p", float), ("presence_penalty", float),
                      ("frequency_penalty", float), ("seed", int), ("top_k", int), ("min_p", float),
                      ("repeat_penalty", float)):
        if body.get(key) is not None:
            sampling[key] = number(body[key], key, kind)
            limits.check_range(key, sampling[key])
    if "seed" in sampling and sampling["seed"] < 0:  # random, as a negative seed in Ollama's options
        sampling["seed"] = None
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None:
        max_tokens = int(number(max_tokens, "max_tokens", int))
        if max_tokens < 0:
            raise BadRequest("max_tokens must not be negative")
        limits.check_range("max_tokens", max_tokens)
    n = body.get("n")
    if n is not None and (n := number(n, "n", int)) != 1:
        raise refused("n", f"n={n} is not supported: one choice per request (n=1)")
    bias = body.get("logit_bias")
    if bias is not None and not isinstance(bias, dict):
        raise BadRequest("logit_bias must be an object mapping token ids to biases")
    if bias:  # not applied by the sampler: refused rather than silently ignored
        raise refused("logit_bias", "logit_bias is not supported")
    return {"sampling": sampling, "max_tokens": max_tokens, "stop": parse_stop(body.get("stop"))}


def response_schema(fmt: Any) -> Any:
    """The JSON schema a ``response_format`` asks for: None (text), ``{"type": "object"}``
    (json_object) or the given schema (json_schema)."""
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise BadRequest("response_format must be an object")
    kind = fmt.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise BadRequest("response_format.json_schema.schema is required")
        return spec["schema"]
    raise BadRequest(f"unsupported response_format type {kind!r}")


def usage(result: GenerationResult) -> dict[str, Any]:
    """OpenAI's usage object; ``cached_tokens``: the prompt's prefix reused from a cache, not evaluated."""
    prompt, completion = result.n_prompt, result.eval_count
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": min(result.prompt_cached, prompt)}}


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


def model_object(name: str, created: float | None = None) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": int(created or time.time()), "owned_by": "library"}


# -- requests --------------------------------------------------------------------------------------
def _include_usage(body: dict[str, Any]) -> bool:
    return isinstance(body.get("stream_options"), dict) and bool(body["stream_options"].get("include_usage"))


def parse_tool_choice(value: Any, tools: list[dict[str, Any]] | None) -> tuple[str, str | None]:
    """``tool_choice``: ``auto`` (default), ``none``, ``required``, or ``{"type": "function",
    "function": {"name"}}`` -> ``("function", name)``."""
    if value is None:
        return "auto", None
    if value in ("auto", "none", "required"):
        if value == "required" and not tools:
            raise BadRequest("tool_choice 'required' needs tools")
        return value, None
    if isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("function"), dict) \
            and isinstance(value["function"].get("name"), str):
        name = value["function"]["name"]
        if name not in tool_names(tools):
            raise BadRequest(f"tool_choice names a function that is not in tools: {name!r}")
        return "function", name
    raise BadRequest("tool_choice must be 'auto', 'none', 'required' or {\"type\": \"function\", "
                     "\"function\": {\"name\": ...}}")


def _sampling_into(body: dict[str, Any], req: GenerationRequest) -> None:
    p = parse_sampling(body)
    req.sampling, req.max_tokens, req.stop = p["sampling"], p["max_tokens"], p["stop"]
    req.schema = response_schema(body.get("response_format"))
    req.stream = flag(body, "stream", False)


def chat_request(body: dict[str, Any], name: str, key: str, path: Any) -> GenerationRequest:
    """/v1/chat/completions -> GenerationRequest."""
    check_default_only(body, "chat")
    req = GenerationRequest(name, key, path, "chat", messages=parse_messages(body.get("messages"), OPENAI_ROLES),
                            tools=normalize_tools(body.get("tools")), keep_alive="default", truncate=False)
    _sampling_into(body, req)
    req.tool_choice, req.tool_name = parse_tool_choice(body.get("tool_choice"), req.tools)
    req.parallel_tool_calls = flag(body, "parallel_tool_calls", True)
    req.logprobs = flag(body, "logprobs", False)
    req.top_logprobs = top_logprobs(body)
    effort = body.get("reasoning_effort")
    if effort is not None:
        if effort not in ("low", "medium", "high", "none"):
            raise BadRequest("reasoning_effort must be 'low', 'medium', 'high' or 'none'")
        req.think = False if effort == "none" else effort
    think = body.get("think")
    if think is not None:
        req.think = parse_think(think)
    return req


def completion_request(body: dict[str, Any], name: str, key: str, path: Any) -> GenerationRequest:
    """/v1/completions -> GenerationRequest (a raw prompt: no chat template)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, list):
        if not prompt or any(isinstance(t, bool) or not isinstance(t, int) for t in prompt):
            raise BadRequest("prompt must be a string, a list of one string, or a list of token ids")
    elif not isinstance(prompt, str):
        raise BadRequest("prompt must be a string or a list of token ids")
    check_default_only(body, "completion")
    if body.get("suffix"):
        raise refused("suffix", f"'{name}' does not support suffix")
    lp = body.get("logprobs")
    top = 0 if lp is None else int(number(lp, "logprobs", int))
    if not 0 <= top <= 20:
        raise BadRequest("logprobs must be between 0 and 20")
    req = GenerationRequest(name, key, path, "raw", prompt=prompt, default_max_tokens=16,
                            logprobs=lp is not None, top_logprobs=top, truncate=False)
    _sampling_into(body, req)
    return req


# -- responses -------------------------------------------------------------------------------------
def tool_calls_out(calls: list[Any]) -> list[dict[str, Any]]:
    """OpenAI's ``tool_calls``: ids, arguments as a JSON string."""
    return [{"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
            for c in calls]


class _OpenAIRenderer(GenerationRenderer):
    sse = True
    obj = ""
    prefix = ""

    def __init__(self, task: Any, body: dict[str, Any]) -> None:
        super().__init__(task)
        self.include_usage = _include_usage(body)
        self.cid, self.created = new_id(self.prefix), int(time.time())

    def head(self, obj: str) -> dict[str, Any]:
        return {"id": self.cid, "object": obj, "created": self.created, "model": self.req.model,
                "system_fingerprint": "fp_llmedge"}

    def finish(self, result: GenerationResult, calls: bool) -> str:
        return "tool_calls" if calls else finish_reason(result.done_reason)

    def usage_chunk(self, result: GenerationResult) -> list[Any]:
        if not self.include_usage:
            return []
        return [{**self.head(self.obj), "choices": [], "usage": usage(result)}]

    def answer(self, obj: str, choice: dict[str, Any], result: GenerationResult) -> dict[str, Any]:
        return {**self.head(obj), "choices": [choice], "usage": usage(result)}


class ChatRenderer(_OpenAIRenderer):
    """/v1/chat/completions: ``content``, ``reasoning_content`` and ``tool_calls`` (streamed as
    ``delta.tool_calls``: index, id and name first, then the arguments)."""

    obj, prefix = "chat.completion.chunk", "chatcmpl"

    def __init__(self, task: Any, body: dict[str, Any]) -> None:
        super().__init__(task, body)
        self.index: dict[str, int] = {}  # call id -> its index + 1 in the stream

    def chunk(self, delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> dict[str, Any]:
        return {**self.head(self.obj),
                "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]}

    def opening(self) -> list[Any]:
        return [self.chunk({"role": "assistant", "content": ""})]

    def delta(self, d: Delta) -> list[Any]:
        out = []
        if d.thinking:
            out.append(self.chunk({"reasoning_content": d.thinking}))
        if d.content:
            out.append(self.chunk({"content": d.content}))
        parts = list(d.fragments)  # a forced call streams as it is generated; others once parsed
        for c in tool_calls_out(d.tool_calls):
            if c["id"] not in self.index:
                parts += [(c["id"], c["function"]["name"], ""), (c["id"], None, c["function"]["arguments"])]
        for call_id, name, text in parts:
            if name is not None:
                self.index[call_id] = self.n_calls = len(self.index) + 1
                out.append(self.chunk({"tool_calls": [{"index": self.index[call_id] - 1, "id": call_id,
                                                       "type": "function",
                                                       "function": {"name": name, "arguments": ""}}]}))
            if text:
                out.append(self.chunk({"tool_calls": [{"index": self.index[call_id] - 1,
                                                       "function": {"arguments": text}}]}))
        return out

    def logprobs(self, result: GenerationResult) -> Any:
        return chat_logprobs(result.records, result.piece) if self.req.logprobs else None

    def done(self, result: GenerationResult) -> list[Any]:
        return [self.chunk({}, self.finish(result, self.n_calls > 0), self.logprobs(result)),
                *self.usage_chunk(result)]

    def complete(self, d: Delta, result: GenerationResult) -> Any:
        msg: dict[str, Any] = {"role": "assistant", "content": d.content}
        if d.thinking:
            msg["reasoning_content"] = d.thinking
        if d.tool_calls:
            msg["tool_calls"] = tool_calls_out(d.tool_calls)
            msg["content"] = d.content or None
        choice = {"index": 0, "message": msg, "logprobs": self.logprobs(result),
                  "finish_reason": self.finish(result, bool(d.tool_calls))}
        return self.answer("chat.completion", choice, result)


class CompletionRenderer(_OpenAIRenderer):
    """/v1/completions: ``text`` (the prompt first with ``echo``) and per-token log-probs."""

    obj, prefix = "text_completion", "cmpl"

    def __init__(self, task: Any, body: dict[str, Any]) -> None:
        super().__init__(task, body)
        prompt = self.req.prompt
        self.echo = prompt if flag(body, "echo", False) and isinstance(prompt, str) else ""

    def chunk(self, text: str, finish: str | None = None) -> dict[str, Any]:
        return {**self.head(self.obj),
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}

    def opening(self) -> list[Any]:
        return [self.chunk(self.echo)] if self.echo else []

    def delta(self, d: Delta) -> list[Any]:
        return [self.chunk(d.content)]

    def done(self, result: GenerationResult) -> list[Any]:
        return [self.chunk("", finish_reason(result.done_reason)), *self.usage_chunk(result)]

    def complete(self, d: Delta, result: GenerationResult) -> Any:
        choice = {"index": 0, "text": self.echo + d.content,
                  "logprobs": completion_logprobs(result.records, result.piece) if self.req.logprobs else None,
                  "finish_reason": finish_reason(result.done_reason)}
        return self.answer("text_completion", choice, result)
