"""Content-addressed blob files: resumable, locked, verified writes, and links to files kept elsewhere.

A blob `sha256-<hex>` becomes visible only by an atomic rename after its size and digest check out.
Until then its bytes live in `.partial-sha256-<hex>` (kept across interrupted pulls, so the next pull
resumes where the last one stopped), guarded by an exclusive lock on `.partial-sha256-<hex>.lock`
so two processes pulling the same blob take turns instead of writing into one file.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from .errors import StoreError
from .names import parse_digest

CHUNK = 1 << 20
PARTIAL_PREFIX = ".partial-"

# fill(offset, out, report) appends the blob's bytes from `offset` to `out`, calling report(total_written)
Fill = Callable[[int, BinaryIO, Callable[[int], None]], None]


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on `path` (created if missing) for the duration of the block."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: no advisory locks, renames stay atomic
        yield
        return
    with open(path, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def hash_file(path: Path, h: hashlib._Hash | None = None) -> hashlib._Hash:
    h = h or hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h


def verifies(path: Path, hexdigest: str, size: int | None = None) -> bool:
    """True when `path` is a file of `size` bytes (if given) whose sha256 is `hexdigest`."""
    try:
        if not path.is_file() or (size is not None and path.stat().st_size != size):
            return False
        return hash_file(path).hexdigest() == hexdigest
    except OSError:
        return False


class BlobDir:
    """The `blobs/` folder of a store."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def blob(self, digest: str) -> Path:
        return self.path / f"sha256-{parse_digest(digest)}"

    def partial(self, digest: str) -> Path:
        return self.path / f"{PARTIAL_PREFIX}sha256-{parse_digest(digest)}"

    def fetch(self, digest: str, size: int | None, fill: Fill, report: Callable[[int], None]) -> Path:
        """The blob `digest`, downloaded by `fill` unless already present and valid. A partial file
        from an interrupted pull is resumed; the digest is checked before the blob becomes visible."""
        hexd = parse_digest(digest)
        blob, part = self.blob(digest), self.partial(digest)
        self.path.mkdir(parents=True, exist_ok=True)
        with locked(part.with_name(part.name + ".lock")):
            if blob.is_file() and (size is None or blob.stat().st_size == size):
                report(blob.stat().st_size)
                return blob
            have = part.stat().st_size if part.is_file() else 0
            if size is not None and have > size:
                part.unlink()
                have = 0
            with open(part, "ab") as out:
                if size is None or have < size:
                    fill(have, out, report)
                out.flush()
                os.fsync(out.fileno())
            got_size = part.stat().st_size
            got = hash_file(part).hexdigest()
            if got != hexd or (size is not None and got_size != size):
                part.unlink(missing_ok=True)
                raise StoreError(f"blob sha256:{hexd[:12]} failed verification: got sha256:{got[:12]}, "
                                 f"{got_size} bytes; the partial download was discarded")
            os.chmod(part, 0o644)
            os.replace(part, blob)
        with contextlib.suppress(OSError):
            part.with_name(part.name + ".lock").unlink()
        return blob

    def link(self, digest: str, target: Path) -> Path:
        """Make the blob `digest` a link to `target` (a file kept by someone else, e.g. the Hugging
        Face cache): a symbolic link, else a hard link, else (last resort) a copy."""
        blob = self.blob(digest)
        self.path.mkdir(parents=True, exist_ok=True)
        target = target.resolve()
        with contextlib.suppress(OSError):
            if blob.is_symlink() and Path(os.readlink(blob)) == target:
                return blob
            if not blob.is_symlink() and blob.is_file() and os.path.samefile(blob, target):
                return blob
        tmp = self.path / f"{PARTIAL_PREFIX}link-{parse_digest(digest)}-{os.getpid()}"
        tmp.unlink(missing_ok=True)
        try:
            try:
                os.symlink(target, tmp)
            except OSError:
                try:
                    os.link(target, tmp)
                except OSError:
                    import shutil

                    shutil.copyfile(target, tmp)
            os.replace(tmp, blob)
        except OSError as e:
            raise StoreError(f"cannot link {target} into the model store: {e.strerror or e}") from None
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()
        return blob
