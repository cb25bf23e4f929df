"""The shard manifest: written once per run by the planner, read by every worker, the gate and publish.

A shard is a list of :class:`Segment` s (file, row range), so one shard can span small files and one big
file can be split into many shards. Row ranges are half-open ``[row_start, row_stop)`` in the file's
own row order (Parquet row order; JSONL line order counting only non-blank lines).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from batch_contract.engine_config import ConfigError, WorkerSettings, engine_config_from_dict
from batch_contract.enums import InputFormat
from batch_contract.jsonutil import canonical_json, pretty_json, sha256_hex
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
    """What to read: the dataset URI as given, its format, the columns, and the resolved files."""

    uri: str
    format: str
    id_column: str
    text_column: str
    files: list[InputFile]

    def __post_init__(self) -> None:
        if self.format not in {f.value for f in InputFormat}:
            raise ConfigError(f"input.format: {self.format!r} is not 'parquet' or 'jsonl'")

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)


def config_fingerprint(engine: dict[str, Any]) -> str:
    """Hash of the engine config (canonical JSON) and ``SCHEMA_VERSION``: the half of the fingerprint
    the planner knows. The worker adds the model digest (see :func:`result_fingerprint`)."""
    return sha256_hex(canonical_json({"engine": engine, "schema_version": SCHEMA_VERSION}))[:32]


def result_fingerprint(config_fp: str, model_digest: str) -> str:
    """Fingerprint stamped on every committed row: config fingerprint + model weights digest.

    Rows committed under another fingerprint are never reused on resume, and publish refuses to mix
    fingerprints in one table.
    """
    return sha256_hex(f"{config_fp}:{model_digest}")[:32]


@dataclass(frozen=True)
class Manifest:
    """The whole plan of one run.

    Attributes:
        run_id: Airflow run id (a safe path segment).
        input: what to read.
        shards: the plan; ``shards[i].shard_id == shard_id_for(i)``.
        engine: engine config dict (validated through ``engine_config_from_dict``).
        worker: batching/chunking/signal settings.
        params: the run's user-facing parameters, for the record (table name, costs, ...).
        config_fingerprint: :func:`config_fingerprint` of ``engine``.
    """

    run_id: str
    input: InputSpec
    shards: list[ShardSpec]
    engine: dict[str, Any]
    worker: WorkerSettings = field(default_factory=WorkerSettings)
    params: dict[str, Any] = field(default_factory=dict)
    created_at: str = ""
    config_fingerprint: str = ""
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        engine_config_from_dict(self.engine)  # raises ConfigError naming the field
        if not self.config_fingerprint:
            object.__setattr__(self, "config_fingerprint", config_fingerprint(self.engine))

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
        return asdict(self)

    def to_json_bytes(self) -> bytes:
        return pretty_json(self.to_dict())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        check_schema_version(int(data.get("schema_version", -1)), "manifest")
        inp = dict(data["input"])
        inp["files"] = [InputFile(**f) for f in inp["files"]]
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
        )

    @classmethod
    def from_json_bytes(cls, raw: bytes) -> Manifest:
        return cls.from_dict(json.loads(raw))
