"""A model's defaults (SYSTEM, PARAMETER, MESSAGE, TEMPLATE from its Modelfile) applied by `llmedge
serve`, checked with the official `ollama` and `openai` clients over real HTTP on loopback: the prompt
the engine evaluates is compared token for token with the chat Ollama would template, and request
options and a request `system` override the model's."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from test_server_api import running_server
from tiny_gguf import write_tiny_llama

from llmedge.api import Model

SYSTEM = "You are terse."
HISTORY = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "the sky is blue"}]
GO_TEMPLATE = ("{{- range .Messages }}<|{{ .Role }}|>{{ .Content }}\n{{ end }}"
               "{{- if .System }}[sys:{{ len .System }}]{{ end }}<|assistant|>")


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    import ollama

    root = tmp_path_factory.mktemp("defaults")
    gguf = write_tiny_llama(root / "tiny.gguf", seed=5)
    saved = {k: os.environ.get(k) for k in ("LLMEDGE_MODELS", "OLLAMA_MODELS")}
    os.environ["LLMEDGE_MODELS"] = str(root / "store")
    os.environ["OLLAMA_MODELS"] = str(root / "ollama")
    try:
        with running_server(parallel=1, max_queue=4) as url:
            client = ollama.Client(host=url)
            digest = client.create_blob(gguf)
            done = client.create(model="terse", files={"tiny.gguf": digest}, system=SYSTEM, messages=HISTORY,
                                 parameters={"temperature": 0, "num_predict": 3, "stop": ["###"]})
            assert done.status == "success"
            done = client.create(model="gotmpl", from_="terse", template=GO_TEMPLATE)
            assert done.status == "success"
            yield {"url": url, "client": client, "local": Model(gguf, backend="numpy", n_ctx=256)}
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def expected_ids(local: Model, messages: list[dict[str, str]]) -> list[int]:
    return local.template.encode(messages)


def test_generate_templates_the_system_and_history_and_caps_at_num_predict(env: dict[str, Any]) -> None:
    r = env["client"].generate(model="terse", prompt="why?")
    want = expected_ids(env["local"], [{"role": "system", "content": SYSTEM}, *HISTORY,
                                       {"role": "user", "content": "why?"}])
    assert r.prompt_eval_count == len(want) and r.context[:len(want)] == want
    assert 1 <= r.eval_count <= 3  # PARAMETER num_predict 3
    again = env["client"].generate(model="terse", prompt="why?")
    assert again.response == r.response  # PARAMETER temperature 0: greedy


def test_request_system_and_options_override_the_models(env: dict[str, Any]) -> None:
    r = env["client"].generate(model="terse", prompt="why?", system="Be loud.", options={"num_predict": 1})
    want = expected_ids(env["local"], [{"role": "system", "content": "Be loud."}, *HISTORY,
                                       {"role": "user", "content": "why?"}])
    assert r.context[:len(want)] == want and len(r.context) == len(want) + r.eval_count
    assert r.eval_count == 1


def fresh(client: Any, name: str) -> str:
    """A copy of `terse` under a new name: loaded anew, so no cached prefix hides prompt tokens."""
    assert client.create(model=name, from_="terse").status == "success"
    return name


def test_chat_prepends_history_and_system_like_ollama(env: dict[str, Any]) -> None:
    client = env["client"]
    r = client.chat(model=fresh(client, "chat1"), messages=[{"role": "user", "content": "and?"}])
    want = expected_ids(env["local"], [{"role": "system", "content": SYSTEM}, *HISTORY,
                                       {"role": "user", "content": "and?"}])
    assert r.prompt_eval_count == len(want) and 1 <= r.eval_count <= 3
    own = [{"role": "system", "content": "Mine."}, {"role": "user", "content": "and?"}]
    r = client.chat(model=fresh(client, "chat2"), messages=own)  # Ollama: MESSAGEs, then the own system
    assert r.prompt_eval_count == len(expected_ids(env["local"], [*HISTORY, *own]))


def test_openai_chat_applies_the_defaults_and_max_tokens_overrides(env: dict[str, Any]) -> None:
    import openai

    client = openai.OpenAI(base_url=env["url"] + "/v1", api_key="unused")
    messages = [{"role": "user", "content": "and?"}]
    r = client.chat.completions.create(model="terse", messages=messages)
    want = expected_ids(env["local"], [{"role": "system", "content": SYSTEM}, *HISTORY, *messages])
    assert r.usage.prompt_tokens == len(want) and 1 <= r.usage.completion_tokens <= 3
    r = client.chat.completions.create(model="terse", messages=messages, max_tokens=1)
    assert r.usage.completion_tokens == 1


def test_a_go_template_is_rendered_by_the_server(env: dict[str, Any]) -> None:
    r = env["client"].generate(model="gotmpl", prompt="why?")
    assert r.eval_count <= 3  # the PARAMETERs of `terse` came along with `FROM terse`
    text = (f"<|system|>{SYSTEM}\n<|user|>hi\n<|assistant|>the sky is blue\n<|user|>why?\n"
            f"[sys:{len(SYSTEM)}]<|assistant|>")
    want = env["local"].tokenize(text, add_bos=True, special=True)
    assert r.context[:len(want)] == want and r.prompt_eval_count == len(want)
    shown = env["client"].show("gotmpl")
    assert shown.template == GO_TEMPLATE


def test_a_template_that_does_not_parse_is_refused_and_one_llmedge_cannot_run_falls_back(
        env: dict[str, Any]) -> None:
    import ollama

    with pytest.raises(ollama.ResponseError) as err:
        env["client"].create(model="badtmpl", from_="terse", template="{{ range .Messages }}{{ .Content }")
    assert err.value.status_code == 400 and err.value.error.startswith("template: go template: "), err.value.error
    # Go runs {{template}}, llmedge does not: created, and chats use the GGUF's template
    bad = env["client"].create(model="badtmpl", from_="terse",
                               template='{{ template "t" . }}{{ range .Messages }}{{ .Content }}{{ end }}')
    assert bad.status == "success"
    r = env["client"].generate(model="badtmpl", prompt="why?")  # falls back to the GGUF's template
    want = expected_ids(env["local"], [{"role": "system", "content": SYSTEM}, *HISTORY,
                                       {"role": "user", "content": "why?"}])
    assert r.context[:len(want)] == want


def test_a_model_re_created_under_its_name_serves_its_new_defaults(env: dict[str, Any]) -> None:
    client = env["client"]
    fresh(client, "again")
    before = client.generate(model="again", prompt="why?")
    assert before.eval_count <= 3
    assert client.create(model="again", from_="terse", system="Now loud.", parameters={"num_predict": 1}).status == \
        "success"
    after = client.generate(model="again", prompt="why?")
    want = expected_ids(env["local"], [{"role": "system", "content": "Now loud."}, *HISTORY,
                                       {"role": "user", "content": "why?"}])
    assert after.context[:len(want)] == want and after.eval_count == 1


def test_a_stop_parameter_ends_the_reply_unless_the_request_sets_its_own(env: dict[str, Any]) -> None:
    client = env["client"]
    full = client.generate(model="terse", prompt="why?", options={"stop": ["\x00never"]}).response
    assert len(full) >= 2  # greedy (temperature 0) on a fixed random model
    stop = full[-1]
    assert client.create(model="stopper", from_="terse", parameters={"stop": [stop]}).status == "success"
    assert client.generate(model="stopper", prompt="why?", options={"stop": ["\x00never"]}).response == full
    assert client.generate(model="stopper", prompt="why?").response == full[:full.index(stop)]


def test_openai_completions_use_the_models_num_predict_when_max_tokens_is_unset(env: dict[str, Any]) -> None:
    import openai

    client = openai.OpenAI(base_url=env["url"] + "/v1", api_key="unused")
    r = client.completions.create(model="terse", prompt="why?")
    assert 1 <= r.usage.completion_tokens <= 3  # PARAMETER num_predict 3, not OpenAI's 16
    r = client.completions.create(model="terse", prompt="why?", max_tokens=16, stop=["\x00never"])
    assert r.usage.completion_tokens > 3  # the request's max_tokens wins


def test_a_generate_request_s_own_template_replaces_the_models(env: dict[str, Any]) -> None:
    """Ollama's /api/generate `template`: a Go template over .System, .Prompt (and .Response), used for
    this request in place of the model's; the prompt is the raw text it renders."""
    import ollama

    client = env["client"]
    mine = client.generate(model="terse", prompt="why?", system="S!", template="<{{ .System }}|{{ .Prompt }}>")
    # the model's MESSAGEs are turns of their own (Ollama appends {{ .Response }} to a template without it)
    text = f"<S!|{HISTORY[0]['content']}>{HISTORY[1]['content']}<|why?>"
    raw = client.generate(model="terse", prompt=text, raw=True)
    assert mine.prompt_eval_count == raw.prompt_eval_count and mine.response == raw.response
    assert mine.context[:mine.prompt_eval_count] == env["local"].tokenize(text, add_bos=True, special=True)
    with pytest.raises(ollama.ResponseError) as err:
        client.generate(model="terse", prompt="x", template="{{ .Prompt }")
    assert err.value.status_code == 400 and err.value.error == "template: go template: unclosed action"
    r = httpx.post(env["url"] + "/api/generate", json={"model": "terse", "prompt": "x", "template": 5})
    assert r.status_code == 400 and r.json()["error"] == "template must be a string"


def served_ctx(url: str, name: str) -> int:
    """The context /api/ps says the model `name` runs at."""
    models = httpx.get(url + "/api/ps").json()["models"]
    return next(m["context_length"] for m in models if m["name"] == f"{name}:latest")


def test_a_models_num_ctx_is_the_context_it_is_served_at(env: dict[str, Any]) -> None:
    """PARAMETER num_ctx is the default context, as in Ollama (request options over PARAMETERs over the
    server's default), and a request without num_ctx keeps a model loaded at it or above it, while one
    loaded smaller for an earlier request is loaded again at the PARAMETER's value, not the server's."""
    import openai

    client, url = env["client"], env["url"]
    assert client.create(model="ctx160", from_="terse", parameters={"num_ctx": 160}).status == "success"
    loads = []
    for options in ({}, {}, {"num_ctx": 224}, {}, {"num_ctx": 32}, {}, {}):
        r = client.generate(model="ctx160", prompt="why?", options=options)
        loads.append((r.load_duration > 0, served_ctx(url, "ctx160")))
    assert loads == [(True, 160), (False, 160), (True, 224), (False, 224), (True, 32), (True, 160), (False, 160)]
    r = openai.OpenAI(base_url=url + "/v1", api_key="unused").chat.completions.create(
        model="ctx160", messages=[{"role": "user", "content": "and?"}])
    assert r.usage.prompt_tokens > 0 and served_ctx(url, "ctx160") == 160
    assert client.create(model="ctxbig", from_="terse", parameters={"num_ctx": 100000}).status == "success"
    client.generate(model="ctxbig", prompt="why?")
    assert served_ctx(url, "ctxbig") == 256  # the tiny model's training context
