"""Diagnostic commands: ``tokenize`` and ``perplexity``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from llmedge.cli.options import BackendOpt, ModelArg, Threads

# llama-perplexity's and llama-imatrix's -c: the chunk size, 512 unless given (llama.cpp's arg.cpp sets
# n_ctx 512 for both tools). A model's num_ctx PARAMETER is not used: it sizes a chat's context, and
# scores only compare at the same chunk size.
CHUNK_HELP = "Tokens per chunk, as llama.cpp's -c (default 512; a model's num_ctx PARAMETER is not used)."


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
    file: Annotated[Path | None, typer.Option("-f", "--file", help="The text file to score.")] = None,
    ctx: Annotated[int, typer.Option("--ctx", "-c", help=CHUNK_HELP + " --kl-divergence takes the base file's.")]
    = 512,
    kld_base: Annotated[Path | None, typer.Option(
        "--kl-divergence-base", help="Save the log-probs to this file (with -f), or read them (with --kl-divergence).",
    )] = None,
    kl_div: Annotated[bool, typer.Option(
        "--kl-divergence", help="Compare with the log-probs saved in --kl-divergence-base (llama-perplexity's file).",
    )] = False,
    chunks: Annotated[int | None, typer.Option(
        "--chunks", help="Score only the first N chunks (default: all; with --kl-divergence, of the base file).",
    )] = None,
    kv_type: Annotated[str, typer.Option("--kv-type", help="KV cache cells: f16, f32 or q8_0.")] = "f16",
    threads: Threads = None,
    backend: BackendOpt = "auto",
) -> None:
    """Perplexity of a text file, computed as llama-perplexity does (its final estimate with its
    +/-); or the KL divergence from a base model."""
    from llmedge.errors import LlmedgeError
    from llmedge.perplexity import check_chunks

    try:
        check_chunks(chunks, "--chunks")  # before reading the text or loading the model
    except ValueError as e:
        raise LlmedgeError(str(e)) from None
    text = _read_text(file) if file is not None else None
    if kl_div:
        if kld_base is None:
            raise LlmedgeError("--kl-divergence needs --kl-divergence-base FILE (made by the base model)")
        return _kl_divergence(model, kld_base, text, chunks, kv_type, threads, backend)
    if text is None:
        raise LlmedgeError("perplexity needs a text: -f FILE")
    _perplexity(model, text, ctx, chunks, kld_base, kv_type, threads, backend)


def _read_text(file: Path) -> str:
    from llmedge.errors import LlmedgeError

    try:
        return file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise LlmedgeError(f"cannot read {file}: {e}") from None


def _perplexity(model: str, text: str, ctx: int, chunks: int | None, save: Path | None, kv_type: str,
                threads: int | None, backend: str) -> None:
    from llmedge.api import load
    from llmedge.errors import LlmedgeError
    from llmedge.perplexity import check_ctx, save_kld_base
    from llmedge.perplexity import perplexity as compute

    try:
        check_ctx(ctx, "--ctx")  # before loading the model: --ctx 0 would load it, then divide by zero
    except ValueError as e:
        raise LlmedgeError(str(e)) from None
    # a context holds at least 8 cells; a chunk of 3 to 7 tokens is evaluated in one of 8
    m = load(model, backend=backend, n_ctx=max(8, ctx), n_threads=threads, kv_type=kv_type)

    def report(i: int, n: int, ppl: float) -> None:
        sys.stderr.write(f"[{i}/{n}] {ppl:.4f}\n")

    r = (compute(m, text, ctx, on_chunk=report, n_chunks=chunks) if save is None
         else save_kld_base(m, text, save, ctx, report, n_chunks=chunks))
    typer.echo(f"Final estimate: {estimate(r)} ({r.n_chunks} chunks of {ctx}, {r.n_scored} tokens scored)")
    if save is not None:
        typer.echo(f"saved the log-probs of {r.n_chunks} chunks to {save}")


def estimate(r) -> str:
    """``PPL = 17.7700 +/- 0.51234`` as llama-perplexity prints it (no +/- where it prints none)."""
    return f"PPL = {r.ppl:.4f}" + ("" if r.uncertainty is None else f" +/- {r.uncertainty:.5f}")


def _kl_divergence(model: str, base_file: Path, text: str | None, chunks: int | None, kv_type: str,
                   threads: int | None, backend: str) -> None:
    from llmedge import kld
    from llmedge.api import load
    from llmedge.perplexity import kl_divergence

    base = kld.read_base(base_file)  # first: its n_ctx sizes the context
    m = load(model, backend=backend, n_ctx=max(8, base.n_ctx), n_threads=threads, kv_type=kv_type)

    def report(i: int, sums: kld.KldSums) -> None:
        if i == 1:  # after the base file has passed its checks
            typer.echo(kld.TABLE_HEADER)
        typer.echo(kld.chunk_line(i, sums))

    sums = kl_divergence(m, base, text, on_chunk=report, n_chunks=chunks)
    typer.echo("")
    typer.echo(kld.report(kld.statistics(sums)))
