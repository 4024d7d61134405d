"""Command-line options shared by several commands."""

from __future__ import annotations

from typing import Annotated, Any

import typer

ModelArg = Annotated[str, typer.Argument(help="A catalog name (smollm2:135m), a store name or a .gguf path.")]
Ctx = Annotated[int, typer.Option("--ctx", help="Context size in tokens.")]
Threads = Annotated[int | None, typer.Option("--threads", help="Compute threads (default: physical cores).")]
BackendOpt = Annotated[str, typer.Option("--backend", help="auto, native, numba, mlx or numpy (LLMEDGE_BACKEND).")]

DraftModelOpt = Annotated[str | None, typer.Option("--draft-model", help="A draft model with the same vocabulary "
                                                   "for speculative decoding (llama.cpp's -md).")]
DraftMaxOpt = Annotated[int | None, typer.Option("--draft-max", help="Most draft tokens per step (16).")]
DraftMinOpt = Annotated[int | None, typer.Option("--draft-min", help="Fewest draft tokens worth verifying (0).")]
LookupOpt = Annotated[int | None, typer.Option(
    "--lookup", metavar="[NGRAM]",
    help="Prompt lookup decoding: drafts copied from the context where its last NGRAM (3) tokens recur.")]


def speculation_options(draft_model: str | None, draft_max: int | None, draft_min: int | None,
                        lookup: int | None) -> dict[str, Any]:
    """The speculative options of ``run`` / ``serve`` as :meth:`llmedge.api.Model.spec_config` keywords."""
    out: dict[str, Any] = {}
    if draft_model:
        out["draft_model"] = draft_model
    if lookup:
        out["lookup"] = lookup
    if draft_max is not None:
        out["draft_max"] = draft_max
    if draft_min is not None:
        out["draft_min"] = draft_min
    return out
