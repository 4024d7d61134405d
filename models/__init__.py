"""The architecture registry: one module per ``general.architecture``, loaded on demand."""

from __future__ import annotations

import importlib
from typing import Any

from llmedge.errors import ModelError

ARCHITECTURES = {
    name: f"llmedge.models.{name}"
    for name in ("llama", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "phi3", "granite")
}


def model_class(arch: str) -> Any:
    """The ``Model`` class for an architecture name, or a clear error listing what is supported."""
    try:
        module = ARCHITECTURES[arch]
    except KeyError:
        raise ModelError(
            f"architecture {arch[:80]!r} is not supported; supported: {', '.join(ARCHITECTURES)}"
        ) from None
    return importlib.import_module(module).Model
