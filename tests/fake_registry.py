"""A fake Ollama registry on 127.0.0.1 for the tests: real HTTP, Docker-style manifests and blobs.

Routes: GET /v2/<ns>/<name>/manifests/<tag>, GET /v2/<ns>/<name>/blobs/<digest> (Range honoured), and
GET /token (the realm of a Bearer challenge). Switches: `redirect_to` (blobs answer 307 to a second
server), `require_token` (401 + WWW-Authenticate until a token is shown), `drop_after` (the next blob
response stops after that many bytes), `throttle` (seconds of sleep per 4 KB), `corrupt` (serve
different bytes than the digest says). Every request is recorded with its Range header.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

MEDIA = "application/vnd.ollama.image."


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass
class FakeRegistry:
    blobs: dict[str, bytes] = field(default_factory=dict)
    manifests: dict[str, bytes] = field(default_factory=dict)  # "ns/name:tag" -> manifest JSON
    requests: list[tuple[str, str | None]] = field(default_factory=list)
    redirect_to: FakeRegistry | None = None
    require_token: bool = False
    token: str = "tok-123"
    drop_after: int | None = None
    throttle: float = 0.0
    corrupt: bool = False
    url: str = ""
    host: str = ""

    def add_model(self, repo: str, tag: str, gguf: bytes, **small: Any) -> str:
        """Publish `gguf` (and params/system/template/license/messages layers) as repo:tag."""
        layers = [self._layer("model", gguf)]
        for kind, value in small.items():
            data = json.dumps(value).encode() if kind in ("params", "messages") else value.encode()
            layers.append(self._layer(kind, data))
        config = self._layer("config", b'{"model_format":"gguf"}')
        config["mediaType"] = "application/vnd.docker.container.image.v1+json"
        manifest = {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                    "config": config, "layers": layers}
        self.manifests[f"{repo}:{tag}"] = json.dumps(manifest).encode()
        return layers[0]["digest"]

    def _layer(self, kind: str, data: bytes) -> dict[str, Any]:
        d = digest(data)
        self.blobs[d] = data
        if self.redirect_to is not None:
            self.redirect_to.blobs[d] = data
        return {"mediaType": MEDIA + kind, "digest": d, "size": len(data)}

    def count(self, part: str) -> int:
        return sum(1 for path, _ in self.requests if part in path)


def _handler(reg: FakeRegistry):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802
            reg.requests.append((self.path, self.headers.get("Range")))
            if self.path.startswith("/token"):
                return self._send(200, json.dumps({"token": reg.token}).encode())
            if reg.require_token and self.headers.get("Authorization") != f"Bearer {reg.token}":
                realm = f'Bearer realm="{reg.url}/token",service="fake",scope="repository:x:pull"'
                return self._send(401, b'{"errors":[{"code":"UNAUTHORIZED"}]}', {"WWW-Authenticate": realm})
            parts = self.path.split("/")
            if len(parts) == 6 and parts[1] == "v2" and parts[4] == "manifests":
                body = reg.manifests.get(f"{parts[2]}/{parts[3]}:{parts[5]}")
                if body is None:
                    return self._send(404, b'{"errors":[{"code":"MANIFEST_UNKNOWN"}]}')
                return self._send(200, body, {"Content-Type": "application/vnd.docker.distribution.manifest.v2+json"})
            if len(parts) == 6 and parts[1] == "v2" and parts[4] == "blobs":
                if reg.redirect_to is not None:
                    return self._send(307, b"", {"Location": f"{reg.redirect_to.url}/cdn/{parts[5]}"})
                return self._blob(parts[5])
            if len(parts) == 3 and parts[1] == "cdn":
                if self.headers.get("Authorization"):
                    return self._send(400, b"credentials leaked to the CDN")
                return self._blob(parts[2])
            self._send(404, b"not found")

        def _blob(self, d: str) -> None:
            data = reg.blobs.get(d)
            if data is None:
                return self._send(404, b"blob unknown")
            if reg.corrupt:
                data = data[:-1] + bytes([data[-1] ^ 1])
            start, end = 0, len(data)
            rng = self.headers.get("Range")
            if rng and rng.startswith("bytes="):
                a, _, b = rng[6:].partition("-")
                start, end = int(a), (int(b) + 1 if b else len(data))
            body = data[start:end]
            self.send_response(206 if rng else 200)
            self.send_header("Content-Length", str(len(body)))
            if rng:
                self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            limit = reg.drop_after
            if limit is not None and len(body) > 4096:
                reg.drop_after = None
                self.wfile.write(body[:limit])
                self.wfile.flush()
                self.close_connection = True
                return
            try:
                for i in range(0, len(body), 4096):
                    self.wfile.write(body[i:i + 4096])
                    if reg.throttle:
                        self.wfile.flush()
                        time.sleep(reg.throttle)
            except (BrokenPipeError, ConnectionResetError):  # the client was killed: expected
                self.close_connection = True

    return Handler


def serve(reg: FakeRegistry) -> http.server.ThreadingHTTPServer:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(reg))
    server.daemon_threads = True
    reg.host = f"127.0.0.1:{server.server_address[1]}"
    reg.url = f"http://{reg.host}"
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server
