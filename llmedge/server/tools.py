"""Tool calling: the tools of a request (Ollama's and OpenAI's shapes), whether a chat template can
show them to the model, the grammar that forces a call (``tool_choice`` ``required`` or a named
function), and the parsing of the model's tool-call syntax back into calls, whole or as the text
streams in.

Formats parsed (each family's own, as its chat template or documentation teaches it):
Qwen/Hermes ``<tool_call>{json}</tool_call>``; Llama 3.x a bare JSON ``{"name", "parameters"}`` and
``<|python_tag|>`` (JSON, or ``tool.call(k=v)``); Mistral ``[TOOL_CALLS][{...}]`` and
``[TOOL_CALLS]name[ARGS]{...}``; Phi-4-mini ``<|tool_call|>[...]<|/tool_call|>`` and ``functools[...]``;
Gemma-style bare JSON (optionally in a Markdown fence) and ``tool_code`` fences with a Python call.
A bare JSON object counts as a call only when it names one of the request's tools.
"""

from __future__ import annotations

import ast
import json
import re
import secrets
import weakref
from dataclasses import dataclass, field
from typing import Any

from llmedge.server.errors import BadRequest

# (start marker, end marker or None: the call runs to the end of the output)
MARKERS: tuple[tuple[str, str | None], ...] = (
    ("<tool_call>", "</tool_call>"),
    ("<|tool_call|>", "<|/tool_call|>"),
    ("<|python_tag|>", None),
    ("[TOOL_CALLS]", None),
    ("functools[", None),
)
_FENCE = re.compile(r"^```(?:json|tool_code)?\s*\n?(.*?)\n?```\s*$", re.S)
_FENCES = ("```json", "```tool_code", "```\n")
_CALL_KEYS = ("name", "function", "type", "id")
_FORCED_HEAD = re.compile(r'\{"name": "((?:[^"\\]|\\.)*)", "arguments": ')
_PROBE = "llmedge_probe_tool_3f9a"


@dataclass
class ToolCall:
    """One call the model made: the function's name and its arguments (a JSON object)."""

    name: str
    arguments: dict[str, Any]
    id: str = field(default_factory=lambda: "call_" + secrets.token_hex(12))


def normalize_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Tools in OpenAI's/Ollama's shape ``{"type": "function", "function": {name, description,
    parameters}}`` (a bare ``{name, parameters}`` is wrapped); BadRequest for anything else."""
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise BadRequest("tools must be an array")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict):
            raise BadRequest(f"tools[{i}] must be an object")
        fn = t.get("function") if "function" in t else t
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise BadRequest(f"tools[{i}].function.name must be a non-empty string")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise BadRequest(f"tools[{i}].function.parameters must be a JSON schema object")
        out.append({"type": "function", "function": {**fn, "parameters": params or {"type": "object",
                                                                                      "properties": {}}}})
    return out


def tool_names(tools: list[dict[str, Any]] | None) -> set[str]:
    return {t["function"]["name"] for t in tools or []}


_tool_support: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def supports_tools(template: Any) -> bool:
    """Whether the chat template shows tools to the model (it renders a probe tool's name)."""
    if template in _tool_support:
        return _tool_support[template]
    probe = [{"type": "function", "function": {"name": _PROBE, "description": "probe",
                                               "parameters": {"type": "object", "properties": {}}}}]
    try:
        ok = _PROBE in template.render([{"role": "user", "content": "hi"}], True, probe)
    except Exception:  # noqa: BLE001 - a template that fails with tools does not support them
        ok = False
    _tool_support[template] = ok
    return ok


def tools_system_text(tools: list[dict[str, Any]]) -> str:
    """How the tools are described to a model whose template cannot show them (a constrained call)."""
    specs = "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in tools)
    return ("You can call these functions. Answer with a JSON object {\"name\": ..., \"arguments\": ...} "
            f"calling one of them:\n{specs}")


def call_schema(tools: list[dict[str, Any]], name: str | None = None) -> dict[str, Any]:
    """The JSON schema of one call ``{"name": ..., "arguments": {...}}`` to ``name`` (else to any tool):
    the grammar of ``tool_choice`` ``required`` or a named function."""
    chosen = [t["function"] for t in tools if name is None or t["function"]["name"] == name]
    if not chosen:
        raise BadRequest(f"tool_choice names a function that is not in tools: {name!r}")
    options = [{"type": "object", "properties": {"name": {"const": f["name"]}, "arguments": f["parameters"]},
                "required": ["name", "arguments"]} for f in chosen]
    return options[0] if len(options) == 1 else {"anyOf": options}


# -- parsing --------------------------------------------------------------------------------------
def _as_call(obj: Any) -> ToolCall | None:
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("function"), dict):
        obj = obj["function"]
    name = obj.get("name")
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            return None
    if not isinstance(name, str) or not name or not isinstance(args, dict):
        return None
    return ToolCall(name, args)


def _json_calls(text: str) -> list[ToolCall] | None:
    """Calls in ``text``: one JSON object or array of them, or several separated by ``;``/newlines."""
    text = text.strip()
    if not text:
        return None
    dec = json.JSONDecoder()
    pos, found = 0, []
    while pos < len(text):
        try:
            obj, end = dec.raw_decode(text, pos)
        except ValueError:
            return None
        items = obj if isinstance(obj, list) else [obj]
        for it in items:
            call = _as_call(it)
            if call is None:
                return None
            found.append(call)
        pos = end
        while pos < len(text) and text[pos] in " \t\r\n;,":
            pos += 1
    return found or None


def _python_calls(text: str) -> list[ToolCall] | None:
    """``name(k=v, ...)`` or ``name.call(k=v)`` calls with literal arguments (Llama's built-in tools,
    Gemma's ``tool_code``)."""
    try:
        tree = ast.parse(text.strip(), mode="exec")
    except (SyntaxError, ValueError):
        return None
    out = []
    for stmt in tree.body:
        if not isinstance(stmt, ast.Expr) or not isinstance(stmt.value, ast.Call) or stmt.value.args:
            return None
        f = stmt.value.func
        if isinstance(f, ast.Attribute) and f.attr == "call" and isinstance(f.value, ast.Name):
            name = f.value.id
        elif isinstance(f, ast.Name):
            name = f.id
        else:
            return None
        try:
            args = {k.arg: ast.literal_eval(k.value) for k in stmt.value.keywords if k.arg}
        except ValueError:
            return None
        out.append(ToolCall(name, args))
    return out or None


def _mistral_calls(text: str) -> list[ToolCall] | None:
    """``[TOOL_CALLS]`` payloads: a JSON array, or ``name[ARGS]{json}`` (``[CALL_ID]id`` optional), repeated."""
    text = text.strip()
    if text.startswith("[") or text.startswith("{"):
        return _json_calls(text)
    out = []
    for part in filter(None, (p.strip() for p in text.split("[TOOL_CALLS]"))):
        name, sep, args = part.partition("[ARGS]")
        name = name.split("[CALL_ID]")[0].strip()
        if not sep:
            return None
        try:
            obj = json.loads(args)
        except ValueError:
            return None
        if not isinstance(obj, dict):
            return None
        out.append(ToolCall(name, obj))
    return out or None


def _marker_calls(start: str, body: str) -> list[ToolCall] | None:
    if start == "<|python_tag|>":
        return _json_calls(body) or _python_calls(body)
    if start == "[TOOL_CALLS]":
        return _mistral_calls(body)
    if start == "functools[":
        return _json_calls("[" + body)
    return _json_calls(body)


def bare_calls(text: str, names: set[str]) -> list[ToolCall] | None:
    """The whole output as calls (Llama 3.x / Gemma-style JSON, a fenced block): only when every call
    names one of the request's tools."""
    s = text.strip()
    m = _FENCE.match(s)
    if m:
        s = m.group(1)
    calls = _json_calls(s) or (_python_calls(s) if m else None)
    if calls and all(c.name in names for c in calls):
        return calls
    return None


def could_be_bare_call(text: str) -> bool:
    """Whether an output that starts with ``text`` may still be a bare call (a JSON object keyed
    ``name``/``function``/..., a list of them, or a ``json``/``tool_code`` fence): only then is the
    text held back; any other answer streams at once."""
    s = text.lstrip()
    if not s:
        return True
    if s.startswith("`"):
        return any(f.startswith(s) or s.startswith(f) for f in _FENCES)
    if s.startswith("["):
        s = s[1:].lstrip()
        if not s:
            return True
    if not s.startswith("{"):
        return False
    s = s[1:].lstrip()
    if not s:
        return True
    if not s.startswith('"'):
        return False
    key, closed, _ = s[1:].partition('"')
    return key in _CALL_KEYS if closed else any(k.startswith(key) for k in _CALL_KEYS)


def parse_tool_calls(text: str, names: set[str]) -> tuple[str, list[ToolCall]]:
    """``(content, calls)`` of a whole output: text outside the calls, and the calls in order."""
    stream = ToolCallStream(names)
    content, calls = stream.feed(text)
    more, rest = stream.finish()
    return content + more, calls + rest


class ToolCallStream:
    """The streaming parser: feed output text, get back the text that is surely content and the calls
    completed so far. Text that may start a call is held back until it is decided."""

    def __init__(self, names: set[str], constrained: bool = False) -> None:
        self.names = names
        self.constrained = constrained  # the whole output is one grammar-forced call
        self.fragments: list[tuple[str, str | None, str]] = []  # (call id, name on the first, arguments text)
        self.call_id: str | None = None  # the forced call's id once its name is known
        self.sent = 0  # how much of the forced call's text went out as fragments
        self.buf = ""
        self.emitted_content = False
        self.open: tuple[str, str | None] | None = None  # the marker of the call being read

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        self.buf += text
        if self.constrained:
            self._stream_forced()
            return "", []
        content, calls = "", []
        while self.buf:
            if self.open is not None:
                start, end = self.open
                if end is None or end not in self.buf:
                    break
                body, _, self.buf = self.buf.partition(end)
                self.open = None
                calls += _marker_calls(start, body) or []
                continue
            hit = min(((self.buf.find(s), s, e) for s, e in MARKERS if s in self.buf), default=None)
            if hit is not None:
                i, s, e = hit
                content += self.buf[:i]
                self.buf = self.buf[i + len(s):]
                self.open = (s, e)
                continue
            if not self.emitted_content and not content and could_be_bare_call(self.buf):
                break  # may be a bare JSON call: decided at the end
            keep = _partial_marker(self.buf)
            content += self.buf[:len(self.buf) - keep]
            self.buf = self.buf[len(self.buf) - keep:]
            break
        if content:
            self.emitted_content = True
        return content, calls

    def _stream_forced(self) -> None:
        """The forced call's arguments as they are generated: ``{"name": N, "arguments": `` opens the
        call (the grammar writes exactly these separators), then everything but a last character that
        may be the outer ``}``."""
        if self.call_id is None:
            m = _FORCED_HEAD.match(self.buf)
            if m is None:
                return
            self.call_id = "call_" + secrets.token_hex(12)
            self.fragments.append((self.call_id, json.loads(f'"{m.group(1)}"'), ""))
            self.sent = m.end()
        end = len(self.buf) - 1
        if end > self.sent:
            self.fragments.append((self.call_id, None, self.buf[self.sent:end]))
            self.sent = end

    def take_fragments(self) -> list[tuple[str, str | None, str]]:
        out, self.fragments = self.fragments, []
        return out

    def finish(self) -> tuple[str, list[ToolCall]]:
        buf, self.buf = self.buf, ""
        if self.constrained:
            try:
                call = _as_call(json.loads(buf))
            except ValueError:
                call = None
            if call is None:
                return buf, []
            if self.call_id is not None:
                call.id = self.call_id
                rest = buf[self.sent:len(buf.rstrip()) - 1]  # what is left of the arguments, not the outer }
                if rest:
                    self.fragments.append((self.call_id, None, rest))
            return "", [call]
        if self.open is not None:
            start, _ = self.open
            self.open = None
            calls = _marker_calls(start, buf)
            return ("", calls) if calls else (start + buf, [])
        if not self.emitted_content:
            calls = bare_calls(buf, self.names)
            if calls:
                return "", calls
        return buf, []


def _partial_marker(text: str) -> int:
    """How many characters at the end of ``text`` could begin a marker."""
    best = 0
    for s, _ in MARKERS:
        for n in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:n]):
                best = max(best, n)
                break
    return best
