"""Command-line options shared by several commands."""

from __future__ import annotations

from typing import Annotated

import typer

ModelArg = Annotated[str, typer.Argument(help="A catalog name (smollm2:135m), a store name or a .gguf path.")]
Ctx = Annotated[int, typer.Option("--ctx", help="Context size in tokens.")]
Threads = Annotated[int | None, typer.Option("--threads", help="Compute threads (default: physical cores).")]
BackendOpt = Annotated[str, typer.Option("--backend", help="auto, native, numba, mlx or numpy (LLMEDGE_BACKEND).")]
