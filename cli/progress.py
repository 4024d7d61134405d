"""Progress display for pulls (rich bars) and loads (a spinner), both only on a terminal."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Any


@contextmanager
def pull_progress():
    """A progress callback in the store's format, drawing rich bars on stderr when it is a TTY."""
    if not sys.stderr.isatty():
        yield lambda status, digest=None, total=None, completed=None: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    console = Console(stderr=True)
    bars: dict[str, Any] = {}
    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  console=console, transient=False) as prog:
        def report(status: str, digest: str | None = None, total: int | None = None,
                   completed: int | None = None) -> None:
            if total:
                if status not in bars:
                    bars[status] = prog.add_task(status, total=total)
                prog.update(bars[status], completed=completed or 0)
            else:
                prog.console.print(status)

        yield report


def load_with_progress(model: str, **kwargs: Any):
    """``llmedge.load`` with pull bars and a loading spinner on a terminal."""
    from llmedge.api import load

    with pull_progress() as report:
        if not sys.stderr.isatty():
            return load(model, progress=report, **kwargs)
        from rich.console import Console

        with Console(stderr=True).status(f"loading {model}", spinner="dots"):
            return load(model, progress=report, **kwargs)
