"""The tool-call and reasoning parsers on outputs in each family's format (tests/fixtures/
tool_call_outputs.json, with the source of each format): the whole output and the same text streamed in
pieces of any size give the same content and calls."""

from __future__ import annotations

from typing import Any

import pytest

from conftest import load_fixture
from llmedge.server.generation import OutputParser
from llmedge.server.tools import ToolCallStream, call_schema, normalize_tools, parse_tool_calls

FIX = load_fixture("tool_call_outputs.json")
NAMES = set(FIX["tools"])


def _calls(calls: list[Any]) -> list[list[Any]]:
    return [[c.name, c.arguments] for c in calls]


def _streamed(text: str, size: int) -> tuple[str, list[list[Any]]]:
    s = ToolCallStream(NAMES)
    content, calls = "", []
    for i in range(0, len(text), size):
        c, k = s.feed(text[i:i + size])
        content, calls = content + c, calls + k
    c, k = s.finish()
    return content + c, _calls(calls + k)


@pytest.mark.parametrize("case", FIX["cases"], ids=[c["family"] for c in FIX["cases"]])
def test_each_familys_tool_call_format_parses_whole_and_streamed(case: dict[str, Any]) -> None:
    content, calls = parse_tool_calls(case["output"], NAMES)
    assert _calls(calls) == case["calls"] and content.strip() == case["content"].strip()
    for size in (1, 2, 5, 64):
        got_content, got_calls = _streamed(case["output"], size)
        assert got_calls == case["calls"], size
        assert got_content.strip() == case["content"].strip(), size


def test_text_before_a_call_streams_before_the_call_is_complete() -> None:
    s = ToolCallStream(NAMES)
    assert s.feed("Checking the weather now. <tool") == ("Checking the weather now. ", [])
    assert s.feed("_call>{\"name\": \"get_weather\", ") == ("", [])
    content, calls = s.feed("\"arguments\": {\"city\": \"Oslo\"}}</tool_call>")
    assert content == "" and _calls(calls) == [["get_weather", {"city": "Oslo"}]]


@pytest.mark.parametrize("case", FIX["thinking"], ids=[c["family"] for c in FIX["thinking"]])
def test_reasoning_is_split_from_content_whole_and_streamed(case: dict[str, Any]) -> None:
    for size in (1, 3, 1000):
        p = OutputParser(True, case["prompt_opens"], None)
        thinking = content = ""
        text = case["output"]
        for i in range(0, len(text), size):
            d = p.feed(text[i:i + size])
            thinking, content = thinking + d.thinking, content + d.content
        d = p.finish()
        assert (thinking + d.thinking, content + d.content) == (case["thinking"], case["content"]), size


def test_thinking_then_a_tool_call() -> None:
    tools = ToolCallStream(NAMES)
    p = OutputParser(True, False, tools)
    d = p.feed("<think>need weather</think>\n<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}"
               "</tool_call>")
    d.merge(p.finish())
    assert d.thinking == "need weather" and _calls(d.tool_calls) == [["get_weather", {"city": "Rome"}]]


def test_parallel_tool_calls_false_keeps_the_first_call() -> None:
    p = OutputParser(False, False, ToolCallStream(NAMES), parallel=False)
    d = p.feed(FIX["cases"][0]["output"])
    d.merge(p.finish())
    assert [c.name for c in d.tool_calls] == ["get_current_temperature"]


def test_both_tool_shapes_normalize_and_a_named_choice_builds_its_schema() -> None:
    tools = normalize_tools([{"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}},
                             {"name": "b"}])
    assert tools is not None and [t["function"]["name"] for t in tools] == ["a", "b"]
    assert call_schema(tools, "b")["properties"]["name"] == {"const": "b"}
    assert len(call_schema(tools)["anyOf"]) == 2


def test_an_ollama_go_template_sees_the_requests_think_and_level() -> None:
    from llmedge.gotemplate import GoChatTemplate
    from llmedge.reasoning import supports_thinking, template_variables

    t = GoChatTemplate("{{ range .Messages }}{{ .Content }}{{ end }}{{ if .IsThinkSet }}[set]{{ end }}"
                       "{{ if .Think }}<think>{{ .ThinkLevel }}{{ end }}")
    chat = [{"role": "user", "content": "hi"}]
    assert supports_thinking(t)
    assert t.render(chat) == "hi"
    assert t.render(chat, True, None, **template_variables("high")) == "hi[set]<think>high"
    assert t.render(chat, True, None, **template_variables(False)) == "hi[set]"


def test_only_text_that_may_be_a_bare_call_is_held_back() -> None:
    for held in ('{"name": "get_we', '[{"na', "```js", "```tool_code\nget_", "  {", '{"function"'):
        assert ToolCallStream(NAMES).feed(held) == ("", []), held
    for streamed in ("```python\nprint(1)", "{x}", "[1, 2]", '{"answer": 4', "Sure: {"):
        assert ToolCallStream(NAMES).feed(streamed)[0] == streamed, streamed


def test_a_forced_call_streams_its_arguments_as_they_are_generated() -> None:
    s = ToolCallStream(NAMES, constrained=True)
    text = '{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}'
    for i in range(0, len(text), 3):
        s.feed(text[i:i + 3])
    _, calls = s.finish()
    frags = s.take_fragments()
    assert frags[0][1] == "get_weather" and all(f[1] is None for f in frags[1:])
    assert {f[0] for f in frags} == {calls[0].id} and calls[0].id.startswith("call_")
    assert "".join(f[2] for f in frags) == '{"city": "Paris", "days": [1, 2]}'
    assert calls[0].arguments == {"city": "Paris", "days": [1, 2]}
