"""The operator's model catalog of the OpenAI-compatible Files + Batches API (``docs/openai-batch.md``).

A JSON file named by ``BATCH_INFERENCE_OPENAI_CATALOG``::

    {"files_root": "gs://bucket/openai",           # where uploads and batch inputs are stored
     "output_root": "gs://bucket/out",             # the runs' output_root (default: files_root)
     "max_file_bytes": 209715200, "max_requests": 50000,   # optional, at most OpenAI's limits
     "models": {
       "minilm": {"dag_id": "batch_inference_backfill", "engine": "encoder",
                  "model": "/models/all-minilm-l6-v2", "params": {"rows_per_shard": 5000}},
       "qwen3-8b": {"dag_id": "batch_inference_llm_l4", "engine": "llm", "model": "/models/qwen3-8b",
                    "engine_options": {"max_model_len": 4096, "max_tokens": 256, "dtype": "bfloat16"}}}}

A request's ``body.model`` names a catalog entry; the entry chooses the DAG (whose deployment settings
fix the worker image, runner and the roots it may read and write), the engine kind, the model directory
and the engine options; ``params`` are further DAG Params for the run (validated by the DAG like any
conf). Read at every call (an edited file takes effect without a restart).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from batch_contract.engine_config import ConfigError
from batch_contract.openai_batch import ENGINE_OF_ENDPOINT, MAX_FILE_BYTES, MAX_REQUESTS

CATALOG_ENV = "BATCH_INFERENCE_OPENAI_CATALOG"
"""Path of the catalog JSON file."""
ENGINE_KINDS = ("encoder", "llm")

@dataclass(frozen=True)
class ModelEntry:
    """One model the API serves.

    Attributes:
        name: the ``model`` clients name.
        dag_id: the batch-inference DAG a batch of this model is a run of.
        engine: ``encoder`` (serves ``/v1/embeddings``) or ``llm`` (``/v1/chat/completions``,
            ``/v1/completions``).
        model: the model directory the worker loads (the DAG's ``model`` Param).
        engine_options: the DAG's ``engine_options`` Param (LLM: ``max_model_len``, default
            ``max_tokens``, ``dtype`` ...).
        params: further DAG Params of every run of this model.
    """

    name: str
    dag_id: str
    engine: str
    model: str
    engine_options: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)

    def serves(self, endpoint: str) -> bool:
        """Whether the entry's engine can run requests of ``endpoint``."""
        return ENGINE_OF_ENDPOINT.get(endpoint) == self.engine

@dataclass(frozen=True)
class Catalog:
    """The whole catalog (see the module docstring; limits in bytes and request lines)."""

    files_root: str
    output_root: str
    models: dict[str, ModelEntry]
    max_file_bytes: int = MAX_FILE_BYTES
    max_requests: int = MAX_REQUESTS

    def dag_ids(self) -> list[str]:
        """The DAGs batches run on (sorted, each once)."""
        return sorted({m.dag_id for m in self.models.values()})

def _entry(name: str, raw: Any) -> ModelEntry:
    where = f"{CATALOG_ENV}: models[{name!r}]"
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be an object")
    unknown = sorted(set(raw) - {"dag_id", "engine", "model", "engine_options", "params"})
    if unknown:
        raise ConfigError(f"{where} has unknown key(s) {unknown}")
    for key in ("dag_id", "engine", "model"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise ConfigError(f"{where}.{key} must be a non-empty string")
    if raw["engine"] not in ENGINE_KINDS:
        raise ConfigError(f"{where}.engine {raw['engine']!r} is not one of {list(ENGINE_KINDS)}")
    for key in ("engine_options", "params"):
        if not isinstance(raw.get(key, {}), Mapping):
            raise ConfigError(f"{where}.{key} must be an object")
    return ModelEntry(name=name, dag_id=raw["dag_id"], engine=raw["engine"], model=raw["model"],
                      engine_options=dict(raw.get("engine_options", {})), params=dict(raw.get("params", {})))

def _limit(raw: Mapping[str, Any], key: str, ceiling: int) -> int:
    value = raw.get(key, ceiling)
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= ceiling:
        raise ConfigError(f"{CATALOG_ENV}: {key} {value!r} is not an integer in 1..{ceiling} (OpenAI's limit)")
    return value

def parse_catalog(raw: Any) -> Catalog:
    """Build the catalog from its parsed JSON.

    Raises:
        ConfigError: a missing or wrong-typed field (the message names it).
    """
    if not isinstance(raw, Mapping) or not isinstance(raw.get("files_root"), str) or not raw["files_root"]:
        raise ConfigError(f"{CATALOG_ENV}: the catalog must be an object with a non-empty 'files_root'")
    models = raw.get("models")
    if not isinstance(models, Mapping) or not models:
        raise ConfigError(f"{CATALOG_ENV}: 'models' must be a non-empty object (model name -> entry)")
    output_root = raw.get("output_root", raw["files_root"])
    if not isinstance(output_root, str) or not output_root:
        raise ConfigError(f"{CATALOG_ENV}: 'output_root' must be a non-empty string")
    return Catalog(files_root=raw["files_root"].rstrip("/"), output_root=output_root,
                   models={str(k): _entry(str(k), v) for k, v in models.items()},
                   max_file_bytes=_limit(raw, "max_file_bytes", MAX_FILE_BYTES),
                   max_requests=_limit(raw, "max_requests", MAX_REQUESTS))

def load_catalog(environ: Mapping[str, str] | None = None) -> Catalog:
    """The catalog of ``BATCH_INFERENCE_OPENAI_CATALOG`` (read now).

    Raises:
        ConfigError: the variable is unset, the file unreadable or not JSON, or :func:`parse_catalog`
            refuses it.
    """
    env = os.environ if environ is None else environ
    path = env.get(CATALOG_ENV, "").strip()
    if not path:
        raise ConfigError(f"{CATALOG_ENV} is not set: the OpenAI batch API serves no model")
    try:
        with open(path, encoding="utf-8") as fh:
            raw = json.load(fh)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{CATALOG_ENV}: cannot read the catalog ({type(exc).__name__})") from None
    return parse_catalog(raw)
