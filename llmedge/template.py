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

import json
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

import jinja2
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


class _StrictSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox, but unsafe attribute access raises instead of rendering ''."""

    def unsafe_undefined(self, obj: Any, attribute: str) -> jinja2.Undefined:
        raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")


class _IgnoreGeneration(jinja2.ext.Extension):
    """Transformers' ``{% generation %}...{% endgeneration %}`` marks assistant text; render its body."""

    tags: ClassVar[set[str]] = {"generation"}

    def parse(self, parser: Any) -> Any:
        parser.stream.skip(1)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
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
        ast = env.parse(source)
    except jinja2.TemplateSyntaxError as e:
        raise TemplateError(f"chat template does not compile (line {e.lineno}): {e.message}") from None
    for node in ast.find_all((jinja2.nodes.Getattr, jinja2.nodes.Getitem, jinja2.nodes.Filter)):
        name = _private_name(node)
        if name is not None:
            raise TemplateError(
                f"chat template sandbox violation: access to {name!r} (line {node.lineno}) is not allowed"
            )
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:  # pragma: no cover - parse() already succeeded
        raise TemplateError(f"chat template does not compile (line {e.lineno}): {e.message}") from None


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
            return self._template.render(**variables)
        except SecurityError as e:
            raise TemplateError(f"chat template sandbox violation: {e}") from None
        except _RaisedByTemplate as e:
            raise TemplateError(f"chat template rejected the messages: {e}") from None
        except TemplateError:
            raise
        except Exception as e:  # noqa: BLE001 - any failure inside a template is one clear error
            raise TemplateError(f"chat template failed to render: {type(e).__name__}: {e}") from None

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
