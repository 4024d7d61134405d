"""Chat templates: llama.cpp's prompt strings, the built-in fallbacks, and the sandbox.

The SmolLM2 expectations come from llama-cpp-python (``Jinja2ChatFormatter`` and the C
``llama_chat_apply_template``) through ``tests/fixtures/make_tokenizer_fixtures.py``.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from llmedge.errors import TemplateError
from llmedge.gguf import GGUFFile
from llmedge.template import CHATML_TEMPLATE, GEMMA_TEMPLATE, ChatTemplate
from llmedge.tokenizer import Tokenizer

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def chat_fixture() -> dict[str, Any]:
    return json.loads((FIXTURES / "tokenizer_smollm2.json").read_text(encoding="utf-8"))["chat"]


@pytest.fixture(scope="module")
def smollm2(smollm2_path: Path) -> tuple[dict[str, Any], Tokenizer]:
    meta = dict(GGUFFile(smollm2_path).metadata)
    return meta, Tokenizer.from_metadata(meta)


@pytest.fixture(scope="module")
def gemma3(gemma3_path: Path) -> tuple[dict[str, Any], Tokenizer]:
    meta = dict(GGUFFile(gemma3_path).metadata)
    return meta, Tokenizer.from_metadata(meta)


SYSTEM_CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi!"},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "  Bye? "},
]


# ------------------------------------------------------------------------- SmolLM2: the file's template


def test_smollm2_uses_the_template_from_the_file(smollm2: tuple, chat_fixture: dict) -> None:
    meta, tok = smollm2
    ct = ChatTemplate.from_metadata(meta, tok)
    assert ct.name == "gguf" and ct.error is None
    assert ct.source == chat_fixture["template"] == meta["tokenizer.chat_template"]
    assert (ct.bos_token, ct.eos_token) == (chat_fixture["bos_token"], chat_fixture["eos_token"])


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_smollm2_system_conversation_is_llama_cpps_prompt_string(
    smollm2: tuple, chat_fixture: dict, add_generation_prompt: bool
) -> None:
    meta, tok = smollm2
    ct = ChatTemplate.from_metadata(meta, tok)
    conv = chat_fixture["conversations"]["system_multiturn"]
    got = ct.render(conv["messages"], add_generation_prompt=add_generation_prompt)
    agp = int(add_generation_prompt)
    assert got == conv[f"jinja2_add_generation_prompt={agp}"]
    assert got == conv[f"llama_chat_apply_template_add_ass={agp}"]


@pytest.mark.parametrize("name", ["no_system_multiturn", "single_user"])
def test_smollm2_conversation_without_system_gets_the_templates_default(
    smollm2: tuple, chat_fixture: dict, name: str
) -> None:
    # the template itself adds SmolLM's default system prompt (llama.cpp's legacy built-in chatml
    # formatter, llama_chat_apply_template, does not run the template and leaves it out)
    meta, tok = smollm2
    ct = ChatTemplate.from_metadata(meta, tok)
    conv = chat_fixture["conversations"][name]
    for agp in (True, False):
        got = ct.render(conv["messages"], add_generation_prompt=agp)
        assert got == conv[f"jinja2_add_generation_prompt={int(agp)}"]
    assert "You are a helpful AI assistant named SmolLM" in got


def test_smollm2_prompt_ids_are_what_llama_cpp_python_feeds(smollm2: tuple, chat_fixture: dict) -> None:
    meta, tok = smollm2
    ct = ChatTemplate.from_metadata(meta, tok)
    for conv in chat_fixture["conversations"].values():
        ids = ct.encode(conv["messages"])
        assert ids == conv["prompt_ids"]
        assert ids == ct.prompt_ids(ct.render(conv["messages"]))
        assert tok.decode(ids, special=True) == ct.render(conv["messages"])


# ------------------------------------------------------------------------- fallbacks


def test_gemma3_falls_back_to_gemmas_turn_format(gemma3: tuple) -> None:
    meta, tok = gemma3
    assert "tokenizer.chat_template" not in meta
    ct = ChatTemplate.from_metadata(meta, tok)
    assert ct.name == "gemma" and ct.source == GEMMA_TEMPLATE
    assert ct.bos_token == "<bos>"
    assert ct.render(SYSTEM_CHAT) == (
        "<bos><start_of_turn>user\nYou are terse.\n\nHi!<end_of_turn>\n"
        "<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\nBye?<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    assert ct.render(SYSTEM_CHAT[1:2], add_generation_prompt=False) == (
        "<bos><start_of_turn>user\nHi!<end_of_turn>\n"
    )


def test_gemma3_prompt_ids_have_exactly_one_bos_and_single_turn_tokens(gemma3: tuple) -> None:
    meta, tok = gemma3
    ct = ChatTemplate.from_metadata(meta, tok)
    ids = ct.encode(SYSTEM_CHAT)
    assert tok.add_bos
    assert ids[0] == tok.bos_id and ids.count(tok.bos_id) == 1
    assert ids[1] == tok.token_id("<start_of_turn>")
    assert ids.count(tok.token_id("<start_of_turn>")) == 4
    assert ids.count(tok.token_id("<end_of_turn>")) == 3
    assert tok.decode(ids, special=True) == ct.render(SYSTEM_CHAT)
    # the same ids as tokenizing the text without its BOS, with add_bos
    assert ids == tok.encode(ct.render(SYSTEM_CHAT)[len("<bos>"):], add_bos=True, special=True)


def test_gemma_template_rejects_non_alternating_roles(gemma3: tuple) -> None:
    meta, tok = gemma3
    ct = ChatTemplate.from_metadata(meta, tok)
    with pytest.raises(TemplateError, match="must alternate"):
        ct.render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])


def test_files_without_template_fall_back_to_chatml(smollm2: tuple) -> None:
    meta, tok = smollm2
    meta = {k: v for k, v in meta.items() if k != "tokenizer.chat_template"}
    ct = ChatTemplate.from_metadata(meta, tok)
    assert ct.name == "chatml" and ct.source == CHATML_TEMPLATE
    assert ct.render([{"role": "user", "content": "hi"}]) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_tool_use_template_is_used_when_tools_are_given(smollm2: tuple) -> None:
    meta, tok = smollm2
    meta = dict(meta)
    meta["tokenizer.chat_template.tool_use"] = "TOOLS {{ tools|tojson }}"
    ct = ChatTemplate.from_metadata(meta, tok)
    msgs = [{"role": "user", "content": "hi"}]
    assert ct.render(msgs, tools=[{"name": "f"}]) == 'TOOLS [{"name": "f"}]'
    assert ct.render(msgs).startswith("<|im_start|>system")


# ------------------------------------------------------------------------- globals, filters, errors


def test_template_environment_matches_transformers() -> None:
    ct = ChatTemplate(
        "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}{{ m.role }}|{% endfor %}\n"
        "{% generation %}{{ tools|tojson }}{% endgeneration %}|{{ strftime_now('%Y') }}|{{ flag }}"
        "|{{ bos_token }}{{ eos_token }}|{{ add_generation_prompt }}",
        bos_token="<s>", eos_token="</s>",
    )
    msgs = [{"role": r, "content": ""} for r in ("a", "b", "c")]
    out = ct.render(msgs, tools=[{"name": "caf\u00e9 <x>"}], flag="on")
    year = datetime.now().strftime("%Y")
    assert out == f'a|b|[{{"name": "caf\u00e9 <x>"}}]|{year}|on|<s></s>|True'


def test_template_blocks_trim_like_transformers() -> None:
    ct = ChatTemplate("{% for m in messages %}\n    {% if m %}\n{{ m.content }}\n    {% endif %}\n{% endfor %}")
    assert ct.render([{"content": "x"}, {"content": "y"}]) == "x\ny\n"


def test_raise_exception_becomes_a_template_error() -> None:
    ct = ChatTemplate("{{ raise_exception('System role not supported') }}")
    with pytest.raises(TemplateError, match="System role not supported"):
        ct.render([])


def test_syntax_errors_are_reported_when_rendering_not_when_loading() -> None:
    ct = ChatTemplate("{% for m in messages %}{{ m }")
    assert isinstance(ct.error, TemplateError) and "does not compile" in str(ct.error)
    with pytest.raises(TemplateError, match="does not compile"):
        ct.render([])


def test_runtime_errors_are_one_template_error() -> None:
    with pytest.raises(TemplateError, match="failed to render: ZeroDivisionError"):
        ChatTemplate("{{ 1 / 0 }}").render([])
    with pytest.raises(TemplateError, match="messages must be a list"):
        ChatTemplate("x").render("hello")  # type: ignore[arg-type]


# ------------------------------------------------------------------------- sandbox


STATIC_ESCAPES = [
    "{{ probe() }}{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ probe() }}{{ cycler.__init__.__globals__.os.system('echo pwned') }}",
    "{{ probe() }}{{ self._TemplateReference__context.cycler }}",
    "{{ probe() }}{{ joiner.__init__.__globals__ }}",
    "{{ probe() }}{{ lipsum.__globals__['os'] }}",
    "{{ probe() }}{{ ''|attr('__class__') }}",
    "{{ probe() }}{{ messages['__class__'] }}",
    "{% if probe() %}{% endif %}{% for c in ''.__class__.__base__.__subclasses__() %}{{ c }}{% endfor %}",
]


@pytest.mark.parametrize("source", STATIC_ESCAPES)
def test_sandbox_escapes_raise_before_anything_runs(source: str) -> None:
    calls: list[int] = []

    def probe() -> str:
        calls.append(1)
        return ""

    ct = ChatTemplate(source)
    assert ct.error is not None and "sandbox violation" in str(ct.error)
    with pytest.raises(TemplateError, match="sandbox violation"):
        ct.render([{"role": "user", "content": "x"}], probe=probe)
    assert calls == []


DYNAMIC_ESCAPES = [
    "{{ ''|attr(name) }}",
    "{% set n = '__cla' ~ 'ss__' %}{{ (''|attr(n)).__name__ }}",
    "{{ '{0.__class__.__mro__}'.format(1) }}",
    "{{ messages.append(1) }}",
    "{% set x = {} %}{{ x.update({'a': 1}) }}",
]


@pytest.mark.parametrize("source", DYNAMIC_ESCAPES)
def test_sandbox_rejects_escapes_it_can_only_see_while_rendering(source: str) -> None:
    ct = ChatTemplate(source)
    with pytest.raises(TemplateError, match="sandbox violation"):
        ct.render([{"role": "user", "content": "x"}], name="__class__")


def test_render_reply_continues_a_last_assistant_message() -> None:
    t = ChatTemplate(CHATML_TEMPLATE)
    user = [{"role": "user", "content": "hi"}]
    start = t.render(user)
    assert t.render_reply(user) == start
    assert t.render_reply([*user, {"role": "assistant", "content": "Hello, I"}]) == start + "Hello, I"
    # not a prefill: an empty text, a tool call, thinking asked for, or an assistant message alone
    for last, extra in (({"role": "assistant", "content": ""}, {}),
                        ({"role": "assistant", "content": "x", "tool_calls": [{"function": {"name": "f"}}]}, {}),
                        ({"role": "assistant", "content": "x"}, {"enable_thinking": True})):
        assert t.render_reply([*user, last], **extra) == t.render([*user, last], **extra)
    alone = [{"role": "assistant", "content": "x"}]
    assert t.render_reply(alone) == t.render(alone)
