"""Reasoning ("thinking") output: which chat templates know it, the template variables that turn it on
or off, and the splitting of a reply into its reasoning and its answer as the text streams in.

Qwen3's template opens ``<think>`` in the model's own output (``enable_thinking=False`` pre-fills an
empty block); DeepSeek-R1 distills' templates end the prompt with ``<think>\\n`` so the reply starts
inside the block. Both close it with ``</think>``; the blank lines after it belong to neither part.
The server (``message.thinking`` / ``reasoning_content``) and the chat REPL share this.
"""

from __future__ import annotations

from typing import Any

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def supports_thinking(template: Any) -> bool:
    """Whether a chat template knows reasoning (Qwen3's ``enable_thinking``, ``<think>`` tags, Ollama's
    ``.Think``)."""
    src = getattr(template, "source", "") or ""
    return THINK_OPEN in src or "enable_thinking" in src or "reasoning_content" in src or ".Think" in src


def template_variables(think: bool | str | None) -> dict[str, Any]:
    """The chat-template variables for ``think`` (a bool, or a level low/medium/high); none when unset."""
    if think is None:
        return {}
    extra: dict[str, Any] = {"enable_thinking": bool(think)}
    if isinstance(think, str):
        extra["reasoning_effort"] = think
    return extra


def opens_thinking(prompt: str) -> bool:
    """Whether a rendered prompt ends inside an open ``<think>`` (the reply starts as reasoning)."""
    return prompt.rstrip().endswith(THINK_OPEN)


class ThinkingSplitter:
    """Feed reply text, get ``(thinking, content)`` back; holds back what may be a partial tag."""

    def __init__(self, in_think: bool = False) -> None:
        self.in_think = in_think
        self.may_open = not in_think  # a <think> may still open the reply
        self.after_close = False
        self.held = ""

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        buf, self.held = self.held + text, ""
        thinking = content = ""
        while buf:
            if self.may_open:
                stripped = buf.lstrip()
                if stripped.startswith(THINK_OPEN):
                    buf, self.in_think, self.may_open = stripped[len(THINK_OPEN):], True, False
                    continue
                if not final and THINK_OPEN.startswith(stripped):
                    self.held = buf
                    return thinking, content
                self.may_open = False
            if self.in_think:
                i = buf.find(THINK_CLOSE)
                if i >= 0:
                    thinking += buf[:i]
                    buf, self.in_think, self.after_close = buf[i + len(THINK_CLOSE):], False, True
                    continue
                keep = 0 if final else _tail_prefix(buf, THINK_CLOSE)
                thinking, self.held = thinking + buf[:len(buf) - keep], buf[len(buf) - keep:]
                return thinking, content
            if self.after_close:  # the blank lines after </think> belong to neither
                buf = buf.lstrip()
                self.after_close = not buf
            content += buf
            buf = ""
        return thinking, content

    def finish(self) -> tuple[str, str]:
        return self.feed("", final=True)


def _tail_prefix(text: str, tag: str) -> int:
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
