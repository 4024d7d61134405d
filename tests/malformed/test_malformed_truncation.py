"""Truncation at every field: a file cut at any byte before its end is refused with one line, never an
IndexError, a short read or a view past the mapping."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf_bytes import minimal, tiny_model

from llmedge.errors import GGUFError
from llmedge.gguf import GGUFFile


def test_every_prefix_of_a_small_file_is_refused(tmp_path: Path) -> None:
    data = minimal().build()
    path = tmp_path / "cut.gguf"
    for n in range(1, len(data)):
        path.write_bytes(data[:n])
        with pytest.raises(GGUFError) as info:
            GGUFFile(path)
        msg = str(info.value)
        assert "\n" not in msg and any(w in msg for w in ("truncated", "impossible", "past the end")), msg


def test_prefixes_of_a_model_are_refused_at_every_field_boundary(tmp_path: Path) -> None:
    """The tiny model cut inside its vocabulary arrays, its tensor infos and its data (each stride
    lands on a different field of a different entry)."""
    data = tiny_model().build()
    path = tmp_path / "cut.gguf"
    cuts = list(range(1, len(data), 89))
    for n in cuts:
        path.write_bytes(data[:n])
        with pytest.raises(GGUFError) as info:
            GGUFFile(path)
        assert "\n" not in str(info.value)
    path.write_bytes(data)
    assert len(GGUFFile(path).tensors) == 11
