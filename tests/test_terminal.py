"""The terminal chat driven in a real terminal: tmux runs ``llmedge run MODEL`` and the screen is read back.

Each step types into the pane (``send-keys``), then polls ``capture-pane`` until what a user waits for
is on the screen (with a deadline; no fixed sleeps). The answers the screen must show come from the
same chat code run headless in this process (same model, same turns, greedy), rendered as Markdown
at the pane's width. HOME and the XDG folders live under tmp_path, and so does the store
(``LLMEDGE_MODELS``: sessions are saved there); the model is passed as a path.
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

WIDTH, HEIGHT = 100, 40
PLACEHOLDER = ">>> Send a message (/? for help)"
CTX = 2048


def _tmux() -> str:
    path = shutil.which("tmux")
    if path is None:
        pytest.fail("tmux is needed for the terminal tests (apt-get install -y tmux)")
    return path


class Terminal:
    """One tmux server on a private socket running one command in a WIDTH x HEIGHT pane."""

    def __init__(self, workdir: Path, command: str, env: dict[str, str]) -> None:
        self.tmux = _tmux()
        self.sock = str(workdir / "tmux.sock")
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        # The pane stays after the command so its exit status can be read off the screen.
        script = f"env {exports} {command}; echo \"[exited $?]\"; sleep 300"
        subprocess.run([self.tmux, "-S", self.sock, "-f", "/dev/null", "new-session", "-d", "-s", "chat",
                        "-x", str(WIDTH), "-y", str(HEIGHT), script],
                       check=True, env={**os.environ, **env})

    def tmux_cmd(self, *args: str) -> str:
        return subprocess.run([self.tmux, "-S", self.sock, *args], check=True, capture_output=True,
                              text=True).stdout

    def keys(self, *keys: str) -> None:
        self.tmux_cmd("send-keys", "-t", "chat", *keys)

    def type(self, text: str) -> None:
        """Type ``text`` literally, then Enter."""
        self.tmux_cmd("send-keys", "-t", "chat", "-l", text)
        self.keys("Enter")

    def screen(self) -> list[str]:
        """The visible screen, lines without trailing blanks."""
        return [line.rstrip() for line in self.tmux_cmd("capture-pane", "-p", "-t", "chat").split("\n")]

    def everything(self) -> list[str]:
        """Scrollback and screen."""
        out = self.tmux_cmd("capture-pane", "-p", "-t", "chat", "-S", "-")
        return [line.rstrip() for line in out.split("\n")]

    def wait(self, ready: Callable[[list[str]], bool], what: str, timeout: float = 30.0,
             whole: bool = False) -> list[str]:
        deadline = time.monotonic() + timeout
        while True:
            lines = self.everything() if whole else self.screen()
            if ready(lines):
                return lines
            if time.monotonic() > deadline:
                shown = "\n".join(self.everything()[-60:])
                pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}; the screen:\n{shown}")
            time.sleep(0.05)

    def submit(self, text: str, timeout: float = 30.0) -> list[str]:
        """Type a line and wait until its output is complete (the empty prompt is back below it).

        Returns the lines printed after the typed line (continuation lines included).
        """
        first = text.split("\n")[0]
        before = self.everything().count(">>> " + first)
        for i, line in enumerate(text.split("\n")):
            if i:
                self.keys("Enter")
            self.tmux_cmd("send-keys", "-t", "chat", "-l", line)
        self.keys("Enter")

        def done(lines: list[str]) -> bool:
            return lines.count(">>> " + first) > before and _last(lines) == PLACEHOLDER

        lines = self.wait(done, f"the output of {text!r}", timeout, whole=True)
        start = len(lines) - 1 - lines[::-1].index(">>> " + first)
        body = lines[start + 1:]
        while body and body[-1] in ("", PLACEHOLDER):
            body.pop()
        return body

    def close(self) -> None:
        subprocess.run([self.tmux, "-S", self.sock, "kill-server"], capture_output=True)


def _last(lines: list[str]) -> str:
    filled = [line for line in lines if line.strip()]
    return filled[-1] if filled else ""


def _rendered(markdown: str) -> list[str]:
    """The lines rich prints for ``markdown`` at the pane's width, as capture-pane reads them back."""
    from rich.console import Console
    from rich.markdown import Markdown

    buf = io.StringIO()
    Console(file=buf, width=WIDTH, color_system=None, force_terminal=False).print(Markdown(markdown))
    lines = [line.rstrip() for line in buf.getvalue().split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _contains_block(lines: list[str], block: list[str]) -> bool:
    n = len(block)
    return any(lines[i:i + n] == block for i in range(len(lines) - n + 1))


@pytest.fixture
def chat_env(tmp_path: Path) -> dict[str, str]:
    dirs = {k: tmp_path / k.lower() for k in ("HOME", "XDG_DATA_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME",
                                               "LLMEDGE_MODELS")}
    for d in dirs.values():
        d.mkdir()
    return {**{k: str(v) for k, v in dirs.items()}, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


@pytest.fixture
def terminals(tmp_path: Path):
    opened: list[Terminal] = []

    def start(name: str, command: str, env: dict[str, str]) -> Terminal:
        workdir = tmp_path / name
        workdir.mkdir()
        term = Terminal(workdir, command, env)
        opened.append(term)
        return term

    yield start
    for term in opened:
        term.close()


def _headless_answers(model_path: Path, turns: list[str]) -> list[str]:
    """The answers the chat gives to ``turns`` (commands included), computed without a terminal."""
    from rich.console import Console

    import llmedge
    from llmedge.cli.chat import ChatSession, unwrap

    m = llmedge.load(str(model_path), n_ctx=CTX)
    out = io.StringIO()
    session = ChatSession(m, Console(file=out, width=WIDTH, color_system=None), out=out)
    answers = []
    for text in turns:
        if text.startswith("/"):
            session.handle(text)
        else:
            answers.append(session.ask(unwrap(text)) or "")
    return answers


def test_chat_in_a_real_terminal(smollm2_path: Path, chat_env: dict[str, str], terminals, tmp_path: Path):
    q1 = "What is the capital of France? Answer in one word."
    q2 = "And of Germany?"
    multi = '"""\nName three colors.\nReply in one line.\n"""'
    setup = ["/set parameter temperature 0", "/set parameter num_predict 48"]
    expected = _headless_answers(smollm2_path, [*setup, q1, q2, multi])
    assert all(a.strip() for a in expected), expected

    command = (f"{shlex.quote(sys.executable)} -m llmedge.cli.main run {shlex.quote(str(smollm2_path))} "
               f"--ctx {CTX}")
    term = terminals("first", command, chat_env)
    term.wait(lambda s: _last(s) == PLACEHOLDER, "the prompt after loading", timeout=60)

    # Commands answer as Ollama's do.
    assert term.submit(setup[0]) == ["Set parameter 'temperature' to '0'"]
    assert term.submit(setup[1]) == ["Set parameter 'num_predict' to '48'"]
    info = term.submit("/show info")
    assert "  Model" in info
    assert re.search(r"^\s+architecture\s+llama$", "\n".join(info), re.M), info
    assert re.search(r"^\s+quantization\s+Q4_1$", "\n".join(info), re.M), info
    assert re.search(r"^\s+context\s+2048 tokens", "\n".join(info), re.M), info
    assert "Available Commands:" in term.submit("/?")
    assert term.submit("/nonsense") == ["Unknown command '/nonsense'. Type /? for help"]
    assert term.submit("/set nonsense") == ["Unknown command '/set nonsense'. Type /? for help"]
    assert term.submit("/load nosuchmodel:1b") == ["Error: no saved session or model named 'nosuchmodel:1b'"]

    # Two turns: each answer is on the screen, rendered, and the second one used the first.
    for question, answer in ((q1, expected[0]), (q2, expected[1])):
        body = term.submit(question)
        assert _contains_block(body, _rendered(answer)), (body, answer)

    # Multi-line input: continuation prompts while typing, then one message.
    body = term.submit(multi)
    assert body[:3] == ["... Name three colors.", "... Reply in one line.", '... """'], body
    assert _contains_block(body, _rendered(expected[2])), (body, expected[2])

    # Ctrl-C in the middle of a long answer: back at the prompt at once, the chat goes on.
    assert term.submit("/set parameter num_predict 400") == ["Set parameter 'num_predict' to '400'"]
    story = "Write a long poem about the sea, at least forty lines."  # greedy, this runs to num_predict
    term.type(story)

    def answering(lines: list[str]) -> bool:
        if ">>> " + story not in lines:
            return False
        after = lines[lines.index(">>> " + story) + 1:]
        return sum(len(line.strip()) for line in after) >= 20  # some text streamed (words or digits)

    term.wait(answering, "the answer to start")
    t_interrupt = time.monotonic()
    term.keys("C-c")
    lines = term.wait(lambda s: _last(s) == PLACEHOLDER, "the prompt after Ctrl-C", timeout=10)
    stopped_in = time.monotonic() - t_interrupt
    partial = lines[lines.index(">>> " + story) + 1:]
    assert any(line.strip() for line in partial[:-1]), "the partial answer should stay on the screen"
    # Had the answer been complete already, the Ctrl-C would have reached the prompt and its hint.
    assert "Use Ctrl + d or /bye to exit." not in partial, partial
    assert "Traceback" not in "\n".join(term.everything())

    assert term.submit("/set parameter num_predict 48") == ["Set parameter 'num_predict' to '48'"]
    assert "invalid session name" in term.submit("/save ../escape")[0]
    assert term.submit("/save s1") == ["Saved session 's1' (8 messages)"]
    saved = json.loads((Path(chat_env["LLMEDGE_MODELS"]) / "sessions" / "s1.json").read_text())
    assert [m["content"] for m in saved["messages"][:2]] == [q1, expected[0]]
    assert saved["messages"][4]["content"] == "Name three colors.\nReply in one line."
    assert saved["parameters"] == {"num_predict": 48, "temperature": 0.0}
    interrupted = saved["messages"][7]
    assert interrupted["role"] == "assistant" and interrupted["content"].strip()
    import llmedge

    n_partial = len(llmedge.load(str(smollm2_path), n_ctx=64).tokenize(interrupted["content"]))
    assert n_partial < 300, f"Ctrl-C took {stopped_in:.1f}s and let {n_partial} tokens through"

    # The chat continues after the interruption, with timings once verbose.
    assert term.submit("/set verbose") == ["Set 'verbose' mode."]
    body = term.submit("Say hello.")
    counts = [int(m.group(1)) for m in (re.match(r"prompt eval count:\s+(\d+) token", x) for x in body) if m]
    assert len(counts) == 1 and 0 < counts[0] < 40, body  # only the new turn is evaluated
    for label in ("total duration:", "load duration:", "prompt eval duration:", "prompt eval rate:",
                  "eval count:", "eval duration:", "eval rate:"):
        assert any(line.startswith(label) for line in body), (label, body)

    assert term.submit("/clear") == ["Cleared session context"]
    term.keys("C-c")
    term.wait(lambda s: "Use Ctrl + d or /bye to exit." in s, "the hint after Ctrl-C at the prompt")
    term.type("/bye")
    term.wait(lambda s: "[exited 0]" in s, "llmedge to exit with status 0")

    history = (Path(chat_env["XDG_DATA_HOME"]) / "llmedge" / "history").read_text()
    assert "+/bye" in history and '+"""' in history and "+Reply in one line." in history

    # A new run: the history is there (Up recalls the last input), /load restores the conversation.
    term2 = terminals("second", command, chat_env)
    term2.wait(lambda s: _last(s) == PLACEHOLDER, "the prompt after loading", timeout=60)
    term2.keys("Up")
    term2.wait(lambda s: _last(s) == ">>> /bye", "the last input recalled by Up")
    term2.keys("C-u")
    term2.wait(lambda s: _last(s) == PLACEHOLDER, "the cleared line")
    body = term2.submit("/load s1")
    assert body[0] == ">>> " + q1 and _contains_block(body, _rendered(expected[0])), body
    assert re.match(r"Loaded session 's1' \(8 messages; (KV state restored|history evaluated: \d+ tokens)",
                    body[-1]), body
    assert term2.submit("/show parameters")[:3] == ["User defined parameters:", f"{'num_predict':<30} 48",
                                                    f"{'temperature':<30} 0"]
    term2.submit("/set verbose")
    body = term2.submit("Thanks!")
    counts = [int(m.group(1)) for m in (re.match(r"prompt eval count:\s+(\d+) token", x) for x in body) if m]
    assert len(counts) == 1 and 0 < counts[0] < 40, body  # the loaded history was not evaluated again
    term2.keys("C-d")
    term2.wait(lambda s: "[exited 0]" in s, "llmedge to exit on Ctrl-D")
