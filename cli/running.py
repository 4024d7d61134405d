"""The commands that talk to a running ``llmedge serve``, as Ollama's do: ``ps`` (the models it has
loaded) and ``stop`` (unload one now). They reach the server at LLMEDGE_HOST (default
127.0.0.1:11434) with the standard library's HTTP client, sending LLMEDGE_API_KEY when it is set."""

from __future__ import annotations

import json
import math
import os
import time
import urllib.error
import urllib.request
from datetime import datetime
from typing import Annotated, Any

import typer

from llmedge.errors import LlmedgeError

TIMEOUT = 30.0  # seconds; an unload waits for the engine thread's current step at most


def _request(path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """GET (or, with ``body``, POST as JSON) ``path`` on the server; its JSON answer. Every failure is one
    LlmedgeError: no server, a refused key, an error reply (its message), a reply that is not JSON."""
    from llmedge.server.config import client_url

    base = client_url()
    headers = {"Accept": "application/json"}
    key = os.environ.get("LLMEDGE_API_KEY")
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(base + path, data=data, headers=headers, method="POST" if body else "GET")
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
            raw = r.read()
    except urllib.error.HTTPError as e:
        raise LlmedgeError(_error_message(e)) from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise LlmedgeError(f"could not connect to llmedge serve at {base} ({reason}); is it running? "
                           "Start it with 'llmedge serve', or set LLMEDGE_HOST to where it listens") from None
    try:
        out = json.loads(raw)
    except ValueError:
        raise LlmedgeError(f"{base}{path} did not answer with JSON; is it llmedge serve?") from None
    if not isinstance(out, dict):
        raise LlmedgeError(f"{base}{path} answered with unexpected JSON; is it llmedge serve?")
    return out


def _error_message(e: urllib.error.HTTPError) -> str:
    try:
        detail = json.loads(e.read()).get("error")
        if isinstance(detail, dict):  # OpenAI's shape
            detail = detail.get("message")
    except (ValueError, AttributeError, OSError):
        detail = None
    if e.code == 401:
        return "the server refused the request (401): set LLMEDGE_API_KEY to its key"
    return f"the server answered {e.code}: {detail or e.reason}"


def _size(n: int) -> str:
    """Bytes as Ollama's HumanBytes writes them: decimal units, whole numbers from 10 up (truncated),
    one decimal below 10 unless whole."""
    value, unit = float(n), "B"
    for u, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            value, unit = n / scale, u
            break
    if value >= 10 or value == int(value):
        return f"{int(value)} {unit}"
    return f"{value:.1f} {unit}"


def _duration(seconds: float) -> str:
    """Ollama's humanDuration."""
    s = int(seconds)
    if s < 1:
        return "Less than a second"
    if s == 1:
        return "1 second"
    if s < 60:
        return f"{s} seconds"
    minutes = int(seconds // 60)
    if minutes == 1:
        return "About a minute"
    if minutes < 60:
        return f"{minutes} minutes"
    hours = round(seconds / 3600)
    if hours == 1:
        return "About an hour"
    if hours < 48:
        return f"{hours} hours"
    if hours < 24 * 7 * 2:
        return f"{hours // 24} days"
    if hours < 24 * 30 * 2:
        return f"{hours // 24 // 7} weeks"
    if hours < 24 * 365 * 2:
        return f"{hours // 24 // 30} months"
    return f"{int(seconds // 3600) // 24 // 365} years"


def _until(expires_at: Any, now: float) -> str:
    """The UNTIL column: "4 minutes from now", "Forever" (kept loaded), "Stopping..." (expired, its
    sequences still ending)."""
    if not isinstance(expires_at, str):
        return "Unknown"
    text = expires_at.replace("Z", "+00:00")
    head, dot, frac = text.partition(".")
    if dot:  # nanosecond digits: Python reads at most 6
        digits = frac[: len(frac) - len(frac.lstrip("0123456789"))]
        text = f"{head}.{digits[:6]}{frac[len(digits):]}"
    try:
        t = datetime.fromisoformat(text).timestamp()
    except ValueError:
        return "Unknown"
    if t - now > 20 * 365 * 86400:
        return "Forever"
    if t <= now:
        return "Stopping..."
    return f"{_duration(t - now)} from now"


def ps() -> None:
    """List the models a running 'llmedge serve' has loaded (LLMEDGE_HOST; 127.0.0.1:11434)."""
    models = _request("/api/ps").get("models")
    if not isinstance(models, list):
        raise LlmedgeError("the server's /api/ps answer has no model list; is it llmedge serve?")
    now = time.time()
    rows = []
    for m in models:
        if not isinstance(m, dict):
            continue
        size = m.get("size") if isinstance(m.get("size"), int) else 0
        vram = m.get("size_vram") if isinstance(m.get("size_vram"), int) else 0
        gpu = 0 if size <= 0 else math.floor(100 * vram / size + 0.5)
        processor = "100% CPU" if gpu == 0 else "100% GPU" if gpu == 100 else f"{100 - gpu}%/{gpu}% CPU/GPU"
        ctx = m.get("context_length")
        rows.append((str(m.get("name", "")), str(m.get("digest", ""))[:12], _size(size), processor,
                     str(ctx) if isinstance(ctx, int) else "", _until(m.get("expires_at"), now)))
    head = ("NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "UNTIL")
    widths = [max(len(r[i]) for r in [head, *rows]) + 4 for i in range(5)]
    for r in [head, *rows]:
        typer.echo("".join(f"{c:<{w}}" for c, w in zip(r, widths)) + r[5])


def stop(model: Annotated[str, typer.Argument(help="A model 'llmedge ps' lists.")]) -> None:
    """Unload a model from a running 'llmedge serve' now (its running requests finish first)."""
    from llmedge.names import normalize_name

    try:
        wanted = normalize_name(model)
    except LlmedgeError:
        wanted = model
    running = [m.get("name") for m in _request("/api/ps").get("models") or [] if isinstance(m, dict)]
    match = next((n for n in running if isinstance(n, str) and n.lower() in (model.lower(), wanted.lower())), None)
    if match is None:
        listed = ", ".join(n for n in running if isinstance(n, str)) or "none"
        raise LlmedgeError(f"model '{model}' is not running (running: {listed})")
    _request("/api/generate", {"model": match, "keep_alive": 0, "stream": False})
