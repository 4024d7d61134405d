"""The Typer app, its command registry and the one-line error handling every command shares."""

from __future__ import annotations

import os
import signal
import sys

import typer
from typer.core import TyperGroup

from llmedge.cli import bench as bench_cmd
from llmedge.cli import convert as convert_cmd
from llmedge.cli import imatrix as imatrix_cmd
from llmedge.cli import models as models_cmds
from llmedge.cli import quantize as quantize_cmd
from llmedge.cli import run as run_cmd
from llmedge.cli import running as running_cmds
from llmedge.cli import serve as serve_cmd
from llmedge.cli import tools as tools_cmds


class OutputClosed(Exception):
    """Standard output was closed by its reader (``llmedge run M P | head -2``)."""


class _Group(TyperGroup):
    """Typer's group, with a closed standard output raised as OutputClosed: Typer itself turns a
    BrokenPipeError into a bare exit status 1, which :func:`main` could not tell from an error."""

    def invoke(self, ctx):  # click.Group.invoke
        try:
            return super().invoke(ctx)
        except BrokenPipeError as e:
            raise OutputClosed from e


app = typer.Typer(
    name="llmedge",
    cls=_Group,
    help="Run quantized GGUF language models locally, token for token like llama.cpp.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("run")(run_cmd.run)
app.command("serve")(serve_cmd.serve)
app.command("show")(models_cmds.show)
app.command("pull")(models_cmds.pull)
app.command("list")(models_cmds.list_models)
app.command("ls", hidden=True)(models_cmds.list_models)
app.command("rm")(models_cmds.rm)
app.command("cp")(models_cmds.cp)
app.command("create")(models_cmds.create)
app.command("ps")(running_cmds.ps)
app.command("stop")(running_cmds.stop)
app.command("tokenize")(tools_cmds.tokenize)
app.command("bench")(bench_cmd.bench)
app.command("perplexity")(tools_cmds.perplexity)
app.command("convert")(convert_cmd.convert)
app.command("quantize")(quantize_cmd.quantize)
app.command("imatrix")(imatrix_cmd.imatrix)


def main() -> None:
    """Console entry point: errors become one line on stderr and exit status 1, never a traceback; a
    closed standard output ends quietly with status 141 (see :func:`_output_closed`)."""
    from llmedge.errors import LlmedgeError

    try:
        code = app(args=optional_values(sys.argv[1:]), standalone_mode=False)
        sys.stdout.flush()  # what is still buffered meets a closed pipe here, not at exit
    except (OutputClosed, BrokenPipeError):
        _output_closed()
    except LlmedgeError as e:
        _fail(str(e))
    except KeyboardInterrupt:
        sys.stderr.write("\n")
        sys.exit(130)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        _fail("aborted")
    except Exception as e:  # usage errors and anything unexpected: one line, no traceback
        if hasattr(e, "show") and isinstance(getattr(e, "exit_code", None), int):
            e.show()  # a click usage error (typer may bundle its own click, so match by shape)
            sys.exit(e.exit_code)
        if os.environ.get("LLMEDGE_DEBUG"):
            raise
        _fail(f"{type(e).__name__}: {e}")
    # Outside standalone mode Typer turns Ctrl-C (KeyboardInterrupt) and a command's typer.Exit into
    # a returned exit code instead of raising (every command returns None): exit with it.
    if isinstance(code, int) and not isinstance(code, bool) and code:
        if code == 130:
            sys.stderr.write("\n")
        sys.exit(code)


OPTIONAL_VALUES = {"--lookup": "3"}  # llama.cpp-style options whose value may be left out (--lookup[=NGRAM])


def optional_values(args: list[str]) -> list[str]:
    """``--lookup`` without a number becomes ``--lookup=3`` (Typer's options always take their value)."""
    out = []
    for i, a in enumerate(args):
        if a == "--":
            return out + args[i:]
        nxt = args[i + 1] if i + 1 < len(args) else None
        if a in OPTIONAL_VALUES and not (nxt is not None and nxt.isdigit()):
            a = f"{a}={OPTIONAL_VALUES[a]}"
        out.append(a)
    return out


def _output_closed() -> None:
    """End quietly when the reader of standard output has gone (``| head``), as ``cat`` or ``ollama``
    do: no message, exit status 141 (128 + SIGPIPE), what a shell reports for a command SIGPIPE ended,
    so ``set -o pipefail`` still sees that the output was cut. The process exits normally (its
    ``finally`` blocks and exit handlers run) rather than dying of the signal; what is left in the
    output buffer goes to /dev/null instead of failing again at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    sys.exit(128 + signal.SIGPIPE)


def _fail(message: str) -> None:
    sys.stderr.write(f"Error: {message}\n")
    sys.exit(1)


if __name__ == "__main__":
    main()
