"""Adds the optional cffi extension ``llmedge._native`` to the build configured in pyproject.toml.

If the C compiler is missing or the build fails, the package still installs (the numba backend,
and the NumPy reference, work without it) and one warning line is printed.
"""

import os
import re

from setuptools import setup
from setuptools.command.build_ext import build_ext

try:  # setuptools >= 59 vendors distutils; the error classes live in both places
    from setuptools.errors import CCompilerError, CompileError, ExecError, LinkError, PlatformError
except ImportError:  # pragma: no cover - old setuptools
    from distutils.errors import CCompilerError, CompileError, LinkError
    from distutils.errors import DistutilsExecError as ExecError
    from distutils.errors import DistutilsPlatformError as PlatformError

_BUILD_ERRORS = (CCompilerError, CompileError, ExecError, LinkError, PlatformError, OSError)


class OptionalBuildExt(build_ext):
    """build_ext that turns a failed C build into one warning line instead of an install error."""

    def finalize_options(self) -> None:
        super().finalize_options()
        for ext in self.extensions:
            ext.optional = True  # setuptools then skips copying a module that was not built

    def run(self) -> None:
        try:
            super().run()
        except _BUILD_ERRORS as e:
            self._warn(e)

    def build_extension(self, ext) -> None:
        try:
            super().build_extension(ext)
        except _BUILD_ERRORS as e:
            self._warn(e)

    @staticmethod
    def _warn(e: BaseException) -> None:
        text = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        # "Command '['gcc', ...]' returned non-zero exit status 1." -> "gcc returned non-zero exit status 1."
        m = re.match(r"Command '\['([^']*)'.*\]' (.*)", text)
        reason = f"{os.path.basename(m.group(1))} {m.group(2)}" if m else text
        if len(reason) > 160:
            reason = reason[:157] + "..."
        print(f"WARNING: llmedge native kernels not built ({reason}); the numba backend will be used")


_BUILDER = "native/build_native.py"
if os.path.exists(os.path.join(os.path.dirname(os.path.abspath(__file__)), _BUILDER)):
    setup(cffi_modules=[f"{_BUILDER}:ffibuilder"], cmdclass={"build_ext": OptionalBuildExt})
else:  # a source tree without the C sources: the pure-Python package only
    print("WARNING: llmedge native kernels not built (native/ sources missing); the numba backend will be used")
    setup()
