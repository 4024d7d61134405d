"""The server's configuration: every setting of ``llmedge serve`` (flags, else environment, else
defaults) in one dataclass, and the reading of the environment into it."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from llmedge.errors import LlmedgeError
from llmedge.server.errors import HTTPError
from llmedge.server.security import DEFAULT_MAX_BODY, env_origins

DEFAULT_KEEP_ALIVE = 300.0
DEFAULT_NUM_CTX = 4096
DEFAULT_MAX_CTX = 131072


@dataclass
class ServerConfig:
    """Everything ``llmedge serve`` can set (flags, else environment, else defaults)."""

    host: str = "127.0.0.1"
    port: int = 11434
    parallel: int = 4
    max_queue: int = 64
    keep_alive: float | None = DEFAULT_KEEP_ALIVE
    num_ctx: int = DEFAULT_NUM_CTX
    max_ctx: int = DEFAULT_MAX_CTX
    api_key: str | None = None
    origins: list[str] = field(default_factory=list)
    max_body: int = DEFAULT_MAX_BODY
    backend: str = "auto"
    n_threads: int | None = None
    max_loaded: int = 2
    announce: bool = False  # print a line on stderr once shut down (the serve command)
    # speculative decoding for every request (lookup, draft_model, draft_max, draft_min); a request's
    # options override the numbers
    speculation: dict[str, Any] = field(default_factory=dict)


def env_int(name: str, default: int) -> int:
    v = os.environ.get(name)
    if v is None or not v.strip():
        return default
    try:
        return int(v)
    except ValueError:
        raise LlmedgeError(f"{name}={v!r} is not an integer") from None


def _host_port(host: str, c: ServerConfig) -> None:
    try:
        _parse_host_port(host, c)
    except ValueError:
        raise LlmedgeError(f"LLMEDGE_HOST={host!r} is not HOST, HOST:PORT, :PORT or [IPV6]:PORT") from None
    if not 0 < c.port < 65536:
        raise LlmedgeError(f"LLMEDGE_HOST={host!r}: port {c.port} is out of range (1-65535)")


def _parse_host_port(host: str, c: ServerConfig) -> None:
    if host.startswith("http://"):
        host = host[len("http://"):]
    if host.startswith("[") and "]" in host:
        h, _, port = host[1:].partition("]")
        c.host = h
        if port.startswith(":"):
            c.port = int(port[1:])
    elif host.count(":") == 1:
        h, port = host.split(":")
        c.host, c.port = h or c.host, int(port)
    else:
        c.host = host


def config_from_env(**overrides: Any) -> ServerConfig:
    """A ServerConfig from LLMEDGE_* variables (``OLLAMA_KEEP_ALIVE`` when ``LLMEDGE_KEEP_ALIVE`` is
    unset), then explicit overrides (None means unset)."""
    from llmedge.server.ollama import parse_keep_alive

    c = ServerConfig()
    host = os.environ.get("LLMEDGE_HOST", "")
    if host:
        _host_port(host, c)
    c.parallel = env_int("LLMEDGE_NUM_PARALLEL", c.parallel)
    c.max_queue = env_int("LLMEDGE_MAX_QUEUE", c.max_queue)
    c.num_ctx = env_int("LLMEDGE_CONTEXT_LENGTH", c.num_ctx)
    c.max_ctx = env_int("LLMEDGE_MAX_CTX", c.max_ctx)
    c.max_body = env_int("LLMEDGE_MAX_BODY", c.max_body)
    c.max_loaded = env_int("LLMEDGE_MAX_LOADED_MODELS", c.max_loaded)
    for var in ("LLMEDGE_KEEP_ALIVE", "OLLAMA_KEEP_ALIVE"):
        ka = os.environ.get(var)
        if ka:
            try:
                parsed = parse_keep_alive(ka)
            except HTTPError as e:
                raise LlmedgeError(f"{var}: {e.message}") from None
            c.keep_alive = None if parsed is None else float(parsed)  # type: ignore[arg-type]
            break
    c.api_key = os.environ.get("LLMEDGE_API_KEY") or None
    c.origins = env_origins()
    c.speculation = env_speculation()
    for k, v in overrides.items():
        if v is not None:
            setattr(c, k, v)
    return c


def client_url() -> str:
    """The base URL at which a client on this machine reaches ``llmedge serve``: LLMEDGE_HOST's address
    and port (default 127.0.0.1:11434), a wildcard bind address (0.0.0.0, ::) read as loopback."""
    c = ServerConfig()
    host = os.environ.get("LLMEDGE_HOST", "").strip()
    if host:
        _host_port(host, c)
    h = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(c.host, c.host)
    return f"http://[{h}]:{c.port}" if ":" in h else f"http://{h}:{c.port}"


SPECULATIVE_OPTIONS = ("lookup", "draft_max", "draft_min")  # Ollama options (llama.cpp's names), out of sampling


def env_speculation() -> dict[str, Any]:
    """Speculative decoding for every request from LLMEDGE_LOOKUP, LLMEDGE_DRAFT_MODEL,
    LLMEDGE_DRAFT_MAX and LLMEDGE_DRAFT_MIN (``llmedge serve --lookup / --draft-model ...`` override them)."""
    out: dict[str, Any] = {}
    for key, env in (("lookup", "LLMEDGE_LOOKUP"), ("draft_max", "LLMEDGE_DRAFT_MAX"),
                     ("draft_min", "LLMEDGE_DRAFT_MIN")):
        value = os.environ.get(env, "").strip()
        if value:
            try:
                out[key] = int(value)
            except ValueError:
                raise LlmedgeError(f"{env} must be a whole number, not {value!r}") from None
    if os.environ.get("LLMEDGE_DRAFT_MODEL"):
        out["draft_model"] = os.environ["LLMEDGE_DRAFT_MODEL"]
    return out
