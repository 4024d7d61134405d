"""The errors a request can meet in the server, defined once, and the one function that renders them.

Routes, request parsing and the scheduler raise these domain errors (a model that is not in the store,
a full queue, a prompt longer than the context, a bad option, a feature the model lacks); none of them
knows about HTTP. :func:`render` maps any exception to a status code, headers and the error shape of
the protocol the request came through (Ollama's ``{"error": msg}``; OpenAI's ``{"error": {message,
type, param, code}}`` under ``/v1``). Nothing matches message text: the class decides.
"""

from __future__ import annotations

from typing import Any

from llmedge.errors import LlmedgeError, ModelNotFoundError, StoreError


class HTTPError(LlmedgeError):
    """A request refused with ``status`` and a one-line ``message``; the base of the domain errors
    below (used as is only for refusals that are HTTP's own: a body too large, a missing key)."""

    status = 400
    retry_after: str | None = None
    code: str | None = None  # OpenAI's error ``code`` (``context_length_exceeded``); None: null
    param: str | None = None  # OpenAI's ``param``: the request field at fault, when one is

    def __init__(self, status: int, message: str, type_: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.headers = headers if headers is not None else (
            {"Retry-After": self.retry_after} if self.retry_after else None)


class _Fixed(HTTPError):
    """A domain error: the class fixes the status."""

    def __init__(self, message: str) -> None:
        super().__init__(type(self).status, message)


class BadRequest(_Fixed):
    """The request is malformed: a missing or wrongly typed field."""


class BadOption(BadRequest):
    """An option's value is of the wrong type or out of range."""


class Unsupported(BadRequest):
    """The model cannot do what the request asks (tools, thinking, images, suffix)."""


class ContextTooLong(BadRequest):
    """The input does not fit the model's context (and cannot be cut, or the protocol says not to)."""

    code = "context_length_exceeded"

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ModelNotFound(_Fixed):
    """The named model is not in the store."""

    status = 404

    def __init__(self, name: str) -> None:
        super().__init__(f"model '{name}' not found")


class QueueFull(_Fixed):
    """Every slot is busy and the queue is full: try again shortly."""

    status = 503
    retry_after = "1"


class ShuttingDown(_Fixed):
    """The server is stopping and takes no new work."""

    status = 503
    retry_after = "5"

    def __init__(self, message: str = "the server is shutting down") -> None:
        super().__init__(message)


OPENAI_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
                413: "invalid_request_error", 429: "rate_limit_error", 503: "server_error"}


def error_body(path: str, status: int, message: str, type_: str | None = None, code: str | None = None,
               param: str | None = None) -> dict[str, Any]:
    """Ollama's ``{"error": msg}``; under ``/v1`` OpenAI's ``{"error": {"message", "type", ...}}``."""
    if path.startswith("/v1"):
        kind = type_ or OPENAI_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
        return {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return {"error": message}


def render(path: str, e: BaseException) -> tuple[int, dict[str, Any], dict[str, str] | None]:
    """``(status, body, headers)`` for any exception a request raised, in the shape of ``path``'s API."""
    if isinstance(e, HTTPError):
        return e.status, error_body(path, e.status, e.message, e.type, e.code, e.param), e.headers
    if isinstance(e, ModelNotFoundError):
        return 404, error_body(path, 404, str(e)), None
    if isinstance(e, StoreError | LlmedgeError):
        return 400, error_body(path, 400, str(e)), None
    msg = f"internal error: {type(e).__name__}: {e}"
    return 500, error_body(path, 500, msg), None
