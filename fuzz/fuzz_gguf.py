"""Fuzz target: the GGUF reader and the model check on arbitrary bytes.

Any input must either load (every tensor view inside the file) or raise one LlmedgeError line; any
other exception, a crash, a hang or an allocation past libFuzzer's RSS limit is a bug.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "malformed"))

import harness  # noqa: E402

TARGET = "gguf"

with harness.instrument(__name__, include=["llmedge"]):
    from llmedge.errors import LlmedgeError
    from llmedge.gguf import GGUFFile
    from llmedge.modelcheck import check_model_file

PATH = harness.scratch_file(TARGET)


def test_one_input(data: bytes) -> None:
    PATH.write_bytes(data)
    try:
        g = GGUFFile(PATH)
    except LlmedgeError as e:
        assert "\n" not in str(e)
        return
    for t in g.tensors.values():
        assert 0 <= t.offset and t.offset + t.n_bytes <= g.file_size
        assert t.data.size == t.n_bytes
    try:
        check_model_file(g)
    except LlmedgeError as e:
        assert "\n" not in str(e)


def seeds() -> list[bytes]:
    from gguf_bytes import ARRAY, STRING, minimal, tiny_model

    words = minimal().kv("test.words", ARRAY, (STRING, [f"w{i}" for i in range(1100)]))  # the native bulk path
    return [minimal().build(), tiny_model().build(), words.build()]


if __name__ == "__main__":
    harness.fuzz(TARGET, test_one_input, seeds)
