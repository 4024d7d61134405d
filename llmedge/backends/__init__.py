"""Compute backends and how one is chosen: ``native`` (C SIMD via cffi), ``numba`` (JIT-compiled
kernels, the portable fast path), ``mlx`` (Apple's MLX: Apple Silicon's GPU, or MLX's CPU build),
``numpy`` (the reference).

``auto`` (the default, or ``$LLMEDGE_BACKEND``) picks mlx on Apple Silicon when it is installed,
else native, then numba, then numpy, and records why in the reason string that ``llmedge show``
prints.
"""

from __future__ import annotations

import functools
import os
import platform
import sys

from llmedge.errors import LlmedgeError

BACKENDS = ("native", "numba", "mlx", "numpy")


def native_status() -> tuple[bool, str]:
    """Whether the native backend can run here, and if not, why."""
    try:
        from llmedge.backends.native import NativeBackend
    except ImportError as e:
        return False, f"native kernels not built ({e})"
    if not NativeBackend.available():
        return False, NativeBackend.unavailable_reason
    return True, "native kernels built for this CPU"


@functools.lru_cache(maxsize=1)
def numba_status() -> tuple[bool, str]:
    """Whether the numba backend can run here (``import numba`` works), and if not, why."""
    try:
        import numba
    except Exception as e:  # ImportError, or llvmlite failing to load
        return False, f"numba is not importable ({type(e).__name__}: {e})"
    return True, f"numba {numba.__version__} JIT"


@functools.lru_cache(maxsize=1)
def mlx_status() -> tuple[bool, str]:
    """Whether the mlx backend can run here (``import mlx.core`` works), and if not, why."""
    try:
        import mlx.core as mx
    except Exception as e:  # ImportError, or a build for another platform
        return False, f"mlx is not importable ({type(e).__name__}: {e}; pip install 'llmedge[mlx]')"
    return True, f"mlx {mx.__version__} on {'gpu' if mx.default_device() == mx.gpu else 'cpu'}"


def apple_silicon() -> bool:
    return sys.platform == "darwin" and platform.machine() == "arm64"


def choose_backend(name: str | None = "auto") -> tuple[str, str]:
    """Resolve ``name`` ('auto', None, or a backend) to a backend name and the reason for it."""
    name = (name or "auto").lower()
    if name == "auto":
        env = os.environ.get("LLMEDGE_BACKEND", "").strip().lower()
        if env and env != "auto":
            try:
                chosen = choose_backend(env)[0]
            except LlmedgeError as e:  # name the variable: the user typed no backend
                raise LlmedgeError(f"LLMEDGE_BACKEND={env}: {e}") from None
            return chosen, f"chosen by LLMEDGE_BACKEND={env}"
        if apple_silicon() and mlx_status()[0]:
            return "mlx", f"Apple Silicon: {mlx_status()[1]}"
        ok, why = native_status()
        if ok:
            return "native", why
        nb_ok, nb_why = numba_status()
        if nb_ok:
            return "numba", f"{why}; {nb_why}"
        return "numpy", f"numpy reference: {why}; {nb_why}"
    if name not in BACKENDS:
        raise LlmedgeError(f"unknown backend '{name}' (choose from auto, {', '.join(BACKENDS)})")
    if name == "native":
        ok, why = native_status()
        if not ok:
            raise LlmedgeError(f"the native backend is unavailable: {why}")
    if name in ("numba", "mlx"):
        ok, why = numba_status() if name == "numba" else mlx_status()
        if not ok:
            raise LlmedgeError(f"the {name} backend is unavailable: {why}")
    return name, "requested"


def make_backend(name: str | None = "auto", n_threads: int | None = None):
    """An instance of the chosen backend (the numba one with its kernels compiled or loaded)."""
    chosen, _ = choose_backend(name)
    if chosen == "native":
        from llmedge.backends.native import NativeBackend

        return NativeBackend(n_threads)
    if chosen == "numba":
        from llmedge.backends.numba_cpu import NumbaBackend

        backend = NumbaBackend(n_threads)
        backend.warmup()
        return backend
    if chosen == "mlx":
        from llmedge.backends.mlx import MlxBackend

        return MlxBackend(n_threads)
    from llmedge.backends.numpy_ref import NumpyBackend

    return NumpyBackend(n_threads)
