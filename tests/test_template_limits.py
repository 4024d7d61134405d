"""A chat template from a downloaded file cannot make rendering take unbounded time or memory: every
way to build a huge string is refused before it is built, a runaway loop is stopped by the watchdog,
and each refusal is one TemplateError line."""

from __future__ import annotations

import time

import pytest

import llmedge.template as template_mod
from llmedge.errors import TemplateError
from llmedge.template import ChatTemplate

MESSAGES = [{"role": "user", "content": "hi"}]

HUGE = {
    "string repetition": "{{ 'a' * 1000000000 }}",
    "repetition on the left": "{{ 1000000000 * 'ab' }}",
    "list repetition": "{{ (messages * 100000000) | length }}",
    "concatenation doubling": "{% set ns = namespace(s='x' * 1000) %}{% for i in range(40) %}"
                              "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}",
    "plus doubling": "{% set ns = namespace(s='x' * 1000) %}{% for i in range(40) %}"
                     "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s | length }}",
    "replace blow-up": "{% set s = 'a' * 100000 %}{{ s.replace('a', s) | length }}",
    "replace of the empty string": "{% set s = 'a' * 100000 %}{{ s.replace('', s) | length }}",
    "center filter": "{{ 'x' | center(1000000000) }}",
    "center method": "{{ 'x'.center(1000000000) }}",
    "ljust method": "{{ 'x'.ljust(1000000000) }}",
    "zfill method": "{{ '1'.zfill(1000000000) }}",
    "indent filter": "{{ ('a\\n' * 1000) | indent(1000000000) }}",
    "indent of many lines": "{{ ('a\\n' * 100000) | indent(1000) }}",
    "indent by a long string": "{{ ('a\\n' * 100000) | indent('x' * 1000) }}",
    "percent width": "{{ '%1000000000d' % 1 }}",
    "percent width of a named field": "{{ '%(a)1000000000d' % {'a': 1} }}",
    "replace filter blow-up": "{% set s = 'a' * 100000 %}{{ s | replace('a', s) | length }}",
    "batch padding": "{{ [1] | batch(1000000000, 'x') | list | length }}",
    "slice count": "{{ [1] | slice(1000000000) | list | length }}",
    "percent computed width": "{{ '%*d' % (1000000000, 1) }}",
    "format filter width": "{{ '%1000000000s' | format('x') }}",
    "str.format width": "{{ '{:>1000000000}'.format('x') }}",
    "str.format computed width": "{{ '{:>{}}'.format('x', 1000000000) }}",
    "tojson indent": "{{ messages | tojson(indent=1000000000) }}",
    "join blow-up": "{% set s = 'a' * 1000000 %}{{ ([s] * 30) | join(s) }}",
    "str.join blow-up": "{% set s = 'a' * 1000000 %}{{ s.join([s] * 30) }}",
    "power": "{{ (10 ** 100000000) | string | length }}",
    "output of many loops": "{% for i in range(100000) %}{% for j in range(1000) %}{{ 'x' * 10000 }}"
                            "{% endfor %}{% endfor %}",
}


@pytest.mark.parametrize("case", list(HUGE))
def test_a_template_cannot_build_a_huge_string(case: str) -> None:
    t0 = time.monotonic()
    with pytest.raises(TemplateError) as info:
        ChatTemplate(HUGE[case]).render(MESSAGES)
    msg = str(info.value)
    assert "\n" not in msg and ("too large" in msg or "took longer" in msg), msg
    assert time.monotonic() - t0 < 30


def test_a_runaway_loop_is_stopped_by_the_watchdog(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(template_mod, "RENDER_SECONDS", 0.5)
    t0 = time.monotonic()
    with pytest.raises(TemplateError, match="took longer than 0.5 s"):
        ChatTemplate("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}x"
                     ).render(MESSAGES)
    elapsed = time.monotonic() - t0
    assert elapsed < 10
    # the thread that rendered lives on and renders again, with no stray exception pending
    assert ChatTemplate("{{ messages[0].content }}").render(MESSAGES) == "hi"
    time.sleep(0.6)
    assert ChatTemplate("{{ messages[0].content }}").render(MESSAGES) == "hi"


@pytest.mark.parametrize("depth", [50, 2000, 20000])
def test_deep_nesting_is_one_template_error(depth: int) -> None:
    """Found by the template fuzzer: a template nested past the recursion limit raised RecursionError
    out of the constructor."""
    for src in ("{% if x %}" * depth + "{% endif %}" * depth, "{{ " + "(" * depth + "1" + ")" * depth + " }}",
                "{% for a in b %}" * depth + "{% endfor %}" * depth):
        t = ChatTemplate(src)
        if t.error is None:
            assert depth == 50
            t.render(MESSAGES)
        else:
            assert "nested too deeply" in str(t.error) or "does not compile" in str(t.error)
            with pytest.raises(TemplateError):
                t.render(MESSAGES)


def test_lipsum_is_not_available() -> None:
    with pytest.raises(TemplateError):
        ChatTemplate("{{ lipsum(1000000000) }}").render(MESSAGES)


def test_ordinary_formatting_still_works() -> None:
    src = ("{{ '%s: %5d' % ('n', 3) }}|{{ '%-4s|' | format('ab') }}{{ '{:>4}'.format('x') }}|"
           "{{ 'ab' * 3 }}|{{ 'x' | center(5) }}|{{ messages | tojson(indent=2) | length > 0 }}|"
           "{{ 'a b'.replace(' ', '--') }}|{{ ', '.join(['a', 'b']) }}|{{ 2 ** 10 }}|{{ '**bold**' }}|"
           "{{ 'aXb' | replace('X', '-') }}|{{ [1, 2, 3] | batch(2, 0) | list }}|{{ '%(a)3s' % {'a': 1} }}")
    assert ChatTemplate(src).render(MESSAGES) == ("n:     3|ab  |   x|ababab|  x  |True|a--b|a, b|1024|**bold**|"
                                                  "a-b|[[1, 2], [3, 0]]|  1")
