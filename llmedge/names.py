"""Model names and digests: what a user may type, what it means, and the only way either becomes a path.

Forms (Ollama's rules: case-insensitive, tag `latest` by default):

    NAME[:TAG]                    the Ollama library (registry.ollama.ai/library/NAME:TAG) or the catalog
    NAMESPACE/NAME[:TAG]          a namespace on registry.ollama.ai
    HOST[:PORT]/NAMESPACE/NAME[:TAG]   another registry (hf.co/ORG/REPO[:QUANT] is Hugging Face)

`huggingface.co/...` and `hf://...` are spellings of `hf.co/...`. Every part is checked against a
strict pattern before any path is built from it (no '..', no separators, no absolute paths).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from .errors import StoreError

DEFAULT_REGISTRY = "registry.ollama.ai"
HF_HOST = "hf.co"
_PART = r"[a-z0-9][a-z0-9._-]{0,79}"
_PART_RE = re.compile(_PART)
_HOST_RE = re.compile(r"[a-z0-9](?:[a-z0-9.-]{0,252}[a-z0-9])?(?::[0-9]{1,5})?")
_DIGEST_RE = re.compile(r"sha256[:-](?P<hex>[0-9a-f]{64})")
_WINDOWS_RESERVED = {"con", "prn", "aux", "nul", *(f"{d}{i}" for d in ("com", "lpt") for i in range(10))}
_HF_PREFIXES = ("hf://", "hf.co/", "huggingface.co/", "https://huggingface.co/", "https://hf.co/")


@dataclass(frozen=True)
class ModelName:
    """A validated model name: `host` ("" for the default registry), `namespace` ("" for library)."""

    host: str
    namespace: str
    model: str
    tag: str

    @property
    def base(self) -> str:
        """The name without its tag, in its shortest form (`x`, `ns/x` or `host/ns/x`)."""
        return "/".join(p for p in (self.host, self.namespace, self.model) if p)

    @property
    def full(self) -> str:
        return f"{self.base}:{self.tag}"

    @property
    def is_hf(self) -> bool:
        return self.host == HF_HOST

    @property
    def registry(self) -> str:
        return self.host or DEFAULT_REGISTRY

    @property
    def repository(self) -> str:
        """`namespace/model` as a registry addresses it (library for bare names)."""
        return f"{self.namespace or 'library'}/{self.model}"

    def path_parts(self) -> tuple[str, ...]:
        """Directory components for a store's manifest folder (':' of a port becomes '_')."""
        return tuple(p for p in (self.host.replace(":", "_"), self.namespace, self.model) if p)


def _bad(name: str) -> StoreError:
    shown = name if len(name) <= 100 else name[:100] + "..."
    return StoreError(f"invalid model name {shown!r}: use [host/namespace/]name[:tag] with letters, "
                      "digits, '.', '_' and '-'")


def is_hf_name(name: str) -> bool:
    """True for `hf.co/...`, `huggingface.co/...` and `hf://...`."""
    return isinstance(name, str) and name.lower().startswith(_HF_PREFIXES)


def canonical_spelling(name: str) -> str:
    """`hf://X`, `huggingface.co/X`, `https://huggingface.co/X` as `hf.co/X`; other names unchanged."""
    low = name.lower()
    for prefix in _HF_PREFIXES:
        if low.startswith(prefix):
            return "hf.co/" + name[len(prefix):]
    return name


def parse_model_name(name: str) -> ModelName:
    """Validate `name` and split it into host, namespace, model and tag (lowercased)."""
    if not isinstance(name, str):
        raise StoreError(f"invalid model name {name!r}: not a string")
    spelled = canonical_spelling(name)
    low = spelled.lower()
    parts = low.split("/")
    if is_hf_name(spelled) and len(parts) != 3:  # not an Ollama name in a namespace called hf.co
        raise StoreError(f"invalid Hugging Face name {name[:100]!r}: use hf.co/ORG/REPO[:QUANT]")
    last, sep, tag = parts[-1].partition(":")
    if not sep:
        tag = "latest"
    parts[-1] = last
    host = parts[0] if len(parts) == 3 else ""
    names = parts[1:] if len(parts) == 3 else parts
    ok = (
        1 <= len(parts) <= 3
        and (len(parts) < 3 or _HOST_RE.fullmatch(host) is not None)
        and all(_PART_RE.fullmatch(p) for p in [*names, tag])
        and ".." not in low
        and (host == HF_HOST or not low.endswith(".gguf") or sep)
        and not any(p.split(".")[0] in _WINDOWS_RESERVED for p in [*names, tag])
    )
    if not ok:
        raise _bad(name)
    namespace, model = (names[0], names[1]) if len(names) == 2 else ("", names[0])
    if host == DEFAULT_REGISTRY:
        host = ""
    if not host and namespace == "library":
        namespace = ""
    return ModelName(host, namespace, model, tag)


def parse_name(name: str) -> tuple[str, str]:
    """`(base, tag)` of a validated name, e.g. ("smollm2", "135m") or ("hf.co/org/repo", "q4_k_m")."""
    n = parse_model_name(name)
    return n.base, n.tag


def normalize_name(name: str) -> str:
    """The name validated and completed to `base:tag`."""
    return parse_model_name(name).full


def parse_digest(digest: str) -> str:
    """The 64 hex digits of a `sha256:<hex>` or `sha256-<hex>` digest; anything else is a StoreError."""
    m = _DIGEST_RE.fullmatch(digest) if isinstance(digest, str) else None
    if m is None:
        raise StoreError(f"invalid digest {str(digest)[:100]!r}: expected sha256:<64 hex digits>")
    return m.group("hex")


def looks_like_path(name_or_path: str) -> bool:
    """True when the argument is a file path rather than a model name: it ends in `.gguf` (and is not a
    Hugging Face name), starts with '/', '.', '~', holds a backslash, or is an existing file."""
    if is_hf_name(name_or_path):
        return False
    seps = {"\\", os.sep} | ({os.altsep} if os.altsep else set())
    seps.discard("/")
    return (
        name_or_path.lower().endswith(".gguf")
        or name_or_path.startswith(("/", "./", "../", "~"))
        or any(s in name_or_path for s in seps)
        or (":" not in name_or_path and "/" in name_or_path and os.path.isfile(name_or_path))
    )
