"""The context a model is loaded at, decided as Ollama decides it: an explicit one (the ``load``
argument, ``run --ctx``, ``/set parameter num_ctx``) first, else the model's num_ctx PARAMETER, else
4096; never more than the model's training context. Checked through ``llmedge.load``, ``llmedge run``
(a real subprocess, and in-process for the chat's reload) and the chat's ``/load``.
The server's side is in test_server_defaults.py."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from tiny_gguf import write_tiny_llama

import llmedge
from llmedge.cli.chat import ChatSession
from llmedge.defaults import load_context, parameter_num_ctx
from llmedge.sampling import OptionError
from llmedge.store import Store

TINY_TRAIN = 256  # write_tiny_llama's training context


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    """A tmp store holding `small` (PARAMETER num_ctx 64), `huge` (num_ctx 100000) and `plain` (none),
    all the tiny model."""
    root = tmp_path / "store"
    monkeypatch.setenv("LLMEDGE_MODELS", str(root))
    gguf = write_tiny_llama(tmp_path / "tiny.gguf")
    s = Store(root)
    s.create("small", gguf, {"parameters": {"num_ctx": 64}})
    s.create("huge", gguf, {"parameters": {"num_ctx": 100000}})
    s.create("plain", gguf)
    return s


def test_the_rule() -> None:
    assert load_context(None, {"parameters": {"num_ctx": 1024}}) == 1024
    assert load_context(2048, {"parameters": {"num_ctx": 1024}}) == 2048  # explicit wins
    assert load_context(0, {"parameters": {"num_ctx": 1024}}) == 0  # 0: the training context, explicitly
    assert load_context(None, {}) == 4096 and load_context(None, {}, default=512) == 512
    assert load_context(None, {"parameters": {"num_ctx": 2048.0}}) == 2048  # JSON from a registry
    for bad in (True, 4, 10.5, "1024", float("inf"), float("nan")):
        assert parameter_num_ctx({"parameters": {"num_ctx": bad}}) is None


def test_show_takes_its_context_by_the_same_rule() -> None:
    """`show`'s KV cache figure (cli.models.run_context) had its own copy of the rule, which raised
    OverflowError / ValueError on a registry's num_ctx of Infinity or NaN; now it asks load_context's."""
    from llmedge.cli.models import DEFAULT_CTX, run_context
    from llmedge.defaults import DEFAULT_NUM_CTX

    assert DEFAULT_CTX == DEFAULT_NUM_CTX
    words = {"given": "--ctx", "parameter": "the model's num_ctx", "default": "the default"}
    for given in (None, 64, 0):
        for value in (None, 1024, 2048.0, 4, 10.5, True, "1024", float("inf"), float("nan")):
            config = {"parameters": {} if value is None else {"num_ctx": value}}
            want = "given" if given is not None else "default" if parameter_num_ctx(config) is None else "parameter"
            assert run_context(given, config) == (load_context(given, config), words[want]), (given, value)


def test_load_uses_the_models_num_ctx_unless_told_otherwise(store: Store) -> None:
    assert llmedge.load("small", backend="numpy").n_ctx == 64
    assert llmedge.load("small", backend="numpy", n_ctx=128).n_ctx == 128
    assert llmedge.load("small", backend="numpy", n_ctx=0).n_ctx == TINY_TRAIN
    assert llmedge.load("huge", backend="numpy").n_ctx == TINY_TRAIN  # capped, as an n_ctx above it is
    assert llmedge.load("plain", backend="numpy").n_ctx == TINY_TRAIN  # 4096, capped
    with pytest.raises(OptionError, match=r"n_ctx must be an integer >= 0 or None \(0: the model's training "):
        llmedge.load("small", backend="numpy", n_ctx="64")


def test_run_answers_within_the_models_num_ctx_and_ctx_overrides_it(smollm2_path: Path, tmp_path: Path) -> None:
    """--no-shift stops the answer at a full context: its size shows in the token counts (120 tokens
    asked for, more than either context holds)."""
    env = {**os.environ, "LLMEDGE_MODELS": str(tmp_path / "store")}
    Store(tmp_path / "store").create("counter", smollm2_path, {"parameters": {"num_ctx": 64}})

    def used(*extra: str) -> int:
        res = subprocess.run([sys.executable, "-m", "llmedge.cli.main", "run", "counter", "Count from 1 to 1000:",
                              "--temperature", "0", "--num-predict", "120", "--no-shift", "--verbose", *extra],
                             capture_output=True, text=True, env=env, timeout=120, stdin=subprocess.DEVNULL)
        assert res.returncode == 0, res.stderr
        counts = [int(x.split(":")[1].split()[0]) for x in res.stderr.splitlines() if "eval count" in x]
        return sum(counts)

    assert 48 < used() <= 64 + 1
    assert 80 < used("--ctx", "96") <= 96 + 1


def test_run_and_its_chat_reloads_keep_ctx_over_the_parameter(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    import llmedge.cli.chat as chat_module
    import llmedge.cli.run as run_module

    started: dict = {}
    monkeypatch.setattr(run_module, "prompt_with_stdin", lambda prompt: None)  # as on a terminal
    monkeypatch.setattr(chat_module, "chat", lambda m, params, **kw: started.update(kw, model=m))
    run_module.run("small", None, backend="numpy")
    assert started["model"].n_ctx == 64
    assert started["reload"](None, "plain").n_ctx == TINY_TRAIN  # /load: that model's own default
    assert started["reload"](32, "plain").n_ctx == 32  # /set parameter num_ctx

    run_module.run("small", None, backend="numpy", ctx=128)
    assert started["model"].n_ctx == 128
    assert started["reload"](None, "plain").n_ctx == 128  # --ctx holds for a /load too


def _session(model, tmp_path: Path) -> tuple[ChatSession, io.StringIO]:
    out = io.StringIO()
    return ChatSession(model, Console(file=out, width=100, color_system=None), sessions=tmp_path / "sessions",
                       out=out), out


def test_chat_load_runs_a_model_at_its_own_num_ctx_unless_the_chat_set_one(store: Store, tmp_path: Path) -> None:
    s, out = _session(llmedge.load("plain", backend="numpy", n_ctx=32), tmp_path)
    s.handle("/load small")
    assert s.model.n_ctx == 64 and s.params["num_ctx"] == 64
    s.handle("/load huge")
    assert s.model.n_ctx == TINY_TRAIN
    s.handle("/show parameters")  # the context it runs at, not the PARAMETER's 100000
    assert f"{'num_ctx':<30} {TINY_TRAIN}\n" in out.getvalue() and "100000" not in out.getvalue()
    s.handle("/set parameter num_ctx 48")
    s.handle("/load small")
    assert s.model.n_ctx == 48 and "num_ctx" in s.user_set  # set in this chat: it stays, as in Ollama
    s.handle("/load plain")
    assert s.model.n_ctx == 48
