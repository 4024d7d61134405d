"""A fake Hugging Face Hub on 127.0.0.1: the routes huggingface_hub calls to list and download files.

GET /api/models/<org>/<repo>/tree/<rev> (the recursive file listing with LFS sha256 oids), HEAD and
GET /<org>/<repo>/resolve/<rev>/<path> (X-Repo-Commit, ETag / X-Linked-Etag, X-Linked-Size,
Content-Length, Range), and the Hub's error headers (X-Error-Code RepoNotFound / EntryNotFound).
Every request is recorded as (method, path, Range header).
"""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class FakeHub:
    repos: dict[str, dict[str, bytes | Path]] = field(default_factory=dict)  # "org/repo" -> {path: bytes/file}
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    url: str = ""
    token: str | None = None  # when set, every route needs "Authorization: Bearer <token>" (a gated repo)
    drop_after: int | None = None  # the next file GET stops after this many bytes (connection dropped)
    corrupt: bool = False  # serve other bytes than the listing's sha256 (and the ETag) promise

    def gets(self, part: str) -> int:
        return sum(1 for m, p, _ in self.requests if m == "GET" and "/resolve/" in p and part in p)


_SHA256: dict[Path, str] = {}


def _bytes(data: bytes | Path) -> bytes:
    return data.read_bytes() if isinstance(data, Path) else data


def _sha256(data: bytes | Path) -> str:
    if isinstance(data, Path):
        if data not in _SHA256:
            _SHA256[data] = hashlib.sha256(data.read_bytes()).hexdigest()
        return _SHA256[data]
    return hashlib.sha256(data).hexdigest()


def _tree(files: dict[str, bytes | Path]) -> list[dict[str, Any]]:
    out = []
    for path, value in sorted(files.items()):
        data = _bytes(value)
        entry: dict[str, Any] = {"type": "file", "path": path, "size": len(data),
                                 "oid": hashlib.sha1(data).hexdigest()}
        if path.endswith(".gguf"):
            entry["lfs"] = {"oid": _sha256(value), "size": len(data), "pointerSize": 134}
        out.append(entry)
    return out


def _handler(hub: FakeHub):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _error(self, status: int, code: str) -> None:
            body = json.dumps({"error": code}).encode()
            self.send_response(status)
            self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _route(self) -> None:
            hub.requests.append((self.command, self.path, self.headers.get("Range")))
            if hub.token is not None and self.headers.get("Authorization") != f"Bearer {hub.token}":
                return self._error(401, "GatedRepo")
            path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
            parts = path.split("/")
            if path.startswith("/api/models/") and len(parts) >= 7 and parts[5] == "tree":
                repo = hub.repos.get(f"{parts[3]}/{parts[4]}")
                if repo is None:
                    return self._error(404, "RepoNotFound")
                body = json.dumps(_tree(repo)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                return self.wfile.write(body)
            if len(parts) >= 6 and parts[3] == "resolve":
                repo = hub.repos.get(f"{parts[1]}/{parts[2]}")
                if repo is None:
                    return self._error(404, "RepoNotFound")
                data = repo.get("/".join(parts[5:]))
                if data is None:
                    return self._error(404, "EntryNotFound")
                return self._file(data, "/".join(parts[5:]).endswith(".gguf"))  # bytes or a file
            self._error(404, "RepoNotFound")

        def _file(self, value: bytes | Path, lfs: bool) -> None:
            data = _bytes(value)
            etag = _sha256(value) if lfs else hashlib.sha1(data).hexdigest()
            if hub.corrupt:
                data = data[:-1] + bytes([data[-1] ^ 1])
            start = 0
            rng = self.headers.get("Range")
            if rng and rng.startswith("bytes=") and rng.endswith("-"):
                start = int(rng[6:-1])
            body = data[start:]
            self.send_response(206 if start else 200)
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("ETag", f'"{etag}"')
            if lfs:
                self.send_header("X-Linked-Etag", f'"{etag}"')
                self.send_header("X-Linked-Size", str(len(data)))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(len(body)))
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.end_headers()
            if self.command == "GET":
                if hub.drop_after is not None:
                    body, hub.drop_after = body[: hub.drop_after], None
                    self.close_connection = True
                self.wfile.write(body)

        do_GET = _route  # noqa: N815
        do_HEAD = _route  # noqa: N815

    return Handler


def serve(hub: FakeHub) -> http.server.ThreadingHTTPServer:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    server.daemon_threads = True
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server
