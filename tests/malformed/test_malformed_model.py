"""Malformed GGUF files, model family: each class of issue 20 is refused with one line naming it."""

from __future__ import annotations

from pathlib import Path

import pytest
from cases import MODEL
from check import refuse


@pytest.mark.parametrize("case", list(MODEL))
def test_model_class_is_refused_in_one_line(tmp_path: Path, case: str) -> None:
    build, words = MODEL[case]
    path = tmp_path / "bad.gguf"
    path.write_bytes(build())
    refuse(path, words)
