"""``llmedge run`` without a terminal (pipes, errors, --verbose) and the chat's logic run headless.

The piped answer must be exactly what the API generates; errors are one line on stderr with exit
status 1. The chat's commands, sessions, context fitting and Ctrl-C handling are driven through
:class:`llmedge.cli.chat.ChatSession` with a console writing into a buffer.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from llmedge.cli.chat import ChatSession, needs_more, parse_parameter, session_path, unwrap
from llmedge.engine import Chunk
from llmedge.errors import LlmedgeError


def _run(args: list[str], tmp_path: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "LLMEDGE_MODELS": str(tmp_path / "store")}
    return subprocess.run([sys.executable, "-m", "llmedge.cli.main", "run", *args], input=stdin,
                          capture_output=True, text=True, env=env, timeout=120,
                          stdin=None if stdin is not None else subprocess.DEVNULL)


@pytest.fixture(scope="module")
def model(smollm2_path: Path):
    import llmedge

    return llmedge.load(str(smollm2_path), n_ctx=1024)


_BY_BACKEND: dict[str, object] = {}


@pytest.fixture(params=["native", "mlx"])
def any_model(request, model, smollm2_path: Path):
    """The model on the default backend, then on MLX (its CPU build here): a few cheap cases of the
    command line and the chat run on both."""
    import llmedge

    if request.param == "native":
        return model
    if request.param not in _BY_BACKEND:
        _BY_BACKEND[request.param] = llmedge.load(str(smollm2_path), n_ctx=1024, backend=request.param)
    return _BY_BACKEND[request.param]


def _session(model, tmp_path: Path, **kw) -> tuple[ChatSession, io.StringIO]:
    out = io.StringIO()
    return ChatSession(model, Console(file=out, width=100, color_system=None), sessions=tmp_path / "sessions",
                       out=out, **kw), out


# -- the command line, piped -----------------------------------------------------------------------

def test_piped_prompt_prints_exactly_the_answer(smollm2_path: Path, model, tmp_path: Path):
    prompt = "Why is the sky blue?\n"
    want = "".join(c.text for c in model.generate(prompt, temperature=0, max_tokens=24)) + "\n"
    res = _run([str(smollm2_path), "--temperature", "0", "--num-predict", "24"], tmp_path, stdin=prompt)
    assert res.returncode == 0, res.stderr
    assert res.stdout == want
    assert res.stderr == ""  # no spinner, no colours when nothing is a terminal


def test_an_empty_prompt_loads_the_model_and_asks_nothing(smollm2_path: Path, tmp_path: Path):
    """As Ollama's run: an empty stdin (or "") is no question; the answer to nothing is not made up."""
    for args, stdin in (([str(smollm2_path)], ""), ([str(smollm2_path), ""], None)):
        res = _run([*args, "--temperature", "0", "--num-predict", "8"], tmp_path, stdin=stdin)
        assert res.returncode == 0, res.stderr
        assert res.stdout == "" and res.stderr == ""
    bad = _run(["nosuchmodel:7b"], tmp_path, stdin="")  # the model is still loaded, so a bad name fails
    assert bad.returncode == 1 and bad.stderr.startswith("Error: ")


def test_prompt_argument_and_verbose_timings(smollm2_path: Path, any_model, tmp_path: Path):
    model = any_model
    want = "".join(c.text for c in model.generate("Say hi.", temperature=0, max_tokens=12)) + "\n"
    res = _run([str(smollm2_path), "Say hi.", "--temperature", "0", "--num-predict", "12", "--verbose",
                "--backend", model.backend_name], tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout == want  # the timings do not go to stdout
    labels = [line.split(":")[0] for line in res.stderr.splitlines()]
    assert labels == ["total duration", "load duration", "prompt eval count", "prompt eval duration",
                      "prompt eval rate", "eval count", "eval duration", "eval rate"]
    assert "eval count:           12 token(s)" in res.stderr


def test_piped_stdin_goes_before_the_prompt_argument(smollm2_path: Path, model, tmp_path: Path):
    """Ollama's run joins stdin and the prompt arguments with a space, stdin first."""
    piped = "My cat is called Whiskers and she is three years old.\n"
    want = "".join(c.text for c in model.generate(piped + " What is my cat called?", temperature=0,
                                                  max_tokens=16)) + "\n"
    alone = "".join(c.text for c in model.generate("What is my cat called?", temperature=0, max_tokens=16)) + "\n"
    assert want != alone
    res = _run([str(smollm2_path), "What is my cat called?", "--temperature", "0", "--num-predict", "16"],
               tmp_path, stdin=piped)
    assert res.returncode == 0, res.stderr
    assert res.stdout == want


def test_a_negative_seed_means_a_random_one(smollm2_path: Path, tmp_path: Path):
    for seed in ("-1", "-7"):
        res = _run([str(smollm2_path), "Say hi.", "--seed", seed, "--num-predict", "4"], tmp_path)
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() and res.stderr == ""


@pytest.mark.parametrize(("option", "value"), [
    ("--ctx", "0"), ("--ctx", "-1"), ("--ctx", "7"), ("--num-predict", "-5"), ("--num-predict", "-3"),
    ("--temperature", "nan"), ("--temperature", "inf"), ("--temperature", "-0.5"), ("--top-p", "5"),
    ("--top-p", "-0.1"), ("--min-p", "1.5"), ("--top-k", "-2"),
])
def test_bad_sampling_options_are_usage_errors(smollm2_path: Path, tmp_path: Path, option: str, value: str):
    res = _run([str(smollm2_path), "hi", option, value], tmp_path)
    assert res.returncode == 2, res.stderr  # as for any other bad option value (--ctx abc)
    assert res.stdout == "" and "Traceback" not in res.stderr
    assert f"Error: Invalid value for '{option}': must be " in res.stderr, res.stderr


def test_num_predict_minus_two_fills_the_context(smollm2_path: Path, tmp_path: Path):
    """Ollama's -2: generate until the context is full (and stop there), -1: until the end of the text."""
    args = [str(smollm2_path), "Count from 1 to 1000:", "--ctx", "64", "--temperature", "0", "--verbose"]
    fill = _run([*args, "--num-predict", "-2"], tmp_path)
    assert fill.returncode == 0, fill.stderr

    def count(label: str) -> int:
        line = next(x for x in fill.stderr.splitlines() if x.startswith(label))
        return int(line.split(":")[1].split()[0])

    assert count("prompt eval count") + count("eval count") <= 64 + 1


def test_an_answer_that_never_ends_stops_at_ten_contexts(smollm2_path: Path, tmp_path: Path):
    """num_predict -1 with a shifting context: a text that never ends stops after 10 * num_ctx tokens,
    Ollama's limit, instead of running for ever."""
    env = {**os.environ, "LLMEDGE_MODELS": str(tmp_path / "store")}
    args = [str(smollm2_path), "a a a a a a a a", "--raw", "--ctx", "16", "--temperature", "0", "--verbose"]
    try:
        res = subprocess.run([sys.executable, "-m", "llmedge.cli.main", "run", *args], capture_output=True,
                             text=True, env=env, timeout=90, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail("the answer did not stop (greedy 'a a a ...' at a context of 16 never ends its text)")
    assert res.returncode == 0, res.stderr
    assert "eval count:           160 token(s)" in res.stderr.splitlines(), res.stderr


def test_chat_answers_run_to_the_end_of_the_text_unless_num_predict_says_less(model, tmp_path: Path):
    """-1 (the engine stops it at ten contexts: test_an_answer_that_never_ends_stops_at_ten_contexts),
    a set number, or -2: fill the context without shifting."""
    s, _ = _session(model, tmp_path)
    assert s.generation_options()["num_predict"] == -1
    s.handle("/set parameter num_predict 48")
    assert s.generation_options()["num_predict"] == 48
    s.handle("/set parameter num_predict -2")
    assert s.generation_options()["num_predict"] == -1 and s.generation_options()["shift"] is False


def test_unknown_model_is_one_line_error(tmp_path: Path):
    res = _run(["nosuchmodel:7b", "hi"], tmp_path)
    assert res.returncode == 1
    assert res.stdout == ""
    assert len(res.stderr.splitlines()) == 1
    assert res.stderr.startswith("Error: model 'nosuchmodel:7b' not found")


@pytest.mark.parametrize("content", ["garbage", "truncated"])
def test_malformed_file_is_one_line_error(smollm2_path: Path, tmp_path: Path, content: str):
    bad = tmp_path / "bad.gguf"
    if content == "garbage":
        bad.write_bytes(b"this is not a model\n" * 10)
    else:
        with open(smollm2_path, "rb") as f:
            bad.write_bytes(f.read(300_000))
    res = _run([str(bad), "hi"], tmp_path)
    assert res.returncode == 1
    assert res.stdout == ""
    assert len(res.stderr.splitlines()) == 1 and res.stderr.startswith("Error: "), res.stderr
    assert "Traceback" not in res.stderr


def _default_sigint() -> None:
    """A child's Ctrl-C as a terminal's: the default action, even when the suite was started with SIGINT
    ignored (a shell's background job without job control), which the child would inherit."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def sigint_raises():
    """Python's KeyboardInterrupt on SIGINT for this test, whatever the suite started with."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_during_a_one_shot_answer_exits_130(smollm2_path: Path, tmp_path: Path):
    env = {**os.environ, "LLMEDGE_MODELS": str(tmp_path / "store")}
    p = subprocess.Popen([sys.executable, "-m", "llmedge.cli.main", "run", str(smollm2_path),
                          "Count from 1 to 100000, one number a line.", "--temperature", "0",
                          "--num-predict", "100000"],
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                         preexec_fn=_default_sigint)
    try:
        first = p.stdout.read(8)  # the answer is streaming
        assert first, p.stderr.read().decode()
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, (p.returncode, err.decode())
    assert b"Traceback" not in err


def test_a_reader_that_stops_reading_ends_the_answer_quietly_with_141(smollm2_path: Path, tmp_path: Path):
    """``llmedge run M "Count to 50" | head -2`` exited 1 with no message (Click's handling of
    BrokenPipeError); it now ends as cat or ollama do under head: no output on stderr, status 141
    (128 + SIGPIPE, what the shell shows for them)."""
    env = {**os.environ, "LLMEDGE_MODELS": str(tmp_path / "store")}
    p = subprocess.Popen([sys.executable, "-m", "llmedge.cli.main", "run", str(smollm2_path), "Count to 50",
                          "--temperature", "0", "--num-predict", "300"],
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        lines = [p.stdout.readline(), p.stdout.readline()]  # what head -2 reads, then it closes the pipe
        p.stdout.close()
        err = p.stderr.read()
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert all(lines), err.decode()
    assert p.returncode == 128 + signal.SIGPIPE and err == b"", (p.returncode, err.decode())


# -- input parsing ---------------------------------------------------------------------------------

def test_multiline_input_rules():
    assert needs_more('"""') and needs_more('"""first line\nsecond')
    assert not needs_more('"""one line"""') and not needs_more('"""\na\nb\n"""')
    assert needs_more('/set system """You are\nterse') and not needs_more('/set system """terse"""')
    assert not needs_more("plain text") and not needs_more('a """ inside')
    assert unwrap('"""\nline one\nline two\n"""') == "line one\nline two"
    assert unwrap('"""one"""') == "one"
    assert unwrap('"Be brief."') == "Be brief."


def test_session_names_are_validated(tmp_path: Path):
    assert session_path("s1", tmp_path) == tmp_path / "s1.json"
    assert session_path("my.chat-2_b", tmp_path).name == "my.chat-2_b.json"
    for bad in ("../x", "a/b", "", ".hidden", "a..b", "x" * 65, "/etc/passwd", "a\\b", "-rf"):
        with pytest.raises(LlmedgeError, match="invalid session name"):
            session_path(bad, tmp_path)


def test_parameters_are_typed():
    assert parse_parameter("temperature", ["0"]) == 0.0
    assert parse_parameter("top_k", ["20"]) == 20 and isinstance(parse_parameter("seed", ["7"]), int)
    assert parse_parameter("stop", ["<|im_end|>", "###"]) == ["<|im_end|>", "###"]
    with pytest.raises(LlmedgeError, match="unknown parameter 'nope'"):
        parse_parameter("nope", ["1"])
    with pytest.raises(LlmedgeError, match="invalid int value 'x'"):
        parse_parameter("num_predict", ["x"])
    with pytest.raises(LlmedgeError, match="missing value"):
        parse_parameter("top_p", [])
    for name, bad, why in [("num_ctx", "-5", "at least 8"), ("num_ctx", "0", "at least 8"),
                           ("num_predict", "-5", "-1 .until the end"), ("temperature", "nan", "finite"),
                           ("top_p", "5", "between 0 and 1"), ("min_p", "-1", "between 0 and 1"),
                           ("typical_p", "inf", "finite"), ("repeat_penalty", "nan", "finite"),
                           ("repeat_penalty", "-1", "0 or more .0 or 1: no penalty")]:
        with pytest.raises(LlmedgeError, match=f"^{name} must be .*{why}"):
            parse_parameter(name, [bad])
    assert parse_parameter("num_predict", ["-2"]) == -2 and parse_parameter("seed", ["-1"]) == -1
    assert parse_parameter("repeat_penalty", ["0"]) == 0.0  # no penalty, as in the server and the API


# -- the chat, headless ----------------------------------------------------------------------------

def test_set_and_show_commands(model, tmp_path: Path):
    s, out = _session(model, tmp_path)
    s.handle("/set parameter temperature 0")
    s.handle('/set parameter stop "<|im_end|>" "two words"')
    s.handle("/set parameter top_k banana")
    s.handle('/set system "You answer in French."')
    s.handle("/show system")
    s.handle("/show parameters")
    s.handle("/show template")
    text = out.getvalue()
    assert "Set parameter 'temperature' to '0'\n" in text
    assert "Set parameter 'stop' to '<|im_end|>, two words'\n" in text
    assert "Couldn't set parameter: invalid int value 'banana' for parameter 'top_k'\n" in text
    assert "Set system message.\nYou answer in French.\n" in text
    assert "User defined parameters:\ntemperature                    0\nstop" in text
    assert model.template.source in text
    assert s.generation_options()["stop"] == ["<|im_end|>", "two words"]
    assert s.conversation() == [{"role": "system", "content": "You answer in French."}]
    assert s.handle("/bye") is False and s.handle("/exit") is False


def test_unknown_set_and_show_subcommands_are_one_line(model, tmp_path: Path):
    s, out = _session(model, tmp_path)
    for line in ("/set foo", "/show bar", "/set", "/show"):
        assert s.handle(line) is True
    text = out.getvalue()
    assert text.startswith("Unknown command '/set foo'. Type /? for help\n"
                           "Unknown command '/show bar'. Type /? for help\n")
    assert text.count("Available Commands:") == 2  # a bare /set and /show still print their help


def test_show_modelfile_and_license_follow_the_model_and_the_session(model, tmp_path: Path, monkeypatch):
    from llmedge.modelfile import parse

    monkeypatch.setattr(model, "defaults", {"parameters": {"top_k": 20}, "license": ["MIT", "or else"]},
                        raising=False)
    s, out = _session(model, tmp_path)
    s.handle("/set parameter temperature 0")
    s.handle("/set system You speak like a pirate.")
    out.truncate(0)
    out.seek(0)
    s.handle("/show modelfile")
    parsed = parse(out.getvalue())
    assert parsed.base == str(model.path)
    assert parsed.config["system"] == "You speak like a pirate."
    assert parsed.config["parameters"] == {"top_k": 20, "temperature": 0.0}
    out.truncate(0)
    out.seek(0)
    s.handle("/show license")
    assert out.getvalue() == "MIT\nor else\n"  # the Modelfile's LICENSE, not the GGUF's apache-2.0


def test_an_empty_multiline_message_is_not_sent(model, tmp_path: Path):
    s, out = _session(model, tmp_path)
    assert s.handle('"""\n\n"""') is True
    assert s.messages == [] and out.getvalue() == ""


def test_set_parameter_seed_minus_one_samples_with_a_random_seed(model, tmp_path: Path):
    s, out = _session(model, tmp_path, params={"num_predict": 4})
    s.handle("/set parameter seed -1")
    assert "Set parameter 'seed' to '-1'" in out.getvalue()
    for _ in range(2):  # every turn, not only the first
        assert s.ask("Say hi.") is not None, out.getvalue()
    assert "Error" not in out.getvalue() and "ValueError" not in out.getvalue()
    assert s.generation_options()["seed"] is None
    s.handle("/set parameter seed 3")
    assert s.generation_options()["seed"] == 3


def test_save_load_restores_the_conversation_and_the_next_turn_is_fast(smollm2_path: Path, any_model,
                                                                        tmp_path: Path):
    import llmedge

    model, backend = any_model, any_model.backend_name
    n = 16 if backend == "native" else 6  # MLX's CPU build decodes a few tokens a second
    s, out = _session(model, tmp_path)
    s.handle("/set parameter temperature 0")
    s.handle(f"/set parameter num_predict {n}")
    s.handle("/set system Be brief.")
    assert s.ask("Name a fruit.") and s.ask("Name a vegetable.")
    s.handle("/save lunch")
    assert "Saved session 'lunch' (4 messages)" in out.getvalue()
    data = json.loads((tmp_path / "sessions" / "lunch.json").read_text())
    assert data["messages"] == s.messages and data["system"] == "Be brief."
    assert data["parameters"] == {"num_predict": n, "temperature": 0.0}

    assert data["state"] == "lunch.state" and (tmp_path / "sessions" / "lunch.state").is_file()

    # A fresh model: the KV state comes back with the conversation, the next turn evaluates only itself.
    fresh = llmedge.load(str(smollm2_path), n_ctx=1024, backend=backend)
    s2, out2 = _session(fresh, tmp_path)
    s2.handle("/load lunch")
    text = out2.getvalue()
    assert s2.messages == s.messages and s2.system == "Be brief." and s2.params["num_predict"] == n
    assert ">>> Name a fruit.\n" in text and "Loaded session 'lunch' (4 messages; KV state restored)" in text
    history = len(fresh.template.encode(s2.conversation(), add_generation_prompt=False))
    assert s2.ask("And a drink?")
    assert fresh.timings.prompt_eval_count < 20 < history

    # A damaged state file: refused in one line, the history is evaluated instead; still fast after.
    state = tmp_path / "sessions" / "lunch.state"
    state.write_bytes(state.read_bytes()[:1000])
    other = llmedge.load(str(smollm2_path), n_ctx=1024, backend=backend)
    s3, out3 = _session(other, tmp_path)
    s3.handle("/load lunch")
    text = out3.getvalue()
    assert "(the KV state could not be restored: " in text
    assert f"Loaded session 'lunch' (4 messages; history evaluated: {history} tokens in " in text
    assert s3.ask("And a drink?")
    assert other.timings.prompt_eval_count < 20 < history

    s2.handle("/load nothing-here")
    s2.handle("/load ../lunch")
    (tmp_path / "sessions" / "broken.json").write_text("{not json")
    s2.handle("/load broken")
    text = out2.getvalue()
    # neither a session nor a model (a name that is no session's is tried as a model, as Ollama's /load)
    assert "Error: no saved session or model named 'nothing-here' (saved sessions: lunch)" in text
    assert "Error: no such model file: ../lunch" in text  # a path, never a session file outside the folder
    assert "Error: session file" in text and "is damaged" in text


def test_old_messages_left_out_when_the_context_is_full(model, tmp_path: Path):
    s, out = _session(model, tmp_path)
    s.handle("/set parameter num_predict 8")
    long = "word " * 200
    for i in range(6):
        s.messages += [{"role": "user", "content": f"{i} {long}"}, {"role": "assistant", "content": "ok"}]
    s.messages.append({"role": "user", "content": "Now say hi."})
    ids, dropped = s.prompt_ids()
    assert dropped > 0 and dropped % 2 == 0
    assert len(ids) + 8 <= model.n_ctx
    assert ids == model.template.encode(s.messages[dropped:])


def test_no_shift_and_keep_reach_every_chat_turn(smollm2_path: Path, tmp_path: Path, monkeypatch):
    """run --no-shift / --keep without a prompt: the chat's answers stop at a full context (and keep
    what --keep says), as the one-shot answers do."""
    import llmedge
    import llmedge.cli.chat as chat_module
    import llmedge.cli.run as run_module

    started = {}
    monkeypatch.setattr(run_module, "prompt_with_stdin", lambda prompt: None)  # as on a terminal
    monkeypatch.setattr(chat_module, "chat", lambda m, params, **kw: started.update(kw, model=m))
    run_module.run(str(smollm2_path), None, ctx=64, no_shift=True, keep=5)
    assert started["options"] == {"shift": False, "num_keep": 5}

    m = llmedge.load(str(smollm2_path), n_ctx=64)
    s, out = _session(m, tmp_path, options=started["options"], params={"temperature": 0})
    s.handle("/set system Be a poet.")
    assert s.generation_options()["shift"] is False and s.generation_options()["num_keep"] == 5
    assert s.ask("Write a very long poem about the sea, at least a hundred lines.")
    assert m.timings.prompt_eval_count + m.timings.eval_count <= 64 + 1  # stopped at the full context


def test_seed_minus_one_reaches_the_chat_over_a_modelfile_seed(model, tmp_path: Path, monkeypatch):
    """run --seed -1 without a prompt: every chat turn samples with a random seed, also when the
    model's Modelfile fixes one (the one-shot run already did so)."""
    import llmedge.cli.chat as chat_module
    import llmedge.cli.progress as progress_module
    import llmedge.cli.run as run_module

    monkeypatch.setattr(model, "defaults", {"parameters": {"seed": 42}}, raising=False)
    monkeypatch.setattr(progress_module, "load_with_progress", lambda *a, **kw: model)
    monkeypatch.setattr(run_module, "prompt_with_stdin", lambda prompt: None)  # as on a terminal
    started = {}
    monkeypatch.setattr(chat_module, "chat", lambda m, params, **kw: started.update(params=params))
    run_module.run("any", None, seed=-1)
    s, out = _session(model, tmp_path, params=started["params"])
    assert s.generation_options()["seed"] is None  # a random one, not the Modelfile's 42
    s.handle("/show parameters")
    assert f"User defined parameters:\n{'seed':<30} -1\n" in out.getvalue()


def test_num_ctx_reloads_the_model(any_model, tmp_path: Path):
    model = any_model
    s, out = _session(model, tmp_path)
    s.handle("/set parameter num_ctx 512")
    assert s.model is not model and s.model.n_ctx == 512 and s.model.backend_name == model.backend_name
    assert "Set parameter 'num_ctx' to '512'" in out.getvalue()


def test_num_ctx_over_the_training_context_says_and_shows_the_one_used(model, tmp_path: Path):
    """/set parameter num_ctx 100000 showed 100000 in /show parameters while the model ran at its
    training context (8192 for smollm2); the chat now says the capped value and shows it, and asking
    again for more does not load the model a second time."""
    s, out = _session(model, tmp_path)
    train = model.params.n_ctx_train
    s.handle("/set parameter num_ctx 100000")
    loaded = s.model
    assert loaded.n_ctx == train == 8192
    assert (f"Set parameter 'num_ctx' to '{train}' ({model.name}'s training context: 100000 is more than "
            "it can use)") in out.getvalue()
    s.handle("/set parameter num_ctx 200000")
    assert s.model is loaded
    s.handle("/show parameters")
    assert f"{'num_ctx':<30} {train}\n" in out.getvalue() and "100000\n" not in out.getvalue()
    s.handle("/show modelfile")
    assert f"PARAMETER num_ctx {train}" in out.getvalue()


def test_load_of_a_model_switches_the_chat_to_it(model, gemma3_path: Path, tmp_path: Path, monkeypatch):
    """/load NAME that is no saved session loads the model NAME, as Ollama's /load: a new conversation,
    the parameters set so far kept; a model that is not there is one line and the chat goes on."""
    monkeypatch.setenv("LLMEDGE_MODELS", str(tmp_path / "store"))
    s, out = _session(model, tmp_path)
    s.handle("/set parameter temperature 0")
    s.handle("/set parameter num_predict 8")
    s.handle("/set system Be brief.")
    s.messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
    out.truncate(0)
    out.seek(0)
    assert s.handle("/load nosuchmodel:1b") is True
    assert out.getvalue() == "Error: no saved session or model named 'nosuchmodel:1b'\n"
    assert s.model is model and len(s.messages) == 2

    s.handle(f"/load {gemma3_path}")
    assert out.getvalue().endswith(f"Loaded model '{gemma3_path}'\n")
    assert s.model.gguf.architecture == "gemma3"
    assert s.model.n_ctx == 4096 != model.n_ctx  # no num_ctx set in this chat: the new model's own default
    assert s.messages == [] and s.system == ""
    assert s.params["temperature"] == 0 and s.params["num_predict"] == 8
    assert s.ask("Say hi.")  # and it answers with the new model
    assert "Error" not in out.getvalue().splitlines()[-1]


class _FakeModel:
    """Streams numbered words and sends itself SIGINT after ``interrupt_after`` chunks (None: never)."""

    def __init__(self, interrupt_after: int | None, n_ctx: int = 4096) -> None:
        self.interrupt_after = interrupt_after
        self.n_ctx = n_ctx
        self.produced = 0
        self.template = self

    def encode(self, messages, add_generation_prompt: bool = True):
        return [1] * (1 + sum(len(m["content"]) for m in messages))

    def generate(self, ids, **options):
        for i in range(200):
            if self.interrupt_after is not None and i == self.interrupt_after:
                os.kill(os.getpid(), signal.SIGINT)
            self.produced += 1
            yield Chunk(i, f"w{i} ")


@pytest.mark.parametrize("after", [0, 5])
def test_ctrl_c_stops_the_answer_and_the_chat_goes_on(tmp_path: Path, after: int):
    fake = _FakeModel(after)
    s, out = _session(fake, tmp_path)
    previous = signal.getsignal(signal.SIGINT)
    assert s.ask("Tell me a story.") is None if after == 0 else s.ask("Tell me a story.") == (
        "".join(f"w{i} " for i in range(after + 1)))
    assert signal.getsignal(signal.SIGINT) is previous  # the handler is put back
    if after == 0:
        assert s.messages == []  # nothing was answered: the question is dropped too
    else:
        # A Ctrl-C once text streams stops at the next token; the partial answer stays in the chat.
        assert fake.produced == after + 1
        assert [m["role"] for m in s.messages] == ["user", "assistant"]
    fake.interrupt_after = None
    assert s.ask("Go on.") == "".join(f"w{i} " for i in range(200))


def test_ctrl_c_while_a_model_loads_or_a_message_is_tokenized_keeps_the_chat(tmp_path: Path, sigint_raises):
    def interrupted_load(n_ctx: int, name: str):
        os.kill(os.getpid(), signal.SIGINT)  # the user's Ctrl-C, in the middle of the load
        raise AssertionError("SIGINT should have interrupted the load")

    fake = _FakeModel(None)
    fake.name = "fake"
    s, out = _session(fake, tmp_path, reload=interrupted_load)
    s.messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    for command in ("/load othermodel:1b", "/set parameter num_ctx 512"):
        assert s.handle(command) is True
    assert out.getvalue() == "Interrupted.\nInterrupted.\n"
    assert s.model is fake and s.params["num_ctx"] == 4096 and "num_ctx" not in s.user_set
    assert len(s.messages) == 2

    def interrupted_encode(messages, add_generation_prompt: bool = True):
        os.kill(os.getpid(), signal.SIGINT)
        raise AssertionError("SIGINT should have interrupted the tokenizer")

    fake.encode = interrupted_encode
    assert s.handle("A very long pasted text") is True
    assert len(s.messages) == 2  # the message that was not sent is not in the chat


def test_answer_view_is_plain_text_off_a_terminal():
    from llmedge.cli.chat import AnswerView

    out = io.StringIO()
    with AnswerView(Console(file=io.StringIO()), out=out) as view:
        for piece in ("# Title", "\n\n**bold** ", "`code`"):
            view.add(piece)
    assert out.getvalue() == "# Title\n\n**bold** `code`\n\n"  # no Markdown, no escapes
    assert view.text == "# Title\n\n**bold** `code`"


def test_live_view_renders_only_the_tail_never_from_inside_a_code_block():
    from llmedge.cli.chat import _tail_source

    paragraphs = "\n\n".join(f"paragraph {i}" for i in range(100))
    tail = _tail_source(paragraphs, 10)
    assert paragraphs.endswith(tail) and tail.startswith("paragraph ") and 10 <= len(tail.split("\n")) < 13
    code = "intro\n\n```python\n" + "\n\n".join(f"x{i} = {i}" for i in range(50)) + "\n```\n\nafter\n\nend"
    assert _tail_source(code, 10).startswith("```python\n")  # blank lines in code are not block starts
    assert _tail_source("short\n\ntext", 10) == "short\n\ntext"


def test_show_info_names_the_file_type_not_the_commonest_tensor_type(gemma3_path: Path, tmp_path: Path):
    import llmedge
    from llmedge.gguf import FILE_TYPES, GGUFFile

    g = GGUFFile(gemma3_path)
    want = FILE_TYPES[g.metadata["general.file_type"]]
    m = llmedge.load(str(gemma3_path), n_ctx=256)
    s, _ = _session(m, tmp_path)
    assert f"    {'quantization':<20}{want}\n" in s.info()


@pytest.mark.parametrize("prompt", [["hi"], []])
def test_an_embedding_model_is_one_line_error(tmp_path: Path, prompt: list[str]):
    """run generated text with an embedding model (a GGUF with {arch}.pooling_type), which Ollama's
    server refuses to generate with; now one line, with and without a prompt (the chat)."""
    sys.path.insert(0, str(Path(__file__).parent / "malformed"))
    from gguf_bytes import U32, tiny_model

    embed = tiny_model().kv("llama.pooling_type", U32, 1).write(tmp_path / "embed.gguf")
    res = _run([str(embed), *prompt], tmp_path)
    assert res.returncode == 1 and res.stdout == "", res.stdout
    assert len(res.stderr.splitlines()) == 1, res.stderr
    assert res.stderr.startswith(f"Error: '{embed}' is an embedding model and does not generate text"), res.stderr
    assert _run([str(tiny_model().write(tmp_path / "chat.gguf")), "hi", "--num-predict", "1"],
                tmp_path).returncode == 0  # the same model without pooling_type generates
