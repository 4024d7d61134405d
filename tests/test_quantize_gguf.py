"""Tests of ``llmedge quantize``: whole files, byte for byte as llama.cpp's ``llama_model_quantize``.

Oracle: ``fixtures/quantize_mixes_llamacpp.json`` (sha256 of llama.cpp's output for the tiny model
of ``fixtures/tiny_quant_model.py``, per mix and option set; made by
``fixtures/make_quantize_mix_fixtures.py``). The tests write the same tiny model, check that
its bytes are those llama.cpp was given, quantize it with llmedge and compare digests.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as T

from llmedge.quant.gguf_quantize import quantize_gguf
from llmedge.quant.imatrix import load_imatrix
from llmedge.quant.mix import MixParams, ModelInfo, TypePlanner, ftype_from_name, parse_type

FIXTURES = Path(__file__).parent / "fixtures"
MIXES = json.loads((FIXTURES / "quantize_mixes_llamacpp.json").read_text(encoding="utf-8"))
sys.path.insert(0, str(FIXTURES))

from tiny_quant_model import write_tiny_imatrix, write_tiny_llama  # noqa: E402


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("tiny")
    paths = {}
    for dtype in ("f16", "f32"):
        paths[dtype] = d / f"tiny-{dtype}.gguf"
        write_tiny_llama(paths[dtype], dtype)
        assert sha256(paths[dtype]) == MIXES["inputs_sha256"][dtype], "gguf writer output changed: remake fixtures"
    for fmt, ext in (("gguf", "gguf"), ("legacy", "dat")):
        write_tiny_imatrix(d / f"tiny-imatrix.{ext}", fmt)
        assert sha256(d / f"tiny-imatrix.{ext}") == MIXES["inputs_sha256"][f"imatrix.{ext}"]
    paths["dir"] = d
    return paths


def params_from_options(mix: str, opts: list[str]) -> tuple[MixParams, str | None]:
    """The CLI's option parsing, repeated here so that each case runs in-process (+ the imatrix name)."""
    p = MixParams(ftype=ftype_from_name(mix))
    imatrix = None
    it = iter(opts)
    for o in it:
        if o == "--imatrix":
            imatrix = next(it)
        elif o == "--pure":
            p.pure = True
        elif o == "--leave-output-tensor":
            p.quantize_output_tensor = False
        elif o == "--output-tensor-type":
            p.output_tensor_type = parse_type(next(it))
        elif o == "--token-embedding-type":
            p.token_embedding_type = parse_type(next(it))
        elif o == "--tensor-type":
            pattern, _, t = next(it).partition("=")
            p.tensor_types.append((pattern.lower(), parse_type(t)))
    return p, imatrix


@pytest.mark.parametrize("case", sorted(MIXES["cases"]))
def test_quantize_file_equals_llama_model_quantize(case: str, tiny: dict[str, Path], tmp_path: Path) -> None:
    c = MIXES["cases"][case]
    out = tmp_path / "out.gguf"
    params, im_name = params_from_options(c["type"], c["options"])
    im = {} if im_name is None else {"imatrix": load_imatrix(tiny["dir"] / im_name), "imatrix_name": im_name}
    if c.get("refused"):
        with pytest.raises(ValueError):
            quantize_gguf(tiny[c["input"]], out, params, **im)
        assert not out.exists()
        return
    quantize_gguf(tiny[c["input"]], out, params, **im)
    assert out.stat().st_size == c["size"]
    assert sha256(out) == c["sha256"]


def test_cli_quantize_writes_the_same_file_and_reports_errors_in_one_line(tiny: dict[str, Path], tmp_path: Path) -> None:
    c = MIXES["cases"]["q4_k_m-tensor-types"]
    out = tmp_path / "cli.gguf"
    cmd = [sys.executable, "-m", "llmedge.cli.main", "quantize", str(tiny["f16"]), str(out), "q4_k_m", "-q"]
    r = subprocess.run(cmd + c["options"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert sha256(out) == c["sha256"]
    assert "quantized 75 tensors" in r.stdout
    # re-quantizing a quantized file needs --allow-requantize
    r = subprocess.run(cmd[:4] + [str(out), str(tmp_path / "again.gguf"), "q8_0"], capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "--allow-requantize" in r.stderr
    assert not (tmp_path / "again.gguf").exists()
    r = subprocess.run(cmd[:4] + [str(tiny["f16"]), str(out), "q9_k"], capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.startswith("Error: unknown quantization type")


def test_requantize_from_a_quantized_file_uses_its_dequantized_values(tiny: dict[str, Path], tmp_path: Path) -> None:
    q8 = tmp_path / "q8.gguf"
    quantize_gguf(tiny["f16"], q8, MixParams("Q8_0"))
    q4 = tmp_path / "q4.gguf"
    r = quantize_gguf(q8, q4, MixParams("Q4_0"), allow_requantize=True)
    assert r.types["blk.0.attn_q.weight"] == T.Q4_0 and r.types["output.weight"] == T.Q6_K
    assert r.types["blk.0.attn_norm.weight"] == T.F32


def test_mix_rules_bump_attn_v_and_ffn_down_by_layer() -> None:
    names = ["token_embd.weight", "output.weight"]
    names += [f"blk.{i}.{t}.weight" for i in range(8) for t in ("attn_v", "ffn_down")]
    info = ModelInfo("llama", n_layer=8, n_head=8, n_head_kv=8)
    planner = TypePlanner(info, MixParams("Q4_K_M"), names)
    got = {n: planner.target_type(n, T.F16, [4096, 4096]) for n in names}
    # use_more_bits(i, 8): layers 0, 7 and (i - 1) % 3 == 2, i.e. 3 and 6
    assert [got[f"blk.{i}.attn_v.weight"] for i in range(8)] == [
        T.Q6_K, T.Q4_K, T.Q4_K, T.Q6_K, T.Q4_K, T.Q4_K, T.Q6_K, T.Q6_K,
    ]  # fmt: skip
    assert got["output.weight"] == T.Q6_K and got["token_embd.weight"] == T.Q4_K
    planner = TypePlanner(info, MixParams("Q4_K_M"), names)
    assert planner.target_type("blk.0.ffn_down.weight", T.F16, [288, 256]) == T.Q8_0  # Q6_K, 288 % 256: fallback


def test_imatrix_collects_squared_inputs_and_feeds_quantize(tiny: dict[str, Path], tmp_path: Path) -> None:
    import gguf
    import numpy as np

    from llmedge.quant.imatrix_collect import collect_imatrix, write_imatrix_gguf

    ids = [int(i) for i in np.random.default_rng(3).integers(0, 512, 64)]
    stats = collect_imatrix(tiny["f32"], tokens=ids, n_ctx=32)
    assert stats.n_chunks == 2 and len(stats.sums) == 8 * 7 and stats.counts["blk.3.ffn_down.weight"] == 64
    # blk.0.attn_q's input is the RMS-normed embedding: recompute it in float64
    r = gguf.GGUFReader(str(tiny["f32"]))
    t = {x.name: np.asarray(x.data, np.float64) for x in r.tensors}
    seen = list(ids)
    seen[0] = seen[32] = 1  # each chunk starts with BOS (id 1: SPM's default), as llama-imatrix does
    x = t["token_embd.weight"].reshape(512, 256)[seen]
    h = x / np.sqrt((x * x).mean(axis=1, keepdims=True) + 1e-5) * t["blk.0.attn_norm.weight"]
    np.testing.assert_allclose(stats.sums["blk.0.attn_q.weight"], (h * h).sum(axis=0), rtol=2e-4)
    path = tmp_path / "collected.gguf"
    write_imatrix_gguf(path, stats, ["ids"])
    im = load_imatrix(path)
    assert im.chunk_count == 2 and im.datasets == ["ids"]
    np.testing.assert_allclose(im.weights["blk.0.attn_q.weight"], stats.sums["blk.0.attn_q.weight"] / 64, rtol=1e-6)
    plain, weighted = tmp_path / "plain.gguf", tmp_path / "weighted.gguf"
    quantize_gguf(tiny["f32"], plain, MixParams("Q4_K_S"))
    r2 = quantize_gguf(tiny["f32"], weighted, MixParams("Q4_K_S"), imatrix=im, imatrix_name="collected.gguf")
    assert r2.size_out > plain.stat().st_size  # + the quantize.imatrix.* keys
    assert sha256(plain) != sha256(weighted)


def test_an_output_that_is_the_input_or_a_folder_is_refused_up_front(tiny: dict[str, Path], tmp_path: Path) -> None:
    """The input itself (same path, a hard link, a symlink) or an existing folder as the output: one line
    naming the user's paths (not a temporary file), exit 1, nothing written, the input unchanged."""
    import os

    src = tmp_path / "in.gguf"
    src.write_bytes(tiny["f16"].read_bytes())
    want = sha256(src)
    hard, sym, folder = tmp_path / "hard.gguf", tmp_path / "sym.gguf", tmp_path / "out"
    os.link(src, hard)
    sym.symlink_to(src)
    folder.mkdir()
    for dst, text in ((src, "is the input file"), (hard, "is the input file"), (sym, "is the input file"),
                      (folder, "is a folder")):
        r = subprocess.run([sys.executable, "-m", "llmedge.cli.main", "quantize", str(src), str(dst), "q8_0", "-q"],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 1 and r.stderr.count("\n") == 1, (dst, r.stderr)
        assert r.stderr.startswith("Error: the output ") and text in r.stderr and ".tmp" not in r.stderr, r.stderr
        with pytest.raises(ValueError, match=text):
            quantize_gguf(src, dst, MixParams("Q8_0"))
    assert sha256(src) == want and os.path.samefile(src, hard) and sym.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hard.gguf", "in.gguf", "out", "sym.gguf"]
    assert not list(folder.iterdir())


def test_a_bad_tensor_type_regex_is_one_clean_line(tiny: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out.gguf"
    r = subprocess.run([sys.executable, "-m", "llmedge.cli.main", "quantize", str(tiny["f16"]), str(out), "q8_0",
                        "-q", "--tensor-type", "attn_(q=q4_0"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("Error: bad --tensor-type pattern 'attn_(q': missing )"), r.stderr
    assert "error: " not in r.stderr and not out.exists()
    with pytest.raises(ValueError, match="bad tensor-type pattern"):  # the library's own check
        quantize_gguf(tiny["f16"], out, MixParams("Q8_0", tensor_types=[("attn_(q", T.Q4_0)]))
    assert not out.exists()


def test_imatrix_cli_refuses_bad_arguments_before_the_work_and_writes_atomically(
        tiny: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A missing output folder, the model itself or a folder as the output, --ctx below the 16 rows
    llama-imatrix needs, --chunks 0: one line each and nothing written (they failed after the work
    with a raw FileNotFoundError, or wrote an imatrix of 0 entries). A failed write keeps the old file."""
    import os

    import numpy

    from llmedge.quant.imatrix_collect import ImatrixStats, write_imatrix_gguf

    text = tmp_path / "cal.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    out = tmp_path / "im.gguf"
    for args, want in (((f"-o{tmp_path / 'missing' / 'im.gguf'}",), "output folder"),
                       ((f"-o{tmp_path}",), "is a folder"), ((f"-o{tiny['f32']}",), "is the input file"),
                       (("--ctx", "0", f"-o{out}"), "--ctx must be at least 16"),
                       (("--chunks", "0", f"-o{out}"), "--chunks must be at least 1")):
        r = subprocess.run([sys.executable, "-m", "llmedge.cli.main", "imatrix", str(tiny["f32"]), "-f", str(text),
                            "--ctx", "16", *args], capture_output=True, text=True, timeout=300)
        assert r.returncode == 1 and r.stderr.count("\n") == 1 and want in r.stderr, (args, r.stderr)
    assert not out.exists() and sha256(tiny["f32"]) == MIXES["inputs_sha256"]["f32"]
    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_gguf import write_tiny_llama as write_runnable  # a vocabulary that spells any text

    model = write_runnable(tmp_path / "model.gguf", seed=2)
    r = subprocess.run([sys.executable, "-m", "llmedge.cli.main", "imatrix", str(model), "-f", str(text),
                        "--ctx", "16", "--chunks", "-1", "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and load_imatrix(out).chunk_count >= 2, r.stderr  # negative: every chunk
    old = out.read_bytes()

    def disk_error(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", disk_error)
    stats = ImatrixStats(sums={"blk.0.attn_q.weight": numpy.ones(4, numpy.float32)}, counts={"blk.0.attn_q.weight": 1})
    with pytest.raises(OSError):
        write_imatrix_gguf(out, stats, ["x"])
    assert out.read_bytes() == old and sorted(p.name for p in tmp_path.iterdir()) == ["cal.txt", "im.gguf", "model.gguf"]
