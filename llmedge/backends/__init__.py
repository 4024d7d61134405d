"""Compute backends and how one is chosen: ``native`` (C SIMD via cffi), ``numpy`` (the reference).

``auto`` (the default, or ``$LLMEDGE_BACKEND``) picks the fastest available one and records why.
"""

from __future__ import annotations

import os

from llmedge.errors import LlmedgeError

BACKENDS = ("native", "numpy")


def native_status() -> tuple[bool, str]:
    """Whether the native backend can run here, and if not, why."""
    try:
        from llmedge.backends.native import NativeBackend
    except ImportError as e:
        return False, f"native kernels not built ({e})"
    if not NativeBackend.available():
        return False, NativeBackend.unavailable_reason
    return True, "native kernels built for this CPU"


def choose_backend(name: str | None = "auto") -> tuple[str, str]:
    """Resolve ``name`` ('auto', None, or a backend) to a backend name and the reason for it."""
    name = (name or "auto").lower()
    if name == "auto":
        env = os.environ.get("LLMEDGE_BACKEND", "").strip().lower()
        if env and env != "auto":
            return choose_backend(env)[0], f"chosen by LLMEDGE_BACKEND={env}"
        ok, why = native_status()
        return ("native", why) if ok else ("numpy", f"numpy reference: {why}")
    if name not in BACKENDS:
        raise LlmedgeError(f"unknown backend '{name}' (choose from auto, {', '.join(BACKENDS)})")
    if name == "native":
        ok, why = native_status()
        if not ok:
            raise LlmedgeError(f"the native backend is unavailable: {why}")
    return name, "requested"


def make_backend(name: str | None = "auto", n_threads: int | None = None):
    """An instance of the chosen backend."""
    chosen, _ = choose_backend(name)
    if chosen == "native":
        from llmedge.backends.native import NativeBackend

        return NativeBackend(n_threads)
    from llmedge.backends.numpy_ref import NumpyBackend

    return NumpyBackend(n_threads)
