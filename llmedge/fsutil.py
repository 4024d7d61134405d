"""Crash-safe file writing helpers: temporary files named after the writing process, and the repair
that removes those a killed process left behind (its pid is no longer alive)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, someone else's
    return True


def remove_stale_temps(directory: Path, prefix: str, suffix: str = "") -> int:
    """Delete ``<prefix><pid>-*<suffix>`` files in ``directory`` whose writer ``pid`` is dead; returns
    how many went. A live writer's file (this process's included) is never touched."""
    removed = 0
    try:
        names = os.listdir(directory)
    except OSError:
        return 0
    for name in names:
        if not name.startswith(prefix) or not name.endswith(suffix):
            continue
        pid_text = name[len(prefix):].split("-", 1)[0].split(".", 1)[0]
        if not pid_text.isdigit() or pid_alive(int(pid_text)):
            continue
        with contextlib.suppress(OSError):
            os.unlink(directory / name)
            removed += 1
    return removed


def fsync_dir(directory: Path) -> None:
    """Make a rename or unlink in ``directory`` durable (best effort: some systems cannot)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def umask_mode(mode: int = 0o666) -> int:
    """``mode`` as a plain ``open()`` would create it under the current umask (temp files are 0600)."""
    mask = os.umask(0)
    os.umask(mask)
    return mode & ~mask


def temp_path(final: Path, suffix: str = ".tmp") -> tuple[int, Path]:
    """A new, empty temporary file beside ``final`` (same directory, so a rename over it is atomic),
    named ``.<final name>.<pid>-<random><suffix>`` for `remove_stale_temps` to recognize once its
    writer is dead; returns its descriptor and path."""
    import tempfile

    fd, name = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name}.{os.getpid()}-", suffix=suffix)
    return fd, Path(name)


@contextlib.contextmanager
def atomic_write(final: Path) -> Iterator[BinaryIO]:
    """Write ``final`` through a temporary file beside it, fsynced and renamed over it when the body
    ends normally: an error or Ctrl-C part-way leaves ``final`` as it was (absent, or the earlier
    file), never half a file. Temporary files that killed writers left are removed first; an OSError
    creating the temporary file names ``final``, not it."""
    remove_stale_temps(final.parent, f".{final.name}.", ".tmp")
    try:
        fd, tmp = temp_path(final)
    except OSError as e:
        raise OSError(e.errno, e.strerror, str(final)) from None
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, umask_mode())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(final.parent)
