"""The server against the official ``ollama`` and ``openai`` Python clients, over real HTTP on loopback,
on smollm2:135m registered in a temporary store."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

MODEL = "smollm2:135m"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(**config: Any) -> Iterator[str]:
    """Start ``create_app`` under uvicorn in a thread on a free loopback port; yields the base URL."""
    import uvicorn

    from llmedge.server.app import config_from_env, create_app

    port = free_port()
    app = create_app(config_from_env(host="127.0.0.1", port=port, **config))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 20
    while not server.started:
        assert thread.is_alive() and time.time() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        assert not thread.is_alive(), "the server did not shut down"


@pytest.fixture(scope="module")
def store_root(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Iterator[Path]:
    from llmedge.store import Store

    root = tmp_path_factory.mktemp("store")
    Store(root).create(MODEL, smollm2_path)
    old = os.environ.get("LLMEDGE_MODELS")
    os.environ["LLMEDGE_MODELS"] = str(root)
    yield root
    if old is None:
        os.environ.pop("LLMEDGE_MODELS", None)
    else:
        os.environ["LLMEDGE_MODELS"] = old


@pytest.fixture(scope="module")
def base_url(store_root: Path) -> Iterator[str]:
    with running_server(parallel=2, max_queue=8) as url:
        yield url


GREEDY = {"temperature": 0, "num_predict": 24, "seed": 1}


def test_ollama_generate_streams_ndjson_and_matches_non_streaming(base_url: str) -> None:
    import ollama

    client = ollama.Client(host=base_url)
    parts = list(client.generate(model=MODEL, prompt="Name a color.", options=GREEDY, stream=True))
    assert len(parts) >= 2 and all(not p.done for p in parts[:-1])
    last = parts[-1]
    assert last.done and last.done_reason in ("stop", "length")
    assert last.eval_count >= 1 and last.eval_duration > 0 and last.prompt_eval_count > 0
    assert last.total_duration >= last.eval_duration + last.prompt_eval_duration
    assert isinstance(last.context, list) and len(last.context) >= last.eval_count
    assert "".join(p.response for p in parts).strip()
    whole = client.generate(model=MODEL, prompt="Name a fruit.", options=GREEDY, stream=False)
    assert whole.done and whole.response.strip() and whole.eval_count >= 1
    assert whole.context[: len(whole.context) - whole.eval_count] != last.context[: len(whole.context)]


def test_ollama_chat_streaming_and_not_agree_and_respect_num_predict(base_url: str) -> None:
    import ollama

    client = ollama.Client(host=base_url)
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello."}]
    chunks = list(client.chat(model=MODEL, messages=messages, options={**GREEDY, "num_predict": 5},
                              stream=True))
    assert chunks[-1].done and chunks[-1].eval_count <= 5
    assert "".join(c.message.content for c in chunks)
    resp = client.chat(model=MODEL, messages=messages[1:], options={**GREEDY, "num_predict": 5})
    assert resp.message.role == "assistant" and resp.message.content
    assert resp.done_reason == "length" or resp.eval_count < 5


def test_ollama_chat_format_schema_output_validates(base_url: str) -> None:
    import ollama

    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 120}},
              "required": ["name", "age"]}
    resp = ollama.Client(host=base_url).chat(
        model=MODEL, messages=[{"role": "user", "content": "Describe a person as JSON."}], format=schema,
        options={"temperature": 0, "num_predict": 64})
    jsonschema.validate(json.loads(resp.message.content), schema)


def test_ollama_model_management_list_show_ps_copy_delete_pull(base_url: str) -> None:
    import ollama

    client = ollama.Client(host=base_url)
    names = [m.model for m in client.list().models]
    assert MODEL in names
    shown = client.show(MODEL)
    assert shown.details.family == "llama" and shown.details.format == "gguf"
    assert shown.modelinfo["general.architecture"] == "llama"
    client.generate(model=MODEL, prompt="Hi", options={"num_predict": 1})
    ps = client.ps().models
    assert ps and ps[0].model == MODEL and ps[0].expires_at is not None
    client.copy(MODEL, "copied:1")
    assert "copied:1" in [m.model for m in client.list().models]
    client.delete("copied:1")
    assert "copied:1" not in [m.model for m in client.list().models]
    with pytest.raises(ollama.ResponseError) as e:
        client.delete("copied:1")
    assert e.value.status_code == 404
    statuses = [p.status for p in client.pull(MODEL, stream=True)]
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success"
    assert "verifying sha256 digest" in statuses and "writing manifest" in statuses
    assert any(s.startswith("pulling ") and s != "pulling manifest" for s in statuses)


def test_ollama_keep_alive_zero_unloads(base_url: str) -> None:
    import ollama

    client = ollama.Client(host=base_url)
    client.generate(model=MODEL, prompt="Hi", options={"num_predict": 1}, keep_alive=-1)
    assert client.ps().models[0].expires_at.year > 2200
    r = client.generate(model=MODEL, prompt="", keep_alive=0)
    assert r.done and r.done_reason == "unload"
    assert client.ps().models == []


def test_openai_chat_completions_streaming_and_not(base_url: str) -> None:
    import openai

    client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused")
    msgs = [{"role": "user", "content": "Count to three."}]
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12, temperature=0, seed=3)
    assert r.object == "chat.completion" and r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 12 and r.usage.prompt_tokens > 0
    stream = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12, temperature=0, seed=3,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-2].choices[0].finish_reason in ("stop", "length") and chunks[-1].choices == []
    assert 0 < chunks[-1].usage.completion_tokens <= 12
    # the same prompt again: its prefix comes from the slot's cache, and usage says how much of it
    used = chunks[-1].usage
    assert used.prompt_tokens == r.usage.prompt_tokens and 0 < used.prompt_tokens_details.cached_tokens < used.prompt_tokens


def test_a_last_assistant_message_is_continued(base_url: str, smollm2_path: Path) -> None:
    """Assistant prefill, as llama.cpp's server does it: the reply continues the assistant's words, and
    equals a raw generation from the user turn's prompt followed by those words."""
    import llmedge

    words = "The capital of France is"
    msgs = [{"role": "user", "content": "What is the capital of France?"}, {"role": "assistant", "content": words}]
    prompt = llmedge.load(str(smollm2_path), n_ctx=256).apply_chat_template(msgs[:1]) + words
    raw = httpx.post(base_url + "/api/generate", json={"model": MODEL, "prompt": prompt, "raw": True, "stream": False,
                                                        "options": {"temperature": 0, "num_predict": 8}}, timeout=60).json()
    oa = httpx.post(base_url + "/v1/chat/completions", json={"model": MODEL, "messages": msgs, "max_tokens": 8,
                                                             "temperature": 0}, timeout=60).json()
    ol = httpx.post(base_url + "/api/chat", json={"model": MODEL, "messages": msgs, "stream": False,
                                                  "options": {"temperature": 0, "num_predict": 8}}, timeout=60).json()
    assert "Paris" in raw["response"]
    assert oa["choices"][0]["message"]["content"] == ol["message"]["content"] == raw["response"]
    assert oa["usage"]["prompt_tokens"] == raw["prompt_eval_count"]


def test_openai_completions_models_and_json_schema(base_url: str) -> None:
    import openai

    client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused")
    c = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0)
    assert c.choices[0].text and c.usage.completion_tokens <= 6
    assert MODEL in [m.id for m in client.models.list()]
    schema = {"type": "object", "properties": {"colors": {"type": "array", "items": {"enum": ["red", "blue"]},
                                                          "maxItems": 3}}, "required": ["colors"]}
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "List colors as JSON."}], temperature=0,
        max_tokens=48, response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
        logprobs=True, top_logprobs=2)
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    lp = r.choices[0].logprobs.content
    assert lp and all(t.logprob <= 0 and len(t.top_logprobs) <= 2 for t in lp)


def test_raw_sse_ends_with_done_and_ndjson_lines_parse(base_url: str) -> None:
    with httpx.stream("POST", base_url + "/v1/chat/completions", timeout=60, json={
            "model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "stream": True}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    assert all(json.loads(e[6:])["object"] == "chat.completion.chunk" for e in events[:-1])
    with httpx.stream("POST", base_url + "/api/generate", timeout=60, json={
            "model": MODEL, "prompt": "Hi", "options": {"num_predict": 3}}) as r:
        lines = [json.loads(line) for line in r.iter_lines() if line]
    final = lines[-1]
    for k in ("total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count",
              "eval_duration", "done_reason", "created_at"):
        assert k in final
    assert final["eval_duration"] > 1000  # nanoseconds, not seconds


def test_version_root_health_and_metrics(base_url: str) -> None:
    assert httpx.get(base_url + "/").status_code == 200
    assert "version" in httpx.get(base_url + "/api/version").json()
    assert httpx.get(base_url + "/health").json()["status"] == "ok"
    text = httpx.get(base_url + "/metrics").text
    assert "llmedge_generated_tokens_total" in text and "llmedge_queue_depth" in text
    assert 'route="/api/generate",status="200"' in text


def test_embeddings_through_both_clients_are_normalized_and_meaningful(base_url: str) -> None:
    import numpy as np
    import ollama
    import openai

    texts = ["The cat sat on the mat.", "A cat was sitting on a mat.", "Quantum chromodynamics lecture notes"]
    r = ollama.Client(host=base_url).embed(model=MODEL, input=texts)
    e = np.array(r.embeddings)
    assert e.shape == (3, 576) and np.allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-5)
    assert e[0] @ e[1] > e[0] @ e[2]  # paraphrases are closer than unrelated text
    assert r.prompt_eval_count > 0
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused")
    o = client.embeddings.create(model=MODEL, input=texts[:2])  # the client asks for base64 by default
    got = np.array([d.embedding for d in o.data])
    assert np.allclose(got, e[:2], atol=1e-5) and o.usage.prompt_tokens > 0
    f = client.embeddings.create(model=MODEL, input=texts[0], encoding_format="float", dimensions=64)
    assert len(f.data[0].embedding) == 64
    # the Python API's embed is the same computation
    import llmedge

    m = llmedge.load(MODEL, n_ctx=256)
    assert np.allclose(m.embed(texts), e, atol=1e-5) and np.allclose(m.embed(texts[0]), e[0], atol=1e-5)
    assert np.allclose(m.embed(texts[0], dimensions=64), f.data[0].embedding, atol=1e-5)


def test_ollama_format_json_logprobs_stop_and_context_continuation(base_url: str) -> None:
    import ollama

    client = ollama.Client(host=base_url)
    r = client.generate(model=MODEL, prompt='Reply with this JSON object: {"ok": true, "n": 3}', format="json",
                        options={"temperature": 0, "num_predict": 80})
    assert r.done_reason == "stop" and isinstance(json.loads(r.response), dict)
    raw = httpx.post(base_url + "/api/generate", timeout=60, json={
        "model": MODEL, "prompt": "Count: 1, 2, 3,", "raw": True, "stream": False, "logprobs": True,
        "top_logprobs": 2, "options": {"temperature": 0, "num_predict": 12, "stop": [" 6"]}}).json()
    assert " 6" not in raw["response"] and raw["done_reason"] == "stop"
    lps = raw["logprobs"]
    assert lps and all(e["logprob"] <= 0 and 1 <= len(e["top_logprobs"]) <= 2 for e in lps)
    assert lps[0]["top_logprobs"][0]["logprob"] >= lps[0]["top_logprobs"][-1]["logprob"]
    nxt = client.generate(model=MODEL, prompt="And then?", context=raw["context"],
                          options={"temperature": 0, "num_predict": 4})
    assert nxt.context[: len(raw["context"])] == raw["context"]
    assert nxt.prompt_eval_count > 0 and nxt.eval_count >= 1


def test_keep_alive_duration_expires_and_gemma3_serves(base_url: str, store_root: Path,
                                                       gemma3_path: Path) -> None:
    import ollama

    from llmedge.store import Store

    Store(store_root).create("gemma3:270m", gemma3_path)
    client = ollama.Client(host=base_url)
    r = client.chat(model="gemma3:270m", messages=[{"role": "user", "content": "Say yes."}],
                    options={"temperature": 0, "num_predict": 4}, keep_alive="1s")
    assert r.done and r.eval_count >= 1 and r.message.content
    assert "gemma3:270m" in [m.model for m in client.ps().models]
    deadline = time.time() + 5
    while "gemma3:270m" in [m.model for m in client.ps().models]:
        assert time.time() < deadline, "keep_alive=1s did not unload the model"
        time.sleep(0.1)
    shown = client.show("gemma3:270m")
    assert shown.details.family == "gemma3"
