"""Ollama Modelfiles: parse one into a base model and defaults, and write defaults back as one.

Commands (case-insensitive, `#` comments): FROM (a store name, a path to a .gguf, or any pullable
name), PARAMETER name value (typed as Ollama types them; `stop` may repeat), SYSTEM, TEMPLATE,
MESSAGE role content, LICENSE (may repeat). Values are a rest of line, a "quoted" string or a
triple-quoted multi-line block. ADAPTER is refused: llmedge does not apply LoRA adapters.

The defaults are a plain dict (`config`): {"parameters": {...}, "system": str, "template": str,
"messages": [{"role", "content"}], "license": [str]}, the same shape the store keeps in manifests.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .defaults import template_problem
from .errors import StoreError

INT_PARAMS = {"num_ctx", "num_predict", "num_keep", "top_k", "seed", "repeat_last_n", "mirostat",
              "num_batch", "num_gpu", "num_thread", "main_gpu"}
FLOAT_PARAMS = {"temperature", "top_p", "min_p", "typical_p", "repeat_penalty", "presence_penalty",
                "frequency_penalty", "mirostat_tau", "mirostat_eta", "tfs_z"}
BOOL_PARAMS = {"penalize_newline", "use_mmap", "numa"}
LIST_PARAMS = {"stop"}
ROLES = {"system", "user", "assistant", "tool"}


@dataclass
class Modelfile:
    """A parsed Modelfile: `base` (what FROM names) and the defaults it sets."""

    base: str
    config: dict[str, Any] = field(default_factory=dict)


def _err(line_no: int, message: str) -> StoreError:
    return StoreError(f"Modelfile line {line_no}: {message}")


def _value(text: str, lines: list[str], i: int) -> tuple[str, int]:
    """The value starting at `text` (rest of line i), consuming more lines for a \"\"\" block."""
    if text.startswith('"""'):
        body = text[3:]
        if '"""' in body:
            return body[: body.index('"""')], i
        parts = [body]
        for j in range(i + 1, len(lines)):
            if '"""' in lines[j]:
                parts.append(lines[j][: lines[j].index('"""')])
                return "\n".join(parts), j
            parts.append(lines[j])
        raise _err(i + 1, 'unterminated """ block')
    if len(text) >= 2 and text[0] == text[-1] == '"':
        try:
            return json.loads(text), i
        except ValueError:
            return text[1:-1], i
    return text, i


def typed_parameter(name: str, raw: Any) -> Any:
    """A PARAMETER's value typed as Ollama types it; StoreError for unknown names or bad values."""
    try:
        if name in INT_PARAMS:
            return int(raw)
        if name in FLOAT_PARAMS:
            return float(raw)
        if name in BOOL_PARAMS:
            if isinstance(raw, bool):
                return raw
            if str(raw).lower() not in ("true", "false"):
                raise ValueError(raw)
            return str(raw).lower() == "true"
        if name in LIST_PARAMS:
            return [str(v) for v in raw] if isinstance(raw, list) else [str(raw)]
    except (TypeError, ValueError):
        raise StoreError(f"invalid value {raw!r} for parameter {name}") from None
    raise StoreError(f"unknown parameter {name!r}")


def parse(text: str) -> Modelfile:
    """Parse a Modelfile's text; a one-line StoreError names the first bad line."""
    lines = text.splitlines()
    base: str | None = None
    config: dict[str, Any] = {}
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        if not line or line.startswith("#"):
            i += 1
            continue
        command, _, rest = line.partition(" ")
        command, rest = command.upper(), rest.strip()
        if command == "ADAPTER":
            raise _err(i + 1, "ADAPTER is not supported (llmedge does not apply LoRA adapters)")
        if command in ("PARAMETER", "MESSAGE"):
            key, _, rest = rest.partition(" ")
            value, i = _value(rest.strip(), lines, i)
            if command == "PARAMETER":
                _add_parameter(config, key.lower(), value, i)
            else:
                if key.lower() not in ROLES:
                    raise _err(i + 1, f"MESSAGE role must be one of {', '.join(sorted(ROLES))}")
                config.setdefault("messages", []).append({"role": key.lower(), "content": value})
        elif command in ("FROM", "SYSTEM", "TEMPLATE", "LICENSE"):
            value, i = _value(rest, lines, i)
            if command == "FROM":
                base = value.strip()
            elif command == "LICENSE":
                config.setdefault("license", []).append(value)
            else:
                if command == "TEMPLATE":
                    problem = template_problem(value)
                    if problem is not None:
                        raise _err(i + 1, f"TEMPLATE: {problem}")
                config[command.lower()] = value
        else:
            raise _err(i + 1, f"unknown command {command!r}")
        i += 1
    if not base:
        raise StoreError("Modelfile has no FROM line")
    return Modelfile(base, config)


def _add_parameter(config: dict[str, Any], key: str, value: str, i: int) -> None:
    try:
        typed = typed_parameter(key, value)
    except StoreError as e:
        raise _err(i + 1, str(e)) from None
    params = config.setdefault("parameters", {})
    if key in LIST_PARAMS:
        params.setdefault(key, []).extend(typed)
    else:
        params[key] = typed


def merge(base: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """`new` laid over `base`: parameters merge by name, the rest is replaced when `new` sets it."""
    out = {**base, **new}
    if base.get("parameters") or new.get("parameters"):
        out["parameters"] = {**(base.get("parameters") or {}), **(new.get("parameters") or {})}
    return out


def _quote(text: str) -> str:
    return f'"""{text}"""' if "\n" in text or '"' in text else f'"{text}"'


def render(base: str, config: dict[str, Any]) -> str:
    """The Modelfile that `parse` turns back into (base, config)."""
    out = ["# Modelfile generated by llmedge", f"FROM {base}"]
    if config.get("template"):
        out.append(f"TEMPLATE {_quote(config['template'])}")
    if config.get("system"):
        out.append(f"SYSTEM {_quote(config['system'])}")
    for key, value in (config.get("parameters") or {}).items():
        for v in value if isinstance(value, list) else [value]:
            shown = json.dumps(v) if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else v
            out.append(f"PARAMETER {key} {shown}")
    for m in config.get("messages") or []:
        out.append(f"MESSAGE {m.get('role')} {_quote(str(m.get('content', '')))}")
    for text in config.get("license") or []:
        out.append(f"LICENSE {_quote(text)}")
    return "\n".join(out) + "\n"
