"""Prefix reuse: time to first token of a chat turn that extends a cached conversation.

    python benchmarks/prefix_reuse.py [--model smollm2:135m] [--backend auto] [--history 1500]
                                      [--ctx 4096] [--kv-type f16] [--repeats 3]

A conversation whose history is about ``--history`` tokens (user turns cut from a fixture text,
short assistant answers) is asked a question on a cold cache (turn 1), then the answer is appended
with a follow-up question (turn 2: only the new suffix is evaluated). Then an unrelated request runs
in between and the conversation comes back (turn 3: its cache is restored from the prefix LRU).
Reported per turn: tokens in the prompt, tokens evaluated, time to first token; and the ratios to
turn 1 (issue 6 accepts turn 2 at no more than 0.15x). The KV memory of the sequence and of the
prefix LRU is printed at the end. Times are medians over ``--repeats`` fresh models.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import llmedge

TEXT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "texts" / "gpl3_30k.txt"


def history(m: llmedge.Model, n_tokens: int) -> list[dict[str, str]]:
    """System prompt plus user/assistant exchanges totalling about ``n_tokens`` tokens."""
    text = TEXT.read_text(encoding="utf-8")
    messages = [{"role": "system", "content": "You are a patient assistant who explains licences."}]
    at = 0
    while len(m.template.encode(messages)) < n_tokens - 60:
        piece = text[at : at + 600]
        at += 600
        messages.append({"role": "user", "content": f"What does this part say?\n{piece}"})
        messages.append({"role": "assistant", "content": "It sets out the terms for copying and changing the work."})
    return messages


def first_token(m: llmedge.Model, messages: list[dict[str, str]]) -> tuple[float, int, int, str]:
    """Seconds to the first chunk, prompt tokens, tokens evaluated, and the (short) answer."""
    n_prompt = len(m.template.encode(messages))
    t0 = time.perf_counter()
    it = m.chat(messages, max_tokens=16, temperature=0)
    chunks = [next(it)]
    ttft = time.perf_counter() - t0
    chunks.extend(it)
    return ttft, n_prompt, m.timings.prompt_eval_count, "".join(c.text for c in chunks)


def run_once(args: argparse.Namespace) -> list[tuple[str, float, int, int]]:
    m = llmedge.load(args.model, backend=args.backend, n_ctx=args.ctx, kv_type=args.kv_type)
    conv = history(m, args.history)
    rows = []
    conv.append({"role": "user", "content": "Summarise all of that in one sentence."})
    ttft, n_prompt, n_eval, answer = first_token(m, conv)
    rows.append(("turn 1 (cold)", ttft, n_prompt, n_eval))
    conv += [{"role": "assistant", "content": answer}, {"role": "user", "content": "And who does it protect?"}]
    ttft, n_prompt, n_eval, answer = first_token(m, conv)
    rows.append(("turn 2 (extends the cache)", ttft, n_prompt, n_eval))
    first_token(m, [{"role": "user", "content": "Unrelated: name a colour."}])
    conv += [{"role": "assistant", "content": answer}, {"role": "user", "content": "Thanks. Anything else?"}]
    ttft, n_prompt, n_eval, _ = first_token(m, conv)
    rows.append(("turn 3 (back from the LRU)", ttft, n_prompt, n_eval))
    run_once.info = m.cache_info()  # type: ignore[attr-defined]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2:135m")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--history", type=int, default=1500, help="tokens of conversation before turn 1's question")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--kv-type", default="f16", choices=("f16", "f32", "q8_0"))
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    runs = [run_once(args) for _ in range(args.repeats)]
    names = [r[0] for r in runs[0]]
    med = [statistics.median(run[i][1] for run in runs) for i in range(len(names))]
    print(f"model {args.model}, backend {args.backend}, n_ctx {args.ctx}, kv {args.kv_type}, "
          f"median of {args.repeats}")
    print(f"{'':30} {'prompt':>7} {'evaluated':>9} {'TTFT s':>8} {'x turn 1':>9}")
    for i, name in enumerate(names):
        _, _, n_prompt, n_eval = runs[-1][i]
        print(f"{name:30} {n_prompt:>7} {n_eval:>9} {med[i]:>8.3f} {med[i] / med[0]:>9.3f}")
    info: dict[str, Any] = run_once.info  # type: ignore[attr-defined]
    print(f"KV cache: {info['sequence_bytes'] / 2**20:.1f} MiB per sequence ({info['kv_type']}, "
          f"{info['layers_full']} full + {info['layers_ring']} ring layers); prefix LRU "
          f"{info['prefix_cache_entries']} entries, {info['prefix_cache_bytes'] / 2**20:.1f} MiB "
          f"of {info['prefix_cache_budget'] / 2**20:.0f} MiB")
    ratio = med[1] / med[0]
    print(f"turn 2 / turn 1 TTFT = {ratio:.3f} ({'meets' if ratio <= 0.15 else 'misses'} the 0.15 target)")


if __name__ == "__main__":
    main()
