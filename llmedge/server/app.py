"""The Starlette application: the route table and its endpoints. Generation routes are one endpoint fed
a protocol's request parser and renderer (``generation.py``, ``stream.py``); model management, embeddings
and tokenization are jobs on the engine thread or a store thread. Any exception a route raises is
rendered by :func:`llmedge.server.errors.render` (a 4xx in the route's API shape for anything a client
can get wrong; no request produces a 500 or stops the server)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

import llmedge
from llmedge.errors import LlmedgeError, ModelNotFoundError, StoreError
from llmedge.server import errors, limits
from llmedge.server import ollama as ol
from llmedge.server import openai as oa
from llmedge.server.config import ServerConfig, config_from_env  # noqa: F401 - the server's entry points
from llmedge.server.embed import embed_text, is_embedding_model, parse_dimensions, shorten
from llmedge.server.errors import BadRequest, HTTPError, ModelNotFound, Unsupported
from llmedge.server.generation import GenerationRenderer, GenerationRequest, GenerationTask
from llmedge.server.gofmt import go_quote
from llmedge.server.metrics import Metrics
from llmedge.server.scheduler import Cancelled, Job, Loaded, Scheduler, ids_in_range
from llmedge.server.security import (
    BodyTooLarge,
    SecurityMiddleware,
    error_response,
    is_loopback_host,
    parse_json_body,
)
from llmedge.server.stream import StatusRenderer, collect, respond

FOREVER = "2318-11-26T00:00:00.000000000Z"  # what /api/ps shows for a model kept loaded forever


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

    @staticmethod
    def render_error(path: str, e: BaseException) -> Response:
        status, body, headers = errors.render(path, e)
        return JSONResponse(body, status_code=status, headers=headers)

    def handler(self, fn: Callable[[Request], Any]) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            try:
                return await fn(request)
            except Cancelled:
                return Response(status_code=499)
            except Exception as e:
                return self.render_error(request.url.path, e)

        return endpoint

    def describe(self, path: Path, verbose: bool = False) -> dict[str, Any]:
        key = f"{path}:{verbose}"
        if key not in self._describe_cache:
            if len(self._describe_cache) > 64:
                self._describe_cache.clear()
            self._describe_cache[key] = ol.describe_gguf(path, verbose)
        return self._describe_cache[key]

    # -- shared request parsing ------------------------------------------------------------------
    def model_of(self, body: dict[str, Any]) -> tuple[str, str, Path]:
        limits.check_request(body)
        name = body.get("model", body.get("name"))
        key, path = self.sched.resolve(name)
        return name, key, path

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

    async def generation(self, request: Request, parse: Callable[..., GenerationRequest],
                         renderer: Callable[[GenerationTask, dict[str, Any]], GenerationRenderer]) -> Response:
        """Every generation route: the protocol's parser makes the request, its renderer the answer."""
        body = await self.body(request)
        name, key, path = self.model_of(body)
        req = parse(body, name, key, path)
        self.check_generates(req)
        num_ctx = self.sched.check_ctx(req.num_ctx)
        task = GenerationTask(req, self.sched.stats, self.config.speculation)
        job = self.submit(None, key, path, num_ctx, req.keep_alive, task=task)
        return await respond(request, job, req.stream, renderer(task, body))

    def check_generates(self, req: GenerationRequest) -> None:
        """Refuse to generate with an embedding model, as Ollama does (routes.go GenerateHandler and
        ChatHandler: 400 ``"name" does not support generate`` / ``chat``; /v1/completions is generate,
        /v1/chat/completions chat). An unload (no prompt, keep_alive 0) is answered first, as there."""
        if req.keep_alive == 0 and not (req.messages if req.kind == "chat" else req.prompt):
            return
        info = self.describe(req.path)
        if is_embedding_model(info.get("model_info") or {}, info.get("family", "")):
            raise Unsupported(f"{go_quote(req.model)} does not support {'chat' if req.kind == 'chat' else 'generate'}")

    def route(self, parse: Callable[..., GenerationRequest],
              renderer: Callable[[GenerationTask, dict[str, Any]], GenerationRenderer]) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            return await self.generation(request, parse, renderer)

        return endpoint

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

        _, models = await collect(request, self.in_thread(work))
        return JSONResponse({"models": models})

    async def show(self, request: Request) -> Response:
        body = await self.body(request)
        name, key, path = self.model_of(body)

        verbose = ol.flag(body, "verbose", False)

        def work(job: Job, _: Any) -> dict[str, Any]:
            from llmedge.server.manage import show_fields

            info = self.describe(path, verbose)
            out = {
                **show_fields(name, path, info.get("template", "")),
                "details": ol.model_details(info),
                "model_info": info.get("model_info", {}),
                "capabilities": ol.capabilities(name, path, info),
                "modified_at": ol.rfc3339(path.stat().st_mtime),
            }
            if verbose:
                out["tensors"] = info["tensors"]
            return out

        _, out = await collect(request, self.in_thread(work))
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
            raise BadRequest("model is required")
        stream = ol.flag(body, "stream", True)

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

        insecure = ol.flag(body, "insecure", False)
        return await self.status_stream(request, self.in_thread(work), stream,
                                        keep=lambda event: event.get("status") != "success")

    async def delete(self, request: Request) -> Response:
        from llmedge.store import Store, normalize_name

        body = await self.body(request)
        name = body.get("model", body.get("name"))
        if not isinstance(name, str) or not name:
            raise BadRequest("model is required")
        try:
            Store().remove(name)
        except ModelNotFoundError:
            raise ModelNotFound(name) from None
        with contextlib.suppress(StoreError):
            self.sched._unload(normalize_name(name))
        return Response(status_code=200)

    async def copy(self, request: Request) -> Response:
        from llmedge.store import Store

        body = await self.body(request)
        src, dst = body.get("source"), body.get("destination")
        if not isinstance(src, str) or not isinstance(dst, str) or not src or not dst:
            raise BadRequest("source and destination are required")
        try:
            Store().copy(src, dst)
        except ModelNotFoundError:
            raise ModelNotFound(src) from None
        except StoreError as e:
            raise BadRequest(str(e)) from None
        return Response(status_code=200)

    async def create(self, request: Request) -> Response:
        from llmedge.server import manage
        from llmedge.store import normalize_name

        body = await self.body(request)
        stream = ol.flag(body, "stream", True)
        insecure = ol.flag(body, "insecure", False)

        def work(job: Job, _: Any) -> dict[str, Any]:
            manage.create(body, lambda status: job.emit({"status": status}), insecure)
            with contextlib.suppress(LlmedgeError):
                self.sched._unload(normalize_name(body.get("model", body.get("name"))))
            return {"status": "success"}

        return await self.status_stream(request, self.in_thread(work), stream)

    async def status_stream(self, request: Request, job: Job, stream: bool,
                            keep: Callable[[dict[str, Any]], bool] | None = None) -> Response:
        """A model-management job's answer: its result, or its status events then the result (pull, create)."""
        return await respond(request, job, stream, StatusRenderer(keep))

    async def blob(self, request: Request) -> Response:
        from llmedge.server import manage

        digest = request.path_params["digest"]
        try:
            if request.method == "HEAD":
                return Response(status_code=200 if manage.has_blob(digest) else 404)
            created = await manage.receive_blob(digest, request.stream())
        except StoreError as e:
            raise BadRequest(str(e)) from None
        return Response(status_code=201 if created else 200)

    def embed_job(self, key: str, path: Path, inputs: list[Any], truncate: bool, num_ctx: int | None,
                  keep_alive: Any, dims: int | None = None) -> Job:
        def work(job: Job, loaded: Loaded | None) -> dict[str, Any]:
            assert loaded is not None
            out, n_tokens = [], 0
            for text in inputs:  # each alone, in a fresh cache: a batch equals its inputs embedded one by one
                job.check()
                vec, n = embed_text(loaded.model, text, truncate)
                out.append(shorten(vec, dims))
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
            raise BadRequest("input must be a string or a non-empty array of strings")
        opts = ol.parse_options(body.get("options"))
        job = self.embed_job(key, path, inputs, ol.flag(body, "truncate", True),
                             self.sched.check_ctx(opts["num_ctx"]), ol.parse_keep_alive(body.get("keep_alive")),
                             parse_dimensions(body.get("dimensions")))
        _, r = await collect(request, job)
        if legacy:
            return JSONResponse({"embedding": r["embeddings"][0] if r["embeddings"] else []})
        return JSONResponse({"model": name, "embeddings": r["embeddings"], "total_duration": r["total_duration"],
                             "load_duration": r["load_duration"], "prompt_eval_count": r["n_tokens"]})

    async def tokenize(self, request: Request) -> Response:
        """``{"model", "content"}`` -> ``{"tokens"}``: the ids the model reads (special tokens parsed, no BOS
        unless ``add_special``), as llama.cpp's /tokenize."""
        body = await self.body(request)
        name, key, path = self.model_of(body)
        text = body.get("content", body.get("text", body.get("prompt")))
        if not isinstance(text, str):
            raise BadRequest("content must be a string")
        add_special = ol.flag(body, "add_special", False)

        ids = await self.with_model(request, body, key, path,
                                    lambda model: model.tokenize(text, add_bos=add_special, special=True))
        return JSONResponse({"model": name, "tokens": ids})

    async def detokenize(self, request: Request) -> Response:
        """``{"model", "tokens"}`` -> ``{"content"}``: the text of token ids."""
        body = await self.body(request)
        name, key, path = self.model_of(body)
        ids = body.get("tokens")
        if not isinstance(ids, list) or any(isinstance(t, bool) or not isinstance(t, int) for t in ids):
            raise BadRequest("tokens must be an array of token ids")
        limits.check_request({"context": ids})

        def text(model: Any) -> str:
            ids_in_range(ids, model.params.n_vocab)
            return model.detokenize(ids)

        return JSONResponse({"model": name, "content": await self.with_model(request, body, key, path, text)})

    async def with_model(self, request: Request, body: dict[str, Any], key: str, path: Path,
                         fn: Callable[[Any], Any]) -> Any:
        """``fn(model)`` on the engine thread between two steps, the model loaded (keep_alive honoured)."""
        def work(job: Job, loaded: Loaded | None) -> Any:
            assert loaded is not None
            return fn(loaded.model)

        _, out = await collect(request, self.submit(work, key, path, None, ol.parse_keep_alive(body.get("keep_alive"))))
        return out

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
            raise BadRequest("input must be a string, an array of strings, or token ids")
        fmt = body.get("encoding_format") or "float"
        if fmt not in ("float", "base64"):
            raise BadRequest("encoding_format must be 'float' or 'base64'")
        dims = parse_dimensions(body.get("dimensions"))
        _, r = await collect(request, self.embed_job(key, path, inputs, True, None, "default", dims))
        data = []
        for i, vec in enumerate(r["embeddings"]):
            v = np.asarray(vec, dtype=np.float32)
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

    # -- wiring ----------------------------------------------------------------------------------
    def routes(self) -> list[Route]:
        get, post = ["GET"], ["POST"]
        table: list[tuple[str, Callable[[Request], Any], list[str]]] = [
            ("/", self.root, ["GET", "HEAD"]), ("/health", self.health, get), ("/metrics", self.metrics_route, get),
            ("/api/version", self.version, get),
            ("/api/generate", self.route(ol.generate_request, ol.GenerateRenderer), post),
            ("/api/chat", self.route(ol.chat_request, ol.ChatRenderer), post),
            ("/api/embed", self.embed, post), ("/api/embeddings", self.embed, post),
            ("/api/tokenize", self.tokenize, post), ("/api/detokenize", self.detokenize, post),
            ("/api/tags", self.tags, get), ("/api/show", self.show, post), ("/api/ps", self.ps, get),
            ("/api/pull", self.pull, post), ("/api/delete", self.delete, ["DELETE"]),
            ("/api/copy", self.copy, post), ("/api/create", self.create, post),
            ("/api/blobs/{digest}", self.blob, ["HEAD", "POST"]),
            ("/v1/embeddings", self.v1_embeddings, post), ("/v1/models", self.v1_models, get),
            ("/v1/models/{model:path}", self.v1_model, get),
            ("/v1/chat/completions", self.route(oa.chat_request, oa.ChatRenderer), post),
            ("/v1/completions", self.route(oa.completion_request, oa.CompletionRenderer), post),
        ]
        return [Route(path, self.handler(fn), methods=methods) for path, fn, methods in table]


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
