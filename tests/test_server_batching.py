"""Continuous batching in the server, over real HTTP on loopback with smollm2:135m: concurrent requests
share batched engine steps and all complete (with log-probabilities and grammars among them), a
request's greedy tokens are the same batched as alone, a disconnected client's slot is free within a
second (streaming or not), a later request reuses a finished one's cached prefix, and other model
jobs (embeddings) run between the steps without stalling the running sequences."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from test_server_api import MODEL, running_server, store_root  # noqa: F401  (fixture)

COUNT = "Count from 1 to 1000: 1, 2, 3, 4,"  # raw: the model keeps counting, so a stream runs its budget


@pytest.fixture(scope="module")
def url(store_root: Path) -> Iterator[str]:  # noqa: F811
    with running_server(parallel=4, max_queue=16) as base:
        yield base


def generate(url: str, body: dict[str, Any], timeout: float = 120) -> dict[str, Any]:
    r = httpx.post(url + "/api/generate", json={"model": MODEL, "stream": False, **body}, timeout=timeout)
    assert r.status_code == 200, r.text
    return r.json()


def metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} is not in /metrics")


def wait_busy(url: str, n: int, within: float) -> float:
    """Seconds until /health reports at most ``n`` busy slots (fails after ``within`` seconds)."""
    t0 = time.monotonic()
    while httpx.get(url + "/health").json()["busy"] > n:
        assert time.monotonic() - t0 < within, f"still more than {n} busy slots after {within} s"
        time.sleep(0.02)
    return time.monotonic() - t0


# MLX's CPU build decodes a few tokens a second: its case generates fewer
@pytest.mark.parametrize(("backend", "n_predict"), [("native", 24), ("mlx", 8)])
def test_greedy_tokens_are_the_same_batched_as_alone(store_root: Path, smollm2_path: Path,  # noqa: F811
                                                     backend: str, n_predict: int) -> None:
    import llmedge
    from llmedge.sampling import Sampler, SamplingOptions

    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
               "The three primary colours are"]
    # fresh slots: no prefix comes from elsewhere
    with running_server(parallel=4, max_queue=4, backend=backend) as base:
        with ThreadPoolExecutor(4) as ex:
            got = list(ex.map(lambda p: generate(base, {"prompt": p, "raw": True, "options": {
                "temperature": 0, "num_predict": n_predict}}), prompts))
        steps = metric(base, "llmedge_engine_steps_total")
        batch = metric(base, "llmedge_engine_sequence_steps_total") / steps
    assert batch > 1.5, batch  # the four sequences really were advanced together
    m = llmedge.load(str(smollm2_path), backend=backend)
    for prompt, r in zip(prompts, got):
        m.engine.cache.clear()
        m.engine.prefix_cache.clear()
        ids = m.tokenize(prompt, add_bos=True, special=True)
        want = [c.token for c in m.engine.generate(ids, Sampler(SamplingOptions(temperature=0)), n_predict)]
        assert r["context"] == ids + want, prompt
        assert r["prompt_eval_count"] == len(ids) and r["eval_count"] == len(want)


def test_sixteen_concurrent_requests_all_complete(url: str) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}

    def one(i: int) -> dict[str, Any]:
        body: dict[str, Any] = {"prompt": f"{COUNT} {i}", "raw": True,
                                "options": {"temperature": 0.5, "seed": i, "num_predict": 8}}
        if i % 4 == 1:
            body.update(logprobs=True, top_logprobs=2)
        if i % 4 == 2:
            body.update(prompt=f"Give a JSON object with a number {i}.", raw=False, format=schema)
            body["options"]["num_predict"] = 32
        return generate(url, body)

    steps0 = metric(url, "llmedge_engine_steps_total")
    seqs0 = metric(url, "llmedge_engine_sequence_steps_total")
    with ThreadPoolExecutor(16) as ex:
        results = list(ex.map(one, range(16)))
    batch = (metric(url, "llmedge_engine_sequence_steps_total") - seqs0) / (
        metric(url, "llmedge_engine_steps_total") - steps0)
    for i, r in enumerate(results):
        assert r["done"] and r["eval_count"] >= 1 and r["prompt_eval_count"] >= 1, r
        assert r["eval_duration"] > 0 and r["total_duration"] >= r["eval_duration"] + r["prompt_eval_duration"]
        if i % 4 == 2:
            jsonschema.validate(json.loads(r["response"]), schema)
        else:
            assert r["eval_count"] == 8 and r["done_reason"] == "length"
        if i % 4 == 1:
            assert len(r["logprobs"]) == 8 and all(len(e["top_logprobs"]) == 2 for e in r["logprobs"])
    assert batch > 2.0, batch
    health = httpx.get(url + "/health").json()
    assert health["busy"] == 0 and health["queue"] == 0 and health["slots"] == 4


def test_a_disconnected_streaming_client_frees_its_slot_within_a_second(url: str) -> None:
    body = {"model": MODEL, "prompt": COUNT, "raw": True, "options": {"num_predict": 2000, "temperature": 0}}
    with httpx.Client(timeout=60) as keep, keep.stream("POST", url + "/api/generate", json=body) as other:
        lines = other.iter_lines()
        next(lines)
        with httpx.Client(timeout=60) as client, client.stream("POST", url + "/api/generate", json=body) as r:
            it = r.iter_lines()
            next(it)
            assert httpx.get(url + "/health").json()["busy"] == 2
        assert wait_busy(url, 1, within=1.0) < 1.0  # the other sequence runs on
        n = sum(1 for _, _ in zip(range(5), lines))
        assert n == 5 and httpx.get(url + "/health").json()["busy"] == 1
    wait_busy(url, 0, within=1.0)


def test_a_disconnected_non_streaming_client_frees_its_slot_within_a_second(url: str) -> None:
    body = {"model": MODEL, "prompt": COUNT, "raw": True, "stream": False,
            "options": {"num_predict": 2000, "temperature": 0}}
    cancelled = metric(url, "llmedge_cancelled_total")
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url + "/api/generate", json=body, timeout=httpx.Timeout(60, read=1.5))
    assert wait_busy(url, 0, within=1.0) < 1.0
    assert metric(url, "llmedge_cancelled_total") == cancelled + 1


def test_a_later_request_reuses_the_cached_prefix_of_an_earlier_one(url: str) -> None:
    system = "You are a careful assistant who answers in one short sentence. " * 8

    def chat(question: str) -> dict[str, Any]:
        r = httpx.post(url + "/api/chat", timeout=120, json={
            "model": MODEL, "stream": False, "options": {"temperature": 0, "num_predict": 4},
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]})
        assert r.status_code == 200, r.text
        return r.json()

    first = chat("Name three colours.")
    stop, streaming = threading.Event(), threading.Event()
    body = {"model": MODEL, "prompt": COUNT, "raw": True, "options": {"num_predict": 2000}}

    def busy() -> None:  # an unrelated sequence occupies a slot meanwhile
        with httpx.Client(timeout=60) as client, client.stream("POST", url + "/api/generate", json=body) as r:
            for _ in r.iter_lines():
                streaming.set()  # its prompt is evaluated: it adds nothing more to the prompt tokens
                if stop.is_set():
                    return

    t = threading.Thread(target=busy)
    t.start()
    try:
        assert streaming.wait(60)
        evaluated = metric(url, "llmedge_prompt_tokens_total")
        second = chat("Name three animals.")
        evaluated = metric(url, "llmedge_prompt_tokens_total") - evaluated
    finally:
        stop.set()
        t.join(30)
    # prompt_eval_count is the whole prompt (as Ollama counts it); the metric, what was evaluated
    assert first["prompt_eval_count"] > 100 and second["prompt_eval_count"] > 100
    assert evaluated < 20, (first["prompt_eval_count"], second["prompt_eval_count"], evaluated)
    wait_busy(url, 0, within=2.0)


def test_embeddings_run_between_steps_of_running_sequences(url: str) -> None:
    body = {"model": MODEL, "prompt": COUNT, "raw": True, "options": {"num_predict": 2000, "temperature": 0}}
    with httpx.Client(timeout=60) as client, client.stream("POST", url + "/api/generate", json=body) as r:
        lines = r.iter_lines()
        next(lines)
        e = httpx.post(url + "/api/embed", json={"model": MODEL, "input": ["hello", "world"]}, timeout=60)
        assert e.status_code == 200 and len(e.json()["embeddings"]) == 2
        assert sum(1 for _, _ in zip(range(3), lines)) == 3  # the sequence still streams
    wait_busy(url, 0, within=1.0)
