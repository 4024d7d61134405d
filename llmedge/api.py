"""The public Python API: ``llmedge.load`` and the :class:`Model` it returns."""

from __future__ import annotations

import numbers
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from llmedge.backends import choose_backend, make_backend
from llmedge.engine import DEFAULT_PREFIX_CACHE_BYTES, Chunk, Engine, Timings
from llmedge.errors import LlmedgeError
from llmedge.gguf import GGUFFile
from llmedge.kvcache import check_kv_type
from llmedge.modelcheck import check_model_file
from llmedge.models import model_class
from llmedge.sampling import OptionError, Sampler, SamplingOptions, _shown, check_int, check_real
from llmedge.speculative import DEFAULT_DRAFT_MAX, DEFAULT_LOOKUP_NGRAM, DEFAULT_P_MIN, DraftModel, SpecConfig
from llmedge.template import ChatTemplate
from llmedge.tokenizer import Tokenizer

_SAMPLING_FIELDS = set(SamplingOptions.__dataclass_fields__)
_LOAD_OPTIONS = {"num_ctx": "n_ctx", "num_thread": "n_threads"}  # Ollama options that are load arguments here
SPEC_FIELDS = ("draft_model", "lookup", "draft_max", "draft_min", "draft_p_min")  # speculative decoding


class Model:
    """A loaded GGUF model: tokenizer, chat template, forward pass and an engine to generate with."""

    def __init__(self, path: Path, backend: str = "auto", n_ctx: int = 4096, n_threads: int | None = None,
                 kv_type: str = "f16", n_batch: int = 512, name: str | None = None,
                 prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES) -> None:
        t0 = time.perf_counter_ns()
        n_ctx, n_threads = _check_load_args(n_ctx, n_threads)
        n_batch = check_int("n_batch", n_batch, 1, "tokens evaluated per forward")
        check_kv_type(kv_type)
        self.path = Path(path)
        self.name = name or self.path.name
        self.gguf = GGUFFile(self.path)
        check_model_file(self.gguf)
        self.backend_name, self.backend_reason = choose_backend(backend)
        self.backend = make_backend(self.backend_name, n_threads)
        self.tokenizer = Tokenizer.from_metadata(self.gguf.metadata)
        self.template = ChatTemplate.from_metadata(self.gguf.metadata, self.tokenizer)
        self.model = model_class(self.gguf.architecture)(self.gguf, self.backend)
        self.params = self.model.params
        if n_ctx <= 0:
            n_ctx = self.params.n_ctx_train
        if n_ctx < 8:
            raise OptionError(f"n_ctx {n_ctx} is too small: a context needs at least 8 tokens")
        self.n_ctx = min(n_ctx, self.params.n_ctx_train)
        self.engine = Engine(self.model, self.tokenizer, self.n_ctx, n_batch, kv_type,
                             load_duration=time.perf_counter_ns() - t0, prefix_cache_bytes=prefix_cache_bytes)
        self._digest: str | None = None
        self.defaults: dict[str, Any] = {}  # Modelfile / registry defaults (llmedge.defaults.apply)
        self.template_origin = self.template.name
        self.speculation: dict[str, Any] = {}  # default speculative options (``--lookup``, ``--draft-model``)
        self._drafts: dict[str, DraftModel] = {}

    # -- text <-> tokens -------------------------------------------------------------------------
    def tokenize(self, text: str, add_bos: bool = False, special: bool = False) -> list[int]:
        """Token ids of ``text``, identical to llama.cpp's (``llama_tokenize``): ``add_bos`` adds the
        model's BOS when its vocabulary asks for one (``add_special``); ``special`` parses special
        tokens written in the text (``<|im_start|>``) instead of tokenizing them as plain text."""
        return self.tokenizer.encode(text, add_bos=add_bos, special=special)

    def detokenize(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` (control tokens such as BOS/EOS render as nothing, as llama.cpp's
        detokenizer without ``special``)."""
        return self.tokenizer.decode(token_ids("ids", ids))

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        """The exact prompt string the model's chat template renders for ``messages`` (a list of
        ``{"role": ..., "content": ...}`` dicts), with the assistant's turn opened when
        ``add_generation_prompt``: the prompt :meth:`chat` answers. When the last message is the
        assistant's own text, that turn is left open instead, so the reply continues it (assistant
        prefill, as llama.cpp's server and llmedge's chat routes do)."""
        check_messages(messages)
        if add_generation_prompt:
            return self.template.render_reply(messages)
        return self.template.render(messages, add_generation_prompt=False)

    def prompt_ids(self, prompt: str | Sequence[int], raw: bool = False) -> list[int]:
        """Token ids for a prompt: a chat-templated user message unless ``raw`` or already ids."""
        if not isinstance(prompt, str):
            return token_ids("prompt", prompt, "a str or a sequence of integer token ids")
        if raw:
            return self.tokenize(prompt, add_bos=True, special=True)
        return self.template.encode(self._with_defaults([{"role": "user", "content": prompt}]))

    def _with_defaults(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if not self.defaults:
            return messages
        from llmedge.defaults import with_defaults

        return with_defaults(self.defaults, messages)

    # -- evaluation ------------------------------------------------------------------------------
    def embed(self, input: str | Sequence[str], truncate: bool = True,
              dimensions: int | None = None) -> list[float] | list[list[float]]:
        """The embedding of a text (a list of floats), or of each text of a list (a list of them): the
        mean over its tokens of the model's final normalized hidden states, L2-normalized (llama.cpp's
        mean pooling; what ``llmedge serve`` returns from /api/embed and /v1/embeddings). Each text is
        evaluated in a fresh context, leaving the model's conversation as it was. A text longer than the
        context is cut to it, or refused when ``truncate`` is False; ``dimensions`` keeps the first N
        components, normalized again."""
        from llmedge.embeddings import pooled, shorten, text_ids

        single = isinstance(input, str)
        texts = [input] if single else input
        if not isinstance(texts, Sequence) or isinstance(texts, bytes) or not all(isinstance(t, str) for t in texts):
            raise OptionError(f"input must be a str or a list of str, not {_shown(input)}")
        if not isinstance(truncate, bool):
            raise OptionError(f"truncate must be True or False, not {_shown(truncate)}")
        dims = check_int("dimensions", dimensions, 1, "components kept", none_ok=True)
        out = []
        for i, text in enumerate(texts):
            ids = text_ids(self, text)
            if len(ids) > self.n_ctx:
                if not truncate:
                    which = "input" if single else f"input[{i}]"
                    raise OptionError(f"{which} has {len(ids)} tokens, more than the context of {self.n_ctx} "
                                      "(truncate=True cuts it to fit)")
                ids = ids[: self.n_ctx]
            out.append(shorten(pooled(self, ids), dims))
        return out[0] if single else out

    def logits(self, ids: Sequence[int], first_row: int = 0) -> np.ndarray:
        """float32 [len(ids) - first_row, n_vocab]: the logits at every position from ``first_row``
        on (default: all), in a fresh context. The earlier positions are evaluated but skip the
        output head, which is most of a prompt's work on large vocabularies (perplexity scores only
        the second half of each chunk)."""
        first_row = check_int("first_row", first_row, 0)
        return self.engine.logits(token_ids("ids", ids), first_row=first_row)

    def generate(self, prompt: str | Sequence[int], raw: bool = False, max_tokens: int = 128,
                 stop: Sequence[str] = (), shift: bool = True, **options: Any) -> Iterator[Chunk]:
        """Stream :class:`Chunk` s; options are Ollama's names (temperature, top_k, seed, ...).

        A full context is shifted: the first ``num_keep`` tokens (alias ``n_keep``; default: the
        system prompt of a chat, else BOS) stay, half of the rest is dropped. ``shift=False`` stops
        with done_reason ``length`` instead.
        """
        if self.defaults:
            from llmedge.defaults import generation_options

            given = set(options) | ({"stop"} if stop else set())
            options = {**{k: v for k, v in generation_options(self.defaults).items() if k not in given}, **options}
            if "stop" in options:
                stop = options.pop("stop")
        max_name = "max_tokens"
        if "num_predict" in options:
            max_name, max_tokens = "num_predict", options.pop("num_predict")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, numbers.Integral):
            raise OptionError(f"{max_name} must be an integer (negative: no limit), not {_shown(max_tokens)}")
        keep_name, n_keep = "num_keep", options.pop("num_keep", None)
        if "n_keep" in options:
            keep_name, n_keep = "n_keep", options.pop("n_keep")
        n_keep = check_int(keep_name, n_keep, -1, "tokens kept when the context shifts; -1 or None: the "
                           "default", none_ok=True)
        spec_given = {k: options.pop(k) for k in SPEC_FIELDS if k in options}
        unknown = set(options) - _SAMPLING_FIELDS
        if unknown:
            hints = [f"{o} is set at load: llmedge.load(..., {_LOAD_OPTIONS[o]}=)" for o in sorted(unknown)
                     if o in _LOAD_OPTIONS]
            raise OptionError(f"unknown generation option(s): {', '.join(sorted(unknown))}"
                              + (f" ({'; '.join(hints)})" if hints else ""))
        spec = self.spec_config(**{**self.speculation, **spec_given})
        sampler = Sampler(SamplingOptions(**options))
        return self.engine.generate(self.prompt_ids(prompt, raw), sampler, int(max_tokens), stop_strings(stop),
                                    shift=shift, n_keep=n_keep, spec=spec)

    def spec_config(self, draft_model: Any = None, lookup: int | bool | None = None,
                    draft_max: int | None = None, draft_min: int | None = None,
                    draft_p_min: float | None = None) -> SpecConfig | None:
        """Speculative decoding options as the engine takes them (None: off). ``lookup``: prompt lookup
        decoding with n-grams up to that size (True: 3); ``draft_model``: a :class:`Model`, or a name
        or path loaded once with this model's backend and context (same vocabulary required)."""
        if lookup is True:
            n = DEFAULT_LOOKUP_NGRAM
        elif lookup is None or lookup is False:
            n = 0
        else:
            n = check_int("lookup", lookup, 0, "the n-gram size; True: 3; 0, False or None: off")
        if draft_max is not None:
            draft_max = check_int("draft_max", draft_max, 0)
        if draft_min is not None:
            draft_min = check_int("draft_min", draft_min, 0)
        if draft_p_min is not None:
            draft_p_min = check_real("draft_p_min", draft_p_min, 0.0, 1.0)
        draft = self.draft(draft_model) if draft_model else None
        if not n and draft is None:
            return None
        return SpecConfig(lookup=n, draft=draft,
                          draft_max=DEFAULT_DRAFT_MAX if draft_max is None else draft_max,
                          draft_min=0 if draft_min is None else draft_min,
                          p_min=DEFAULT_P_MIN if draft_p_min is None else draft_p_min).check()

    def draft(self, model: Any) -> DraftModel:
        """The :class:`DraftModel` for ``model`` (a loaded Model, a name or a path), made once."""
        if not isinstance(model, (Model, str, os.PathLike)):
            raise OptionError(f"draft_model must be a Model, a model name or a path to a .gguf file, not {_shown(model)}")
        key = str(id(model)) if isinstance(model, Model) else str(model)
        d = self._drafts.get(key)
        if d is None:
            if not isinstance(model, Model):
                model = load(str(model), backend=self.backend_name, n_ctx=self.n_ctx,
                             n_threads=getattr(self.backend, "n_threads", None), kv_type=self.kv_type)
            d = self._drafts[key] = DraftModel(model, self.tokenizer)
        return d

    def chat(self, messages: list[dict[str, Any]], **options: Any) -> Iterator[Chunk]:
        """Stream the assistant's reply to ``messages`` (``{"role": ..., "content": ...}`` dicts) through
        the chat template (a last assistant message is continued: see :meth:`apply_chat_template`); the
        options are :meth:`generate`'s. A full context keeps the system message."""
        check_messages(messages)
        messages = self._with_defaults(messages)
        ids = self.template.prompt_ids(self.template.render_reply(messages))  # a last assistant text continued
        if options.get("num_keep") is None and options.get("n_keep") is None:
            options.pop("n_keep", None)
            options["num_keep"] = self.system_keep(messages, ids)
        return self.generate(ids, **options)

    def system_keep(self, messages: list[dict[str, Any]], ids: Sequence[int] | None = None) -> int | None:
        """How many leading tokens of the conversation's ids the system message takes (None: no system
        message; the engine then keeps BOS only)."""
        if not messages or messages[0].get("role") != "system":
            return None
        ids = self.template.encode(messages) if ids is None else ids
        try:
            head = self.template.encode(messages[:1], add_generation_prompt=False)
        except LlmedgeError:
            return None
        n = 0
        for a, b in zip(head, ids):
            if a != b:
                break
            n += 1
        return n

    # -- KV cache and sequence state -------------------------------------------------------------
    @property
    def kv_type(self) -> str:
        """The KV cache's element type: ``f16``, ``f32`` or ``q8_0``."""
        return self.engine.kv_type

    @property
    def cache_bytes(self) -> int:
        """KV cache bytes allocated for one sequence (what ``llmedge show`` / ``ps`` report)."""
        return self.engine.cache_bytes

    def cache_info(self) -> dict[str, Any]:
        """KV cache memory and layout: type, context, bytes per sequence, full / ring layers, prefix LRU."""
        return self.engine.memory()

    @property
    def digest(self) -> str:
        """``sha256:<hex>`` of the model file (state files are tied to it)."""
        if self._digest is None:
            from llmedge.state import model_digest

            self._digest = model_digest(self.path)
        return self._digest

    def save_state(self, path: str | Path, extra: dict[str, Any] | None = None) -> int:
        """Write the current sequence (tokens and KV cache) and optional JSON ``extra`` (e.g. the chat
        messages) to ``path``; returns the bytes written."""
        _check_path(path)
        if extra is not None and not isinstance(extra, dict):  # anything else came back as {}
            raise OptionError(f"extra must be a dict (saved as JSON) or None, not {_shown(extra)}")
        return self.engine.save_state(path, self.digest, self.gguf.architecture, extra)

    def load_state(self, path: str | Path) -> dict[str, Any]:
        """Restore a sequence saved by :meth:`save_state` (a later prompt that extends its tokens
        evaluates only the new suffix); returns its ``extra``. A file from another model, a truncated
        or corrupted one is refused with a one-line LlmedgeError and the current sequence is kept."""
        _check_path(path)
        return self.engine.load_state(path, self.digest)

    def prefill(self, ids: Sequence[int]) -> int:
        """Evaluate ``ids`` into the model's sequence (what a cache already holds is reused), so a later
        prompt that extends them starts at once; returns how many tokens were evaluated."""
        return self.engine.prefill(token_ids("ids", ids))[1]

    @property
    def cached_tokens(self) -> int:
        """How many tokens the model's sequence holds (its KV cache)."""
        return len(self.engine.cache.tokens)

    @property
    def timings(self) -> Timings:
        """Timings of the last generation, in Ollama's terms (nanoseconds)."""
        return self.engine.last


def load(model: str | Path, backend: str = "auto", n_ctx: int | None = None, n_threads: int | None = None,
         kv_type: str = "f16", pull: bool = True, progress: Any = None, insecure: bool = False) -> Model:
    """Load a catalog name, a store name or a path to a ``.gguf`` file (pulling a catalog name if needed).

    ``backend``: ``auto``, ``native``, ``numba``, ``mlx`` or ``numpy``; ``n_ctx``: the context in tokens
    (None: the model's num_ctx PARAMETER, else 4096, see :func:`llmedge.defaults.load_context`; 0: the
    model's training context; never more than it); ``n_threads``: None, 0 or -1 for the
    backend's default; ``kv_type``: ``f16``, ``f32`` or ``q8_0``; ``pull=False`` refuses a name not already
    stored; ``progress``: a callback for the pull's progress; ``insecure``: allow a registry over http.
    Bad arguments raise an OptionError (a ValueError) naming them; other problems an LlmedgeError.
    """
    from llmedge.defaults import apply, load_context
    from llmedge.store import Store

    if not isinstance(model, (str, os.PathLike)):
        raise OptionError(f"model must be a model name or a path to a .gguf file, not {_shown(model)}")
    n_ctx, n_threads = _check_load_args(n_ctx, n_threads, none_ok=True)  # before anything is resolved or pulled
    check_kv_type(kv_type)
    store = Store(insecure=insecure)  # insecure: a registry may be pulled from over plain http
    path = store.resolve(str(model), pull=pull, progress=progress)
    config = store.config(str(model))
    m = Model(path, backend=backend, n_ctx=load_context(n_ctx, config), n_threads=n_threads, kv_type=kv_type,
              name=str(model))
    if config:
        apply(m, config)
    return m


def _check_load_args(n_ctx: Any, n_threads: Any, none_ok: bool = False) -> tuple[Any, int | None]:
    """``n_ctx`` (0: the model's training context; None with ``none_ok``: the model's own default) as an
    int and ``n_threads`` as an int or None (None, 0 or -1: the backend's default, -1 as
    llama-cpp-python's and llama.cpp's callers pass it); OptionError (a ValueError) naming the argument
    and its range otherwise."""
    what = "0: the model's training context" + ("; None: its num_ctx PARAMETER, else 4096" if none_ok else "")
    n_ctx = check_int("n_ctx", n_ctx, 0, what, none_ok=none_ok)
    if n_threads is None or isinstance(n_threads, numbers.Integral) and not isinstance(n_threads, bool) \
            and n_threads >= -1:
        return n_ctx, None if n_threads is None or n_threads <= 0 else int(n_threads)
    raise OptionError(f"n_threads must be a positive integer, or None, 0 or -1 for the backend's default, "
                      f"not {_shown(n_threads)}")


def token_ids(name: str, ids: Any, what: str = "a sequence of integer token ids") -> list[int]:
    """``ids`` as a list of ints when it is a sequence of integers (numpy ones too); else OptionError
    naming the argument (a str, None or a float id failed deep inside, or a float was decoded as "")."""
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
        raise OptionError(f"{name} must be {what}, not {_shown(ids)}")
    out = []
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, numbers.Integral):
            raise OptionError(f"{name} must be {what}, not one holding {_shown(t)}")
        out.append(int(t))
    return out


def stop_strings(stop: Any) -> tuple[str, ...]:
    """``stop`` (a string, a sequence of strings, or None) as a tuple; OptionError otherwise."""
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    if isinstance(stop, Iterable) and not isinstance(stop, bytes):
        stop = tuple(stop)
        if all(isinstance(s, str) for s in stop):
            return stop
    raise OptionError(f"stop must be a string or a sequence of strings, not {_shown(stop)}")


def _check_path(path: Any) -> None:
    if not isinstance(path, (str, os.PathLike)):
        raise OptionError(f"path must be a file path (str or os.PathLike), not {_shown(path)}")


def check_messages(messages: Any) -> None:
    """OptionError naming the first message that is not a dict with a string ``role``: templates
    failed on those with a misleading line ('Conversation roles must alternate', a Jinja
    UndefinedError) or skipped them. A list itself is the template's to check."""
    if not isinstance(messages, list):
        return
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise OptionError(f"messages[{i}] must be a dict with a 'role' string and its 'content', "
                              f"not {_shown(msg)}")
