"""Thinking in the terminal: ``/set think`` / ``/set nothink`` in the chat and ``llmedge run --think``,
on SmolLM2 under a DeepSeek-R1-style template (the prompt opens ``<think>``): the reasoning is shown
between Ollama's "Thinking..." lines and kept out of the remembered answer; a model whose template has no
reasoning refuses with Ollama's message."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from llmedge.cli.chat import ChatSession
from llmedge.template import ChatTemplate

THINK_TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and enable_thinking %}<think>\n{% endif %}{% endif %}")


@pytest.fixture(scope="module")
def model(smollm2_path: Path):
    import llmedge

    return llmedge.load(str(smollm2_path), n_ctx=512)


def _session(model, **kw) -> tuple[ChatSession, io.StringIO]:
    out = io.StringIO()
    s = ChatSession(model, Console(file=out, width=100, color_system=None), out=out, **kw)
    s.handle("/set parameter temperature 0")
    s.handle("/set parameter num_predict 6")
    return s, out


def test_set_think_shows_reasoning_apart_and_nothink_answers_plainly(model) -> None:
    plain = model.template
    model.template = ChatTemplate(THINK_TEMPLATE, bos_token=plain.bos_token, eos_token=plain.eos_token,
                                  tokenizer=model.tokenizer)
    try:
        s, out = _session(model)
        s.handle("/set think")
        assert "Set 'think' mode." in out.getvalue()
        s.ask("Why is the sky blue?")
        assert s.prompt_text.endswith("<think>\n") and "Thinking...\n" in out.getvalue()
        assert s.messages[-1] == {"role": "assistant", "content": ""}  # SmolLM2 never closes </think>
        s.handle("/set nothink")
        s.handle("/clear")
        answer = s.ask("Why is the sky blue?")
        assert not s.prompt_text.endswith("<think>\n") and answer and s.messages[-1]["content"] == answer
        s.handle("/set think high")
        assert s.think == "high" and "Set 'think' mode to 'high'." in out.getvalue()
    finally:
        model.template = plain


def test_set_think_on_a_model_without_reasoning_is_refused(model) -> None:
    s, out = _session(model)
    s.handle("/set think")
    assert f'Error: "{model.name}" does not support thinking' in out.getvalue() and s.think is None


def test_run_think_on_a_model_without_reasoning_is_one_line_error(smollm2_path: Path, tmp_path: Path) -> None:
    env = {**os.environ, "LLMEDGE_MODELS": str(tmp_path / "store")}
    res = subprocess.run([sys.executable, "-m", "llmedge.cli.main", "run", str(smollm2_path), "hi", "--think"],
                         capture_output=True, text=True, env=env, timeout=120, stdin=subprocess.DEVNULL)
    assert res.returncode == 1 and res.stderr.strip().endswith("does not support thinking")
    assert len(res.stderr.strip().splitlines()) == 1


def test_run_think_prints_the_reasoning_between_ollamas_lines(smollm2_path: Path, tmp_path: Path) -> None:
    env = {**os.environ, "LLMEDGE_MODELS": str(tmp_path / "store")}
    modelfile = tmp_path / "Modelfile"
    modelfile.write_text(f'FROM {smollm2_path}\nTEMPLATE """{THINK_TEMPLATE}"""\n')

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "llmedge.cli.main", *args], capture_output=True, text=True,
                              env=env, timeout=120, stdin=subprocess.DEVNULL)

    assert cli("create", "thinky", "-f", str(modelfile)).returncode == 0
    res = cli("run", "thinky", "Why?", "--think", "--temperature", "0", "--num-predict", "6")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("Thinking...\n") and len(res.stdout) > len("Thinking...\n\n")
    plain = cli("run", "thinky", "Why?", "--no-think", "--temperature", "0", "--num-predict", "6")
    assert plain.returncode == 0 and "Thinking..." not in plain.stdout and plain.stdout.strip()
