"""The ``quantize`` command: llama-quantize's interface over :mod:`llmedge.quant.gguf_quantize`."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Annotated

import typer


def quantize(
    src: Annotated[
        str, typer.Argument(help="The input: a .gguf path or a stored model name (quantized: --allow-requantize).")
    ],
    dst: Annotated[Path, typer.Argument(help="The GGUF to write.")],
    qtype: Annotated[str, typer.Argument(metavar="TYPE", help="A llama-quantize mix: Q4_K_M, Q8_0, IQ4_XS, F16, ...")],
    allow_requantize: Annotated[
        bool, typer.Option("--allow-requantize", help="Allow re-quantizing tensors that are already quantized.")
    ] = False,
    pure: Annotated[bool, typer.Option("--pure", help="Every quantizable tensor gets TYPE's default type.")] = False,
    leave_output_tensor: Annotated[
        bool, typer.Option("--leave-output-tensor", help="Keep output.weight in its input type.")
    ] = False,
    output_tensor_type: Annotated[
        str | None, typer.Option("--output-tensor-type", help="Type of output.weight.")
    ] = None,
    token_embedding_type: Annotated[
        str | None, typer.Option("--token-embedding-type", help="Type of token_embd.weight.")
    ] = None,
    tensor_type: Annotated[
        list[str] | None,
        typer.Option("--tensor-type", help="PATTERN=TYPE: tensors whose name matches the regex get TYPE (repeatable)."),
    ] = None,
    imatrix: Annotated[
        str | None, typer.Option("--imatrix", help="An importance matrix (llama-imatrix GGUF or legacy .dat).")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No per-tensor lines.")] = False,
) -> None:
    """Quantize a GGUF file, byte for byte like llama.cpp's llama-quantize."""
    from llmedge.errors import LlmedgeError
    from llmedge.quant.gguf_quantize import check_output, quantize_gguf
    from llmedge.quant.imatrix import load_imatrix
    from llmedge.quant.mix import MixParams, ftype_from_name, parse_type

    try:
        params = MixParams(
            ftype=ftype_from_name(qtype),
            output_tensor_type=parse_type(output_tensor_type) if output_tensor_type else None,
            token_embedding_type=parse_type(token_embedding_type) if token_embedding_type else None,
            quantize_output_tensor=not leave_output_tensor,
            pure=pure,
            tensor_types=[_tensor_type_option(o) for o in tensor_type or ()],
        )
    except ValueError as e:
        raise LlmedgeError(str(e)) from None
    from llmedge.store import Store

    src = Store().resolve(src)  # a path, or a model already in the store (never pulled here)
    try:
        check_output(src, dst)  # a folder, or the input itself (a hard link, a symlink): before any work
    except ValueError as e:
        raise LlmedgeError(str(e)) from None

    def report(i: int, n: int, name: str, t: object) -> None:
        if not quiet:
            sys.stderr.write(f"[{i + 1:4d}/{n:4d}] {name:<40} -> {getattr(t, 'name', t)}\n")

    try:
        im = {} if imatrix is None else {"imatrix": load_imatrix(imatrix), "imatrix_name": imatrix}
    except (OSError, ValueError) as e:
        raise LlmedgeError(f"cannot load imatrix {imatrix}: {e}") from None
    try:
        r = quantize_gguf(src, dst, params, allow_requantize=allow_requantize, progress=report, **im)
    except ValueError as e:
        raise LlmedgeError(str(e)) from None
    except OSError as e:  # e.g. the output folder is missing, read-only or full (the previous output is kept)
        raise LlmedgeError(f"{e.filename or dst}: {e.strerror or e}") from None
    mib = 1024 * 1024
    typer.echo(
        f"quantized {len(r.types)} tensors: {r.size_in / mib:.2f} MiB -> {r.size_out / mib:.2f} MiB "
        f"in {r.seconds:.1f} s{f' ({r.n_fallback} fallbacks)' if r.n_fallback else ''}"
    )


def _tensor_type_option(opt: str) -> tuple[str, object]:
    """llama-quantize's ``--tensor-type``: ``PATTERN=TYPE``, the pattern lower-cased."""
    from llmedge.quant.mix import parse_type

    pattern, sep, tname = opt.partition("=")
    if not sep or not pattern or not tname:
        raise ValueError(f"malformed --tensor-type {opt!r} (expected PATTERN=TYPE)")
    try:
        re.compile(pattern.lower())
    except re.error as e:
        raise ValueError(f"bad --tensor-type pattern {pattern!r}: {e}") from None
    return pattern.lower(), parse_type(tname)
