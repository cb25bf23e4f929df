"""Deployment settings per DAG: what a trigger-form user may name, and the ceilings no Param may pass.

A person who may trigger a DAG chooses Params; the platform team that deploys it chooses, per DAG, the
bounds those Params must stay inside (docs/security.md):

* ``input_roots`` / ``output_roots``: storage roots (local directories, ``gs://bucket[/prefix]``) under
  which ``input_uri`` (every file it expands to, after ``realpath``), and ``output_root`` /
  ``duckdb_path`` must lie.
* ``model_roots``: where ``model`` (a run's model directory, or an Asset event's ``model_path``) must
  lie: a model directory is loaded as trusted weights and configuration, so the platform team, not a
  form user, decides where a worker may load one from.
* ``postgres_conn_ids`` / ``iceberg_catalog_conn_ids``: the only Airflow connections publish may use.
* ceilings: ``max_token_budget`` (tokens per batch), ``max_max_tokens`` (LLM tokens generated per row),
  ``max_budget_usd`` (a run's budget; a run that gives none gets this one), ``max_deadline_hours``,
  ``max_parallelism`` (local shards at once, and pods at once for ``max_gpus``), ``max_line_bytes`` (one
  JSONL line) and ``max_row_group_bytes`` (one Parquet row group, uncompressed).

Where they come from: the JSON file named by ``BATCH_INFERENCE_POLICY``
(``{"defaults": {...}, "dags": {"<dag_id>": {...}}}``; a DAG's entry overrides the defaults key by key,
and an unknown key or a wrong type is a :class:`ConfigError` naming it). Without that file: the roots of
``BATCH_INFERENCE_ALLOWED_ROOTS`` (:func:`batch_inference.locations.allowed_roots`) for both inputs and
outputs, the connections of ``BATCH_INFERENCE_ALLOWED_CONN_IDS`` (comma-separated; default
``batch_inference_postgres``), those roots plus the bundled model's directory and ``/models`` (the
worker image's) for models, and the built-in ceilings below.

A value outside these bounds is a ``ConfigError`` naming the Param and the setting, never the allowed
values themselves (a form user learns nothing about other teams' roots or connections).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from batch_contract.engine_config import ConfigError

from batch_inference.locations import allowed_roots, default_model_path, normalize_roots

POLICY_ENV = "BATCH_INFERENCE_POLICY"
"""Path of the deployment's policy file (JSON); unset: the environment's defaults (module docstring)."""
CONN_IDS_ENV = "BATCH_INFERENCE_ALLOWED_CONN_IDS"
"""Comma-separated Airflow connection ids publish may use when no policy file is set."""
DEFAULT_CONN_IDS = ("batch_inference_postgres",)
DEFAULT_MAX_LINE_BYTES = 8 * 1024 * 1024
"""8 MiB: one JSONL line (a row's whole JSON object) longer than this is a dead letter, not a read."""
DEFAULT_MAX_ROW_GROUP_BYTES = 256 * 1024 * 1024
"""256 MiB: the largest uncompressed Parquet row group a worker reads at once (the planner refuses
bigger ones; the writers' defaults stay far below: pyarrow writes 1 Mi rows per group)."""


@dataclass(frozen=True)
class DagPolicy:
    """The bounds one DAG's Params must stay inside (module docstring). Units: tokens, USD, hours,
    bytes; ``None`` for a ceiling: no ceiling.

    Attributes:
        input_roots: normalized storage roots inputs may come from.
        output_roots: normalized storage roots run outputs and DuckDB files may go to.
        model_roots: normalized roots a ``model`` directory must lie under (a path on the machine that
            runs the worker: the Airflow worker, or inside the worker image for pods).
        postgres_conn_ids: connections the postgres backend may publish through.
        iceberg_catalog_conn_ids: connections the iceberg backend's SQL catalog may use.
        max_token_budget: largest ``token_budget`` (tokens per batch).
        max_max_tokens: largest ``engine_options.max_tokens`` (tokens generated per row, LLM engine).
        max_budget_usd: largest ``budget_usd``; also the budget of a run that sets none.
        max_deadline_hours: largest ``deadline_hours``.
        max_parallelism: largest ``parallelism`` and ``max_gpus``.
        max_line_bytes: longest JSONL line a worker reads (bytes).
        max_row_group_bytes: largest uncompressed Parquet row group (bytes).
    """

    input_roots: tuple[str, ...] = ()
    output_roots: tuple[str, ...] = ()
    model_roots: tuple[str, ...] = ()
    postgres_conn_ids: tuple[str, ...] = DEFAULT_CONN_IDS
    iceberg_catalog_conn_ids: tuple[str, ...] = DEFAULT_CONN_IDS
    max_token_budget: int = 4_194_304
    max_max_tokens: int = 4096
    max_budget_usd: float | None = None
    max_deadline_hours: float = 720.0
    max_parallelism: int = 1024
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    max_row_group_bytes: int = DEFAULT_MAX_ROW_GROUP_BYTES

    def worker_limits(self) -> dict[str, int]:
        """The settings that travel to the worker in the manifest's ``worker`` (bytes)."""
        return {"max_line_bytes": self.max_line_bytes, "max_row_group_bytes": self.max_row_group_bytes}


_ROOT_KEYS = ("input_roots", "output_roots", "model_roots")
IMAGE_MODEL_ROOT = "/models"
"""Where the worker image keeps its models (``worker_image/Dockerfile``); a default model root."""
_ID_KEYS = ("postgres_conn_ids", "iceberg_catalog_conn_ids")
_INT_KEYS = ("max_token_budget", "max_max_tokens", "max_parallelism", "max_line_bytes", "max_row_group_bytes")
_NUMBER_KEYS = ("max_budget_usd", "max_deadline_hours")


def _ids(raw: Any, where: str) -> tuple[str, ...]:
    if not isinstance(raw, list) or not all(isinstance(x, str) and x.strip() for x in raw):
        raise ConfigError(f"{where}: expected a list of non-empty strings")
    return tuple(x.strip() for x in raw)


def _roots(raw: Any, where: str) -> tuple[str, ...]:
    return tuple(normalize_roots(_ids(raw, where), where))


def _value(key: str, raw: Any, where: str) -> Any:
    if key in _ROOT_KEYS:
        return _roots(raw, where)
    if key in _ID_KEYS:
        return _ids(raw, where)
    if key in _INT_KEYS:
        if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
            raise ConfigError(f"{where}: expected a positive integer")
        return raw
    if raw is None and key == "max_budget_usd":
        return None
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw) or raw <= 0:
        raise ConfigError(f"{where}: expected a positive number")
    return float(raw)


def _apply(base: DagPolicy, entry: Any, where: str) -> DagPolicy:
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{where}: expected a JSON object of settings")
    known = {f.name for f in fields(DagPolicy)}
    changes = {}
    for key, raw in entry.items():
        if key not in known:
            raise ConfigError(f"{where}.{key}: not a deployment setting (see docs/security.md)")
        changes[key] = _value(key, raw, f"{where}.{key}")
    return replace(base, **changes)


def _env_defaults(env: Mapping[str, str]) -> DagPolicy:
    roots = tuple(allowed_roots(env))
    ids = tuple(x.strip() for x in env.get(CONN_IDS_ENV, "").split(",") if x.strip()) or DEFAULT_CONN_IDS
    models = tuple(normalize_roots([*roots, os.path.dirname(default_model_path()), IMAGE_MODEL_ROOT], "model_roots"))
    return DagPolicy(input_roots=roots, output_roots=roots, model_roots=models, postgres_conn_ids=ids,
                     iceberg_catalog_conn_ids=ids)


def policy_for(dag_id: str | None, environ: Mapping[str, str] | None = None) -> DagPolicy:
    """The deployment's bounds for ``dag_id`` (``None``: the defaults), read at call time.

    Args:
        dag_id: the DAG being run.
        environ: environment to read (default ``os.environ``).

    Raises:
        ConfigError: the policy file cannot be read or parsed, or a setting is unknown or malformed (the
            message names the file's key, e.g. ``BATCH_INFERENCE_POLICY: dags.<id>.max_line_bytes``).
    """
    env = os.environ if environ is None else environ
    base = _env_defaults(env)
    path = env.get(POLICY_ENV, "").strip()
    if not path:
        return base
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{POLICY_ENV}: cannot read the policy file ({type(exc).__name__})") from None
    if not isinstance(data, Mapping) or not set(data) <= {"defaults", "dags"}:
        raise ConfigError(f"{POLICY_ENV}: expected an object with keys 'defaults' and 'dags'")
    policy = _apply(base, data.get("defaults", {}), f"{POLICY_ENV}: defaults")
    dags = data.get("dags", {})
    if not isinstance(dags, Mapping):
        raise ConfigError(f"{POLICY_ENV}: dags: expected an object keyed by DAG id")
    if dag_id is not None and dag_id in dags:
        policy = _apply(policy, dags[dag_id], f"{POLICY_ENV}: dags.{dag_id}")
    return policy
