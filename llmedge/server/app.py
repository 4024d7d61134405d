"""The Starlette application: Ollama's and OpenAI's routes, the job hand-off to the engine thread,
NDJSON and SSE streaming, and error rendering (a 4xx in the route's API shape for anything a client
can get wrong; no request produces a 500 or stops the server)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

import llmedge
from llmedge.defaults import generate_messages, request_options, with_defaults
from llmedge.errors import LlmedgeError, StoreError
from llmedge.sampling import SamplingOptions
from llmedge.server import limits
from llmedge.server import ollama as ol
from llmedge.server import openai as oa
from llmedge.server.embed import embed_text
from llmedge.server.grammar import ANY_JSON_OBJECT, RequestSampler, compile_schema
from llmedge.server.metrics import Metrics
from llmedge.server.scheduler import (
    DEFAULT_KEEP_ALIVE,
    DEFAULT_MAX_CTX,
    DEFAULT_NUM_CTX,
    Cancelled,
    GenRequest,
    Job,
    Loaded,
    Scheduler,
    count_tokens,
    ids_in_range,
)
from llmedge.server.security import (
    DEFAULT_MAX_BODY,
    BodyTooLarge,
    HTTPError,
    SecurityMiddleware,
    error_response,
    is_loopback_host,
    parse_json_body,
)

FOREVER = "2318-11-26T00:00:00.000000000Z"  # what /api/ps shows for a model kept loaded forever
DISCONNECT_POLL = 0.25  # seconds between checks that a waiting client is still connected


@dataclass
class ServerConfig:
    """Everything ``llmedge serve`` can set (flags, else environment, else defaults)."""

    host: str = "127.0.0.1"
    port: int = 11434
    parallel: int = 4
    max_queue: int = 64
    keep_alive: float | None = DEFAULT_KEEP_ALIVE
    num_ctx: int = DEFAULT_NUM_CTX
    max_ctx: int = DEFAULT_MAX_CTX
    api_key: str | None = None
    origins: list[str] = field(default_factory=list)
    max_body: int = DEFAULT_MAX_BODY
    backend: str = "auto"
    n_threads: int | None = None
    max_loaded: int = 2
    announce: bool = False  # print a line on stderr once shut down (the serve command)


# -- the generation job --------------------------------------------------------------------------
@dataclass
class GenSpec:
    """What a generation request asks the worker to do."""

    build_ids: Callable[[Any], list[int]]  # model -> prompt ids
    sampling: dict[str, Any]
    max_tokens: int | None
    stop: tuple[str, ...]
    num_keep: int | None = None
    keep_from: list[dict[str, Any]] | None = None  # chat messages: keep the system prompt on shifts
    grammar: str | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    collect_ids: bool = False
    default_max_tokens: int | None = None  # when neither the request nor the model's num_predict says


class GenerationTask:
    """A generation request for the engine thread (:class:`~llmedge.server.scheduler.GenTask`): the
    prompt ids, sampler and options once the model is loaded, then the result dict the routes render."""

    def __init__(self, spec: GenSpec, stats: dict[str, int]) -> None:
        self.spec = spec
        self.stats = stats

    def _base(self, job: Job, model: Any, ids: list[int]) -> dict[str, Any]:
        return {"load_duration": job.load_duration, "prompt_eval_count": 0, "prompt_eval_duration": 0,
                "eval_count": 0, "eval_duration": 0, "n_prompt": len(ids), "ids": ids, "records": [],
                "piece": model.tokenizer.token_to_piece}

    def prepare(self, job: Job, loaded: Loaded) -> GenRequest | dict[str, Any]:
        spec, model = self.spec, loaded.model
        ids = spec.build_ids(model)
        ids_in_range(ids, model.params.n_vocab)
        if not ids:
            reason = "unload" if job.keep_alive == 0 else "load"
            return {**self._base(job, model, ids), "done_reason": reason,
                    "total_duration": time.perf_counter_ns() - job.t_arrival}
        sampling, max_tokens, stop, n_keep = request_options(model.defaults, spec.sampling, spec.max_tokens,
                                                             spec.stop, spec.num_keep)
        speculative = {**server_speculation(), **{k: sampling.pop(k) for k in ol.SPECULATIVE_OPTIONS if k in sampling}}
        sampler = RequestSampler(SamplingOptions(**sampling), model.tokenizer, spec.grammar,
                                 spec.logprobs, spec.top_logprobs)
        if n_keep is None and spec.keep_from is not None:
            n_keep = model.system_keep(with_defaults(model.defaults, spec.keep_from), ids)
        if max_tokens is None:
            max_tokens = spec.default_max_tokens
        max_tokens = max_tokens if max_tokens is not None and max_tokens >= 0 else model.n_ctx
        return GenRequest(ids, sampler, max_tokens, stop, n_keep, spec=model.spec_config(**speculative))

    def result(self, job: Job, loaded: Loaded, request: GenRequest, gen: Any, out_ids: list[int]
               ) -> dict[str, Any]:
        t = gen.timings
        count_tokens(self.stats, t.prompt_eval_count, t.eval_count, t.prompt_eval_duration, t.eval_duration)
        speculative = {k: int(t.extra[k]) for k in ("draft_tokens", "draft_accepted") if k in t.extra}
        for k, v in speculative.items():
            self.stats[k] = self.stats.get(k, 0) + v
        return {**self._base(job, loaded.model, request.ids), "done_reason": t.done_reason or "stop",
                "speculative": speculative,
                "prompt_eval_count": t.prompt_eval_count, "prompt_eval_duration": t.prompt_eval_duration,
                "eval_count": t.eval_count, "eval_duration": t.eval_duration,
                "total_duration": time.perf_counter_ns() - job.t_arrival, "out_ids": out_ids,
                "records": request.sampler.records}


# -- the application -----------------------------------------------------------------------------
class Server:
    """Routes and the state they share (scheduler, metrics, caches)."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.scheduler: Scheduler | None = None
        self.metrics = Metrics()
        self._describe_cache: dict[str, dict[str, Any]] = {}

    @property
    def sched(self) -> Scheduler:
        if self.scheduler is None:
            c = self.config
            self.scheduler = Scheduler(c.parallel, c.max_queue, c.keep_alive, c.num_ctx, c.max_ctx,
                                       c.max_loaded, c.backend, c.n_threads)
        return self.scheduler

    # -- plumbing --------------------------------------------------------------------------------
    async def body(self, request: Request) -> dict[str, Any]:
        try:
            raw = await request.body()
        except BodyTooLarge:
            raise HTTPError(413, f"request body exceeds {self.config.max_body} bytes") from None
        return parse_json_body(raw, request.url.path)

    async def wait(self, request: Request, job: Job) -> tuple[str, Any]:
        """The job's next event; cancels the job when the client disconnects meanwhile."""
        getter = asyncio.ensure_future(job.next())
        try:
            while True:
                done, _ = await asyncio.wait({getter}, timeout=DISCONNECT_POLL)
                now = time.monotonic()
                if not done or now - job.checked >= DISCONNECT_POLL:  # also while items keep coming
                    job.checked = now
                    if await request.is_disconnected():
                        job.cancelled.set()
                        raise Cancelled()
                if done:
                    return getter.result()
        finally:
            if not getter.done():
                getter.cancel()

    async def collect(self, request: Request, job: Job) -> tuple[list[Any], Any]:
        items = []
        while True:
            kind, payload = await self.wait(request, job)
            if kind == "item":
                items.append(payload)
            elif kind == "done":
                return items, payload
            else:
                raise payload

    def submit(self, work: Callable[[Job, Loaded | None], Any] | None = None, name: str | None = None,
               path: Path | None = None, num_ctx: int | None = None, keep_alive: Any = "default",
               task: GenerationTask | None = None) -> Job:
        job = Job(asyncio.get_running_loop(), work, name, path, num_ctx, keep_alive, task=task)
        return self.sched.submit(job)

    def in_thread(self, work: Callable[[Job, Loaded | None], Any]) -> Job:
        """Run ``work`` on its own thread (store operations that must not wait behind generations)."""
        job = Job(asyncio.get_running_loop(), work)

        def run() -> None:
            try:
                job._put(("done", work(job, None)))
            except Exception as e:
                job._put(("error", e))

        threading.Thread(target=run, name="llmedge-store", daemon=True).start()
        return job

    def render_error(self, path: str, e: BaseException) -> Response:
        if isinstance(e, HTTPError):
            return error_response(path, e.status, e.message, e.type, e.headers)
        if isinstance(e, StoreError):
            return error_response(path, 404 if "not found" in str(e) else 400, str(e))
        if isinstance(e, LlmedgeError):
            return error_response(path, 400, str(e))
        return error_response(path, 500, f"internal error: {type(e).__name__}: {e}")

    def handler(self, fn: Callable[[Request], Any]) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            try:
                return await fn(request)
            except Cancelled:
                return Response(status_code=499)
            except Exception as e:
                return self.render_error(request.url.path, e)

        return endpoint

    def describe(self, path: Path) -> dict[str, Any]:
        key = str(path)
        if key not in self._describe_cache:
            self._describe_cache[key] = ol.describe_gguf(path)
        return self._describe_cache[key]

    # -- shared request parsing ------------------------------------------------------------------
    def model_of(self, body: dict[str, Any]) -> tuple[str, str, Path]:
        limits.check_request(body)
        name = body.get("model", body.get("name"))
        key, path = self.sched.resolve(name)
        return name, key, path

    def grammar_of(self, fmt: Any) -> str | None:
        if fmt is None or fmt == "":
            return None
        if fmt == "json":
            return compile_schema(ANY_JSON_OBJECT)
        if isinstance(fmt, dict | bool):
            return compile_schema(fmt)
        raise HTTPError(400, "format must be \"json\" or a JSON schema object")

    @staticmethod
    def flag(body: dict[str, Any], key: str, default: bool) -> bool:
        v = body.get(key, default)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise HTTPError(400, f"{key} must be a boolean")
        return v

    @staticmethod
    def top_logprobs(body: dict[str, Any]) -> int:
        v = body.get("top_logprobs")
        if v is None:
            return 0
        n = int(ol.number(v, "top_logprobs", int))
        if not 0 <= n <= 20:
            raise HTTPError(400, "top_logprobs must be between 0 and 20")
        return n

    # -- Ollama ----------------------------------------------------------------------------------
    async def root(self, request: Request) -> Response:
        return PlainTextResponse("llmedge is running (Ollama-compatible API)")

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": llmedge.__version__})

    async def health(self, request: Request) -> Response:
        s = self.sched
        return JSONResponse({"status": "ok", "busy": s.busy, "queue": s.queue_depth, "slots": s.parallel,
                             "loaded": [m.name for m in s.ps()]})

    async def metrics_route(self, request: Request) -> Response:
        return PlainTextResponse(self.metrics.render(self.sched),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    async def generate(self, request: Request) -> Response:
        body = await self.body(request)
        name, key, path = self.model_of(body)
        prompt = body.get("prompt") or ""
        system = body.get("system")
        if not isinstance(prompt, str) or (system is not None and not isinstance(system, str)):
            raise HTTPError(400, "prompt and system must be strings")
        if body.get("suffix"):
            raise HTTPError(400, f"'{name}' does not support insert (suffix)")
        if body.get("images"):
            raise HTTPError(400, f"'{name}' does not support images")
        if body.get("template"):
            raise HTTPError(400, "a per-request template is not supported; the model's chat template is used")
        raw = self.flag(body, "raw", False)
        context = body.get("context") or []
        if not isinstance(context, list) or any(isinstance(t, bool) or not isinstance(t, int) for t in context):
            raise HTTPError(400, "context must be an array of token ids")
        opts = ol.parse_options(body.get("options"))
        num_ctx = self.sched.check_ctx(opts["num_ctx"])
        keep_alive = ol.parse_keep_alive(body.get("keep_alive"))
        grammar = self.grammar_of(body.get("format"))
        stream = self.flag(body, "stream", True)

        def build(model: Any) -> list[int]:
            if not prompt:
                return []
            if raw:
                ids = model.tokenize(prompt, add_bos=not context, special=True)
            else:
                ids = model.template.encode(generate_messages(model.defaults, prompt, system, not context))
                bos = model.tokenizer.bos_id
                if context and ids and ids[0] == bos:
                    ids = ids[1:]
            return list(context) + ids

        spec = GenSpec(build, opts["sampling"], opts["max_tokens"], opts["stop"], opts["num_keep"],
                       grammar=grammar, logprobs=self.flag(body, "logprobs", False),
                       top_logprobs=self.top_logprobs(body))
        job = self.submit(None, key, path, num_ctx, keep_alive, task=GenerationTask(spec, self.sched.stats))

        def item(text: str) -> dict[str, Any]:
            return {"model": name, "created_at": ol.now_rfc3339(), "response": text, "done": False}

        def final(result: dict[str, Any], text: str = "") -> dict[str, Any]:
            out = {"model": name, "created_at": ol.now_rfc3339(), "response": text, **ol.final_fields(result)}
            if result["done_reason"] not in ("load", "unload"):
                out["context"] = result["ids"] + result.get("out_ids", [])
            if spec.logprobs or spec.top_logprobs:
                out["logprobs"] = ol.logprob_entries(result["records"], result["piece"])
            return out

        return await self.respond_ollama(request, job, stream, item, final)

    async def chat(self, request: Request) -> Response:
        body = await self.body(request)
        name, key, path = self.model_of(body)
        raw_messages = body.get("messages")
        if raw_messages is None:
            raw_messages = []
        if raw_messages and not isinstance(raw_messages, list):
            raise HTTPError(400, "messages must be an array")
        if any(isinstance(m, dict) and m.get("images") for m in raw_messages):
            raise HTTPError(400, f"'{name}' does not support images")
        if body.get("tools"):
            raise HTTPError(400, f"'{name}' does not support tools")
        messages = oa.parse_messages(raw_messages) if raw_messages else []
        opts = ol.parse_options(body.get("options"))
        num_ctx = self.sched.check_ctx(opts["num_ctx"])
        keep_alive = ol.parse_keep_alive(body.get("keep_alive"))
        grammar = self.grammar_of(body.get("format"))
        stream = self.flag(body, "stream", True)

        def build(model: Any) -> list[int]:
            return model.template.encode(with_defaults(model.defaults, messages)) if messages else []

        spec = GenSpec(build, opts["sampling"], opts["max_tokens"], opts["stop"], opts["num_keep"],
                       keep_from=messages, grammar=grammar, logprobs=self.flag(body, "logprobs", False),
                       top_logprobs=self.top_logprobs(body))
        job = self.submit(None, key, path, num_ctx, keep_alive, task=GenerationTask(spec, self.sched.stats))

        def item(text: str) -> dict[str, Any]:
            return {"model": name, "created_at": ol.now_rfc3339(),
                    "message": {"role": "assistant", "content": text}, "done": False}

        def final(result: dict[str, Any], text: str = "") -> dict[str, Any]:
            out = {"model": name, "created_at": ol.now_rfc3339(),
                   "message": {"role": "assistant", "content": text}, **ol.final_fields(result)}
            if spec.logprobs or spec.top_logprobs:
                out["logprobs"] = ol.logprob_entries(result["records"], result["piece"])
            return out

        return await self.respond_ollama(request, job, stream, item, final)

    async def respond_ollama(self, request: Request, job: Job, stream: bool, item: Callable[[str], Any],
                             final: Callable[..., Any]) -> Response:
        if not stream:
            items, result = await self.collect(request, job)
            return JSONResponse(final(result, "".join(items)))
        kind, payload = await self.wait(request, job)
        if kind == "error":
            raise payload
        path = request.url.path

        async def lines() -> AsyncIterator[bytes]:
            k, p = kind, payload
            try:
                while True:
                    if k == "item":
                        yield _ndjson(item(p))
                    elif k == "done":
                        yield _ndjson(final(p))
                        return
                    else:
                        yield _ndjson(_error_payload(self, path, p))
                        return
                    k, p = await job.next()
            finally:
                job.cancelled.set()

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    async def tags(self, request: Request) -> Response:
        from llmedge.store import Store

        def work(job: Job, _: Any) -> list[dict[str, Any]]:
            store = Store()
            out = []
            for e in store.list():
                try:
                    info = self.describe(store.blob_path(e.digest))
                except (LlmedgeError, OSError):
                    info = {}
                out.append({"name": e.name, "model": e.name, "modified_at": ol.rfc3339(e.modified.timestamp()),
                            "size": e.size, "digest": e.digest.split(":")[-1],
                            "details": ol.model_details(info)})
            return out

        _, models = await self.collect(request, self.in_thread(work))
        return JSONResponse({"models": models})

    async def show(self, request: Request) -> Response:
        body = await self.body(request)
        name, key, path = self.model_of(body)

        def work(job: Job, _: Any) -> dict[str, Any]:
            from llmedge.server.manage import show_fields

            info = self.describe(path)
            return {
                **show_fields(name, path, info.get("template", "")),
                "details": ol.model_details(info),
                "model_info": info.get("model_info", {}),
                "capabilities": ["completion", "embedding"],
                "modified_at": ol.rfc3339(path.stat().st_mtime),
            }

        _, out = await self.collect(request, self.in_thread(work))
        return JSONResponse(out)

    async def ps(self, request: Request) -> Response:
        models = []
        for m in self.sched.ps():
            info = self.describe(m.path)
            models.append({
                "name": m.name, "model": m.name, "size": m.size, "digest": m.digest.split(":")[-1],
                "details": ol.model_details(info),
                "expires_at": FOREVER if m.expires_at is None else ol.rfc3339(m.expires_at),
                "size_vram": 0, "context_length": m.num_ctx,
            })
        return JSONResponse({"models": models})

    async def pull(self, request: Request) -> Response:
        from llmedge.store import Store

        body = await self.body(request)
        name = body.get("model", body.get("name"))
        if not isinstance(name, str) or not name:
            raise HTTPError(400, "model is required")
        stream = self.flag(body, "stream", True)

        def work(job: Job, _: Any) -> dict[str, Any]:
            last = [0.0, ""]

            def progress(status: str, digest: str | None = None, total: int | None = None,
                         completed: int | None = None) -> None:
                now = time.monotonic()
                if status == last[1] and now - last[0] < 0.1 and completed != total:
                    return
                last[0], last[1] = now, status
                event: dict[str, Any] = {"status": status}
                if digest is not None:
                    event["digest"] = digest
                if total is not None:
                    event["total"] = total
                if completed is not None:
                    event["completed"] = completed
                job.emit(event)

            Store(insecure=insecure).pull(name, progress=progress)
            return {"status": "success"}

        insecure = self.flag(body, "insecure", False)
        return await self.status_stream(request, self.in_thread(work), stream,
                                        keep=lambda event: event.get("status") != "success")

    async def delete(self, request: Request) -> Response:
        from llmedge.store import Store, normalize_name

        body = await self.body(request)
        name = body.get("model", body.get("name"))
        if not isinstance(name, str) or not name:
            raise HTTPError(400, "model is required")
        try:
            Store().remove(name)
        except StoreError as e:
            if "not found" in str(e):
                raise HTTPError(404, f"model '{name}' not found") from None
            raise
        with contextlib.suppress(StoreError):
            self.sched._unload(normalize_name(name))
        return Response(status_code=200)

    async def copy(self, request: Request) -> Response:
        from llmedge.store import Store

        body = await self.body(request)
        src, dst = body.get("source"), body.get("destination")
        if not isinstance(src, str) or not isinstance(dst, str) or not src or not dst:
            raise HTTPError(400, "source and destination are required")
        try:
            Store().copy(src, dst)
        except StoreError as e:
            if "not found" in str(e) and "invalid" not in str(e):
                raise HTTPError(404, f"model '{src}' not found") from None
            raise HTTPError(400, str(e)) from None
        return Response(status_code=200)

    async def create(self, request: Request) -> Response:
        from llmedge.server import manage
        from llmedge.store import normalize_name

        body = await self.body(request)
        stream = self.flag(body, "stream", True)
        insecure = self.flag(body, "insecure", False)

        def work(job: Job, _: Any) -> dict[str, Any]:
            manage.create(body, lambda status: job.emit({"status": status}), insecure)
            with contextlib.suppress(LlmedgeError):
                self.sched._unload(normalize_name(body.get("model", body.get("name"))))
            return {"status": "success"}

        return await self.status_stream(request, self.in_thread(work), stream)

    async def status_stream(self, request: Request, job: Job, stream: bool,
                            keep: Callable[[dict[str, Any]], bool] = lambda event: True) -> Response:
        """A model-management job's answer: its result as one JSON object, or its status events
        (those ``keep`` accepts) as NDJSON ending in the result or an error line (pull, create)."""
        if not stream:
            _, result = await self.collect(request, job)
            return JSONResponse(result)
        kind, payload = await self.wait(request, job)
        if kind == "error":
            raise payload
        path = request.url.path

        async def lines() -> AsyncIterator[bytes]:
            k, p = kind, payload
            while True:
                if k == "item":
                    if keep(p):
                        yield _ndjson(p)
                elif k == "done":
                    yield _ndjson(p)
                    return
                else:
                    yield _ndjson(_error_payload(self, path, p))
                    return
                k, p = await job.next()

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    async def blob(self, request: Request) -> Response:
        from llmedge.server import manage

        digest = request.path_params["digest"]
        try:
            if request.method == "HEAD":
                return Response(status_code=200 if manage.has_blob(digest) else 404)
            created = await manage.receive_blob(digest, request.stream())
        except StoreError as e:
            raise HTTPError(400, str(e)) from None
        return Response(status_code=201 if created else 200)

    def embed_job(self, key: str, path: Path, inputs: list[Any], truncate: bool, num_ctx: int | None,
                  keep_alive: Any) -> Job:
        def work(job: Job, loaded: Loaded | None) -> dict[str, Any]:
            assert loaded is not None
            out, n_tokens = [], 0
            for text in inputs:
                job.check()
                vec, n = embed_text(loaded.model, text, truncate)
                out.append(vec)
                n_tokens += n
            self.sched.stats["prompt_tokens"] += n_tokens
            return {"embeddings": out, "n_tokens": n_tokens, "load_duration": job.load_duration,
                    "total_duration": time.perf_counter_ns() - job.t_arrival}

        return self.submit(work, key, path, num_ctx, keep_alive)

    async def embed(self, request: Request) -> Response:
        body = await self.body(request)
        name, key, path = self.model_of(body)
        legacy = request.url.path == "/api/embeddings"
        raw = body.get("prompt") if legacy else body.get("input")
        inputs = [raw] if isinstance(raw, str) else raw
        if not isinstance(inputs, list) or not all(isinstance(t, str) for t in inputs) or (
                not legacy and not inputs):
            raise HTTPError(400, "input must be a string or a non-empty array of strings")
        opts = ol.parse_options(body.get("options"))
        job = self.embed_job(key, path, inputs, self.flag(body, "truncate", True),
                             self.sched.check_ctx(opts["num_ctx"]), ol.parse_keep_alive(body.get("keep_alive")))
        _, r = await self.collect(request, job)
        if legacy:
            return JSONResponse({"embedding": r["embeddings"][0] if r["embeddings"] else []})
        return JSONResponse({"model": name, "embeddings": r["embeddings"], "total_duration": r["total_duration"],
                             "load_duration": r["load_duration"], "prompt_eval_count": r["n_tokens"]})

    # -- OpenAI ----------------------------------------------------------------------------------
    async def v1_embeddings(self, request: Request) -> Response:
        import base64

        import numpy as np

        body = await self.body(request)
        name, key, path = self.model_of(body)
        raw = body.get("input")
        if isinstance(raw, str):
            inputs: list[Any] = [raw]
        elif isinstance(raw, list) and raw and all(isinstance(t, int) and not isinstance(t, bool) for t in raw):
            inputs = [raw]
        elif isinstance(raw, list) and raw and all(
                isinstance(t, str) or (isinstance(t, list) and t and all(
                    isinstance(i, int) and not isinstance(i, bool) for i in t)) for t in raw):
            inputs = raw
        else:
            raise HTTPError(400, "input must be a string, an array of strings, or token ids")
        fmt = body.get("encoding_format") or "float"
        if fmt not in ("float", "base64"):
            raise HTTPError(400, "encoding_format must be 'float' or 'base64'")
        dims = body.get("dimensions")
        if dims is not None:
            dims = int(ol.number(dims, "dimensions", int))
            if dims <= 0:
                raise HTTPError(400, "dimensions must be positive")
        _, r = await self.collect(request, self.embed_job(key, path, inputs, True, None, "default"))
        data = []
        for i, vec in enumerate(r["embeddings"]):
            v = np.asarray(vec, dtype=np.float32)
            if dims is not None and dims < len(v):
                v = v[:dims]
                v = v / max(float(np.linalg.norm(v)), 1e-12)
            emb: Any = base64.b64encode(v.astype("<f4").tobytes()).decode() if fmt == "base64" else v.tolist()
            data.append({"object": "embedding", "embedding": emb, "index": i})
        return JSONResponse({"object": "list", "data": data, "model": name,
                             "usage": {"prompt_tokens": r["n_tokens"], "total_tokens": r["n_tokens"]}})

    async def v1_models(self, request: Request) -> Response:
        from llmedge.store import Store

        entries = await asyncio.to_thread(lambda: Store().list())
        return JSONResponse({"object": "list",
                             "data": [oa.model_object(e.name, e.modified.timestamp()) for e in entries]})

    async def v1_model(self, request: Request) -> Response:
        name = request.path_params["model"]
        _, path = self.sched.resolve(name)
        return JSONResponse(oa.model_object(name, path.stat().st_mtime))

    async def v1_chat(self, request: Request) -> Response:
        body = await self.body(request)
        name, key, path = self.model_of(body)
        messages = oa.parse_messages(body.get("messages"))
        if body.get("tools"):
            raise HTTPError(400, f"'{name}' does not support tools")
        p = oa.parse_sampling(body)
        grammar = self.grammar_of(oa.response_schema(body.get("response_format")))
        stream = self.flag(body, "stream", False)
        logprobs = self.flag(body, "logprobs", False)
        top = self.top_logprobs(body)
        include_usage = isinstance(body.get("stream_options"), dict) and bool(
            body["stream_options"].get("include_usage"))
        spec = GenSpec(lambda model: model.template.encode(with_defaults(model.defaults, messages)), p["sampling"], p["max_tokens"], p["stop"],
                       keep_from=messages, grammar=grammar, logprobs=logprobs, top_logprobs=top)
        job = self.submit(None, key, path, task=GenerationTask(spec, self.sched.stats))
        cid, created = oa.new_id("chatcmpl"), int(time.time())
        if not stream:
            items, r = await self.collect(request, job)
            choice = {"index": 0, "message": {"role": "assistant", "content": "".join(items)},
                      "logprobs": oa.chat_logprobs(r["records"], r["piece"]) if logprobs else None,
                      "finish_reason": oa.finish_reason(r["done_reason"])}
            return JSONResponse({"id": cid, "object": "chat.completion", "created": created, "model": name,
                                 "system_fingerprint": "fp_llmedge", "choices": [choice],
                                 "usage": oa.usage(r["n_prompt"], r["eval_count"])})

        def first() -> list[dict[str, Any]]:
            return [oa.chat_chunk(cid, name, created, {"role": "assistant", "content": ""}, None)]

        def item(text: str) -> list[dict[str, Any]]:
            return [oa.chat_chunk(cid, name, created, {"content": text}, None)]

        def final(r: dict[str, Any]) -> list[dict[str, Any]]:
            lp = oa.chat_logprobs(r["records"], r["piece"]) if logprobs else None
            out = [oa.chat_chunk(cid, name, created, {}, oa.finish_reason(r["done_reason"]), lp)]
            if include_usage:
                out.append({"id": cid, "object": "chat.completion.chunk", "created": created, "model": name,
                            "system_fingerprint": "fp_llmedge", "choices": [],
                            "usage": oa.usage(r["n_prompt"], r["eval_count"])})
            return out

        return await self.respond_sse(request, job, first, item, final)

    async def v1_completions(self, request: Request) -> Response:
        body = await self.body(request)
        name, key, path = self.model_of(body)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]
        if isinstance(prompt, list):
            if not prompt or any(isinstance(t, bool) or not isinstance(t, int) for t in prompt):
                raise HTTPError(400, "prompt must be a string, a list of one string, or a list of token ids")
        elif not isinstance(prompt, str):
            raise HTTPError(400, "prompt must be a string or a list of token ids")
        if body.get("suffix"):
            raise HTTPError(400, f"'{name}' does not support suffix")
        p = oa.parse_sampling(body)
        echo = self.flag(body, "echo", False)
        lp = body.get("logprobs")
        top = 0 if lp is None else int(ol.number(lp, "logprobs", int))
        if not 0 <= top <= 20:
            raise HTTPError(400, "logprobs must be between 0 and 20")
        stream = self.flag(body, "stream", False)
        include_usage = isinstance(body.get("stream_options"), dict) and bool(
            body["stream_options"].get("include_usage"))
        grammar = self.grammar_of(oa.response_schema(body.get("response_format")))

        def build(model: Any) -> list[int]:
            if isinstance(prompt, list):
                return list(prompt)
            return model.tokenize(prompt, add_bos=True, special=True) if prompt else [model.tokenizer.bos_id or 0]

        spec = GenSpec(build, p["sampling"], p["max_tokens"], p["stop"], grammar=grammar,
                       logprobs=lp is not None, top_logprobs=top, default_max_tokens=16)
        job = self.submit(None, key, path, task=GenerationTask(spec, self.sched.stats))
        cid, created = oa.new_id("cmpl"), int(time.time())
        prefix = prompt if echo and isinstance(prompt, str) else ""
        if not stream:
            items, r = await self.collect(request, job)
            choice = {"index": 0, "text": prefix + "".join(items),
                      "logprobs": oa.completion_logprobs(r["records"], r["piece"]) if lp is not None else None,
                      "finish_reason": oa.finish_reason(r["done_reason"])}
            return JSONResponse({"id": cid, "object": "text_completion", "created": created, "model": name,
                                 "system_fingerprint": "fp_llmedge", "choices": [choice],
                                 "usage": oa.usage(r["n_prompt"], r["eval_count"])})

        def first() -> list[dict[str, Any]]:
            return [oa.completion_chunk(cid, name, created, prefix, None)] if prefix else []

        def item(text: str) -> list[dict[str, Any]]:
            return [oa.completion_chunk(cid, name, created, text, None)]

        def final(r: dict[str, Any]) -> list[dict[str, Any]]:
            out = [oa.completion_chunk(cid, name, created, "", oa.finish_reason(r["done_reason"]))]
            if include_usage:
                out.append({"id": cid, "object": "text_completion", "created": created, "model": name,
                            "choices": [], "usage": oa.usage(r["n_prompt"], r["eval_count"])})
            return out

        return await self.respond_sse(request, job, first, item, final)

    async def respond_sse(self, request: Request, job: Job, first: Callable[[], list[Any]],
                          item: Callable[[str], list[Any]], final: Callable[[Any], list[Any]]) -> Response:
        kind, payload = await self.wait(request, job)
        if kind == "error":
            raise payload
        path = request.url.path

        async def events() -> AsyncIterator[bytes]:
            k, p = kind, payload
            try:
                for ev in first():
                    yield _sse(ev)
                while True:
                    if k == "item":
                        for ev in item(p):
                            yield _sse(ev)
                    elif k == "done":
                        for ev in final(p):
                            yield _sse(ev)
                        break
                    else:
                        yield _sse(_error_payload(self, path, p))
                        break
                    k, p = await job.next()
                yield b"data: [DONE]\n\n"
            finally:
                job.cancelled.set()

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"cache-control": "no-cache"})

    # -- wiring ----------------------------------------------------------------------------------
    def routes(self) -> list[Route]:
        h = self.handler
        return [
            Route("/", h(self.root), methods=["GET", "HEAD"]),
            Route("/health", h(self.health), methods=["GET"]),
            Route("/metrics", h(self.metrics_route), methods=["GET"]),
            Route("/api/version", h(self.version), methods=["GET"]),
            Route("/api/generate", h(self.generate), methods=["POST"]),
            Route("/api/chat", h(self.chat), methods=["POST"]),
            Route("/api/embed", h(self.embed), methods=["POST"]),
            Route("/api/embeddings", h(self.embed), methods=["POST"]),
            Route("/v1/embeddings", h(self.v1_embeddings), methods=["POST"]),
            Route("/api/tags", h(self.tags), methods=["GET"]),
            Route("/api/show", h(self.show), methods=["POST"]),
            Route("/api/ps", h(self.ps), methods=["GET"]),
            Route("/api/pull", h(self.pull), methods=["POST"]),
            Route("/api/delete", h(self.delete), methods=["DELETE"]),
            Route("/api/copy", h(self.copy), methods=["POST"]),
            Route("/api/create", h(self.create), methods=["POST"]),
            Route("/api/blobs/{digest}", h(self.blob), methods=["HEAD", "POST"]),
            Route("/v1/models", h(self.v1_models), methods=["GET"]),
            Route("/v1/models/{model:path}", h(self.v1_model), methods=["GET"]),
            Route("/v1/chat/completions", h(self.v1_chat), methods=["POST"]),
            Route("/v1/completions", h(self.v1_completions), methods=["POST"]),
        ]


def _ndjson(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode("utf-8") + b"\n"


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode("utf-8") + b"\n\n"


def _error_payload(server: Server, path: str, e: BaseException) -> Any:
    resp = server.render_error(path, e)
    return json.loads(bytes(resp.body))


def create_app(config: ServerConfig | None = None) -> Any:
    """The ASGI application: Starlette routes inside the security middleware."""
    config = config or ServerConfig()
    server = Server(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        _ = server.sched  # start the engine worker
        yield
        if server.scheduler is not None:
            await asyncio.to_thread(server.scheduler.stop)
        if config.announce:
            import sys

            sys.stderr.write("llmedge: stopped\n")
            sys.stderr.flush()

    async def not_found(request: Request, exc: Exception) -> Response:
        return error_response(request.url.path, 404, f"{request.method} {request.url.path} not found")

    async def not_allowed(request: Request, exc: Exception) -> Response:
        return error_response(request.url.path, 405, f"method {request.method} not allowed")

    async def server_error(request: Request, exc: Exception) -> Response:
        return error_response(request.url.path, 500, f"internal error: {type(exc).__name__}")

    inner = Starlette(routes=server.routes(), lifespan=lifespan,
                      exception_handlers={404: not_found, 405: not_allowed, 500: server_error})
    inner.state.server = server
    app = SecurityMiddleware(inner, loopback=is_loopback_host(config.host), api_key=config.api_key,
                             origins=config.origins, max_body=config.max_body,
                             on_response=server.metrics.on_response)
    app.server = server  # type: ignore[attr-defined]
    return app


def server_speculation() -> dict[str, Any]:
    """Speculative decoding for every request (``llmedge serve --lookup / --draft-model ...``, passed
    as LLMEDGE_LOOKUP, LLMEDGE_DRAFT_MODEL, LLMEDGE_DRAFT_MAX, LLMEDGE_DRAFT_MIN); a request's
    ``options`` override the numbers."""
    out: dict[str, Any] = {}
    for key, env in (("lookup", "LLMEDGE_LOOKUP"), ("draft_max", "LLMEDGE_DRAFT_MAX"),
                     ("draft_min", "LLMEDGE_DRAFT_MIN")):
        value = os.environ.get(env, "").strip()
        if value:
            try:
                out[key] = int(value)
            except ValueError:
                raise LlmedgeError(f"{env} must be a whole number, not {value!r}") from None
    if os.environ.get("LLMEDGE_DRAFT_MODEL"):
        out["draft_model"] = os.environ["LLMEDGE_DRAFT_MODEL"]
    return out


def config_from_env(**overrides: Any) -> ServerConfig:
    """A ServerConfig from LLMEDGE_* variables, then explicit overrides (None means unset)."""
    from llmedge.server.scheduler import env_int
    from llmedge.server.security import env_origins

    c = ServerConfig()
    host = os.environ.get("LLMEDGE_HOST", "")
    if host:
        if host.startswith("http://"):
            host = host[len("http://"):]
        if host.startswith("[") and "]" in host:
            h, _, port = host[1:].partition("]")
            c.host = h
            if port.startswith(":"):
                c.port = int(port[1:])
        elif host.count(":") == 1:
            h, port = host.split(":")
            c.host, c.port = h or c.host, int(port)
        else:
            c.host = host
    c.parallel = env_int("LLMEDGE_NUM_PARALLEL", c.parallel)
    c.max_queue = env_int("LLMEDGE_MAX_QUEUE", c.max_queue)
    c.num_ctx = env_int("LLMEDGE_CONTEXT_LENGTH", c.num_ctx)
    c.max_ctx = env_int("LLMEDGE_MAX_CTX", c.max_ctx)
    c.max_body = env_int("LLMEDGE_MAX_BODY", c.max_body)
    c.max_loaded = env_int("LLMEDGE_MAX_LOADED_MODELS", c.max_loaded)
    ka = os.environ.get("LLMEDGE_KEEP_ALIVE")
    if ka:
        try:
            parsed = ol.parse_keep_alive(ka)
        except HTTPError as e:
            raise LlmedgeError(f"LLMEDGE_KEEP_ALIVE: {e.message}") from None
        c.keep_alive = None if parsed is None else float(parsed)  # type: ignore[arg-type]
    c.api_key = os.environ.get("LLMEDGE_API_KEY") or None
    c.origins = env_origins()
    for k, v in overrides.items():
        if v is not None:
            setattr(c, k, v)
    return c
