"""Shard completion marker, per-attempt records and live progress objects (JSON in storage).

* ``attempts/<attempt_id>.json`` - written when a worker starts, after each commit, at each progress
  tick and when it exits; a record still ``running`` after its shard completed means that attempt was
  killed (SIGKILL, node loss), and holds what it did up to its last progress tick.
* ``_PROGRESS.json`` - rewritten at most every ``progress_interval_seconds`` while a worker runs.
* ``_SUCCESS.json`` - the :class:`ShardMarker`, written last, only when every row of the shard is
  committed (results + dead letters = input rows). Storage, not task state, is the truth: the gate,
  publish and report read markers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from batch_contract.records import JsonRecord
from batch_contract.tokens import TokenCounts
from batch_contract.version import SCHEMA_VERSION

STAGES = ("model_load", "input_read", "tokenize", "inference", "write", "idle", "reuse")
"""Stage names used in ``stage_seconds`` everywhere (worker stats, markers, the cost report). ``reuse``:
the result-cache pass before model load (read + hash the shard's texts, look keys up, commit hits)."""
OPTIONAL_STAGES = ("preprocess",)
"""Stages a record holds only when the run has them: ``preprocess``, the wall seconds the producer
waited for a chunk's documents to be extracted (inputs with ``input.documents``; it overlaps inference
like ``input_read`` and ``tokenize``). Kept apart from :data:`STAGES` so records of text runs keep
their bytes."""

PREPROCESS_FIELDS = ("rows", "cpu_seconds", "wall_seconds", "extract_seconds", "engine_wait_seconds",
                     "engine_busy_seconds", "pool_workers", "queue_depth")
"""Keys of the ``preprocess`` figures of an attempt record / marker (documents runs only): documents
extracted (rows), CPU seconds of the extraction processes, wall seconds from the first document
submitted to the last one received, seconds the pool processes spent extracting (summed), seconds the
engine's thread waited for the next chunk (``idle``), seconds it spent on chunks (engine and commit),
and the pool's size and queue depth."""


def _without_empty(data: dict[str, Any], name: str) -> dict[str, Any]:
    """``data`` without key ``name`` when its value is empty (a field written only when it has figures)."""
    if not data.get(name):
        data.pop(name, None)
    return data


@dataclass
class AttemptRecord(JsonRecord):
    """One start of the worker on a shard.

    Attributes:
        exit_code: ``None`` while running (or if the process was killed before it could write).
        rows_committed: rows (results + dead letters) this attempt committed.
        rows_processed: rows that went through inference in this attempt, committed or not; the
            difference to ``rows_committed`` is work lost to the interruption (re-done later).
        stage_seconds: seconds per stage (see :data:`STAGES`).
    """

    RECORD_NAME: ClassVar[str] = "attempt record"

    attempt_id: str
    shard_id: str
    started_at: str
    host: str = ""
    status: str = "running"
    ended_at: str | None = None
    exit_code: int | None = None
    rows_skipped_resume: int = 0
    rows_committed: int = 0
    rows_processed: int = 0
    chunks_committed: int = 0
    stage_seconds: dict[str, float] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION
    tokens_real: int = 0
    """Non-pad input tokens of the rows this attempt committed (added after v1; default 0)."""
    tokens_padded: int = 0
    """Input tokens incl. padding processed for the rows this attempt committed (default 0)."""
    cpu_seconds: float = 0.0
    """User + system CPU seconds of the worker process during this attempt (default 0)."""
    steady_rows_per_s: float = 0.0
    """Rows/s after the first chunk (warm-up excluded); 0 when the attempt ran one chunk or less."""
    gpu: dict[str, Any] = field(default_factory=dict)
    """NVML summary (``util_mean`` percent, ``mem_max_bytes``) or ``{}`` without a GPU."""
    fingerprint: str = ""
    """Result fingerprint this attempt wrote under (markers sum only attempts of their fingerprint)."""
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Files this attempt committed: name -> ``{"bytes": size, "sha256": hex}``
    (:func:`batch_contract.partfiles.digest_of`; default empty)."""
    rows_reused: int = 0
    """Rows this attempt carried over from the result cache (:mod:`batch_contract.resultcache`)."""
    reuse_seconds_avoided: float = 0.0
    """Measured compute seconds of those rows in the runs that computed them (default 0)."""
    updated_at: str = ""
    """When the record was last written (UTC ISO): every commit and every progress tick while running,
    so a killed attempt's record holds its seconds and rows in flight up to its last progress write."""
    threads: int = 0
    """Intra-op CPU threads the worker ran inference with (torch's count after the runner's cap,
    ``BATCH_WORKER_THREADS``); 0 in records written before this field or when unknown."""
    host_facts: dict[str, Any] = field(default_factory=dict)
    """The machine this attempt ran on (:func:`batch_contract.hostinfo.host_facts`: CPU model, cores,
    caches, bf16/AMX, memory, load average at start); ``{}`` in records written before this field."""
    preprocess: dict[str, Any] = field(default_factory=dict)
    """Document extraction figures of this attempt (:data:`PREPROCESS_FIELDS`); ``{}`` (and left out of
    the JSON) for text inputs."""
    steal: dict[str, Any] = field(default_factory=dict)
    """Work stealing (``worker.steal``; :mod:`batch_contract.claims`): ``{"role": "owner" | "thief",
    "units": units of this shard whose rows this attempt committed and marked done}``, and for an owner
    that waited for units other workers held after its shard was complete, ``"wait_seconds"`` (written
    after the marker: not in the shard's stage seconds); a ``thief`` attempt is a worker of another shard
    that computed units of this one. ``{}`` (and left out of the JSON) with stealing off."""

    def to_dict(self) -> dict[str, Any]:
        """Every field; ``preprocess`` and ``steal`` only when they hold figures (runs without them write
        the bytes they did)."""
        return _without_empty(_without_empty(asdict(self), "preprocess"), "steal")


@dataclass
class ShardProgress(JsonRecord):
    """Live progress of one shard (``_PROGRESS.json``)."""

    RECORD_NAME: ClassVar[str] = "progress object"

    shard_id: str
    status: str
    rows_total: int
    rows_done: int
    rows_dead_letter: int
    rows_per_s: float
    eta_s: float | None
    updated_at: str
    attempt_id: str = ""
    schema_version: int = SCHEMA_VERSION


@dataclass
class ShardMarker(JsonRecord):
    """Completion marker of one shard (``_SUCCESS.json``), with the stats the cost report needs.

    Counts are rows; tokens are tokenizer tokens; seconds are wall-clock seconds summed over attempts.

    Attributes:
        rows_input: rows the manifest assigns to the shard.
        rows_ok: rows with a result in part files (each id once).
        rows_dead_letter: rows in dead-letter files; ``rows_ok + rows_dead_letter == rows_input``.
        rows_truncated: results whose input was cut to the model's max length.
        tokens_real / tokens_padded: non-pad tokens and tokens processed including padding (encoder),
            so ``padding_efficiency = tokens_real / tokens_padded``.
        tokens_prompt / tokens_cached / tokens_output: LLM accounting (prefix-cache hits in ``tokens_cached``).
        stage_seconds: seconds by stage (see :data:`STAGES`), summed over attempts.
        steady_rows_per_s: rows/s during inference after warm-up, last attempt.
        engine: engine info (model digest, dtype, device, torch/vLLM versions, embedding dim).
        gpu: NVML samples summary (``util_mean``, ``mem_max_bytes``) or ``{}`` without a GPU.
        attempts: every attempt's record (see :class:`AttemptRecord`).
        parts / dead_letter_parts: committed file names in the shard directory.
        files: every committed file's record, name -> ``{"bytes": size, "sha256": hex}``; publish
            checks sizes against it and its no-op check compares it (empty in markers written before).
        files_quarantined: files of the shard set aside in ``quarantine/`` (torn, unreadable, other
            fingerprint) by the time the marker was written.
        rows_reused / reuse_seconds_avoided: see the fields.
    """

    RECORD_NAME: ClassVar[str] = "shard marker"

    run_id: str
    shard_id: str
    fingerprint: str
    rows_input: int
    rows_ok: int
    rows_dead_letter: int
    rows_truncated: int = 0
    rows_text_repaired: int = 0
    dead_letter_reasons: dict[str, int] = field(default_factory=dict)
    tokens_real: int = 0
    tokens_padded: int = 0
    tokens_prompt: int = 0
    tokens_cached: int = 0
    tokens_output: int = 0
    stage_seconds: dict[str, float] = field(default_factory=dict)
    steady_rows_per_s: float = 0.0
    cpu_seconds: float = 0.0
    engine: dict[str, Any] = field(default_factory=dict)
    gpu: dict[str, Any] = field(default_factory=dict)
    attempts: list[dict[str, Any]] = field(default_factory=list)
    parts: list[str] = field(default_factory=list)
    dead_letter_parts: list[str] = field(default_factory=list)
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    files_quarantined: int = 0
    rows_reused: int = 0
    """Results carried over from the result cache (rows of ``part-*-reuse-*`` files; not computed by
    this run; included in ``rows_ok``). ``tokens_real`` counts only computed rows."""
    reuse_seconds_avoided: float = 0.0
    """Compute seconds the runs that computed the reused rows measured for them (summed over attempts)."""
    host_facts: dict[str, Any] = field(default_factory=dict)
    """The machine of the attempt that completed the shard (:func:`batch_contract.hostinfo.host_facts`),
    so the cost report can tell shards that ran on different kinds of host apart; ``{}`` in markers
    written before this field (they still load)."""
    started_at: str = ""
    finished_at: str = ""
    status: str = "complete"
    schema_version: int = SCHEMA_VERSION
    preprocess: dict[str, Any] = field(default_factory=dict)
    """Document extraction figures (:data:`PREPROCESS_FIELDS`) summed over the attempts (pool size
    and queue depth: the last attempt's); ``{}`` (and left out of the JSON) for text inputs."""
    steal: dict[str, Any] = field(default_factory=dict)
    """Work stealing figures (``worker.steal``): ``{"units": units of the shard, "units_stolen": units
    committed by ``thief`` attempts (workers of other shards), "stolen_seconds": those attempts' stage
    seconds except ``idle`` (worker time that would otherwise have waited for the run to end)}``; ``{}``
    (and left out of the JSON) with stealing off."""

    def to_dict(self) -> dict[str, Any]:
        """Every field; ``preprocess`` and ``steal`` (the marker's and each attempt's) only when they hold
        figures (runs without them write the bytes they did)."""
        data = _without_empty(_without_empty(asdict(self), "preprocess"), "steal")
        data["attempts"] = [_without_empty(_without_empty(dict(a), "preprocess"), "steal") for a in data["attempts"]]
        return data

    @property
    def tokens(self) -> TokenCounts:
        """The marker's ``tokens_*`` fields as one :class:`~batch_contract.tokens.TokenCounts`."""
        return TokenCounts.from_dict(vars(self))

    @property
    def padding_efficiency(self) -> float | None:
        return self.tokens_real / self.tokens_padded if self.tokens_padded else None

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        """LLM: share of prompt tokens served from the prefix cache (``tokens_cached / tokens_prompt``);
        ``None`` without LLM prompt tokens (encoder shards)."""
        return self.tokens_cached / self.tokens_prompt if self.tokens_prompt else None
