"""The GGUF reader: real files parse to the right metadata and tensors; malformed files fail clearly."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from llmedge.errors import GGUFError
from llmedge.gguf import GGUFFile


def write_small_gguf(path: Path) -> Path:
    """A small valid GGUF: a few typed metadata values and two tensors (F32 and Q8_0)."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("test.count", 7)
    w.add_float32("test.eps", 1e-5)
    w.add_bool("test.flag", True)
    w.add_string("test.name", "tiny")
    w.add_array("test.tokens", ["a", "bé", "🙂"])
    w.add_array("test.scores", [0.5, -1.0, 2.0])
    rng = np.random.default_rng(0)
    w.add_tensor("vec.weight", rng.standard_normal(64).astype(np.float32))
    q = gguf.quants.quantize(rng.standard_normal((4, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("mat.weight", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def small(tmp_path: Path) -> Path:
    return write_small_gguf(tmp_path / "small.gguf")


def test_reads_typed_metadata_and_tensors(small: Path) -> None:
    g = GGUFFile(small)
    assert g.version == 3
    assert g.architecture == "llama"
    assert g.get_int("test.count") == 7
    assert g.get_float("test.eps") == pytest.approx(1e-5)
    assert g.get_bool("test.flag") is True
    assert g.get_str("test.name") == "tiny"
    assert g.get_array("test.tokens") == ["a", "bé", "🙂"]
    assert np.allclose(g.get_array("test.scores"), [0.5, -1.0, 2.0])
    mat = g.tensor("mat.weight")
    assert mat.dims == (64, 4) and mat.shape == (4, 64) and mat.type_name == "Q8_0"
    assert mat.n_bytes == 4 * 2 * 34 and mat.rows().shape == (4, 68)
    ref = gguf.GGUFReader(str(small))
    want = {t.name: bytes(t.data.tobytes()) for t in ref.tensors}
    assert bytes(mat.data) == want["mat.weight"]
    assert bytes(g.tensor("vec.weight").data) == want["vec.weight"]


def test_typed_accessor_rejects_wrong_type(small: Path) -> None:
    g = GGUFFile(small)
    with pytest.raises(GGUFError, match="test.name.*integer"):
        g.get_int("test.name")
    with pytest.raises(GGUFError, match="missing"):
        g.get_int("no.such.key")
    assert g.get_int("no.such.key", 3) == 3


def test_real_models_match_gguf_package(model_paths: dict[str, Path]) -> None:
    for path in model_paths.values():
        g = GGUFFile(path)
        ref = gguf.GGUFReader(str(path))
        assert len(g.tensors) == len(ref.tensors)
        for t in ref.tensors[:40]:
            mine = g.tensors[t.name]
            assert mine.type_name == t.tensor_type.name
            assert mine.dims == tuple(int(d) for d in t.shape)
            assert mine.offset == t.data_offset
        assert len(g.get_array("tokenizer.ggml.tokens")) == len(ref.fields["tokenizer.ggml.tokens"].data)


def _tensor_info_offset(data: bytes, name: str) -> int:
    """Byte offset of the rank field that follows tensor ``name`` in the header."""
    key = struct.pack("<Q", len(name)) + name.encode()
    return data.index(key) + len(key)


def _corrupt(small: Path, tmp_path: Path, how: str) -> Path:
    data = bytearray(small.read_bytes())
    if how == "bad magic":
        data[0:4] = b"GGUX"
    elif how == "unknown version":
        data[4:8] = struct.pack("<I", 99)
    elif how == "truncated header":
        data = data[:40]
    elif how == "string length past the end":
        data[24:32] = struct.pack("<Q", 1 << 40)  # length of the first key
    elif how == "tensor data past the end":
        data = data[: len(data) - 100]
    elif how == "absurd tensor count":
        data[8:16] = struct.pack("<Q", 1 << 60)
    elif how == "dimension overflow":
        at = _tensor_info_offset(bytes(data), "mat.weight")
        data[at + 4 : at + 20] = struct.pack("<QQ", 1 << 62, 1 << 62)
    elif how == "unknown tensor type":
        at = _tensor_info_offset(bytes(data), "mat.weight")
        data[at + 20 : at + 24] = struct.pack("<I", 1000)
    elif how == "misaligned tensor offset":
        at = _tensor_info_offset(bytes(data), "mat.weight")
        off = struct.unpack_from("<Q", data, at + 24)[0]
        data[at + 24 : at + 32] = struct.pack("<Q", off + 1)
    elif how == "empty file":
        data = bytearray()
    out = tmp_path / f"{how.replace(' ', '_')}.gguf"
    out.write_bytes(bytes(data))
    return out


CASES = {
    "bad magic": "not a GGUF file",
    "unknown version": "unsupported GGUF version 99",
    "truncated header": "truncated",
    "string length past the end": "claims 1099511627776 bytes",
    "tensor data past the end": "runs past the end",
    "absurd tensor count": "tensor count",
    "dimension overflow": "overflow",
    "unknown tensor type": "unknown GGML type 1000",
    "misaligned tensor offset": "not aligned",
    "empty file": "empty file",
}


@pytest.mark.parametrize("how", list(CASES))
def test_malformed_file_raises_one_clear_error(small: Path, tmp_path: Path, how: str) -> None:
    bad = _corrupt(small, tmp_path, how)
    with pytest.raises(GGUFError, match=CASES[how]) as info:
        GGUFFile(bad)
    assert str(bad) in str(info.value)


CLI_CASES = ["bad magic", "unknown version", "truncated header", "string length past the end",
             "tensor data past the end", "absurd tensor count", "dimension overflow"]


@pytest.mark.parametrize("command", ["run", "show"])
@pytest.mark.parametrize("how", CLI_CASES)
def test_cli_reports_malformed_file_in_one_line(small: Path, tmp_path: Path, how: str, command: str) -> None:
    bad = _corrupt(small, tmp_path, how)
    args = [sys.executable, "-m", "llmedge.cli.main", command, str(bad)]
    if command == "run":
        args.append("hello")
    r = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("Error: ") and CASES[how] in lines[0]
    assert "Traceback" not in r.stderr and r.stdout == ""


@pytest.mark.parametrize("odd", ["plain", "nul", "bad-utf8", "split-char"])
def test_bulk_string_arrays_equal_per_string_reads(tmp_path: Path, odd: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Large string arrays are decoded in one pass; every odd case must read as the per-string path does."""
    import llmedge.gguf as reader

    words = [f"tok{i}" for i in range(3000)] + ["", "ĠÃ©", "日本語", "😀"]
    w = gguf.GGUFWriter(str(tmp_path / "s.gguf"), "llama")
    w.add_array("test.words", words)
    w.add_tensor("vec.weight", np.zeros(64, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    data = bytearray((tmp_path / "s.gguf").read_bytes())
    at = data.index(b"tok1234")
    if odd == "nul":
        data[at + 3] = 0
    elif odd == "bad-utf8":
        data[at + 3] = 0xFF
    elif odd == "split-char":  # a lead byte at the end of one string, its continuation starting the next
        at = data.index(b"tok1235")
        data[at + 6] = 0xC3
        data[at + 7 + 8] = 0xA9
    path = tmp_path / "odd.gguf"
    path.write_bytes(bytes(data))
    bulk = GGUFFile(path).metadata["test.words"]
    monkeypatch.setattr(reader, "_bulk_strings", lambda *a: None)
    plain = GGUFFile(path).metadata["test.words"]
    assert bulk == plain and len(bulk) == len(words)
    if odd == "plain":
        assert bulk == words


def _rss_file_kb() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssFile:"))


def _vm_flags(arr: np.ndarray) -> list[str]:
    """The VmFlags of the mapping holding ``arr`` (/proc/self/smaps)."""
    addr, inside = arr.ctypes.data, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(v, 16) for v in head.split("-"))
                inside = lo <= addr < hi
            elif inside and head == "VmFlags:":
                return line.split()[1:]
    raise AssertionError("no mapping holds the array")


def test_release_resident_pages_drops_a_tensors_file_pages_and_keeps_its_bytes(tmp_path: Path) -> None:
    """A backend that copied a tensor (the native backend's packed weights) drops the file's pages under
    it from the resident set; the bytes read back the same (faulted in again from the page cache).
    Memory that is not a GGUF file mapping (anonymous, where MADV_DONTNEED would zero it) is left alone.
    prepare_release, called before, stops 2 MB mappings of the file (see its docstring)."""
    from llmedge.gguf import prepare_release, release_resident_pages

    path = tmp_path / "big.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("big.weight", np.arange(4 << 20, dtype=np.float32))  # 16 MB
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    copy = np.arange(4 << 20, dtype=np.float32)
    with GGUFFile(path) as g:
        data = g.tensor("big.weight").data
        assert int(data.view(np.uint8).sum(dtype=np.uint64)) > 0  # every page resident
        assert prepare_release(data)
        if sys.platform.startswith("linux"):
            # no 2 MB mappings of the file from now on: releasing part of one would unmap its neighbours too
            assert "nh" in _vm_flags(data), "the mapping still takes huge-page mappings"
            before = _rss_file_kb()
            assert release_resident_pages(data) and release_resident_pages(data)  # counted once
            assert before - _rss_file_kb() > 12 << 10, "the tensor's pages stayed resident"
            assert (16 << 20) - 4096 <= g.released_bytes <= 16 << 20
        else:
            release_resident_pages(data)
        assert np.array_equal(data.view(np.float32), copy)
        del data
    assert not prepare_release(copy) and not release_resident_pages(copy)
    assert np.array_equal(copy, np.arange(4 << 20, dtype=np.float32))
