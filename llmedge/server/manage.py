"""Model management behind Ollama's REST routes: /api/create, /api/blobs/:digest, and the
Modelfile-derived fields of /api/show. The routes in `app.py` only parse and stream; the store does
the work. A client never makes the server open a path of its choosing: `from` must be a model name
and `files` must name blobs already uploaded through /api/blobs."""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator, Callable
from typing import Any

from llmedge.defaults import template_problem
from llmedge.errors import StoreError
from llmedge.modelfile import FLOAT_PARAMS, merge, parse, render, typed_parameter
from llmedge.server.errors import BadRequest
from llmedge.server.gofmt import float32_shortest, go_value
from llmedge.store import Store, looks_like_path, normalize_name, parse_digest


def _config(body: dict[str, Any]) -> dict[str, Any]:
    """The defaults a create request sets (a legacy `modelfile` text first, then the fields)."""
    config: dict[str, Any] = {}
    params = body.get("parameters")
    if params is not None:
        if not isinstance(params, dict):
            raise BadRequest("parameters must be an object")
        try:
            config["parameters"] = {k: typed_parameter(k, v) for k, v in params.items()}
        except StoreError as e:
            raise BadRequest(str(e)) from None
    for key in ("system", "template"):
        if body.get(key) is not None:
            if not isinstance(body[key], str):
                raise BadRequest(f"{key} must be a string")
            config[key] = body[key]
    problem = template_problem(config.get("template") or "")
    if problem is not None:
        raise BadRequest(f"template: {problem}")
    lic = body.get("license")
    if lic is not None:
        config["license"] = [lic] if isinstance(lic, str) else [str(x) for x in lic]
    msgs = body.get("messages")
    if msgs is not None:
        if not isinstance(msgs, list) or not all(isinstance(m, dict) and isinstance(m.get("content"), str)
                                                 for m in msgs):
            raise BadRequest("messages must be a list of {role, content} objects")
        config["messages"] = [{"role": str(m.get("role", "user")), "content": m["content"]} for m in msgs]
    return config


def create(body: dict[str, Any], report: Callable[[str], None], insecure: bool = False) -> None:
    """Carry out an /api/create request (see the module docstring); statuses go to `report`."""
    name = body.get("model", body.get("name"))
    if not isinstance(name, str) or not name:
        raise BadRequest("model is required")
    normalize_name(name)
    if body.get("adapters"):
        raise BadRequest("adapters are not supported: llmedge does not apply LoRA adapters")
    if body.get("quantize"):
        raise BadRequest("quantize is not supported by /api/create; use `llmedge quantize`")
    base, config = body.get("from"), _config(body)
    if isinstance(body.get("modelfile"), str) and body["modelfile"].strip():
        mf = parse(body["modelfile"])
        base, config = base or mf.base, merge(as_ollama_sends(mf.config), config)
    store = Store(insecure=insecure)
    files = body.get("files")
    report("parsing modelfile")
    if files:
        _create_from_files(store, name, files, config, report)
    elif isinstance(base, str) and base:
        if looks_like_path(base):
            raise BadRequest(f"'from' must be a model name, not a path: {base[:100]!r} (upload it with "
                                 "/api/blobs and use 'files')")
        store.resolve(base, pull=True, progress=lambda status, **_: report(status))
        report("using existing layer")
        store.derive(name, base, config)
    else:
        raise BadRequest("neither 'from' nor 'files' was given")
    report("writing manifest")


def _create_from_files(store: Store, name: str, files: Any, config: dict[str, Any],
                       report: Callable[[str], None]) -> None:
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise BadRequest("files must map file names to sha256 digests")
    ggufs = [(f, d) for f, d in files.items() if f.lower().endswith(".gguf")] or list(files.items())
    if len(ggufs) != 1:
        raise BadRequest("files must name exactly one .gguf model (split models are not supported)")
    filename, digest = ggufs[0]
    blob = store.blob_path(digest)
    if not blob.is_file():
        raise BadRequest(f"blob {digest[:80]} has not been uploaded (POST /api/blobs/{digest[:80]})")
    with open(blob, "rb") as f:
        if f.read(4) != b"GGUF":
            raise BadRequest(f"{filename[:100]} is not a GGUF file")
    report(f"using existing layer sha256:{parse_digest(digest)}")
    store.register(name, digest, blob.stat().st_size, {"type": "upload", "file": filename[:200]}, config)


def has_blob(digest: str) -> bool:
    return Store().blob_path(digest).is_file()


async def receive_blob(digest: str, chunks: AsyncIterator[bytes]) -> bool:
    """Store an uploaded blob after checking its sha256; True when it was new."""
    store = Store()
    hexd = parse_digest(digest)
    blob = store.blob_path(digest)
    if blob.is_file():
        async for _ in chunks:
            pass
        return False
    store.blobs_dir.mkdir(parents=True, exist_ok=True)
    store.sweep()  # what uploads cut by a kill left
    tmp = store.blobs_dir / f".partial-{os.getpid()}-upload-{hexd[:16]}-{id(chunks)}"  # swept once we are dead
    h = hashlib.sha256()
    try:
        with open(tmp, "wb") as out:
            async for chunk in chunks:
                h.update(chunk)
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        if h.hexdigest() != hexd:
            raise BadRequest(f"digest mismatch: the upload's sha256 is {h.hexdigest()}")
        os.chmod(tmp, 0o644)
        os.replace(tmp, blob)
    finally:
        tmp.unlink(missing_ok=True)
    return True


def as_ollama_sends(config: dict[str, Any]) -> dict[str, Any]:
    """A parsed Modelfile's defaults with its float PARAMETERs as Ollama's client sends them (float32
    digits, see :func:`float32_shortest`); /api/create's JSON ``parameters`` are kept as they are."""
    params = config.get("parameters")
    if not params:
        return config
    return {**config, "parameters": {k: float32_shortest(v) if k in FLOAT_PARAMS and isinstance(v, float) else v
                                     for k, v in params.items()}}


def parameters_text(params: dict[str, Any]) -> str:
    """/api/show's ``parameters`` (what ``show --parameters`` prints): a line per value (``stop`` a line
    per string), the name padded to 30 columns and the value as Go's ``%#v`` of the JSON-decoded value
    (routes.go GetModelInfo): 4096, 0.7, 1 for 1.0, 1e+06, 1e-05, true; strings Go-quoted."""
    lines = []
    for k, v in params.items():
        for item in v if isinstance(v, list) else [v]:
            lines.append(f"{k:<30} {go_value(item)}")
    return "\n".join(lines)


def show_fields(name: str, path: Any, gguf_template: str) -> dict[str, Any]:
    """/api/show's modelfile, parameters, system, template and license for a stored model."""
    config = Store().config(name)
    out = {"modelfile": render(str(path), config), "parameters": parameters_text(config.get("parameters") or {}),
           "template": config.get("template") or gguf_template, "license": "\n".join(config.get("license") or [])}
    if config.get("system"):
        out["system"] = config["system"]
    if config.get("messages"):
        out["messages"] = config["messages"]
    return out
