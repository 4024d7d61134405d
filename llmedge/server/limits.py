"""Bounds on what a request may ask for, checked before any work is queued: the number of messages,
image fields, context ids, embedding inputs, tools, stop strings, and the range of every option value.

Each check raises BadRequest naming the field and the bound. The option ranges are wide (they
refuse only what no model can use: negative lengths, temperatures of 10^9, penalties that are not
numbers), so a request Ollama or OpenAI would accept is accepted here too.
"""

from __future__ import annotations

import math
from typing import Any

from llmedge.server.errors import BadOption, BadRequest

MAX_MESSAGES = 4096
MAX_INPUTS = 4096  # embedding inputs in one request
MAX_TOOLS = 256  # tools in one request (each is rendered into the prompt and may become a grammar branch)
MAX_IDS = 1 << 20  # token ids given directly (context, prompt ids)
MAX_STOP = 16
MAX_STOP_CHARS = 1024
MAX_NUM_PREDICT = 1 << 24  # -1 (until the end) and -2 (fill the context) are Ollama's specials
MAX_KEEP_ALIVE = 10 * 365 * 86400.0  # longer is the same as forever

# option -> (low, high), inclusive; None: unbounded on that side
OPTION_RANGES: dict[str, tuple[float | None, float | None]] = {
    "temperature": (0.0, 1000.0),
    "top_k": (-1, 1 << 24),  # 0 and -1: no limit, as in llama.cpp's sampler and SamplingOptions
    "top_p": (0.0, 1.0),
    "min_p": (0.0, 1.0),
    "typical_p": (0.0, 1.0),
    "repeat_penalty": (0.0, 1000.0),  # 0, like 1, is no penalty (SamplingOptions)
    "repeat_last_n": (-1, 1 << 24),
    "presence_penalty": (-1000.0, 1000.0),
    "frequency_penalty": (-1000.0, 1000.0),
    "num_predict": (-2, MAX_NUM_PREDICT),
    "max_tokens": (0, MAX_NUM_PREDICT),
    "num_keep": (-1, 1 << 24),
}


def check_range(name: str, value: Any) -> None:
    """BadRequest when a numeric option is outside OPTION_RANGES (NaN and infinities included)."""
    bounds = OPTION_RANGES.get(name)
    if bounds is None or isinstance(value, bool) or not isinstance(value, int | float):
        return
    lo, hi = bounds
    if isinstance(value, float) and not math.isfinite(value) or (lo is not None and value < lo) or (
            hi is not None and value > hi):
        raise BadOption(f"option {name}={value!r} is out of range ({lo}..{hi})")


def check_images(value: Any, where: str) -> None:
    """``images`` must be absent, null or an array of base64 strings; none are supported, so a
    non-empty array is refused too (by the caller, naming the model)."""
    if value is None:
        return
    if not isinstance(value, list) or not all(isinstance(i, str) for i in value):
        raise BadRequest(f"{where}images must be an array of base64 strings")


def check_request(body: dict[str, Any]) -> None:
    """The size bounds shared by every generation and embedding endpoint."""
    messages = body.get("messages")
    if isinstance(messages, list):
        if len(messages) > MAX_MESSAGES:
            raise BadRequest(f"too many messages: {len(messages)} (at most {MAX_MESSAGES})")
        for i, m in enumerate(messages):
            if isinstance(m, dict):
                check_images(m.get("images"), f"messages[{i}].")
    check_images(body.get("images"), "")
    for key in ("context", "prompt"):
        v = body.get(key)
        if isinstance(v, list) and len(v) > MAX_IDS:
            raise BadRequest(f"{key} holds {len(v)} token ids (at most {MAX_IDS})")
    tools = body.get("tools")
    if isinstance(tools, list) and len(tools) > MAX_TOOLS:
        raise BadRequest(f"too many tools: {len(tools)} (at most {MAX_TOOLS})")
    inputs = body.get("input")
    if isinstance(inputs, list) and len(inputs) > MAX_INPUTS:
        raise BadRequest(f"too many inputs: {len(inputs)} (at most {MAX_INPUTS})")
    for holder in (body, body.get("options") if isinstance(body.get("options"), dict) else {}):
        stop = holder.get("stop")
        if isinstance(stop, str):
            stop = [stop]
        if isinstance(stop, list) and (len(stop) > MAX_STOP or any(
                isinstance(s, str) and len(s) > MAX_STOP_CHARS for s in stop)):
            raise BadRequest(f"stop holds at most {MAX_STOP} strings of at most {MAX_STOP_CHARS} characters")
    options = body.get("options")
    if isinstance(options, dict):
        for key, value in options.items():
            check_inert_type(key, value)


# options accepted for compatibility without effect (hardware and runner knobs, mirostat): their
# values are not used, but their types are checked as Ollama checks them
INERT_TYPES: dict[str, str] = {
    **dict.fromkeys(("num_gpu", "main_gpu", "num_thread", "num_batch", "mirostat"), "integer"),
    **dict.fromkeys(("mirostat_tau", "mirostat_eta", "tfs_z"), "number"),
    **dict.fromkeys(("use_mmap", "use_mlock", "numa", "low_vram", "f16_kv", "vocab_only", "penalize_newline",
                     "logits_all", "embedding_only"), "boolean"),
}


def check_inert_type(name: str, value: Any) -> None:
    """BadOption when an option in INERT_TYPES has a value of the wrong type (null: unset)."""
    kind = INERT_TYPES.get(name)
    if kind is None or value is None:
        return
    if kind == "boolean":
        ok = isinstance(value, bool)
    else:
        ok = not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value) and (
            kind == "number" or float(value).is_integer())
    if not ok:
        got = json_type(value)
        raise BadOption(f"option {name} must be {'an' if kind == 'integer' else 'a'} {kind}"
                             + ("" if got == "number" else f", not {got}"))


def json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), type(value).__name__)
