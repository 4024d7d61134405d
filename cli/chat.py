"""The interactive chat of ``llmedge run MODEL``: input, slash commands, answer rendering, sessions.

Input is read with prompt_toolkit (history kept across runs in the user's data folder, multi-line
messages between ``\"\"\"``, Tab completes slash commands). Answers stream token by token: on a
terminal as live Markdown (rich, code blocks highlighted) under a spinner that runs until the first
text, then printed once more, whole, as Markdown when complete; elsewhere as plain text.

Ctrl-C while an answer is being generated stops it and returns to the prompt; the chat goes on. The
partial answer is kept in the conversation exactly as it stands on the screen (the KV cache already
holds it, so the next turn starts at once); if no text had appeared yet, the question is dropped too.
Ctrl-C at the prompt clears the line; Ctrl-C while a command loads a model (``/load``, ``/set parameter
num_ctx``) leaves the chat as it was. Ctrl-D on an empty line or ``/bye`` leaves.

The slash commands are Ollama's (``/set``, ``/show``, ``/clear``, ``/save``, ``/load``, ``/bye``,
``/?``). ``/save NAME`` writes the conversation, system message and parameters to
``<store root>/sessions/NAME.json`` (plus the KV state in ``NAME.state`` when the model can save it);
``/load NAME`` restores them, with the KV state when the model file is the same, else by evaluating
the history once so the next turn still starts at once through the engine's prefix reuse. A NAME that
is no saved session is loaded as a model, as Ollama's ``/load MODEL``: a new conversation with it.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shlex
import signal
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.markup import escape
from rich.segment import Segment

from llmedge.cli.options import parameter_problem
from llmedge.errors import LlmedgeError

PROMPT = ">>> "
CONTINUATION = "... "
PLACEHOLDER = "Send a message (/? for help)"
SESSION_FORMAT = "llmedge-session"

# Ollama's /set parameter names, in the order of its help, with their value types and help lines.
PARAMETERS: dict[str, tuple[type, str]] = {
    "seed": (int, "Random number seed"),
    "num_predict": (int, "Max number of tokens to predict"),
    "top_k": (int, "Pick from top k num of tokens"),
    "top_p": (float, "Pick token based on sum of probabilities"),
    "min_p": (float, "Pick token based on top token probability * min_p"),
    "num_ctx": (int, "Set the context size"),
    "temperature": (float, "Set creativity level"),
    "repeat_penalty": (float, "How strongly to penalize repetitions"),
    "repeat_last_n": (int, "Set how far back to look for repetitions"),
    "stop": (list, "Set the stop parameters"),
}
# Accepted as well (the API knows them), not listed in the help, like Ollama.
EXTRA_PARAMETERS: dict[str, type] = {"presence_penalty": float, "frequency_penalty": float,
                                     "typical_p": float}

DEFAULT_PARAMETERS: dict[str, Any] = {
    "seed": None, "num_predict": -1, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "temperature": 0.8,
    "repeat_penalty": 1.0, "repeat_last_n": 64, "stop": [],
    "presence_penalty": 0.0, "frequency_penalty": 0.0, "typical_p": 1.0,
}

HELP = '''Available Commands:
  /set            Set session variables
  /show           Show model information
  /load <name>    Load a saved session or a model
  /save <name>    Save your current session
  /clear          Clear session context
  /bye            Exit
  /?, /help       Help for a command
  /? shortcuts    Help for keyboard shortcuts

Use """ to begin a multi-line message.
'''

HELP_SET = '''Available Commands:
  /set parameter ...     Set a parameter
  /set system <string>   Set system message
  /set history           Enable history
  /set nohistory         Disable history
  /set verbose           Show LLM stats
  /set quiet             Disable LLM stats
  /set think [level]     Enable thinking (low, medium, high)
  /set nothink           Disable thinking
'''

HELP_SHOW = '''Available Commands:
  /show info         Show details for this model
  /show license      Show model license
  /show modelfile    Show Modelfile for this model
  /show parameters   Show parameters for this model
  /show system       Show system message
  /show template     Show prompt template
'''

HELP_SHORTCUTS = '''Available keyboard shortcuts:
  Ctrl + a            Move to the beginning of the line (Home)
  Ctrl + e            Move to the end of the line (End)
   Alt + b            Move back (left) one word
   Alt + f            Move forward (right) one word
  Ctrl + k            Delete the sentence after the cursor
  Ctrl + u            Delete the sentence before the cursor
  Ctrl + w            Delete the word before the cursor

  Ctrl + l            Clear the screen
  Ctrl + c            Stop the model from responding (the partial answer stays in the chat)
  Ctrl + d            Exit llmedge (/bye)
   Tab                Complete a slash command
'''

COMMANDS = [
    "/set parameter ", "/set system ", "/set history", "/set nohistory", "/set verbose", "/set quiet", "/set think", "/set nothink",
    "/show info", "/show license", "/show modelfile", "/show parameters", "/show system", "/show template",
    "/load ", "/save ", "/clear", "/bye", "/help", "/?", "/? shortcuts",
] + [f"/set parameter {name} " for name in PARAMETERS]


def help_parameters() -> str:
    """The help of ``/set parameter``, one line per parameter as Ollama prints it."""
    lines = ["Available Parameters:"]
    for name, (kind, text) in PARAMETERS.items():
        arg = "<string> <string> ..." if kind is list else f"<{kind.__name__}>"
        lines.append(f"  /set parameter {name} {arg}".ljust(40) + text)
    return "\n".join(lines) + "\n"


# -- input ---------------------------------------------------------------------------------------

def needs_more(text: str) -> bool:
    """Whether a multi-line message opened with \"\"\" (or ``/set system \"\"\"``) is still open."""
    s = text.lstrip()
    for opener in ('"""', '/set system """'):
        if s.startswith(opener):
            return not s[len(opener):].rstrip().endswith('"""')
    return False


def unwrap(text: str) -> str:
    """The text of a message with its surrounding \"\"\" (or one pair of double quotes) removed."""
    s = text.strip()
    if s.startswith('"""'):
        s = s[3:]
        if s.rstrip().endswith('"""'):
            s = s.rstrip()[:-3]
        return s.strip()
    if len(s) >= 2 and s[0] == s[-1] == '"':
        return s[1:-1]
    return s


def history_path() -> Path:
    """The input history file, in the user's data folder (``~/.local/share/llmedge/history`` on Linux)."""
    import platformdirs

    return Path(platformdirs.user_data_dir("llmedge")) / "history"


class InputReader:
    """prompt_toolkit input: ``>>>`` prompt, placeholder, history across runs, \"\"\" multi-line, Tab."""

    def __init__(self, history_file: Path | None = None) -> None:
        from prompt_toolkit import PromptSession
        from prompt_toolkit.completion import Completer, Completion
        from prompt_toolkit.formatted_text import FormattedText
        from prompt_toolkit.history import FileHistory, InMemoryHistory
        from prompt_toolkit.key_binding import KeyBindings
        from prompt_toolkit.output.defaults import create_output

        class _History(FileHistory):
            enabled = True

            def store_string(self, string: str) -> None:
                if self.enabled:
                    try:
                        super().store_string(string)
                    except OSError:
                        pass

        class _Commands(Completer):
            def get_completions(self, document, complete_event):  # noqa: ANN001 - prompt_toolkit's API
                text = document.text_before_cursor
                if not text.startswith("/") or "\n" in text:
                    return
                for cmd in COMMANDS:
                    if cmd.startswith(text) and cmd != text:
                        yield Completion(cmd, start_position=-len(text))

        self.history: Any = InMemoryHistory()
        if history_file is not None:
            try:
                history_file.parent.mkdir(parents=True, exist_ok=True)
                history_file.touch(exist_ok=True)
                self.history = _History(str(history_file))
            except OSError:
                pass  # an unwritable data folder: history for this run only

        kb = KeyBindings()

        @kb.add("enter")
        def _enter(event) -> None:  # noqa: ANN001
            buf = event.current_buffer
            if needs_more(buf.text):
                buf.insert_text("\n")
            elif buf.text.strip():
                buf.validate_and_handle()
            # an empty line is not sent (and leaves no line behind)

        @kb.add("escape", "enter")
        def _newline(event) -> None:  # noqa: ANN001
            event.current_buffer.insert_text("\n")

        self.session: Any = PromptSession(
            history=self.history,
            multiline=True,
            key_bindings=kb,
            prompt_continuation=CONTINUATION,
            placeholder=FormattedText([("fg:ansibrightblack", PLACEHOLDER)]),
            completer=_Commands(),
            complete_while_typing=False,
            output=create_output(always_prefer_tty=True),
        )

    def set_history(self, enabled: bool) -> None:
        self.history.enabled = enabled

    def read(self) -> str:
        """One message (KeyboardInterrupt on Ctrl-C, EOFError on Ctrl-D at an empty prompt)."""
        return self.session.prompt(PROMPT)

    @property
    def had_text(self) -> bool:
        """Whether the line held text when the last read was interrupted."""
        return bool(self.session.default_buffer.text)


# -- answers -------------------------------------------------------------------------------------

class AnswerView:
    """Shows one streaming answer: spinner, then live Markdown on a terminal; plain text elsewhere.

    On a terminal the live region shows the tail of the rendered Markdown that fits the screen; when
    the answer ends (or is interrupted) the region is erased and the whole answer printed as Markdown.
    """

    def __init__(self, console: Console, markdown: bool | None = None, blank_line: bool = True,
                 out: Any = None) -> None:
        self.console = console
        self.markdown = console.is_terminal if markdown is None else markdown
        self.blank_line = blank_line
        self.out = out if out is not None else sys.stdout
        self.parts: list[str] = []
        self._live: Any = None
        self._cache: tuple[int, int, list[list[Segment]]] | None = None
        self._rendered_at = 0.0
        self._render_cost = 0.0

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def __enter__(self) -> AnswerView:
        if self.markdown:
            from rich.live import Live
            from rich.spinner import Spinner

            self._spinner = Spinner("dots", style="bright_black")
            self._live = Live(self, console=self.console, transient=True, refresh_per_second=12,
                              redirect_stdout=False, redirect_stderr=False)
            self._live.start()
        return self

    def add(self, text: str) -> None:
        self.parts.append(text)
        if not self.markdown:
            self.out.write(text)
            self.out.flush()

    def __exit__(self, *exc: object) -> None:
        text = self.text
        if self._live is None:
            self.out.write("\n\n" if self.blank_line else "\n")
            self.out.flush()
            return
        self._live.stop()
        if text.strip():
            self.console.print(_markdown(text))
        if self.blank_line:
            self.console.print()

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        text = self.text
        if not text.strip():
            yield self._spinner
            return
        height = max(1, console.height - 2)
        key = (len(text), options.max_width)
        now = time.perf_counter()
        # Re-render at most at a quarter of the time: the model needs the CPU more than the screen.
        fresh = self._cache is not None and now - self._rendered_at < 3 * self._render_cost
        if self._cache is None or (self._cache[:2] != key and not fresh):
            source = _tail_source(text, 2 * height)
            lines = console.render_lines(_markdown(source), options.update(height=None), pad=False)
            self._cache = (*key, lines)
            self._rendered_at = time.perf_counter()
            self._render_cost = self._rendered_at - now
        tail = self._cache[2][-height:]
        for i, line in enumerate(tail):
            yield from line
            if i < len(tail) - 1:
                yield Segment.line()


def _tail_source(text: str, min_lines: int) -> str:
    """The end of ``text`` from the latest Markdown block start (after a blank line outside code
    fences) that leaves at least ``min_lines`` lines: all the live view can show, cheap to render."""
    lines = text.split("\n")
    if len(lines) <= min_lines:
        return text
    limit = len(lines) - min_lines
    start = 0
    in_fence = False
    for i, line in enumerate(lines[:limit]):
        s = line.lstrip()
        if s.startswith(("```", "~~~")):
            in_fence = not in_fence
        elif not in_fence and not s:
            start = i + 1
    return "\n".join(lines[start:])


def _markdown(text: str) -> Any:
    from rich.markdown import Markdown

    return Markdown(text, code_theme="monokai")


class _StopOnCtrlC:
    """SIGINT while generating: before the first token it interrupts at once (the prompt may be long);
    after it, it asks the stream to stop at the next token; a second Ctrl-C interrupts at once."""

    def __init__(self) -> None:
        self.requested = False
        self.streaming = False
        self._previous: Any = None

    def _handler(self, signum: int, frame: Any) -> None:
        if not self.streaming or self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __enter__(self) -> _StopOnCtrlC:
        try:
            self._previous = signal.signal(signal.SIGINT, self._handler)
        except ValueError:  # not the main thread: leave SIGINT as it is
            self._previous = None
        self._tty = _quiet_terminal()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._tty is not None:
            _restore_terminal(*self._tty)
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def _quiet_terminal() -> tuple[int, list] | None:
    """Stop the terminal echoing keys (and ``^C``) into the answer while it streams; keys typed
    meanwhile stay buffered for the next prompt. Returns what to restore, or None."""
    try:
        import termios

        fd = sys.stdin.fileno()
        if not os.isatty(fd):
            return None
        saved = termios.tcgetattr(fd)
        quiet = termios.tcgetattr(fd)
        quiet[3] &= ~(termios.ECHO | getattr(termios, "ECHOCTL", 0))
        termios.tcsetattr(fd, termios.TCSANOW, quiet)
        return fd, saved
    except (ImportError, OSError, ValueError, AttributeError):
        return None


def _restore_terminal(fd: int, saved: list) -> None:
    import termios

    try:
        termios.tcsetattr(fd, termios.TCSANOW, saved)
    except (OSError, termios.error):
        pass


# -- sessions ------------------------------------------------------------------------------------

_SESSION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def sessions_dir() -> Path:
    """Where sessions are saved: ``<store root>/sessions``."""
    from llmedge.store import Store

    return Store().root / "sessions"


def session_path(name: str, root: Path | None = None) -> Path:
    """The JSON file of session ``name``; names are letters, digits, ``. _ -`` (no paths, no ``..``)."""
    if not _SESSION_NAME.fullmatch(name) or ".." in name:
        raise LlmedgeError(f"invalid session name '{name}': use up to 64 letters, digits, '.', '_' or '-' "
                           "(starting with a letter or digit)")
    return (root if root is not None else sessions_dir()) / f"{name}.json"


def parse_parameter(name: str, args: list[str]) -> Any:
    """The value of ``/set parameter NAME ARGS...``, typed; LlmedgeError when unknown or malformed."""
    kind = PARAMETERS[name][0] if name in PARAMETERS else EXTRA_PARAMETERS.get(name)
    if kind is None:
        raise LlmedgeError(f"unknown parameter '{name}'")
    if not args:
        raise LlmedgeError(f"missing value for parameter '{name}'")
    if kind is list:
        return list(args)
    if len(args) != 1:
        raise LlmedgeError(f"parameter '{name}' takes one value")
    try:
        value = kind(args[0])
    except ValueError:
        raise LlmedgeError(f"invalid {kind.__name__} value '{args[0]}' for parameter '{name}'") from None
    problem = parameter_problem(name, value)
    if problem is not None:
        raise LlmedgeError(f"{name} {problem}")
    return value


def _format_value(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename: a kill leaves old or new."""
    from llmedge.fsutil import remove_stale_temps

    remove_stale_temps(path.parent, f".{path.name}.", ".tmp")  # what a killed save left behind
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


# -- the session ---------------------------------------------------------------------------------

class Reply:
    """A streamed answer on its way to the view: with thinking on, the reasoning is shown between
    Ollama's "Thinking..." and "...done thinking." lines and kept out of the answer the chat remembers."""

    def __init__(self, view: AnswerView, think: bool | str | None, prompt: str) -> None:
        from llmedge.reasoning import ThinkingSplitter, opens_thinking

        self.view = view
        self.content = ""
        self.splitter = ThinkingSplitter(opens_thinking(prompt)) if think else None
        self.state = "none"  # none -> thinking -> done

    def add(self, text: str, final: bool = False) -> None:
        if self.splitter is None:
            self.content += text
            self.view.add(text)
            return
        thinking, content = self.splitter.feed(text, final)
        if thinking:
            if self.state == "none":
                self.view.add("Thinking...\n")
                self.state = "thinking"
            self.view.add(thinking)
        if content:
            if self.state == "thinking":
                self.view.add("\n...done thinking.\n\n")
                self.state = "done"
            self.content += content
            self.view.add(content)

    def finish(self) -> None:
        self.add("", final=True)


class ChatSession:
    """One conversation with a loaded model: messages, system message, parameters, commands, turns."""

    def __init__(self, model: Any, console: Console | None = None, params: dict[str, Any] | None = None,
                 verbose: bool = False, reload: Callable[[int | None, str], Any] | None = None,
                 sessions: Path | None = None, out: Any = None, think: bool | str | None = None,
                 options: dict[str, Any] | None = None) -> None:
        self.model = model
        self.run_options = dict(options or {})  # run's --no-shift (shift) and --keep (num_keep), every turn
        self.think = think  # None: the template's default; else enable_thinking (and a level)
        self.prompt_text = ""  # the last rendered prompt
        self.console = console or Console(highlight=False)
        self.out = out
        self.user_set: set[str] = set()
        self._adopt(model, params or {})
        self.verbose = verbose
        self.reload = reload
        self.sessions = sessions
        self.reader: InputReader | None = None

    def _adopt(self, model: Any, params: dict[str, Any]) -> None:
        """Start the conversation with ``model``: its defaults (a Modelfile's / registry's parameters,
        system message and messages) under ``params``, the values the user set."""
        self.model = model
        self.params: dict[str, Any] = dict(DEFAULT_PARAMETERS)
        defaults = getattr(model, "defaults", None) or {}
        self.params.update({k: v for k, v in (defaults.get("parameters") or {}).items() if k in self.params})
        self.params["num_ctx"] = model.n_ctx  # the context it runs at (a num_ctx PARAMETER capped at training)
        self.user_set = set()
        for k, v in params.items():
            if v is not None and v != self.params.get(k):
                self.params[k] = v
                self.user_set.add(k)
        self.system = str(defaults.get("system") or "")
        self.messages: list[dict[str, str]] = [dict(m) for m in defaults.get("messages") or []]

    # -- output helpers --------------------------------------------------------------------------
    def say(self, text: str = "") -> None:
        self.console.out(text, highlight=False)

    def error(self, text: str) -> None:
        self.console.out(f"Error: {text}", style="red", highlight=False)

    # -- dispatch --------------------------------------------------------------------------------
    def handle(self, text: str) -> bool:
        """Act on one input: a command or a message. False when the chat should end."""
        stripped = text.strip()
        if not stripped:
            return True
        if stripped.startswith("/"):
            return self.command(stripped)
        message = unwrap(stripped) if stripped.startswith('"""') else stripped
        if message:  # an empty """ """ block is not sent, as in Ollama
            self.ask(message)
        return True

    def command(self, line: str) -> bool:
        words = line.split()
        cmd = words[0].lower()
        try:
            if cmd in ("/bye", "/exit"):
                return False
            if cmd in ("/?", "/help"):
                topic = words[1].lower() if len(words) > 1 else ""
                text = {"set": HELP_SET, "show": HELP_SHOW, "shortcuts": HELP_SHORTCUTS,
                        "shortcut": HELP_SHORTCUTS}.get(topic, HELP)
                self.say(text)
            elif cmd == "/set":
                self.cmd_set(line, words)
            elif cmd == "/show":
                self.cmd_show(words)
            elif cmd == "/clear":
                self.messages = []
                self.say("Cleared session context")
            elif cmd == "/save":
                if len(words) != 2:
                    self.say("Usage:\n  /save <name>")
                else:
                    self.save(words[1])
            elif cmd == "/load":
                if len(words) != 2:
                    self.say("Usage:\n  /load <name>")
                elif self._is_session(words[1]):
                    self.load(words[1])
                else:
                    self.load_model(words[1])
            else:
                self.say(f"Unknown command '{words[0]}'. Type /? for help")
        except LlmedgeError as e:
            self.error(str(e))
        except KeyboardInterrupt:  # Ctrl-C while a model loads (/load, num_ctx): the chat goes on as it was
            self.say("Interrupted.")
        return True

    def cmd_set(self, line: str, words: list[str]) -> None:
        what = words[1].lower() if len(words) > 1 else ""
        if what == "parameter":
            if len(words) < 4:
                self.say(help_parameters())
                return
            name = words[2]
            try:
                args = shlex.split(line.split(None, 3)[3]) if name == "stop" else words[3:]
            except ValueError:
                args = words[3:]
            try:
                value = parse_parameter(name, args)
                used = self.set_parameter(name, value)
            except LlmedgeError as e:
                self.say(f"Couldn't set parameter: {e}")
                return
            note = "" if used == value else (f" ({self.model.name}'s training context: "
                                             f"{_format_value(value)} is more than it can use)")
            self.say(f"Set parameter '{name}' to '{_format_value(used)}'{note}")
        elif what == "system":
            rest = line.split(None, 2)[2] if len(words) > 2 else ""
            if not rest.strip():
                self.say(HELP_SET)
                return
            self.system = unwrap(rest)
            self.say("Set system message.")
        elif what in ("verbose", "quiet"):
            self.verbose = what == "verbose"
            self.say(f"Set '{what}' mode.")
        elif what in ("think", "nothink"):
            level = words[2].lower() if what == "think" and len(words) > 2 else None
            if level is not None and level not in ("low", "medium", "high"):
                self.say("Usage:\n  /set think [low|medium|high]")
                return
            from llmedge.reasoning import supports_thinking

            if what == "think" and not supports_thinking(self.model.template):
                self.error(f'"{self.model.name}" does not support thinking')
                return
            self.think = level or (what == "think")
            self.say(f"Set '{what}' mode." if level is None else f"Set 'think' mode to '{level}'.")
        elif what in ("history", "nohistory"):
            if self.reader is not None:
                self.reader.set_history(what == "history")
            self.say(f"Set '{what}' mode.")
        elif what:
            self.say(f"Unknown command '/set {words[1]}'. Type /? for help")
        else:
            self.say(HELP_SET)

    def set_parameter(self, name: str, value: Any) -> Any:
        """Set ``name`` for the next turns and return the value in effect. num_ctx is capped at the
        model's training context, as Ollama caps it (llm/server.go), and reloads the model when the
        context changes; the capped value is what /show parameters and /show modelfile then say."""
        if name == "num_ctx":
            train = getattr(getattr(self.model, "params", None), "n_ctx_train", 0)
            value = min(value, train) if train > 0 else value
            if value != self.model.n_ctx:
                self._reload(value)
            value = self.model.n_ctx
        self.params[name] = value
        self.user_set.add(name)
        return value

    def _reload(self, n_ctx: int) -> None:
        """Load the model again with another context (the conversation stays; its cache does not)."""
        if self.reload is not None:
            self.model = self.reload(n_ctx, self.model.name)  # run's reload shows its own spinner
            return
        from llmedge.api import Model

        what = f"loading {escape(self.model.name)} with a context of {n_ctx}"
        with self.console.status(what, spinner="dots"):
            self.model = Model(self.model.path, backend=self.model.backend_name, n_ctx=n_ctx,
                               name=self.model.name)

    def _is_session(self, name: str) -> bool:
        try:
            return session_path(name, self.sessions).is_file()
        except LlmedgeError:
            return False

    def load_model(self, name: str) -> None:
        """``/load MODEL`` (not a saved session): chat with another model, as Ollama's /load does: a new
        conversation with that model's defaults; the parameters set in this chat stay. A model that is
        not stored is not pulled; it is one line, and the chat goes on with the model it had. The new
        model runs at the num_ctx set in this chat, else at its own default (run's ``--ctx``, else its
        num_ctx PARAMETER, else 4096: :func:`llmedge.defaults.load_context`), as Ollama's /load sends
        only the options set with /set parameter."""
        from llmedge.errors import ModelNotFoundError

        ctx_set = "num_ctx" in self.user_set
        n_ctx = self.params["num_ctx"] if ctx_set else None
        try:
            if self.reload is not None:
                model = self.reload(n_ctx, name)
            else:
                import llmedge

                with self.console.status(f"loading {escape(name)}", spinner="dots"):
                    model = llmedge.load(name, backend=self.model.backend_name, n_ctx=n_ctx, pull=False)
        except ModelNotFoundError:
            saved = sorted(p.stem for p in session_path("x", self.sessions).parent.glob("*.json"))
            hint = f" (saved sessions: {', '.join(saved)})" if saved else ""
            raise LlmedgeError(f"no saved session or model named '{name}'{hint}") from None
        self._adopt(model, {k: self.params[k] for k in self.user_set if k != "num_ctx"})
        if ctx_set:  # still the user's, at the value the new model runs at
            self.user_set.add("num_ctx")
        self.say(f"Loaded model '{name}'")

    def cmd_show(self, words: list[str]) -> None:
        what = words[1].lower() if len(words) > 1 else ""
        m = self.model
        if what == "info":
            self.say(self.info())
        elif what == "template":
            self.say(m.template.source)
        elif what == "system":
            self.say(self.system or "No system message was specified for this model.")
        elif what == "license":
            # a Modelfile's LICENSE (what /api/show reports), else the GGUF's general.license
            lic = "\n".join((getattr(m, "defaults", None) or {}).get("license") or []) or m.gguf.get("general.license")
            self.say(str(lic) if lic else "No license was specified for this model.")
        elif what == "modelfile":
            self.say(self.modelfile())
        elif what in ("parameters", "params"):
            self.say(self.show_parameters())
        elif what:
            self.say(f"Unknown command '/show {words[1]}'. Type /? for help")
        else:
            self.say(HELP_SHOW)

    def modelfile(self) -> str:
        """``/show modelfile``: the model's Modelfile with this session's system message and the
        parameters set in it laid over the model's own, as Ollama's chat shows it."""
        from llmedge.modelfile import render

        config = dict(getattr(self.model, "defaults", None) or {})
        if self.system:
            config["system"] = self.system
        parameters = dict(config.get("parameters") or {})
        parameters.update({k: self.params[k] for k in self._ordered(self.user_set)})
        config["parameters"] = parameters
        return render(str(self.model.path), config)

    def info(self) -> str:
        """``/show info``: the model block Ollama prints, plus what this session runs with."""
        m = self.model
        g = m.gguf
        arch = g.architecture
        n_params = sum(t.n_elements for t in g.tensors.values())
        quant = g.file_type  # general.file_type's name, as llama.cpp and Ollama show it, else the commonest type
        rows = {
            "architecture": arch,
            "parameters": f"{n_params / 1e9:.2f}B" if n_params >= 1e9 else f"{n_params / 1e6:.2f}M",
            "context length": g.get_int(f"{arch}.context_length", 0),
            "embedding length": g.get_int(f"{arch}.embedding_length", 0),
            "quantization": quant,
        }
        run = {
            "context": f"{m.n_ctx} tokens ({m.cached_tokens} cached)",
            "backend": f"{m.backend_name} ({m.backend_reason})",
            "template": m.template.name,
            "file": str(m.path),
        }
        lines = ["  Model"] + [f"    {k:<20}{v}" for k, v in rows.items()]
        lines += ["", "  Session"] + [f"    {k:<20}{v}" for k, v in run.items()]
        return "\n".join(lines) + "\n"

    def show_parameters(self) -> str:
        lines = []
        if self.user_set:
            lines.append("User defined parameters:")
            lines += [f"{k:<30} {_format_value(self.params[k])}" for k in self._ordered(self.user_set)]
        else:
            lines.append("No parameters were specified for this model.")
        rest = [k for k in self._ordered(set(PARAMETERS) - self.user_set) if self.params[k] is not None]
        lines += ["", "Defaults in effect:"]
        lines += [f"{k:<30} {_format_value(self.params[k]) or '(none)'}" for k in rest]
        return "\n".join(lines) + "\n"

    @staticmethod
    def _ordered(names: Iterable[str]) -> list[str]:
        order = list(PARAMETERS) + list(EXTRA_PARAMETERS)
        return sorted(names, key=order.index)

    # -- turns -----------------------------------------------------------------------------------
    def conversation(self) -> list[dict[str, str]]:
        """The messages as the template sees them: the system message (if set) first."""
        system = [{"role": "system", "content": self.system}] if self.system else []
        return system + self.messages

    def generation_options(self) -> dict[str, Any]:
        options = {k: v for k, v in self.params.items() if k not in ("num_ctx", "seed")}
        seed = self.params.get("seed")
        # -1 (any negative seed) means a random one, as in Ollama; always given, so that a
        # Modelfile's negative seed is not laid over it
        options["seed"] = seed if isinstance(seed, int) and seed >= 0 else None
        options.update(self.run_options)
        if options.get("num_predict") == -2:  # Ollama's "fill the context": stop where it is full
            options.update(num_predict=-1, shift=False)
        return options

    def prompt_ids(self) -> tuple[list[int], int]:
        """The ids of the conversation, leaving out the oldest exchanges that no longer fit."""
        n_ctx = self.model.n_ctx
        n_predict = self.params["num_predict"]
        reserve = min(n_predict if n_predict > 0 else 256, n_ctx // 4)
        dropped = 0
        from llmedge.reasoning import template_variables

        extra = template_variables(self.think)
        while True:
            if extra:  # the rendered text says whether the reply starts inside <think>
                self.prompt_text = self.model.template.render(self._window(dropped), True, None, **extra)
                ids = self.model.template.prompt_ids(self.prompt_text)
            else:
                ids = self.model.template.encode(self._window(dropped))
            if len(ids) + reserve <= n_ctx or len(self.messages) - dropped <= 1:
                return ids, dropped
            dropped += 2

    def _window(self, dropped: int) -> list[dict[str, str]]:
        system = [{"role": "system", "content": self.system}] if self.system else []
        return system + self.messages[dropped:]

    def ask(self, text: str) -> str | None:
        """One turn: stream the answer to ``text``; None when it failed."""
        self.messages.append({"role": "user", "content": text})
        try:
            ids, dropped = self.prompt_ids()
        except KeyboardInterrupt:  # Ctrl-C while a long message is tokenized: it is not sent
            self.messages.pop()
            return None
        except LlmedgeError as e:
            self.messages.pop()
            self.error(str(e))
            return None
        if dropped:
            self.console.print(f"({dropped} earlier messages no longer fit in the context of "
                               f"{self.model.n_ctx} tokens and are left out)", style="bright_black")
        options = self.generation_options()
        system_keep = getattr(self.model, "system_keep", None)
        if self.system and callable(system_keep) and "num_keep" not in options:
            # a full context keeps the system message when the engine shifts it
            options["num_keep"] = system_keep(self._window(dropped), ids)
        interrupted = False
        view = AnswerView(self.console, out=self.out)
        stop = _StopOnCtrlC()
        reply = Reply(view, self.think, self.prompt_text)
        try:
            with stop, view:
                stream: Iterator[Any] = self.model.generate(ids, **options)
                try:
                    for chunk in stream:
                        stop.streaming = True
                        if chunk.text:
                            reply.add(chunk.text)
                        if stop.requested:
                            interrupted = True
                            break
                finally:
                    close = getattr(stream, "close", None)
                    if close is not None:
                        close()
                reply.finish()
        except KeyboardInterrupt:
            interrupted = True
        except Exception as e:  # noqa: BLE001 - one line, and the conversation survives
            if os.environ.get("LLMEDGE_DEBUG"):
                raise
            self.messages.pop()
            self.error(str(e) if isinstance(e, LlmedgeError) else f"{type(e).__name__}: {e}")
            return None
        answer = reply.content
        if interrupted and not answer.strip():
            self.messages.pop()
            return None
        self.messages.append({"role": "assistant", "content": answer})
        if self.verbose and not interrupted:
            from llmedge.cli.run import print_timings

            print_timings(self.model.timings)
            sys.stderr.write("\n")
            sys.stderr.flush()
        return answer

    # -- sessions --------------------------------------------------------------------------------
    def _identity(self) -> dict[str, Any]:
        path = Path(self.model.path)
        ident = {"name": self.model.name, "path": str(path), "size": path.stat().st_size,
                 "architecture": self.model.gguf.architecture}
        digest = getattr(self.model, "digest", None)
        if isinstance(digest, str):
            ident["digest"] = digest
        return ident

    def _same_model(self, saved: dict[str, Any]) -> bool:
        """Whether a session was saved with this very model file (by digest when both know it)."""
        try:
            mine = self._identity()
        except (OSError, LlmedgeError):
            return False
        if saved.get("digest") and mine.get("digest"):
            return saved["digest"] == mine["digest"]
        return saved.get("path") == mine["path"] and saved.get("size") == mine["size"]

    def save(self, name: str) -> Path:
        path = session_path(name, self.sessions)
        path.parent.mkdir(parents=True, exist_ok=True)
        data: dict[str, Any] = {
            "format": SESSION_FORMAT,
            "version": 1,
            "saved": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "model": self._identity(),
            "system": self.system,
            "parameters": {k: self.params[k] for k in self._ordered(self.user_set)},
            "messages": self.messages,
            "state": None,
        }
        save_state = getattr(self.model, "save_state", None)
        state_path = path.with_suffix(".state")
        if callable(save_state) and self.messages and self.model.cached_tokens:
            try:
                save_state(state_path, extra={"session": name})
                data["state"] = state_path.name
            except (LlmedgeError, OSError) as e:
                self.console.print(f"(the KV state was not saved: {e})", style="bright_black", markup=False)
        if data["state"] is None:
            state_path.unlink(missing_ok=True)
        _atomic_write(path, json.dumps(data, indent=1, ensure_ascii=False).encode("utf-8"))
        self.say(f"Saved session '{name}' ({len(self.messages)} messages)")
        return path

    def load(self, name: str) -> None:
        path = session_path(name, self.sessions)
        if not path.is_file():
            saved = sorted(p.stem for p in path.parent.glob("*.json")) if path.parent.is_dir() else []
            hint = f" (saved sessions: {', '.join(saved)})" if saved else ""
            raise LlmedgeError(f"no session named '{name}'{hint}")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            messages = data["messages"]
            ok = (data.get("format") == SESSION_FORMAT and isinstance(messages, list) and all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages))
        except (OSError, ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            raise LlmedgeError(f"session file {path} is damaged")
        for k, v in (data.get("parameters") or {}).items():
            try:
                args = [str(x) for x in v] if isinstance(v, list) else [str(v)]
                self.set_parameter(k, parse_parameter(k, args))
            except LlmedgeError:
                pass
        self.system = str(data.get("system") or "")
        self.messages = [{"role": m["role"], "content": m["content"]} for m in messages]
        how = self._restore_context(path, data)
        self._replay()
        self.say(f"Loaded session '{name}' ({len(self.messages)} messages; {how})")

    def _restore_context(self, path: Path, data: dict[str, Any]) -> str:
        saved_model = data.get("model") or {}
        same = self._same_model(saved_model)
        load_state = getattr(self.model, "load_state", None)
        if not same and saved_model.get("name"):
            self.console.print(f"(saved with model '{saved_model['name']}'; continuing with "
                               f"'{self.model.name}')", style="bright_black", markup=False)
        if same and data.get("state") and callable(load_state):
            state = path.parent / str(data["state"])
            try:
                with self.console.status("restoring the KV state", spinner="dots"):
                    load_state(state)
                return "KV state restored"
            except (LlmedgeError, OSError, ValueError) as e:
                self.console.print(f"(the KV state could not be restored: {e})", style="bright_black",
                                   markup=False)
        if not self.messages:
            return "nothing to evaluate"
        return self.prefill_history()

    def prefill_history(self) -> str:
        """Evaluate the conversation so far, so the next turn reuses it as a cached prefix."""
        try:
            ids = self.model.template.encode(self.conversation(), add_generation_prompt=False)
        except LlmedgeError as e:
            return f"history not evaluated: {e}"
        if len(ids) + 1 >= self.model.n_ctx:
            return "history longer than the context, not evaluated"
        t0 = time.perf_counter()
        try:
            with _StopOnCtrlC(), self.console.status(f"evaluating {len(ids)} tokens of history",
                                                     spinner="dots"):
                self.model.prefill(ids)
        except KeyboardInterrupt:
            return "history evaluation interrupted"
        return f"history evaluated: {len(ids)} tokens in {time.perf_counter() - t0:.1f}s"

    def _replay(self) -> None:
        for m in self.messages:
            if m["role"] == "user":
                self.say(PROMPT + m["content"].replace("\n", "\n" + CONTINUATION))
            elif m["role"] == "assistant":
                if self.console.is_terminal:
                    self.console.print(_markdown(m["content"]))
                else:
                    self.say(m["content"])
                self.say()


# -- the loop ------------------------------------------------------------------------------------

def chat(model: Any, params: dict[str, Any] | None = None, verbose: bool = False,
         reload: Callable[[int | None, str], Any] | None = None, think: bool | str | None = None,
         options: dict[str, Any] | None = None) -> None:
    """The interactive chat on the terminal, until Ctrl-D or /bye."""
    reader = InputReader(history_path())
    session = ChatSession(model, Console(highlight=False), params=params, verbose=verbose, reload=reload,
                          think=think, options=options)
    del model  # the session owns it: a /load frees it
    session.reader = reader
    while True:
        try:
            text = reader.read()
        except KeyboardInterrupt:
            if not reader.had_text:
                session.say("Use Ctrl + d or /bye to exit.")
            continue
        except EOFError:
            session.say()
            return
        if not session.handle(text):
            return
