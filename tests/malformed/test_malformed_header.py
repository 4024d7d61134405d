"""Malformed GGUF files, header family: each class of issue 20 is refused with one line naming it."""

from __future__ import annotations

from pathlib import Path

import pytest
from cases import HEADER
from check import refuse


@pytest.mark.parametrize("case", list(HEADER))
def test_header_class_is_refused_in_one_line(tmp_path: Path, case: str) -> None:
    build, words = HEADER[case]
    path = tmp_path / "bad.gguf"
    path.write_bytes(build())
    refuse(path, words)
