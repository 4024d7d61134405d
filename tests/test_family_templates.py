"""Each family's typical chat template renders through llmedge.template exactly as Hugging Face's
Jinja2 setup renders it (the oracle here: a plain Jinja2 environment with transformers' options,
filters and globals), and as llama.cpp's tests expect where they cover the template.

The templates are data (tests/family_templates.py, sources noted there): Qwen 2.5's ChatML with its
default system prompt and tools, Llama 3 and 3.2 (dates, tools in the first user turn), Phi-3-mini,
Phi-4, Gemma, Gemma 3 (system folded into the first turn, content parts) and Granite 3.0.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import family_templates as ft
import jinja2
import jinja2.ext
import pytest

from llmedge.errors import TemplateError
from llmedge.template import ChatTemplate

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather – «now»",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City, e.g. 東京"}},
                   "required": ["city"]}}}]

CONVERSATIONS: dict[str, list[dict[str, Any]]] = {
    "system_first": ft.LLAMACPP_CONVERSATION,
    "no_system": [{"role": "user", "content": "Hi!\nTwo lines  "}, {"role": "assistant", "content": " Hello."},
                  {"role": "user", "content": "Ünïcödé 東京 \"quotes\" {{ not a tag }}"}],
    "one_user": [{"role": "user", "content": "2 + 2 = ?"}],
}
TOOL_TURNS = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "content": "{\"temp\": 21}"},
    {"role": "tool", "content": "{\"wind\": 3}"},
]


DATE = {"date_string": "02 Dec 2026"}  # Llama 3.2's date (other templates ignore it): no midnight race


class _Raised(Exception):
    pass


def _oracle(source: str, bos: str, eos: str, messages: list, add_generation_prompt: bool,
            tools: list | None = None, **extra: Any) -> str:
    """transformers' chat-template rendering: trim_blocks, lstrip_blocks, loopcontrols, its tojson
    (non-ASCII kept, no HTML escaping), raise_exception and strftime_now."""
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(message: str) -> None:
        raise _Raised(message)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    variables: dict[str, Any] = {**extra, "messages": messages, "bos_token": bos, "eos_token": eos,
                                 "add_generation_prompt": add_generation_prompt}
    if tools is not None:
        variables["tools"] = tools
    return env.from_string(source).render(**variables)


def _cases() -> list[tuple[str, str, bool]]:
    return [(fam, conv, gen) for fam in ft.TEMPLATES for conv in CONVERSATIONS for gen in (True, False)]


@pytest.mark.parametrize(("family", "conversation", "generation_prompt"), _cases())
def test_family_template_renders_as_transformers_does(family: str, conversation: str,
                                                      generation_prompt: bool) -> None:
    source, (bos, eos) = ft.TEMPLATES[family], ft.SPECIAL_TEXTS[family]
    messages = CONVERSATIONS[conversation]
    tmpl = ChatTemplate(source, bos_token=bos, eos_token=eos)
    try:
        want = _oracle(source, bos, eos, messages, generation_prompt, **DATE)
    except _Raised as e:  # Gemma refuses a system turn: so must llmedge, with the template's words
        with pytest.raises(TemplateError, match=str(e)):
            tmpl.render(messages, add_generation_prompt=generation_prompt, **DATE)
        return
    assert tmpl.render(messages, add_generation_prompt=generation_prompt, **DATE) == want


def test_qwen25_adds_its_default_system_prompt_without_tools() -> None:
    out = ChatTemplate(ft.QWEN25, eos_token="<|im_end|>").render(CONVERSATIONS["one_user"])
    assert out == ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
                   "<|im_end|>\n<|im_start|>user\n2 + 2 = ?<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("family", ["qwen2", "llama-3.2", "granite"])
def test_family_template_with_tools_renders_as_transformers_does(family: str) -> None:
    source, (bos, eos) = ft.TEMPLATES[family], ft.SPECIAL_TEXTS[family]
    turns = TOOL_TURNS[:3] if family == "llama-3.2" else TOOL_TURNS if family == "qwen2" else [TOOL_TURNS[0]]
    for messages in (turns, [{"role": "system", "content": "Be brief."}, *turns]):
        want = _oracle(source, bos, eos, messages, True, TOOLS, **DATE)
        got = ChatTemplate(source, bos_token=bos, eos_token=eos).render(messages, tools=TOOLS, **DATE)
        assert got == want
        assert "東京" in got and "«now»" in got  # transformers' tojson keeps non-ASCII


@pytest.mark.parametrize("family", sorted(ft.LLAMACPP_OUTPUTS))
def test_family_template_renders_as_llamacpp_expects(family: str) -> None:
    got = ChatTemplate(ft.TEMPLATES[family]).render(ft.LLAMACPP_CONVERSATION, add_generation_prompt=True)
    assert got == ft.LLAMACPP_OUTPUTS[family]


def test_llama32_dates_its_system_turn_with_strftime_now() -> None:
    tmpl = ChatTemplate(ft.LLAMA32, bos_token="<|begin_of_text|>")
    for _ in range(3):  # the date may change between the two calls, at midnight: take a stable pair
        before = datetime.now().strftime("%d %b %Y")
        out = tmpl.render(CONVERSATIONS["one_user"])
        if datetime.now().strftime("%d %b %Y") == before:
            break
    assert out.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: "
                          f"December 2023\nToday Date: {before}\n\n<|eot_id|>")


def test_gemma3_folds_the_system_turn_and_reads_content_parts() -> None:
    messages = [{"role": "system", "content": [{"type": "text", "text": " Be terse. "}]},
                {"role": "user", "content": [{"type": "text", "text": "Look:"}, {"type": "image"},
                                             {"type": "text", "text": " what is it? "}]}]
    want = _oracle(ft.GEMMA3, "<bos>", "<eos>", messages, True)
    assert ChatTemplate(ft.GEMMA3, bos_token="<bos>", eos_token="<eos>").render(messages) == want
    assert want == ("<bos><start_of_turn>user\n Be terse. \n\nLook:<start_of_image>what is it?<end_of_turn>\n"
                    "<start_of_turn>model\n")
