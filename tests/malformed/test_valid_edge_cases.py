"""Valid edge cases the stricter reader must still load, byte for byte as the gguf package reads them:
a zero-element tensor and custom alignments."""

from __future__ import annotations

import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf_bytes import U32, RawGGUF, Tensor, minimal

from llmedge.gguf import GGUFFile


def test_zero_element_tensor_loads(tmp_path: Path) -> None:
    g = minimal()
    g.tensors = [Tensor("empty", (0, 4)), Tensor("after", (8,), data=np.arange(8, dtype="<f4").tobytes())]
    path = g.write(tmp_path / "zero.gguf")
    f = GGUFFile(path)
    assert f.tensor("empty").n_bytes == 0 and f.tensor("empty").n_elements == 0
    assert f.tensor("empty").rows().size == 0
    assert np.array_equal(f.tensor("after").data.view("<f4"), np.arange(8, dtype="<f4"))
    ref = gguf.GGUFReader(str(path))
    assert {t.name: int(t.data_offset) for t in ref.tensors} == {n: t.offset for n, t in f.tensors.items()}


@pytest.mark.parametrize("alignment", [1, 8, 64, 4096])
def test_custom_alignment_loads(tmp_path: Path, alignment: int) -> None:
    g = minimal()
    g.alignment = alignment
    g.kvs.append(("general.alignment", U32, struct.pack("<I", alignment)))
    g.tensors = [Tensor("a", (3,), data=b"\x01" * 12), Tensor("b", (5,), data=b"\x02" * 20)]
    path = g.write(tmp_path / f"align{alignment}.gguf")
    f = GGUFFile(path)
    assert f.alignment == alignment and f.data_offset % alignment == 0
    assert bytes(f.tensor("a").data) == b"\x01" * 12 and bytes(f.tensor("b").data) == b"\x02" * 20
    ref = gguf.GGUFReader(str(path))
    assert {t.name: int(t.data_offset) for t in ref.tensors} == {n: t.offset for n, t in f.tensors.items()}


def test_no_tensors_and_no_metadata_is_a_valid_file(tmp_path: Path) -> None:
    path = RawGGUF().write(tmp_path / "empty.gguf")
    f = GGUFFile(path)
    assert f.metadata == {} and f.tensors == {}
