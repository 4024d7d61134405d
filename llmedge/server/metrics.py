"""Server metrics in Prometheus' text exposition format: requests by route and status, tokens in and
out, decode and prefill rates, queue depth, busy sequence slots, batched engine steps and loaded models."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

ROUTES = ("/api/generate", "/api/chat", "/api/embed", "/api/embeddings", "/api/tags", "/api/show", "/api/pull",
          "/api/ps", "/api/delete", "/api/copy", "/api/version", "/v1/chat/completions", "/v1/completions",
          "/v1/models", "/v1/embeddings", "/metrics", "/health", "/")


class Metrics:
    """Request counters fed by the security middleware; token counters live in the scheduler."""

    def __init__(self) -> None:
        self.requests: Counter[tuple[str, int]] = Counter()
        self.lock = threading.Lock()

    def on_response(self, path: str, status: int) -> None:
        route = path if path in ROUTES else ("/v1/models/{model}" if path.startswith("/v1/models/") else "other")
        with self.lock:
            self.requests[(route, status)] += 1

    def render(self, scheduler: Any) -> str:
        s = scheduler.stats
        lines = [
            "# HELP llmedge_requests_total HTTP requests answered, by route and status.",
            "# TYPE llmedge_requests_total counter",
        ]
        with self.lock:
            for (route, status), n in sorted(self.requests.items()):
                lines.append(f'llmedge_requests_total{{route="{route}",status="{status}"}} {n}')
        eval_s = s["eval_ns"] / 1e9
        prompt_s = s["prompt_ns"] / 1e9
        gauges = [
            ("llmedge_prompt_tokens_total", "counter", "Prompt tokens evaluated.", s["prompt_tokens"]),
            ("llmedge_generated_tokens_total", "counter", "Tokens generated.", s["generated_tokens"]),
            ("llmedge_decode_tokens_per_second", "gauge", "Mean decode rate over all generations.",
             s["generated_tokens"] / eval_s if eval_s > 0 else 0.0),
            ("llmedge_prefill_tokens_per_second", "gauge", "Mean prompt evaluation rate.",
             s["prompt_tokens"] / prompt_s if prompt_s > 0 else 0.0),
            ("llmedge_queue_depth", "gauge", "Requests waiting for the engine.", scheduler.queue_depth),
            ("llmedge_busy_slots", "gauge", "Sequence slots in use (and a running non-generation job).",
             scheduler.busy),
            ("llmedge_slots", "gauge", "Sequence slots per model (--parallel).", scheduler.parallel),
            ("llmedge_engine_steps_total", "counter", "Batched forward steps run by the engine.", scheduler.steps),
            ("llmedge_engine_sequence_steps_total", "counter", "Sequences advanced by those steps (the batch "
             "sizes summed).", scheduler.sequence_steps),
            ("llmedge_rejected_total", "counter", "Requests refused with 503 (queue full).", s["rejected"]),
            ("llmedge_cancelled_total", "counter", "Jobs stopped because the client went away.",
             s["cancelled"]),
            ("llmedge_loaded_models", "gauge", "Models in memory.", len(scheduler.loaded)),
            ("llmedge_draft_tokens_total", "counter", "Speculative draft tokens verified.", s.get("draft_tokens", 0)),
            ("llmedge_draft_accepted_total", "counter", "Speculative draft tokens accepted.",
             s.get("draft_accepted", 0)),
        ]
        for name, kind, help_, value in gauges:
            lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name} {value:g}"]
        return "\n".join(lines) + "\n"
