"""Fuzz target: the chat template renderer on arbitrary templates and messages.

The input is split at the first NUL: the template source, then JSON-ish message contents. Rendering
must return a string within MAX_RENDER_CHARS or raise one TemplateError line; the sandbox must hold
(nothing reachable writes a file or reads a private attribute: a canary attribute is checked) and the
watchdog bounds time (libFuzzer's -timeout catches a render the watchdog misses).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402

TARGET = "template"

with harness.instrument(__name__, include=["llmedge.template", "jinja2"]):
    import llmedge.template as template_mod

from llmedge.errors import TemplateError  # noqa: E402

template_mod.RENDER_SECONDS = 2.0


class Canary:
    """Reachable from every template as ``canary``; its private state must never change or leak."""

    def __init__(self) -> None:
        self._secret = "CANARY-SECRET-7f3a"
        self.name = "canary"


CANARY = Canary()


def test_one_input(data: bytes) -> None:
    source, _, rest = data.partition(b"\x00")
    contents = rest.decode("utf-8", "replace").split("\x01")[:8]
    messages = [{"role": ("user", "assistant", "system")[i % 3], "content": c} for i, c in enumerate(contents)]
    t = template_mod.ChatTemplate(source.decode("utf-8", "replace"), bos_token="<s>", eos_token="</s>")
    try:
        out = t.render(messages, add_generation_prompt=bool(len(data) & 1), canary=CANARY)
    except TemplateError as e:
        assert "\n" not in str(e) and str(e).startswith("chat template"), str(e)
        return
    assert isinstance(out, str) and len(out) <= template_mod.MAX_RENDER_CHARS
    assert "CANARY-SECRET" not in out
    assert CANARY._secret == "CANARY-SECRET-7f3a" and CANARY.name == "canary"


def seeds() -> list[bytes]:
    from llmedge.template import CHATML_TEMPLATE, GEMMA_TEMPLATE

    return [CHATML_TEMPLATE.encode() + b"\x00hi\x01hello", GEMMA_TEMPLATE.encode() + b"\x00a\x01b\x01c",
            b"{{ canary.name }}{{ canary._secret }}\x00x", b"{{ ''.__class__ }}\x00",
            b"{% for m in messages %}{{ m.content | upper }}{% endfor %}\x00x",
            b"{{ 'a' * 3 }}{{ '%5s' % 'x' }}{{ 'x' | center(9) }}\x00", b"{{ range(10) | list }}\x00",
            b"{% set ns = namespace(s='') %}{% for i in range(9) %}{% set ns.s = ns.s ~ i %}{% endfor %}\x00"]


if __name__ == "__main__":
    harness.fuzz(TARGET, test_one_input, seeds)
