"""Loaded models, keep-alive, the bounded request queue and the one engine worker thread.

Every request that touches a model (generation, embeddings, loading, unloading) becomes a
:class:`Job` run by a single worker thread, one job at a time: the engine drives one sequence at a
time today, so generations are serialized in arrival order. ``parallel`` is the number of admitted
requests beyond which further ones wait in the queue; at most ``max_queue`` wait, the next one is
refused with 503. A job streams its items to the asyncio side through a thread-safe hand-off; a
client that disconnects sets ``cancelled`` and the worker drops the job before its next token.
Continuous batching (one forward over every active sequence) needs multi-sequence support in the
engine and is not done here.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmedge.errors import LlmedgeError, StoreError
from llmedge.server.security import HTTPError

DEFAULT_KEEP_ALIVE = 300.0
DEFAULT_NUM_CTX = 4096
DEFAULT_MAX_CTX = 131072


class Cancelled(Exception):
    """The client went away; the job stopped early."""


@dataclass
class Loaded:
    """A model in memory and when it expires (``None``: never)."""

    name: str
    model: Any
    path: Path
    num_ctx: int
    size: int
    digest: str
    expires_at: float | None = None
    last_used: float = field(default_factory=time.time)


class Job:
    """One unit of work for the engine worker, with a stream of ``(kind, payload)`` items back to the
    event loop: ``("item", x)`` any number of times, then ``("done", result)`` or ``("error", exc)``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, work: Callable[[Job, Loaded | None], Any],
                 name: str | None = None, path: Path | None = None, num_ctx: int | None = None,
                 keep_alive: float | None | str = "default") -> None:
        self.loop = loop
        self.work = work
        self.name = name
        self.path = path
        self.num_ctx = num_ctx
        self.keep_alive = keep_alive
        self.cancelled = threading.Event()
        self.items: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.t_arrival = time.perf_counter_ns()
        self.load_duration = 0
        self.started = False

    def emit(self, item: Any) -> None:
        self._put(("item", item))

    def _put(self, pair: tuple[str, Any]) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed during shutdown
            self.loop.call_soon_threadsafe(self.items.put_nowait, pair)

    async def next(self) -> tuple[str, Any]:
        return await self.items.get()

    def check(self) -> None:
        if self.cancelled.is_set():
            raise Cancelled()


class Scheduler:
    """Owns the loaded models and the worker thread that runs every model job in order."""

    def __init__(self, parallel: int = 4, max_queue: int = 64, keep_alive: float | None = DEFAULT_KEEP_ALIVE,
                 num_ctx: int = DEFAULT_NUM_CTX, max_ctx: int = DEFAULT_MAX_CTX, max_loaded: int = 2,
                 backend: str = "auto", n_threads: int | None = None) -> None:
        self.parallel = max(1, parallel)
        self.max_queue = max(0, max_queue)
        self.keep_alive = keep_alive
        self.num_ctx = num_ctx
        self.max_ctx = max_ctx
        self.max_loaded = max(1, max_loaded)
        self.backend = backend
        self.n_threads = n_threads
        self.loaded: dict[str, Loaded] = {}
        self.lock = threading.Lock()
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self.pending = 0  # admitted and not finished (running + queued)
        self.busy = 0
        self.current: Job | None = None
        self.stats = {"prompt_tokens": 0, "generated_tokens": 0, "eval_ns": 0, "prompt_ns": 0,
                      "jobs": 0, "rejected": 0, "cancelled": 0}
        self._thread = threading.Thread(target=self._run, name="llmedge-engine", daemon=True)
        self._stopping = False
        self._thread.start()

    # -- admission -------------------------------------------------------------------------------
    @property
    def queue_depth(self) -> int:
        return max(0, self.pending - self.busy)

    def submit(self, job: Job) -> Job:
        """Queue ``job``; HTTPError 503 when the slots and the queue are full or the server is stopping."""
        with self.lock:
            if self._stopping:
                raise HTTPError(503, "the server is shutting down")
            if self.pending >= self.parallel + self.max_queue:
                self.stats["rejected"] += 1
                raise HTTPError(503, f"server busy: {self.pending} requests in progress or queued "
                                     f"(LLMEDGE_MAX_QUEUE={self.max_queue})")
            self.pending += 1
        self._jobs.put(job)
        return job

    def stop(self, timeout: float = 5.0) -> None:
        """Cancel what is queued, let the running job see its cancellation, stop the worker."""
        with self.lock:
            self._stopping = True
            if self.current is not None:
                self.current.cancelled.set()
        self._jobs.put(None)
        self._thread.join(timeout)
        with self.lock:
            self.loaded.clear()

    # -- models ----------------------------------------------------------------------------------
    def resolve(self, name: Any) -> tuple[str, Path]:
        """``(key, path)`` for a store name; HTTPError 400 for paths and invalid names, 404 when absent."""
        from llmedge.store import Store, looks_like_path, normalize_name

        if not isinstance(name, str) or not name.strip():
            raise HTTPError(400, "model is required")
        try:
            if looks_like_path(name):  # a client must not make the server open files of its choosing
                raise HTTPError(400, f"invalid model name {name[:100]!r}: use a name from the store")
            key = normalize_name(name)
            return key, Store().resolve(name, pull=False)
        except StoreError as e:
            msg = str(e)
            if "invalid model name" in msg:
                raise HTTPError(400, msg) from None
            raise HTTPError(404, f"model '{name}' not found") from None

    def check_ctx(self, num_ctx: Any) -> int | None:
        if num_ctx is None:
            return None
        if isinstance(num_ctx, bool) or not isinstance(num_ctx, int | float) or int(num_ctx) != num_ctx:
            raise HTTPError(400, "option num_ctx must be an integer")
        n = int(num_ctx)
        if n < 8 or n > self.max_ctx:
            raise HTTPError(400, f"option num_ctx={n} is out of range (8..{self.max_ctx}, LLMEDGE_MAX_CTX)")
        return n

    def ps(self) -> list[Loaded]:
        with self.lock:
            return sorted(self.loaded.values(), key=lambda m: -m.last_used)

    def _ensure(self, job: Job) -> Loaded:
        from llmedge.api import Model

        assert job.name is not None and job.path is not None
        want_ctx = job.num_ctx or self.num_ctx
        with self.lock:
            cur = self.loaded.get(job.name)
        if cur is not None and (cur.path != job.path or (job.num_ctx and cur.num_ctx != min(
                want_ctx, cur.model.params.n_ctx_train))):
            self._unload(job.name)
            cur = None
        if cur is None:
            while len(self.loaded) >= self.max_loaded:
                lru = min(self.loaded.values(), key=lambda m: m.last_used)
                self._unload(lru.name)
            t0 = time.perf_counter_ns()
            model = Model(job.path, backend=self.backend, n_ctx=want_ctx, n_threads=self.n_threads,
                          name=job.name)
            job.load_duration = time.perf_counter_ns() - t0
            size = job.path.stat().st_size + model.cache_bytes
            cur = Loaded(job.name, model, job.path, model.n_ctx, size, _short_digest(job.path))
            with self.lock:
                self.loaded[job.name] = cur
        cur.last_used = time.time()
        return cur

    def _unload(self, name: str) -> None:
        with self.lock:
            self.loaded.pop(name, None)

    def _expire(self) -> None:
        now = time.time()
        with self.lock:
            for name in [n for n, m in self.loaded.items() if m.expires_at is not None and m.expires_at <= now]:
                del self.loaded[name]

    def _set_expiry(self, loaded: Loaded, keep_alive: float | None | str) -> None:
        ka = self.keep_alive if keep_alive == "default" else keep_alive
        if ka is None:
            loaded.expires_at = None
        elif ka <= 0:
            self._unload(loaded.name)
        else:
            loaded.expires_at = time.time() + float(ka)

    # -- the worker ------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=0.5)
            except queue.Empty:
                self._expire()
                continue
            if job is None:
                self._drain()
                return
            self._run_job(job)
            self._expire()

    def _run_job(self, job: Job) -> None:
        with self.lock:
            self.busy += 1
            self.current = job
        try:
            if self._stopping:
                raise HTTPError(503, "the server is shutting down")
            job.check()
            loaded = self._ensure(job) if job.name is not None else None
            job.started = True
            result = job.work(job, loaded)
            if loaded is not None:
                loaded.last_used = time.time()
                self._set_expiry(loaded, job.keep_alive)
            self.stats["jobs"] += 1
            job._put(("done", result))
        except Cancelled as e:
            self.stats["cancelled"] += 1
            job._put(("error", e))
        except Exception as e:  # handed to the route, which renders it as a 4xx or 500 error shape
            job._put(("error", e))
        finally:
            with self.lock:
                self.current = None
                self.busy -= 1
                self.pending -= 1

    def _drain(self) -> None:
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                job._put(("error", HTTPError(503, "the server is shutting down")))
                with self.lock:
                    self.pending -= 1


def _short_digest(path: Path) -> str:
    """The blob's digest from its store file name, else a cheap stand-in (no hashing of a large file)."""
    name = path.name
    if name.startswith("sha256-") and len(name) == 71:
        return "sha256:" + name[7:]
    st = path.stat()
    import hashlib

    return "sha256:" + hashlib.sha256(f"{path}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()


def env_int(name: str, default: int) -> int:
    v = os.environ.get(name)
    if v is None or not v.strip():
        return default
    try:
        return int(v)
    except ValueError:
        raise LlmedgeError(f"{name}={v!r} is not an integer") from None


def count_tokens(stats: dict[str, int], prompt: int, generated: int, prompt_ns: int, eval_ns: int) -> None:
    stats["prompt_tokens"] += prompt
    stats["generated_tokens"] += generated
    stats["prompt_ns"] += prompt_ns
    stats["eval_ns"] += eval_ns


def ids_in_range(ids: Sequence[int], n_vocab: int) -> None:
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < n_vocab:
            raise HTTPError(400, f"token id {t!r} is out of range for a vocabulary of {n_vocab}")
