"""Chat templates: the GGUF ``tokenizer.chat_template`` rendered in a Jinja2 sandbox.

This module owns turning a list of chat messages into the prompt string a model was trained on.
The template comes from the GGUF file (``tokenizer.chat_template``; ``tokenizer.chat_template.tool_use``
when tools are given and the file has one) and is rendered the way llama-cpp-python's
``Jinja2ChatFormatter`` and Hugging Face transformers render it: Jinja2's
``ImmutableSandboxedEnvironment`` with ``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols``
extension, a pass-through ``{% generation %}`` tag, transformers' ``tojson`` filter and the globals
``raise_exception`` and ``strftime_now``; the variables are ``messages``, ``bos_token``,
``eos_token``, ``add_generation_prompt``, ``tools`` and any extra keyword.

A file without a template gets a built-in one chosen by ``general.architecture``: Gemma's official
turn format for gemma/gemma2/gemma3 (a system message is folded into the first user turn), ChatML
(llama.cpp's own fallback) for everything else.

Safety: templates come from downloaded files. Attribute or item access to names starting with an
underscore (``''.__class__``, ``cycler.__init__.__globals__``, ``self._TemplateReference__context``)
is rejected before anything runs (a static check of the parsed template) and, as a second line, at
render time by the sandbox, which here raises instead of rendering an empty string. Both surface as
:class:`~llmedge.errors.TemplateError` saying it is a sandbox violation. Every other failure (syntax,
``raise_exception``, a runtime error) is one ``TemplateError`` too.

BOS and the tokenizer (decided here, as llama.cpp's server does): :meth:`ChatTemplate.render` returns
exactly what the template writes, including a leading ``bos_token`` if the template writes one
(Gemma's does). To feed the prompt to the model, tokenize it with :meth:`ChatTemplate.prompt_ids`:
when the model adds BOS by itself (``tokenizer.ggml.add_bos_token``) a BOS text written by the
template is removed first (and likewise a trailing EOS text when the model adds EOS), then the text
is tokenized with ``add_bos=True, special=True``. The result holds exactly one BOS, never two.
"""

from __future__ import annotations

import ctypes
import json
import re
import threading
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

import jinja2
import jinja2.compiler
import jinja2.ext
import jinja2.nodes
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from llmedge.errors import TemplateError

if TYPE_CHECKING:
    from llmedge.tokenizer import Tokenizer

__all__ = ["CHATML_TEMPLATE", "GEMMA_TEMPLATE", "ChatTemplate", "fallback_template"]

# llama.cpp common/chat.cpp CHATML_TEMPLATE_SRC
CHATML_TEMPLATE = (
    "{%- for message in messages -%}\n"
    "  {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<|im_start|>assistant\n' -}}\n"
    "{%- endif -%}"
)

# Gemma 3's official template (google/gemma-3-*-it tokenizer_config.json)
GEMMA_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\n'}}\n"
    "{%- endif -%}\n"
)

_GEMMA_ARCHS = frozenset({"gemma", "gemma2", "gemma3", "gemma3n"})


def fallback_template(architecture: str) -> tuple[str, str]:
    """The built-in ``(name, source)`` used when a file has no chat template."""
    if architecture in _GEMMA_ARCHS:
        return "gemma", GEMMA_TEMPLATE
    return "chatml", CHATML_TEMPLATE


class _RaisedByTemplate(Exception):
    """``raise_exception(message)`` called by a template."""


MAX_RENDER_CHARS = 32 << 20  # the largest prompt (and any string a template builds on the way)
RENDER_SECONDS = 5.0  # real templates render in milliseconds; a loop that runs longer is refused
_GROWING_METHODS = frozenset({"replace", "center", "ljust", "rjust", "zfill", "expandtabs", "join"})
_PCT_BIG = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(?:\*|\d{6,}|\d*\.(?:\*|\d{6,}))")  # %-format widths
_FMT_BIG = re.compile(r"\{[^{}]*:[^{}]*(?:\d{6,}|\{)")  # str.format widths, also computed ones


class _TooBig(Exception):
    """A template tried to build a string or list past MAX_RENDER_CHARS."""


class _RenderTimeout(BaseException):
    """Injected into the rendering thread when it runs past RENDER_SECONDS (BaseException, so that a
    template's own error handling cannot swallow it)."""


def _line(message: str, limit: int = 500) -> str:
    """A message built from template text, made one line (an error is one line wherever it is shown)."""
    flat = " ".join(message.split())
    return flat if len(flat) <= limit else flat[:limit] + "..."


def _size(x: Any) -> int:
    return len(x) if isinstance(x, str | bytes | list | tuple) else 0


def _bound(n: int, what: str) -> None:
    if n > MAX_RENDER_CHARS:
        raise _TooBig(f"{what} would hold {n} items, over the limit of {MAX_RENDER_CHARS}")


class _BoundedCodeGenerator(jinja2.compiler.CodeGenerator):
    """Jinja's code generator, with ``~`` (string concatenation) routed through a size check."""

    def visit_Concat(self, node: jinja2.nodes.Concat, frame: Any) -> None:
        self.write("environment.bounded_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class _StrictSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox, but unsafe attribute access raises instead of rendering '', and nothing a
    template computes may grow past MAX_RENDER_CHARS (repetition, concatenation, padding, formatting)."""

    code_generator_class = _BoundedCodeGenerator
    intercepted_binops = frozenset({"*", "**", "%", "+"})

    def unsafe_undefined(self, obj: Any, attribute: str) -> jinja2.Undefined:
        raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")

    def bounded_concat(self, parts: tuple[Any, ...]) -> str:
        strs = [p if isinstance(p, str) else str(p) for p in parts]
        _bound(sum(map(len, strs)), "a concatenation")
        return "".join(strs)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(n, int) and _size(seq):
                    _bound(_size(seq) * n, "a repetition")
        elif operator == "+":
            _bound(_size(left) + _size(right), "a concatenation")
        elif operator == "**":
            if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0:
                _bound(abs(left).bit_length() * right // 8, "a power")
        elif operator == "%" and isinstance(left, str) and _PCT_BIG.search(left):
            raise _TooBig("a %-format with a huge or computed width")
        return super().call_binop(context, operator, left, right)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        owner = getattr(__obj, "__self__", None)
        if isinstance(owner, str) and getattr(__obj, "__name__", "") in _GROWING_METHODS:
            _check_str_method(owner, __obj.__name__, args, kwargs)
        return super().call(__context, __obj, *args, **kwargs)

    def wrap_str_format(self, value: Any) -> Any:
        wrapped = super().wrap_str_format(value)
        if wrapped is not None and _FMT_BIG.search(value.__self__):
            raise _TooBig("a format string with a huge width")
        return wrapped


def _check_str_method(s: str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    if name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        hits = len(s) + 1 if args[0] == "" else s.count(args[0])
        _bound(len(s) + hits * len(args[1]), "a replace")
    elif name == "join" and args and isinstance(args[0], list | tuple):
        items = args[0]
        _bound(sum(_size(x) for x in items) + len(s) * len(items), "a join")
    elif name == "expandtabs":
        _bound(len(s) * (args[0] if args and isinstance(args[0], int) else 8), "a tab expansion")
    elif args and isinstance(args[0], int):
        _bound(args[0], f"str.{name}")


def _bounded_filter(name: str, check: Any) -> Any:
    """Jinja's filter ``name``, with ``check`` run on its arguments first (without the context or
    environment Jinja passes to some filters)."""
    from jinja2.filters import FILTERS

    inner = FILTERS[name]
    skip = 1 if hasattr(inner, "jinja_pass_arg") else 0

    def filter_(*args: Any, **kwargs: Any) -> Any:
        check(*args[skip:], **kwargs)
        return inner(*args, **kwargs)

    filter_.__name__ = inner.__name__
    if skip:
        filter_.jinja_pass_arg = inner.jinja_pass_arg  # type: ignore[attr-defined]
    return filter_


def _width_check(index: int, key: str) -> Any:
    """A padding width argument (``center``, ``wordwrap``) no larger than the output bound."""

    def check(*args: Any, **kwargs: Any) -> None:
        width = kwargs.get(key, args[index] if len(args) > index else None)
        if isinstance(width, int):
            _bound(width, f"a {key} of {width}")

    return check


def _indent_check(s: Any = "", width: Any = 4, *args: Any, **kwargs: Any) -> None:
    """``indent`` adds its width (a count or a string) to every line."""
    text = str(s)
    per_line = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
    _bound(len(text) + per_line * (text.count("\n") + 1), "an indent")


def _replace_check(s: Any = "", old: Any = "", new: Any = "", count: Any = None, *a: Any, **k: Any) -> None:
    text, old, new = str(s), str(old), str(new)
    hits = len(text) + 1 if old == "" else text.count(old)
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    _bound(len(text) + hits * len(new), "a replace")


def _count_check(index: int, what: str) -> Any:
    """``batch`` and ``slice`` make that many items (padding with ``fill_with``)."""

    def check(*args: Any, **kwargs: Any) -> None:
        n = args[index] if len(args) > index else kwargs.get("linecount", kwargs.get("slices"))
        if isinstance(n, int):
            _bound(n, what)

    return check


def _join_check(*args: Any, **kwargs: Any) -> None:
    seq = next((a for a in args if isinstance(a, list | tuple)), None)
    if seq is not None:
        sep = kwargs.get("d", "")
        _bound(sum(_size(x) for x in seq) + _size(sep) * len(seq), "a join")


def _format_check(*args: Any, **kwargs: Any) -> None:
    fmt = next((a for a in args if isinstance(a, str)), "")
    if _PCT_BIG.search(fmt):
        raise _TooBig("a format string with a huge width")


class _Watchdog:
    """Interrupts the current thread with _RenderTimeout once ``seconds`` pass (CPython's async
    exception, checked between bytecodes: a runaway template loop stops, the thread lives on)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.lock = threading.Lock()
        self.fired = self.done = False

    def __enter__(self) -> _Watchdog:
        self.thread_id = threading.get_ident()
        self.timer = threading.Timer(self.seconds, self._fire)
        self.timer.daemon = True
        self.timer.start()
        return self

    def _fire(self) -> None:
        with self.lock:
            if not self.done:
                self.fired = True
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.thread_id),
                                                           ctypes.py_object(_RenderTimeout))

    def __exit__(self, *exc: object) -> None:
        self.timer.cancel()
        with self.lock:
            self.done = True
            if self.fired:  # a pending injection not yet raised must not escape the render
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.thread_id), None)


class _IgnoreGeneration(jinja2.ext.Extension):
    """Transformers' ``{% generation %}...{% endgeneration %}`` marks assistant text; render its body."""

    tags: ClassVar[set[str]] = {"generation"}

    def parse(self, parser: Any) -> Any:
        parser.stream.skip(1)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    if isinstance(indent, int) and indent > 64 or isinstance(indent, str) and len(indent) > 64:
        raise _TooBig("tojson with an indent over 64")
    # transformers' chat-template tojson: no HTML escaping, non-ASCII kept
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _raise_exception(message: str) -> None:
    raise _RaisedByTemplate(message)


def _make_env() -> _StrictSandbox:
    env = _StrictSandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_IgnoreGeneration, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.filters["center"] = _bounded_filter("center", _width_check(1, "width"))
    env.filters["indent"] = _bounded_filter("indent", _indent_check)
    env.filters["wordwrap"] = _bounded_filter("wordwrap", _width_check(1, "width"))
    env.filters["join"] = _bounded_filter("join", _join_check)
    env.filters["replace"] = _bounded_filter("replace", _replace_check)
    env.filters["batch"] = _bounded_filter("batch", _count_check(1, "a batch"))
    env.filters["slice"] = _bounded_filter("slice", _count_check(1, "a slice"))
    env.filters["format"] = _bounded_filter("format", _format_check)
    env.globals.pop("lipsum", None)  # lipsum(n) writes n paragraphs
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _private_name(node: jinja2.nodes.Node) -> str | None:
    """The underscore name a node reaches for, if any (``x.__class__``, ``x['_a']``, ``x|attr('_a')``)."""
    if isinstance(node, jinja2.nodes.Getattr) and node.attr.startswith("_"):
        return node.attr
    if (isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Const)
            and isinstance(node.arg.value, str) and node.arg.value.startswith("_")):
        return node.arg.value
    if isinstance(node, jinja2.nodes.Filter) and node.name == "attr":
        for arg in node.args:
            if isinstance(arg, jinja2.nodes.Const) and isinstance(arg.value, str) and arg.value.startswith("_"):
                return arg.value
    return None


def _compile(env: _StrictSandbox, source: str) -> jinja2.Template:
    try:
        return _compile_checked(env, source)
    except (RecursionError, SyntaxError):  # parsing, checking and code generation all recurse over the
        # nesting, and Python itself compiles at most 20 nested blocks
        raise TemplateError("chat template does not compile: it is nested too deeply") from None


def _compile_checked(env: _StrictSandbox, source: str) -> jinja2.Template:
    try:
        ast = env.parse(source)
    except jinja2.TemplateSyntaxError as e:
        raise TemplateError(_line(f"chat template does not compile (line {e.lineno}): {e.message}")) from None
    for node in ast.find_all((jinja2.nodes.Getattr, jinja2.nodes.Getitem, jinja2.nodes.Filter)):
        name = _private_name(node)
        if name is not None:
            raise TemplateError(
                f"chat template sandbox violation: access to {name!r} (line {node.lineno}) is not allowed"
            )
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:  # pragma: no cover - parse() already succeeded
        raise TemplateError(_line(f"chat template does not compile (line {e.lineno}): {e.message}")) from None


class ChatTemplate:
    """A compiled chat template plus the BOS/EOS texts it is rendered with.

    A template that does not compile, or that reaches for private attributes, does not make the
    constructor fail (a model stays usable without chat); :meth:`render` raises its
    :class:`TemplateError` without running anything, and :attr:`error` says what is wrong.
    """

    def __init__(
        self,
        source: str,
        *,
        bos_token: str = "",
        eos_token: str = "",
        tokenizer: Tokenizer | None = None,
        name: str = "gguf",
        tool_use_source: str | None = None,
    ) -> None:
        self._source = source
        self._name = name
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._tokenizer = tokenizer
        self._env = _make_env()
        self._template: jinja2.Template | None = None
        self._error: TemplateError | None = None
        try:
            self._template = _compile(self._env, source)
        except TemplateError as e:
            self._error = e
        self._tool_use: ChatTemplate | None = None
        if tool_use_source:
            self._tool_use = ChatTemplate(tool_use_source, bos_token=bos_token, eos_token=eos_token,
                                          tokenizer=tokenizer, name=name + ":tool_use")

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any], tokenizer: Tokenizer) -> ChatTemplate:
        """The model's template (or the architecture's fallback) with its BOS/EOS texts.

        BOS/EOS texts are the tokens' pieces with specials rendered, as llama.cpp passes them.
        """

        def piece(tid: int | None) -> str:
            if tid is None:
                return ""
            return tokenizer.token_to_piece(tid, special=True).decode("utf-8", errors="replace")

        source = meta.get("tokenizer.chat_template")
        tool_use = meta.get("tokenizer.chat_template.tool_use")
        name = "gguf"
        if not isinstance(source, str) or not source.strip():
            name, source = fallback_template(str(meta.get("general.architecture", "") or ""))
        return cls(
            source,
            bos_token=piece(tokenizer.bos_id),
            eos_token=piece(tokenizer.eos_id),
            tokenizer=tokenizer,
            name=name,
            tool_use_source=tool_use if isinstance(tool_use, str) and tool_use.strip() else None,
        )

    @property
    def source(self) -> str:
        """The template text."""
        return self._source

    @property
    def name(self) -> str:
        """``"gguf"`` for the file's own template, else the fallback's name (``gemma``, ``chatml``)."""
        return self._name

    @property
    def error(self) -> TemplateError | None:
        """Why the template cannot render (compile error or sandbox violation), or None."""
        return self._error

    def render(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        **extra: Any,
    ) -> str:
        """The prompt string exactly as the template writes it (see the module docstring for BOS)."""
        if tools and self._tool_use is not None:
            return self._tool_use.render(messages, add_generation_prompt, tools, **extra)
        if self._error is not None:
            raise self._error
        assert self._template is not None
        if not isinstance(messages, list):
            raise TemplateError("messages must be a list of {'role': ..., 'content': ...} dicts")
        variables = dict(extra)
        variables.update(
            messages=messages,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
        )
        try:
            return self._render(variables)
        except _TooBig as e:
            raise TemplateError(f"chat template output too large: {e}") from None
        except _RenderTimeout:
            raise TemplateError(f"chat template took longer than {RENDER_SECONDS:g} s to render") from None
        except SecurityError as e:
            raise TemplateError(_line(f"chat template sandbox violation: {e}")) from None
        except _RaisedByTemplate as e:
            raise TemplateError(_line(f"chat template rejected the messages: {e}")) from None
        except TemplateError:
            raise
        except Exception as e:  # noqa: BLE001 - any failure inside a template is one clear error
            raise TemplateError(_line(f"chat template failed to render: {type(e).__name__}: {e}")) from None

    def render_reply(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                     **extra: Any) -> str:
        """The prompt a reply to ``messages`` starts from: ``render`` with the generation prompt, except
        when the last message is the assistant's own text (no tool calls, no thinking asked): then the
        reply continues that text (assistant prefill, as llama.cpp's server does it): the messages before
        it with the generation prompt, then the text, with no end of turn."""
        last = messages[-1] if isinstance(messages, list) and len(messages) > 1 else None
        if (isinstance(last, dict) and last.get("role") == "assistant" and isinstance(last.get("content"), str)
                and last["content"] and not last.get("tool_calls") and not extra.get("enable_thinking")):
            return self.render(messages[:-1], True, tools, **extra) + last["content"]
        return self.render(messages, True, tools, **extra)

    def _render(self, variables: dict[str, Any]) -> str:
        """Render with the output streamed and counted, under the watchdog."""
        assert self._template is not None
        parts: list[str] = []
        n = 0
        with _Watchdog(RENDER_SECONDS):
            for part in self._template.generate(**variables):
                n += len(part)
                _bound(n, "the rendered prompt")
                parts.append(part)
        return "".join(parts)

    def prompt_ids(self, prompt: str) -> list[int]:
        """Token ids to feed for a rendered prompt, with exactly one BOS (llama.cpp server's rule).

        If the model adds BOS itself and the prompt starts with the BOS text, that text is dropped
        (likewise a trailing EOS text when the model adds EOS); then the prompt is tokenized with
        ``add_bos=True, special=True``.
        """
        tok = self._tokenizer
        if tok is None:
            raise TemplateError("this chat template has no tokenizer")
        if tok.add_bos and self.bos_token and prompt.startswith(self.bos_token):
            prompt = prompt[len(self.bos_token):]
        if tok.add_eos and self.eos_token and prompt.endswith(self.eos_token):
            prompt = prompt[: len(prompt) - len(self.eos_token)]
        return tok.encode(prompt, add_bos=True, special=True)

    def encode(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        **extra: Any,
    ) -> list[int]:
        """``prompt_ids(render(...))``: the ids of a conversation, ready for the model."""
        return self.prompt_ids(self.render(messages, add_generation_prompt, tools, **extra))
