"""``llmedge run``: one-shot generation with a prompt (or piped stdin), else a simple chat loop."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from llmedge.cli.options import BackendOpt, Ctx, ModelArg, Threads


def run(
    model: ModelArg,
    prompt: Annotated[str | None, typer.Argument(help="The prompt; omit it to chat.")] = None,
    raw: Annotated[bool, typer.Option("--raw", help="Feed the prompt without the chat template.")] = False,
    temperature: Annotated[float, typer.Option(help="Sampling temperature; 0 is greedy.")] = 0.8,
    seed: Annotated[int | None, typer.Option(help="Random seed for reproducible sampling.")] = None,
    num_predict: Annotated[int, typer.Option("--num-predict", help="Tokens to generate (-1: until EOS).")] = -1,
    top_k: Annotated[int, typer.Option("--top-k")] = 40,
    top_p: Annotated[float, typer.Option("--top-p")] = 0.95,
    min_p: Annotated[float, typer.Option("--min-p")] = 0.05,
    ctx: Ctx = 4096,
    threads: Threads = None,
    backend: BackendOpt = "auto",
    verbose: Annotated[bool, typer.Option("--verbose", help="Print Ollama-style timings.")] = False,
) -> None:
    """Run a model: print its answer to PROMPT, or chat when no prompt is given."""
    from llmedge.cli.progress import load_with_progress

    m = load_with_progress(model, backend=backend, n_ctx=ctx, n_threads=threads)
    options = dict(temperature=temperature, seed=seed, top_k=top_k, top_p=top_p, min_p=min_p,
                   max_tokens=num_predict)
    if prompt is None and not sys.stdin.isatty():
        prompt = sys.stdin.read()
    if prompt is not None:
        _stream(m.generate(prompt, raw=raw, **options))
        if verbose:
            print_timings(m.timings)
        return
    _chat_loop(m, options, verbose)


def _stream(chunks) -> str:
    out = []
    for chunk in chunks:
        if chunk.text:
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
            out.append(chunk.text)
    sys.stdout.write("\n")
    sys.stdout.flush()
    return "".join(out)


def _chat_loop(m, options: dict, verbose: bool) -> None:
    messages: list[dict[str, str]] = []
    while True:
        try:
            line = input(">>> ")
        except EOFError:
            sys.stdout.write("\n")
            return
        if line.strip() in ("/bye", "/exit"):
            return
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line})
        try:
            answer = _stream(m.chat(messages, **options))
        except KeyboardInterrupt:
            sys.stdout.write("\n")
            messages.pop()
            continue
        messages.append({"role": "assistant", "content": answer})
        if verbose:
            print_timings(m.timings)


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
    sys.stderr.write("\n".join(lines) + "\n")
