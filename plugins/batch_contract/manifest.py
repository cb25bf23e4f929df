"""The shard manifest: written once per run by the planner, read by every worker, the gate and publish.

A shard is a list of :class:`Segment` s (file, row range), so one shard can span small files and one big
file can be split into many shards. Row ranges are half-open ``[row_start, row_stop)`` in the file's
own row order (Parquet row order; JSONL line order counting only non-blank lines).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from batch_contract.documents import DocumentSettings
from batch_contract.engine_config import ConfigError, WorkerSettings
from batch_contract.engines import EngineConfig, engine_config_from_dict
from batch_contract.enums import InputFormat
from batch_contract.jsonutil import canonical_json, ordered_json, sha256_hex
from batch_contract.records import JsonRecord
from batch_contract.version import SCHEMA_VERSION, check_schema_version


@dataclass(frozen=True)
class InputFile:
    """One input file: URI, row count and (Parquet) row-group row counts."""

    uri: str
    rows: int
    row_group_rows: list[int] = field(default_factory=list)
    size_bytes: int | None = None


@dataclass(frozen=True)
class Segment:
    """Rows ``[row_start, row_stop)`` of input file number ``file_index`` in :attr:`InputSpec.files`."""

    file_index: int
    row_start: int
    row_stop: int

    @property
    def rows(self) -> int:
        return self.row_stop - self.row_start


@dataclass(frozen=True)
class ShardSpec:
    """One unit of work for one worker (one mapped task / one pod)."""

    shard_id: str
    segments: list[Segment]
    est_tokens: int | None = None

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.segments)


@dataclass(frozen=True)
class InputSpec:
    """What to read: the dataset URI as given, its format, the columns, and the resolved files.

    Attributes:
        roots: the allowed input roots the planner checked every file against (URIs or local paths);
            the worker checks each file again when it opens it
            (:func:`batch_contract.storage.open_input_file`: locally the real path of the file actually
            opened) and refuses one outside them. Empty (the default, and every manifest written before
            the field existed): no check. Left out of the manifest JSON when empty.
        documents: ``None`` (the text column is text) or how the worker turns each row's document
            (the text column holds its URI) into text (:mod:`batch_contract.documents`). Left out of
            the manifest JSON when ``None``.
        rejection_key: ``None`` (every row is read as it is) or the key of a JSONL row that holds
            ``{"code", "message"}`` when the row was refused before the run (an OpenAI batch input
            converted by the planner: :data:`batch_contract.openai_batch.REJECTION_KEY`): the worker
            dead-letters such a row with ``code`` (a ``DeadLetterReason`` value) as its reason. Left out
            of the manifest JSON when ``None``.
    """

    uri: str
    format: str
    id_column: str
    text_column: str
    files: list[InputFile]
    roots: list[str] = field(default_factory=list)
    documents: DocumentSettings | None = None
    rejection_key: str | None = None

    def __post_init__(self) -> None:
        if self.rejection_key is not None and not (isinstance(self.rejection_key, str) and self.rejection_key):
            raise ConfigError("input.rejection_key: must be a non-empty key or null")
        if self.documents is not None and not isinstance(self.documents, DocumentSettings):
            raise ConfigError("input.documents: must be a DocumentSettings object or null")
        if self.format not in {f.value for f in InputFormat}:
            raise ConfigError(f"input.format: {self.format!r} is not 'parquet' or 'jsonl'")
        if not isinstance(self.roots, list | tuple) or not all(isinstance(r, str) and r for r in self.roots):
            raise ConfigError("input.roots: must be a list of non-empty URIs or paths")

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)


def fingerprint_dict(config: EngineConfig) -> dict[str, Any]:
    """The part of ``config`` that decides outputs: its full ``to_dict()`` (every default filled in) minus
    the fields its class lists in ``NOT_IN_FINGERPRINT`` (scheduling, memory and padding settings that
    change speed, never outputs, like :class:`WorkerSettings`). A ``json_schema`` is hashed as its
    compact JSON text in its own key order (:func:`ordered_json`): structured output generates the keys
    in the schema's order, so two schemas that differ only in order give different outputs and different
    fingerprints (this changed the fingerprint of every run with a schema once)."""
    skip = getattr(type(config), "NOT_IN_FINGERPRINT", frozenset())
    out = {k: v for k, v in config.to_dict().items() if k not in skip}
    if isinstance(out.get("json_schema"), dict):  # canonical JSON sorts keys: keep the schema's own order
        out["json_schema"] = ordered_json(out["json_schema"])
    return out


def config_fingerprint(engine: Mapping[str, Any] | EngineConfig, documents: DocumentSettings | None = None) -> str:
    """Hash of the normalised engine config and ``SCHEMA_VERSION``: the half of the fingerprint the
    planner knows. The worker adds the model digest (see :func:`result_fingerprint`).

    The config is parsed (validated) and hashed as :func:`fingerprint_dict` in canonical JSON (sorted
    keys), so a default written out (``{"kind": "encoder", "pooling": "auto"}``) and the same default
    omitted (``{"kind": "encoder"}``) give one fingerprint, and speed-only fields do not count.

    Note: before this normalisation the raw engine dict was hashed, so every fingerprint changed once:
    rows committed by runs planned with older code are not reused and are recomputed once (their own
    manifests keep the fingerprint they were planned with, so an in-flight run still resumes).
    ``SCHEMA_VERSION`` was not bumped: no on-disk layout or schema changed.

    Args:
        engine: an engine config dict (as in the manifest or Params) or config object.
        documents: the input's document settings (``input.documents``): their output-relevant fields
            (:meth:`~batch_contract.documents.DocumentSettings.fingerprint_dict`) are hashed too, so
            another extractor or OCR language never shares a fingerprint; ``None``: the fingerprint is
            what it was before documents existed.

    Raises:
        ConfigError: ``engine`` is an invalid engine dict (the message names the field).
    """
    config = engine_config_from_dict(engine) if isinstance(engine, Mapping) else engine
    payload: dict[str, Any] = {"engine": fingerprint_dict(config), "schema_version": SCHEMA_VERSION}
    if documents is not None:
        payload["documents"] = documents.fingerprint_dict()
    return sha256_hex(canonical_json(payload))[:32]


def result_fingerprint(config_fp: str, model_digest: str, resolved: Mapping[str, Any] | None = None) -> str:
    """Fingerprint stamped on every committed row: config fingerprint + model weights digest + what the
    host resolved from an ``auto`` setting.

    Rows committed under another fingerprint are never reused on resume or from the result cache
    (:mod:`batch_contract.resultcache`), and publish refuses to mix fingerprints in one table.

    Args:
        config_fp: :func:`config_fingerprint` of the manifest.
        model_digest: digest of the model files.
        resolved: settings the worker resolved on its host that change outputs but are written as
            ``auto`` in the config (the encoder's ``{"dtype": "bfloat16"}`` for ``dtype: auto``): a
            bf16 host and an fp32 host get different fingerprints. Empty/``None``: the fingerprint is
            what it was before this argument existed.
    """
    if not resolved:
        return sha256_hex(f"{config_fp}:{model_digest}")[:32]
    return sha256_hex(f"{config_fp}:{model_digest}:{canonical_json(dict(resolved))}")[:32]


@dataclass(frozen=True)
class Manifest(JsonRecord):
    """The whole plan of one run.

    Attributes:
        run_id: Airflow run id (a safe path segment).
        input: what to read.
        shards: the plan; ``shards[i].shard_id == shard_id_for(i)``.
        engine: engine config dict, normalised when built: validated through ``engine_config_from_dict``
            and replaced by the config's full ``to_dict()`` (every default written out, so a worker
            whose code has other defaults still runs the planned config). Parsed once per process:
            use :attr:`engine_config`.
        worker: batching/chunking/signal settings.
        params: the run's user-facing parameters, for the record (table name, costs, ...).
        config_fingerprint: :func:`config_fingerprint` of ``engine``; one read from a stored manifest
            is kept as written (a run keeps the fingerprint it was planned with).
        prefix_plan: LLM runs: the prefix-aware plan's record (``batch_inference.prefix_plan``):
            ``status`` ``planned`` (with ``block_tokens``, ``global_prefix_tokens``, ``groups``,
            ``grouped_rows``, ``split_groups``, ``rows``, ``prompt_tokens``, ``sampled_rows`` and the
            expected prefix-cache hit rates ``expected_hit_rate``, ``token_plan_hit_rate``,
            ``ideal_hit_rate`` and ``shard_hit_rates`` (per shard id): shares of prompt tokens) or ``skipped``/``off`` with a ``reason``;
            ``None`` (other engines, and every manifest written before the field existed): left out of
            the JSON.

    Written (:meth:`~batch_contract.records.JsonRecord.to_json_bytes`) as indented JSON in field
    order, mappings in their own order (not sorted: the engine config's JSON schema keeps its property
    order, see :func:`fingerprint_dict`); read by :meth:`from_dict`.
    """

    RECORD_NAME: ClassVar[str] = "manifest"
    SORT_KEYS: ClassVar[bool] = False

    run_id: str
    input: InputSpec
    shards: list[ShardSpec]
    engine: dict[str, Any]
    worker: WorkerSettings = field(default_factory=WorkerSettings)
    params: dict[str, Any] = field(default_factory=dict)
    created_at: str = ""
    config_fingerprint: str = ""
    schema_version: int = SCHEMA_VERSION
    prefix_plan: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        config = engine_config_from_dict(self.engine)  # raises ConfigError naming the field
        object.__setattr__(self, "_engine_config", config)  # not a field: not in to_dict() or ==
        object.__setattr__(self, "engine", config.to_dict())
        if not self.config_fingerprint:
            object.__setattr__(self, "config_fingerprint", config_fingerprint(config, self.input.documents))

    @property
    def engine_config(self) -> EngineConfig:
        """The validated engine config object (an ``EncoderConfig``, ``LLMConfig``, ...), parsed once
        when the manifest was built: read it here instead of calling ``engine_config_from_dict`` again."""
        return self._engine_config  # type: ignore[attr-defined]

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.shards)

    def shard(self, shard_id: str) -> ShardSpec:
        """The shard with id ``shard_id``; ``KeyError`` naming the known range if absent."""
        for spec in self.shards:
            if spec.shard_id == shard_id:
                return spec
        known = f"{self.shards[0].shard_id}..{self.shards[-1].shard_id}" if self.shards else "none"
        raise KeyError(f"shard {shard_id!r} is not in the manifest of run {self.run_id} ({known})")

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of every field; ``input.roots`` is left out when empty, ``input.documents``,
        ``input.rejection_key`` and ``prefix_plan`` when ``None`` and the worker's stealing settings when
        ``worker.steal`` is off (:meth:`WorkerSettings.to_dict`), so a plan without them is written
        exactly as before the fields existed (and older readers accept it)."""
        data = asdict(self)
        data["worker"] = self.worker.to_dict()
        if not self.input.roots:
            del data["input"]["roots"]
        if self.input.documents is None:
            del data["input"]["documents"]
        if self.prefix_plan is None:
            del data["prefix_plan"]
        if self.input.rejection_key is None:
            del data["input"]["rejection_key"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        """The manifest of a parsed ``manifest.json`` object (keys it does not know are ignored).

        Raises:
            ValueError: unreadable ``schema_version``. KeyError / TypeError: a required key is absent
                or a nested record has a field it does not know. ConfigError: an invalid engine
                config or input spec (the message names the field).
        """
        check_schema_version(int(data.get("schema_version", -1)), cls.RECORD_NAME)
        inp = dict(data["input"])
        inp["files"] = [InputFile(**f) for f in inp["files"]]
        inp["roots"] = list(inp.get("roots", []))
        if inp.get("documents") is not None:
            inp["documents"] = DocumentSettings.from_dict(dict(inp["documents"]))
        shards = [
            ShardSpec(
                shard_id=s["shard_id"],
                segments=[Segment(**seg) for seg in s["segments"]],
                est_tokens=s.get("est_tokens"),
            )
            for s in data["shards"]
        ]
        return cls(
            run_id=data["run_id"],
            input=InputSpec(**inp),
            shards=shards,
            engine=dict(data["engine"]),
            worker=WorkerSettings.from_dict(data.get("worker", {})),
            params=dict(data.get("params", {})),
            created_at=data.get("created_at", ""),
            config_fingerprint=data.get("config_fingerprint", ""),
            schema_version=int(data["schema_version"]),
            prefix_plan=dict(data["prefix_plan"]) if data.get("prefix_plan") is not None else None,
        )
