"""Diagnostic commands: ``tokenize`` and ``perplexity``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from llmedge.cli.options import BackendOpt, ModelArg, Threads


def tokenize(
    model: ModelArg,
    text: Annotated[str, typer.Argument(help="The text to tokenize ('-' reads stdin).")],
    special: Annotated[bool, typer.Option("--special", help="Parse special tokens written in the text.")] = False,
    bos: Annotated[bool, typer.Option("--bos/--no-bos", help="Add BOS/EOS as the model does.")] = False,
    pieces: Annotated[bool, typer.Option("--pieces", help="Print each id with its text.")] = False,
) -> None:
    """Print the token ids of TEXT, as llama.cpp tokenizes it."""
    from llmedge.gguf import GGUFFile
    from llmedge.modelcheck import check_model_file
    from llmedge.store import Store
    from llmedge.tokenizer import Tokenizer

    if text == "-":
        text = sys.stdin.read()
    g = GGUFFile(Store().resolve(model, pull=True))
    check_model_file(g)
    tok = Tokenizer.from_metadata(g.metadata)
    ids = tok.encode(text, add_bos=bos, special=special)
    if pieces:
        for t in ids:
            typer.echo(f"{t:>8} {json.dumps(tok.token_to_piece(t, special=True).decode('utf-8', 'replace'))}")
    else:
        typer.echo(json.dumps(ids))


def perplexity(
    model: ModelArg,
    file: Annotated[Path, typer.Option("-f", "--file", help="The text file to score.")],
    ctx: Annotated[int, typer.Option("--ctx", help="Tokens per chunk.")] = 512,
    threads: Threads = None,
    backend: BackendOpt = "auto",
) -> None:
    """Perplexity of a text file, computed as llama-perplexity does."""
    from llmedge.api import load
    from llmedge.errors import LlmedgeError
    from llmedge.perplexity import perplexity as compute

    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise LlmedgeError(f"cannot read {file}: {e}") from None
    m = load(model, backend=backend, n_ctx=ctx, n_threads=threads)

    def report(i: int, n: int, ppl: float) -> None:
        sys.stderr.write(f"[{i}/{n}] {ppl:.4f}\n")

    r = compute(m, text, ctx, on_chunk=report)
    typer.echo(f"Final estimate: PPL = {r.ppl:.4f} ({r.n_chunks} chunks of {ctx}, {r.n_scored} tokens scored)")
