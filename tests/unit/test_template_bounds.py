"""Bounded prompt rendering (issue #38): no user template can make one row allocate more than a small
multiple of the row's character limit, whatever its filters and operators and their arguments.

* every string-building filter and operator, with huge arguments, is refused before it builds;
* hypothesis composes random chains of them (nested, in loops, in ``{% filter %}`` / ``{% set %}``
  blocks) and checks that rendering returns at most the limit or raises ``RowRenderError``, quickly and
  with a traced allocation peak far below what any unbounded operation would take;
* ordinary templates render exactly as in Jinja's own sandbox;
* the limit: ``LLMConfig.max_prompt_chars``, and plan-time checks of the template and prefix sizes.
"""

from __future__ import annotations

import re
import time
import tracemalloc

import pytest
from batch_contract.engine_config import ConfigError
from batch_contract.llm_config import DEFAULT_MAX_PROMPT_CHARS, MIN_MAX_PROMPT_CHARS, LLMConfig
from batch_worker.prompting import (
    MAX_INT_BITS,
    RENDER_BUDGET_FACTOR,
    PromptRenderer,
    PromptTooLongRenderError,
    RowRenderError,
    row_context,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jinja2 import StrictUndefined
from jinja2.sandbox import ImmutableSandboxedEnvironment

CAP = 5_000
TEXT = "a b-c\n<d> " * 20  # 200 characters, 20 lines
HUGE = 10**9


def _renderer(template: str, cap: int = CAP) -> PromptRenderer:
    return PromptRenderer(LLMConfig(model_path="/m", max_tokens=16, user_template=template,
                                    use_chat_template=False), max_chars=cap)


def _render(template: str, cap: int = CAP, text: str = TEXT) -> tuple[str | None, str | None, int, float]:
    """``(output, error, traced peak bytes, seconds)`` of rendering ``template`` for one row."""
    renderer = _renderer(template, cap)
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        out, err = renderer.user_message(row_context({"title": "T"}, "1", text)), None
    except RowRenderError as exc:
        out, err = None, str(exc)
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return out, err, peak, seconds


@pytest.mark.parametrize(
    ("template", "reason"),
    [
        ("{{ text|center(1000000000) }}", r"^SecurityError: filter center would build 1000000000 characters"),
        ("{{ text|indent(1000000000) }}", r"^SecurityError: filter indent would build \d+ characters"),
        ("{{ text|indent(text ~ text ~ text) }}", r"^SecurityError: filter indent would build"),
        ("{{ text|wordwrap(1, wrapstring=text) }}", r"^SecurityError: filter wordwrap would build"),
        ("{{ text|replace('', text) }}", r"^SecurityError: filter replace would build"),
        ("{{ text|replace('a', text ~ text) }}", r"^SecurityError: filter replace would build"),
        ("{{ text|list|join(text) }}", r"^SecurityError: filter join would build"),
        ("{{ text|truncate(1000000000, end=text|center(6000)) }}", r"^SecurityError: filter center would build 6000"),
        ("{{ '%*s'|format(1000000000, text) }}", r"^SecurityError: filter format would build 1000000003"),
        ("{{ '%*s'|format(-1000000000, text) }}", r"^SecurityError: filter format would build 1000000003"),
        ("{{ '%.999999999f'|format(1.5) }}", r"^SecurityError: filter format would build"),
        ("{{ '%9999999999999s'|format(1) }}", r"^SecurityError: filter format: a width or precision of 13 digits"),
        ("{{ '%1000000000s' % text }}", r"^SecurityError: formatting \(%\) would build"),
        ("{{ '%*d' % (1000000000, 1) }}", r"^SecurityError: formatting \(%\) would build"),
        ("{{ text|batch(1000000000, 'x')|list }}", r"^SecurityError: filter batch would build"),
        ("{{ text|slice(1000000000)|list }}", r"^SecurityError: filter slice would build"),
        ("{{ text|list|map('center', 1000000000)|join }}", r"^SecurityError: filter center would build"),
        ("{% set a = text ~ text %}{% set b = a ~ a %}{% set c = b ~ b %}{% set d = c ~ c %}{% set e = d ~ d %}"
         "{{ e ~ e }}", r"^SecurityError: concatenation \(~\) would build"),
        ("{% set a = text + text %}{% set b = a + a %}{% set c = b + b %}{% set d = c + c %}{% set e = d + d %}"
         "{{ e + e }}", r"^SecurityError: concatenation \(\+\) would build"),
        ("{% set a = text|list %}{% set b = a + a %}{% set c = b + b %}{% set d = c + c %}{% set e = d + d %}"
         "{{ e + e + e }}", r"^SecurityError: concatenation \(\+\) would build"),
        ("{{ text * 10000 }}", r"^SecurityError: repetition builds more than 100000 characters"),
        ("{{ [text] * 100000 }}", r"^SecurityError: repetition builds more than 100000 characters"),
        ("{{ ([text] * 400)|tojson }}", r"^SecurityError: repetition \(\*\) would build"),
        ("{{ [[text, text]] * 30 }}", r"^SecurityError: repetition \(\*\) would build"),
        ("{{ text * 30 }}", r"^SecurityError: repetition \(\*\) would build 6000 characters or items, above the "
                            r"row limit 5000"),
        ("{% set x = 10 ** 64 %}{{ x ** 64 }}", rf"^SecurityError: the power would have more than {MAX_INT_BITS} bits"),
        ("{% set x = 10 ** 60 %}{% set a = x * x %}{% set b = a * a %}{% set c = b * b %}{% set d = c * c %}"
         "{{ d * d }}", rf"^SecurityError: the product would have more than {MAX_INT_BITS} bits"),
        ("{% filter upper %}{% for c in text %}{{ text }}{% endfor %}{% endfilter %}",
         r"^SecurityError: a template block: the template built more than 20000"),
        ("{% set blk %}{% for c in text %}{{ text }}{% endfor %}{% endset %}{{ blk|length }}",
         r"^SecurityError: a template block: the template built more than 20000"),
        ("{{ text|tojson|tojson|tojson|tojson|tojson|tojson|tojson|tojson|tojson|tojson }}",
         r"^SecurityError: filter tojson would build"),
        ("{{ (text|list|batch(1)|list)|sum(start=[]) ~ text|center(4900) }}", r"^SecurityError: "),
        ("{{ '{}'.format(text) }}", r"^SecurityError: .* is not safely callable"),
        ("{{ text|truncate(5, end=text) }}", r"^AssertionError: expected length >= 200, got 5"),
    ],
)
def test_each_string_builder_is_refused_before_it_builds(template: str, reason: str) -> None:
    out, err, peak, seconds = _render(template)
    assert out is None, f"rendered {len(out)} characters"
    assert err is not None
    assert re.search(reason, err), err
    assert peak < 2 << 20, f"traced peak {peak} bytes"
    assert seconds < 2.0


def test_a_long_user_message_stops_at_the_limit_as_too_long() -> None:
    out, err, peak, _ = _render("{% for c in text %}{{ text }}{% endfor %}")
    assert out is None and err is not None and err.startswith(f"the rendered user message passed {CAP} characters")
    with pytest.raises(PromptTooLongRenderError, match=r"max_prompt_chars"):
        _renderer("{% for c in text %}{{ text }}{% endfor %}").user_message(row_context({}, "1", TEXT))
    assert peak < 1 << 20
    assert _render("{{ text }}", cap=len(TEXT))[0] == TEXT, "exactly the limit renders"


# ----------------------------------------------------------------------------------- random chains

WIDTHS = st.sampled_from([0, 1, 3, 79, 4_000, 6_000, 10**6, HUGE, -HUGE])
STRINGS = st.sampled_from(["''", "'x'", "'ab'", "'" + "y" * 300 + "'", "text", "title"])


def _filter(draw: st.DrawFn, expr: str) -> str:
    w, s, s2 = draw(WIDTHS), draw(STRINGS), draw(STRINGS)
    choices = [
        f"({expr})|center({w})", f"({expr})|indent({w})", f"({expr})|indent({s})",
        f"({expr})|wordwrap({max(w, 1)}, wrapstring={s})", f"({expr})|replace({s}, {s2})",
        f"({expr})|list|join({s})", f"({expr})|truncate({max(abs(w), 3)}, end='..')",
        f"'%*s'|format({w}, {expr})", f"'%.{min(abs(w), 10**12)}s'|format({expr})",
        f"({expr})|batch({max(w, 1)}, {s})|list|string", f"({expr})|slice({max(w, 1)})|list|string",
        f"({expr}) ~ ({expr})", f"({expr}) ~ {s}", f"({expr}) + {s}", f"'%s%s' % (({expr}), {s})",
        f"({expr}) * {draw(st.sampled_from([0, 2, 50, 10**5, 10**9]))}",
        f"({expr})|upper", f"({expr})|tojson", f"({expr})|urlencode", f"({expr})|e", f"({expr})|list|string",
        f"({expr})|wordcount|string", f"({expr})|reverse", f"({expr})|title", f"({expr})|trim",
    ]
    return draw(st.sampled_from(choices))


@st.composite
def templates(draw: st.DrawFn) -> str:
    expr = draw(st.sampled_from(["text", "title", "id"]))
    for _ in range(draw(st.integers(1, 5))):
        expr = _filter(draw, expr)
    body = "{{ " + expr + " }}"
    wrapper = draw(st.sampled_from(["{}", "{{% for c in text %}}{}{{% endfor %}}", "{{% filter upper %}}{}{{% endfilter %}}",
                                    "{{% set v %}}{}{{% endset %}}{{{{ v ~ v }}}}", "{{% set v = {} %}}{{{{ v ~ v }}}}"]))
    if "set v = {}" in wrapper:
        return wrapper.format(expr)
    return wrapper.format(body)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(template=templates())
def test_random_filter_chains_never_allocate_past_the_cap(template: str) -> None:
    out, err, peak, seconds = _render(template)
    assert out is not None or err is not None
    if out is not None:
        assert len(out) <= CAP
    # Every value built is at most CAP characters or items and all of them together RENDER_BUDGET_FACTOR x
    # CAP; constant-factor filters (tojson, urlencode) may build a few times their checked input before
    # the check. An unbounded operation here would build millions to billions of characters.
    assert peak < 1_000_000 + 400 * RENDER_BUDGET_FACTOR * CAP, f"{template}: traced peak {peak} bytes ({err})"
    assert seconds < 5.0, f"{template}: {seconds:.1f} s"


# ------------------------------------------------------------------------------- ordinary templates


@pytest.mark.parametrize("template", [
    "{{ title | upper }}: {{ text | truncate(8, true, '', 0) }}",
    "{{ text|wordwrap(7) }}|{{ text|indent(2, true) }}|{{ text|center(230) }}",
    "{{ '%-5s|%05.1f|%d%%' % ('ab', 3.14159, 5) }} {{ '%s and %s'|format(title, id) }}",
    "{{ text|replace('a', 'AA', 3) }}{{ [1, 2]|join(', ') }}{{ text|list|batch(3, '.')|list|length }}",
    "{% for w in text|wordcount|string %}{{ w ~ loop.index }}{% endfor %}{{ 'x' ~ 1 ~ none }}",
    "{% set v %}<{{ title }}>{% endset %}{% filter upper %}{{ v }} {{ text|striptags }}{% endfilter %}",
    "{{ [[1], [2, 3]]|sum(start=[]) }}{{ [1, 2, 3]|sum }}{{ 2 ** 10 }}{{ 7 % 3 }}{{ 'ab' * 3 }}{{ [1] + [2] }}",
    "{{ text|slice(3)|list|length }} {{ text|tojson }} {{ text|urlencode }}",
])
def test_ordinary_templates_render_as_in_jinjas_own_sandbox(template: str) -> None:
    plain = ImmutableSandboxedEnvironment(undefined=StrictUndefined, autoescape=False)
    context = row_context({"title": "T"}, "1", TEXT)
    assert _renderer(template).user_message(context) == plain.from_string(template).render(context)


# ---------------------------------------------------------------------------------------- the limit


def test_max_prompt_chars_follows_the_context_length() -> None:
    assert LLMConfig(model_path="/m", max_tokens=8).max_prompt_chars == DEFAULT_MAX_PROMPT_CHARS == 131_072
    assert LLMConfig(model_path="/m", max_tokens=8, max_model_len=64).max_prompt_chars == MIN_MAX_PROMPT_CHARS
    assert LLMConfig(model_path="/m", max_tokens=8, max_model_len=32768).max_prompt_chars == 32 * 32768
    config = LLMConfig(model_path="/m", max_tokens=8)
    assert PromptRenderer(config).max_chars == config.max_prompt_chars
    assert "max_prompt_chars" not in config.to_dict(), "derived: not in the engine dict, so not in the fingerprint"


def test_template_and_prefix_over_the_limit_fail_at_plan_time() -> None:
    with pytest.raises(ConfigError, match=r"^engine\.user_template: is 70000 characters, above the limit 65536"):
        LLMConfig(model_path="/m", max_tokens=8, max_model_len=64, user_template="{{ text }}" * 7000)
    with pytest.raises(ConfigError, match=r"^engine\.system_prompt: with the few_shot texts is 70000 characters"):
        LLMConfig(model_path="/m", max_tokens=8, max_model_len=64, system_prompt="s" * 60000,
                  few_shot=[{"user": "u" * 5000, "assistant": "a" * 5000}])
