"""Tool calling and thinking through the official ``ollama`` and ``openai`` clients against a real server
on loopback: tools reach the chat template, tool calls come back parsed (Ollama: arguments as an object;
OpenAI: a JSON string with ``call_`` ids), streamed the way each client reads them; ``required`` and
named calls are grammar-constrained so their arguments validate on SmolLM2; a tool's result continues
the conversation; a template without tools (or without thinking) is refused with Ollama's message."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from test_server_api import MODEL, running_server, store_root  # noqa: F401  (fixture)
from test_server_grammar import SCHEMAS

FIXTURES = Path(__file__).parent / "fixtures"
TOOLS_MODEL = "smollm2-tools:latest"  # SmolLM2's weights under Qwen2.5's tool-calling template
THINK_MODEL = "smollm2-think:latest"  # ... under a DeepSeek-R1-style template that opens <think>
THINK_TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and enable_thinking %}<think>\n{% endif %}{% endif %}")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                   "required": ["city"]}}}
CALL_SCHEMA = {"type": "object", "properties": {"name": {"const": "get_weather"},
                                                "arguments": WEATHER["function"]["parameters"]},
               "required": ["name", "arguments"]}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def url(store_root: Path) -> Iterator[str]:  # noqa: F811
    import ollama

    with running_server(parallel=4, max_queue=32) as base:
        client = ollama.Client(host=base)
        template = (FIXTURES / "templates" / "qwen2.5-tools.jinja").read_text()
        assert client.create(model=TOOLS_MODEL, from_=MODEL, template=template).status == "success"
        assert client.create(model=THINK_MODEL, from_=MODEL, template=THINK_TEMPLATE).status == "success"
        yield base


def oai(url: str) -> Any:
    import openai

    return openai.OpenAI(base_url=url + "/v1", api_key="unused")


def test_ollama_chat_with_tools_returns_tool_calls_with_object_arguments(url: str) -> None:
    import ollama

    client = ollama.Client(host=url)
    r = client.chat(model=TOOLS_MODEL, messages=ASK, tools=[WEATHER], format=CALL_SCHEMA,
                    options={"temperature": 0, "num_predict": 48})
    calls = r.message.tool_calls
    assert calls and calls[0].function.name == "get_weather", r.message
    assert isinstance(calls[0].function.arguments, dict)
    jsonschema.validate(dict(calls[0].function.arguments), WEATHER["function"]["parameters"])
    assert r.message.content == ""


def test_ollama_streams_tool_calls_in_a_chunk(url: str) -> None:
    import ollama

    chunks = list(ollama.Client(host=url).chat(model=TOOLS_MODEL, messages=ASK, tools=[WEATHER],
                                               format=CALL_SCHEMA, stream=True,
                                               options={"temperature": 0, "num_predict": 48}))
    with_calls = [c for c in chunks if c.message.tool_calls]
    assert len(with_calls) == 1 and chunks[-1].done
    assert with_calls[0].message.tool_calls[0].function.name == "get_weather"
    assert "".join(c.message.content for c in chunks) == ""  # the call's JSON is not echoed as text


def test_openai_required_call_on_the_tools_template_parses_with_an_id(url: str) -> None:
    r = oai(url).chat.completions.create(model=TOOLS_MODEL, messages=ASK, tools=[WEATHER], tool_choice="required",
                                         max_tokens=48, temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.id.startswith("call_") and call.type == "function" and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])


def test_openai_streams_tool_call_deltas_index_id_name_then_arguments(url: str) -> None:
    stream = oai(url).chat.completions.create(model=TOOLS_MODEL, messages=ASK, tools=[WEATHER],
                                              tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                              max_tokens=48, temperature=0, stream=True)
    deltas, finish = [], None
    for chunk in stream:
        for c in chunk.choices:
            deltas += c.delta.tool_calls or []
            finish = c.finish_reason or finish
    assert finish == "tool_calls"
    first = deltas[0]
    assert first.index == 0 and first.id.startswith("call_") and first.function.name == "get_weather"
    fragments = [d.function.arguments for d in deltas[1:] if d.index == 0 and d.function.arguments]
    assert len(fragments) >= 2  # the arguments stream as they are generated
    assert all(d.id is None and d.function.name is None for d in deltas[1:])
    jsonschema.validate(json.loads("".join(fragments)), WEATHER["function"]["parameters"])


def test_the_tool_result_sent_back_continues_the_conversation(url: str) -> None:
    import llmedge
    from llmedge.template import ChatTemplate

    client = oai(url)
    first = client.chat.completions.create(model=TOOLS_MODEL, messages=ASK, tools=[WEATHER],
                                           tool_choice="required", max_tokens=48, temperature=0)
    call = first.choices[0].message.tool_calls[0]
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
               {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21, "sky": "clear"}'}]
    second = client.chat.completions.create(model=TOOLS_MODEL, messages=history, tools=[WEATHER],
                                            max_tokens=16, temperature=0)
    assert second.choices[0].message.content and second.choices[0].finish_reason in ("stop", "length")
    # the prompt the server fed is the template's rendering of the call and its result
    m = llmedge.load(MODEL, backend="numpy", n_ctx=512)
    t = ChatTemplate((FIXTURES / "templates" / "qwen2.5-tools.jinja").read_text(), tokenizer=m.tokenizer)
    msgs = [*ASK, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": call.function.name,
                                          "arguments": json.loads(call.function.arguments)}}]},
            {"role": "tool", "content": '{"temperature": 21, "sky": "clear"}'}]
    text = t.render(msgs, True, [WEATHER])
    assert "<tool_response>" in text and '"sky": "clear"' in text
    assert second.usage.prompt_tokens == len(t.prompt_ids(text))


def test_a_required_call_validates_on_smollm2_for_twenty_tool_schemas(url: str) -> None:
    objects = [s for s in SCHEMAS if s.get("type") == "object"]
    objects += [{"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 5},
                                                  "unit": {"enum": ["cm", "m"]}}, "required": ["n", "unit"]},
                {"type": "object", "properties": {"flag": {"type": "boolean"}, "note": {"type": "string",
                                                                                       "maxLength": 10}},
                 "required": ["flag"]}]
    assert len(objects) == 20
    client = oai(url)

    def call(i: int) -> None:
        tool = {"type": "function", "function": {"name": f"tool_{i}", "description": "Do it.",
                                                 "parameters": objects[i]}}
        choice = "required" if i % 2 else {"type": "function", "function": {"name": f"tool_{i}"}}
        r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Call the tool."}],
                                           tools=[tool, WEATHER] if i % 2 == 0 else [tool], tool_choice=choice,
                                           max_tokens=96, temperature=0.7, seed=i)
        calls = r.choices[0].message.tool_calls
        assert calls and calls[0].function.name == f"tool_{i}", (i, r.choices[0])
        jsonschema.validate(json.loads(calls[0].function.arguments), objects[i])

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(call, range(20)))


def test_tools_on_a_template_without_tools_are_refused_with_ollamas_message(url: str) -> None:
    import ollama
    import openai

    with pytest.raises(ollama.ResponseError) as e:
        ollama.Client(host=url).chat(model=MODEL, messages=ASK, tools=[WEATHER])
    assert e.value.status_code == 400 and e.value.error == f"{MODEL} does not support tools"
    with pytest.raises(openai.BadRequestError) as e2:
        oai(url).chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], max_tokens=4)
    assert "does not support tools" in str(e2.value)
    r = oai(url).chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="none",
                                         max_tokens=4)
    assert r.choices[0].message.tool_calls is None  # tool_choice none: plain text


def test_tool_choice_none_offers_no_tools_to_the_model(url: str) -> None:
    """tool_choice none: the prompt is the one without tools (no tools in the template, no system message
    describing them), on a template with tools and one without; it used to carry the tools' system text."""
    for model in (MODEL, TOOLS_MODEL):
        plain = oai(url).chat.completions.create(model=model, messages=ASK, max_tokens=1)
        none = oai(url).chat.completions.create(model=model, messages=ASK, tools=[WEATHER], tool_choice="none",
                                                max_tokens=1)
        assert none.usage.prompt_tokens == plain.usage.prompt_tokens, model
    offered = oai(url).chat.completions.create(model=TOOLS_MODEL, messages=ASK, tools=[WEATHER], max_tokens=1)
    assert offered.usage.prompt_tokens > plain.usage.prompt_tokens  # tools offered do show in the prompt


def test_think_splits_reasoning_from_content_and_refuses_models_without_it(url: str) -> None:
    import ollama
    import openai

    client = ollama.Client(host=url)
    r = client.chat(model=THINK_MODEL, messages=ASK, think=True, options={"temperature": 0, "num_predict": 12})
    assert r.message.thinking and "<think>" not in r.message.thinking
    plain = client.chat(model=THINK_MODEL, messages=ASK, think=False, options={"temperature": 0, "num_predict": 12})
    assert plain.message.content and not plain.message.thinking
    parts = list(client.chat(model=THINK_MODEL, messages=ASK, think=True, stream=True,
                             options={"temperature": 0, "num_predict": 12}))
    assert "".join(p.message.thinking or "" for p in parts) == r.message.thinking
    g = client.generate(model=THINK_MODEL, prompt="Why is the sky blue?", think="high",
                        options={"temperature": 0, "num_predict": 6})
    assert g.thinking
    o = oai(url).chat.completions.create(model=THINK_MODEL, messages=ASK, max_tokens=12, temperature=0,
                                         extra_body={"think": True})
    assert o.choices[0].message.model_extra.get("reasoning_content") == r.message.thinking
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model=MODEL, messages=ASK, think=True)
    assert e.value.status_code == 400 and e.value.error == f'"{MODEL}" does not support thinking'
    with pytest.raises(openai.BadRequestError):
        oai(url).chat.completions.create(model=MODEL, messages=ASK, max_tokens=4, reasoning_effort="low")


def test_show_lists_tools_and_thinking_when_the_template_has_them(url: str) -> None:
    import ollama

    client = ollama.Client(host=url)
    assert client.show(TOOLS_MODEL).capabilities == ["completion", "tools"]
    assert client.show(THINK_MODEL).capabilities == ["completion", "thinking"]
    assert client.show(MODEL).capabilities == ["completion"]
