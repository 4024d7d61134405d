"""`llmedge convert`: Hugging Face safetensors folders to GGUF, judged by the weights' own forward pass.

Every family gets a tiny random HF folder (tests/hf_folders.py). Its converted GGUF, loaded by
llmedge, must give the logits of a float64 forward of the HF weights in HF's layout (so the tensor
name map, Llama's Q/K permutation, Gemma's ``norm + 1`` and Phi-3's fused projections are proven),
and llama.cpp must have loaded the very same tensors and agreed (fixtures/llamacpp_convert.json, made
by fixtures/make_convert_fixtures.py). A real model (SmolLM2-135M's dequantized tensors exported
back to an HF folder) converts to bit-identical tensors, the same vocabulary and metadata, and the
same greedy continuation; converting it peaks well below its F32 size in memory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gguf
import hf_folders as hf
import numpy as np
import pytest
from fake_hub import FakeHub, serve

from conftest import load_fixture
from llmedge.gguf import GGUFFile
from llmedge.quant.convert import convert
from llmedge.quant.dequant import dequantize

FAMILIES = list(hf.FAMILIES)
T = gguf.GGMLQuantizationType


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("hf")
    return {f: hf.write_tiny(f, d / f) for f in FAMILIES}


@pytest.fixture(scope="module")
def converted(folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("gguf")
    return {f: convert(p, d / f"{f}.gguf", "f32").path for f, p in folders.items()}


def _reference(family: str) -> np.ndarray:
    return hf.hf_forward(family, hf.tiny_config(family), hf.tiny_weights(family), hf.PROMPT)


def _logits(path: Path, kv_type: str = "f32") -> np.ndarray:
    import llmedge

    return llmedge.load(str(path), n_ctx=64, kv_type=kv_type).logits(hf.PROMPT).astype(np.float64)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full = {**os.environ, **(env or {})}
    for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HUB_OFFLINE", "HF_TOKEN"):
        full.pop(key, None)
    return subprocess.run([sys.executable, "-m", "llmedge.cli.main", *args], capture_output=True, text=True,
                          env=full, timeout=120, stdin=subprocess.DEVNULL)


def _fingerprint(path: Path) -> str:
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_convert_fixtures", Path(__file__).parent / "fixtures/make_convert_fixtures.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.fingerprint(path)


@pytest.mark.parametrize("family", FAMILIES)
def test_converted_logits_equal_a_float64_forward_of_the_hf_weights(family: str, converted: dict[str, Path]) -> None:
    ref = _reference(family)
    got = _logits(converted[family])
    assert _rel(got, ref) < 2e-4, family  # float32 arithmetic; a wrong map or permutation is > 1e-2
    assert (got.argmax(-1) == ref.argmax(-1)).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_llamacpp_loaded_the_same_conversion_and_agrees(family: str, converted: dict[str, Path]) -> None:
    fx = load_fixture("llamacpp_convert.json")
    assert fx["prompt"] == hf.PROMPT
    assert _fingerprint(converted[family]) == fx["models"][family]["fingerprint"], "not the tensors llama.cpp saw"
    theirs = np.asarray(fx["models"][family]["logits"])
    assert _rel(theirs, _reference(family)) < 5e-4  # llama.cpp's f16 KV cache
    assert _rel(_logits(converted[family], kv_type="f16"), theirs) < 5e-4


def test_llama_rows_are_permuted_and_the_name_map_is_llamacpps(folders: dict[str, Path], converted: dict[str, Path]) -> None:
    g = GGUFFile(converted["llama"])
    names = list(g.tensors)
    assert names[0] == "rope_freqs.weight" and "output.weight" in names and "blk.1.ffn_down.weight" in names
    w = hf.tiny_weights("llama")
    q = dequantize(g.tensors["blk.0.attn_q.weight"].data, T.F32, g.tensors["blk.0.attn_q.weight"].shape)
    k = dequantize(g.tensors["blk.0.attn_k.weight"].data, T.F32, g.tensors["blk.0.attn_k.weight"].shape)
    assert not np.array_equal(q, w["model.layers.0.self_attn.q_proj.weight"])
    assert np.array_equal(hf.unpermute(q, hf.N_HEAD), w["model.layers.0.self_attn.q_proj.weight"])
    assert np.array_equal(hf.unpermute(k, hf.N_KV), w["model.layers.0.self_attn.k_proj.weight"])
    gemma = GGUFFile(converted["gemma"])
    norm = dequantize(gemma.tensors["blk.0.attn_norm.weight"].data, T.F32, (hf.HIDDEN,))
    assert np.allclose(norm, hf.tiny_weights("gemma")["model.layers.0.input_layernorm.weight"] + 1)
    assert "output.weight" not in gemma.tensors  # tied: llama.cpp reuses token_embd


def test_metadata_is_what_llamacpps_converter_writes(converted: dict[str, Path]) -> None:
    m = GGUFFile(converted["llama"]).metadata
    assert m["general.architecture"] == "llama" and m["general.type"] == "model"
    assert m["general.file_type"] == gguf.LlamaFileType.ALL_F32 and m["general.quantization_version"] == 2
    assert (m["llama.block_count"], m["llama.embedding_length"], m["llama.attention.head_count_kv"]) == (2, 64, 2)
    assert m["llama.vocab_size"] == hf.N_VOCAB and m["llama.rope.dimension_count"] == hf.HEAD_DIM
    assert m["tokenizer.ggml.model"] == "gpt2" and m["tokenizer.ggml.pre"] == "llama-bpe"
    assert m["tokenizer.chat_template"] == hf.TEMPLATE and m["tokenizer.ggml.add_bos_token"] is False
    assert (m["tokenizer.ggml.bos_token_id"], m["tokenizer.ggml.eos_token_id"]) == (0, 2)
    assert list(m["tokenizer.ggml.token_type"][:4]) == [3, 3, 3, 1]  # added specials are CONTROL
    assert len(m["tokenizer.ggml.merges"]) > 0
    assert GGUFFile(converted["qwen2"]).metadata["tokenizer.ggml.pre"] == "qwen2"
    gr = GGUFFile(converted["granite"]).metadata
    assert gr["tokenizer.ggml.pre"] == "gpt-2" and gr["granite.logit_scale"] == 4.0
    assert abs(gr["granite.attention.scale"] - 0.2) < 1e-7 and gr["granite.residual_scale"] == pytest.approx(0.3)
    g3 = GGUFFile(converted["gemma3"]).metadata
    assert g3["tokenizer.ggml.model"] == "llama" and g3["tokenizer.ggml.add_space_prefix"] is False
    assert g3["gemma3.attention.sliding_window"] == 6 and g3["tokenizer.ggml.add_bos_token"] is True
    assert g3["gemma3.attention.key_length"] == hf.HEAD_DIM
    assert GGUFFile(converted["gemma2"]).metadata["gemma2.final_logit_softcapping"] == 30.0
    assert GGUFFile(converted["phi3"]).metadata["phi3.attention.sliding_window"] == 0
    lr = GGUFFile(converted["phi3_longrope"])
    assert list(lr.tensors)[:2] == ["rope_factors_long.weight", "rope_factors_short.weight"]
    assert lr.metadata["phi3.rope.scaling.attn_factor"] == pytest.approx(1.25 ** 0.5)
    assert lr.metadata["phi3.rope.scaling.original_context_length"] == 256


def test_a_llama_with_a_sentencepiece_model_gets_the_llama_vocabulary(folders: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    d = shutil.copytree(folders["llama"], tmp_path / "llama2")
    (d / "tokenizer.json").unlink()
    (d / "tokenizer.model").write_bytes(hf.spm_model(hf.N_VOCAB, llama_style=True)[0])
    (d / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": True, "chat_template": hf.TEMPLATE}))
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "bos_token_id": 1, "eos_token_id": 2}))
    g = GGUFFile(convert(d, tmp_path / "l2.gguf", "f32").path)
    m = g.metadata
    assert (m["tokenizer.ggml.model"], m["tokenizer.ggml.pre"]) == ("llama", "default")
    assert list(m["tokenizer.ggml.tokens"][:4]) == ["<unk>", "<s>", "</s>", "<0x00>"]
    assert list(m["tokenizer.ggml.token_type"][:4]) == [2, 3, 3, 6] and m["tokenizer.ggml.scores"][270] == -12.0  # piece 270 is word 11
    assert m["tokenizer.ggml.add_bos_token"] is True and m["tokenizer.ggml.bos_token_id"] == 1
    assert _rel(_logits(g.path), _reference("llama")) < 2e-4


def test_chat_template_jinja_and_generation_config_are_read(folders: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    d = shutil.copytree(folders["qwen3"], tmp_path / "Qwen3-Tiny-Instruct")
    tc = json.loads((d / "tokenizer_config.json").read_text())
    del tc["chat_template"]
    (d / "tokenizer_config.json").write_text(json.dumps(tc))
    (d / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    (d / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "top_k": 20, "top_p": 0.95}))
    m = GGUFFile(convert(d, tmp_path / "q.gguf", "f32").path).metadata
    assert m["tokenizer.chat_template"] == "{{ messages[0]['content'] }}"
    assert m["general.sampling.top_k"] == 20 and m["general.sampling.temp"] == pytest.approx(0.6)
    assert m["general.name"] == "Qwen3 Tiny Instruct" and m["general.finetune"] == "Instruct"


def test_outtypes_follow_llamacpps_rules(folders: dict[str, Path], tmp_path: Path) -> None:
    auto_f32 = GGUFFile(convert(folders["llama"], tmp_path / "a.gguf", "auto").path)
    assert auto_f32.metadata["general.file_type"] == gguf.LlamaFileType.MOSTLY_F16
    types = {n: t.ggml_type for n, t in auto_f32.tensors.items()}
    assert types["blk.0.attn_q.weight"] == T.F16 and types["token_embd.weight"] == T.F16
    assert types["blk.0.attn_norm.weight"] == T.F32 and types["rope_freqs.weight"] == T.F32
    auto_bf16 = GGUFFile(convert(folders["qwen3"], tmp_path / "b.gguf", "auto").path)  # a BF16 checkpoint
    assert auto_bf16.metadata["general.file_type"] == gguf.LlamaFileType.MOSTLY_BF16
    q = auto_bf16.tensors["blk.0.attn_q.weight"]
    w = hf.tiny_weights("qwen3")["model.layers.0.self_attn.q_proj.weight"]
    assert q.ggml_type == T.BF16 and np.array_equal(dequantize(q.data, T.BF16, q.shape), w)  # lossless
    assert auto_bf16.tensors["blk.0.attn_q_norm.weight"].ggml_type == T.F32
    q8 = GGUFFile(convert(folders["qwen2"], tmp_path / "c.gguf", "q8_0").path)
    t = q8.tensors["blk.0.ffn_down.weight"]
    src = hf.tiny_weights("qwen2")["model.layers.0.mlp.down_proj.weight"]
    assert t.ggml_type == T.Q8_0 and q8.tensors["blk.0.attn_q.bias"].ggml_type == T.F32
    assert np.array_equal(np.asarray(t.data), gguf.quants.quantize(src, T.Q8_0).reshape(-1))  # llama.cpp's bytes
    assert _rel(_logits(q8.path), _reference("qwen2")) < 0.05


@pytest.fixture(scope="module")
def smol_folder(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Path:
    return hf.export_gguf(smollm2_path, tmp_path_factory.mktemp("smol") / "SmolLM2-135M-Instruct")


def test_a_real_model_exported_to_hf_converts_back_to_the_same_model(tmp_path: Path, smollm2_path: Path,
                                                                     smol_folder: Path) -> None:
    import llmedge

    folder = smol_folder
    f32 = GGUFFile(convert(folder, tmp_path / "f32.gguf", "f32").path)
    (tmp_path / "out").mkdir()
    f16 = convert(folder, tmp_path / "out", "f16").path  # a folder: llama.cpp's file name
    assert f16.name == "SmolLM2-135M-Instruct-F16.gguf"
    orig = GGUFFile(smollm2_path)
    assert list(f32.tensors) == list(orig.tensors)
    for name, ti in orig.tensors.items():  # the dequantized weights, bit for bit, in GGUF's layout
        assert np.array_equal(dequantize(ti.data, ti.ggml_type, ti.shape),
                              dequantize(f32.tensors[name].data, T.F32, ti.shape)), name
    om, cm = orig.metadata, f32.metadata
    for key in ("tokenizer.ggml.pre", "tokenizer.ggml.model", "tokenizer.ggml.bos_token_id",
                "tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token",
                "tokenizer.ggml.add_space_prefix", "tokenizer.chat_template", "llama.rope.freq_base",
                "llama.context_length", "llama.vocab_size", "general.size_label", "general.license"):
        assert cm[key] == om[key], key
    assert cm["tokenizer.ggml.pre"] == "smollm"  # llama.cpp's hash of the check text, computed without transformers
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type"):
        assert list(cm[key]) == list(om[key]), key
    # the original's Q4_1 products (Q8_1 activations) differ from F16/F32 ones: a prompt without near-ties
    prompt = [{"role": "user", "content": "Give me a short poem about cats."}]
    orig_model = llmedge.load(str(smollm2_path), n_ctx=256)
    want = [c.token for c in orig_model.chat(prompt, max_tokens=24, temperature=0)]
    fx = load_fixture("llamacpp_convert.json")["smollm2_f16"]
    assert _fingerprint(f16) == fx["fingerprint"], "not the file llama.cpp ran"
    assert orig_model.tokenize(orig_model.apply_chat_template(prompt), special=True) == fx["prompt_ids"]
    assert want == fx["greedy"]  # llama.cpp, on this very converted F16 file
    m = llmedge.load(str(f16), n_ctx=256)  # (F32's tensors are the original's, bit for bit, above)
    assert [c.token for c in m.chat(prompt, max_tokens=24, temperature=0)] == want
    text = "Héllo wörld 12345 🚀 it's"
    assert m.tokenize(text) == orig_model.tokenize(text)


def test_a_real_sentencepiece_vocabulary_converts_to_the_same_tokenizer(tmp_path: Path, gemma3_path: Path) -> None:
    from llmedge.tokenizer import Tokenizer

    folder = hf.export_spm_vocab(gemma3_path, tmp_path / "gemma-3-tiny")
    got = GGUFFile(convert(folder, tmp_path / "g.gguf", "f32").path).metadata
    want = GGUFFile(gemma3_path).metadata
    for key in ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token",
                "tokenizer.ggml.add_eos_token", "tokenizer.ggml.add_space_prefix"):
        assert got[key] == want[key], key
    assert list(got["tokenizer.ggml.tokens"]) == list(want["tokenizer.ggml.tokens"])
    assert np.array_equal(np.asarray(got["tokenizer.ggml.token_type"]), np.asarray(want["tokenizer.ggml.token_type"]))
    assert np.array_equal(np.asarray(got["tokenizer.ggml.scores"]), np.asarray(want["tokenizer.ggml.scores"]))
    text = "Héllo wörld!  <start_of_turn>user\n日本語のテキスト, код 12345 🚀\t  tabs"
    a, b = Tokenizer.from_metadata(want), Tokenizer.from_metadata(got)
    assert b.encode(text, add_bos=True, special=True) == a.encode(text, add_bos=True, special=True)
    assert len(a.encode(text, add_bos=True, special=True)) > 20


def test_converting_streams_tensors_and_peaks_below_the_f32_size(tmp_path: Path, smol_folder: Path) -> None:
    folder = smol_folder
    f32_size = (folder / "model.safetensors").stat().st_size
    code = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", code, sys.executable, "-m", "llmedge.cli.main", "convert",
                          str(folder), "-o", str(tmp_path / "s.gguf"), "--outtype", "f16", "-q"],
                         capture_output=True, text=True, check=True, timeout=300)
    peak = int(out.stdout) * 1024
    assert peak < 0.4 * f32_size, (peak, f32_size)  # measured: 145 MB of 538 MB; holding the model is > 538


def test_a_tensor_larger_than_the_budget_is_streamed_in_row_ranges(folders: dict[str, Path], tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import llmedge.quant.convert as cv

    whole = convert(folders["llama"], tmp_path / "whole.gguf", "q8_0").path.read_bytes()
    calls: list[tuple[int, int]] = []
    chunks = cv._Out.chunks
    monkeypatch.setattr(cv, "CHUNK_BYTES", 1024)  # 4 rows of 64 floats: every matrix in many pieces
    monkeypatch.setattr(cv._Out, "chunks", lambda self, budget=None: calls.extend(c := list(chunks(self))) or iter(c))
    streamed = convert(folders["llama"], tmp_path / "streamed.gguf", "q8_0").path.read_bytes()
    assert streamed == whole  # the permutation works per head, the quantizer per row
    assert len(calls) > 10 * len(GGUFFile(tmp_path / "whole.gguf").tensors)


def test_the_cli_converts_a_folder_and_draws_a_line_per_tensor(folders: dict[str, Path], tmp_path: Path) -> None:
    p = cli("convert", str(folders["gemma3"]), "-o", str(tmp_path / "g.gguf"), "--outtype", "bf16")
    assert p.returncode == 0, p.stderr
    assert "gemma3" in p.stdout and "MOSTLY_BF16" in p.stdout
    assert "token_embd.weight" in p.stderr and "-> BF16" in p.stderr
    assert GGUFFile(tmp_path / "g.gguf").metadata["general.file_type"] == gguf.LlamaFileType.MOSTLY_BF16


def _broken(folders: dict[str, Path], tmp_path: Path) -> dict[str, tuple[Path, str]]:
    import shutil

    out: dict[str, tuple[Path, str]] = {}
    for case in ("arch", "config", "weights", "shard", "pretok", "tokenizer"):
        d = tmp_path / case
        shutil.copytree(folders["llama"] if case != "tokenizer" else folders["gemma"], d)
        out[case] = (d, "")
    cfg = json.loads((tmp_path / "arch/config.json").read_text())
    (tmp_path / "arch/config.json").write_text(json.dumps({**cfg, "architectures": ["MambaForCausalLM"]}))
    out["arch"] = (tmp_path / "arch", "unsupported architecture MambaForCausalLM")
    (tmp_path / "config/config.json").unlink()
    out["config"] = (tmp_path / "config", "has no config.json")
    for f in (tmp_path / "weights").glob("model*"):
        f.unlink()
    out["weights"] = (tmp_path / "weights", "has no model*.safetensors")
    next((tmp_path / "shard").glob("model-00002-*")).unlink()
    out["shard"] = (tmp_path / "shard", "missing safetensors part(s): model-00002-of-00002.safetensors")
    tj = json.loads((tmp_path / "pretok/tokenizer.json").read_text())
    tj["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\w+|\\s+"
    (tmp_path / "pretok/tokenizer.json").write_text(json.dumps(tj))
    out["pretok"] = (tmp_path / "pretok", "unknown BPE pre-tokenizer")
    (tmp_path / "tokenizer/tokenizer.model").unlink()
    out["tokenizer"] = (tmp_path / "tokenizer", "has no tokenizer.model")
    return out


def _main(*args: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    """``llmedge ARGS`` through the console entry point, in this process: (exit status, stderr)."""
    from llmedge.cli.main import main

    monkeypatch.setattr(sys, "argv", ["llmedge", *args])
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main()
    return int(e.value.code or 0), capsys.readouterr().err


def test_bad_input_is_one_line_and_exit_1(folders: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    cases = _broken(folders, tmp_path)
    cases["nofolder"] = (tmp_path / "nope", "no such folder")
    for case, (path, text) in cases.items():
        code, err = _main("convert", str(path), "-o", str(tmp_path / f"{case}.gguf"), capsys=capsys,
                          monkeypatch=monkeypatch)
        assert code == 1, (case, err)
        assert err.count("\n") == 1 and err.startswith("Error: ") and text in err, (case, err)
        assert not (tmp_path / f"{case}.gguf").exists() and not list(tmp_path.glob("*.partial"))
    code, err = _main("convert", str(folders["llama"]), "-o", str(tmp_path / "x.gguf"), "--outtype", "q4_0",
                      capsys=capsys, monkeypatch=monkeypatch)
    assert code == 1 and "unknown --outtype 'q4_0'" in err
    p = cli("convert", str(cases["pretok"][0]), "-o", str(tmp_path / "p.gguf"))  # as a user runs it
    assert p.returncode == 1 and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr


def test_an_output_that_is_a_source_file_is_refused_before_writing(folders: dict[str, Path], tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """-o naming a file of the source folder (itself, a hard link or a symlink to it) would replace the
    model being converted: one line, exit 1, the source files and the link untouched."""
    import shutil

    from llmedge.quant.convert import ConvertError

    src = tmp_path / "src"
    shutil.copytree(folders["llama"], src)
    shard = next(src.glob("model-00001-*.safetensors"))
    before = {f.name: f.read_bytes() for f in src.iterdir()}
    hard, sym = tmp_path / "hard.gguf", tmp_path / "sym.gguf"
    os.link(shard, hard)
    sym.symlink_to(src / "config.json")
    for out in (shard, src / "config.json", hard, sym):
        code, err = _main("convert", str(src), "-o", str(out), "-q", capsys=capsys, monkeypatch=monkeypatch)
        assert code == 1, (out, err)
        assert err.count("\n") == 1 and err.startswith("Error: ") and "would overwrite it" in err, (out, err)
        with pytest.raises(ConvertError, match="is the source file"):
            convert(src, out)
    assert {f.name: f.read_bytes() for f in src.iterdir()} == before  # no .partial left either
    assert sym.is_symlink() and hard.read_bytes() == before[shard.name]
    # an earlier conversion in the folder itself may be overwritten
    again = src / "model.gguf"
    again.write_bytes(b"old")
    assert convert(src, again, "f32").nbytes > 3


def test_a_hub_repo_converts_through_the_hf_cache(folders: dict[str, Path], tmp_path: Path) -> None:
    files: dict[str, bytes | Path] = {p.name: p for p in folders["qwen2"].iterdir()}
    files["pytorch_model.bin"] = b"not downloaded: safetensors only"
    hub = FakeHub(repos={"Org/Tiny-Qwen": files})
    server = serve(hub)
    try:
        env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_DISABLE_TELEMETRY": "1",
               "LLMEDGE_MODELS": str(tmp_path / "store")}
        p = cli("convert", "hf.co/Org/Tiny-Qwen", "-o", str(tmp_path / "q.gguf"), "--outtype", "f32", "-q", env=env)
        assert p.returncode == 0, p.stderr
        assert hub.gets("pytorch_model.bin") == 0 and hub.gets("model.safetensors") == 1
        assert list((tmp_path / "hf").rglob("model.safetensors"))  # in the Hugging Face cache
        m = GGUFFile(tmp_path / "q.gguf").metadata
        assert m["general.name"] == "Org/Tiny-Qwen" and m["tokenizer.ggml.pre"] == "qwen2"
        assert _rel(_logits(tmp_path / "q.gguf"), _reference("qwen2")) < 2e-5
        p = cli("convert", "hf.co/Org/nope", "-o", str(tmp_path / "n.gguf"), env=env)
        assert p.returncode == 1 and p.stderr.count("\n") == 1 and "hf.co/Org/nope" in p.stderr
    finally:
        server.shutdown()
        server.server_close()
