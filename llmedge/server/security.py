"""Request safety for the server: Host header check (DNS rebinding), CORS, API key, body size limit,
and the error shapes every refusal uses (Ollama's ``{"error": ...}``, OpenAI's under ``/v1``).

It is one pure ASGI middleware so that nothing reaches a route before these checks pass.
"""

from __future__ import annotations

import fnmatch
import hmac
import ipaddress
import json
import os
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from starlette.responses import JSONResponse, Response

from llmedge.server.errors import BadRequest, HTTPError, error_body  # noqa: F401 - HTTPError: re-exported

DEFAULT_MAX_BODY = 16 << 20  # bytes; LLMEDGE_MAX_BODY overrides
UNLIMITED_BODY_PREFIXES = ("/api/blobs/",)  # model uploads: streamed to disk and digest-checked
PUBLIC_PATHS = frozenset({"/", "/health"})
LOCAL_ORIGIN_HOSTS = ("localhost", "127.0.0.1", "[::1]", "0.0.0.0")
LOCAL_SCHEMES = ("app", "file", "tauri", "vscode-webview", "vscode-file")


def error_response(path: str, status: int, message: str, type_: str | None = None,
                   headers: dict[str, str] | None = None) -> Response:
    return JSONResponse(error_body(path, status, message, type_), status_code=status, headers=headers)


def is_loopback_host(host: str) -> bool:
    """True for names and addresses that only reach this machine."""
    h = host.strip().lower().strip("[]")
    if h == "localhost" or h.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def split_host_header(value: str) -> str:
    """The host part of a Host header (``name``, ``name:port``, ``[v6]:port``)."""
    value = value.strip()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    if value.count(":") == 1:
        return value.split(":", 1)[0]
    return value


def env_origins() -> list[str]:
    return [o.strip() for o in os.environ.get("LLMEDGE_ORIGINS", "").split(",") if o.strip()]


def origin_allowed(origin: str, extra: Iterable[str] = ()) -> bool:
    """Local origins (http(s) on a loopback name, any port; desktop app schemes) plus ``extra`` patterns."""
    for pattern in extra:
        if pattern == "*" or fnmatch.fnmatchcase(origin, pattern):
            return True
    scheme, sep, rest = origin.partition("://")
    if not sep:
        return False
    if scheme in LOCAL_SCHEMES:
        return True
    if scheme not in ("http", "https"):
        return False
    host = split_host_header(rest.split("/", 1)[0])
    return is_loopback_host(host) or host == "0.0.0.0"


Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]


class SecurityMiddleware:
    """Refuses unknown Hosts (while bound to loopback), foreign Origins, missing API keys and large bodies;
    answers CORS preflights; counts every response for the metrics."""

    def __init__(self, app: Any, *, loopback: bool, api_key: str | None, origins: Iterable[str] = (),
                 max_body: int = DEFAULT_MAX_BODY, on_response: Callable[[str, int], None] | None = None
                 ) -> None:
        self.app = app
        self.loopback = loopback
        self.api_key = api_key or None
        self.origins = list(origins)
        self.max_body = max_body
        self.on_response = on_response

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "/")
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        status_box = [0]

        async def counting_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status_box[0] = message["status"]
                origin = headers.get("origin")
                if origin and origin_allowed(origin, self.origins):
                    message.setdefault("headers", [])
                    message["headers"] = list(message["headers"]) + _cors_headers(origin)
            await send(message)

        try:
            refusal = self._check(scope, path, headers)
            if refusal is not None:
                await refusal(scope, receive, counting_send)
                return
            if scope.get("method") == "OPTIONS" and "access-control-request-method" in headers:
                await Response(status_code=204, headers=_preflight_headers(headers))(
                    scope, receive, counting_send)
                return
            limited = not path.startswith(UNLIMITED_BODY_PREFIXES)
            await self.app(scope, self._limited(receive, path) if limited else receive, counting_send)
        except BodyTooLarge:
            if status_box[0] == 0:
                await error_response(path, 413, f"request body exceeds {self.max_body} bytes")(
                    scope, receive, counting_send)
        finally:
            if self.on_response is not None:
                self.on_response(path, status_box[0] or 499)

    def _check(self, scope: dict[str, Any], path: str, headers: dict[str, str]) -> Response | None:
        if self.loopback:
            host = split_host_header(headers.get("host", ""))
            if not host or not is_loopback_host(host):
                return error_response(path, 403, f"host '{host}' is not allowed while bound to loopback")
        origin = headers.get("origin")
        if origin and not origin_allowed(origin, self.origins):
            return error_response(path, 403, f"origin '{origin}' is not allowed (set LLMEDGE_ORIGINS)")
        preflight = scope.get("method") == "OPTIONS" and "access-control-request-method" in headers
        if self.api_key and path not in PUBLIC_PATHS and not preflight:
            auth = headers.get("authorization", "")
            scheme, _, token = auth.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(),
                                                                     self.api_key.encode()):
                return error_response(path, 401, "missing or invalid API key (Authorization: Bearer <key>)")
        length = headers.get("content-length")
        if length is not None and not path.startswith(UNLIMITED_BODY_PREFIXES):
            try:
                n = int(length)
            except ValueError:
                return error_response(path, 400, "invalid Content-Length")
            if n < 0:
                return error_response(path, 400, "invalid Content-Length")
            if n > self.max_body:
                return error_response(path, 413, f"request body exceeds {self.max_body} bytes")
        return None

    def _limited(self, receive: Receive, path: str) -> Receive:
        seen = [0]

        async def wrapped() -> dict[str, Any]:
            message = await receive()
            if message["type"] == "http.request":
                seen[0] += len(message.get("body", b""))
                if seen[0] > self.max_body:
                    raise BodyTooLarge()
            return message

        return wrapped


class BodyTooLarge(Exception):
    pass


def _cors_headers(origin: str) -> list[tuple[bytes, bytes]]:
    return [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin")]


def _preflight_headers(headers: dict[str, str]) -> dict[str, str]:
    return {
        "access-control-allow-methods": "GET, POST, PUT, DELETE, OPTIONS, HEAD",
        "access-control-allow-headers": headers.get("access-control-request-headers",
                                                    "authorization, content-type"),
        "access-control-max-age": "600",
    }


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json_body(raw: bytes, path: str) -> dict[str, Any]:
    """The request's JSON object, or BadRequest saying why not."""
    if not raw.strip():
        raise BadRequest("missing request body")
    try:
        data = json.loads(raw, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(f"invalid JSON: {e}") from None
    except RecursionError:
        raise BadRequest("invalid JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise BadRequest("the request body must be a JSON object")
    return data
