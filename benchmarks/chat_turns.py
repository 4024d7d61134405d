"""Chat turn latency: how soon the second turn of a conversation starts answering (prefix reuse).

    python benchmarks/chat_turns.py [--model smollm2:135m] [--history 1000] [--repeats 3]

A conversation of about ``--history`` tokens (fixed user/assistant exchanges) gets a first turn on a
cold cache, then a second turn, through the chat of ``llmedge run`` (:class:`ChatSession`, greedy,
32 tokens per answer). Reported: the first turn's prompt time (tokens evaluated and duration), the
second turn's time to its first token, and their ratio; the acceptance of issue 8 is a ratio of at
most 0.15. Then the conversation is saved with ``/save`` and loaded into a fresh model with
``/load`` (KV state restored), and once more with the state file removed (history re-evaluated),
and the time to the first token of the turn after each load is reported.
"""

from __future__ import annotations

import argparse
import io
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console

import llmedge
from llmedge.cli.chat import ChatSession

TOPICS = ["rivers", "mountains", "bread", "bicycles", "libraries", "tides", "bees", "glass", "maps", "tea",
          "clocks", "bridges", "snow", "violins", "lighthouses", "paper", "owls", "salt", "kites", "caves"]


def _history(model: Any, n_tokens: int) -> list[dict[str, str]]:
    """Fixed exchanges until the rendered conversation reaches ``n_tokens`` tokens."""
    messages: list[dict[str, str]] = []
    i = 0
    while len(model.template.encode(messages or [{"role": "user", "content": ""}])) < n_tokens:
        topic = TOPICS[i % len(TOPICS)]
        messages.append({"role": "user", "content": f"Tell me two facts about {topic}."})
        messages.append({"role": "assistant", "content": (
            f"First, {topic} have been studied for centuries and appear in stories from many countries. "
            f"Second, people still find new ways to use and enjoy {topic} in everyday life.")})
        i += 1
    return messages


class _Clock:
    """Wraps a model's ``generate`` to time the first streamed chunk of each call."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.first: float = 0.0
        self._generate = model.generate
        model.generate = self.generate

    def generate(self, *args: Any, **kwargs: Any):
        t0 = time.perf_counter()
        stream = self._generate(*args, **kwargs)
        first = True
        for chunk in stream:
            if first:
                self.first = time.perf_counter() - t0
                first = False
            yield chunk


def _session(model: Any, sessions: Path) -> ChatSession:
    out = io.StringIO()
    s = ChatSession(model, Console(file=out, width=100, color_system=None), sessions=sessions, out=out)
    s.handle("/set parameter temperature 0")
    s.handle("/set parameter num_predict 32")
    return s


def _cold(model: Any) -> None:
    model.engine.cache.clear()
    prefix = getattr(model.engine, "prefix_cache", None)
    if prefix is not None:
        prefix.clear()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2:135m")
    ap.add_argument("--history", type=int, default=1000, help="tokens of conversation before turn 1")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()

    m = llmedge.load(args.model, n_ctx=args.ctx, n_threads=args.threads)
    clock = _Clock(m)
    history = _history(m, args.history)
    print(f"model {args.model} ({m.backend_name}), history {len(history)} messages")

    tmp = Path(tempfile.mkdtemp(prefix="llmedge-chat-bench-"))
    warm = _session(m, tmp)
    warm.ask("Hi")  # first-call overheads out of the way

    first_prompt, second_ttft, rows = [], [], []
    for _ in range(args.repeats):
        _cold(m)
        s = _session(m, tmp)
        s.messages = [dict(x) for x in history]
        s.ask("Now tell me one fact about the sea.")
        t1 = m.timings
        first_prompt.append(t1.prompt_eval_duration / 1e9)
        s.ask("And one about the moon.")
        t2 = m.timings
        second_ttft.append(clock.first)
        rows.append((t1.prompt_eval_count, t1.prompt_eval_duration / 1e9, clock.first, t2.prompt_eval_count))
    for n1, d1, ttft2, n2 in rows:
        print(f"  turn 1: {n1} tokens evaluated in {d1:.3f}s | turn 2: {n2} tokens evaluated, "
              f"first token after {ttft2:.3f}s (ratio {ttft2 / d1:.3f})")
    p1, f2 = statistics.median(first_prompt), statistics.median(second_ttft)
    ratio = f2 / p1
    print(f"median: turn 1 prompt {p1:.3f}s, turn 2 first token {f2:.3f}s, ratio {ratio:.3f} "
          f"({'meets' if ratio <= 0.15 else 'MISSES'} the 0.15 target)")

    # /save, then /load into a fresh model: with the KV state, and with the history re-evaluated.
    s.handle("/save bench")
    for label, drop_state in (("KV state restored", False), ("history re-evaluated", True)):
        if drop_state:
            (tmp / "bench.state").unlink(missing_ok=True)
        fresh = llmedge.load(args.model, n_ctx=args.ctx, n_threads=args.threads)
        fclock = _Clock(fresh)
        s2 = _session(fresh, tmp)
        t0 = time.perf_counter()
        s2.handle("/load bench")
        t_load = time.perf_counter() - t0
        s2.ask("One more fact about the stars.")
        print(f"/load ({label}): {t_load:.3f}s; next turn: {fresh.timings.prompt_eval_count} tokens "
              f"evaluated, first token after {fclock.first:.3f}s")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
