"""The ``imatrix`` command: llama-imatrix's importance matrix, computed by llmedge."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from llmedge.cli.options import ModelArg
from llmedge.cli.tools import CHUNK_HELP


def imatrix(
    model: ModelArg,
    file: Annotated[Path, typer.Option("-f", "--file", help="The calibration text.")],
    out: Annotated[Path, typer.Option("-o", "--output", help="The imatrix GGUF to write.")] = Path("imatrix.gguf"),
    ctx: Annotated[int, typer.Option("--ctx", "-c", help=CHUNK_HELP)] = 512,
    chunks: Annotated[int | None, typer.Option("--chunks", help="Use at most this many chunks (negative: all).")] = None,
    process_output: Annotated[
        bool, typer.Option("--process-output", help="Also collect output.weight's inputs.")
    ] = False,
) -> None:
    """Compute an importance matrix over a text, in the GGUF format llama-quantize reads."""
    from llmedge.errors import LlmedgeError
    from llmedge.quant.gguf_quantize import check_output
    from llmedge.quant.imatrix_collect import MIN_ROWS, collect_imatrix, write_imatrix_gguf
    from llmedge.store import Store

    if ctx < MIN_ROWS:  # llama-imatrix skips products over fewer rows: nothing would be collected
        raise LlmedgeError(f"--ctx must be at least {MIN_ROWS} tokens, not {ctx}")
    if chunks == 0:
        raise LlmedgeError("--chunks must be at least 1 (or negative for every chunk)")
    chunks = None if chunks is not None and chunks < 0 else chunks  # llama-imatrix's -1: all
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise LlmedgeError(f"cannot read {file}: {e}") from None
    if not out.parent.is_dir():  # before the work, not after it
        raise LlmedgeError(f"the output folder {out.parent} does not exist")

    def report(i: int, n: int) -> None:
        sys.stderr.write(f"[{i}/{n}] chunks\n")

    path = Store().resolve(model, pull=True)
    try:
        check_output(path, out)  # a folder, or the model file itself
    except ValueError as e:
        raise LlmedgeError(str(e)) from None
    try:
        stats = collect_imatrix(path, text=text, n_ctx=ctx, n_chunks=chunks, process_output=process_output,
                                progress=report)
    except ValueError as e:
        raise LlmedgeError(str(e)) from None
    try:
        write_imatrix_gguf(out, stats, [str(file)])
    except OSError as e:
        raise LlmedgeError(f"cannot write {out}: {e.strerror or e}") from None
    typer.echo(f"wrote {out}: {len(stats.sums)} entries over {stats.n_chunks} chunks of {ctx} tokens")
