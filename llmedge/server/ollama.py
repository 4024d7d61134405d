"""Ollama's native API shapes: request fields and options checked and mapped onto llmedge's generation
options, ``keep_alive`` durations, and the response objects (exact field names, nanosecond durations,
RFC 3339 timestamps, model details)."""

from __future__ import annotations

import math
import re
import time
from datetime import UTC, datetime
from typing import Any

from llmedge.server import limits
from llmedge.server.config import SPECULATIVE_OPTIONS
from llmedge.server.errors import BadOption, BadRequest, Unsupported
from llmedge.server.generation import Delta, GenerationRenderer, GenerationRequest, GenerationResult

# Ollama option name -> (llmedge keyword, expected type)
SAMPLING_OPTIONS: dict[str, tuple[str, type]] = {
    "temperature": ("temperature", float),
    "top_k": ("top_k", int),
    "top_p": ("top_p", float),
    "min_p": ("min_p", float),
    "typical_p": ("typical_p", float),
    "repeat_penalty": ("repeat_penalty", float),
    "repeat_last_n": ("repeat_last_n", int),
    "presence_penalty": ("presence_penalty", float),
    "frequency_penalty": ("frequency_penalty", float),
    "seed": ("seed", int),
}
# accepted for compatibility, without effect here (hardware and runner knobs, mirostat, ...)
IGNORED_OPTIONS = frozenset({
    "num_gpu", "main_gpu", "num_thread", "num_batch", "use_mmap", "use_mlock", "numa", "low_vram",
    "f16_kv", "vocab_only", "mirostat", "mirostat_tau", "mirostat_eta", "penalize_newline", "tfs_z",
    "logits_all", "embedding_only",
})


def number(value: Any, name: str, kind: type) -> int | float:
    """``value`` as an int or float option, BadRequest for anything else (bools, strings, NaN)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadOption(f"option {name} must be a number, not {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise BadOption(f"option {name} must be finite")
    if kind is int:
        if int(value) != value:
            raise BadOption(f"option {name} must be an integer")
        value = int(value)
        if abs(value) > 2**63 - 1:
            raise BadOption(f"option {name} is out of range")
        return value
    return float(value)


def parse_stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return tuple(value)
    raise BadRequest("stop must be a string or a list of strings")


def parse_options(options: Any) -> dict[str, Any]:
    """Ollama ``options`` -> ``{"sampling": {...}, "max_tokens", "stop", "num_ctx", "num_keep"}``."""
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise BadRequest("options must be an object")
    sampling: dict[str, Any] = {}
    out: dict[str, Any] = {"sampling": sampling, "max_tokens": None, "stop": (), "num_ctx": None,
                           "num_keep": None}
    for key, value in options.items():
        if value is None:
            continue
        if key in SAMPLING_OPTIONS:
            name, kind = SAMPLING_OPTIONS[key]
            v = number(value, key, kind)
            if key == "seed" and v < 0:
                v = None
            sampling[name] = v
        elif key == "num_predict":
            out["max_tokens"] = int(number(value, key, int))
        elif key == "stop":
            out["stop"] = parse_stop(value)
        elif key == "num_ctx":
            out["num_ctx"] = int(number(value, key, int))
        elif key == "num_keep":
            out["num_keep"] = int(number(value, key, int))
        elif key in SPECULATIVE_OPTIONS:  # llmedge's: speculative decoding (llama.cpp's names)
            sampling[key] = int(number(value, key, int))
        elif key in IGNORED_OPTIONS:
            continue
        else:
            raise BadOption(f"unknown option '{key}'")
    for key, value in options.items():
        limits.check_range(key, value)
    return out


_DURATION = re.compile(r"(?P<n>\d+(?:\.\d+)?)(?P<unit>ns|us|µs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_keep_alive(value: Any) -> float | None | str:
    """Seconds to keep a model loaded: ``"default"`` when absent, ``None`` (forever) when negative,
    0 to unload now. Numbers are seconds; strings are Go durations (``5m``, ``1h30m``, ``-1s``)."""
    if value is None:
        return "default"
    if isinstance(value, bool):
        raise BadRequest("keep_alive must be a duration or a number of seconds")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        sign = -1.0 if text.startswith("-") else 1.0
        body = text.lstrip("+-")
        try:
            seconds = sign * float(body)
        except ValueError:
            pos, total = 0, 0.0
            for m in _DURATION.finditer(body):
                if m.start() != pos:
                    break
                total += float(m.group("n")) * _UNITS[m.group("unit")]
                pos = m.end()
            if pos != len(body) or not body:
                raise BadRequest(f"invalid keep_alive duration {value!r}") from None
            seconds = sign * total
    else:
        raise BadRequest("keep_alive must be a duration or a number of seconds")
    if not math.isfinite(seconds) or seconds < 0 or seconds > limits.MAX_KEEP_ALIVE:
        return None
    return seconds


def now_rfc3339() -> str:
    return rfc3339(time.time())


_second: tuple[int | None, str] = (None, "")  # the last whole second formatted, and its text up to the fraction


def rfc3339(t: float) -> str:
    """``t`` as Ollama's ``created_at`` (UTC, nanosecond digits). Every streamed token carries one,
    so the date part is formatted once per second, not per token (it was a tenth of the event loop's
    time with 4 streams)."""
    sec = math.floor(t)
    micro = round((t - sec) * 1e6)  # as datetime.fromtimestamp rounds (half to even), carry included
    if micro >= 1000000:
        sec, micro = sec + 1, micro - 1000000
    global _second
    cached = _second  # one pair, read and replaced whole: other threads see the old one or the new
    if cached[0] != sec:
        cached = _second = (sec, datetime.fromtimestamp(sec, UTC).strftime("%Y-%m-%dT%H:%M:%S."))
    return f"{cached[1]}{micro:06d}000Z"


def final_fields(result: Any) -> dict[str, Any]:
    """The closing fields of a generate or chat response (from a GenerationResult)."""
    return {
        "done": True,
        "done_reason": result.done_reason,
        "total_duration": result.total_duration,
        "load_duration": result.load_duration,
        "prompt_eval_count": result.prompt_eval_count,
        "prompt_eval_duration": result.prompt_eval_duration,
        "eval_count": result.eval_count,
        "eval_duration": result.eval_duration,
        **result.speculative,  # draft_tokens, draft_accepted, draft_batched_steps when speculation ran (llmedge's)
    }


def logprob_entries(records: list[dict[str, Any]], piece: Any) -> list[dict[str, Any]]:
    """Ollama's ``logprobs`` list: token text, logprob, bytes and ``top_logprobs``."""
    out = []
    for rec in records:
        b = piece(rec["id"])
        entry: dict[str, Any] = {"token": b.decode("utf-8", errors="replace"), "logprob": rec["logprob"],
                                 "bytes": list(b)}
        if "top" in rec:
            entry["top_logprobs"] = [
                {"token": piece(t).decode("utf-8", errors="replace"), "logprob": lp, "bytes": list(piece(t))}
                for t, lp in rec["top"]
            ]
        out.append(entry)
    return out


# -- requests --------------------------------------------------------------------------------------
def flag(body: dict[str, Any], key: str, default: bool) -> bool:
    v = body.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise BadRequest(f"{key} must be a boolean")
    return v


def top_logprobs(body: dict[str, Any]) -> int:
    v = body.get("top_logprobs")
    if v is None:
        return 0
    n = int(number(v, "top_logprobs", int))
    if not 0 <= n <= 20:
        raise BadRequest("top_logprobs must be between 0 and 20")
    return n


def parse_think(value: Any) -> bool | str | None:
    """``think``: absent, a boolean, or a level (``low``, ``medium``, ``high``)."""
    if value is None or isinstance(value, bool):
        return value
    if value in ("low", "medium", "high"):
        return value
    raise BadRequest("think must be a boolean or one of \"low\", \"medium\", \"high\"")


def format_schema(fmt: Any) -> Any:
    """Ollama's ``format``: ``"json"`` (any object) or a JSON schema; None for free text."""
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return {"type": "object"}
    if isinstance(fmt, dict | bool):
        return fmt
    raise BadRequest("format must be \"json\" or a JSON schema object")


def _common(body: dict[str, Any], req: Any) -> None:
    """The fields /api/generate and /api/chat share, onto a GenerationRequest."""
    opts = parse_options(body.get("options"))
    req.sampling, req.max_tokens, req.stop = opts["sampling"], opts["max_tokens"], opts["stop"]
    req.num_keep, req.num_ctx = opts["num_keep"], opts["num_ctx"]
    req.keep_alive = parse_keep_alive(body.get("keep_alive"))
    req.schema = format_schema(body.get("format"))
    req.stream = flag(body, "stream", True)
    req.logprobs = flag(body, "logprobs", False)
    req.top_logprobs = top_logprobs(body)
    req.think = parse_think(body.get("think"))


def generate_request(body: dict[str, Any], name: str, key: str, path: Any) -> Any:
    """/api/generate -> GenerationRequest."""
    prompt = body.get("prompt") or ""
    system = body.get("system")
    if not isinstance(prompt, str) or (system is not None and not isinstance(system, str)):
        raise BadRequest("prompt and system must be strings")
    if body.get("suffix"):
        raise Unsupported(f"'{name}' does not support insert (suffix)")
    if body.get("images"):
        raise Unsupported(f"'{name}' does not support images")
    template = body.get("template") or None
    if template is not None:
        from llmedge.gotemplate import GoTemplateError, parse

        if not isinstance(template, str):
            raise BadRequest("template must be a string")
        try:
            parse(template)  # refused now, before a model is loaded for it
        except GoTemplateError as e:
            raise BadRequest(f"template: {e}") from None
    context = body.get("context") or []
    if not isinstance(context, list) or any(isinstance(t, bool) or not isinstance(t, int) for t in context):
        raise BadRequest("context must be an array of token ids")
    raw = flag(body, "raw", False)
    req = GenerationRequest(name, key, path, "raw" if raw else "generate", prompt=prompt, system=system,
                            context=list(context), template=template)
    _common(body, req)
    return req


def chat_request(body: dict[str, Any], name: str, key: str, path: Any) -> Any:
    """/api/chat -> GenerationRequest."""
    from llmedge.server.openai import parse_messages
    from llmedge.server.tools import normalize_tools

    raw_messages = body.get("messages")
    if raw_messages is None:
        raw_messages = []
    if not isinstance(raw_messages, list):
        raise BadRequest("messages must be an array")
    if any(isinstance(m, dict) and m.get("images") for m in raw_messages):
        raise Unsupported(f"'{name}' does not support images")
    messages = parse_messages(raw_messages) if raw_messages else []
    req = GenerationRequest(name, key, path, "chat", messages=messages, tools=normalize_tools(body.get("tools")))
    _common(body, req)
    return req


# -- responses -------------------------------------------------------------------------------------
def tool_calls_out(calls: list[Any], first_index: int = 0) -> list[dict[str, Any]]:
    """Ollama's ``tool_calls``: arguments as an object."""
    return [{"id": c.id, "function": {"index": first_index + i, "name": c.name, "arguments": c.arguments}}
            for i, c in enumerate(calls)]


def _closing(out: dict[str, Any], req: Any, result: Any) -> dict[str, Any]:
    out.update(final_fields(result))
    if req.logprobs or req.top_logprobs:
        out["logprobs"] = logprob_entries(result.records, result.piece)
    return out


class _OllamaRenderer(GenerationRenderer):
    def head(self) -> dict[str, Any]:
        return {"model": self.req.model, "created_at": now_rfc3339()}

    def delta(self, d: Delta) -> list[Any]:
        if not (d.content or d.thinking or d.tool_calls):  # Ollama sends a call once it is whole
            return []
        return [{**self.body(d), "done": False}]

    def done(self, result: GenerationResult, d: Delta | None = None) -> list[Any]:
        out = _closing(self.body(d or Delta()), self.req, result)
        if self.with_context and result.done_reason not in ("load", "unload"):
            out["context"] = result.ids + result.out_ids
        return [out]

    def complete(self, d: Delta, result: GenerationResult) -> Any:
        return self.done(result, d)[0]

    with_context = False

    def body(self, d: Delta) -> dict[str, Any]:
        raise NotImplementedError


class GenerateRenderer(_OllamaRenderer):
    """/api/generate: ``response`` and ``thinking`` text; the context ids at the end."""

    with_context = True

    def body(self, d: Delta) -> dict[str, Any]:
        out = {**self.head(), "response": d.content}
        if d.thinking:
            out["thinking"] = d.thinking
        return out


class ChatRenderer(_OllamaRenderer):
    """/api/chat: the assistant ``message`` with ``thinking`` and ``tool_calls``."""

    def body(self, d: Delta) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": d.content}
        if d.thinking:
            msg["thinking"] = d.thinking
        if d.tool_calls:
            msg["tool_calls"] = tool_calls_out(d.tool_calls, self.n_calls)
            self.n_calls += len(d.tool_calls)
        return {**self.head(), "message": msg}


def model_details(info: dict[str, Any]) -> dict[str, Any]:
    return {
        "parent_model": "",
        "format": "gguf",
        "family": info.get("family", ""),
        "families": [info.get("family", "")] if info.get("family") else None,
        "parameter_size": info.get("parameter_size", ""),
        "quantization_level": info.get("quantization_level", ""),
    }


def describe_gguf(path: Any, verbose: bool = False) -> dict[str, Any]:
    """Family, parameter count, quantization (the file type), context length and the metadata of a GGUF
    file under its own key names, as Ollama's ``model_info`` shows them: arrays of more than 64 items
    are null unless ``verbose`` (which also lists the tensors)."""
    from llmedge.gguf import GGUFFile
    from llmedge.modelcheck import check_model_file

    g = GGUFFile(path)
    check_model_file(g)
    arch = g.architecture
    n_params = sum(t.n_elements for t in g.tensors.values())
    meta: dict[str, Any] = {}
    for k, v in g.metadata.items():
        if hasattr(v, "tolist"):
            v = v.tolist()
        if isinstance(v, list | tuple):
            meta[k] = list(v) if verbose or len(v) <= 64 else None
        elif isinstance(v, bytes):
            continue
        elif k != "tokenizer.chat_template":
            meta[k] = v
    meta["general.parameter_count"] = n_params
    size = f"{n_params / 1e9:.1f}B" if n_params >= 1e9 else f"{n_params / 1e6:.0f}M"
    ctx = g.metadata.get(f"{arch}.context_length")
    template = g.metadata.get("tokenizer.chat_template") or ""
    out = {"family": arch, "parameter_size": size, "quantization_level": g.file_type, "model_info": meta,
           "context_length": int(ctx) if ctx is not None else None,
           "template": template if isinstance(template, str) else "",
           "embedding_length": g.metadata.get(f"{arch}.embedding_length")}
    if verbose:
        out["tensors"] = [{"name": t.name, "type": t.type_name, "shape": [int(d) for d in t.dims]}
                          for t in g.tensors.values()]
    return out


def capabilities(name: str, path: Any, info: dict[str, Any]) -> list[str]:
    """What /api/show lists, by Ollama's rules (server/images.go, ggufCapabilities): ``embedding`` for a
    model whose GGUF sets ``{arch}.pooling_type`` (an embedding model), else ``completion``; ``tools``
    and ``thinking`` when the model's chat template (its TEMPLATE, else the GGUF's) supports them.
    ``insert`` is never listed (no suffix support here) nor ``vision`` (no image input). Embedding
    does not need the capability: /api/embed embeds with any model, as Ollama's does."""
    from types import SimpleNamespace

    from llmedge.defaults import template_choice
    from llmedge.reasoning import supports_thinking
    from llmedge.server.embed import is_embedding_model
    from llmedge.server.tools import supports_tools
    from llmedge.store import Store
    from llmedge.template import ChatTemplate, fallback_template

    source = info.get("template") or fallback_template(info.get("family", ""))[1]
    gguf = ChatTemplate(source)
    template, _ = template_choice(Store().config(name), SimpleNamespace(template=gguf, tokenizer=None))
    pooled = is_embedding_model(info.get("model_info") or {}, info.get("family", ""))
    caps = ["embedding" if pooled else "completion"]
    if supports_tools(template):
        caps.append("tools")
    if supports_thinking(template):
        caps.append("thinking")
    return caps
