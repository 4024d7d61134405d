"""Loaded models, keep-alive, the bounded request queue and the engine thread (continuous batching).

Every request that touches a model becomes a :class:`Job` handed to one engine thread. A generation
job carries a :class:`GenTask` (build the prompt and sampler, then the result); any other job (an
embedding, a load) carries a plain ``work`` function that the thread runs between two steps.

The thread loops: take new jobs; drop the ones whose client went away; admit waiting generation jobs
into free sequence slots of their model (``parallel`` slots per model, each with its own KV cache,
chosen by the longest shared prefix: :class:`~llmedge.engine.SlotPool`); run other jobs; then, per
model with active sequences, one :meth:`~llmedge.engine.Engine.step`: one batched forward that decodes
a token for every decoding sequence and evaluates a chunk of the waiting prompts; emit each
sequence's text to its request's asyncio stream; free the slots of finished or cancelled requests.
A client that disconnects sets ``cancelled``; its slot is free after the current step.

Speculation and batching: a request with speculation (``--lookup``, ``--draft-model``) drafts only in
steps where it runs alone (:data:`llmedge.engine.SPECULATE_MAX_SEQUENCES`) and no request waits to be
admitted (it would join the next step, and wait for the verify rows first); while other sequences
share the step it decodes one token per step, as batched rows (its timings count those steps as
``draft_batched_steps``). Several sequences' decode rows verify nothing but already fill the multi-row
kernels, where draft rows would cost nearly full price.

At most ``parallel`` requests run; at most ``max_queue`` more wait, the next one is refused with 503.
A model is never unloaded (keep-alive, another ``num_ctx``, the loaded-models limit) while sequences
run on it: the job that needs it waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from llmedge.errors import ModelNotFoundError, StoreError
from llmedge.server.config import DEFAULT_KEEP_ALIVE, DEFAULT_MAX_CTX, DEFAULT_NUM_CTX
from llmedge.server.errors import BadOption, BadRequest, ModelNotFound, QueueFull, ShuttingDown

PROMPT_ROWS_WHILE_DECODING = 128  # more prompt rows in a step than the first chunk, while others decode


class Cancelled(Exception):
    """The client went away; the job stopped early."""


@dataclass
class Loaded:
    """A model in memory, when it expires (``None``: never) and its sequence slots."""

    name: str
    model: Any
    path: Path
    num_ctx: int
    digest: str
    parallel: int = 1
    expires_at: float | None = None
    last_used: float = field(default_factory=time.time)
    active: int = 0  # sequences running on it

    held: int = 0  # anonymous memory the load and the first forward added (measured; 0 where unknown)
    stepped: bool = False

    @property
    def size(self) -> int:
        """Bytes the process holds for the model: the mapped weights (less the file pages of weights the
        backend copied, packed, and released), plus what loading it and its first forward added (tokenizer,
        prepared weights, every slot's KV cache, committed at load, buffers) where the OS says (Linux), else
        the slots' caches; plus the cached prefixes and scratch."""
        engine = self.model.engine
        pool = engine.slot_pool(self.parallel)
        scratch = sum(c.scratch_bytes for c in pool.caches if c is not None)
        mapped = self.path.stat().st_size - self.model.gguf.released_bytes
        return mapped + max(self.held, pool.nbytes) + engine.prefix_cache.nbytes + scratch


@dataclass
class GenRequest:
    """What a generation job runs: the prompt and the options of :meth:`Engine.begin`."""

    ids: list[int]
    sampler: Any
    max_tokens: int
    stop: tuple[str, ...] = ()
    n_keep: int | None = None
    spec: Any = None  # speculative decoding (llmedge.speculative.SpecConfig), None: off
    shift: bool = True  # a full context is shifted (Ollama); False: the reply ends with "length" (OpenAI)


class GenTask(Protocol):
    """A generation request's two halves around the engine: prepare (on the engine thread, with the
    model loaded) a :class:`GenRequest` or an immediate result, and build the result once done."""

    def prepare(self, job: Job, loaded: Loaded) -> GenRequest | Any: ...

    def result(self, job: Job, loaded: Loaded, request: GenRequest, gen: Any,
               out_ids: list[int]) -> Any: ...


class Job:
    """One unit of work for the engine thread, with a stream of ``(kind, payload)`` items back to the
    event loop: ``("item", x)`` any number of times, then ``("done", result)`` or ``("error", exc)``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, work: Callable[[Job, Loaded | None], Any] | None,
                 name: str | None = None, path: Path | None = None, num_ctx: int | None = None,
                 keep_alive: float | None | str = "default", task: GenTask | None = None) -> None:
        self.loop = loop
        self.work = work
        self.task = task
        self.name = name
        self.path = path
        self.num_ctx = num_ctx
        self.default_ctx: int | None = None  # without num_ctx: its model's default context (Scheduler._want_ctx)
        self.keep_alive = keep_alive
        self.cancelled = threading.Event()
        self.items: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.t_arrival = time.perf_counter_ns()
        self.checked = time.monotonic()  # when the route last checked that its client is connected
        self.load_duration = 0
        self.started = False

    def emit(self, item: Any) -> None:
        self._put(("item", item))

    def _put(self, pair: tuple[str, Any]) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed during shutdown
            self.loop.call_soon_threadsafe(self.items.put_nowait, pair)

    @staticmethod
    def emit_all(items: list[tuple[Job, Any]]) -> None:
        """``emit`` of several jobs' items with one wake-up per event loop, not one per item: a
        batched step makes one item per sequence."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Job, Any]]] = {}
        for job, item in items:
            by_loop.setdefault(job.loop, []).append((job, item))
        for loop, batch in by_loop.items():
            with contextlib.suppress(RuntimeError):  # the loop closed during shutdown
                loop.call_soon_threadsafe(Job._deliver, batch)

    @staticmethod
    def _deliver(batch: list[tuple[Job, Any]]) -> None:
        for job, item in batch:
            job.items.put_nowait(("item", item))

    async def next(self) -> tuple[str, Any]:
        return await self.items.get()

    def ready(self) -> tuple[str, Any] | None:
        """The next event if one is already queued, else None (no waiting)."""
        try:
            return self.items.get_nowait()
        except asyncio.QueueEmpty:
            return None

    def check(self) -> None:
        if self.cancelled.is_set():
            raise Cancelled()


@dataclass
class Active:
    """A generation job holding a sequence slot."""

    job: Job
    loaded: Loaded
    slot: int
    request: GenRequest
    gen: Any
    out_ids: list[int] = field(default_factory=list)


class Scheduler:
    """Owns the loaded models and the engine thread that admits, batches and finishes every job."""

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
        self._waiting: list[Job] = []  # taken from the queue, not yet admitted (engine thread only)
        self._active: list[Active] = []  # engine thread only
        self.pending = 0  # admitted and not finished (running + queued)
        self.busy = 0  # sequences in slots, plus a running non-generation job
        self.steps = 0  # batched forwards run
        self.sequence_steps = 0  # sequences advanced by them (sequence_steps / steps: the mean batch)
        self.stats = {"prompt_tokens": 0, "generated_tokens": 0, "eval_ns": 0, "prompt_ns": 0,
                      "jobs": 0, "rejected": 0, "cancelled": 0}
        self._thread = threading.Thread(target=self._run, name="llmedge-engine", daemon=True)
        self._stopping = False
        self._freed = False
        self._thread.start()

    # -- admission -------------------------------------------------------------------------------
    @property
    def queue_depth(self) -> int:
        return max(0, self.pending - self.busy)

    def submit(self, job: Job) -> Job:
        """Queue ``job``; QueueFull (or ShuttingDown) when the slots and the queue are full or the server is stopping."""
        with self.lock:
            if self._stopping:
                raise ShuttingDown()
            if self.pending >= self.parallel + self.max_queue:
                self.stats["rejected"] += 1
                raise QueueFull(f"server busy: {self.pending} requests in progress or queued "
                                f"(LLMEDGE_MAX_QUEUE={self.max_queue})")
            self.pending += 1
        self._jobs.put(job)
        return job

    def stop(self, timeout: float = 5.0) -> None:
        """Refuse new jobs, fail what waits, stop the running sequences, stop the engine thread."""
        with self.lock:
            self._stopping = True
        self._jobs.put(None)
        self._thread.join(timeout)
        with self.lock:
            self.loaded.clear()

    # -- models ----------------------------------------------------------------------------------
    def resolve(self, name: Any) -> tuple[str, Path]:
        """``(key, path)`` for a store name; BadRequest for paths and invalid names, ModelNotFound when absent."""
        from llmedge.store import Store, looks_like_path, normalize_name

        if not isinstance(name, str) or not name.strip():
            raise BadRequest("model is required")
        if looks_like_path(name):  # a client must not make the server open files of its choosing
            raise BadRequest(f"invalid model name {name[:100]!r}: use a name from the store")
        try:
            key = normalize_name(name)
            return key, Store().resolve(name, pull=False)
        except ModelNotFoundError:
            raise ModelNotFound(name) from None
        except StoreError as e:
            raise BadRequest(str(e)) from None

    def check_ctx(self, num_ctx: Any) -> int | None:
        if num_ctx is None:
            return None
        if isinstance(num_ctx, bool) or not isinstance(num_ctx, int | float) or not math.isfinite(num_ctx) \
                or int(num_ctx) != num_ctx:
            raise BadOption("option num_ctx must be an integer")
        n = int(num_ctx)
        if n < 8 or n > self.max_ctx:
            raise BadOption(f"option num_ctx={n} is out of range (8..{self.max_ctx}, LLMEDGE_MAX_CTX)")
        return n

    def ps(self) -> list[Loaded]:
        with self.lock:
            return sorted(self.loaded.values(), key=lambda m: -m.last_used)

    def _want_ctx(self, job: Job) -> int:
        """The context ``job`` asks for before the training-context cap, in Ollama's order
        (:func:`llmedge.defaults.load_context`): its num_ctx option, else its model's num_ctx PARAMETER
        (at most LLMEDGE_MAX_CTX, as a request's), else the server's default. Read once per job."""
        if job.num_ctx:
            return job.num_ctx
        if job.default_ctx is None:
            from llmedge.defaults import parameter_num_ctx
            from llmedge.errors import LlmedgeError
            from llmedge.store import Store

            try:
                own = parameter_num_ctx(Store().config(job.name)) if job.name else None
            except (LlmedgeError, OSError, ValueError):
                own = None  # the load reads the config again and reports what is wrong with it
            job.default_ctx = self.num_ctx if own is None else min(own, self.max_ctx)
        return job.default_ctx

    def _fits(self, job: Job, cur: Loaded) -> bool:
        """Whether the loaded ``cur`` serves ``job`` as it is: the same file, at the job's num_ctx; a job
        without one (OpenAI's routes, Ollama requests without the option) takes its model's default
        context (:meth:`_want_ctx`) or a larger one already loaded, so an earlier request's small
        num_ctx is not imposed on it (the model is loaded again, as Ollama does)."""
        if cur.path != job.path:
            return False
        want = min(self._want_ctx(job), cur.model.params.n_ctx_train)
        return cur.num_ctx == want if job.num_ctx else cur.num_ctx >= want

    def _can_ensure(self, job: Job) -> bool:
        """Whether ``job``'s model can be made ready now without unloading one that sequences use."""
        assert job.name is not None
        with self.lock:
            cur = self.loaded.get(job.name)
            if cur is not None:
                return self._fits(job, cur) or cur.active == 0
            return len(self.loaded) < self.max_loaded or any(m.active == 0 for m in self.loaded.values())

    def _ensure(self, job: Job) -> Loaded:
        from llmedge.api import Model

        assert job.name is not None and job.path is not None
        want_ctx = self._want_ctx(job)
        with self.lock:
            cur = self.loaded.get(job.name)
        if cur is not None and not self._fits(job, cur):
            self._unload(job.name)
            cur = None
        if cur is None:
            while len(self.loaded) >= self.max_loaded:
                idle = [m for m in self.loaded.values() if m.active == 0] or list(self.loaded.values())
                self._unload(min(idle, key=lambda m: m.last_used).name)
            t0 = time.perf_counter_ns()
            anon0 = anon_rss()
            model = Model(job.path, backend=self.backend, n_ctx=want_ctx, n_threads=self.n_threads,
                          name=job.name)
            _commit_slots(model, self.parallel)
            job.load_duration = time.perf_counter_ns() - t0
            cur = Loaded(job.name, model, job.path, model.n_ctx, _short_digest(job.path), self.parallel,
                         held=max(0, anon_rss() - anon0))
            with self.lock:
                self.loaded[job.name] = cur
        _apply_defaults(cur.model, job.name)
        cur.last_used = time.time()
        return cur

    def _unload(self, name: str) -> None:
        with self.lock:
            gone = self.loaded.pop(name, None)
        if gone is not None:
            self._freed = True  # collected once the engine thread's frames let go of it

    def _expire(self) -> None:
        now = time.time()
        with self.lock:
            expired = [n for n, m in self.loaded.items()
                       if m.expires_at is not None and m.expires_at <= now and m.active == 0]
        for name in expired:
            self._unload(name)

    def _set_expiry(self, loaded: Loaded, keep_alive: float | None | str) -> None:
        ka = self.keep_alive if keep_alive == "default" else keep_alive
        if ka is None:
            loaded.expires_at = None
        elif ka <= 0:
            loaded.expires_at = time.time()  # unloaded now, or once its other sequences end
            if loaded.active == 0:
                self._unload(loaded.name)
        else:
            loaded.expires_at = time.time() + float(ka)

    # -- the engine thread -----------------------------------------------------------------------
    def _run(self) -> None:
        last_expire = time.monotonic()
        while True:
            idle = not self._active and not self._waiting
            try:
                job = self._jobs.get(timeout=0.5) if idle else self._jobs.get_nowait()
                while True:
                    if job is None:
                        self._shutdown()
                        return
                    self._waiting.append(job)
                    job = self._jobs.get_nowait()
            except queue.Empty:
                pass
            try:
                self._admit()
                if not self._active and self._waiting:
                    time.sleep(0.01)  # nothing runs and nothing can start yet (cannot last: see _admit)
                self._step()
            except Exception as e:  # a failure of the engine itself: fail the running requests, go on
                for a in list(self._active):
                    a.gen.cache.clear()  # its cells may be half written: no later request reuses them
                    self._finish(a, e)
            now = time.monotonic()
            if idle or now - last_expire > 0.5:
                self._expire()
                last_expire = now
            if self._freed:  # an unloaded model's arrays and mapping go now, not at some later collection
                self._freed = False
                gc.collect()

    def _admit(self) -> None:
        """Start what can start, in arrival order: a cancelled job ends; a generation job takes a free
        slot of its model; any other job runs now (between two steps)."""
        keep: list[Job] = []
        blocked: set[str] = set()  # models with an earlier job still waiting: later ones keep their turn
        for job in self._waiting:
            if job.cancelled.is_set():
                self._end(job, ("error", Cancelled()), cancelled=True)
            elif self._stopping:
                self._end(job, ("error", ShuttingDown()))
            elif job.name is not None and (job.name in blocked or not self._can_ensure(job)):
                keep.append(job)
                blocked.add(job.name)
            elif job.task is not None:
                if not self._start(job):
                    keep.append(job)
                    blocked.add(job.name or "")
            else:
                self._run_work(job)
        self._waiting = keep

    def _start(self, job: Job) -> bool:
        """Admit a generation job into a slot; False when its model's slots are all busy."""
        assert job.task is not None
        with self.lock:
            cur = self.loaded.get(job.name or "")
        if cur is not None and self._fits(job, cur) and cur.model.engine.slot_pool(self.parallel).n_busy >= \
                self.parallel:
            return False
        loaded: Loaded | None = None
        try:
            loaded = self._ensure(job)
            job.started = True
            request = job.task.prepare(job, loaded)
            if not isinstance(request, GenRequest):  # answered without generating (a load, an unload)
                self._set_expiry(loaded, job.keep_alive)
                self._end(job, ("done", request))
                return True
            engine = loaded.model.engine
            pool = engine.slot_pool(self.parallel)
            slot = pool.acquire(request.ids)
            if slot is None:
                return False
            try:
                gen = engine.begin(request.ids, request.sampler, request.max_tokens, request.stop, shift=request.shift,
                                   n_keep=request.n_keep, cache=pool.cache(slot), spec=request.spec)
            except BaseException:
                pool.release(slot)
                raise
        except Exception as e:  # handed to the route, which renders it as a 4xx or 500 error shape
            if loaded is not None:  # loaded for this request: its keep_alive applies all the same
                self._set_expiry(loaded, job.keep_alive)
            self._end(job, ("error", e))
            return True
        loaded.active += 1
        self._active.append(Active(job, loaded, slot, request, gen))
        with self.lock:
            self.busy += 1
        return True

    def _run_work(self, job: Job) -> None:
        assert job.work is not None
        with self.lock:
            self.busy += 1
        loaded: Loaded | None = None
        try:
            loaded = self._ensure(job) if job.name is not None else None
            job.started = True
            result = job.work(job, loaded)
            if loaded is not None:
                loaded.last_used = time.time()
                self._set_expiry(loaded, job.keep_alive)
            self._end(job, ("done", result))
        except Exception as e:
            if loaded is not None:  # failed or cancelled after loading: keep_alive applies all the same
                self._set_expiry(loaded, job.keep_alive)
            self._end(job, ("error", e), cancelled=isinstance(e, Cancelled))
        finally:
            with self.lock:
                self.busy -= 1

    def _step(self) -> None:
        """Per model, one batched forward over its active sequences; then emit, finish and free."""
        for a in [a for a in self._active if a.job.cancelled.is_set()]:
            self._finish(a, Cancelled())
        by_model: dict[int, list[Active]] = {}
        for a in self._active:
            by_model.setdefault(id(a.loaded), []).append(a)
        for group in by_model.values():
            engine = group[0].loaded.model.engine
            decoding = any(a.gen.decoding for a in group)
            rows = min(engine.n_batch, PROMPT_ROWS_WHILE_DECODING) if decoding else engine.n_batch
            first = not group[0].loaded.stepped
            anon0 = anon_rss() if first else 0  # /proc/self/status, read on the first step only
            # a request waiting to be admitted is about to share the steps: a draft now would make it wait
            # for verify rows (measured: 4 streams' aggregate 0.97x -> 1.00x the plain server's)
            outs = engine.step([a.gen for a in group], rows, speculate=self._jobs.empty())
            if first:  # the forward's buffers are allocated once, on the first step: the model's too
                group[0].loaded.stepped = True
                group[0].loaded.held += max(0, anon_rss() - anon0)
            self.steps += 1
            self.sequence_steps += len(group)
            texts: list[tuple[Job, Any]] = []
            for a, chunks in zip(group, outs):
                for chunk in chunks:
                    a.out_ids.append(chunk.token)
                    if chunk.text:
                        texts.append((a.job, chunk.text))
            Job.emit_all(texts)  # before any job's end below, which the loop then delivers after them
            for a in group:
                if a.gen.error is not None:
                    self._finish(a, a.gen.error)
                elif a.gen.done:
                    self._finish(a, None)

    def _finish(self, a: Active, error: BaseException | None) -> None:
        """Free ``a``'s slot and hand its result (or ``error``) to the route."""
        if a not in self._active:
            return
        self._active.remove(a)
        a.loaded.model.engine.slot_pool(self.parallel).release(a.slot)
        a.loaded.active -= 1
        a.loaded.last_used = time.time()
        with self.lock:
            self.busy -= 1
        if error is None:
            assert a.job.task is not None
            try:
                result = a.job.task.result(a.job, a.loaded, a.request, a.gen, a.out_ids)
            except Exception as e:
                error = e
        self._set_expiry(a.loaded, a.job.keep_alive)  # an error or a cancel too: else loaded forever
        if error is None:
            self._end(a.job, ("done", result))
        else:
            self._end(a.job, ("error", error), cancelled=isinstance(error, Cancelled))

    def _end(self, job: Job, pair: tuple[str, Any], cancelled: bool = False) -> None:
        if cancelled:
            self.stats["cancelled"] += 1
        elif pair[0] == "done":
            self.stats["jobs"] += 1
        job._put(pair)
        with self.lock:
            self.pending -= 1

    def _shutdown(self) -> None:
        for a in list(self._active):
            self._finish(a, Cancelled())
        for job in self._waiting:
            self._end(job, ("error", ShuttingDown()))
        self._waiting = []
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                self._end(job, ("error", ShuttingDown()))


def _apply_defaults(model: Any, name: str) -> None:
    """Give a model the server runs its Modelfile/registry defaults (SYSTEM, PARAMETER, TEMPLATE), read
    again for every request so that a model re-created under the same name is seen at once."""
    from llmedge.defaults import apply
    from llmedge.store import Store

    config = Store().config(name)
    if config != model.defaults:
        apply(model, config)


def anon_rss() -> int:
    """The process's resident anonymous memory in bytes (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _commit_slots(model: Any, parallel: int) -> None:
    """Allocate every sequence slot's KV cache and write its pages, as llama.cpp clears its KV buffer: a
    server's memory is then what it reports from the start, not a later surprise."""
    pool = model.engine.slot_pool(parallel)
    for i in range(len(pool)):
        arena = getattr(pool.cache(i), "arena", None)
        if arena is not None:
            arena.buffer.fill(0)


def _short_digest(path: Path) -> str:
    """The blob's digest from its store file name, else a cheap stand-in (no hashing of a large file)."""
    name = path.name
    if name.startswith("sha256-") and len(name) == 71:
        return "sha256:" + name[7:]
    st = path.stat()
    import hashlib

    return "sha256:" + hashlib.sha256(f"{path}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()


def count_tokens(stats: dict[str, int], prompt: int, generated: int, prompt_ns: int, eval_ns: int) -> None:
    stats["prompt_tokens"] += prompt
    stats["generated_tokens"] += generated
    stats["prompt_ns"] += prompt_ns
    stats["eval_ns"] += eval_ns


def ids_in_range(ids: Sequence[int], n_vocab: int) -> None:
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < n_vocab:
            raise BadRequest(f"token id {t!r} is out of range for a vocabulary of {n_vocab}")
