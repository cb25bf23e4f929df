"""Prompt rendering for the LLM engine: a sandboxed Jinja user template plus the tokenizer's chat template.

No vLLM or torch import here; ``jinja2`` is needed (both images have it). The worker renders every row with
it; the planner renders a run's prompts with it only for the prefix-aware plan
(:mod:`batch_inference.prefix_plan`) and otherwise checks the template with
:func:`batch_contract.llm_config.check_user_template`, which :func:`validate_template` also applies (after
compiling in this sandbox). ``batch_worker.prompting`` is an alias of this module.

Sandbox: templates come from people filling in a form, so they are rendered by
:class:`RowTemplateEnvironment`, an ``ImmutableSandboxedEnvironment`` that additionally refuses *every*
attribute access and every call (``{{ text.upper() }}``, ``{{ '{}'.format(x) }}``, ``{{ text.__class__ }}``,
``{{ cycler.__init__.__globals__ }}``, ``range(...)`` all fail) and treats an undefined name as an error
(``StrictUndefined``). Filters (``{{ text | upper | truncate(200) }}``), conditionals and loops still work.

Bounded rendering: a template cannot make one row allocate more than a small constant times the larger
of the row's character limit (:attr:`LLMConfig.max_prompt_chars
<batch_contract.llm_config.LLMConfig.max_prompt_chars>`, or :data:`DEFAULT_MAX_PROMPT_CHARS` outside
:class:`PromptRenderer`) and the size of the row's own fields:

* operations that build strings or lists of a size their arguments choose check the size *before*
  building: ``*`` (also capped at :data:`MAX_REPEAT_CHARS`), ``+``, ``~``, ``%`` and the ``format``
  filter (widths and precisions), and the filters ``center``, ``indent``, ``wordwrap``, ``replace``,
  ``join``, ``truncate``, ``batch``, ``slice``, ``list`` and ``sum`` (of lists); ``**`` is capped at
  :data:`MAX_POWER_EXPONENT` and integer results of ``*``/``**`` at :data:`MAX_INT_BITS`;
* every other filter's result (at most a constant factor of its input: ``upper``, ``tojson``, ...) is
  checked after it is built;
* the results of every filter and of these operators, and the text buffered by ``{% filter %}`` /
  ``{% set %}...{% endset %}`` blocks, count toward a per-row total of :data:`RENDER_BUDGET_FACTOR`
  times the limit;
* the rendered user message is streamed and abandoned as soon as it passes the limit.

An operation over a limit raises ``SecurityError`` (:class:`RowRenderError` from
:meth:`PromptRenderer.user_message`: the row is dead-lettered ``template_error``); a user message over the
limit raises :class:`PromptTooLongRenderError` (dead letter ``too_long``). Loops are not bounded in time: a
template that loops over a long field inside a loop over it, printing nothing, is slow but allocates
nothing.

Prompt layout (chat models, ``use_chat_template=True``)::

    [system: system_prompt] [user: few_shot[0].user] [assistant: few_shot[0].assistant] ... [user: row]

rendered by the tokenizer's own chat template with the generation prompt appended. Everything before the
row's turn is identical for every row: the prefix vLLM's prefix cache serves after the first row.
"""

from __future__ import annotations

import contextlib
import functools
import json
import operator
import re
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import jinja2
from jinja2 import StrictUndefined, meta, nodes
from jinja2 import filters as jfilters
from jinja2.compiler import CodeGenerator, Frame, optimizeconst
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import pass_environment, pass_eval_context

from batch_contract.engine_config import ConfigError
from batch_contract.llm_config import DEFAULT_MAX_PROMPT_CHARS, LLMConfig, check_user_template

MAX_REPEAT_CHARS = 100_000
"""Largest string a template may build with ``*``, in characters (a list counts its items' text)."""
MAX_POWER_EXPONENT = 64
"""Largest exponent a template may use with ``**``."""
MAX_INT_BITS = 4096
"""Largest integer (bits) a template may build with ``*`` or ``**`` (about 1,233 decimal digits)."""
RENDER_BUDGET_FACTOR = 4
"""Every string and list a template builds for one row, together, is at most this many times the row's
character limit (characters or items)."""
PLAIN_SEPARATOR = "\n\n"
"""Separator between parts of a prompt when no chat template is applied."""


# ------------------------------------------------------------------------------------ render budget


class _Budget:
    """Characters (or items) one render may build: each value at most ``limit``, all together at most
    ``total``."""

    def __init__(self, limit: int, total: int | None = None) -> None:
        self.limit = limit
        self.total = RENDER_BUDGET_FACTOR * limit if total is None else total
        self.used = 0

    def check(self, size: int, what: str) -> None:
        """Refuse to build a value of ``size`` (before it is built).

        Raises:
            SecurityError: ``size`` is over the limit, or would take the row's total over its budget.
        """
        if size > self.limit:
            raise SecurityError(f"{what} would build {size} characters or items, above the row limit {self.limit}")
        if self.used + size > self.total:
            raise SecurityError(f"{what}: the template built more than {self.total} characters or items for "
                                f"this row ({RENDER_BUDGET_FACTOR} x the row limit {self.limit})")

    def charge(self, size: int, what: str) -> None:
        """:meth:`check` then count ``size`` as built."""
        self.check(size, what)
        self.used += size


_BUDGET: ContextVar[_Budget | None] = ContextVar("row_template_budget", default=None)


def _budget() -> _Budget:
    """The budget of the render in progress, else a fresh one at :data:`DEFAULT_MAX_PROMPT_CHARS`."""
    return _BUDGET.get() or _Budget(DEFAULT_MAX_PROMPT_CHARS)


@contextlib.contextmanager
def render_budget(limit: int) -> Iterator[_Budget]:
    """Bound every template operation in this context (this thread) by ``limit`` characters per value
    and :data:`RENDER_BUDGET_FACTOR` x ``limit`` in all."""
    token = _BUDGET.set(_Budget(limit))
    try:
        yield _BUDGET.get()  # type: ignore[misc]
    finally:
        _BUDGET.reset(token)


def _size(value: Any) -> int:
    """Characters of a string, items of a list/tuple/dict, else 0 (numbers, generators)."""
    return len(value) if isinstance(value, str | list | tuple | dict) else 0


def _weight(value: Any, depth: int = 0) -> int:
    """Characters ``value`` would print as, estimated without building it: a string's length; a list's or
    tuple's items' weights plus one per item (so ``[text] * n`` weighs ``n * len(text)``, not ``n``);
    1 for anything else. Nesting past 8 levels counts one per item."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list | tuple):
        if depth >= 8:
            return len(value)
        return sum(_weight(v, depth + 1) + 1 for v in value)
    return 1


def _int(value: Any, what: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        raise SecurityError(f"{what}: {value!r:.40} is not an integer") from None


_PERCENT = re.compile(r"%(?:\([^)]*\))?[#0 +-]*(\*|\d+)?(?:\.(\*|\d*))?[hlL]?([a-zA-Z%])")


def _check_percent(fmt: str, args: Any, what: str) -> None:
    """Refuse a ``%`` format whose widths and precisions (written, or taken from the arguments by ``*``)
    add up past the row limit, before formatting.

    Raises:
        SecurityError: over the limit, or a width of more than 12 digits.
    """
    positional = list(args) if isinstance(args, tuple) else [] if isinstance(args, Mapping) else [args]
    index = 0
    total = len(fmt)
    for match in _PERCENT.finditer(fmt):
        if match.group(3) == "%":
            continue
        for part in (match.group(1), match.group(2)):
            if part == "*":
                if index < len(positional):
                    total += abs(_int(positional[index], what))
                index += 1
            elif part:
                if len(part) > 12:
                    raise SecurityError(f"{what}: a width or precision of {len(part)} digits")
                total += int(part)
        index += 1
    _budget().check(total, what)


# ------------------------------------------------------------------------------------ bounded filters


def _charged(name: str, func: Any) -> Any:
    """``func`` (a filter) with its result charged to the render budget (after it is built)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = func(*args, **kwargs)
        _budget().charge(_size(result), f"filter {name}")
        return result

    return wrapper


def _center(value: Any, width: Any = 80) -> str:
    value = str(value)
    _budget().check(max(len(value), _int(width, "filter center")), "filter center")
    return jfilters.do_center(value, width)


def _indent(s: Any, width: Any = 4, first: bool = False, blank: bool = False) -> str:
    s = str(s)
    pad = len(width) if isinstance(width, str) else _int(width, "filter indent")
    _budget().check(len(s) + (s.count("\n") + 1) * max(pad, 0), "filter indent")
    return jfilters.do_indent(s, width, first, blank)


@pass_environment
def _wordwrap(environment: Any, s: Any, width: Any = 79, break_long_words: bool = True,
              wrapstring: str | None = None, break_on_hyphens: bool = True) -> str:
    s = str(s)
    sep = environment.newline_sequence if wrapstring is None else str(wrapstring)
    lines = 2 * len(s) // max(_int(width, "filter wordwrap"), 1) + s.count("\n") + 2
    _budget().check(len(s) + lines * len(sep), "filter wordwrap")
    return jfilters.do_wordwrap(environment, s, width, break_long_words, wrapstring, break_on_hyphens)


@pass_eval_context
def _replace(eval_ctx: Any, s: Any, old: Any, new: Any, count: Any = None) -> str:
    s, old, new = str(s), str(old), str(new)
    hits = s.count(old) if old else len(s) + 1
    if count is not None and _int(count, "filter replace") >= 0:
        hits = min(hits, int(count))
    _budget().check(len(s) + hits * max(len(new) - len(old), 0), "filter replace")
    return jfilters.do_replace(eval_ctx, s, old, new, count)


@pass_eval_context
def _join(eval_ctx: Any, value: Any, d: Any = "", attribute: Any = None) -> str:
    budget = _budget()
    items = list(value) if not isinstance(value, list | tuple) else value
    sep = str(d)
    budget.check(max(len(items) - 1, 0) * len(sep), "filter join")
    if attribute is not None:
        getter = jfilters.make_attrgetter(eval_ctx.environment, attribute)
        items = [getter(item) for item in items]
    total = max(len(items) - 1, 0) * len(sep)
    texts = []
    for item in items:
        text = str(item)
        total += len(text)
        budget.check(total, "filter join")
        texts.append(text)
    return sep.join(texts)


@pass_environment
def _truncate(env: Any, s: Any, length: Any = 255, killwords: bool = False, end: Any = "...",
              leeway: Any = None) -> str:
    _budget().check(len(str(end)), "filter truncate")
    return jfilters.do_truncate(env, s, length, killwords, end, leeway)


def _batch(value: Any, linecount: Any, fill_with: Any = None) -> Any:
    _budget().check(_int(linecount, "filter batch"), "filter batch")
    return jfilters.do_batch(value, linecount, fill_with)


def _slice(value: Any, slices: Any, fill_with: Any = None) -> Any:
    _budget().check(_int(slices, "filter slice"), "filter slice")
    return jfilters.sync_do_slice(value, slices, fill_with)


def _list(value: Any) -> list[Any]:
    if hasattr(value, "__len__"):
        _budget().check(len(value), "filter list")
    return jfilters.sync_do_list(value)


@pass_environment
def _sum(environment: Any, iterable: Any, attribute: Any = None, start: Any = 0) -> Any:
    """``sum``; list or tuple sums (``start=[]``) are built in place and checked as they grow (Python's
    ``sum`` would copy the growing list at every item)."""
    if attribute is not None:
        iterable = map(jfilters.make_attrgetter(environment, attribute), iterable)
    if not isinstance(start, list | tuple):
        return sum(iterable, start)
    budget = _budget()
    out = list(start)
    for item in iterable:
        if not isinstance(item, type(start)):
            raise TypeError(f"can only concatenate {type(start).__name__} (not {type(item).__name__})")
        budget.check(len(out) + len(item), "filter sum")
        out.extend(item)
    return out if isinstance(start, list) else tuple(out)


def _format(value: Any, *args: Any, **kwargs: Any) -> str:
    fmt = str(value)
    _check_percent(fmt, kwargs or args, "filter format")
    return jfilters.do_format(fmt, *args, **kwargs)


BOUNDED_FILTERS: dict[str, Any] = {
    "center": _center, "indent": _indent, "wordwrap": _wordwrap, "replace": _replace, "join": _join,
    "truncate": _truncate, "batch": _batch, "slice": _slice, "list": _list, "format": _format, "sum": _sum,
}
"""Filters whose result size an argument chooses, checked before they build it (see the module doc); their
results are charged to the render budget like every other filter's."""


# ------------------------------------------------------------------------------------ the environment


class _BoundedBuffer(list):
    """Jinja's buffer of a ``{% filter %}`` / ``{% set %}`` block body, counting what is appended."""

    def append(self, item: Any) -> None:
        _budget().charge(len(item) if isinstance(item, str) else 0, "a template block")
        super().append(item)

    def extend(self, items: Any) -> None:
        for item in items:
            self.append(item)


class _RowCodeGenerator(CodeGenerator):
    """Jinja's code generator with ``~`` and block buffers routed through the environment's checks."""

    @optimizeconst
    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        self.write("environment.call_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")

    def buffer(self, frame: Frame) -> None:
        frame.buffer = self.temporary_identifier()
        self.writeline(f"{frame.buffer} = environment.block_buffer()")


class RowTemplateEnvironment(ImmutableSandboxedEnvironment):
    """Jinja sandbox for user-supplied row templates: no attribute access, no calls, bounded operators
    and filters (see the module docstring)."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})
    code_generator_class = _RowCodeGenerator

    def __init__(self) -> None:
        super().__init__(undefined=StrictUndefined, autoescape=False, keep_trailing_newline=False)
        self.filters = {name: _charged(name, BOUNDED_FILTERS.get(name, f)) for name, f in self.filters.items()}

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        """Refuse every attribute access except Jinja's own ``loop`` helpers (``loop.index``)."""
        return isinstance(obj, LoopContext) and super().is_safe_attribute(obj, attr, value)

    def is_safe_callable(self, obj: Any) -> bool:
        """Refuse every call from a template (``range``/``dict``/methods alike); filters still run."""
        return False

    def block_buffer(self) -> list[Any]:
        """The buffer compiled templates collect a block body in (appends are charged to the budget)."""
        return _BoundedBuffer()

    def call_concat(self, parts: tuple[Any, ...]) -> str:
        """``~``: the parts' text joined, refused when it would pass the row limit.

        Raises:
            SecurityError: the result would be too large.
        """
        texts = [str(p) for p in parts]
        _budget().charge(sum(len(t) for t in texts), "concatenation (~)")
        return "".join(texts)

    def call_binop(self, context: Any, operator_name: str, left: Any, right: Any) -> Any:
        """``*``, ``**``, ``+`` and ``%`` with size limits (:data:`MAX_REPEAT_CHARS`,
        :data:`MAX_POWER_EXPONENT`, :data:`MAX_INT_BITS`, the row limit).

        Raises:
            SecurityError: the result would be too large.
        """
        budget = _budget()
        if operator_name == "**":
            if isinstance(right, int | float) and abs(right) > MAX_POWER_EXPONENT:
                raise SecurityError(f"exponent {right} is above the template limit {MAX_POWER_EXPONENT}")
            if isinstance(left, int) and isinstance(right, int) and left.bit_length() * right > MAX_INT_BITS:
                raise SecurityError(f"the power would have more than {MAX_INT_BITS} bits")
            return operator.pow(left, right)
        if operator_name == "+":
            if isinstance(left, str | list | tuple) and isinstance(right, str | list | tuple):
                budget.charge(_weight(left) + _weight(right), "concatenation (+)")
            return operator.add(left, right)
        if operator_name == "%":
            if isinstance(left, str):
                _check_percent(left, right, "formatting (%)")
                result = operator.mod(left, right)
                budget.charge(len(result), "formatting (%)")
                return result
            return operator.mod(left, right)
        for seq, count in ((left, right), (right, left)):
            if isinstance(seq, str | list | tuple) and isinstance(count, int):
                weight = _weight(seq) * count  # a list repeated prints each item's text that often
                if weight > MAX_REPEAT_CHARS:
                    raise SecurityError(f"repetition builds more than {MAX_REPEAT_CHARS} characters")
                budget.charge(max(weight, 0), "repetition (*)")
        if isinstance(left, int) and isinstance(right, int) and left.bit_length() + right.bit_length() > MAX_INT_BITS:
            raise SecurityError(f"the product would have more than {MAX_INT_BITS} bits")
        return operator.mul(left, right)


_ENV = RowTemplateEnvironment()


def compile_template(source: str, field_name: str = "engine.user_template") -> jinja2.Template:
    """Parse ``source`` in the row sandbox.

    Raises:
        ConfigError: syntax error; the message names ``field_name`` and the line.
    """
    try:
        return _ENV.from_string(source)
    except TemplateError as exc:
        line = getattr(exc, "lineno", None)
        where = f" (line {line})" if line else ""
        raise ConfigError(f"{field_name}: template syntax error{where}: {exc}") from None


def template_fields(source: str) -> set[str]:
    """Names the template reads from its context (row fields it needs), e.g. ``{"text", "title"}``.

    Raises:
        ConfigError: syntax error.
    """
    try:
        return set(meta.find_undeclared_variables(_ENV.parse(source)))
    except TemplateError as exc:
        raise ConfigError(f"engine.user_template: template syntax error: {exc}") from None


def template_columns(config: LLMConfig) -> list[str]:
    """Input columns the user template reads, other than the ``id``/``text`` aliases (sorted).

    Raises:
        ConfigError: syntax error.
    """
    return sorted(template_fields(config.user_template) - {"id", "text"})


def validate_template(config: LLMConfig, available_fields: Sequence[str]) -> None:
    """Check the user template against the input's columns: it compiles in the row sandbox, and reads
    only columns (the contract's :func:`~batch_contract.llm_config.check_user_template`, which the
    planner runs at plan time).

    Args:
        config: the LLM engine config.
        available_fields: input column names; ``id`` and ``text`` are always available as aliases of
            the id and text columns.

    Raises:
        ConfigError: syntax error, or the template reads a field that is not a column (names it).
    """
    compile_template(config.user_template)
    check_user_template(config, list(available_fields))


class RowRenderError(ValueError):
    """A row's template failed to render (missing field, sandbox violation, an operation over the row's
    limits); dead-letter ``template_error`` (:class:`PromptTooLongRenderError`: ``too_long``)."""


class PromptTooLongRenderError(RowRenderError):
    """The row's rendered user message passed the row's character limit; dead-letter ``too_long``."""


@dataclass(frozen=True)
class PromptParts:
    """The pieces of one row's prompt, before the chat template."""

    system_prompt: str
    few_shot: list[dict[str, str]]
    user: str
    chat: list[dict[str, str]] | None = None
    """The row's whole conversation (``engine.row_messages``); ``None``: built from the parts above."""

    def messages(self) -> list[dict[str, str]]:
        """Chat messages ``[{"role": ..., "content": ...}, ...]`` (OpenAI/HF chat format)."""
        if self.chat is not None:
            return [dict(m) for m in self.chat]
        out: list[dict[str, str]] = []
        if self.system_prompt:
            out.append({"role": "system", "content": self.system_prompt})
        for example in self.few_shot:
            out.append({"role": "user", "content": example["user"]})
            out.append({"role": "assistant", "content": example["assistant"]})
        out.append({"role": "user", "content": self.user})
        return out

    def plain_text(self) -> str:
        """Prompt for a base model: the parts joined by :data:`PLAIN_SEPARATOR`."""
        pieces = [self.system_prompt] if self.system_prompt else []
        for example in self.few_shot:
            pieces.extend([example["user"], example["assistant"]])
        pieces.append(self.user)
        return PLAIN_SEPARATOR.join(pieces)


class PromptRenderer:
    """Renders rows into prompt token ids: sandboxed user template, then chat template, then tokenizer.

    Args:
        config: the LLM engine config (templates, ``use_chat_template``).
        tokenizer: a Hugging Face tokenizer (``apply_chat_template``, ``encode``); ``None`` renders text
            only (:meth:`render_text` works, :meth:`render_ids` raises ``RuntimeError``).
        max_chars: the row's character limit (rendered user message, and any one value its template
            builds); default ``config.max_prompt_chars``.

    Raises:
        ConfigError: the user template does not compile; ``use_chat_template`` but the tokenizer has no
            chat template.
    """

    def __init__(self, config: LLMConfig, tokenizer: Any | None = None, max_chars: int | None = None) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.max_chars = config.max_prompt_chars if max_chars is None else max_chars
        self._template = compile_template(config.user_template)
        if tokenizer is not None and config.use_chat_template and not getattr(tokenizer, "chat_template", None):
            raise ConfigError(
                "engine.use_chat_template: the model's tokenizer has no chat template; set it to false "
                "for a base model or use an instruction-tuned model"
            )

    def user_message(self, row: Mapping[str, Any]) -> str:
        """The row's user message (the rendered ``user_template``).

        Args:
            row: row fields by name (input columns plus the ``id``/``text`` aliases).

        Raises:
            PromptTooLongRenderError: the message passed :attr:`max_chars` characters (rendering stops
                there).
            RowRenderError: undefined field, sandbox violation (an operation over the row's limits
                included) or any other error the template raised (``MemoryError`` is not caught).
        """
        pieces: list[str] = []
        length = 0
        try:
            with render_budget(self.max_chars):
                for piece in self._template.generate(dict(row)):
                    length += len(piece)
                    if length > self.max_chars:
                        raise PromptTooLongRenderError(
                            f"the rendered user message passed {self.max_chars} characters (engine "
                            "max_prompt_chars); rendering stopped there")
                    pieces.append(piece)
        except (RowRenderError, MemoryError):
            raise
        except Exception as exc:  # noqa: BLE001 - any error a template raises (a filter's assert) is the row's
            raise RowRenderError(f"{type(exc).__name__}: {exc}") from None
        return "".join(pieces)

    def parts(self, row: Mapping[str, Any]) -> PromptParts:
        """Prompt parts of ``row`` (see :meth:`user_message` and :func:`row_messages` for errors)."""
        if self.config.row_messages:
            chat = row_messages(row.get("text"), self.max_chars)
            return PromptParts("", [], "".join(m["content"] for m in chat), chat=chat)
        return PromptParts(self.config.system_prompt, list(self.config.few_shot), self.user_message(row))

    def render_text(self, parts: PromptParts) -> str:
        """The full prompt string: the tokenizer's chat template (with generation prompt) or plain text."""
        if not self.config.use_chat_template:
            return parts.plain_text()
        if self.tokenizer is None:
            raise RuntimeError("render_text with use_chat_template needs a tokenizer")
        return self.tokenizer.apply_chat_template(parts.messages(), tokenize=False, add_generation_prompt=True)

    def render_ids(self, parts: PromptParts) -> list[int]:
        """Prompt token ids as the engine will see them (counted before generation).

        The chat template already writes the special tokens (BOS), so they are not added again; a plain
        prompt gets the tokenizer's usual special tokens.
        """
        if self.tokenizer is None:
            raise RuntimeError("render_ids needs a tokenizer")
        text = self.render_text(parts)
        return list(self.tokenizer.encode(text, add_special_tokens=not self.config.use_chat_template))

    def prefix_text(self) -> str:
        """The shared prefix as text (chat template applied to system + few-shot only), for reports."""
        parts = PromptParts(self.config.system_prompt, list(self.config.few_shot), "")
        if not self.config.use_chat_template:
            return parts.plain_text()
        messages = parts.messages()[:-1]
        if not messages or self.tokenizer is None:
            return ""
        return self.tokenizer.apply_chat_template(messages, tokenize=False)


MESSAGE_ROLES = frozenset({"system", "user", "assistant"})
"""Roles of a row's own conversation (``engine.row_messages``)."""


def row_messages(text: Any, max_chars: int) -> list[dict[str, str]]:
    """A row's conversation from its text (``engine.row_messages``): a JSON array of
    ``{"role", "content"}`` objects, roles in :data:`MESSAGE_ROLES`, contents strings.

    Raises:
        PromptTooLongRenderError: the contents together pass ``max_chars`` characters.
        RowRenderError: the text is not such an array (the message says what is wrong).
    """
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except (ValueError, RecursionError):
        value = None
    if not isinstance(value, list) or not value:
        raise RowRenderError("engine.row_messages: the row's text is not a JSON array of chat messages")
    chat = []
    for i, m in enumerate(value):
        if not (isinstance(m, dict) and m.get("role") in MESSAGE_ROLES and isinstance(m.get("content"), str)):
            raise RowRenderError(f"engine.row_messages: message {i} is not {{'role': system|user|assistant, "
                                 "'content': string}")
        chat.append({"role": m["role"], "content": m["content"]})
    if sum(len(m["content"]) for m in chat) > max_chars:
        raise PromptTooLongRenderError(f"the row's messages pass {max_chars} characters (engine max_prompt_chars)")
    return chat


def row_context(fields: Mapping[str, Any], row_id: str, text: str) -> dict[str, Any]:
    """Template context of one row: its input columns plus the ``id`` and ``text`` aliases."""
    context = dict(fields)
    context["id"] = row_id
    context["text"] = text
    return context
