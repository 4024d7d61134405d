"""A model's defaults from its Modelfile or registry layers: options, system prompt, template.

`apply(model, config)` makes a loaded :class:`~llmedge.api.Model` use them: PARAMETERs become the
default generation options (a caller's options win), SYSTEM and MESSAGEs are put before a
conversation that has no system message of its own, and TEMPLATE replaces the GGUF's chat template
when it is a Jinja template that renders. Ollama's Go templates (`{{ .Prompt }}`, `{{ range
.Messages }}`) are not rendered: the GGUF's Jinja template is used and `template_origin` says so.
"""

from __future__ import annotations

import re
from typing import Any

from .errors import LlmedgeError
from .sampling import SamplingOptions

_GO_ACTION = re.compile(r"\{\{-?\s*(?:\.|if\b|range\b|end\b|else\b|with\b|template\b|block\b|define\b|\$)")
_OPTION_NAMES = set(SamplingOptions.__dataclass_fields__) | {"num_predict", "num_keep", "stop"}


def is_go_template(source: str) -> bool:
    """True for a template in Go's text/template syntax (Ollama's TEMPLATE), not Jinja."""
    return bool(_GO_ACTION.search(source))


def generation_options(config: dict[str, Any]) -> dict[str, Any]:
    """The PARAMETERs that are generation options (num_ctx and the like are load-time settings)."""
    params = config.get("parameters") or {}
    return {k: v for k, v in params.items() if k in _OPTION_NAMES}


def template_choice(config: dict[str, Any], model: Any) -> tuple[Any, str]:
    """(ChatTemplate to use, where it comes from) for a model and its defaults."""
    from .template import ChatTemplate

    source = config.get("template")
    gguf = model.template
    if not isinstance(source, str) or not source.strip():
        return gguf, f"{gguf.name} (the GGUF's chat template)" if gguf.name == "gguf" else gguf.name
    if is_go_template(source):
        return gguf, "gguf (the model's Go template cannot be rendered; using the GGUF's Jinja template)"
    candidate = ChatTemplate(source, bos_token=gguf.bos_token, eos_token=gguf.eos_token,
                             tokenizer=model.tokenizer, name="modelfile")
    try:
        candidate.render([{"role": "user", "content": "hi"}])
    except LlmedgeError:
        return gguf, "gguf (the model's TEMPLATE does not render; using the GGUF's Jinja template)"
    return candidate, "modelfile (the model's Jinja TEMPLATE)"


def with_defaults(config: dict[str, Any], messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` preceded by the SYSTEM prompt and MESSAGEs of the defaults, unless the conversation
    brings its own system message."""
    if messages and messages[0].get("role") == "system":
        return messages
    head: list[dict[str, Any]] = []
    if config.get("system"):
        head.append({"role": "system", "content": config["system"]})
    head += [dict(m) for m in config.get("messages") or []]
    return head + messages


def apply(model: Any, config: dict[str, Any]) -> None:
    """Make `model` use `config` as its defaults (see the module docstring)."""
    model.defaults = dict(config)
    model.template, model.template_origin = template_choice(config, model)
