"""cffi (API mode) builder for ``llmedge._native``: the C kernels in ``native/``.

Used by setup.py (``cffi_modules=["native/build_native.py:ffibuilder"]``) and runnable directly
(``python native/build_native.py``) to build the module in place for development. Every source is
compiled once with portable flags; per-ISA files raise their own target with ``#pragma GCC target``
so one binary carries scalar, AVX2 and (on aarch64) NEON kernels, chosen at run time from CPUID.
"""

from __future__ import annotations

import os
import platform
import re
import sys

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))

SOURCES = [
    "api.c",
    "threadpool.c",
    "quants_scalar.c",
    "quants_avx2.c",
    "quants_avx512.c",
    "quants_neon.c",
    "ops.c",
    "ops_avx2.c",
    "ops_avx512.c",
    "layer.c",
    "packed.c",
]
DEPENDS = ["common.h", "avx512_compat.h", "ggml_avx512_orders.h", "llmedge_api.h", "tiles_avx2.inc", "gemv_avx2.inc", "gemv_rows_avx2.inc", "korder_avx2.inc",
           "packed_avx2.inc"]


def _cdef() -> str:
    with open(os.path.join(HERE, "llmedge_api.h"), encoding="utf-8") as f:
        text = f.read()
    return re.sub(r"/\*.*?\*/", "", text, flags=re.S)


def _rel(path: str) -> str:
    """Paths relative to the current directory (setuptools rejects absolute source paths in sdists)."""
    try:
        return os.path.relpath(path)
    except ValueError:  # another drive on Windows
        return path


def _compile_args() -> list[str]:
    if sys.platform == "win32":
        return ["/O2", "/fp:precise"]
    args = ["-O3", "-std=gnu11", "-ffp-contract=off", "-fno-math-errno", "-pthread", "-Wall",
            "-Wno-unused-function"]
    machine = platform.machine().lower()
    if machine in ("aarch64", "arm64"):
        args.append("-march=armv8-a")
    return args


def make_builder(absolute: bool = False) -> FFI:
    """The FFI builder; ``absolute`` paths for builds that change directory (cffi's compile())."""
    path = os.path.abspath if absolute else _rel
    builder = FFI()
    builder.cdef(_cdef())
    builder.set_source(
        "llmedge._native",
        '#include "llmedge_api.h"\n',
        sources=[path(os.path.join(HERE, s)) for s in SOURCES],
        include_dirs=[path(HERE)],
        depends=[path(os.path.join(HERE, s)) for s in DEPENDS],
        extra_compile_args=_compile_args(),
        extra_link_args=[] if sys.platform == "win32" else ["-pthread"],
        libraries=[] if sys.platform == "win32" else ["m"],
    )
    return builder


ffibuilder = make_builder()


if __name__ == "__main__":
    # development build: compile under build/cffi and copy the module next to llmedge/__init__.py
    import glob
    import shutil

    root = os.path.dirname(HERE)
    os.chdir(root)
    tmp = os.path.join("build", "cffi")
    built = make_builder(absolute=True).compile(tmpdir=tmp, verbose="-v" in sys.argv)
    for old in glob.glob(os.path.join(root, "llmedge", "_native.*.so")) + glob.glob(
        os.path.join(root, "llmedge", "_native.*.pyd")
    ):
        os.remove(old)
    dest = os.path.join(root, "llmedge", os.path.basename(built))
    shutil.copy2(built, dest)
    print(dest)
