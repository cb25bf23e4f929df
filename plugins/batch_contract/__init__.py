"""The on-disk data contract shared by the Airflow side and the worker (stdlib + pyarrow only).

Modules: :mod:`~batch_contract.version` (``SCHEMA_VERSION``), :mod:`~batch_contract.enums`,
:mod:`~batch_contract.layout` (run URIs), :mod:`~batch_contract.engine_config`,
:mod:`~batch_contract.llm_config`, :mod:`~batch_contract.engines` (engine kind -> config class),
:mod:`~batch_contract.manifest`, :mod:`~batch_contract.schemas` (Arrow schemas),
:mod:`~batch_contract.marker` (markers, attempts, progress), :mod:`~batch_contract.storage`.
"""

from batch_contract.engine_config import ConfigError, EncoderConfig, WorkerSettings
from batch_contract.engines import engine_config_from_dict
from batch_contract.enums import DeadLetterReason, EngineKind, ExitCode, InputFormat, ShardStatus
from batch_contract.layout import RunLayout, shard_id_for
from batch_contract.llm_config import LLMConfig
from batch_contract.manifest import InputFile, InputSpec, Manifest, Segment, ShardSpec
from batch_contract.marker import STAGES, AttemptRecord, ShardMarker, ShardProgress
from batch_contract.version import SCHEMA_VERSION

__all__ = [
    "SCHEMA_VERSION",
    "STAGES",
    "AttemptRecord",
    "ConfigError",
    "DeadLetterReason",
    "EncoderConfig",
    "EngineKind",
    "ExitCode",
    "InputFile",
    "InputFormat",
    "InputSpec",
    "LLMConfig",
    "Manifest",
    "RunLayout",
    "Segment",
    "ShardMarker",
    "ShardProgress",
    "ShardStatus",
    "ShardSpec",
    "WorkerSettings",
    "engine_config_from_dict",
    "shard_id_for",
]
