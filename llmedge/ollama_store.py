"""Ollama's image manifests: reading a local Ollama store in place, and turning layers into defaults.

An Ollama store (`$OLLAMA_MODELS`, else `~/.ollama/models`) holds
`manifests/<host>/<namespace>/<name>/<tag>` (Docker-style JSON manifests) and `blobs/sha256-<hex>`.
llmedge lists and runs those models where they lie: it opens files there read-only and never
creates, renames or deletes anything under that folder. The same layer rules serve registry pulls:
the `model` layer is the GGUF; `params` (JSON options), `system`, `template`, `license` and `messages`
layers become the model's defaults (its `config`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import StoreError
from .names import DEFAULT_REGISTRY, normalize_name, parse_digest, parse_model_name

MEDIA_PREFIX = "application/vnd.ollama.image."
MAX_SMALL_LAYER = 4 << 20  # params, system, template, license and messages layers are small text


@dataclass(frozen=True)
class HeldModel:
    """A model of the Ollama store: its name, GGUF blob and defaults."""

    name: str
    path: Path
    digest: str
    size: int
    mtime: float
    config: dict[str, Any] = field(default_factory=dict)


def default_ollama_root() -> Path:
    env = os.environ.get("OLLAMA_MODELS")
    return Path(env).expanduser() if env else Path.home() / ".ollama" / "models"


def model_layer(manifest: Any) -> dict[str, Any]:
    """The GGUF layer of an Ollama manifest (digest validated); StoreError if there is none."""
    layers = manifest.get("layers") if isinstance(manifest, dict) else None
    if not isinstance(layers, list):
        raise StoreError("the manifest has no layers")
    for layer in layers:
        if not isinstance(layer, dict):
            continue
        kind = str(layer.get("mediaType", "")).removeprefix(MEDIA_PREFIX)
        if kind == "adapter":
            raise StoreError("the manifest has an ADAPTER layer; llmedge does not apply LoRA adapters")
        if kind == "model":
            parse_digest(layer.get("digest"))
            size = layer.get("size")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise StoreError("the model layer of the manifest has no valid size")
            return layer
    raise StoreError("the manifest has no model layer")


def small_layers(manifest: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(kind, layer) for the params/system/template/license/messages layers, digests validated."""
    for layer in manifest.get("layers") or []:
        if not isinstance(layer, dict):
            continue
        kind = str(layer.get("mediaType", "")).removeprefix(MEDIA_PREFIX)
        if kind in ("params", "system", "template", "license", "messages"):
            parse_digest(layer.get("digest"))
            size = layer.get("size")
            if isinstance(size, int) and not 0 <= size <= MAX_SMALL_LAYER:
                raise StoreError(f"the {kind} layer is larger than {MAX_SMALL_LAYER} bytes")
            yield kind, layer


def config_from_layers(manifest: dict[str, Any], read: Callable[[dict[str, Any]], bytes]) -> dict[str, Any]:
    """The defaults the small layers carry; `read(layer)` returns a layer's verified bytes."""
    config: dict[str, Any] = {}
    for kind, layer in small_layers(manifest):
        text = read(layer).decode("utf-8", errors="replace")
        if kind == "params":
            try:
                params = json.loads(text)
            except ValueError:
                raise StoreError("the params layer is not JSON") from None
            if not isinstance(params, dict):
                raise StoreError("the params layer is not a JSON object")
            config["parameters"] = params
        elif kind == "messages":
            try:
                messages = json.loads(text)
            except ValueError:
                raise StoreError("the messages layer is not JSON") from None
            if not isinstance(messages, list):
                raise StoreError("the messages layer is not a JSON array")
            config["messages"] = messages
        elif kind == "license":
            config.setdefault("license", []).append(text)
        else:
            config[kind] = text
    return config


class OllamaStore:
    """A local Ollama store, read in place."""

    def __init__(self, root: Path | str | None = None) -> None:
        self.root = Path(root).expanduser() if root is not None else default_ollama_root()

    def _manifest_file(self, name: str) -> Path:
        n = parse_model_name(name)
        return self.root.joinpath("manifests", n.host or DEFAULT_REGISTRY, n.namespace or "library", n.model, n.tag)

    def _blob(self, digest: str) -> Path:
        return self.root / "blobs" / f"sha256-{parse_digest(digest)}"

    def find(self, name: str) -> HeldModel | None:
        """The model `name` if the Ollama store holds it (and its GGUF blob is there), else None."""
        try:
            full = normalize_name(name)
            path = self._manifest_file(full)
        except StoreError:
            return None
        if not self.root.is_dir():
            return None
        if not path.is_file():
            path = self._case_insensitive(path)
            if path is None:
                return None
        return self._load(full, path)

    def _case_insensitive(self, path: Path) -> Path | None:
        """The manifest file whose path matches `path` (all lowercase) but for case: Ollama keeps
        the name as it was typed (`hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF/Q4_K_M`) and matches
        it in any case."""
        base = self.root / "manifests"
        found = base
        for part in path.relative_to(base).parts:
            try:
                hits = sorted(e for e in os.listdir(found) if e.lower() == part)
            except OSError:
                return None
            if not hits:
                return None
            found = found / hits[0]
        return found if found.is_file() else None

    def _load(self, full: str, path: Path) -> HeldModel | None:
        try:
            if path.stat().st_size > MAX_SMALL_LAYER:
                return None
            manifest = json.loads(path.read_text(encoding="utf-8"))
            layer = model_layer(manifest)
            blob = self._blob(layer["digest"])
            if not blob.is_file():
                return None
            config = config_from_layers(manifest, lambda lay: self._read_small(lay))
            return HeldModel(full, blob, "sha256:" + parse_digest(layer["digest"]), layer["size"],
                             path.stat().st_mtime, config)
        except (OSError, ValueError, StoreError):
            return None

    def _read_small(self, layer: dict[str, Any]) -> bytes:
        with open(self._blob(layer["digest"]), "rb") as f:
            return f.read(MAX_SMALL_LAYER + 1)[:MAX_SMALL_LAYER]

    def list(self) -> list[HeldModel]:
        """Every model with a readable manifest and a present model blob, sorted by name."""
        base = self.root / "manifests"
        if not base.is_dir():
            return []
        out: dict[str, HeldModel] = {}
        for path in sorted(base.glob("*/*/*/*")):
            if not path.is_file():
                continue
            parts = path.relative_to(base).parts
            host, ns, model, tag = parts
            try:
                full = normalize_name(f"{host}/{ns}/{model}:{tag}")
                # Ollama keeps a name in the case it was typed (`hf.co/bartowski/X-GGUF/Q4_K_M`): any case
                if self._manifest_file(full).relative_to(base).parts != tuple(p.lower() for p in parts):
                    continue
            except StoreError:
                continue
            held = None if full in out else self._load(full, path)
            if held is not None:
                out[full] = held
        return sorted(out.values(), key=lambda h: h.name)
