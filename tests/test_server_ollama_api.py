"""The rest of Ollama's API through the official clients on a real server: /api/ps memory against the
process's RSS, keep_alive 0 unloading at once, /api/show (file type, capabilities, model_info, tensors),
batch embeddings equal to single ones (truncate, dimensions, base64 on /v1), tokenize/detokenize,
/api/version, /v1/models/{id}, logprobs on both protocols."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from test_server_api import MODEL, running_server, store_root  # noqa: F401  (fixture)

GEMMA = "gemma3:270m"


def rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def url(store_root: Path, gemma3_path: Path) -> Iterator[str]:  # noqa: F811
    from llmedge.store import Store

    Store(store_root).create(GEMMA, gemma3_path)
    with running_server(parallel=2, max_queue=8) as base:
        yield base


def test_ps_memory_matches_the_rss_the_model_adds_and_keep_alive_zero_frees_it(url: str) -> None:
    import ollama

    client = ollama.Client(host=url)
    assert client.ps().models == []
    before = rss()
    with ThreadPoolExecutor(2) as pool:  # both slots in use
        list(pool.map(lambda p: client.generate(model=MODEL, prompt=p, options={"num_predict": 8}, keep_alive=-1),
                      ["Tell me about cats.", "Tell me about dogs."]))
    grown = rss() - before
    (m,) = client.ps().models
    assert m.context_length == 4096 and m.expires_at.year > 2200 and m.size_vram == 0
    assert abs(m.size - grown) <= 0.10 * m.size, (m.size, grown)
    r = client.generate(model=MODEL, prompt="", keep_alive=0)
    assert r.done_reason == "unload" and client.ps().models == []
    deadline = time.time() + 5
    while rss() - before > 0.25 * m.size and time.time() < deadline:
        time.sleep(0.1)
    assert rss() - before <= 0.25 * m.size, (rss() - before, m.size)


def test_keep_alive_per_request_sets_the_expiry(url: str) -> None:
    import ollama

    client = ollama.Client(host=url)
    client.generate(model=MODEL, prompt="Hi", options={"num_predict": 1}, keep_alive="90s")
    (m,) = [p for p in client.ps().models if p.model == MODEL]
    left = m.expires_at.timestamp() - time.time()
    assert 60 < left <= 91
    client.generate(model=MODEL, prompt="", keep_alive=0)


def test_show_reports_the_file_type_capabilities_model_info_and_tensors(url: str) -> None:
    import ollama

    client = ollama.Client(host=url)
    g = client.show(GEMMA)
    assert g.details.quantization_level == "Q4_K_M" and g.details.family == "gemma3"
    assert g.capabilities == ["completion"]  # a chat model; embedding is for pooling_type models
    assert g.modelinfo["gemma3.context_length"] == 32768 and g.modelinfo["general.architecture"] == "gemma3"
    assert g.modelinfo["tokenizer.ggml.tokens"] is None  # long arrays only with verbose
    s = client.show(MODEL)
    assert s.details.quantization_level == "Q4_1"
    v = httpx.post(url + "/api/show", json={"model": MODEL, "verbose": True}).json()
    assert len(v["model_info"]["tokenizer.ggml.tokens"]) == 49152
    by_name = {t["name"]: t for t in v["tensors"]}
    assert by_name["token_embd.weight"]["shape"] == [576, 49152] and by_name["token_embd.weight"]["type"]


def test_a_batch_of_embeddings_equals_each_embedded_alone(url: str) -> None:
    import ollama

    client = ollama.Client(host=url)
    texts = ["The cat sat.", "Quantum chromodynamics", "a"]
    batch = client.embed(model=MODEL, input=texts).embeddings
    alone = [client.embed(model=MODEL, input=t).embeddings[0] for t in texts]
    assert np.array_equal(np.asarray(batch), np.asarray(alone))
    short = client.embed(model=MODEL, input=texts, dimensions=64).embeddings
    assert all(len(e) == 64 and abs(np.linalg.norm(e) - 1) < 1e-6 for e in short)
    assert np.allclose(short[0], np.asarray(batch[0][:64]) / np.linalg.norm(batch[0][:64]))
    long, small = "word " * 300, {"num_ctx": 128}
    with pytest.raises(ollama.ResponseError) as e:
        client.embed(model=MODEL, input=long, truncate=False, options=small)
    assert e.value.status_code == 400
    cut = client.embed(model=MODEL, input=long, options=small)
    assert len(cut.embeddings[0]) == 576 and cut.prompt_eval_count == 128  # truncated to the context


def test_openai_embeddings_base64_decode_to_the_floats_and_models_by_id(url: str) -> None:
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
    floats = client.embeddings.create(model=MODEL, input=["hello", "world"]).data
    raw = httpx.post(url + "/v1/embeddings", json={"model": MODEL, "input": ["hello", "world"],
                                                   "encoding_format": "base64"}).json()["data"]
    for f, b in zip(floats, raw):
        assert np.array_equal(np.frombuffer(base64.b64decode(b["embedding"]), dtype="<f4"),
                              np.asarray(f.embedding, dtype=np.float32))
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("absent:1")


def test_tokenize_and_detokenize_round_trip_with_the_models_ids(url: str) -> None:
    import llmedge

    text = "Hello, world! <|im_start|>"
    r = httpx.post(url + "/api/tokenize", json={"model": MODEL, "content": text}).json()
    local = llmedge.load(MODEL, backend="numpy", n_ctx=64)
    assert r["tokens"] == local.tokenize(text, special=True)
    back = httpx.post(url + "/api/detokenize", json={"model": MODEL, "tokens": r["tokens"]}).json()
    assert back["content"] == local.detokenize(r["tokens"])
    bad = httpx.post(url + "/api/detokenize", json={"model": MODEL, "tokens": [10**9]})
    assert bad.status_code == 400 and "out of range" in bad.json()["error"]
    assert httpx.get(url + "/api/version").json()["version"] == llmedge.__version__


def test_logprobs_on_both_protocols(url: str) -> None:
    import ollama
    import openai

    r = ollama.Client(host=url).generate(model=MODEL, prompt="Hi", logprobs=True, top_logprobs=3,
                                         options={"temperature": 0, "num_predict": 4})
    assert len(r.logprobs) == r.eval_count and all(len(e.top_logprobs) == 3 for e in r.logprobs)
    assert all(e.logprob <= 0 and e.top_logprobs[0].logprob >= e.logprob - 1e-6 for e in r.logprobs)
    o = openai.OpenAI(base_url=url + "/v1", api_key="unused").chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0, logprobs=True,
        top_logprobs=2)
    content = o.choices[0].logprobs.content
    assert len(content) == o.usage.completion_tokens and all(len(c.top_logprobs) == 2 for c in content)


def test_created_at_is_the_instant_as_datetime_formats_it() -> None:
    """created_at (every streamed token has one) caches its date part per second: the text must stay what
    datetime gives for any instant, across second boundaries and where the microseconds round up."""
    from datetime import UTC, datetime

    from llmedge.server.ollama import rfc3339

    def reference(t: float) -> str:
        dt = datetime.fromtimestamp(t, UTC)
        return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond:06d}000Z"

    rng = np.random.default_rng(0)
    instants = [*rng.uniform(0, 4e9, 2000), *(1.7e9 + rng.uniform(0, 5, 2000))]
    instants += [1.7e9 + k + f for k in range(50) for f in (0.0, 0.9999995, 0.9999996, 0.0000005, 0.5)]
    assert [rfc3339(float(t)) for t in instants] == [reference(float(t)) for t in instants]
