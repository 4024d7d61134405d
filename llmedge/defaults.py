"""A model's defaults from its Modelfile or registry layers: options, system prompt, template.

`apply(model, config)` makes a loaded :class:`~llmedge.api.Model` use them: PARAMETERs become the
default generation options (a caller's options win), SYSTEM and MESSAGEs are put before a
conversation as Ollama's /api/chat and /api/generate put them, and TEMPLATE replaces the GGUF's chat
template when it renders: a Jinja template in the sandbox, an Ollama Go template (`{{ range .Messages
}}`) with :mod:`llmedge.gotemplate`. One that does not parse or render leaves the GGUF's Jinja template
in place, and `template_origin` says which is used and why. The num_ctx PARAMETER is a load-time
setting: `load_context` decides the context a model is loaded at.
"""

from __future__ import annotations

import math
import re
from typing import Any

from .errors import LlmedgeError
from .sampling import SamplingOptions

_GO_ACTION = re.compile(r"\{\{-?\s*(?:\.|if\b|range\b|end\b|else\b|with\b|template\b|block\b|define\b|\$)")
_OPTION_NAMES = set(SamplingOptions.__dataclass_fields__) | {"num_predict", "num_keep", "stop"}
DEFAULT_NUM_CTX = 4096  # the context when neither the caller nor the model's num_ctx PARAMETER sets one
MIN_NUM_CTX = 8  # the smallest context a model is loaded at (llmedge.api refuses less)


def is_go_template(source: str) -> bool:
    """True for a template in Go's text/template syntax (Ollama's TEMPLATE), not Jinja."""
    return bool(_GO_ACTION.search(source))


def template_problem(source: str) -> str | None:
    """Why a TEMPLATE being created cannot work (it does not parse: Go's syntax, or Jinja's in the
    sandbox), else None. As Ollama's create refuses a Go template that does not parse. A Go template
    that parses in Go but uses what llmedge does not run ({{template}}, {{define}}, {{block}}) passes:
    at load it falls back to the GGUF's template, and `template_origin` says so."""
    from .gotemplate import GoTemplateError, parse
    from .template import ChatTemplate

    if not source.strip():
        return None
    if is_go_template(source):
        try:
            parse(source)
        except GoTemplateError as e:
            return None if str(e).endswith("is not supported") else str(e)
        return None
    error = ChatTemplate(source).error
    return None if error is None else str(error)


def generation_options(config: dict[str, Any]) -> dict[str, Any]:
    """The PARAMETERs that are generation options (num_ctx and the like are load-time settings)."""
    params = config.get("parameters") or {}
    return {k: v for k, v in params.items() if k in _OPTION_NAMES}


def parameter_num_ctx(config: dict[str, Any]) -> int | None:
    """The model's num_ctx PARAMETER as an int; None when it sets none, or one that is no whole number
    of at least 8 (create refuses those; a registry's config is not checked there)."""
    value = (config.get("parameters") or {}).get("num_ctx")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or value != int(value) or value < MIN_NUM_CTX:
        return None
    return int(value)


def load_context(n_ctx: int | None, config: dict[str, Any], default: int = DEFAULT_NUM_CTX) -> int:
    """The context a model is loaded at, decided as Ollama decides it (server/routes.go modelOptions:
    `api.DefaultOptions()`, then the model's Options, then the request's): an explicit `n_ctx` (the
    `load` argument, `run --ctx`, `/set parameter num_ctx`, a request's num_ctx option) wins; else the
    model's num_ctx PARAMETER (its Modelfile's or registry's); else `default` (4096, or the server's
    LLMEDGE_CONTEXT_LENGTH). The model caps the result at its training context when it loads
    (:class:`llmedge.api.Model`, as Ollama's llm/server.go caps NumCtx at the GGUF's context_length),
    and 0 there means the training context itself."""
    return load_context_origin(n_ctx, config, default)[0]


def load_context_origin(n_ctx: int | None, config: dict[str, Any],
                        default: int = DEFAULT_NUM_CTX) -> tuple[int, str]:
    """:func:`load_context`'s context and which rule gave it: ``"given"`` (``n_ctx``), ``"parameter"``
    (the model's num_ctx PARAMETER) or ``"default"``."""
    if n_ctx is not None:
        return n_ctx, "given"
    own = parameter_num_ctx(config)
    return (default, "default") if own is None else (own, "parameter")


def template_choice(config: dict[str, Any], model: Any) -> tuple[Any, str]:
    """(ChatTemplate to use, where it comes from) for a model and its defaults."""
    from .template import ChatTemplate

    source = config.get("template")
    gguf = model.template
    if not isinstance(source, str) or not source.strip():
        return gguf, f"{gguf.name} (the GGUF's chat template)" if gguf.name == "gguf" else gguf.name
    if is_go_template(source):
        return go_template_choice(source, model)
    candidate = ChatTemplate(source, bos_token=gguf.bos_token, eos_token=gguf.eos_token,
                             tokenizer=model.tokenizer, name="modelfile")
    try:
        candidate.render([{"role": "user", "content": "hi"}])
    except LlmedgeError:
        return gguf, "gguf (the model's TEMPLATE does not render; using the GGUF's Jinja template)"
    return candidate, "modelfile (the model's Jinja TEMPLATE)"


def go_template_choice(source: str, model: Any) -> tuple[Any, str]:
    """The model's Go template when it parses and renders a sample chat, else the GGUF's template."""
    from .gotemplate import GoChatTemplate

    gguf = model.template
    try:
        candidate = GoChatTemplate(source, bos_token=gguf.bos_token, eos_token=gguf.eos_token,
                                   tokenizer=model.tokenizer)
        candidate.render([{"role": "system", "content": "s"}, {"role": "user", "content": "hi"},
                          {"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}])
    except LlmedgeError as e:
        return gguf, f"gguf (the model's Go template does not render: {e}; using the GGUF's Jinja template)"
    return candidate, "modelfile (the model's Go template, rendered as Ollama does)"


def with_defaults(config: dict[str, Any], messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A chat as Ollama's /api/chat builds it: the MESSAGEs of the defaults, then `messages`; the SYSTEM
    prompt goes first unless the conversation brings its own system message."""
    if not config:
        return messages
    out = [dict(m) for m in config.get("messages") or []] + list(messages)
    if config.get("system") and not (messages and messages[0].get("role") == "system"):
        out.insert(0, {"role": "system", "content": config["system"]})
    return out


def generate_messages(config: dict[str, Any], prompt: str, system: str | None = None,
                      with_history: bool = True) -> list[dict[str, Any]]:
    """The chat Ollama's /api/generate templates: the request's `system` (else the SYSTEM default), the
    MESSAGEs unless the request continues a `context`, then the prompt as the user's message."""
    out: list[dict[str, Any]] = []
    system = system or config.get("system")
    if system:
        out.append({"role": "system", "content": system})
    if with_history:
        out += [dict(m) for m in config.get("messages") or []]
    return out + [{"role": "user", "content": prompt}]


def request_options(config: dict[str, Any], sampling: dict[str, Any], max_tokens: int | None,
                    stop: tuple[str, ...], num_keep: int | None) -> tuple[dict[str, Any], int | None,
                                                                          tuple[str, ...], int | None]:
    """A request's (sampling, max_tokens, stop, num_keep) over the PARAMETERs: what the request sets wins."""
    params = generation_options(config)
    base = {k: v for k, v in params.items() if k in SamplingOptions.__dataclass_fields__}
    if max_tokens is None and params.get("num_predict") is not None:
        max_tokens = int(params["num_predict"])
    if not stop and params.get("stop"):
        given = params["stop"]
        stop = (given,) if isinstance(given, str) else tuple(given)
    if num_keep is None and params.get("num_keep") is not None:
        num_keep = int(params["num_keep"])
    return {**base, **sampling}, max_tokens, stop, num_keep


def apply(model: Any, config: dict[str, Any]) -> None:
    """Make `model` use `config` as its defaults (see the module docstring)."""
    if not hasattr(model, "gguf_template"):  # the file's own template, kept for a later apply
        model.gguf_template = model.template
    model.template = model.gguf_template
    model.defaults = dict(config)
    model.template, model.template_origin = template_choice(config, model)
