"""Limits from the network: every bounded request field refused with a 400 (413 for the body) when
negative, huge or of the wrong type, against a real server on loopback serving a tiny random-weight
model; the values Ollama gives a meaning to (num_predict -1, keep_alive -1) keep it."""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_server_api import running_server

sys.path.insert(0, str(Path(__file__).parent / "malformed"))
from gguf_bytes import U32, tiny_model  # noqa: E402

from llmedge.server import limits  # noqa: E402

MODEL = "tiny:latest"


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from llmedge.store import Store

    root = tmp_path_factory.mktemp("limits")
    Store(root / "store").create(MODEL, tiny_model().write(root / "tiny.gguf"))
    mp = pytest.MonkeyPatch()
    mp.setenv("LLMEDGE_MODELS", str(root / "store"))
    with running_server(parallel=1, max_queue=4, max_body=256 * 1024, max_ctx=4096) as base:
        yield base
    mp.undo()


def gen(url: str, path: str = "/api/generate", **fields: Any) -> httpx.Response:
    body = {"model": MODEL, "stream": False, **fields}
    if path == "/api/generate":
        body.setdefault("prompt", "hello")
    return httpx.post(url + path, json=body, timeout=60)


def assert_400(r: httpx.Response, words: str) -> None:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    msg = err if isinstance(err, str) else err["message"]
    assert words in msg and "\n" not in msg, msg


def raw_post(url: str, content_length: str) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(f"POST /api/generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {content_length}\r\nConnection: close\r\n\r\n{{}}".encode())
        return s.recv(4096)


def test_body_size_negative_huge_and_wrong_type(url: str) -> None:
    assert raw_post(url, "-5").startswith(b"HTTP/1.1 400")
    assert raw_post(url, "abc").startswith(b"HTTP/1.1 400")
    assert raw_post(url, str(1 << 40)).startswith(b"HTTP/1.1 413")
    r = httpx.post(url + "/api/generate", json={"model": MODEL, "prompt": "x" * (300 * 1024)}, timeout=30)
    assert r.status_code == 413


def test_prompt_longer_than_the_context_is_cut_to_fit(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    r = gen(url, prompt="hello " * 2000, raw=True, options={"num_ctx": 64, "num_predict": 2})
    assert r.status_code == 200, r.text
    assert 0 < r.json()["prompt_eval_count"] <= 64
    assert_400(gen(url, prompt=["hello"]), "prompt and system must be strings")
    assert_400(gen(url, context=[-1]), "token")
    monkeypatch.setattr(limits, "MAX_IDS", 1000)  # the server runs in this process
    assert_400(gen(url, context=[0] * 1001), "context holds 1001 token ids (at most 1000)")
    assert_400(gen(url, "/v1/completions", prompt=[0] * 1001), "prompt holds 1001 token ids")


def test_openai_prompt_longer_than_the_context_is_400_context_length_exceeded(url: str) -> None:
    """OpenAI refuses a prompt that does not fit instead of cutting it (the OpenAI routes cut it silently);
    Ollama's routes keep cutting it, as Ollama does."""
    long = "hello " * 3000
    for path, fields, param in (("/v1/completions", {"prompt": long}, "prompt"),
                                ("/v1/completions", {"prompt": [0] * 20000}, "prompt"),
                                ("/v1/chat/completions", {"messages": [{"role": "user", "content": long}]},
                                 "messages")):
        for stream in (False, True):
            r = gen(url, path, max_tokens=2, **{**fields, "stream": stream})
            assert r.status_code == 400, (path, stream, r.text[:300])
            err = r.json()["error"]
            assert err["code"] == "context_length_exceeded" and err["type"] == "invalid_request_error", err
            assert err["param"] == param and "maximum context length" in err["message"], err
            assert "\n" not in err["message"]
    r = gen(url, "/api/chat", messages=[{"role": "user", "content": long}], options={"num_ctx": 64, "num_predict": 2})
    assert r.status_code == 200 and 0 < r.json()["prompt_eval_count"] <= 64, r.text[:300]
    ok = gen(url, "/v1/chat/completions", messages=[{"role": "user", "content": "hello"}], max_tokens=2)
    assert ok.status_code == 200, ok.text


def test_num_predict(url: str) -> None:
    assert_400(gen(url, options={"num_predict": -3}), "num_predict=-3 is out of range")
    assert_400(gen(url, options={"num_predict": 10**12}), "out of range")
    assert_400(gen(url, options={"num_predict": "ten"}), "num_predict must be a number")
    assert_400(gen(url, options={"num_predict": True}), "num_predict must be a number, not bool")
    assert_400(gen(url, options={"num_predict": 2.5}), "num_predict must be an integer")
    assert_400(gen(url, "/v1/completions", prompt="x", max_tokens=10**12), "out of range")
    r = gen(url, options={"num_predict": -1, "num_ctx": 32})
    assert r.status_code == 200 and r.json()["eval_count"] >= 1
    # a text that never ends (the tiny model's greedy one, with a stop string that never comes) ends at
    # ten contexts, Ollama's limit, instead of shifting for ever
    r = gen(url, raw=True, options={"num_predict": -1, "num_ctx": 32, "temperature": 0, "stop": ["\x00"]})
    assert r.status_code == 200 and r.json()["eval_count"] == 320 and r.json()["done_reason"] == "length", r.text


def test_num_ctx(url: str) -> None:
    assert_400(gen(url, options={"num_ctx": -1}), "num_ctx=-1 is out of range")
    assert_400(gen(url, options={"num_ctx": 10**12}), "out of range")
    assert_400(gen(url, options={"num_ctx": "4096"}), "num_ctx must be a number")
    assert_400(gen(url, options={"num_ctx": 64.5}), "num_ctx must be an integer")
    assert_400(gen(url, "/api/embed", input="x", options={"num_ctx": 0}), "num_ctx=0 is out of range")
    assert gen(url, options={"num_ctx": 64, "num_predict": 1}).status_code == 200


def test_number_of_messages(url: str) -> None:
    many = [{"role": "user", "content": "hi"}] * (limits.MAX_MESSAGES + 1)
    assert_400(gen(url, "/api/chat", messages=many), "too many messages")
    assert_400(gen(url, "/v1/chat/completions", messages=many), "too many messages")
    assert_400(gen(url, "/api/chat", messages="hi"), "messages must be an array")
    assert_400(gen(url, "/api/chat", messages=[5]), "messages[0] must be an object")
    assert_400(gen(url, "/api/chat", messages=[{"role": "user", "content": 5}]), "messages[0].content must be")
    assert_400(gen(url, "/v1/chat/completions", messages=[{"role": 5, "content": "x"}]), "messages[0].role")
    assert_400(gen(url, "/v1/chat/completions", messages=[]), "non-empty")
    assert_400(gen(url, "/api/embed", input=["x"] * (limits.MAX_INPUTS + 1)), "too many inputs")
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    for route in ("/api/chat", "/v1/chat/completions"):
        assert_400(gen(url, route, messages=[{"role": "user", "content": "hi"}], tools=[tool] * (limits.MAX_TOOLS + 1)),
                   "too many tools")
        assert_400(gen(url, route, messages=[{"role": "user", "content": "hi"}], tools=[{"function": {}}]),
                   "name must be a non-empty string")


def test_image_fields(url: str) -> None:
    assert_400(gen(url, images="aGk="), "images must be an array of base64 strings")
    assert_400(gen(url, images=[1, 2]), "images must be an array of base64 strings")
    assert_400(gen(url, images=["aGk="]), "does not support images")
    assert_400(gen(url, images=["aGk="] * 20000), "does not support images")  # many: refused before decoding
    assert_400(gen(url, images=["aGk="] * 10 + [None]), "images must be an array of base64 strings")
    assert_400(gen(url, "/api/chat", messages=[{"role": "user", "content": "x", "images": {"a": 1}}]),
               "messages[0].images must be an array")
    assert gen(url, images=[], options={"num_predict": 1}).status_code == 200


def test_keep_alive(url: str) -> None:
    assert_400(gen(url, keep_alive=[5]), "keep_alive must be a duration")
    assert_400(gen(url, keep_alive="5 parsecs"), "invalid keep_alive duration")
    assert_400(gen(url, keep_alive=True), "keep_alive must be a duration")
    for forever in (-1, "-1s", "99999999999h", 1e300):  # Ollama: negative keeps the model loaded
        r = gen(url, keep_alive=forever, options={"num_predict": 1})
        assert r.status_code == 200, (forever, r.text)
    ps = httpx.get(url + "/api/ps", timeout=10).json()["models"]
    assert ps and ps[0]["expires_at"] > "2100"


@pytest.mark.parametrize("option,bad", [("temperature", -1), ("temperature", 1e9), ("temperature", "hot"),
                                        ("top_p", 1.5), ("top_p", -0.1), ("min_p", 2), ("top_k", -2),
                                        ("top_k", 10**12), ("repeat_penalty", -2), ("repeat_last_n", -5),
                                        ("presence_penalty", 1e6), ("seed", "x"), ("num_keep", -9),
                                        ("stop", 5), ("stop", ["x"] * 100), ("stop", "x" * 2000),
                                        # accepted without effect, but type-checked as Ollama does
                                        ("num_thread", "x"), ("num_batch", True), ("num_gpu", 1.5),
                                        ("mirostat", "2"), ("mirostat_tau", "x"), ("tfs_z", [1]),
                                        ("penalize_newline", "x"), ("use_mmap", 1)])
def test_option_values(url: str, option: str, bad: Any) -> None:
    r = gen(url, options={option: bad})
    assert r.status_code == 400, (option, bad, r.text)
    assert option in r.json()["error"]


def test_inert_options_take_any_number_and_change_nothing(url: str) -> None:
    """num_thread, num_batch, num_gpu and mirostat have no effect here: a negative or huge value is
    accepted (as Ollama accepts it) and starts no threads, allocates nothing."""
    import threading

    before = threading.active_count()
    for value in (-1, 10**9):
        r = gen(url, options={"num_thread": value, "num_batch": value, "num_gpu": value, "mirostat": value,
                              "mirostat_tau": float(value), "num_predict": 1})
        assert r.status_code == 200, (value, r.text)
    assert threading.active_count() <= before + 2


def test_repeat_penalty_zero_is_no_penalty_on_both_protocols(url: str) -> None:
    """The limits accepted repeat_penalty 0 and the sampler then refused it (a 400 saying "> 0"); both
    now read 0 as no penalty: the greedy answer equals the one at 1. Negative stays a 400."""
    def text(path: str, penalty: float) -> str:
        if path == "/api/generate":
            r = gen(url, raw=True, options={"repeat_penalty": penalty, "temperature": 0, "num_predict": 12})
            assert r.status_code == 200, r.text
            return r.json()["response"]
        r = gen(url, "/v1/completions", prompt="hello", repeat_penalty=penalty, temperature=0, max_tokens=12)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]

    for path in ("/api/generate", "/v1/completions"):
        assert text(path, 0) == text(path, 1.0)
    assert_400(gen(url, options={"repeat_penalty": -0.5}), "repeat_penalty")


def test_top_k_minus_one_is_no_limit_as_zero_is(url: str) -> None:
    """Ollama hands top_k to llama.cpp, where 0 or less is no limit, and SamplingOptions and the chat
    take -1 as that; the limits refused -1 with a 400. A seeded sample at -1 now equals one at 0."""
    def answer(k: int) -> str:
        r = gen(url, raw=True, options={"top_k": k, "temperature": 1.5, "seed": 3, "num_predict": 12})
        assert r.status_code == 200, r.text
        return r.json()["response"]

    assert answer(-1) == answer(0)
    r = gen(url, "/v1/completions", prompt="hello", top_k=-1, temperature=1.5, seed=3, max_tokens=12)
    assert r.status_code == 200, r.text
    assert_400(gen(url, "/v1/completions", prompt="hi", repeat_penalty=-0.5), "repeat_penalty")


def test_null_options_keep_their_defaults(url: str) -> None:
    r = gen(url, options={"num_predict": None, "num_ctx": None, "temperature": None}, raw=True)
    assert r.status_code == 200 and r.json()["eval_count"] >= 1


def test_openai_sampling_values(url: str) -> None:
    msgs = [{"role": "user", "content": "hi"}]
    assert_400(gen(url, "/v1/chat/completions", messages=msgs, temperature=-1), "temperature")
    assert_400(gen(url, "/v1/chat/completions", messages=msgs, top_p=7), "top_p")
    assert_400(gen(url, "/v1/chat/completions", messages=msgs, max_tokens="5"), "max_tokens")
    assert_400(gen(url, "/v1/chat/completions", messages=msgs, max_tokens=-5), "max_tokens")
    assert gen(url, "/v1/chat/completions", messages=msgs, max_tokens=2, temperature=1.5).status_code == 200


def test_openai_refuses_an_unknown_role_n_above_one_and_logit_bias(url: str) -> None:
    """Found by QA: OpenAI chat took any role and ignored logit_bias; now 400s naming what is refused."""
    unload(url)  # not left loaded with an earlier test's small num_ctx
    chat, hi = "/v1/chat/completions", [{"role": "user", "content": "hi"}]
    assert_400(gen(url, chat, messages=[*hi, {"role": "wizard", "content": "x"}]),
               "messages[1].role 'wizard' is not a supported role")
    for path, fields in ((chat, {"messages": hi}), ("/v1/completions", {"prompt": "hi"})):
        assert_400(gen(url, path, n=2, **fields), "n=2 is not supported")
        assert_400(gen(url, path, n=0, **fields), "n=0 is not supported")
        assert_400(gen(url, path, logit_bias={"5": 10}, **fields), "logit_bias is not supported")
        assert_400(gen(url, path, logit_bias=[5], **fields), "logit_bias must be an object")
        r = gen(url, path, n=1, logit_bias={}, max_tokens=1, **fields)  # the defaults are accepted
        assert r.status_code == 200, r.text
    roles = [{"role": r, "content": "x"} for r in ("system", "developer", "user", "assistant", "tool")]
    r = gen(url, chat, messages=roles, max_tokens=1)
    assert r.status_code == 200, r.text
    r = gen(url, "/api/chat", messages=[{"role": "wizard", "content": "x"}], options={"num_predict": 1})
    assert r.status_code == 200, r.text  # Ollama hands any role to the template


def test_openai_fields_it_cannot_honour_are_400s_naming_them_unless_at_their_default(url: str) -> None:
    """best_of=3 (and audio, functions, ...) were ignored silently: the answer was one plain candidate.
    Each is now a 400 whose OpenAI error names the field as ``param``; at its default it is accepted,
    and the official client's ordinary requests (and fields that cannot change the answer) still work."""
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    hi = [{"role": "user", "content": "hi"}]
    refusals = [("/v1/completions", {"prompt": "hi", "best_of": 3}, "best_of=3 is not supported"),
                ("/v1/completions", {"prompt": "hi", "n": 2}, "n=2 is not supported"),
                ("/v1/completions", {"prompt": "hi", "suffix": "x"}, "does not support suffix"),
                ("/v1/chat/completions", {"messages": hi, "logit_bias": {"5": 1}}, "logit_bias is not supported"),
                ("/v1/chat/completions", {"messages": hi, "audio": {"voice": "alloy", "format": "wav"}},
                 "audio is not supported"),
                ("/v1/chat/completions", {"messages": hi, "modalities": ["text", "audio"]},
                 "modalities is not supported"),
                ("/v1/chat/completions", {"messages": hi, "functions": [{"name": "f", "parameters": {}}]},
                 "functions is not supported: deprecated by OpenAI; use tools"),
                ("/v1/chat/completions", {"messages": hi, "function_call": {"name": "f"}}, "function_call"),
                ("/v1/chat/completions", {"messages": hi, "web_search_options": {}}, "web_search_options"),
                ("/v1/chat/completions", {"messages": hi, "verbosity": "low"}, 'verbosity="low" is not supported')]
    for path, fields, words in refusals:
        r = gen(url, path, **fields)
        assert_400(r, words)
        field = next(k for k in fields if k not in ("prompt", "messages"))
        assert r.json()["error"]["param"] == field and r.json()["error"]["code"] == "unsupported_value", r.text
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="hi", max_tokens=2, best_of=2)
    assert e.value.param == "best_of" and "best_of=2 is not supported" in e.value.message
    c = client.completions.create(model=MODEL, prompt="hi", max_tokens=2, best_of=1, n=1, logit_bias={}, user="u")
    assert c.choices[0].finish_reason in ("length", "stop")
    o = client.chat.completions.create(model=MODEL, messages=hi, max_tokens=2, n=1, modalities=["text"],
                                       store=False, metadata={"k": "v"}, user="u", service_tier="auto",
                                       verbosity="medium", prediction={"type": "content", "content": "hi"})
    assert o.choices[0].message.role == "assistant"
    assert gen(url, "/v1/chat/completions", messages=hi, max_tokens=1, functions=[], function_call="none",
               audio=None).status_code == 200


def test_openai_seed_negative_is_random_and_not_an_integer_is_400(url: str) -> None:
    """A negative seed was handed to the sampler as is (a 500); it means random, as in Ollama's options."""
    from llmedge.server.openai import parse_sampling

    assert parse_sampling({"seed": -1})["sampling"] == {"seed": None}
    assert parse_sampling({"seed": 7})["sampling"] == {"seed": 7}
    for path, fields in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                         ("/v1/completions", {"prompt": "hi"})):
        for seed in (-1, -(2**63 - 1)):
            r = gen(url, path, seed=seed, max_tokens=2, **fields)
            assert r.status_code == 200, (path, seed, r.text)
        assert_400(gen(url, path, seed=2.5, max_tokens=2, **fields), "option seed must be an integer")
        assert_400(gen(url, path, seed="7", max_tokens=2, **fields), "option seed must be a number, not str")
        assert_400(gen(url, path, seed=True, max_tokens=2, **fields), "option seed must be a number, not bool")


def prompt_tokens_evaluated(url: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("llmedge_prompt_tokens_total "):
            return float(line.split()[1])
    raise AssertionError("llmedge_prompt_tokens_total is not in /metrics")


def test_prompt_eval_count_is_the_whole_prompt_cached_part_included(url: str) -> None:
    """Ollama's prompt_eval_count is the prompt's length (after truncation to the context), whether or not
    a cached prefix spared evaluating part of it; it used to count only the uncached tokens."""
    for path, fields in (("/api/generate", {"prompt": "hello world " * 20, "raw": True}),
                         ("/api/chat", {"messages": [{"role": "user", "content": "hello world " * 20}]})):
        first = gen(url, path, options={"num_predict": 1}, **fields).json()
        before = prompt_tokens_evaluated(url)
        again = gen(url, path, options={"num_predict": 1}, **fields).json()
        assert prompt_tokens_evaluated(url) - before < first["prompt_eval_count"]  # the prefix was reused
        assert again["prompt_eval_count"] == first["prompt_eval_count"] > 20, (path, first, again)
    r = gen(url, prompt="hello " * 2000, raw=True, options={"num_ctx": 64, "num_predict": 2})
    assert 32 <= r.json()["prompt_eval_count"] <= 64  # the prompt as cut to the context, as Ollama counts it


def loaded_models(url: str) -> list[dict[str, Any]]:
    return httpx.get(url + "/api/ps", timeout=10).json()["models"]


def unload(url: str) -> None:
    assert gen(url, prompt="", keep_alive=0).json()["done_reason"] == "unload"
    assert loaded_models(url) == []


def test_a_request_that_fails_or_is_cancelled_after_loading_still_applies_keep_alive(url: str) -> None:
    """A request that failed once its model was loaded (here: a token id out of range, found by prepare)
    or whose client went away left the model loaded forever: keep_alive was applied only on success."""
    unload(url)
    assert_400(gen(url, context=[10**6], keep_alive=0), "out of range")
    assert loaded_models(url) == []
    assert_400(gen(url, context=[10**6], keep_alive="1m"), "out of range")
    ps = loaded_models(url)
    assert len(ps) == 1 and ps[0]["expires_at"] < "2100", ps  # not "forever"
    unload(url)
    body = {"model": MODEL, "prompt": "hello", "raw": True, "keep_alive": 0,
            "options": {"num_predict": 100000, "num_ctx": 64}}  # runs until the client goes away
    with httpx.Client(timeout=60) as client, client.stream("POST", url + "/api/generate", json=body) as r:
        assert r.status_code == 200
        next(r.iter_lines())
    deadline = time.monotonic() + 5
    while loaded_models(url) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert loaded_models(url) == []


def test_infinite_and_nan_values_are_400_not_500(url: str) -> None:
    """Found by the requests fuzzer: num_ctx=Infinity reached int() in check_ctx (OverflowError, a 500).
    JSON has no NaN or Infinity; the body parser now refuses them, and check_ctx refuses them too."""
    from types import SimpleNamespace

    from llmedge.server.scheduler import Scheduler
    from llmedge.server.security import HTTPError

    for raw in (b'{"model": "tiny", "prompt": "x", "options": {"num_ctx": Infinity}}',
                b'{"model": "tiny", "prompt": "x", "keep_alive": NaN}'):
        r = httpx.post(url + "/api/generate", content=raw, timeout=30)
        assert_400(r, "is not valid JSON")
    for v in (float("inf"), float("-inf"), float("nan")):
        with pytest.raises(HTTPError) as info:
            Scheduler.check_ctx(SimpleNamespace(max_ctx=4096), v)  # type: ignore[arg-type]
        assert info.value.status == 400


def test_openai_reply_that_fills_the_context_ends_with_length_instead_of_shifting(url: str) -> None:
    """At a full context the Ollama routes shift it (drop half the history) and go on, as Ollama does; the
    OpenAI routes end the reply with finish_reason "length", as OpenAI and llama.cpp's server do."""
    prompt = "hello " * 4
    with running_server(parallel=1, num_ctx=64) as small:  # OpenAI requests run at the server's context
        ol = gen(small, prompt=prompt, raw=True, options={"num_predict": 120, "temperature": 0})
        assert ol.status_code == 200, ol.text
        o = ol.json()
        assert o["prompt_eval_count"] + o["eval_count"] > 64, o  # greedy tokens run past the context: shifted
        r = gen(small, "/v1/completions", prompt=prompt, max_tokens=120, temperature=0)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["choices"][0]["finish_reason"] == "length", body
        # the last token is sampled from a full context of 64 and never stored: 65 in all, not 120 + prompt
        assert body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"] == 65, body["usage"]


def test_a_request_without_num_ctx_does_not_inherit_an_earlier_requests_small_context(url: str) -> None:
    """Found by QA: after an Ollama request loaded the model with num_ctx 64, OpenAI requests (which
    cannot set num_ctx) ran at 64 and refused a 100-token prompt. Now the model is loaded again at the
    server's default context (here the tiny model's 256), as Ollama reloads; a larger loaded context
    is kept (no reload)."""
    unload(url)
    assert gen(url, options={"num_ctx": 64, "num_predict": 1}).status_code == 200
    assert [m["context_length"] for m in httpx.get(url + "/api/ps").json()["models"]] == [64]
    prompt = [5] * 100
    r = gen(url, "/v1/completions", prompt=prompt, max_tokens=1)
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 100, r.text
    r = gen(url, prompt="hello " * 100, raw=True, options={"num_predict": 1})  # Ollama's, no num_ctx: not cut to 64
    assert r.status_code == 200 and r.json()["prompt_eval_count"] > 64, r.text
    assert [m["context_length"] for m in httpx.get(url + "/api/ps").json()["models"]] == [256]
    assert gen(url, options={"num_ctx": 64, "num_predict": 1}).status_code == 200  # an explicit one still wins
    assert [m["context_length"] for m in httpx.get(url + "/api/ps").json()["models"]] == [64]
    unload(url)


def test_show_lists_embedding_only_for_a_model_with_a_pooling_type(url: str, tmp_path: Path) -> None:
    """/api/show listed "embedding" for every model; Ollama lists it for a GGUF that sets
    {arch}.pooling_type (an embedding model) and "completion" otherwise. Both still embed."""
    from llmedge.store import Store

    Store().create("tiny-embed:latest", tiny_model().kv("llama.pooling_type", U32, 1).write(tmp_path / "e.gguf"))
    for name, caps in ((MODEL, ["completion"]), ("tiny-embed:latest", ["embedding"])):
        r = httpx.post(url + "/api/show", json={"model": name}, timeout=30)
        assert r.status_code == 200 and r.json()["capabilities"] == caps, r.text
        r = httpx.post(url + "/api/embed", json={"model": name, "input": "hello"}, timeout=60)
        assert r.status_code == 200 and len(r.json()["embeddings"]) == 1, r.text


def test_an_embedding_model_does_not_generate_with_ollamas_errors(url: str, tmp_path: Path) -> None:
    """llmedge generated text with an embedding model (a GGUF with {arch}.pooling_type); Ollama refuses
    (routes.go: CheckCapabilities, then 400 '"name" does not support generate' / 'chat', the name %q
    as the client wrote it), a load request too, and its OpenAI middleware gives the same message in
    OpenAI's error object. An unload is still answered, and the model still embeds."""
    from llmedge.store import Store

    Store().create("tiny-embed:latest", tiny_model().kv("llama.pooling_type", U32, 1).write(tmp_path / "e.gguf"))
    hi = [{"role": "user", "content": "hi"}]
    for name in ("tiny-embed", "tiny-embed:latest"):
        for path, fields, what in (("/api/generate", {"prompt": "hi"}, "generate"),
                                   ("/api/generate", {"prompt": "hi", "stream": True}, "generate"),
                                   ("/api/generate", {"prompt": "hi", "raw": True}, "generate"),
                                   ("/api/generate", {}, "generate"),  # a load request
                                   ("/api/chat", {"messages": hi}, "chat"), ("/api/chat", {}, "chat")):
            r = httpx.post(url + path, json={"model": name, "stream": False, **fields}, timeout=30)
            assert r.status_code == 400 and r.json() == {"error": f'"{name}" does not support {what}'}, r.text
        for path, fields, what in (("/v1/chat/completions", {"messages": hi}, "chat"),
                                   ("/v1/completions", {"prompt": "hi"}, "generate")):
            r = httpx.post(url + path, json={"model": name, **fields}, timeout=30)
            assert r.status_code == 400, r.text
            assert r.json() == {"error": {"message": f'"{name}" does not support {what}',
                                          "type": "invalid_request_error", "param": None, "code": None}}, r.text
    r = gen(url, model="tiny-embed", prompt="", keep_alive=0)
    assert r.status_code == 200 and r.json()["done_reason"] == "unload", r.text
    r = httpx.post(url + "/api/embed", json={"model": "tiny-embed", "input": "hello"}, timeout=60)
    assert r.status_code == 200 and len(r.json()["embeddings"]) == 1, r.text
    assert gen(url, options={"num_predict": 1}).status_code == 200  # a completion model still generates
