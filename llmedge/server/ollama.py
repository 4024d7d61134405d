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
from llmedge.server.security import HTTPError

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
    """``value`` as an int or float option, HTTPError 400 for anything else (bools, strings, NaN)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise HTTPError(400, f"option {name} must be a number, not {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise HTTPError(400, f"option {name} must be finite")
    if kind is int:
        if int(value) != value:
            raise HTTPError(400, f"option {name} must be an integer")
        value = int(value)
        if abs(value) > 2**63 - 1:
            raise HTTPError(400, f"option {name} is out of range")
        return value
    return float(value)


def parse_stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return tuple(value)
    raise HTTPError(400, "stop must be a string or a list of strings")


SPECULATIVE_OPTIONS = ("lookup", "draft_max", "draft_min")  # GenerationTask.prepare takes them out of sampling


def parse_options(options: Any) -> dict[str, Any]:
    """Ollama ``options`` -> ``{"sampling": {...}, "max_tokens", "stop", "num_ctx", "num_keep"}``."""
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise HTTPError(400, "options must be an object")
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
            raise HTTPError(400, f"unknown option '{key}'")
    if "top_k" in sampling and sampling["top_k"] < 0:
        raise HTTPError(400, "option top_k must not be negative")
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
        raise HTTPError(400, "keep_alive must be a duration or a number of seconds")
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
                raise HTTPError(400, f"invalid keep_alive duration {value!r}") from None
            seconds = sign * total
    else:
        raise HTTPError(400, "keep_alive must be a duration or a number of seconds")
    if not math.isfinite(seconds) or seconds < 0 or seconds > limits.MAX_KEEP_ALIVE:
        return None
    return seconds


def now_rfc3339() -> str:
    return rfc3339(time.time())


def rfc3339(t: float) -> str:
    dt = datetime.fromtimestamp(t, UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond:06d}000Z"


def final_fields(result: dict[str, Any]) -> dict[str, Any]:
    """The closing fields of a generate or chat response."""
    return {
        "done": True,
        "done_reason": result["done_reason"],
        "total_duration": result["total_duration"],
        "load_duration": result["load_duration"],
        "prompt_eval_count": result["prompt_eval_count"],
        "prompt_eval_duration": result["prompt_eval_duration"],
        "eval_count": result["eval_count"],
        "eval_duration": result["eval_duration"],
        **result.get("speculative", {}),  # draft_tokens, draft_accepted when speculation ran (llmedge's)
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


def model_details(info: dict[str, Any]) -> dict[str, Any]:
    return {
        "parent_model": "",
        "format": "gguf",
        "family": info.get("family", ""),
        "families": [info.get("family", "")] if info.get("family") else None,
        "parameter_size": info.get("parameter_size", ""),
        "quantization_level": info.get("quantization_level", ""),
    }


def describe_gguf(path: Any) -> dict[str, Any]:
    """Family, parameter count, quantization, context length and the scalar metadata of a GGUF file."""
    from collections import Counter

    from llmedge.gguf import GGUFFile
    from llmedge.modelcheck import check_model_file

    g = GGUFFile(path)
    check_model_file(g)
    arch = g.architecture
    n_params = sum(t.n_elements for t in g.tensors.values())
    types = Counter(t.type_name for t in g.tensors.values())
    quant = max((t for t in types if t not in ("F32",)), key=lambda t: types[t], default="F32")
    meta: dict[str, Any] = {}
    for k, v in g.metadata.items():
        if hasattr(v, "tolist"):
            v = v.tolist()
        if isinstance(v, list | tuple):
            meta[k] = list(v) if len(v) <= 64 else None
        elif isinstance(v, bytes):
            continue
        elif k != "tokenizer.chat_template":
            meta[k] = v
    meta["general.parameter_count"] = n_params
    size = f"{n_params / 1e9:.1f}B" if n_params >= 1e9 else f"{n_params / 1e6:.0f}M"
    ctx = g.metadata.get(f"{arch}.context_length")
    template = g.metadata.get("tokenizer.chat_template") or ""
    return {"family": arch, "parameter_size": size, "quantization_level": quant, "model_info": meta,
            "context_length": int(ctx) if ctx is not None else None,
            "template": template if isinstance(template, str) else "",
            "embedding_length": g.metadata.get(f"{arch}.embedding_length")}
