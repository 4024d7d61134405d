"""llmedge: run quantized GGUF language models locally, token for token like llama.cpp.

``llmedge.load(name_or_path)`` returns a :class:`llmedge.api.Model`; heavy modules load lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time these load lazily (below)
    from llmedge.api import Model, load
    from llmedge.errors import LlmedgeError

__version__ = "0.1.0"
__all__ = ["load", "Model", "LlmedgeError", "__version__"]


def __getattr__(name: str) -> Any:
    if name in ("load", "Model"):
        from llmedge import api

        return getattr(api, name)
    if name == "LlmedgeError":
        from llmedge.errors import LlmedgeError

        return LlmedgeError
    raise AttributeError(f"module 'llmedge' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
