"""LLM engine configuration (``engine.kind == "llm"``), carried in the manifest, validated when built.

Stdlib only (part of the contract). :data:`batch_contract.engines.ENGINE_CONFIG_TYPES` maps
``EngineKind.LLM`` to :class:`LLMConfig`.

The prompt is three parts: ``system_prompt`` and ``few_shot`` are identical for every row (the
cacheable prefix vLLM's prefix cache serves after the first row), ``user_template`` is a Jinja template
over named row fields (``id``, ``text``) rendered in a sandbox by ``batch_worker.prompting``. All three
live in the engine dict, so :func:`batch_contract.manifest.config_fingerprint` (a hash of the normalised engine
dict minus its speed-only fields) changes when any of them changes and a changed prompt never reuses
committed rows.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, ClassVar

from batch_contract.engine_config import ConfigError, _check, _known_fields
from batch_contract.enums import EngineKind

PROMPT_CHARS_PER_TOKEN = 32
"""Characters per token of ``max_model_len`` allowed in a row's rendered user message
(:attr:`LLMConfig.max_prompt_chars`): far above what real text averages (about 4 for English), so a
message that could fit the context is never refused for its length in characters."""
MIN_MAX_PROMPT_CHARS = 1 << 16
"""Smallest :attr:`LLMConfig.max_prompt_chars` (65,536 characters), for very short contexts."""
DEFAULT_MAX_PROMPT_CHARS = PROMPT_CHARS_PER_TOKEN * 4096
"""The character limit of the default ``max_model_len`` (4,096 tokens): 131,072 characters. The worker's
template sandbox uses it for rendering outside a configured renderer."""

LLM_DTYPES = ("auto", "bfloat16", "float16", "float32")
LLM_QUANTIZATIONS = (None, "fp8")
FEW_SHOT_KEYS = frozenset({"user", "assistant"})
OPTIONAL_DEFAULTS = {"row_messages": False, "row_sampling_column": None}
"""Fields :meth:`LLMConfig.to_dict` leaves out at these defaults, so that configs written before the fields
existed keep their manifest form and fingerprint."""
ROW_SAMPLING_KEYS = ("max_tokens", "temperature", "top_p", "seed", "stop", "json_schema")
"""Keys a row's own sampling settings may give (:attr:`LLMConfig.row_sampling_column`)."""


def _check_str_list(value: Any, field_name: str) -> None:
    _check(isinstance(value, list | tuple) and all(isinstance(s, str) and s for s in value),
           field_name, "must be a list of non-empty strings")


def _check_few_shot(value: Any) -> None:
    _check(isinstance(value, list | tuple), "engine.few_shot",
           "must be a list of {'user': str, 'assistant': str} examples")
    for i, example in enumerate(value):
        _check(isinstance(example, dict) and set(example) == FEW_SHOT_KEYS
               and all(isinstance(example[k], str) for k in FEW_SHOT_KEYS),
               f"engine.few_shot[{i}]", "must be an object with exactly the string keys 'user' and 'assistant'")


def _parse_json_schema(text: str) -> Any:
    """``engine.json_schema`` given as JSON text: the parsed value, keys in the text's order.

    Raises:
        ConfigError: the text is not JSON (the message names the field and the position).
    """
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, over-long integers, deep nesting
        raise ConfigError(f"engine.json_schema: is a string but not JSON text ({type(exc).__name__})") from None
    _check(isinstance(value, dict), "engine.json_schema", "is a string whose JSON text is not an object")
    return value


def _check_json_schema(value: Any) -> None:
    if value is None:
        return
    _check(isinstance(value, dict) and value, "engine.json_schema",
           "must be a non-empty JSON Schema object (e.g. {'type': 'object', 'properties': {...}})")
    try:
        json.dumps(value, allow_nan=False, ensure_ascii=False).encode("utf-8")
    except (TypeError, ValueError, RecursionError) as exc:  # UnicodeEncodeError (a lone surrogate) too
        raise ConfigError(f"engine.json_schema: is not plain JSON ({exc})") from None
    schema_type = value.get("type")
    _check(schema_type is None or isinstance(schema_type, str | list), "engine.json_schema",
           "'type' must be a string or a list of strings")


@dataclass(frozen=True)
class LLMConfig:
    """An LLM generation job run through vLLM's offline ``LLM.generate`` (one call per chunk).

    Every field below except those in :attr:`NOT_IN_FINGERPRINT` is part of the fingerprint, including
    the prompt templates and sampling parameters: change any and committed rows are re-done.
    """

    NOT_IN_FINGERPRINT: ClassVar[frozenset[str]] = frozenset(
        {"gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching"})
    """Fields left out of :func:`batch_contract.manifest.config_fingerprint`: KV-cache memory, scheduler
    concurrency and prefix-cache reuse change which rows share a step (speed), not what a row generates,
    like the worker's batching settings. Fields that change kernels or sharding (``dtype``,
    ``quantization``, ``enforce_eager``, ``tensor_parallel_size``) stay in."""

    kind: str = EngineKind.LLM.value
    model_path: str = ""
    """Local model directory in Hugging Face layout (config, weights, tokenizer with a chat template).
    Required. Never a hub name: the worker never downloads (bake weights into the image or sync them
    to local disk at start)."""
    dtype: str = "auto"
    """Weights/activations dtype passed to vLLM: ``auto`` (the checkpoint's), ``bfloat16``,
    ``float16`` or ``float32``."""
    quantization: str | None = None
    """``None`` (weights as stored) or ``"fp8"`` (online FP8 weight quantization: Hopper or newer;
    validate on a sample with the quality gate before a full run)."""
    max_model_len: int = 4096
    """Context length in tokens (prompt + output). A row whose prompt exceeds
    ``max_model_len - max_tokens`` tokens is dead-lettered ``too_long`` instead of failing its chunk."""
    gpu_memory_utilization: float = 0.92
    """Fraction of GPU memory vLLM may take for weights + KV cache (offline: no traffic spikes, so high).
    Ignored on CPU, where ``VLLM_CPU_KVCACHE_SPACE`` (GiB) sizes the KV cache."""
    max_num_seqs: int | None = None
    """Sequences the scheduler runs concurrently. ``None`` (default): vLLM's own offline default for the
    device (it sizes it by GPU class: on large GPUs above the 512 this field used to default to); set
    it to override (the autotuner may). The engine caps it on CPU (see
    ``batch_worker.engines.llm.CPU_MAX_NUM_SEQS``)."""
    max_num_batched_tokens: int | None = None
    """Tokens per scheduler step (prefill chunk size). ``None`` (default): vLLM's own offline default
    for the device; set it to override."""
    enable_prefix_caching: bool = True
    """Reuse the KV cache of the shared prefix (system prompt + few-shot block) across rows."""
    tensor_parallel_size: int = 1
    """GPUs per model copy. Prefer 1 (data parallelism across shards) unless the model does not fit."""
    enforce_eager: bool = False
    """Disable CUDA graphs (always on for CPU). Saves start-up time on short shards."""
    seed: int = 0
    """Sampling seed (only matters when ``temperature > 0``)."""
    system_prompt: str = ""
    """System message shared by every row (start of the cacheable prefix); ``""``: no system message.
    Plain text, not a template."""
    few_shot: list[dict[str, str]] = field(default_factory=list)
    """Example turns ``[{"user": ..., "assistant": ...}, ...]`` placed after the system prompt and before
    the row's turn; shared by every row (end of the cacheable prefix). Plain text, not templates."""
    user_template: str = "{{ text }}"
    """Jinja template of the row's user message over the row fields ``id`` and ``text`` (rendered in a
    sandbox with undefined names as errors: a template error dead-letters the row ``template_error``).
    Checked at plan time by :func:`check_user_template` (syntax; for Parquet input also that every field
    it reads is a column) when ``jinja2`` is installed, as it is beside Airflow."""
    use_chat_template: bool = True
    """Apply the tokenizer's chat template (instruction-tuned models). ``False``: the prompt is the plain
    concatenation system prompt + few-shot pairs + user message, separated by blank lines (base models)."""
    temperature: float = 0.0
    """Sampling temperature; 0 is greedy (deterministic, what extraction and classification want)."""
    top_p: float = 1.0
    """Nucleus sampling mass, in (0, 1]."""
    max_tokens: int | None = None
    """Maximum generated tokens per row. Required: decode cost is linear in output tokens, so this is
    the biggest cost lever; a row that hits it has ``finish_reason == "length"``."""
    stop: list[str] = field(default_factory=list)
    """Stop strings; generation ends before the first one (it is not included in the output)."""
    json_schema: dict[str, Any] | str | None = None
    """JSON Schema of the output. Set: generation is constrained through vLLM structured outputs and
    every output is parsed and validated against it (invalid -> dead letter ``invalid_output`` with the
    reason); results carry the canonical JSON in ``output_json``. ``None``: free text. Structured output
    writes the keys in the schema's ``properties`` order; a string holding the schema's JSON text is
    parsed here (an object afterwards) and keeps the order of the text, which a run's conf does not
    always keep: Airflow stores ``dag_run.conf`` as JSONB on a PostgreSQL metadata database, and JSONB
    reorders object keys."""
    row_messages: bool = False
    """The row's text is its whole conversation: a JSON array of chat messages ``[{"role", "content"},
    ...]`` (roles ``system``, ``user``, ``assistant``; an OpenAI batch chat request's ``messages``,
    :mod:`batch_contract.openai_batch`). The prompt is the tokenizer's chat template over exactly those
    messages (with the generation prompt), as vLLM's chat endpoint renders them; ``system_prompt``,
    ``few_shot`` and ``user_template`` must stay at their defaults. A text that is not such an array is
    dead-lettered ``template_error``. Left out of the manifest (and fingerprint) when false."""
    row_sampling_column: str | None = None
    """Input column holding each row's own sampling settings as a JSON object (text) with any of
    ``max_tokens``, ``temperature``, ``top_p``, ``seed``, ``stop``, ``json_schema``: each given key
    replaces the engine's setting for that row (validated like the engine's; an invalid one
    dead-letters the row ``template_error``). The column's value is part of the row's reuse key.
    ``None``: every row uses the engine's settings. Left out of the manifest (and fingerprint) when
    ``None``."""
    constrain_output: bool = True
    """With ``json_schema``: constrain decoding to the schema (vLLM structured outputs, compact JSON with
    no free whitespace). ``False``: generate freely and only validate afterwards (for models or backends
    where constrained decoding is unavailable, or to measure how often a model follows the schema
    unaided). Ignored without a schema."""

    def __post_init__(self) -> None:
        _check(self.kind == EngineKind.LLM.value, "engine.kind", "must be 'llm'")
        _check(isinstance(self.model_path, str) and bool(self.model_path.strip()), "engine.model_path",
               "is required: a local model directory in Hugging Face layout")
        _check(self.dtype in LLM_DTYPES, "engine.dtype", f"{self.dtype!r} is not one of {list(LLM_DTYPES)}")
        _check(self.quantization in LLM_QUANTIZATIONS, "engine.quantization",
               f"{self.quantization!r} is not null or 'fp8'")
        _check(_is_int(self.max_model_len) and 16 <= self.max_model_len <= 1_048_576, "engine.max_model_len",
               f"{self.max_model_len!r} is not an integer in 16..1048576")
        _check(_is_num(self.gpu_memory_utilization) and 0.05 <= self.gpu_memory_utilization <= 0.99,
               "engine.gpu_memory_utilization", f"{self.gpu_memory_utilization!r} is outside 0.05..0.99")
        _check(self.max_num_seqs is None or (_is_int(self.max_num_seqs) and 1 <= self.max_num_seqs <= 8192),
               "engine.max_num_seqs", f"{self.max_num_seqs!r} is not null or an integer in 1..8192")
        _check(self.max_num_batched_tokens is None
               or (_is_int(self.max_num_batched_tokens) and 16 <= self.max_num_batched_tokens <= 1 << 20),
               "engine.max_num_batched_tokens", f"{self.max_num_batched_tokens!r} is not null or an integer "
               "in 16..1048576")
        _check(isinstance(self.enable_prefix_caching, bool), "engine.enable_prefix_caching", "must be a boolean")
        _check(_is_int(self.tensor_parallel_size) and self.tensor_parallel_size in {1, 2, 4, 8},
               "engine.tensor_parallel_size", f"{self.tensor_parallel_size!r} is not 1, 2, 4 or 8")
        _check(isinstance(self.enforce_eager, bool), "engine.enforce_eager", "must be a boolean")
        _check(_is_int(self.seed) and self.seed >= 0, "engine.seed", "must be an integer >= 0")
        _check(isinstance(self.system_prompt, str), "engine.system_prompt", "must be a string")
        _check_few_shot(self.few_shot)
        _check(isinstance(self.user_template, str) and bool(self.user_template.strip()),
               "engine.user_template", "must be a non-empty Jinja template, e.g. '{{ text }}'")
        _check(isinstance(self.use_chat_template, bool), "engine.use_chat_template", "must be a boolean")
        _check(_is_num(self.temperature) and 0.0 <= self.temperature <= 2.0, "engine.temperature",
               f"{self.temperature!r} is outside 0..2")
        _check(_is_num(self.top_p) and 0.0 < self.top_p <= 1.0, "engine.top_p", f"{self.top_p!r} is outside (0, 1]")
        _check(self.max_tokens is not None, "engine.max_tokens",
               "is required: cap generated tokens per row (the biggest cost lever)")
        _check(_is_int(self.max_tokens) and 1 <= self.max_tokens < self.max_model_len, "engine.max_tokens",
               f"{self.max_tokens!r} is not an integer in 1..max_model_len-1 ({self.max_model_len - 1})")
        _check_str_list(self.stop, "engine.stop")
        if isinstance(self.json_schema, str):
            object.__setattr__(self, "json_schema", _parse_json_schema(self.json_schema))
        _check_json_schema(self.json_schema)
        _check(isinstance(self.constrain_output, bool), "engine.constrain_output", "must be a boolean")
        _check(isinstance(self.row_messages, bool), "engine.row_messages", "must be a boolean")
        _check(not self.row_messages or (self.use_chat_template and not self.system_prompt and not self.few_shot
                                         and self.user_template == "{{ text }}"), "engine.row_messages",
               "takes the whole conversation from the row: leave system_prompt, few_shot and user_template "
               "unset and use_chat_template true")
        _check(self.row_sampling_column is None or (isinstance(self.row_sampling_column, str)
                                                    and bool(self.row_sampling_column.strip())),
               "engine.row_sampling_column", "must be null or an input column name")
        limit = self.max_prompt_chars
        _check(len(self.user_template) <= limit, "engine.user_template",
               f"is {len(self.user_template)} characters, above the limit {limit} (max_prompt_chars)")
        prefix = len(self.system_prompt) + sum(len(e["user"]) + len(e["assistant"]) for e in self.few_shot)
        _check(prefix <= limit, "engine.system_prompt",
               f"with the few_shot texts is {prefix} characters, above the limit {limit} (max_prompt_chars)")

    @property
    def max_prompt_chars(self) -> int:
        """Character limit of a row's prompt parts: ``max(MIN_MAX_PROMPT_CHARS, PROMPT_CHARS_PER_TOKEN *
        max_model_len)`` (131,072 at the default 4,096 tokens). The worker stops rendering a row's user
        message past it (dead letter ``too_long``) and refuses any single string or list its template
        would build past it (``template_error``; ``batch_worker.prompting``); the user template and the
        shared prefix (system prompt and few-shot texts together) are refused at plan time past it.
        Derived, not a field: the fingerprint does not change."""
        return max(MIN_MAX_PROMPT_CHARS, PROMPT_CHARS_PER_TOKEN * self.max_model_len)

    @property
    def max_prompt_tokens(self) -> int:
        """Longest prompt (tokens) that still leaves room for ``max_tokens``: ``max_model_len - max_tokens``."""
        return self.max_model_len - int(self.max_tokens or 0)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (lists, not tuples), as stored in the manifest."""
        data = asdict(self)
        data["few_shot"] = [dict(e) for e in self.few_shot]
        data["stop"] = list(self.stop)
        for name, default in OPTIONAL_DEFAULTS.items():  # absent at their defaults: older fingerprints hold
            if data[name] == default:
                del data[name]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LLMConfig:
        """Build and validate from a manifest/Params dict.

        Raises:
            ConfigError: unknown or invalid field; the message names it.
        """
        return cls(**_known_fields(cls, dict(data), "engine"))


def user_template_fields(source: str) -> set[str] | None:
    """Names the Jinja template ``source`` reads from its context (``{"text", "title"}``); ``None`` when
    ``jinja2`` is not installed (the contract itself is stdlib-only, so the import is optional).

    Raises:
        ConfigError: syntax error (the message names ``engine.user_template`` and the line).
    """
    try:
        import jinja2
        from jinja2 import meta
    except ImportError:
        return None
    try:
        return set(meta.find_undeclared_variables(jinja2.Environment().parse(source)))
    except jinja2.TemplateSyntaxError as exc:
        raise ConfigError(f"engine.user_template: template syntax error (line {exc.lineno}): {exc}") from None


def check_user_template(config: LLMConfig, columns: Sequence[str] | None) -> None:
    """Plan-time check of ``config.user_template``: it parses, and every field it reads is one of
    ``columns`` or the aliases ``id``/``text``. Skipped when ``jinja2`` is missing; the column check is
    skipped when ``columns`` is ``None`` (JSONL rows have no fixed columns: a row missing a field is
    dead-lettered ``template_error`` by the worker).

    Args:
        config: the LLM engine config.
        columns: the input's column names, or ``None`` when not known.

    Raises:
        ConfigError: syntax error, or a field that is not a column (the message names it).
    """
    used = user_template_fields(config.user_template)
    if used is None or columns is None:
        return
    available = set(columns) | {"id", "text"}
    unknown = sorted(used - available)
    if unknown:
        raise ConfigError(f"engine.user_template: reads field(s) {unknown} that are not input columns; "
                          f"available: {sorted(available)}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_num(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)



def with_row_sampling(config: LLMConfig, raw: Any) -> LLMConfig:
    """``config`` with one row's own sampling settings applied (:attr:`LLMConfig.row_sampling_column`).

    Args:
        config: the engine's config.
        raw: the row's value: JSON text of an object with keys of :data:`ROW_SAMPLING_KEYS`, a dict, or
            ``None`` / ``""`` (no settings of its own).

    Returns:
        The row's config (``config`` itself when the row gives none), validated like the engine's.

    Raises:
        ConfigError: not a JSON object, an unknown key, or a value the engine's config refuses (the
            message names the field, e.g. ``engine.temperature: 3 is outside 0..2``).
    """
    if raw is None or raw == "":
        return config
    try:
        value = json.loads(raw) if isinstance(raw, str) else raw
    except (ValueError, RecursionError):
        raise ConfigError("row sampling settings: not JSON text") from None
    _check(isinstance(value, dict), "row sampling settings", "must be a JSON object")
    unknown = sorted(set(value) - set(ROW_SAMPLING_KEYS))
    _check(not unknown, "row sampling settings", f"unknown key(s) {unknown}; allowed: {list(ROW_SAMPLING_KEYS)}")
    return replace(config, **value) if value else config
