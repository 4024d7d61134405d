"""Malformed GGUF files, metadata family: each class of issue 20 is refused with one line naming it."""

from __future__ import annotations

from pathlib import Path

import pytest
from cases import METADATA
from check import refuse


@pytest.mark.parametrize("case", list(METADATA))
def test_metadata_class_is_refused_in_one_line(tmp_path: Path, case: str) -> None:
    build, words = METADATA[case]
    path = tmp_path / "bad.gguf"
    path.write_bytes(build())
    refuse(path, words)
