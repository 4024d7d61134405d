"""Ollama's Go chat templates rendered by llmedge.gotemplate: Ollama's own templates and expected
prompts (tests/fixtures/ollama_templates, see its NOTICE.md), its legacy .Prompt/.Response cases, Go
text/template semantics checked by hand, the bounds, and the fallback to the GGUF's Jinja template."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmedge.gotemplate import GoTemplateError, execute, parse, render_chat

FIXTURES = Path(__file__).parent / "fixtures" / "ollama_templates"
GREETING = {"role": "user", "content": "Hello, how are you?"}
CONVERSATIONS = {
    "user": [GREETING],
    "user-assistant-user": [GREETING, {"role": "assistant", "content": "I'm doing great. How can I help you today?"},
                            {"role": "user", "content": "I'd like to show off how chat templating works!"}],
}
CONVERSATIONS["system-user-assistant-user"] = [{"role": "system", "content": "You are a helpful assistant."},
                                               *CONVERSATIONS["user-assistant-user"]]
# Ollama's test strips one trailing space from these templates' output before comparing
TRAILING_SPACE = {"chatqa.gotmpl", "llama2-chat.gotmpl", "mistral-instruct.gotmpl", "openchat.gotmpl",
                  "vicuna.gotmpl"}
TEMPLATES = sorted(p.name for p in FIXTURES.glob("*.gotmpl"))


def test_the_fixtures_hold_ollamas_templates() -> None:
    assert len(TEMPLATES) >= 20 and "gemma3-instruct.gotmpl" in TEMPLATES


@pytest.mark.parametrize("name", TEMPLATES)
def test_ollamas_templates_render_ollamas_expected_prompts(name: str) -> None:
    template = parse((FIXTURES / name).read_text())
    for conversation, messages in CONVERSATIONS.items():
        out = render_chat(template, messages)
        if name in TRAILING_SPACE and out.endswith(" "):
            out = out[:-1]
        assert out == (FIXTURES / "expected" / name / conversation).read_text(), (name, conversation)


MISTRAL_CHAT = [{"role": "user", "content": "Hello friend!"}, {"role": "assistant", "content": "Hello human!"},
                {"role": "user", "content": "What is your name?"}]


@pytest.mark.parametrize("source", [
    "[INST] {{ if .System }}{{ .System }}\n\n{{ end }}{{ .Prompt }}[/INST] ",
    "[INST] {{ if .System }}{{ .System }}\n\n{{ end }}{{ .Prompt }}[/INST] {{ .Response }}",
    "[INST] {{ if .System }}{{ .System }}\n\n{{ end }}\n{{- range .Messages }}\n{{- if eq .Role \"user\" }}"
    "{{ .Content }}[/INST] {{ else if eq .Role \"assistant\" }}{{ .Content }}[INST] {{ end }}\n{{- end }}",
])
def test_legacy_prompt_response_templates_render_per_turn_like_ollama(source: str) -> None:
    t = parse(source)  # Ollama's TestExecuteWithMessages "mistral" and "mistral system"
    assert render_chat(t, MISTRAL_CHAT) == "[INST] Hello friend![/INST] Hello human![INST] What is your name?[/INST] "
    system = [{"role": "system", "content": "You are a helpful assistant!"}, *MISTRAL_CHAT]
    assert render_chat(t, system) == ("[INST] You are a helpful assistant!\n\nHello friend![/INST] Hello human!"
                                      "[INST] What is your name?[/INST] ")


def test_the_last_legacy_turn_is_cut_after_the_response() -> None:
    t = parse("{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}{{ if .Prompt }}<|im_start|>"
              "user\n{{ .Prompt }}<|im_end|>\n{{ end }}<|im_start|>assistant\n{{ .Response }}<|im_end|>\n")
    out = render_chat(t, [{"role": "system", "content": "S"}, *MISTRAL_CHAT])
    assert out == ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHello friend!<|im_end|>\n<|im_start|>"
                   "assistant\nHello human!<|im_end|>\n<|im_start|>user\nWhat is your name?<|im_end|>\n"
                   "<|im_start|>assistant\n")
    partial = render_chat(parse("[INST] {{ .Prompt }}[/INST] {{ .Response }}"),
                          [*MISTRAL_CHAT, {"role": "assistant", "content": "My name is Ollama and I"}])
    assert partial == "[INST] Hello friend![/INST] Hello human![INST] What is your name?[/INST] My name is Ollama and I"


def run(source: str, data: object) -> str:
    return execute(parse(source, ollama=False), data)


def test_trimming_comments_and_variables_follow_go() -> None:
    assert run("a  {{- /* note */ -}}  b {{- 1 }} {{ 2 -}}\n c", {}) == "ab1 2c"
    assert run("{{ $x := 1 }}{{ if true }}{{ $x = 2 }}{{ $y := 3 }}{{ end }}{{ $x }}", {}) == "2"
    with pytest.raises(GoTemplateError, match="undefined variable"):
        run("{{ if true }}{{ $y := 3 }}{{ end }}{{ $y }}", {})
    data = {"Messages": [{"Role": "a"}, {"Role": "b"}, {"Role": "c"}], "System": "S"}
    assert run("{{ range $i, $m := .Messages }}{{ $i }}{{ $m.Role }}{{ $.System }}{{ end }}", data) == "0aS1bS2cS"
    assert run("{{ range .Messages }}{{ if eq .Role \"b\" }}{{ break }}{{ end }}{{ .Role }}{{ end }}", data) == "a"
    assert run("{{ range .Messages }}{{ if eq .Role \"b\" }}{{ continue }}{{ end }}{{ .Role }}{{ end }}", data) == "ac"
    assert run("{{ range .Nothing }}x{{ else }}empty{{ end }}", data) == "empty"
    assert run("{{ with .System }}[{{ . }}]{{ end }}{{ with .Nope }}x{{ else with .System }}<{{ . }}>{{ end }}",
               data) == "[S]<S>"
    assert run("{{ if eq .System \"x\" }}1{{ else if eq .System \"y\" \"S\" }}2{{ else }}3{{ end }}", data) == "2"


def test_functions_follow_go() -> None:
    data = {"M": [1, 2, 3], "S": "héllo", "E": "", "Args": {"b": "<&>", "a": 1}}
    assert run("{{ len .S }} {{ len .M }} {{ len (slice .M 1) }} {{ index .M 2 }} {{ slice .S 0 1 }}", data) == \
        "6 3 2 3 h"
    assert run("{{ and 1 .E 2 }}|{{ or .E 0 \"z\" }}|{{ not .E }}|{{ and 1 2 }}", data) == "|z|true|2"
    assert run("{{ json .Args }} {{ .Args }}", data) == '{"a":1,"b":"\\u003c\\u0026\\u003e"} map[a:1 b:<&>]'
    assert run('{{ printf "%s-%d-%v%%" "a" 2 true }} {{ print 1 2 "x" 3 }} {{ .S | len }}', data) == \
        "a-2-true% 1 2x3 6"
    assert run("{{ lt 1 2 }} {{ ge 2.5 3.0 }} {{ ne \"a\" \"b\" }} {{ .Missing }}", data) == \
        "true false true <no value>"
    assert run('{{ $last := eq (len (slice .M 2)) 1 }}{{ $last }}', data) == "true"


@pytest.mark.parametrize("source", [
    "{{ range .Messages }}", "{{ end }}", "{{ .Content }", "{{ template \"x\" }}", "{{ define \"x\" }}{{ end }}",
    "{{ exec \"ls\" }}", "{{ call .F }}", "{{ break }}", "{{ if }}{{ end }}", "{{ (1 }}",
    "{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}", "{{ if 1 }}" * 3000 + "{{ end }}" * 3000,
])
def test_templates_outside_the_subset_do_not_parse(source: str) -> None:
    with pytest.raises(GoTemplateError):
        parse(source)


def test_a_render_is_bounded_and_reaches_no_python() -> None:
    with pytest.raises(GoTemplateError, match="steps"):
        run("{{ range 100000 }}{{ range 100000 }}x{{ end }}{{ end }}", {})
    with pytest.raises(GoTemplateError, match="output"):
        run("{{ range 100000 }}" + "x" * 1000 + "{{ end }}", {})
    with pytest.raises(GoTemplateError, match="exceeds"):
        run('{{ $s := "ab" }}{{ range 200 }}{{ $s = printf "%s%s" $s $s }}{{ end }}{{ len $s }}', {})
    assert run("{{ .__class__ }}{{ .Messages.__len__ }}", {"Messages": {}}) == "<no value><no value>"
    with pytest.raises(GoTemplateError, match="can't evaluate field"):
        render_chat(parse("{{ range .Messages }}{{ .__class__ }}{{ end }}"), [GREETING])
    for source in ('{{ eq 1 "1" }}', "{{ lt 1 2.5 }}", "{{ eq .M 1 }}"):
        with pytest.raises(GoTemplateError, match="incompatible"):
            run(source, {"M": [1]})


TOOL_TEMPLATE = """{{- if .Tools }}Tools: {{ range .Tools }}{{ json . }}
{{ end }}{{ end }}
{{- range .Messages }}
{{- if .ToolCalls }}{{ range .ToolCalls }}{"name": "{{ .Function.Name }}", "parameters": {{ .Function.Arguments }}}{{ end }}
{{- else }}{{ .Role }}: {{ .Content }}
{{ end }}{{ end }}"""


def test_tools_and_tool_calls_print_as_ollamas_json() -> None:
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather <now>",
        "parameters": {"type": "object", "required": ["city"], "properties": {
            "unit": {"type": "string", "enum": ["c", "f"]}, "city": {"type": "string", "description": "City"}}}}}]
    messages = [{"role": "user", "content": "weather in Paris?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"function": {"name": "get_weather", "arguments": {"unit": "c", "city": "Paris"}}}]},
                {"role": "tool", "content": "18"}]
    out = render_chat(parse(TOOL_TEMPLATE), messages, tools)
    assert out == ('Tools: {"type":"function","function":{"name":"get_weather","description":"Weather \\u003cnow'
                   '\\u003e","parameters":{"type":"object","required":["city"],"properties":{"city":{"type":"string",'
                   '"description":"City"},"unit":{"type":"string","enum":["c","f"]}}}}}\nuser: weather in Paris?\n'
                   '{"name": "get_weather", "parameters": {"city":"Paris","unit":"c"}}tool: 18\n')
    assert render_chat(parse(TOOL_TEMPLATE), messages[:1]) == "user: weather in Paris?\n"


# gemma3-instruct.gotmpl ends with a newline after its last action, which Ollama's output keeps
@pytest.mark.parametrize(("model", "template", "extra"), [("smollm2", "chatml.gotmpl", ""),
                                                          ("gemma3", "gemma3-instruct.gotmpl", "\n")])
def test_ollamas_template_for_a_real_model_gives_the_ggufs_prompt_ids(model_paths: dict[str, Path], model: str,
                                                                      template: str, extra: str) -> None:
    from types import SimpleNamespace

    from llmedge.defaults import template_choice
    from llmedge.gguf import GGUFFile
    from llmedge.template import ChatTemplate
    from llmedge.tokenizer import Tokenizer

    meta = GGUFFile(model_paths[model]).metadata
    tok = Tokenizer.from_metadata(meta)
    gguf = ChatTemplate.from_metadata(meta, tok)
    go, origin = template_choice({"template": (FIXTURES / template).read_text()},
                                 SimpleNamespace(template=gguf, tokenizer=tok))
    assert origin.startswith("modelfile (the model's Go template")
    chat = CONVERSATIONS["system-user-assistant-user"]
    assert go.render(chat) == (FIXTURES / "expected" / template / "system-user-assistant-user").read_text()
    assert go.encode(chat) == gguf.prompt_ids(gguf.render(chat) + extra)
