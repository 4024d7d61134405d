"""Assertions shared by the malformed-file tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmedge.errors import LlmedgeError
from llmedge.gguf import GGUFFile
from llmedge.modelcheck import check_model_file


def refuse(path: Path, words: str) -> str:
    """Open ``path`` as llmedge does before loading a model; the refusal must be one line naming
    the file and containing ``words``."""
    with pytest.raises(LlmedgeError) as info:
        check_model_file(GGUFFile(path))
    msg = str(info.value)
    assert "\n" not in msg and str(path) in msg, msg
    assert words in msg, msg
    return msg
