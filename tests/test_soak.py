"""The soak, short: benchmarks/soak.py against a real `llmedge serve` subprocess on loopback with a
tiny model, 4 clients for 8 s and a queue small enough that some requests get 503 + Retry-After.
Nothing lost, swapped or 5xx, the server idle afterwards, RSS bounded. The long run is the script."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import soak  # noqa: E402


def test_short_soak_has_no_errors_and_serves_every_refused_request() -> None:
    r = soak.run(clients=4, seconds=8, parallel=1, max_queue=1, warmup=2)
    assert r["errors"] == 0, r["error_samples"]
    assert r["server_5xx"] == 0 and not r["traceback_in_log"]
    assert r["mismatched_answers"] == 0  # every answer carried its own request's prompt tokens
    assert r["refused_503"] > 0 and r["missing_retry_after"] == 0  # the queue overflowed, and said when
    assert r["server_503"] == r["refused_503"]  # each refusal the server counted was retried and served
    assert set(r["by_kind"]) == set(soak.KINDS) and r["requests_ok"] >= 20
    assert r["idle_after"]
    assert r["rss_growth"] < 0.25, r  # a short run only bounds RSS; the long run checks < 5 %


def test_schema_output_on_a_space_prefixed_sentencepiece_vocabulary(tmp_path: Path) -> None:
    """Found by the soak: llguidance tokenizes the bytes it forces (a '{' mid-answer) through the model's
    tokenizer, which must not add SentencePiece's leading space there (the tiny model is a Llama-2-style
    vocabulary with add_space_prefix), else the first forced brace was rejected with a 400."""
    import json

    import httpx
    from test_server_api import running_server

    models, name = soak.tiny_store(tmp_path)
    import os

    old = os.environ.get("LLMEDGE_MODELS")
    os.environ["LLMEDGE_MODELS"] = str(models)
    try:
        with running_server(parallel=1) as base:
            for seed in range(3):
                r = httpx.post(base + "/api/chat", timeout=60, json={
                    "model": name, "messages": [{"role": "user", "content": "hello"}], "stream": False,
                    "format": soak.SCHEMA, "options": {"num_predict": 64, "seed": seed}})
                assert r.status_code == 200, r.text
                if r.json()["done_reason"] == "stop":
                    assert isinstance(json.loads(r.json()["message"]["content"])["n"], int)
    finally:
        if old is None:
            os.environ.pop("LLMEDGE_MODELS", None)
        else:
            os.environ["LLMEDGE_MODELS"] = old
