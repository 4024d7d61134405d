"""Pulls from an Ollama registry (registry.ollama.ai or HOST/NAMESPACE/NAME:TAG), as `ollama pull` does.

GET /v2/<namespace>/<name>/manifests/<tag> gives the image manifest; the GGUF layer is fetched from
/v2/<namespace>/<name>/blobs/<digest> (following redirects to a CDN, without passing credentials on
to another host) with ranged requests that resume a partial file, and becomes visible only after its
sha256 checks out (`llmedge.blobs`); a large blob comes in up to 8 byte ranges at once. The small params/system/template/license/messages layers are
read into the model's defaults, each verified against its digest. A 401 with a Bearer challenge is
answered with an anonymous token from the challenge's realm. https only, unless `insecure`.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from . import __version__
from .blobs import RangeReader, parallel_fill, sequential_fill
from .errors import ModelNotFoundError, StoreError
from .names import ModelName, parse_digest
from .ollama_store import MAX_SMALL_LAYER, config_from_layers, model_layer
from .sources import Progress

MANIFEST_ACCEPT = "application/vnd.docker.distribution.manifest.v2+json"
MAX_MANIFEST = 4 << 20
CHUNK = 1 << 20
MAX_PARTS = 8  # parallel ranged requests per blob (of at least `Store.part_size` bytes each)


class _Transient(StoreError):
    """A failure worth retrying (connection dropped, truncated body, HTTP 5xx/429)."""


class _HTTPError(StoreError):
    def __init__(self, message: str, status: int, headers: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Follow http(s) redirects only; drop credentials when the host changes; no https->http unless
    insecure."""

    def __init__(self, insecure: bool) -> None:
        self.insecure = insecure

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        old, new = urllib.parse.urlsplit(req.full_url), urllib.parse.urlsplit(newurl)
        if new.scheme not in ("http", "https") or (new.scheme == "http" and not self.insecure):
            raise StoreError(f"refusing redirect to {newurl[:200]!r}")
        out = super().redirect_request(req, fp, code, msg, headers, newurl)
        if out is not None and old.netloc != new.netloc:
            out.remove_header("Authorization")
        return out


def parse_challenge(header: str) -> dict[str, str]:
    """The parameters of a `Bearer realm="...",service="...",scope="..."` challenge."""
    scheme, _, rest = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return {}
    out = {}
    for part in rest.split(","):
        key, _, value = part.strip().partition("=")
        out[key.strip().lower()] = value.strip().strip('"')
    return out


class RegistryClient:
    """HTTP access to one repository of one registry."""

    def __init__(self, name: ModelName, insecure: bool = False, timeout: float = 60.0, attempts: int = 3,
                 retry_delay: float = 0.5) -> None:
        scheme = "http" if insecure else "https"
        self.name = name
        self.base = f"{scheme}://{name.registry}/v2/{name.repository}"
        self.insecure = insecure
        self.timeout = timeout
        self.attempts = max(1, attempts)
        self.retry_delay = retry_delay
        self.token: str | None = None
        self._opener = urllib.request.build_opener(_Redirects(insecure))

    # -- HTTP ---------------------------------------------------------------------------------
    def _request(self, url: str, headers: dict[str, str]) -> http.client.HTTPResponse:
        hdrs = {"User-Agent": f"llmedge/{__version__}", **headers}
        if self.token:
            hdrs["Authorization"] = f"Bearer {self.token}"
        try:
            return self._opener.open(urllib.request.Request(url, headers=hdrs), timeout=self.timeout)
        except urllib.error.HTTPError as e:
            e.close()
            if e.code >= 500 or e.code == 429:
                raise _Transient(f"{url}: HTTP {e.code} {e.reason}") from None
            raise _HTTPError(f"{url}: HTTP {e.code} {e.reason}", e.code, e.headers) from None
        except StoreError:
            raise
        except (OSError, http.client.HTTPException, ValueError) as e:
            reason = e.reason if isinstance(e, urllib.error.URLError) else e
            if isinstance(reason, ssl.SSLError) and not self.insecure:  # not worth retrying
                hint = "" if isinstance(reason, ssl.SSLCertVerificationError) else (
                    " (a registry that speaks plain http needs `llmedge pull --insecure`)")
                raise StoreError(f"{url}: {_reason(e)}{hint}") from None
            raise _Transient(f"{url}: {_reason(e)}") from None

    def open(self, url: str, headers: dict[str, str] | None = None) -> http.client.HTTPResponse:
        """GET `url`, answering one Bearer challenge with a token from its realm."""
        try:
            return self._request(url, headers or {})
        except _HTTPError as e:
            if e.status != 401 or self.token is not None:
                raise
            self.token = self._fetch_token(e.headers.get("WWW-Authenticate", "") if e.headers else "")
            return self._request(url, headers or {})

    def _fetch_token(self, challenge: str) -> str:
        params = parse_challenge(challenge)
        realm = params.get("realm", "")
        scheme = urllib.parse.urlsplit(realm).scheme
        if scheme not in ("http", "https") or (scheme == "http" and not self.insecure):
            raise StoreError(f"registry {self.name.registry} asks for credentials llmedge cannot give "
                             f"(challenge {challenge[:100]!r})")
        query = urllib.parse.urlencode({k: v for k, v in params.items() if k in ("service", "scope")})
        with self._request(f"{realm}?{query}" if query else realm, {"Accept": "application/json"}) as resp:
            try:
                data = json.loads(resp.read(1 << 20))
            except ValueError:
                data = None
        token = (data.get("token") or data.get("access_token")) if isinstance(data, dict) else None
        if not isinstance(token, str) or not token:
            raise StoreError(f"registry {self.name.registry}: the token service gave no token")
        return token

    def retrying(self, fn: Callable[[], Any]) -> Any:
        for attempt in range(self.attempts):
            try:
                return fn()
            except _Transient as e:
                if attempt + 1 >= self.attempts:
                    raise StoreError(str(e)) from None
                time.sleep(self.retry_delay * (2**attempt))
        raise AssertionError("unreachable")

    # -- registry objects ---------------------------------------------------------------------
    def manifest(self) -> dict[str, Any]:
        url = f"{self.base}/manifests/{self.name.tag}"

        def once() -> bytes:
            with self.open(url, {"Accept": MANIFEST_ACCEPT}) as resp:
                return _read_limited(resp, MAX_MANIFEST, url)

        try:
            body = self.retrying(once)
        except _HTTPError as e:
            if e.status == 404:
                raise ModelNotFoundError(f"model '{self.name.full}' not found in registry {self.name.registry} "
                                 "(no such name or tag)") from None
            raise StoreError(str(e)) from None
        try:
            data = json.loads(body)
        except ValueError:
            raise StoreError(f"{url}: the manifest is not JSON") from None
        if not isinstance(data, dict):
            raise StoreError(f"{url}: the manifest is not a JSON object")
        return data

    def small_blob(self, layer: dict[str, Any]) -> bytes:
        hexd = parse_digest(layer.get("digest"))
        url = f"{self.base}/blobs/sha256:{hexd}"

        def once() -> bytes:
            with self.open(url) as resp:
                return _read_limited(resp, MAX_SMALL_LAYER, url)

        body = self.retrying(once)
        if hashlib.sha256(body).hexdigest() != hexd:
            raise StoreError(f"layer sha256:{hexd[:12]} from {self.name.registry} failed verification")
        return body

    def reader(self, digest: str) -> RangeReader:
        """A `llmedge.blobs` range reader for one blob: ranged GETs that resume after a dropped
        connection (up to `attempts` times in a row without progress)."""
        url = f"{self.base}/blobs/sha256:{parse_digest(digest)}"

        def read(start: int, end: int | None) -> Iterator[bytes]:
            pos, failures = start, 0
            while end is None or pos < end:
                want = f"bytes={pos}-" + (str(end - 1) if end is not None else "")
                headers = {"Range": want} if pos or end is not None else {}
                try:
                    with self.open(url, headers) as resp:
                        skip = pos if resp.status != 206 else 0  # the server ignored the range
                        length = resp.headers.get("Content-Length", "")
                        stop = (pos - skip + int(length)) if length.isdigit() else None
                        while chunk := resp.read1(CHUNK):
                            if skip:
                                cut = min(skip, len(chunk))
                                chunk, skip = chunk[cut:], skip - cut
                            if end is not None:
                                chunk = chunk[: end - pos]
                            if chunk:
                                pos += len(chunk)
                                failures = 0
                                yield chunk
                            if end is not None and pos >= end:
                                return
                    if end is None and (stop is None or pos >= stop):
                        return
                    raise _Transient(f"download from {self.name.registry} ended early at byte {pos}")
                except (_Transient, OSError, http.client.HTTPException) as e:
                    failures += 1
                    if failures >= self.attempts:
                        reason = str(e) if isinstance(e, StoreError) else _reason(e)
                        raise StoreError(f"download from {self.name.registry} failed: {reason}") from None
                    time.sleep(self.retry_delay * (2 ** (failures - 1)))

        return read


def _read_limited(resp: http.client.HTTPResponse, limit: int, url: str) -> bytes:
    try:
        body = resp.read(limit + 1)
    except (OSError, http.client.HTTPException) as e:
        raise _Transient(f"{url}: {_reason(e)}") from None
    if len(body) > limit:
        raise StoreError(f"{url}: larger than {limit} bytes")
    return body


def _reason(e: BaseException) -> str:
    if isinstance(e, urllib.error.URLError) and isinstance(e.reason, BaseException):
        e = e.reason
    if isinstance(e, http.client.IncompleteRead):
        return "connection closed early (truncated download)"
    return " ".join((str(e) or type(e).__name__).split())


def _check_space(folder: Path, size: int, blob: Path) -> None:
    import shutil

    if blob.is_file():
        return
    free = shutil.disk_usage(folder).free
    if size > free:
        raise StoreError(f"not enough disk space for a {size} byte model in {folder} ({free} bytes free)")


def pull_registry(store: Any, name: ModelName, report: Progress) -> Path:
    """Pull `name` from its Ollama registry into `store`; returns the GGUF blob's path."""
    client = RegistryClient(name, store.insecure, store.timeout, store.attempts, min(store.retry_delay, 0.5))
    report("pulling manifest")
    manifest = client.manifest()
    layer = model_layer(manifest)
    digest, size = "sha256:" + parse_digest(layer["digest"]), layer["size"]
    config = config_from_layers(manifest, client.small_blob)
    store._ensure_dirs()
    _check_space(store.blobs_dir, size, store.blob_path(digest))
    pulling = f"pulling {parse_digest(digest)[:12]}"
    report(pulling, digest=digest, total=size, completed=0)
    read = client.reader(digest)
    parts = min(MAX_PARTS, size // store.part_size)
    fill = parallel_fill(read, size, parts) if parts > 1 else sequential_fill(read, size)
    blob = store.blobs.fetch(digest, size, fill,
                             lambda done: report(pulling, digest=digest, total=size, completed=done))
    report("verifying sha256 digest")
    report("writing manifest")
    source = {"type": "ollama-registry", "registry": name.registry, "repository": name.repository,
              "tag": name.tag}
    store.register(name.full, digest, size, source, config)
    report("success")
    return blob
