"""Speculative decoding benchmark: decode rate with prompt lookup and with a draft model against plain
decoding, side by side in one process (rounds interleaved, caches cleared before every run, greedy).

    python benchmarks/speculative.py [--models smollm2:135m,gemma3:270m] [--tokens 150] [--rounds 3]
                                     [--draft] [--draft-target-type q8_0]

Prompt lookup runs on copy-heavy tasks (repeat a paragraph with one word changed, add a docstring to
a function). With ``--draft`` the target is the same model requantized to Q8_0 (or F16) at bench
time (``llmedge quantize --allow-requantize``, cached in the system temp folder) and the shipped
quantized file is the draft. Each line gives the best decode rate (Ollama's eval rate) of the
rounds, the ratio to plain decoding, the acceptance rate and the tokens per decode forward; it
checks that every speculative text equals the plain one (the speed-up is worth nothing otherwise).
The machine is shared: compare the ratios, not the absolute rates.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import llmedge
from llmedge.bench import SPEC_PROMPTS

PROMPTS = {
    **SPEC_PROMPTS,
    "open (no copying)": "Write a short story about a robot who learns to paint.",
}


def run(m: llmedge.Model, prompt: str, tokens: int, **opts) -> tuple[float, str, dict, int]:
    m.engine.cache.clear()
    m.engine.prefix_cache.clear()
    text = "".join(c.text for c in m.generate(prompt, max_tokens=tokens, temperature=0, **opts))
    t = m.timings
    return t.eval_count / (t.eval_duration / 1e9), text, dict(t.extra), t.eval_count


def requantized(path: Path, ggml_type: str) -> Path:
    out = Path(tempfile.gettempdir()) / f"llmedge-bench-{path.stem}-{ggml_type}.gguf"
    if not out.exists():
        subprocess.run([str(Path(sys.executable).parent / "llmedge"), "quantize", "--allow-requantize", str(path),
                        str(out), ggml_type.upper()], check=True, stdout=subprocess.DEVNULL)
    return out


def bench(name: str, target: llmedge.Model, rounds: int, tokens: int, variants: dict[str, dict]) -> bool:
    ok = True
    for pname, prompt in PROMPTS.items():
        best: dict[str, tuple[float, str, dict, int]] = {}
        for _ in range(rounds):
            for label, opts in variants.items():
                r = run(target, prompt, tokens, **opts)
                if label not in best or r[0] > best[label][0]:
                    best[label] = r
        base = best["plain"]
        print(f"{name:28s} {pname:18s} plain            {base[0]:7.1f} tok/s")
        for label in variants:
            if label == "plain":
                continue
            rate, text, extra, n = best[label]
            same = text == base[1]
            ok &= same
            per_fwd = n / max(1, extra.get("decode_forwards", n))
            print(f"{name:28s} {pname:18s} {label:16s} {rate:7.1f} tok/s  x{rate / base[0]:.2f}  "
                  f"accepted {extra.get('draft_accepted', 0)}/{extra.get('draft_tokens', 0)} "
                  f"({100 * extra.get('draft_acceptance', 0):.0f}%)  {per_fwd:.2f} tokens/forward  "
                  f"{'same text' if same else 'TEXT DIFFERS'}")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="smollm2:135m,gemma3:270m")
    ap.add_argument("--tokens", type=int, default=150)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--draft", action="store_true", help="also a requantized target with the shipped file as draft")
    ap.add_argument("--draft-target-type", default="q8_0")
    ap.add_argument("--ctx", type=int, default=2048)
    a = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}")
    ok = True
    for name in a.models.split(","):
        m = llmedge.load(name, n_ctx=a.ctx)
        ok &= bench(name, m, a.rounds, a.tokens, {"plain": {}, "lookup=3": {"lookup": 3}})
        if a.draft:
            target = llmedge.Model(requantized(m.path, a.draft_target_type), n_ctx=a.ctx)
            label = f"{name} {a.draft_target_type} target"
            ok &= bench(label, target, a.rounds, a.tokens,
                        {"plain": {}, "draft": {"draft_model": m}, "draft+lookup": {"draft_model": m, "lookup": 3}})
    print(f"load average {os.getloadavg()[0]:.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
