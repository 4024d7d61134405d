"""The one generation path every protocol shares.

Ollama's ``/api/generate`` and ``/api/chat`` and OpenAI's ``/v1/completions`` and
``/v1/chat/completions`` are each parsed (``ollama.py``, ``openai.py``) into one typed
:class:`GenerationRequest`. :class:`GenerationTask` turns it into prompt ids and a sampler on the
engine thread once the model is loaded (chat template with ``tools`` and ``enable_thinking``, the
grammar of a forced tool call or a ``format``), and the finished sequence into a typed
:class:`GenerationResult`. On the way back, :class:`OutputParser` splits the generated text into typed
:class:`Delta` events (content, thinking, tool calls), which each protocol renders in its own shape.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmedge.defaults import generate_messages, request_options, with_defaults
from llmedge.reasoning import ThinkingSplitter, opens_thinking, supports_thinking, template_variables
from llmedge.sampling import SamplingOptions
from llmedge.server import tools as tl
from llmedge.server.config import SPECULATIVE_OPTIONS
from llmedge.server.errors import ContextTooLong, Unsupported
from llmedge.server.grammar import RequestSampler, compile_schema
from llmedge.server.scheduler import GenRequest, Job, Loaded, count_tokens, ids_in_range


@dataclass
class GenerationRequest:
    """A generation request, whatever protocol it came through."""

    model: str  # the name as the client wrote it
    key: str
    path: Path
    kind: str  # "chat" (messages through the template), "generate" (a prompt as one user turn), "raw"
    messages: list[dict[str, Any]] = field(default_factory=list)
    prompt: str | list[int] = ""
    system: str | None = None
    context: list[int] = field(default_factory=list)
    template: str | None = None  # /api/generate's own Go template, in place of the model's
    sampling: dict[str, Any] = field(default_factory=dict)
    max_tokens: int | None = None
    default_max_tokens: int | None = None  # when neither the request nor the model's num_predict says
    stop: tuple[str, ...] = ()
    num_keep: int | None = None
    num_ctx: int | None = None
    keep_alive: Any = "default"
    schema: Any = None  # format / response_format: a JSON schema (None: free text)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str = "auto"  # "auto", "none", "required", or "function" (then tool_name)
    tool_name: str | None = None
    parallel_tool_calls: bool = True
    think: bool | str | None = None  # None: the template's default, nothing split out
    logprobs: bool = False
    top_logprobs: int = 0
    stream: bool = True
    truncate: bool = True  # a prompt longer than the context is cut (Ollama); False: refused (OpenAI)

    @property
    def constrained(self) -> bool:
        return bool(self.tools) and self.tool_choice in ("required", "function")


@dataclass
class GenerationResult:
    """A finished generation: why it stopped, its counts and durations (ns), ids and log-probs."""

    done_reason: str
    total_duration: int
    load_duration: int
    prompt_eval_count: int = 0  # the whole prompt as evaluated (cut to the context), cached prefix included
    prompt_cached: int = 0  # of which reused from a cache, not evaluated (OpenAI's cached_tokens)
    prompt_eval_duration: int = 0
    eval_count: int = 0
    eval_duration: int = 0
    ids: list[int] = field(default_factory=list)
    out_ids: list[int] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    piece: Any = None  # token id -> bytes
    # draft_tokens, draft_accepted, draft_batched_steps (llmedge's)
    speculative: dict[str, int] = field(default_factory=dict)

    @property
    def n_prompt(self) -> int:
        return len(self.ids)


@dataclass
class Delta:
    """A piece of the reply: text, reasoning, and the tool calls completed in it."""

    content: str = ""
    thinking: str = ""
    tool_calls: list[tl.ToolCall] = field(default_factory=list)
    # a forced call's arguments as they stream: (call id, its name on the first fragment, text)
    fragments: list[tuple[str, str | None, str]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.thinking or self.tool_calls or self.fragments)

    def merge(self, other: Delta) -> None:
        self.content += other.content
        self.thinking += other.thinking
        self.tool_calls += other.tool_calls
        self.fragments += other.fragments


class GenerationTask:
    """A :class:`GenerationRequest` for the engine thread (:class:`~llmedge.server.scheduler.GenTask`)."""

    def __init__(self, req: GenerationRequest, stats: dict[str, int],
                 speculation: dict[str, Any] | None = None) -> None:
        self.req = req
        self.stats = stats
        self.speculation = speculation or {}  # the server's (ServerConfig.speculation)
        self.starts_thinking = False  # the prompt ends inside an open <think> (set by prepare)
        self.tools_shown = False

    # -- the prompt --------------------------------------------------------------------------------
    def _messages(self, model: Any) -> list[dict[str, Any]]:
        req = self.req
        messages = with_defaults(model.defaults, req.messages)
        # a constrained call on a template without tools: the tools described in a system message (never
        # with tool_choice none, which offers the model no tools at all)
        if req.constrained and not self.tools_shown:
            messages = [{"role": "system", "content": tl.tools_system_text(req.tools)}, *messages]
        return messages

    def _template_extra(self, model: Any) -> dict[str, Any]:
        req = self.req
        if req.think is None:
            return {}
        if not supports_thinking(model.template):
            raise Unsupported(f"\"{req.model}\" does not support thinking")
        return template_variables(req.think)

    def prompt_ids(self, model: Any) -> list[int]:
        req = self.req
        if req.kind == "raw":
            if isinstance(req.prompt, list):
                return list(req.prompt)
            return model.tokenize(req.prompt, add_bos=not req.context, special=True) if req.prompt else []
        if req.tools and req.tool_choice != "none":
            self.tools_shown = tl.supports_tools(model.template)
            if not self.tools_shown and not req.constrained:
                raise Unsupported(f"{req.model} does not support tools")
        extra = self._template_extra(model)
        if req.kind == "chat":
            if not req.messages:
                return []
            text = model.template.render_reply(self._messages(model), req.tools if self.tools_shown else None,
                                               **extra)
        else:
            if not req.prompt:
                return []
            template = model.template
            if req.template:
                from llmedge.gotemplate import GoChatTemplate

                template = GoChatTemplate(req.template, bos_token=template.bos_token, eos_token=template.eos_token,
                                          tokenizer=model.tokenizer, name="request")
            text = template.render(generate_messages(model.defaults, str(req.prompt), req.system, not req.context),
                                   True, None, **extra)
        self.starts_thinking = bool(req.think) and opens_thinking(text)
        ids = model.template.prompt_ids(text)
        if req.context and ids and ids[0] == model.tokenizer.bos_id:
            ids = ids[1:]
        return list(req.context) + ids

    def _grammar(self) -> str | None:
        req = self.req
        if req.constrained:
            assert req.tools is not None
            return compile_schema(tl.call_schema(req.tools, req.tool_name))
        if req.schema is None:
            return None
        return compile_schema(req.schema)

    # -- the scheduler's GenTask -------------------------------------------------------------------
    def _result(self, job: Job, model: Any, ids: list[int], **fields: Any) -> GenerationResult:
        return GenerationResult(load_duration=job.load_duration, ids=ids, piece=model.tokenizer.token_to_piece,
                                total_duration=time.perf_counter_ns() - job.t_arrival, **fields)

    def prepare(self, job: Job, loaded: Loaded) -> GenRequest | GenerationResult:
        req, model = self.req, loaded.model
        ids = self.prompt_ids(model)
        ids_in_range(ids, model.params.n_vocab)
        if not req.truncate and len(ids) >= model.n_ctx:  # no room left to answer without cutting the prompt
            what = "messages" if req.kind == "chat" else "prompt"
            raise ContextTooLong(f"This model's maximum context length is {model.n_ctx} tokens, but the {what} "
                                 f"resulted in {len(ids)} tokens (the prompt must be shorter than the context, "
                                 f"leaving room for the reply); reduce the length of the {what}", param=what)
        if not ids:
            return self._result(job, model, ids, done_reason="unload" if job.keep_alive == 0 else "load")
        sampling, max_tokens, stop, n_keep = request_options(model.defaults, req.sampling, req.max_tokens,
                                                             req.stop, req.num_keep)
        speculative = {**self.speculation,
                       **{k: sampling.pop(k) for k in SPECULATIVE_OPTIONS if k in sampling}}
        sampler = RequestSampler(SamplingOptions(**sampling), model.tokenizer, self._grammar(),
                                 req.logprobs, req.top_logprobs)
        if n_keep is None and req.kind == "chat":
            n_keep = model.system_keep(with_defaults(model.defaults, req.messages), ids)
        if max_tokens is None:
            max_tokens = req.default_max_tokens
        max_tokens = max_tokens if max_tokens is not None and max_tokens >= 0 else -1  # the engine stops at
        # ten contexts, as Ollama does (a shifting context otherwise never ends a text that never ends)
        return GenRequest(ids, sampler, max_tokens, stop, n_keep, spec=model.spec_config(**speculative),
                          shift=req.truncate)

    def result(self, job: Job, loaded: Loaded, request: GenRequest, gen: Any, out_ids: list[int]
               ) -> GenerationResult:
        t = gen.timings
        count_tokens(self.stats, t.prompt_eval_count, t.eval_count, t.prompt_eval_duration, t.eval_duration)
        # draft_batched_steps: decode steps that did not speculate because other sequences shared them
        speculative = {k: int(t.extra[k]) for k in ("draft_tokens", "draft_accepted", "draft_batched_steps")
                       if k in t.extra}
        for k, v in speculative.items():
            self.stats[k] = self.stats.get(k, 0) + v
        # Ollama's prompt_eval_count: the whole prompt (as cut to the context), its cached prefix included;
        # t.prompt_eval_count (the tokens evaluated, what the metrics count) leaves the cached prefix out
        cached = int(t.extra.get("prompt_cached", 0))
        return self._result(job, loaded.model, request.ids, done_reason=t.done_reason or "stop",
                            prompt_eval_count=t.prompt_eval_count + cached, prompt_cached=cached,
                            prompt_eval_duration=t.prompt_eval_duration,
                            eval_count=t.eval_count, eval_duration=t.eval_duration, out_ids=out_ids,
                            records=request.sampler.records, speculative=speculative)

    def parser(self) -> OutputParser:
        req = self.req
        tools = None
        if req.tools and req.tool_choice != "none":
            tools = tl.ToolCallStream(tl.tool_names(req.tools), constrained=req.constrained)
        return OutputParser(bool(req.think), self.starts_thinking, tools, req.parallel_tool_calls)


class OutputParser:
    """Generated text -> :class:`Delta` events: reasoning between ``<think>`` tags (when thinking was
    asked for), tool calls (when tools were given), the rest as content."""

    def __init__(self, think: bool, in_think: bool, tools: tl.ToolCallStream | None, parallel: bool = True
                 ) -> None:
        self.thinking = ThinkingSplitter(in_think) if think else None
        self.tools = tools
        self.parallel = parallel
        self.n_calls = 0

    def _calls(self, calls: list[tl.ToolCall]) -> list[tl.ToolCall]:
        if not self.parallel:
            calls = calls[:max(0, 1 - self.n_calls)]
        self.n_calls += len(calls)
        return calls

    def feed(self, text: str, final: bool = False) -> Delta:
        thinking, content = self.thinking.feed(text, final) if self.thinking is not None else ("", text)
        d = Delta(thinking=thinking)
        if self.tools is None:
            d.content = content
            return d
        d.content, calls = self.tools.feed(content)
        if final:
            more, rest = self.tools.finish()
            d.content += more
            calls += rest
        d.tool_calls = self._calls(calls)
        d.fragments = self.tools.take_fragments()
        return d

    def finish(self) -> Delta:
        return self.feed("", final=True)


class GenerationRenderer:
    """A :class:`~llmedge.server.stream.Renderer` for generation jobs: the job's text through the
    task's :class:`OutputParser` into :class:`Delta` events; a protocol says how to write a delta
    (:meth:`delta`), the end of a stream (:meth:`done`) and a whole answer (:meth:`complete`)."""

    sse = False

    def __init__(self, task: GenerationTask, body: dict[str, Any] | None = None) -> None:
        self.task = task
        self.req = task.req
        self._parser: OutputParser | None = None
        self.n_calls = 0  # tool calls written so far

    @property
    def parser(self) -> OutputParser:
        if self._parser is None:  # after prepare ran: the prompt decides whether thinking is open
            self._parser = self.task.parser()
        return self._parser

    def opening(self) -> list[Any]:
        return []

    def item(self, payload: Any) -> list[Any]:
        d = self.parser.feed(payload)
        return self.delta(d) if d else []

    def final(self, result: GenerationResult) -> list[Any]:
        d = self.parser.finish()
        return (self.delta(d) if d else []) + self.done(result)

    def whole(self, items: list[Any], result: GenerationResult) -> Any:
        d = Delta()
        for text in items:
            d.merge(self.parser.feed(text))
        d.merge(self.parser.finish())
        return self.complete(d, result)

    def delta(self, d: Delta) -> list[Any]:
        raise NotImplementedError

    def done(self, result: GenerationResult) -> list[Any]:
        raise NotImplementedError

    def complete(self, d: Delta, result: GenerationResult) -> Any:
        raise NotImplementedError
