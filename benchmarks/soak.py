"""A bounded loopback soak of `llmedge serve`: N clients for T seconds sending a mix of Ollama and OpenAI
requests (generate, chat, embed, JSON-schema chat, OpenAI chat and streams cancelled after the first
line) to a server with a small queue, so some requests are refused with 503 + Retry-After and retried.

Checked: no 5xx other than those 503s, every 503 carries Retry-After and its request is served on a
retry (none lost), every generate answer belongs to its own request (its returned `context` starts
with the request's own prompt tokens: nothing swapped or duplicated), and the server's RSS after
warm-up stays flat. Reported: requests, errors, 503s, RSS start/end, latency p50/p99 per kind.

    python benchmarks/soak.py                              # 8 clients, 60 s, a tiny random model
    python benchmarks/soak.py --clients 8 --seconds 600    # the long run
    python benchmarks/soak.py --model smollm2:135m         # a real model from the store

The server listens on 127.0.0.1 only; the whole run is bounded by --seconds plus a short drain.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
WORDS = ["hello", "the", "a", "b", "world", "model", "soak", "test"]
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


@dataclass
class Results:
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    ok: int = 0
    refused_503: int = 0
    missing_retry_after: int = 0
    errors: list[str] = field(default_factory=list)
    mismatched: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def error(self, text: str) -> None:
        with self.lock:
            self.errors.append(text[:300])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def tiny_store(root: Path) -> tuple[Path, str]:
    """A store holding the tests' tiny random-weight llama (tests/malformed/gguf_bytes.py)."""
    sys.path.insert(0, str(ROOT / "tests" / "malformed"))
    from gguf_bytes import tiny_model

    from llmedge.store import Store

    path = tiny_model().write(root / "tiny.gguf")
    Store(root / "store").create("tiny:latest", path)
    return root / "store", "tiny:latest"


class Server:
    """`llmedge serve` as a subprocess on a free loopback port."""

    def __init__(self, models: Path, parallel: int, max_queue: int, backend: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "LLMEDGE_MODELS": str(models), "LLMEDGE_HOST": f"127.0.0.1:{self.port}"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "llmedge.cli.main", "serve", "--parallel", str(parallel), "--max-queue",
             str(max_queue), "--backend", backend], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + 60
        while True:
            try:
                if httpx.get(self.url + "/", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"the server did not start: {self.proc.stderr.read().decode()[-2000:]}")
            time.sleep(0.1)

    def stop(self) -> str:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.proc.stderr.read().decode(errors="replace")


def _request(kind: str, model: str, rng: random.Random) -> tuple[str, dict[str, Any], list[str]]:
    words = [rng.choice(WORDS) for _ in range(rng.randint(1, 12))]
    prompt = " ".join(words)
    opts = {"num_predict": rng.randint(1, 8), "temperature": 0.7, "seed": rng.randint(0, 1000)}
    msgs = [{"role": "user", "content": prompt}]
    if kind == "generate":
        return "/api/generate", {"model": model, "prompt": prompt, "raw": True, "stream": False,
                                 "options": opts}, words
    if kind == "chat":
        return "/api/chat", {"model": model, "messages": msgs, "stream": False, "options": opts}, words
    if kind == "embed":
        return "/api/embed", {"model": model, "input": [prompt, prompt + " b"]}, words
    if kind == "schema":
        return "/api/chat", {"model": model, "messages": msgs, "stream": False, "format": SCHEMA,
                             "options": {**opts, "num_predict": 24}}, words
    if kind == "openai":
        return "/v1/chat/completions", {"model": model, "messages": msgs, "max_tokens": opts["num_predict"]}, words
    return "/api/generate", {"model": model, "prompt": prompt, "raw": True, "stream": True,
                             "options": {**opts, "num_predict": 64}}, words  # "cancel"


KINDS = ["generate", "chat", "embed", "schema", "openai", "cancel"]


def _check(kind: str, r: httpx.Response, body: dict[str, Any], tokenize: Any, res: Results) -> None:
    j = r.json()
    if kind == "generate":
        want = tokenize(body["prompt"])
        if j.get("context", [])[: len(want)] != want:
            with res.lock:
                res.mismatched += 1
    elif kind == "embed" and len(j.get("embeddings", [])) != 2:
        res.error(f"embed: {r.text}")
    elif kind in ("chat", "schema") and "message" not in j:
        res.error(f"{kind}: {r.text}")
    elif kind == "schema" and j.get("done_reason") == "stop":
        json.loads(j["message"]["content"])  # a complete answer parses
    elif kind == "openai" and not j.get("choices"):
        res.error(f"openai: {r.text}")


def _one(client: httpx.Client, url: str, kind: str, model: str, rng: random.Random, tokenize: Any,
         res: Results, stop_at: float) -> None:
    path, body, _ = _request(kind, model, rng)
    t0 = time.perf_counter()
    while True:
        if kind == "cancel":
            with client.stream("POST", url + path, json=body) as r:
                status = r.status_code
                if status == 200:
                    next(r.iter_lines())  # the first token, then the client goes away
                else:
                    r.read()
        else:
            r = client.post(url + path, json=body)
            status = r.status_code
        if status != 503:
            break
        with res.lock:
            res.refused_503 += 1
            if "retry-after" not in r.headers:
                res.missing_retry_after += 1
        if time.monotonic() > stop_at + 60:
            res.error(f"{kind}: still refused 60 s after the end")
            return
        time.sleep(min(float(r.headers.get("retry-after", 1)), 2.0) * rng.uniform(0.1, 0.5))
    if status != 200:
        res.error(f"{kind}: HTTP {status}: {r.text if kind != 'cancel' else ''}")
        return
    if kind != "cancel":
        _check(kind, r, body, tokenize, res)
    with res.lock:
        res.ok += 1
        res.latencies[kind].append(time.perf_counter() - t0)


def _client(url: str, model: str, seed: int, tokenize: Any, res: Results, stop_at: float) -> None:
    rng = random.Random(seed)
    with httpx.Client(timeout=120) as client:
        while time.monotonic() < stop_at:
            kind = rng.choice(KINDS)
            try:
                _one(client, url, kind, model, rng, tokenize, res, stop_at)
            except Exception as e:  # noqa: BLE001 - a lost request is the finding
                res.error(f"{kind}: {type(e).__name__}: {e}")


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def run(clients: int = 8, seconds: float = 60.0, model: str | None = None, parallel: int = 2,
        max_queue: int = 2, backend: str = "numpy", warmup: float | None = None) -> dict[str, Any]:
    """Run the soak; returns the figures (see the module docstring)."""
    with tempfile.TemporaryDirectory(prefix="llmedge-soak-") as tmp:
        if model is None:
            models, model = tiny_store(Path(tmp))
        else:
            from llmedge.store import Store

            models = Store().root
        from llmedge.gguf import GGUFFile
        from llmedge.store import Store
        from llmedge.tokenizer import Tokenizer

        tok = Tokenizer.from_metadata(GGUFFile(Store(models).resolve(model)).metadata)

        def tokenize(text: str) -> list[int]:
            return tok.encode(text, add_bos=True, special=True)

        server = Server(models, parallel, max_queue, backend)
        res = Results()
        try:
            warm = min(10.0, seconds / 5) if warmup is None else warmup
            stop_at = time.monotonic() + seconds
            threads = [threading.Thread(target=_client, args=(server.url, model, i, tokenize, res, stop_at))
                       for i in range(clients)]
            for t in threads:
                t.start()
            time.sleep(warm)
            rss_start = rss_kb(server.proc.pid)
            samples = []
            while any(t.is_alive() for t in threads):
                samples.append(rss_kb(server.proc.pid))
                time.sleep(0.5)
            for t in threads:
                t.join()
            rss_end = rss_kb(server.proc.pid)
            health = httpx.get(server.url + "/health", timeout=10).json()
            metrics = httpx.get(server.url + "/metrics", timeout=10).text
        finally:
            log = server.stop()
    lat = [x for xs in res.latencies.values() for x in xs]
    return {
        "clients": clients, "seconds": seconds, "model": model, "requests_ok": res.ok,
        "by_kind": {k: len(v) for k, v in sorted(res.latencies.items())},
        "errors": len(res.errors), "error_samples": res.errors[:5], "refused_503": res.refused_503,
        "missing_retry_after": res.missing_retry_after, "mismatched_answers": res.mismatched,
        "rss_start_mb": round(rss_start / 1024, 1), "rss_end_mb": round(rss_end / 1024, 1),
        "rss_max_mb": round(max(samples or [rss_end]) / 1024, 1),
        "rss_growth": round((rss_end - rss_start) / max(rss_start, 1), 4),
        "p50_s": round(percentile(lat, 0.5), 4), "p99_s": round(percentile(lat, 0.99), 4),
        "p99_by_kind_s": {k: round(percentile(v, 0.99), 4) for k, v in sorted(res.latencies.items())},
        "idle_after": health.get("busy") == 0 and health.get("queue") == 0,
        "server_5xx": sum(int(float(line.split()[-1])) for line in metrics.splitlines()
                          if line.startswith("llmedge_requests_total") and 'status="5' in line
                          and 'status="503"' not in line),
        "server_503": sum(int(float(line.split()[-1])) for line in metrics.splitlines()
                          if line.startswith("llmedge_requests_total") and 'status="503"' in line),
        "traceback_in_log": "Traceback" in log,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--model", default=None, help="a store name (default: a tiny random model)")
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--max-queue", type=int, default=2)
    ap.add_argument("--backend", default="numpy")
    a = ap.parse_args()
    r = run(a.clients, a.seconds, a.model, a.parallel, a.max_queue, a.backend)
    print(json.dumps(r, indent=2))
    bad = r["errors"] or r["missing_retry_after"] or r["mismatched_answers"] or r["server_5xx"] or \
        r["traceback_in_log"] or not r["idle_after"] or r["rss_growth"] > 0.05
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
