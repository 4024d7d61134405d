"""Shared set-up of the Numba backend: the on-disk compile cache (``$NUMBA_CACHE_DIR`` or
``<user cache>/llmedge/numba/<digest of these sources>``, set before numba is imported), the GGML type ids as plain ints,
the weight types the backend supports, and the IQ4 value table."""

from __future__ import annotations

import os

import numpy as np


def _sources_key() -> str:
    """A digest of this package's source files (names, sizes, modification times). Numba checks a
    cached kernel against its own file only, so a kernel inlining an edited function from another
    file would load stale; a directory per state of the sources rules that out."""
    import hashlib

    here = os.path.dirname(os.path.abspath(__file__))
    h = hashlib.sha256()
    for name in sorted(os.listdir(here)):
        if name.endswith(".py"):
            st = os.stat(os.path.join(here, name))
            h.update(f"{name}:{st.st_size}:{st.st_mtime_ns};".encode())
    return h.hexdigest()[:16]


def _cache_dir() -> str:
    try:
        import platformdirs

        root = platformdirs.user_cache_dir("llmedge")
    except ImportError:  # pragma: no cover - platformdirs is a dependency
        root = os.path.join(os.path.expanduser("~"), ".cache", "llmedge")
    return os.path.join(root, "numba", _sources_key())


def _prune_stale_caches(current: str, days: float = 14.0) -> None:
    """Mark ``current`` used now and delete sibling digest folders unused for ``days`` (earlier
    versions' kernels, about 30 MB each)."""
    import shutil
    import time

    try:
        os.makedirs(current, exist_ok=True)
        os.utime(current)
        parent = os.path.dirname(current)
        for name in os.listdir(parent):
            path = os.path.join(parent, name)
            if (len(name) == 16 and all(c in "0123456789abcdef" for c in name) and path != current
                    and os.path.isdir(path) and time.time() - os.stat(path).st_mtime > days * 86400):
                shutil.rmtree(path, ignore_errors=True)
    except OSError:  # a read-only or vanished cache folder only costs compile time
        pass


if not os.environ.get("NUMBA_CACHE_DIR"):
    os.environ["NUMBA_CACHE_DIR"] = _cache_dir()
    _prune_stale_caches(os.environ["NUMBA_CACHE_DIR"])

import numba  # noqa: E402

if not numba.config.CACHE_DIR:  # numba was imported before this module set the variable
    numba.config.CACHE_DIR = os.environ["NUMBA_CACHE_DIR"]

from llmedge.quant import GGMLQuantizationType as T  # noqa: E402

F32 = np.float32
I32 = np.int32

# GGML type ids as plain ints (numba compares them as constants)
TF32, TF16, TQ4_0, TQ4_1, TQ5_0, TQ5_1, TQ8_0 = 0, 1, 2, 3, 6, 7, 8
TQ2_K, TQ3_K, TQ4_K, TQ5_K, TQ6_K, TIQ4_NL, TIQ4_XS, TBF16 = 10, 11, 12, 13, 14, 20, 23, 30

#: every weight type the backend multiplies and gathers
SUPPORTED = frozenset({T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K,
                       T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS})
_Q8_0_FAMILY = (TQ4_0, TQ5_0, TQ8_0, TIQ4_NL)
_Q8_1_FAMILY = (TQ4_1, TQ5_1)
_Q8_K_FAMILY = (TQ2_K, TQ3_K, TQ4_K, TQ5_K, TQ6_K, TIQ4_XS)

KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int32)
