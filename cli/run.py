"""``llmedge run``: one-shot generation with a prompt (or piped stdin), else the interactive chat.

With a prompt, or else the whole of stdin when stdin or stdout is not a terminal, the answer is
streamed (piped stdin and a prompt argument: the stdin text, a space, then the prompt, as Ollama
does; see :func:`prompt_with_stdin`); when stdout is not a terminal it is exactly the answer and a newline (no colours, no
spinner), so it pipes. On a terminal the answer is shown as Markdown (see :mod:`llmedge.cli.chat`),
except with ``--raw``. Without a prompt, stdin and stdout both terminals, the chat of
:mod:`llmedge.cli.chat` starts. ``--verbose`` timings go to stderr.
"""

from __future__ import annotations

import io
import os
import stat
import sys
from typing import Annotated

import typer

from llmedge.cli.models import DEFAULT_CTX
from llmedge.cli.options import (
    MIN_CTX,
    BackendOpt,
    DraftMaxOpt,
    DraftMinOpt,
    DraftModelOpt,
    LookupOpt,
    ModelArg,
    Threads,
    checked,
    speculation_options,
)


def run(
    model: ModelArg,
    prompt: Annotated[str | None, typer.Argument(help="The prompt; omit it to chat.")] = None,
    raw: Annotated[bool, typer.Option("--raw", help="Feed the prompt without the chat template.")] = False,
    temperature: Annotated[float | None, typer.Option(help="Sampling temperature; 0 is greedy "
                                                      "(default 0.8, or the model's).",
                                                      callback=checked("temperature"))] = None,
    seed: Annotated[int | None, typer.Option(help="Random seed for reproducible sampling "
                                             "(-1, or any negative: a random one).")] = None,
    num_predict: Annotated[int | None, typer.Option("--num-predict", callback=checked("num_predict"),
                                                    help="Tokens to generate (-1: until the end of the text, "
                                                    "-2: until the context is full).")] = None,
    top_k: Annotated[int | None, typer.Option("--top-k", callback=checked("top_k"),
                                              help="Sample from the K most likely tokens (default 40; "
                                              "0 or -1: all).")] = None,
    top_p: Annotated[float | None, typer.Option("--top-p", callback=checked("top_p"),
                                                help="Sample from the most likely tokens whose probabilities "
                                                "add up to P, 0 to 1 (default 0.95).")] = None,
    min_p: Annotated[float | None, typer.Option("--min-p", callback=checked("min_p"),
                                                help="Drop tokens less likely than P times the most likely "
                                                "one, 0 to 1 (default 0.05).")] = None,
    ctx: Annotated[int | None, typer.Option("--ctx", callback=checked("num_ctx"), help=(
        f"Context size in tokens (at least {MIN_CTX}; default: the model's num_ctx PARAMETER, "
        f"else {DEFAULT_CTX})."))] = None,
    threads: Threads = None,
    backend: BackendOpt = "auto",
    kv_type: Annotated[str, typer.Option("--kv-type", help="KV cache cells: f16, f32 or q8_0.")] = "f16",
    no_shift: Annotated[bool, typer.Option("--no-shift",
                                           help="Stop at a full context instead of shifting it.")] = False,
    keep: Annotated[int | None, typer.Option("--keep", help="Tokens kept when the context shifts "
                                             "(default: the system prompt).")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", help="Print Ollama-style timings.")] = False,
    insecure: Annotated[bool, typer.Option("--insecure", help="Pull from a registry over plain http.")] = False,
    think: Annotated[bool | None, typer.Option("--think/--no-think", help="Turn the model's reasoning on or off "
                                               "(models whose template supports it; default: the template's).")
                     ] = None,
    draft_model: DraftModelOpt = None,
    draft_max: DraftMaxOpt = None,
    draft_min: DraftMinOpt = None,
    lookup: LookupOpt = None,
) -> None:
    """Run a model: print its answer to PROMPT, or chat when no prompt is given."""
    from llmedge.cli.progress import load_with_progress

    m = load_with_progress(model, backend=backend, n_ctx=ctx, n_threads=threads, kv_type=kv_type,
                           insecure=insecure)
    refuse_embedding_model(m, model)
    m.speculation = speculation_options(draft_model, draft_max, draft_min, lookup)
    if m.speculation:
        m.spec_config(**m.speculation)  # a bad draft model fails here, in one line, before any output
    default_seed = ((getattr(m, "defaults", None) or {}).get("parameters") or {}).get("seed")
    if (seed is not None and seed < 0) or (seed is None and isinstance(default_seed, int) and default_seed < 0):
        seed = None  # -1 (any negative seed, the option's or the Modelfile's) means a random one
        random_seed = True
    else:
        random_seed = False
    given = dict(temperature=temperature, seed=seed, top_k=top_k, top_p=top_p, min_p=min_p)
    options = {k: v for k, v in given.items() if v is not None}
    if random_seed:
        options["seed"] = None  # given, so a Modelfile's negative seed is not applied either
    n_predict = num_predict
    if n_predict is None:  # the Modelfile's, else until the end of the text
        n_predict = ((getattr(m, "defaults", None) or {}).get("parameters") or {}).get("num_predict", -1)
        n_predict = n_predict if isinstance(n_predict, int) and n_predict >= -2 else -1
    options.update(shift=not no_shift and n_predict != -2,  # -2, Ollama's "fill the context":
                   max_tokens=n_predict)  # stop where the context is full (the engine caps at 10 contexts)
    if keep is not None:
        options["num_keep"] = keep
    prompt = prompt_with_stdin(prompt)
    if prompt == "":  # as Ollama's generate with an empty prompt: the model is loaded, nothing is asked
        return
    if think is not None:
        from llmedge.errors import LlmedgeError
        from llmedge.reasoning import supports_thinking

        if think and not supports_thinking(m.template):
            raise LlmedgeError(f'"{m.name}" does not support thinking')
    if prompt is not None:
        text = None
        if think is not None and not raw:
            from llmedge.defaults import generate_messages
            from llmedge.reasoning import template_variables

            text = m.template.render(generate_messages(m.defaults, prompt), True, None, **template_variables(think))
            chunks = m.generate(m.template.prompt_ids(text), **options)
        else:
            chunks = m.generate(prompt, raw=raw, **options)
        pretty = sys.stdout.isatty() and not raw
        if pretty:
            _show(chunks, think, text or "")
        else:
            _stream(chunks, think, text or "")
        if verbose:
            if pretty:
                sys.stderr.write("\n")
            print_timings(m.timings)
        return
    from llmedge.cli.chat import chat

    params = dict(temperature=temperature, seed=-1 if random_seed else seed, top_k=top_k, top_p=top_p, min_p=min_p,
                  num_predict=num_predict)  # None: the model's default, else the chat's

    speculation = m.speculation

    def reload(n_ctx: int | None, name: str):  # /set parameter num_ctx, and /load of another model (not pulled)
        m2 = load_with_progress(name, backend=backend, n_ctx=ctx if n_ctx is None else n_ctx, n_threads=threads,
                                kv_type=kv_type, pull=False)  # None: --ctx, else the model's own default
        refuse_embedding_model(m2, name)
        m2.speculation = speculation if name == model else {}  # a draft model is for the first model
        return m2

    fixed = {"shift": False} if no_shift else {}
    if keep is not None:
        fixed["num_keep"] = keep
    held = [m]  # handed over, not kept: after /load the first model must be freed, not held by this frame
    del m
    chat(held.pop(), params, verbose=verbose, reload=reload, think=think, options=fixed)


def refuse_embedding_model(m, name: str) -> None:
    """One line instead of text from an embedding model (a GGUF with ``{arch}.pooling_type``), which
    Ollama's server refuses to generate with (``"name" does not support generate``)."""
    from llmedge.errors import LlmedgeError
    from llmedge.server.embed import is_embedding_model

    if is_embedding_model(m.gguf.metadata, m.gguf.architecture):
        raise LlmedgeError(f"{name!r} is an embedding model and does not generate text: embed with "
                           "llmedge serve's /api/embed or llmedge.Model.embed")


def prompt_with_stdin(prompt: str | None) -> str | None:
    """The prompt to answer, or None for the chat, as Ollama's ``run`` builds it (cmd/cmd.go,
    RunHandler): when stdin is not a terminal, its whole text goes *before* the prompt argument and
    the two are joined with one space, ``strings.Join(append([]string{stdin}, args...), " ")``, so
    ``cat notes.txt | llmedge run MODEL "Summarize this."`` asks about the notes (piped text usually
    ends with a newline, which puts the prompt on a line of its own). Unlike Ollama, an empty stdin
    (``</dev/null``) leaves the prompt as it is rather than adding a space in front. Without a prompt
    argument, stdin is the prompt when it is piped in or when the answer is redirected (one answer,
    no chat)."""
    if prompt is None:
        if not (sys.stdin.isatty() and sys.stdout.isatty()):
            return sys.stdin.read()  # piped in, or the answer is redirected: one answer, no chat
        return None
    if _stdin_is_pipe_or_file():
        piped = sys.stdin.read()
        return f"{piped} {prompt}" if piped else prompt
    return prompt


def _stdin_is_pipe_or_file() -> bool:
    """Whether stdin is a pipe or a regular file (``cmd | llmedge run M P``, ``< notes.txt``): what is
    read before a prompt argument. A terminal, /dev/null, a socket or a stdin with no file (an
    embedding program's, pytest's) is not read, so a prompt argument never waits on an open stdin."""
    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISREG(mode)


class _Stdout:
    def add(self, text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()


def _stream(chunks, think: bool | None = None, prompt: str = "") -> str:
    from llmedge.cli.chat import Reply

    reply = Reply(_Stdout(), think, prompt)  # type: ignore[arg-type]
    for chunk in chunks:
        if chunk.text:
            reply.add(chunk.text)
    reply.finish()
    sys.stdout.write("\n")
    sys.stdout.flush()
    return reply.content


def _show(chunks, think: bool | None = None, prompt: str = "") -> str:
    """The answer on a terminal: spinner, live Markdown, then the whole answer as Markdown."""
    from rich.console import Console

    from llmedge.cli.chat import AnswerView, Reply

    with AnswerView(Console(highlight=False), markdown=True, blank_line=False) as view:
        reply = Reply(view, think, prompt)
        for chunk in chunks:
            if chunk.text:
                reply.add(chunk.text)
        reply.finish()
    return reply.content


def print_timings(t) -> None:
    """Ollama's --verbose lines, on stderr so stdout stays the answer."""
    def rate(n: int, ns: int) -> str:
        return f"{n / (ns / 1e9):.2f} tokens/s" if ns else "n/a"

    lines = [
        f"total duration:       {t.total_duration / 1e9:.6f}s",
        f"load duration:        {t.load_duration / 1e9:.6f}s",
        f"prompt eval count:    {t.prompt_eval_count} token(s)",
        f"prompt eval duration: {t.prompt_eval_duration / 1e9:.6f}s",
        f"prompt eval rate:     {rate(t.prompt_eval_count, t.prompt_eval_duration)}",
        f"eval count:           {t.eval_count} token(s)",
        f"eval duration:        {t.eval_duration / 1e9:.6f}s",
        f"eval rate:            {rate(t.eval_count, t.eval_duration)}",
    ]
    extra = getattr(t, "extra", {}) or {}
    if "draft_tokens" in extra:  # speculative decoding (llama.cpp reports "accept" the same way)
        drafted, accepted = int(extra["draft_tokens"]), int(extra["draft_accepted"])
        forwards = int(extra.get("decode_forwards", 0)) or 1
        lines += [
            f"draft tokens:         {drafted} token(s), {accepted} accepted "
            f"({100 * accepted / drafted if drafted else 0:.1f}%)",
            f"decode forwards:      {forwards} ({t.eval_count / forwards:.2f} tokens per forward)",
        ]
        if extra.get("draft_model_dropped"):
            lines.append("draft model:          dropped (its tokens cost too much to pay at any acceptance)")
    sys.stderr.write("\n".join(lines) + "\n")
