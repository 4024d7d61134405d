"""KL divergence of a quantized model, llmedge's figures against llama.cpp's logits.

Run with llama-cpp-python's interpreter (it has no llama-perplexity binding, so llama.cpp's logits go
through llmedge's statistics code, which follows llama-perplexity's):

    PYTHONPATH=. /work/lcpp-venv/bin/python benchmarks/kld_vs_llamacpp.py BASE.gguf QUANT.gguf TEXT [--ctx 256]

Prints the mean KLD, ln(PPL(Q)/PPL(base)) and same-top of (a) llama.cpp's quantized model against
llama.cpp's base logits and (b) the same pair evaluated by llmedge, with the relative difference.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from llmedge import kld


def llama_logits(path: str, n_ctx: int):
    import llama_cpp

    llm = llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_batch=n_ctx, logits_all=True, verbose=False)
    add_bos, bos = llm._model.add_bos_token(), llm.token_bos()

    def chunk_logits(chunk: list[int]) -> np.ndarray:
        if add_bos:
            chunk = [bos] + chunk[1:]
        llm.reset()
        llm.eval(chunk)
        return np.array(llm.scores[n_ctx // 2 : n_ctx - 1], np.float32)

    return chunk_logits


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("quant")
    ap.add_argument("text")
    ap.add_argument("--ctx", type=int, default=256)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        ours_base = Path(d) / "llmedge.kld"
        cmd = [str(Path(__file__).resolve().parents[1] / ".venv" / "bin" / "llmedge"), "perplexity"]
        subprocess.run([*cmd, a.base, "-f", a.text, "--ctx", str(a.ctx), "--kl-divergence-base", str(ours_base)],
                       check=True, capture_output=True)
        base = kld.read_base(ours_base)  # same tokens for both sides: llmedge's tokenization of the text
        theirs_base = Path(d) / "llamacpp.kld"
        f = llama_logits(a.base, a.ctx)
        rows = [kld.quantize_rows(f([int(t) for t in base.tokens[c * a.ctx : (c + 1) * a.ctx]]))
                for c in range(base.n_chunk)]
        kld.write_base(theirs_base, a.ctx, base.n_vocab, base.tokens.tolist(), rows, base.n_chunk)
        theirs = kld.statistics(kld.compare(kld.read_base(theirs_base), llama_logits(a.quant, a.ctx)))
        out = subprocess.run([*cmd, a.quant, "--kl-divergence", "--kl-divergence-base", str(ours_base)],
                             check=True, capture_output=True, text=True).stdout
    got = {line.split(":")[0].strip(): float(line.split(":")[1].split("±")[0].strip().rstrip("%"))
           for line in out.splitlines() if line.startswith(("Mean    KLD", "Mean ln(PPL", "Same top p"))}
    rows_out = [("Mean KLD", theirs.kld[0], got["Mean    KLD"]),
                ("ln(PPL(Q)/PPL(base))", theirs.ln_ratio[0], got["Mean ln(PPL(Q)/PPL(base))"]),
                ("Same top p %", 100 * theirs.same_top[0], got["Same top p"])]
    print(f"{'':24}{'llama.cpp':>12}{'llmedge':>12}{'rel diff':>10}")
    for name, t, o in rows_out:
        print(f"{name:24}{t:12.6f}{o:12.6f}{(o - t) / t if t else 0.0:10.2%}")


if __name__ == "__main__":
    sys.exit(main())
