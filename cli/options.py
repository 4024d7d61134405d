"""Command-line options shared by several commands."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Annotated, Any

import typer

MIN_CTX = 8  # the chat's smallest context: a prompt and a reply must fit


def parameter_problem(name: str, value: Any) -> str | None:
    """Why ``value`` cannot be the generation parameter ``name`` (Ollama's names: num_ctx,
    num_predict, temperature, top_p, ...), as a phrase to follow the name ("must be at least 8"),
    or None when it can. Shared by the command-line options, ``/set parameter`` and Modelfiles.
    num_predict follows Ollama: -1 generates until the end of the text, -2 until the context is
    full, other negatives are refused; a negative seed means a random one; repeat_penalty 0, like 1,
    is no penalty (see :class:`llmedge.sampling.SamplingOptions`)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, not {value}"
    if name == "num_ctx" and value < MIN_CTX:
        return f"must be at least {MIN_CTX} (got {value})"
    if name == "num_predict" and value < -2:
        return f"must be -1 (until the end), -2 (until the context is full) or 0 or more (got {value})"
    if name == "temperature" and value < 0:
        return f"must be 0 or more (got {value})"
    if name in ("top_p", "min_p", "typical_p") and not 0 <= value <= 1:
        return f"must be between 0 and 1 (got {value})"
    if name == "repeat_penalty" and value < 0:
        return f"must be 0 or more (0 or 1: no penalty; got {value})"
    if name in ("top_k", "repeat_last_n") and value < -1:
        return f"must be -1 or more (got {value})"
    return None


def checked(name: str) -> Callable[[Any], Any]:
    """A Typer callback refusing a bad value of the parameter ``name`` as a usage error (exit 2)."""
    def check(value: Any) -> Any:
        problem = None if value is None else parameter_problem(name, value)
        if problem is not None:
            raise typer.BadParameter(problem)
        return value

    return check


ModelArg = Annotated[str, typer.Argument(help="A catalog name (smollm2:135m), a store name or a .gguf path.")]
Ctx = Annotated[int, typer.Option("--ctx", help=f"Context size in tokens (at least {MIN_CTX}).",
                                  callback=checked("num_ctx"))]
Threads = Annotated[int | None, typer.Option("--threads",
                                              help="Compute threads (default, 0 or -1: physical cores).")]
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
