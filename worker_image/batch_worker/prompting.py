"""Prompt rendering for the LLM engine: a sandboxed Jinja user template plus the tokenizer's chat template.

No vLLM or torch import here. The Airflow side never imports this module: the planner checks the template
with the contract's :func:`batch_contract.llm_config.check_user_template`, which
:func:`validate_template` also applies (after compiling in this sandbox).

Sandbox: templates come from people filling in a form, so they are rendered by
:class:`RowTemplateEnvironment`, an ``ImmutableSandboxedEnvironment`` that additionally refuses *every*
attribute access and every call (``{{ text.upper() }}``, ``{{ text.__class__ }}``,
``{{ cycler.__init__.__globals__ }}`` all fail), caps string/list repetition and powers so a template
cannot allocate gigabytes, and treats an undefined name as an error (``StrictUndefined``). Filters
(``{{ text | upper | truncate(200) }}``), conditionals and loops still work.

Prompt layout (chat models, ``use_chat_template=True``)::

    [system: system_prompt] [user: few_shot[0].user] [assistant: few_shot[0].assistant] ... [user: row]

rendered by the tokenizer's own chat template with the generation prompt appended. Everything before the
row's turn is identical for every row: the prefix vLLM's prefix cache serves after the first row.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jinja2
from batch_contract.engine_config import ConfigError
from batch_contract.llm_config import LLMConfig, check_user_template
from jinja2 import StrictUndefined, meta
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment

MAX_REPEAT_CHARS = 100_000
"""Largest string/list a template may build with ``*`` (items or characters)."""
MAX_POWER_EXPONENT = 64
"""Largest exponent a template may use with ``**``."""
PLAIN_SEPARATOR = "\n\n"
"""Separator between parts of a prompt when no chat template is applied."""


class RowTemplateEnvironment(ImmutableSandboxedEnvironment):
    """Jinja sandbox for user-supplied row templates: no attribute access, no calls, bounded operators."""

    intercepted_binops = frozenset({"*", "**"})

    def __init__(self) -> None:
        super().__init__(undefined=StrictUndefined, autoescape=False, keep_trailing_newline=False)

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        """Refuse every attribute access except Jinja's own ``loop`` helpers (``loop.index``)."""
        return isinstance(obj, LoopContext) and super().is_safe_attribute(obj, attr, value)

    def is_safe_callable(self, obj: Any) -> bool:
        """Refuse every call from a template (``range``/``dict``/methods alike); filters still run."""
        return False

    def call_binop(self, context: Any, operator_name: str, left: Any, right: Any) -> Any:
        """``*`` and ``**`` with size limits (see :data:`MAX_REPEAT_CHARS`, :data:`MAX_POWER_EXPONENT`).

        Raises:
            SecurityError: the result would be too large.
        """
        if operator_name == "**":
            if isinstance(right, int | float) and abs(right) > MAX_POWER_EXPONENT:
                raise SecurityError(f"exponent {right} is above the template limit {MAX_POWER_EXPONENT}")
            return operator.pow(left, right)
        for seq, count in ((left, right), (right, left)):
            if isinstance(seq, str | list | tuple) and isinstance(count, int):
                if len(seq) * count > MAX_REPEAT_CHARS:
                    raise SecurityError(f"repetition builds more than {MAX_REPEAT_CHARS} items")
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
    """A row's template failed to render (missing field, sandbox violation); dead-letter ``template_error``."""


@dataclass(frozen=True)
class PromptParts:
    """The pieces of one row's prompt, before the chat template."""

    system_prompt: str
    few_shot: list[dict[str, str]]
    user: str

    def messages(self) -> list[dict[str, str]]:
        """Chat messages ``[{"role": ..., "content": ...}, ...]`` (OpenAI/HF chat format)."""
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

    Raises:
        ConfigError: the user template does not compile; ``use_chat_template`` but the tokenizer has no
            chat template.
    """

    def __init__(self, config: LLMConfig, tokenizer: Any | None = None) -> None:
        self.config = config
        self.tokenizer = tokenizer
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
            RowRenderError: undefined field, sandbox violation or any other template runtime error.
        """
        try:
            return self._template.render(dict(row))
        except (TemplateError, TypeError, ValueError, ArithmeticError, OverflowError) as exc:
            raise RowRenderError(f"{type(exc).__name__}: {exc}") from None

    def parts(self, row: Mapping[str, Any]) -> PromptParts:
        """Prompt parts of ``row`` (see :meth:`user_message` for errors)."""
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


def row_context(fields: Mapping[str, Any], row_id: str, text: str) -> dict[str, Any]:
    """Template context of one row: its input columns plus the ``id`` and ``text`` aliases."""
    context = dict(fields)
    context["id"] = row_id
    context["text"] = text
    return context
