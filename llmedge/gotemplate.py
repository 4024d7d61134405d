"""Ollama's chat templates: the subset of Go's text/template they use, parsed and evaluated here.

Ollama's registry models ship a `template` layer such as ``{{- range .Messages }}<|im_start|>{{ .Role
}}...{{ end }}``. :func:`parse` turns one into a tree (text, actions, ``if``/``else if``/``else``,
``range`` (with ``$i, $m :=``, ``break``, ``continue``), ``with``, ``{{- -}}`` trimming, comments,
``$variables`` with ``:=``/``=``, ``$`` and ``$.Field`` root access, ``(pipelines)`` and ``|``);
:func:`execute` evaluates it over plain Python values with a fixed set of functions (``and or not eq
ne lt le gt ge len index slice print printf println json currentDate yesterdayDate
toTypeScriptType``). Nothing in a template can reach Python: fields are dictionary keys, functions
come from the table above, and a run is bounded in steps and output size. Anything outside the
subset is a :class:`GoTemplateError` at parse time.

:class:`GoChatTemplate` renders a conversation the way Ollama's ``template.Execute`` does: messages
collated (consecutive same-role messages joined), ``.System`` the system messages joined, and for a
template without ``.Messages`` one ``.System``/``.Prompt``/``.Response`` render per turn, the last
one cut after ``.Response``.
"""

from __future__ import annotations

import datetime
import json
import re
from dataclasses import dataclass, field
from typing import Any

from .errors import TemplateError
from .template import ChatTemplate

MAX_STEPS = 200_000  # nodes evaluated in one render
MAX_OUTPUT = 1 << 20  # characters written by one render
MAX_SOURCE = 64 * 1024


class GoTemplateError(TemplateError):
    """A Go template outside the supported subset, or one that fails to render."""


# -- lexing ----------------------------------------------------------------------------------------
_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<str>"(?:[^"\\\n]|\\.)*")
  | (?P<raw>`[^`]*`)
  | (?P<char>'(?:[^'\\]|\\.)')
  | (?P<num>-?(?:0[xX][0-9a-fA-F]+|\d+(?:\.\d+)?(?:[eE][-+]?\d+)?))
  | (?P<decl>:=)
  | (?P<punct>[=|(),])
  | (?P<var>\$[A-Za-z0-9_]*(?:\.[A-Za-z_]\w*)*)
  | (?P<field>(?:\.[A-Za-z_]\w*)+|\.)
  | (?P<ident>[A-Za-z_]\w*)
""", re.VERBOSE)

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "a": "\a", "b": "\b",
            "f": "\f", "v": "\v", "0": "\0"}


def _unquote(s: str) -> str:
    def one(m: re.Match[str]) -> str:
        e = m.group(1)
        if e[0] in "xuU":
            return chr(int(e[1:], 16))
        return _ESCAPES.get(e, e)

    return re.sub(r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|.)", one, s[1:-1])


@dataclass
class _Tok:
    kind: str
    text: str
    space_before: bool


def _tokens(action: str) -> list[_Tok]:
    out: list[_Tok] = []
    pos, space = 0, False
    while pos < len(action):
        m = _TOKEN.match(action, pos)
        if m is None:
            raise GoTemplateError(f"go template: unexpected {action[pos:pos + 10]!r} in action")
        kind = m.lastgroup or ""
        if kind == "ws":
            space = True
        else:
            out.append(_Tok(kind, m.group(), space))
            space = False
        pos = m.end()
    return out


def _split(source: str) -> list[tuple[str, str, int]]:
    """[(kind 'text'|'action', text, offset)] with `{{-`/`-}}` trimming and comments applied."""
    parts: list[tuple[str, str, int]] = []
    pos, trim_next = 0, False
    while True:
        start = source.find("{{", pos)
        text = source[pos:] if start < 0 else source[pos:start]
        if trim_next:
            text = text.lstrip(" \t\r\n")
        if start < 0:
            parts.append(("text", text, pos))
            return parts
        inner_start = start + 2
        trim_left = source.startswith("- ", inner_start) or source.startswith("-\n", inner_start) or \
            source.startswith("-\t", inner_start) or source.startswith("-\r", inner_start)
        if trim_left:
            text = text.rstrip(" \t\r\n")
            inner_start += 1
        parts.append(("text", text, pos))
        end = _action_end(source, inner_start)
        inner_end, trim_next = end, False
        if end - 1 >= inner_start and source[end - 1] == "-" and source[end - 2:end - 1] in (" ", "\t", "\n", "\r"):
            trim_next, inner_end = True, end - 1
        inner = source[inner_start:inner_end]
        if not inner.strip().startswith("/*"):
            parts.append(("action", inner, start))
        elif not inner.strip().endswith("*/"):
            raise GoTemplateError("go template: unclosed comment")
        pos = end + 2


def _action_end(source: str, start: int) -> int:
    """Offset of the `}}` closing the action that starts at `start` (quotes may hold braces)."""
    i = start
    while i < len(source):
        c = source[i]
        if c in "\"'`":
            j = i + 1
            while j < len(source) and source[j] != c:
                j += 2 if source[j] == "\\" and c != "`" else 1
            i = j + 1
            continue
        if source.startswith("/*", i):
            j = source.find("*/", i + 2)
            if j < 0:
                raise GoTemplateError("go template: unclosed comment")
            i = j + 2
            continue
        if source.startswith("}}", i):
            return i
        i += 1
    raise GoTemplateError("go template: unclosed action")


# -- the tree --------------------------------------------------------------------------------------
@dataclass
class Pipe:
    decl: list[str]
    assign: bool  # `=` rather than `:=`
    cmds: list[list[Any]]  # each command: operands; an ("ident", name) first is a function call


@dataclass
class Node:
    kind: str  # text | action | if | range | with | break | continue
    pos: int
    text: str = ""
    pipe: Pipe | None = None
    body: list[Node] = field(default_factory=list)
    orelse: list[Node] = field(default_factory=list)


FUNCS = {"and", "or", "not", "eq", "ne", "lt", "le", "gt", "ge", "len", "index", "slice", "print",
         "printf", "println", "json", "currentDate", "yesterdayDate", "toTypeScriptType"}


class _Parser:
    def __init__(self, source: str) -> None:
        self.parts = _split(source)
        self.i = 0
        self.response_pos: int | None = None  # the first `.Response` field (Ollama cuts after it)
        self.idents: set[str] = set()
        self.loops = 0

    def parse(self) -> list[Node]:
        nodes, stop = self.block()
        if stop is not None:
            raise GoTemplateError(f"go template: unexpected {{{{{stop[0]}}}}}")
        return nodes

    def block(self) -> tuple[list[Node], tuple[str, list[_Tok], int] | None]:
        """Nodes up to an `end`/`else` (returned as the stop keyword) or the end of the source."""
        nodes: list[Node] = []
        while self.i < len(self.parts):
            kind, text, pos = self.parts[self.i]
            self.i += 1
            if kind == "text":
                if text:
                    nodes.append(Node("text", pos, text=text))
                continue
            toks = _tokens(text)
            if not toks:
                raise GoTemplateError("go template: missing value for command")
            head = toks[0].text if toks[0].kind == "ident" else ""
            if head in ("end", "else"):
                return nodes, (head, toks[1:], pos)
            if head in ("if", "range", "with"):
                nodes.append(self.control(head, toks[1:], pos))
            elif head in ("break", "continue"):
                if not self.loops or len(toks) > 1:
                    raise GoTemplateError(f"go template: {{{{{head}}}}} outside range")
                nodes.append(Node(head, pos))
            elif head in ("define", "template", "block"):
                raise GoTemplateError(f"go template: {{{{{head}}}}} is not supported")
            else:
                nodes.append(Node("action", pos, pipe=self.pipe(toks, pos)))
        return nodes, None

    def control(self, kind: str, toks: list[_Tok], pos: int) -> Node:
        node = Node(kind, pos, pipe=self.pipe(toks, pos, allow_two=kind == "range"))
        self.loops += kind == "range"
        node.body, stop = self.block()
        self.loops -= kind == "range"
        if stop is None:
            raise GoTemplateError(f"go template: unclosed {{{{{kind}}}}}")
        word, rest, epos = stop
        if word == "else":
            if rest and rest[0].kind == "ident" and rest[0].text in ("if", "with") and kind != "range":
                node.orelse = [self.control(rest[0].text, rest[1:], epos)]  # consumes the shared end
                return node
            if rest:
                raise GoTemplateError("go template: unexpected words after {{else}}")
            node.orelse, stop = self.block()
            if stop is None or stop[0] != "end":
                raise GoTemplateError(f"go template: {{{{{kind}}}}} without {{{{end}}}}")
        elif rest:
            raise GoTemplateError("go template: unexpected words after {{end}}")
        return node

    def pipe(self, toks: list[_Tok], pos: int, allow_two: bool = False) -> Pipe:
        decl: list[str] = []
        assign = False
        j = 0
        while j + 1 < len(toks) and toks[j].kind == "var" and "." not in toks[j].text:
            nxt = toks[j + 1]
            if nxt.kind == "decl" or (nxt.kind == "punct" and nxt.text == "="):
                decl.append(toks[j].text)
                assign = nxt.text == "="
                j += 2
                break
            if nxt.kind == "punct" and nxt.text == "," and allow_two and not decl:
                decl.append(toks[j].text)
                j += 2
                continue
            break
        else:
            if decl:
                raise GoTemplateError("go template: bad variable declaration")
        if decl and not (toks[j - 1].kind == "decl" or toks[j - 1].text == "="):
            raise GoTemplateError("go template: bad variable declaration")
        cmds, rest = self.commands(toks[j:], pos)
        if rest:
            raise GoTemplateError(f"go template: unexpected {rest[0].text!r}")
        if not cmds:
            raise GoTemplateError("go template: missing value for command")
        return Pipe(decl, assign, cmds)

    def commands(self, toks: list[_Tok], pos: int) -> tuple[list[list[Any]], list[_Tok]]:
        cmds: list[list[Any]] = []
        cmd: list[Any] = []
        k = 0
        while k < len(toks):
            t = toks[k]
            if t.kind == "punct" and t.text == ")":
                break
            if t.kind == "punct" and t.text == "|":
                if not cmd:
                    raise GoTemplateError("go template: missing command before |")
                cmds.append(cmd)
                cmd = []
                k += 1
                continue
            operand, k = self.operand(toks, k, pos)
            cmd.append(operand)
        if cmd:
            cmds.append(cmd)
        return cmds, toks[k:]

    def operand(self, toks: list[_Tok], k: int, pos: int) -> tuple[Any, int]:
        t = toks[k]
        if t.kind == "punct" and t.text == "(":
            inner, rest = self.commands(toks[k + 1:], pos)
            if not rest or rest[0].text != ")" or not inner:
                raise GoTemplateError("go template: unclosed (")
            k = len(toks) - len(rest) + 1
            op: Any = ("pipe", Pipe([], False, inner))
            if k < len(toks) and toks[k].kind == "field" and not toks[k].space_before and toks[k].text != ".":
                op = ("chain", op, toks[k].text[1:].split("."))
                k += 1
            return op, k + 0
        if t.kind in ("str", "raw"):
            return ("lit", _unquote(t.text) if t.kind == "str" else t.text[1:-1]), k + 1
        if t.kind == "char":
            return ("lit", ord(_unquote(t.text))), k + 1
        if t.kind == "num":
            text = t.text
            value: Any = int(text, 0) if re.fullmatch(r"-?(0[xX][0-9a-fA-F]+|\d+)", text) else float(text)
            return ("lit", value), k + 1
        if t.kind == "field":
            names = [] if t.text == "." else t.text[1:].split(".")
            self.note_fields(names, pos, field=True)
            return ("field", None, names), k + 1
        if t.kind == "var":
            name, *names = t.text.split(".")
            self.note_fields(names, pos, field=False)
            return ("field", name, names), k + 1
        if t.kind == "ident":
            if t.text in ("true", "false"):
                return ("lit", t.text == "true"), k + 1
            if t.text == "nil":
                return ("lit", None), k + 1
            if t.text not in FUNCS:
                raise GoTemplateError(f'go template: function "{t.text}" not defined')
            return ("func", t.text), k + 1
        raise GoTemplateError(f"go template: unexpected {t.text!r}")

    def note_fields(self, names: list[str], pos: int, field: bool) -> None:
        """Ollama's Vars: every field/variable identifier, lowercased; its cut: the first `.Response` field."""
        self.idents.update(n.lower() for n in names)
        if field and "Response" in names and self.response_pos is None:
            self.response_pos = pos


@dataclass
class GoTemplate:
    """A parsed template: its tree and what Ollama's Execute needs to know about it."""

    nodes: list[Node]
    uses_messages: bool
    response_pos: int | None


def parse(source: str, ollama: bool = True) -> GoTemplate:
    """Parse Go template text; GoTemplateError outside the supported subset. `ollama` touches it up as
    Ollama's Parse does: a template using neither .Messages nor .Response gets `{{ .Response }}` appended."""
    if len(source) > MAX_SOURCE:
        raise GoTemplateError(f"go template: longer than {MAX_SOURCE} characters")
    p = _Parser(source)
    try:
        nodes = p.parse()
    except RecursionError:
        raise GoTemplateError("go template: nested too deeply") from None
    if ollama and "messages" not in p.idents and "response" not in p.idents:  # Ollama appends {{ .Response }}
        nodes.append(Node("action", len(source), pipe=Pipe([], False, [[("field", None, ["Response"])]])))
        p.response_pos = len(source)
    return GoTemplate(nodes, "messages" in p.idents, p.response_pos)


# -- evaluation ------------------------------------------------------------------------------------
class Struct(dict):
    """A Go struct value: a missing field is an error (a map's missing key is a zero value)."""

    json_value: Any = None  # what json.Marshal / String() give, when not the fields themselves


class _Break(Exception):
    pass


class _Continue(Exception):
    pass


class _Cut(Exception):
    pass


class JSONMap(dict):
    """A map whose String() is its JSON (Ollama's templateArgs and templateProperties)."""


class JSONList(list):
    """A slice whose String() is its JSON (Ollama's templateTools)."""


def _go_order(value: Any) -> Any:
    """`value` with keys in json.Marshal's order: struct fields as declared, map keys sorted."""
    if isinstance(value, Struct):
        return value.json_value if value.json_value is not None else {k: _go_order(v) for k, v in value.items()}
    if isinstance(value, dict):
        return {str(k): _go_order(value[k]) for k in sorted(value, key=str)}
    if isinstance(value, list | tuple):
        return [_go_order(v) for v in value]
    return value


def go_json(value: Any) -> str:
    """json.Marshal's text: compact, map keys sorted, <, > and & escaped."""
    text = json.dumps(_go_order(value), ensure_ascii=False, separators=(",", ":"), default=str)
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def go_str(value: Any) -> str:
    """How text/template prints a value (fmt's %v)."""
    if isinstance(value, str):
        return value
    if value is None:
        return "<no value>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value) if not value.is_integer() or abs(value) >= 1e21 else str(int(value))
    if isinstance(value, Struct | JSONMap | JSONList):
        return go_json(value)
    if isinstance(value, list | tuple):
        return "[" + " ".join(go_str(v) for v in value) + "]"
    if isinstance(value, dict):
        return "map[" + " ".join(f"{go_str(k)}:{go_str(v)}" for k, v in sorted(value.items())) + "]"
    return str(value)


def truth(value: Any) -> bool:
    if isinstance(value, Struct):
        return True
    if value is None:
        return False
    if isinstance(value, bool | int | float):
        return value != 0
    if isinstance(value, str | list | tuple | dict):
        return len(value) > 0
    return True


def _length(value: Any) -> int:
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, list | tuple | dict):
        return len(value)
    raise GoTemplateError(f"go template: len of {type(value).__name__}")


def _index(value: Any, *keys: Any) -> Any:
    for key in keys:
        if isinstance(value, list | tuple | str):
            if not isinstance(key, int) or isinstance(key, bool) or not 0 <= key < _length(value):
                raise GoTemplateError(f"go template: index {key!r} out of range")
            value = value.encode()[key] if isinstance(value, str) else value[key]
        elif isinstance(value, dict):
            value = value.get(key)
        else:
            raise GoTemplateError(f"go template: can't index {type(value).__name__}")
    return value


def _slice(value: Any, *bounds: Any) -> Any:
    if not isinstance(value, list | tuple | str) or len(bounds) > 2:
        raise GoTemplateError("go template: bad slice")
    size = _length(value)
    lo = bounds[0] if bounds else 0
    hi = bounds[1] if len(bounds) > 1 else size
    if not all(isinstance(b, int) and not isinstance(b, bool) for b in (lo, hi)) or not 0 <= lo <= hi <= size:
        raise GoTemplateError(f"go template: slice index out of range [{lo}:{hi}]")
    if isinstance(value, str):
        return value.encode()[lo:hi].decode("utf-8", errors="replace")
    return list(value[lo:hi])


def _kind(v: Any) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "float"
    if isinstance(v, str):
        return "string"
    return "nil" if v is None else "other"


def _same(a: Any, b: Any) -> bool:
    """Go's eq: basic values of one kind (an int and a float, or a string and a number, are an error)."""
    if _kind(a) != _kind(b) or _kind(a) == "other":
        raise GoTemplateError("go template: incompatible types for comparison")
    return bool(a == b)


def _order(a: Any, b: Any) -> int:
    if _kind(a) != _kind(b) or _kind(a) not in ("int", "float", "string"):
        raise GoTemplateError("go template: incompatible types for comparison")
    return (a > b) - (a < b)


def _sprint(args: tuple[Any, ...]) -> str:
    out = ""
    for i, a in enumerate(args):
        if i and not isinstance(a, str) and not isinstance(args[i - 1], str):
            out += " "
        out += go_str(a)
    return out


def _printf(fmt: Any, *args: Any) -> str:
    if not isinstance(fmt, str):
        raise GoTemplateError("go template: printf needs a format string")
    it = iter(args)

    def verb(m: re.Match[str]) -> str:
        v = m.group(1)
        if v == "%":
            return "%"
        try:
            a = next(it)
        except StopIteration:
            return f"%!{v}(MISSING)"
        if v == "q":
            return go_json(a) if isinstance(a, str) else go_str(a)
        if v == "d" and isinstance(a, bool | str):
            return f"%!d({go_str(a)})"
        return go_str(a)

    return re.sub(r"%([svdqt%])", verb, fmt)


def _ts_type(value: Any) -> str:
    t = value.get("type") if isinstance(value, dict) else None
    names = {"string": "string", "integer": "number", "number": "number", "boolean": "boolean"}
    if isinstance(t, str):
        return names.get(t, "any") if t != "array" else _ts_type(value.get("items")) + "[]"
    return "any"


_PLAIN = {
    "not": lambda a: not truth(a),
    "len": _length,
    "index": _index,
    "slice": _slice,
    "print": lambda *a: _sprint(a),
    "println": lambda *a: " ".join(go_str(x) for x in a) + "\n",
    "printf": _printf,
    "json": go_json,
    "eq": lambda a, *bs: any(_same(a, b) for b in bs) if bs else _fail("eq needs two arguments"),
    "ne": lambda a, b: not _same(a, b),
    "lt": lambda a, b: _order(a, b) < 0,
    "le": lambda a, b: _order(a, b) <= 0,
    "gt": lambda a, b: _order(a, b) > 0,
    "ge": lambda a, b: _order(a, b) >= 0,
    "currentDate": lambda *a: datetime.date.today().isoformat(),
    "yesterdayDate": lambda *a: (datetime.date.today() - datetime.timedelta(days=1)).isoformat(),
    "toTypeScriptType": _ts_type,
}


def _fail(msg: str) -> Any:
    raise GoTemplateError(f"go template: {msg}")


class _Run:
    def __init__(self, root: Any, cut_at: int | None) -> None:
        self.vars: list[tuple[str, Any]] = [("$", root)]
        self.out: list[str] = []
        self.size = 0
        self.steps = 0
        self.cut_at = cut_at

    def write(self, text: str) -> None:
        self.size += len(text)
        if self.size > MAX_OUTPUT:
            raise GoTemplateError(f"go template: output exceeds {MAX_OUTPUT} characters")
        self.out.append(text)

    def nodes(self, nodes: list[Node], dot: Any) -> None:
        for node in nodes:
            self.steps += 1
            if self.steps > MAX_STEPS:
                raise GoTemplateError(f"go template: more than {MAX_STEPS} steps")
            if self.cut_at is not None and node.pos > self.cut_at:
                raise _Cut()
            self.node(node, dot)

    def node(self, node: Node, dot: Any) -> None:
        if node.kind == "text":
            self.write(node.text)
        elif node.kind == "action":
            assert node.pipe is not None
            value = self.pipe(node.pipe, dot)
            if not node.pipe.decl:
                self.write(go_str(value))
        elif node.kind in ("if", "with"):
            self.branch(node, dot)
        elif node.kind == "range":
            self.range(node, dot)
        elif node.kind == "break":
            raise _Break()
        else:
            raise _Continue()

    def scoped(self, nodes: list[Node], dot: Any) -> None:
        mark = len(self.vars)
        try:
            self.nodes(nodes, dot)
        finally:
            del self.vars[mark:]

    def branch(self, node: Node, dot: Any) -> None:
        assert node.pipe is not None
        mark = len(self.vars)
        try:
            value = self.pipe(node.pipe, dot)
            if truth(value):
                self.scoped(node.body, value if node.kind == "with" else dot)
            else:
                self.scoped(node.orelse, dot)
        finally:
            del self.vars[mark:]

    def range(self, node: Node, dot: Any) -> None:
        assert node.pipe is not None
        pipe = node.pipe
        value = self.pipe(Pipe([], False, pipe.cmds), dot)
        if isinstance(value, dict):
            items: list[tuple[Any, Any]] = sorted(value.items())
        elif isinstance(value, list | tuple):
            items = list(enumerate(value))
        elif isinstance(value, int) and not isinstance(value, bool):
            items = [(i, i) for i in range(min(value, MAX_STEPS + 1))]
        elif value is None:
            items = []
        else:
            raise GoTemplateError(f"go template: range can't iterate over {go_str(value)[:40]}")
        if not items:
            self.scoped(node.orelse, dot)
            return
        for key, elem in items:
            mark = len(self.vars)
            if len(pipe.decl) == 1:
                self.vars.append((pipe.decl[0], elem))
            elif len(pipe.decl) == 2:
                self.vars += [(pipe.decl[0], key), (pipe.decl[1], elem)]
            try:
                self.nodes(node.body, elem)
            except _Break:
                break
            except _Continue:
                continue
            finally:
                del self.vars[mark:]

    def pipe(self, pipe: Pipe, dot: Any) -> Any:
        value: Any = _NOTHING
        for cmd in pipe.cmds:
            value = self.command(cmd, dot, value)
        if pipe.decl:
            if pipe.assign:
                self.set_var(pipe.decl[0], value)
            else:
                self.vars.append((pipe.decl[-1], value))
        return value

    def set_var(self, name: str, value: Any) -> None:
        for i in range(len(self.vars) - 1, -1, -1):
            if self.vars[i][0] == name:
                self.vars[i] = (name, value)
                return
        raise GoTemplateError(f"go template: undefined variable {name}")

    def command(self, cmd: list[Any], dot: Any, piped: Any) -> Any:
        first = cmd[0]
        if first[0] == "func":
            args = cmd[1:]
            extra = [] if piped is _NOTHING else [piped]
            if first[1] in ("and", "or"):
                return self.logic(first[1], args, extra, dot)
            values = [self.operand(a, dot) for a in args] + extra
            try:
                result = _PLAIN[first[1]](*values)
            except TypeError:
                raise GoTemplateError(f"go template: wrong number of arguments for {first[1]}") from None
            if isinstance(result, str) and len(result) > MAX_OUTPUT:  # e.g. a printf doubling a variable
                raise GoTemplateError(f"go template: a value exceeds {MAX_OUTPUT} characters")
            return result
        if len(cmd) > 1 or piped is not _NOTHING:
            raise GoTemplateError("go template: can't give argument to non-function")
        return self.operand(first, dot)

    def logic(self, name: str, args: list[Any], extra: list[Any], dot: Any) -> Any:
        if len(args) + len(extra) < 1:
            raise GoTemplateError(f"go template: {name} needs arguments")
        value: Any = None
        for a in args:
            value = self.operand(a, dot)
            if truth(value) == (name == "or"):
                return value
        for value in extra:
            if truth(value) == (name == "or"):
                return value
        return value

    def operand(self, op: Any, dot: Any) -> Any:
        kind = op[0]
        if kind == "lit":
            return op[1]
        if kind == "pipe":
            return self.pipe(op[1], dot)
        if kind == "chain":
            return self.fields(self.operand(op[1], dot), op[2])
        if kind == "field":
            base = dot if op[1] is None else self.var(op[1])
            return self.fields(base, op[2])
        raise GoTemplateError(f"go template: {op[1]} used as a value")

    def var(self, name: str) -> Any:
        for n, v in reversed(self.vars):
            if n == name:
                return v
        raise GoTemplateError(f"go template: undefined variable {name}")

    def fields(self, value: Any, names: list[str]) -> Any:
        for name in names:
            if isinstance(value, Struct):
                if name not in value:
                    raise GoTemplateError(f"go template: can't evaluate field {name}")
                value = value[name]
            elif isinstance(value, dict):
                value = value.get(name)
            else:
                raise GoTemplateError(f"go template: can't evaluate field {name} in {type(value).__name__}")
        return value


_NOTHING = object()


def execute(template: GoTemplate, data: Any, cut: bool = False) -> str:
    """Render `template` over `data`; `cut` stops where Ollama's last legacy turn is cut (after the
    first `.Response`)."""
    run = _Run(data, template.response_pos if cut else None)
    try:
        run.nodes(template.nodes, data)
    except _Cut:
        pass
    except (_Break, _Continue):
        raise GoTemplateError("go template: break or continue outside range") from None
    except RecursionError:
        raise GoTemplateError("go template: nested too deeply") from None
    return "".join(run.out)


# -- Ollama's chat values --------------------------------------------------------------------------
def _tool_call(call: dict[str, Any], index: int) -> Struct:
    fn = call.get("function") or {}
    args = fn.get("arguments") or {}
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            args = {}
    return Struct(ID=call.get("id") or "", Function=Struct(Index=fn.get("index", index), Name=fn.get("name") or "",
                                                           Arguments=JSONMap(args)))


def _message(m: dict[str, Any]) -> Struct:
    calls = [_tool_call(c, i) for i, c in enumerate(m.get("tool_calls") or [])]
    return Struct(Role=m.get("role") or "", Content=m.get("content") or "", Thinking=m.get("thinking") or "",
                  Images=list(m.get("images") or []), ToolCalls=calls, ToolName=m.get("tool_name") or m.get("name")
                  or "", ToolCallID=m.get("tool_call_id") or "")


_PROPERTY_FIELDS = ("anyOf", "type", "items", "description", "enum", "properties", "required")


def _property_json(p: Any) -> Any:
    """An api.ToolProperty as json.Marshal writes it (declared field order, empty fields left out)."""
    if not isinstance(p, dict):
        return p
    out = {k: p[k] for k in _PROPERTY_FIELDS if p.get(k)}
    if "anyOf" in out:
        out["anyOf"] = [_property_json(x) for x in out["anyOf"]]
    if "properties" in out:
        out["properties"] = {k: _property_json(v) for k, v in sorted(out["properties"].items())}
    return out


def _tool(t: dict[str, Any]) -> Struct:
    fn = t.get("function") or {}
    params = fn.get("parameters") or {}
    props = JSONMap(params.get("properties") or {})
    value = Struct(Type=t.get("type") or "function", Items=t.get("items"), Function=Struct(
        Name=fn.get("name") or "", Description=fn.get("description") or "",
        Parameters=Struct(Type=params.get("type") or "", Defs=params.get("$defs"), Items=params.get("items"),
                          Required=list(params.get("required") or []), Properties=props)))
    parameters = {"type": params.get("type") or "", **{k: params[k] for k in ("$defs", "items", "required")
                                                       if params.get(k)},
                  "properties": {k: _property_json(v) for k, v in sorted(props.items())}}
    value.json_value = {"type": t.get("type") or "function", **({"items": t["items"]} if t.get("items") else {}),
                        "function": {"name": fn.get("name") or "", "description": fn.get("description") or "",
                                     "parameters": parameters}}
    return value


def collate(messages: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """Ollama's collate: the system messages joined, consecutive same-role messages merged (not tools)."""
    system: list[str] = []
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.get("role") == "system":
            system.append(m.get("content") or "")
        if out and out[-1].get("role") == m.get("role") and m.get("role") != "tool":
            out[-1] = {**out[-1], "content": (out[-1].get("content") or "") + "\n\n" + (m.get("content") or "")}
        else:
            out.append(dict(m))
    return "\n\n".join(system), out


def render_chat(template: GoTemplate, messages: list[dict[str, Any]],
                tools: list[dict[str, Any]] | None = None, think: bool | None = None, think_level: str = "") -> str:
    """The prompt Ollama's template.Execute writes for a conversation (``think``: the request's, if set)."""
    system, msgs = collate(messages)
    base = {"Think": bool(think), "ThinkLevel": think_level, "IsThinkSet": think is not None}
    if template.uses_messages:
        data = {**base, "System": system, "Messages": [_message(m) for m in msgs],
                "Tools": JSONList(_tool(t) for t in tools) if tools else None, "Response": ""}
        return execute(template, data)
    out: list[str] = []
    turn = {"System": "", "Prompt": "", "Response": ""}

    def flush() -> None:
        out.append(execute(template, {**base, **turn}))
        turn.update(System="", Prompt="", Response="")

    for m in msgs:
        role, content = m.get("role"), m.get("content") or ""
        if role == "system":
            if turn["Prompt"] or turn["Response"]:
                flush()
            turn["System"] = content
        elif role == "user":
            if turn["Response"]:
                flush()
            turn["Prompt"] = content
        elif role == "assistant":
            turn["Response"] = content
    out.append(execute(template, {**base, **turn}, cut=True))
    return "".join(out)


class GoChatTemplate(ChatTemplate):
    """An Ollama Go template with :class:`~llmedge.template.ChatTemplate`'s interface (render, encode)."""

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "", tokenizer: Any = None,
                 name: str = "ollama") -> None:
        self._source = source
        self._name = name
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._tokenizer = tokenizer
        self._template = None
        self._error = None
        self._tool_use = None
        self.parsed = parse(source)

    def render_reply(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                     **extra: Any) -> str:
        """As Ollama: a last assistant message is continued by the template itself (Ollama's templates
        leave the last assistant turn open; legacy ones are cut after its .Response)."""
        return self.render(messages, True, tools, **extra)

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               tools: list[dict[str, Any]] | None = None, **extra: Any) -> str:
        """The prompt as Ollama writes it (its templates always end with the assistant's header)."""
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise GoTemplateError("messages must be a list of {'role': ..., 'content': ...} dicts")
        return render_chat(self.parsed, messages, tools, extra.get("enable_thinking"),
                           str(extra.get("reasoning_effort") or ""))
