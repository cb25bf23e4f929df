"""The engine interface every worker engine implements, and how an engine kind finds its class.

The worker runtime (``batch_worker.runtime``) owns everything that is the same for all engines: reading
the shard's rows, resume, validation, chunked commit, signals, progress and stats. An engine only turns
one chunk of validated rows into output columns. Life cycle, driven by the runtime::

    engine = engine_class(EngineKind(cfg["kind"]))(config, settings)   # cheap, no model yet
    digest = engine.model_digest()       # cheap: decides "already complete" before any load
    loaded = engine.load()               # once per process: LoadedModel(model_digest, info, part_schema)
    for each chunk of rows (ChunkRows):
        prepared = engine.prepare(rows)  # CPU work (tokenize); the runtime calls it on a background
                                         # thread for chunk N+1 while process() runs chunk N
        out = engine.process(prepared, should_stop)   # -> ChunkOutput, joined by id
    engine.close()

Contract of :meth:`Engine.process` (checked by :func:`check_chunk_output`):

* every row of the chunk comes out at most once, keyed by its ``id`` (never by position): either as one
  row of ``out.table`` or as one :class:`Reject` (a dead letter with a reason);
* rows absent from both were *not processed* and are only allowed when ``out.interrupted`` is true
  (``should_stop()`` returned true between batches: SIGTERM). The runtime commits what came out and
  leaves the rest for the next attempt;
* ``out.table`` has an ``id`` column plus every column of ``loaded.part_schema`` except
  ``fingerprint`` and ``text_repaired``, which the runtime adds; row order is free.

Writing a new engine: add its :class:`~batch_contract.enums.EngineKind` member and config class in the
contract (``batch_contract.engines``), then write the module ``batch_worker/engines/<kind value>.py`` with
one :class:`Engine` subclass whose ``kind`` is that member; implement ``load``, ``process`` (and
``prepare`` if it has CPU work worth overlapping). :func:`engine_class` finds it by that name, so there
is no list to extend (``docs/extending.md``). Engines never import Airflow; heavy imports (torch, vLLM)
happen inside ``load`` or the engine module, which :func:`engine_class` imports lazily.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pyarrow as pa
from batch_contract.engine_config import ConfigError, WorkerSettings
from batch_contract.enums import DeadLetterReason, EngineKind
from batch_contract.resultcache import text_key
from batch_contract.tokens import TokenCounts


@dataclass(frozen=True)
class LoadedModel:
    """What :meth:`Engine.load` returns.

    Attributes:
        model_digest: hex digest of the model's weight/config/tokenizer files (see
            ``batch_worker.digest.model_digest``); with the manifest's config fingerprint it makes the
            result fingerprint (``batch_contract.manifest.result_fingerprint``).
        info: JSON-able engine facts for the marker (model path, dtype, device, library versions,
            embedding dim, max length, ...).
        part_schema: Arrow schema of the part files (``batch_contract.schemas.part_schema(...)``).
        max_length: max input tokens per row (the engine truncates longer inputs), or ``None``.
    """

    model_digest: str
    info: dict[str, Any]
    part_schema: pa.Schema
    max_length: int | None = None


@dataclass
class ChunkRows:
    """One chunk of validated rows handed to an engine. All lists have ``len(self)`` entries.

    Attributes:
        ids: row ids as strings (integer ids in decimal), unique within the shard.
        texts: the text column, a non-empty ``str`` (invalid UTF-8 already replaced with U+FFFD).
        text_repaired: whether ``texts[i]`` was repaired.
        source_uri / source_row: where the row came from (file URI, 0-based row number in that file).
        fields: the id column (canonical string ids), the text column (repaired texts) and the
            engine's :meth:`Engine.extra_columns` of these rows, same order, for engines that need
            named row fields (LLM prompt templates: ``fields.to_pylist()``).
    """

    ids: list[str]
    texts: list[str]
    text_repaired: list[bool]
    source_uri: list[str]
    source_row: list[int]
    fields: pa.Table

    def __len__(self) -> int:
        return len(self.ids)

    def take(self, indices: list[int]) -> ChunkRows:
        """The rows at ``indices`` (in that order) as a new :class:`ChunkRows`."""
        return ChunkRows(
            ids=[self.ids[i] for i in indices],
            texts=[self.texts[i] for i in indices],
            text_repaired=[self.text_repaired[i] for i in indices],
            source_uri=[self.source_uri[i] for i in indices],
            source_row=[self.source_row[i] for i in indices],
            fields=self.fields.take(pa.array(indices, pa.int64())),
        )


@dataclass(frozen=True)
class Reject:
    """A row the engine could not process: it goes to the dead letters with ``reason``."""

    id: str
    reason: DeadLetterReason
    detail: str


@dataclass
class ChunkOutput:
    """What :meth:`Engine.process` returns for one chunk.

    Attributes:
        table: one row per processed id: ``id`` + part-schema columns except ``fingerprint`` and
            ``text_repaired`` (``n_tokens`` int32 real input tokens, ``truncated`` bool, outputs).
        rejects: rows dead-lettered by the engine (template error, invalid output, engine error).
        interrupted: ``should_stop()`` became true and some rows were left unprocessed.
        tokens: the chunk's token counters (:class:`~batch_contract.tokens.TokenCounts`): ``real``
            is the sum of ``n_tokens`` of the processed rows, ``padded`` includes padding (encoder;
            = ``real`` for LLMs), ``prompt`` / ``cached`` / ``output`` are the LLM accounting (0 for
            encoders).
        stage_seconds: seconds spent by stage name (``batch_contract.marker.STAGES``), e.g.
            ``{"inference": 12.3}``; ``prepare`` time is measured by the runtime itself.
        batches: number of engine batches run.
    """

    table: pa.Table
    rejects: list[Reject] = field(default_factory=list)
    interrupted: bool = False
    tokens: TokenCounts = TokenCounts()
    stage_seconds: dict[str, float] = field(default_factory=dict)
    batches: int = 0


class EngineOutputError(RuntimeError):
    """An engine broke the id contract (dropped, duplicated or invented a row)."""


class Engine(ABC):
    """Base class of worker engines (see the module docstring for the life cycle and contract).

    Args:
        config: the engine config object built by ``batch_contract.engine_config.engine_config_from_dict``
            (``EncoderConfig`` for ``encoder``; the LLM config for ``llm``).
        settings: the manifest's worker settings (token budget, batch rows, ...).
    """

    kind: ClassVar[EngineKind]
    reuses_results: ClassVar[bool] = False
    """Whether a row's result depends only on what :meth:`reuse_keys` hashes (plus the fingerprint),
    so the result cache may serve it."""

    def __init__(self, config: Any, settings: WorkerSettings) -> None:
        self.config = config
        self.settings = settings
        self.on_rows_done: Callable[[int], None] | None = None
        """Set by the runtime; an engine may call it with the row count of each finished batch (for
        live progress between commits). Optional: engines that never call it get chunk-level progress."""

    @abstractmethod
    def load(self) -> LoadedModel:
        """Load the model once (local files only, never the network).

        Raises:
            batch_contract.engine_config.ConfigError: model path missing/invalid (exit code 2).
        """

    def model_digest(self) -> str:
        """Digest of the model files without loading the model (the runtime's fast path: a shard whose
        marker has the same fingerprint exits at once). Default: ``self.load().model_digest``; override
        when the digest is cheaper than a load (``batch_worker.digest.model_digest(path)``)."""
        return self.load().model_digest

    def resolved_settings(self) -> dict[str, Any]:
        """Settings this host resolves from an ``auto`` config value that change outputs (e.g. the
        encoder's dtype), without loading the model; they go into the result fingerprint
        (``batch_contract.manifest.result_fingerprint``). Default: none."""
        return {}

    def possible_resolved_settings(self) -> list[dict[str, Any]]:
        """Every value :meth:`resolved_settings` may return on some host, computed without importing the
        engine's libraries (torch, vLLM): the worker tells a shard already complete under this run's
        config and model from these before it imports them (``runtime.complete_before_load``).
        Default: ``[self.resolved_settings()]`` (an engine whose resolution is cheap and host-independent
        overrides nothing)."""
        return [self.resolved_settings()]

    def reuse_keys(self, rows: ChunkRows) -> list[bytes | None]:
        """Result-cache key of each row (:mod:`batch_contract.resultcache`): a hash of exactly what the
        model sees, or ``None`` for a row that cannot be keyed before inference (it is computed).
        Only called when :attr:`reuses_results` is true. Default: the repaired input text
        (:func:`~batch_contract.resultcache.text_key`)."""
        return [text_key(t) for t in rows.texts]

    def pin_resolved(self, resolved: dict[str, Any]) -> None:
        """Resolve ``auto`` settings to ``resolved`` instead of this host's choice (the run carried
        shards over that another host computed: :mod:`batch_contract.carryover`). Default: nothing to
        pin (an engine with no resolved settings has the same fingerprint everywhere).

        Raises:
            ConfigError: this engine cannot run with ``resolved`` on this host.
        """
        if resolved:
            raise ConfigError(f"engine {self.kind.value} resolves no settings; cannot pin {resolved}")

    def extra_columns(self) -> list[str]:
        """Input columns the engine reads besides the id and text columns (in ``ChunkRows.fields``).
        The reader reads no other column. Default: none."""
        return []

    def prepare(self, rows: ChunkRows) -> Any:
        """CPU preparation of a chunk (tokenization); may run on a background thread. Default: identity."""
        return rows

    @abstractmethod
    def process(self, prepared: Any, should_stop: Callable[[], bool]) -> ChunkOutput:
        """Run the engine over a prepared chunk.

        Args:
            prepared: what :meth:`prepare` returned for the chunk.
            should_stop: poll between batches; once it returns true, stop taking new batches, return the
                rows finished so far and set ``interrupted``.

        Returns:
            The chunk's outputs joined by id (see :class:`ChunkOutput`).
        """

    def tunable(self) -> bool:
        """Whether the run leaves this engine's batch settings to the canary (its search, and the shards
        using what it chose). Default: False (an engine without batch settings to tune)."""
        return False

    def planned_device(self) -> str | None:
        """The ``device`` :meth:`load` will put into the engine info, when known without loading; an engine
        that returns it takes :meth:`apply_tuning` *before* :meth:`load` (its batch settings are load-time
        arguments). Default: ``None`` (tuning is applied after the load)."""
        return None

    def apply_tuning(self, token_budget: int, max_batch_rows: int) -> dict[str, Any]:
        """Batch with these settings from now on (the canary's trials and its chosen settings, see
        ``batch_worker.canary``); call after :meth:`load` (or before it, when :meth:`planned_device`
        is not ``None``). Returns the engine-info fields changed; ``{}`` (the default) for an engine
        without batch settings, which ignores them.

        Args:
            token_budget: padded tokens per batch (tokens); the LLM engine's ``max_num_batched_tokens``.
            max_batch_rows: rows per batch cap; the LLM engine's ``max_num_seqs``.
        """
        return {}

    def close(self) -> None:  # noqa: B027 - optional hook, default no-op
        """Release the model (optional)."""


def check_chunk_output(rows: ChunkRows, out: ChunkOutput) -> set[str]:
    """Check the id contract of one chunk's output and return the set of ids left unprocessed.

    Args:
        rows: the chunk given to the engine.
        out: what the engine returned.

    Returns:
        Ids neither in ``out.table`` nor in ``out.rejects`` (empty unless ``out.interrupted``).

    Raises:
        EngineOutputError: an id came out twice, an id not in the chunk came out, or rows are missing
            although the engine was not interrupted.
    """
    wanted = set(rows.ids)
    seen: set[str] = set()
    produced = out.table.column("id").to_pylist() + [r.id for r in out.rejects]
    for rid in produced:
        if rid not in wanted:
            raise EngineOutputError(f"engine returned id {rid!r} that is not in the chunk")
        if rid in seen:
            raise EngineOutputError(f"engine returned id {rid!r} more than once")
        seen.add(rid)
    missing = wanted - seen
    if missing and not out.interrupted:
        sample = sorted(missing)[:5]
        raise EngineOutputError(f"engine dropped {len(missing)} row(s) without interruption, e.g. {sample}")
    return missing


def engine_module(kind: EngineKind) -> str:
    """The module that holds ``kind``'s engine: ``batch_worker.engines.<kind value>``."""
    return f"{__name__.rpartition('.')[0]}.{kind.value}"


def engine_class(kind: EngineKind | str) -> type[Engine]:
    """The engine class for ``kind``: the one :class:`Engine` subclass defined in :func:`engine_module`
    whose ``kind`` is ``kind``. The module is imported lazily (torch/vLLM load only when needed).

    Raises:
        batch_contract.engine_config.ConfigError: unknown kind.
        ImportError: the engine's module or its libraries are not installed in this image.
        TypeError: the module defines no such class, or more than one (a developer error).
    """
    from batch_contract.engine_config import ConfigError

    try:
        key = EngineKind(kind)
    except ValueError:
        raise ConfigError(f"engine.kind: {kind!r} is not one of {[k.value for k in EngineKind]}") from None
    module = importlib.import_module(engine_module(key))
    found = [obj for obj in vars(module).values()
             if isinstance(obj, type) and issubclass(obj, Engine) and obj.__module__ == module.__name__
             and getattr(obj, "kind", None) is key]
    if len(found) != 1:
        raise TypeError(f"{module.__name__} must define exactly one Engine subclass with kind = "
                        f"EngineKind.{key.name}; found {[c.__name__ for c in found]}")
    return found[0]
