"""Which shards of a run are complete, read from storage (markers), the gate's decision, and what the gate
reports at each check (progress line and metrics: :func:`gate_progress`)."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field

from batch_contract.runstore import RunStore

from batch_inference.progress import collect_progress, format_progress

log = logging.getLogger(__name__)
MAX_NAMED = 20
"""Most shard ids spelled out in a message; the rest are counted."""


@dataclass
class CompletionStatus:
    """Completion of one run. Rows are manifest rows; ``ratio = rows_complete / rows_total`` (1.0 when
    the run has no rows)."""

    shards_total: int
    shards_complete: int
    rows_total: int
    rows_complete: int
    min_success_ratio: float
    missing: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return self.rows_complete / self.rows_total if self.rows_total else 1.0

    @property
    def satisfied(self) -> bool:
        return not self.missing or self.ratio >= self.min_success_ratio

    def to_dict(self) -> dict:
        return {**asdict(self), "ratio": self.ratio, "satisfied": self.satisfied}


def name_shards(shard_ids: list[str]) -> str:
    """``"00003, 00007 (+12 more)"``: the first :data:`MAX_NAMED` ids and a count of the rest."""
    head = ", ".join(shard_ids[:MAX_NAMED])
    rest = len(shard_ids) - MAX_NAMED
    return f"{head} (+{rest} more)" if rest > 0 else head


def _store(run: str | RunStore) -> RunStore:
    return run if isinstance(run, RunStore) else RunStore.open(run)


def check_completion(run: str | RunStore, min_success_ratio: float = 1.0) -> CompletionStatus:
    """Read which shards of the run are complete and decide whether the gate opens.

    Args:
        run: the run directory, or a :class:`~batch_contract.runstore.RunStore` kept across polls: then
            the manifest is read once and each poll costs one listing of the run's markers plus one
            read per shard completed since the previous poll (:meth:`RunStore.poll`).
        min_success_ratio: fraction of manifest rows that must be in complete shards.

    Raises:
        FileNotFoundError: the run has no manifest (never planned).
    """
    store = _store(run)
    manifest = store.manifest
    done = set(store.poll())
    missing = [s.shard_id for s in manifest.shards if s.shard_id not in done]
    return CompletionStatus(
        shards_total=len(manifest.shards),
        shards_complete=len(manifest.shards) - len(missing),
        rows_total=manifest.rows,
        rows_complete=sum(s.rows for s in manifest.shards if s.shard_id in done),
        min_success_ratio=min_success_ratio,
        missing=missing,
    )


def gate_check(run: str | RunStore, min_success_ratio: float = 1.0) -> tuple[CompletionStatus, str]:
    """One check of the gate: :func:`check_completion`'s decision and :func:`gate_progress`'s line and
    metrics from ONE listing of the run's markers and progress objects
    (:meth:`~batch_contract.runstore.RunStore.poll_with_progress`) instead of three: on a store kept
    across checks, a check of 1,024 shards costs one paged listing (about 3 GCS list requests), one read
    per shard completed since the previous check and one per running shard's progress object.

    Args:
        run: the run directory or the store kept across checks.
        min_success_ratio: fraction of manifest rows that must be in complete shards.

    Returns:
        ``(status, progress line)``.

    Raises:
        FileNotFoundError: the run has no manifest. (A metrics failure is logged, never raised.)
    """
    from batch_inference.metrics import emit_gate_metrics  # numpy (the report package): only when checking

    store = _store(run)
    manifest = store.manifest
    ids = [s.shard_id for s in manifest.shards]
    summary = collect_progress(store, ids, per_shard=True)
    done = {sid for sid, shard in summary["shards"].items() if shard["state"] == "completed"}
    missing = [sid for sid in ids if sid not in done]
    status = CompletionStatus(
        shards_total=len(ids),
        shards_complete=len(ids) - len(missing),
        rows_total=manifest.rows,
        rows_complete=sum(s.rows for s in manifest.shards if s.shard_id in done),
        min_success_ratio=min_success_ratio,
        missing=missing,
    )
    emit_gate_metrics(store, summary)
    return status, format_progress(summary)


def gate_progress(run: str | RunStore) -> str:
    """What the gate does at each check besides deciding, from one read of the run's markers and progress
    objects (:func:`~batch_inference.progress.collect_progress`): one compact progress line (returned;
    :func:`~batch_inference.progress.format_progress`: rows/s and ETA first, shard counts, the shards
    waited on) and the gate's metrics (:func:`batch_inference.metrics.emit_gate_metrics`: rows, rates,
    dead letters by reason, spend so far and projected, per run and per shard).

    Args:
        run: the run directory or the store kept across polls (the metrics' ``dag_id`` and ``run_id``
            are the manifest's).

    Raises:
        FileNotFoundError: the run has no manifest. (A metrics failure is logged, never raised.)
    """
    from batch_inference.metrics import emit_gate_metrics  # numpy (the report package): only when checking

    store = _store(run)
    summary = collect_progress(store, [s.shard_id for s in store.manifest.shards], per_shard=True)
    emit_gate_metrics(store, summary)
    return format_progress(summary)
