"""KL divergence as llama-perplexity computes it, on tiny random models: the base-logits file round-trips
in llama.cpp's layout, a model against itself has no divergence, a Q4_0 copy's statistics equal a float64
recomputation from both models' logits, mismatched base files are refused in one line, and the CLI
(`perplexity --kl-divergence-base/--kl-divergence/--kv-type`) prints llama-perplexity's report."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tiny_gguf

import llmedge
from llmedge import kld
from llmedge.errors import LlmedgeError
from llmedge.perplexity import kl_divergence, perplexity, save_kld_base
from llmedge.quant.gguf_quantize import quantize_gguf
from llmedge.quant.mix import MixParams, ftype_from_name

TEXT = (Path(__file__).parent / "fixtures" / "texts" / "gpl3_30k.txt").read_text(encoding="utf-8")[:240]
CTX = 128


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("kld")
    f32 = tiny_gguf.write_tiny_llama(d / "tiny-f32.gguf", seed=3)
    q4 = d / "tiny-q4_0.gguf"
    quantize_gguf(f32, q4, MixParams(ftype=ftype_from_name("Q4_0"), pure=True))
    base = d / "base.kld"
    save_kld_base(load(f32), TEXT, base, CTX)
    return {"f32": f32, "q4": q4, "base": base, "dir": d}


def load(path: Path, kv_type: str = "f16") -> llmedge.api.Model:
    return llmedge.load(str(path), backend="numpy", n_ctx=CTX, kv_type=kv_type)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def test_quantized_rows_keep_log_probs_within_half_a_step() -> None:
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((5, 301)) * 3).astype(np.float32)
    rows = kld.quantize_rows(logits)
    assert rows.shape == (5, kld.row_width(301)) == (5, 306)
    back, want = kld.dequantize_rows(rows, 301), log_softmax(logits)
    step, floor = np.ascontiguousarray(rows[:, :4]).view(np.float32).T
    kept = want >= floor[:, None]  # more than 16 nats below the top all become the floor
    assert 0 < kept.sum() < kept.size and np.all(back[~kept] == np.repeat(floor[:, None], 301, 1)[~kept])
    assert np.all(np.abs(back - want)[kept] <= step.repeat(301).reshape(5, 301)[kept] * 0.5 + 1e-5)


def test_base_file_round_trips_in_llama_perplexity_layout(tiny) -> None:
    m = load(tiny["f32"])
    base = kld.read_base(tiny["base"])
    ids = m.tokenizer.encode(TEXT, add_bos=True, special=False)
    n_chunk = len(ids) // CTX
    assert (base.n_ctx, base.n_vocab, base.n_chunk) == (CTX, m.tokenizer.n_vocab, n_chunk) and n_chunk >= 2
    assert base.tokens.tolist() == ids[: n_chunk * CTX]
    raw = tiny["base"].read_bytes()
    assert raw[:8] == b"_logits_" and len(raw) == 20 + 4 * n_chunk * CTX + 2 * n_chunk * 63 * kld.row_width(base.n_vocab)
    chunk = [m.tokenizer.bos_id] + ids[CTX + 1 : 2 * CTX]
    assert np.array_equal(base.rows[1], kld.quantize_rows(m.logits(chunk)[CTX // 2 : CTX - 1]))
    copy = tiny["dir"] / "copy.kld"
    kld.write_base(copy, base.n_ctx, base.n_vocab, base.tokens.tolist(), base.rows, base.n_chunk)
    assert copy.read_bytes() == raw


def test_model_against_itself_has_no_divergence_and_the_same_top_token(tiny) -> None:
    st = kld.statistics(kl_divergence(load(tiny["f32"]), tiny["base"], TEXT))
    assert st.count == 2 * 63 and st.same_top[0] == 1.0
    assert abs(st.kld[0]) < 1e-4 and st.kld_percentiles["Maximum"] < 5e-4
    assert abs(st.ln_ratio[0]) < 1e-4 and st.rms_p_diff[0] < 1e-4


def test_q4_0_statistics_equal_a_float64_recomputation(tiny) -> None:
    m, q = load(tiny["f32"]), load(tiny["q4"])
    st = kld.statistics(kl_divergence(q, tiny["base"], TEXT))
    ids = m.tokenizer.encode(TEXT, add_bos=True, special=False)
    per_kld, nll_q, nll_b, p_diff, same = [], [], [], [], 0
    for c in range(len(ids) // CTX):
        chunk = ids[c * CTX : (c + 1) * CTX]
        evaluated = [m.tokenizer.bos_id] + chunk[1:]
        lb = log_softmax(m.logits(evaluated)[CTX // 2 : CTX - 1])
        lq = log_softmax(q.logits(evaluated)[CTX // 2 : CTX - 1])
        t = np.asarray(chunk[CTX // 2 + 1 :])
        r = np.arange(len(t))
        per_kld.append((np.exp(lb) * (lb - lq)).sum(axis=1))
        nll_q.append(-lq[r, t])
        nll_b.append(-lb[r, t])
        p_diff.append(np.exp(lq[r, t]) - np.exp(lb[r, t]))
        same += int((lb.argmax(axis=1) == lq.argmax(axis=1)).sum())
    k, nq, nb, dp = (np.concatenate(x) for x in (per_kld, nll_q, nll_b, p_diff))
    assert st.count == len(k) == 2 * 63
    assert k.mean() > 1e-3  # Q4_0 does move the distribution: the comparison below is not of zeros
    assert st.kld[0] == pytest.approx(k.mean(), rel=2e-3, abs=2e-5)
    assert st.kld[1] == pytest.approx(k.std(ddof=0) / np.sqrt(len(k) - 1), rel=1e-2)
    for name, f in [("99.9%", 99.9), ("99.0%", 99), ("95.0%", 95), ("90.0%", 90), ("Median", 50), ("10.0%", 10),
                    ("5.0%", 5), ("1.0%", 1), ("0.1%", 0.1), ("Maximum", 100)]:
        assert st.kld_percentiles[name] == pytest.approx(np.percentile(k, f), rel=5e-3, abs=5e-5), name
    assert st.ln_ratio[0] == pytest.approx(nq.mean() - nb.mean(), abs=1e-4)
    assert st.ppl_ratio[0] == pytest.approx(np.exp(nq.mean() - nb.mean()), rel=1e-4)
    assert st.rms_p_diff[0] == pytest.approx(np.sqrt((dp**2).mean()), rel=1e-3, abs=1e-5)
    assert st.p_diff_percentiles["Median"] == pytest.approx(np.median(dp), abs=1e-4)
    assert abs(st.same_top[0] * len(k) - same) <= 1  # a near tie may round either way in 16 bits


def test_base_files_from_another_vocabulary_or_text_are_refused(tiny, monkeypatch) -> None:
    monkeypatch.setattr(tiny_gguf, "WORDS", [*tiny_gguf.WORDS, "▁sea"])
    other = tiny_gguf.write_tiny_llama(tiny["dir"] / "other-vocab.gguf", seed=3)
    with pytest.raises(LlmedgeError, match="vocabulary of 267 tokens; this model has 268"):
        kl_divergence(load(other), tiny["base"], TEXT)
    with pytest.raises(LlmedgeError, match="other tokens than this text gives"):
        kl_divergence(load(tiny["f32"]), tiny["base"], TEXT[1:])
    junk = tiny["dir"] / "junk.kld"
    junk.write_bytes(b"not a logits file at all")
    with pytest.raises(LlmedgeError, match="not a file of base log-probabilities"):
        kld.read_base(junk)
    cut = tiny["dir"] / "cut.kld"
    cut.write_bytes(tiny["base"].read_bytes()[:-10])
    with pytest.raises(LlmedgeError, match="truncated"):
        kld.read_base(cut)


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "LLMEDGE_MODELS": "/nonexistent-llmedge-store"}
    return subprocess.run([sys.executable, "-m", "llmedge.cli.main", "perplexity", *args], capture_output=True,
                          text=True, env=env, timeout=300, stdin=subprocess.DEVNULL)


def test_cli_saves_a_base_and_prints_llama_perplexity_statistics_with_a_kv_type(tiny) -> None:
    text = tiny["dir"] / "text.txt"
    text.write_text(TEXT, encoding="utf-8")
    base = tiny["dir"] / "cli-base.kld"
    p = cli(str(tiny["f32"]), "-f", str(text), "--ctx", str(CTX), "--kl-divergence-base", str(base),
            "--backend", "numpy")
    assert p.returncode == 0, p.stderr
    assert base.read_bytes() == tiny["base"].read_bytes()
    p = cli(str(tiny["q4"]), "--kl-divergence-base", str(base), "--kl-divergence", "--kv-type", "q8_0")
    assert p.returncode == 1 and "q8_0 KV cache needs head sizes" in p.stderr  # --kv-type reaches the engine
    p = cli(str(tiny["q4"]), "--kl-divergence-base", str(base), "--kl-divergence", "--kv-type", "f32",
            "--backend", "numpy")
    assert p.returncode == 0, p.stderr
    for line in ("Mean PPL(Q)/PPL(base)", "Mean ln(PPL(Q)/PPL(base))", "Mean    KLD:", "99.9%   KLD:",
                 " 0.1%   KLD:", "Maximum KLD:", "RMS Δp    :", "Same top p:", "Median  Δp:"):
        assert line in p.stdout, line
    p = cli(str(tiny["q4"]), "-f", str(text), "--kl-divergence")
    assert p.returncode == 1 and p.stderr.count("\n") == 1 and "--kl-divergence-base" in p.stderr
    text.write_text(TEXT[5:], encoding="utf-8")
    p = cli(str(tiny["q4"]), "-f", str(text), "--kl-divergence", "--kl-divergence-base", str(base))
    assert p.returncode == 1 and p.stdout == "" and p.stderr.count("\n") == 1 and "other tokens" in p.stderr


@pytest.mark.parametrize("ctx", [0, -5, 1, 2])
def test_a_chunk_size_that_scores_nothing_is_one_clear_error(tiny, ctx: int) -> None:
    """--ctx 0 or negative divided by zero (ZeroDivisionError) after loading the model; 2 indexed with a
    float. Now: ValueError naming n_ctx and the range, and in the CLI one line, exit 1, before loading."""
    m = load(tiny["f32"])
    for run in (lambda: perplexity(m, TEXT, ctx), lambda: save_kld_base(m, TEXT, tiny["dir"] / "x.kld", ctx)):
        with pytest.raises(ValueError, match=rf"n_ctx \(tokens per chunk\) must be an integer of at least 3, not {ctx}"):
            run()
    assert not (tiny["dir"] / "x.kld").exists()
    text = tiny["dir"] / "ctx.txt"
    text.write_text(TEXT, encoding="utf-8")
    p = cli(str(tiny["f32"]), "-f", str(text), f"--ctx={ctx}", "--backend", "numpy")
    assert p.returncode == 1 and p.stdout == "" and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr == f"Error: --ctx (tokens per chunk) must be an integer of at least 3, not {ctx}\n"


def test_an_interrupted_save_leaves_no_truncated_base_file(tiny) -> None:
    """The rows were written straight into the named file: Ctrl-C (or a failing chunk) part-way left a
    truncated file there, in place of a good earlier one. Now they go to a temporary file beside it
    that replaces it only once every chunk is written."""
    d = tiny["dir"] / "interrupted"
    d.mkdir()
    target = d / "base.kld"
    target.write_bytes(tiny["base"].read_bytes())

    def stop(i: int, n: int, ppl: float) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        save_kld_base(load(tiny["q4"]), TEXT, target, CTX, on_chunk=stop)
    assert target.read_bytes() == tiny["base"].read_bytes()
    assert os.listdir(d) == ["base.kld"]
    fresh = d / "fresh.kld"
    with pytest.raises(KeyboardInterrupt):
        save_kld_base(load(tiny["q4"]), TEXT, fresh, CTX, on_chunk=stop)
    assert os.listdir(d) == ["base.kld"]
    save_kld_base(load(tiny["q4"]), TEXT, fresh, CTX)
    assert sorted(os.listdir(d)) == ["base.kld", "fresh.kld"]
    assert kld.read_base(fresh).n_chunk >= 1 and (fresh.stat().st_mode & 0o777) == 0o666 & ~_umask()
    seen = []
    with pytest.raises(LlmedgeError, match="it is a directory"):  # before the first chunk, not after the last
        save_kld_base(load(tiny["q4"]), TEXT, d, CTX, on_chunk=lambda *a: seen.append(a))
    assert seen == [] and sorted(os.listdir(d)) == ["base.kld", "fresh.kld"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("ctx", [3, 5])
def test_the_smallest_chunk_sizes_score_and_round_trip_through_a_base_file(tiny, ctx: int) -> None:
    """--ctx 3 to 7 passed the chunk-size check (at least 3) and then failed at load ("a context needs
    at least 8 tokens"), and a base file saved with --ctx 3 was refused as an invalid header. A chunk
    now runs in a context of 8 cells, and every chunk size perplexity accepts reads back."""
    text = tiny["dir"] / f"small-{ctx}.txt"
    text.write_text(TEXT, encoding="utf-8")
    base = tiny["dir"] / f"small-{ctx}.kld"
    m = load(tiny["f32"])
    want = perplexity(m, TEXT, ctx)
    p = cli(str(tiny["f32"]), "-f", str(text), "--ctx", str(ctx), "--kl-divergence-base", str(base),
            "--backend", "numpy")
    assert p.returncode == 0, p.stderr
    plus_minus = "" if want.uncertainty is None else f" +/- {want.uncertainty:.5f}"
    assert f"Final estimate: PPL = {want.ppl:.4f}{plus_minus} ({want.n_chunks} chunks of {ctx}," in p.stdout
    assert kld.read_base(base).n_ctx == ctx
    p = cli(str(tiny["f32"]), "--kl-divergence-base", str(base), "--kl-divergence", "--backend", "numpy")
    assert p.returncode == 0, p.stderr
    assert "Same top p: 100.000 ± 0.000 %" in p.stdout


def test_chunks_limits_the_saved_base_and_the_comparison(tiny) -> None:
    """--chunks N (llama-perplexity's): a base file of the first N chunks, and a comparison over the first
    N chunks of a longer base file, both equal to what the API gives for them."""
    text = tiny["dir"] / "chunks.txt"
    text.write_text(TEXT, encoding="utf-8")
    whole = kld.read_base(tiny["base"])
    assert whole.n_chunk == 2
    base = tiny["dir"] / "one-chunk.kld"
    p = cli(str(tiny["f32"]), "-f", str(text), "--ctx", str(CTX), "--kl-divergence-base", str(base),
            "--chunks", "1", "--backend", "numpy")
    assert p.returncode == 0, p.stderr
    assert "(1 chunks of 128," in p.stdout and p.stderr.count("\n") == 1
    one = kld.read_base(base)
    assert one.n_chunk == 1 and np.array_equal(one.tokens, whole.tokens[:CTX])
    assert np.array_equal(np.asarray(one.rows[0]), np.asarray(whole.rows[0]))
    sums = kl_divergence(load(tiny["q4"]), tiny["base"], n_chunks=1)
    assert sums.count == one.n_scored
    p = cli(str(tiny["q4"]), "--kl-divergence-base", str(tiny["base"]), "--kl-divergence", "--chunks", "1",
            "--backend", "numpy")
    assert p.returncode == 0, p.stderr
    mine = [line for line in p.stdout.splitlines() if re.match(r"\s*\d+\s+\d+\.\d+ ±", line)]
    assert len(mine) == 1, p.stdout  # one chunk line
    assert kld.report(kld.statistics(sums)) in p.stdout
