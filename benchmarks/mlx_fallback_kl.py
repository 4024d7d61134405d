"""How each choice for the GGML types MLX cannot hold exactly (Q6_K) moves the logits, and its speed.

For every choice (re-quantized to MLX 8-bit codes, or dequantized to f16, bf16, f32), gemma3:270m
(whose ffn_down tensors are Q6_K) runs the first N tokens of the perplexity text on the mlx backend;
the KL divergence is measured against the exact f32 choice, and the decode time per token reported.

    python benchmarks/mlx_fallback_kl.py [N]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

import llmedge
from llmedge.backends import mlx_quant
from llmedge.quant import GGMLQuantizationType as T

TEXT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "texts" / "gpl3_30k.txt"


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def run(how: str, ids: list[int]) -> tuple[np.ndarray, float]:
    mlx_quant.REQUANTIZED[T.Q6_K] = how
    m = llmedge.load("gemma3:270m", backend="mlx", n_ctx=512)
    lp = log_softmax(m.logits(ids))
    t0 = time.perf_counter()
    n = len(list(m.generate(ids[:8], temperature=0, max_tokens=8)))
    return lp, (time.perf_counter() - t0) / n


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    ids = llmedge.load("gemma3:270m", backend="numpy", n_ctx=512).tokenize(TEXT.read_text()[:4000], add_bos=True)[:n]
    ref, t_ref = run("f32", ids)
    print(f"f32 (exact): decode {t_ref * 1e3:.0f} ms/token")
    for how in ("q8", "f16", "bf16"):
        lp, t = run(how, ids)
        kl = (np.exp(ref) * (ref - lp)).sum(axis=-1)
        flips = int((lp.argmax(-1) != ref.argmax(-1)).sum())
        print(f"{how}: KL mean {kl.mean():.2e} max {kl.max():.2e}, top-1 changes {flips}/{len(ids)}, "
              f"decode {t * 1e3:.0f} ms/token ({t / t_ref:.2f}x f32)")


if __name__ == "__main__":
    main()
