"""Content-addressed blob files: resumable, locked, verified writes, and links to files kept elsewhere.

A blob `sha256-<hex>` becomes visible only by an atomic rename after its size and digest check out.
Until then its bytes live in `.partial-sha256-<hex>` (kept across interrupted pulls, so the next pull
resumes where the last one stopped; a parallel download of byte ranges keeps each range's progress
in `.partial-sha256-<hex>.ranges`), guarded by an exclusive lock on `.partial-sha256-<hex>.lock`
so two processes pulling the same blob take turns instead of writing into one file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .errors import StoreError
from .fsutil import fsync_dir
from .names import parse_digest

CHUNK = 1 << 20
PARTIAL_PREFIX = ".partial-"

# read(start, end) yields the blob's bytes [start, end) (end None: to the end), resuming by itself after
# transient failures and raising StoreError once it gives up.
RangeReader = Callable[[int, "int | None"], Iterator[bytes]]
# fill(partial, report) makes the partial file complete, calling report(bytes_done) as it goes.
Fill = Callable[[Path, Callable[[int], None]], None]
STATE_SUFFIX = ".ranges"
SAVE_EVERY = 4 << 20


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


def hash_file(path: Path) -> Any:
    h = hashlib.sha256()
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


def sequential_fill(read: RangeReader, size: int | None) -> Fill:
    """Append to the partial file from where it ends (a file longer than `size` starts over)."""

    def fill(part: Path, report: Callable[[int], None]) -> None:
        have = part.stat().st_size if part.is_file() else 0
        state = part.with_name(part.name + STATE_SUFFIX)
        if state.exists() or state.with_name(state.name + ".tmp").exists() or (size is not None and have > size):
            part.unlink(missing_ok=True)  # a parallel download's preallocated file: start over
            _drop_ranges(state)
            have = 0
        with open(part, "ab") as out:
            if size is None or have < size:
                for chunk in read(have, None):
                    out.write(chunk)
                    have += len(chunk)
                    report(have)
            out.flush()
            os.fsync(out.fileno())

    return fill


def _split(size: int, parts: int) -> list[list[int]]:
    step = -(-size // parts)
    return [[s, min(s + step, size), 0] for s in range(0, size, step)]


def _load_ranges(state: Path, size: int) -> list[list[int]] | None:
    try:
        ranges = json.loads(state.read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(ranges, list) and all(
        isinstance(r, list) and len(r) == 3 and all(isinstance(x, int) for x in r) and 0 <= r[2] <= r[1] - r[0]
        for r in ranges) and sum(r[1] - r[0] for r in ranges) == size
    return ranges if ok else None


def _drop_ranges(state: Path) -> None:
    """Remove a ranged download's progress record (and the temp file of its last update)."""
    state.unlink(missing_ok=True)
    state.with_name(state.name + ".tmp").unlink(missing_ok=True)


def _save_ranges(state: Path, ranges: list[list[int]]) -> None:
    tmp = state.with_name(state.name + ".tmp")
    tmp.write_text(json.dumps(ranges))
    os.replace(tmp, state)


def parallel_fill(read: RangeReader, size: int, parts: int) -> Fill:
    """Download `parts` byte ranges at once into a preallocated partial file; the progress of each
    range is kept beside it (`.ranges`) so an interrupted pull resumes every range where it stopped."""

    def fill(part: Path, report: Callable[[int], None]) -> None:
        state = part.with_name(part.name + STATE_SUFFIX)
        ranges = _load_ranges(state, size) if part.is_file() else None
        if ranges is None:
            if part.is_file() and not state.exists() and part.stat().st_size <= size:
                return sequential_fill(read, size)(part, report)  # a sequential pull's partial file
            ranges = _split(size, parts)
            _save_ranges(state, ranges)  # first: a preallocated file never lacks its progress record,
            with open(part, "wb") as f:  # which would make its zeros look like downloaded bytes
                f.truncate(size)
        lock = threading.Lock()
        errors: list[BaseException] = []
        total = [sum(r[2] for r in ranges)]

        def save() -> None:  # called with `lock` held; records only bytes already flushed
            _save_ranges(state, ranges)

        def worker(r: list[int]) -> None:
            every = min(SAVE_EVERY, max(4096, (r[1] - r[0]) // 16))
            pending = 0
            try:
                with open(part, "r+b") as f:
                    f.seek(r[0] + r[2])
                    try:
                        for chunk in read(r[0] + r[2], r[1]):
                            f.write(chunk)
                            pending += len(chunk)
                            with lock:
                                total[0] += len(chunk)
                                report(total[0])
                            if pending >= every:
                                f.flush()
                                with lock:
                                    r[2] += pending
                                    save()
                                pending = 0
                    finally:
                        f.flush()
                        with lock:
                            r[2] += pending
            except BaseException as e:  # noqa: BLE001 - re-raised by the caller below
                errors.append(e)

        with lock:
            save()
        threads = [threading.Thread(target=worker, args=(r,)) for r in ranges if r[2] < r[1] - r[0]]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        with lock:
            save()
        if errors:
            raise errors[0]
        if any(r[2] != r[1] - r[0] for r in ranges):
            raise StoreError("a ranged download ended early")
        with open(part, "r+b") as f:  # durable before the rename makes it the blob
            os.fsync(f.fileno())

    return fill


class BlobDir:
    """The `blobs/` folder of a store."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def blob(self, digest: str) -> Path:
        return self.path / f"sha256-{parse_digest(digest)}"

    def partial(self, digest: str) -> Path:
        return self.path / f"{PARTIAL_PREFIX}sha256-{parse_digest(digest)}"

    def fetch(self, digest: str, size: int | None, fill: Fill, report: Callable[[int], None]) -> Path:
        """The blob `digest`, downloaded by `fill` unless already present and valid. `fill` resumes
        what an interrupted pull left in the partial file; the digest is checked before the blob
        becomes visible, and a partial file that fails the check is discarded."""
        hexd = parse_digest(digest)
        blob, part = self.blob(digest), self.partial(digest)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            with locked(part.with_name(part.name + ".lock")):
                if blob.is_file() and (size is None or blob.stat().st_size == size):
                    report(blob.stat().st_size)
                    _drop_ranges(part.with_name(part.name + STATE_SUFFIX))  # a pull killed after its rename left it
                else:
                    self._complete(f"sha256:{hexd}", size, fill, report)
        except OSError as e:  # a read-only or full disk (network errors arrive as StoreError)
            raise StoreError(f"cannot write into the model store's blobs {self.path}: {e.strerror or e}") from None
        with contextlib.suppress(OSError):  # also when a killed pull left it after the rename
            part.with_name(part.name + ".lock").unlink()
        return blob

    def _complete(self, digest: str, size: int | None, fill: Fill, report: Callable[[int], None]) -> None:
        """With the lock held: fill the partial file, verify it, and rename it to the blob."""
        hexd = parse_digest(digest)
        blob, part = self.blob(digest), self.partial(digest)
        state = part.with_name(part.name + STATE_SUFFIX)
        fill(part, report)
        got_size = part.stat().st_size
        got = hash_file(part).hexdigest()
        if got != hexd or (size is not None and got_size != size):
            part.unlink(missing_ok=True)
            _drop_ranges(state)
            raise StoreError(f"blob sha256:{hexd[:12]} failed verification: got sha256:{got[:12]}, "
                             f"{got_size} bytes; the partial download was discarded")
        os.chmod(part, 0o644)
        os.replace(part, blob)
        _drop_ranges(state)
        fsync_dir(self.path)

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
        tmp = self.path / f"{PARTIAL_PREFIX}{os.getpid()}-link-{parse_digest(digest)}"
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
