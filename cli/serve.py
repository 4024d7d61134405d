"""``llmedge serve``: run the Ollama- and OpenAI-compatible REST server (uvicorn, graceful shutdown), with
``--parallel`` sequence slots per model batched by the engine thread and a bounded queue behind them."""

from __future__ import annotations

from typing import Annotated

import typer

from llmedge.cli.options import BackendOpt, DraftMaxOpt, DraftMinOpt, DraftModelOpt, LookupOpt, Threads


def serve(
    host: Annotated[str | None, typer.Option("--host", help="Address to bind (LLMEDGE_HOST; 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option("--port", help="Port (default 11434).")] = None,
    parallel: Annotated[int | None, typer.Option("--parallel", help="Sequence slots per model, decoded together "
                                                                    "in one batched forward "
                                                                    "(LLMEDGE_NUM_PARALLEL; 4).")] = None,
    max_queue: Annotated[int | None, typer.Option("--max-queue", help="Waiting requests before 503 "
                                                                      "(LLMEDGE_MAX_QUEUE; 64).")] = None,
    insecure: Annotated[bool, typer.Option("--insecure", help="Allow a non-loopback bind without "
                                                              "LLMEDGE_API_KEY.")] = False,
    backend: BackendOpt = "auto",
    threads: Threads = None,
    draft_model: DraftModelOpt = None,
    draft_max: DraftMaxOpt = None,
    draft_min: DraftMinOpt = None,
    lookup: LookupOpt = None,
) -> None:
    """Serve Ollama's API (/api/...) and OpenAI's (/v1/...) on 127.0.0.1:11434."""
    import uvicorn

    from llmedge.errors import LlmedgeError
    from llmedge.server.app import config_from_env, create_app
    from llmedge.server.security import is_loopback_host

    config = config_from_env(host=host, port=port, parallel=parallel, max_queue=max_queue, backend=backend,
                             n_threads=threads, announce=True)
    if not is_loopback_host(config.host) and not config.api_key and not insecure:
        raise LlmedgeError(f"refusing to listen on {config.host} without LLMEDGE_API_KEY; set a key or pass "
                           "--insecure")
    if config.parallel < 1 or config.parallel > 256:
        raise LlmedgeError(f"--parallel / LLMEDGE_NUM_PARALLEL must be between 1 and 256, not {config.parallel}")
    if config.max_queue < 0:
        raise LlmedgeError(f"--max-queue / LLMEDGE_MAX_QUEUE must not be negative, not {config.max_queue}")
    if not 0 < config.port < 65536:
        raise LlmedgeError(f"invalid port {config.port}")
    from llmedge.backends import choose_backend

    choose_backend(config.backend)  # an unknown or unavailable backend ends here, not in every request
    # speculative decoding for every request: the flags over LLMEDGE_LOOKUP, LLMEDGE_DRAFT_MODEL, ...
    config.speculation.update({k: v for k, v in (("draft_model", draft_model), ("draft_max", draft_max),
                                                 ("draft_min", draft_min), ("lookup", lookup)) if v is not None})
    app = create_app(config)
    typer.echo(f"llmedge serving on http://{config.host}:{config.port} (Ctrl+C to stop)", err=True)
    uvicorn.run(app, host=config.host, port=config.port, log_level="warning", timeout_graceful_shutdown=5,
                lifespan="on")
