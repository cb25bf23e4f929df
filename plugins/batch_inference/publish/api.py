"""Publish entry points the DAG and the CLI call: :func:`publish_run`, :func:`rollback` and the
preflight :func:`check_target`."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from batch_inference.publish.backend import backend_for, check_owned, nothing_stored
from batch_inference.publish.coverage import Coverage
from batch_inference.publish.inventory import RunInventory, load_inventory
from batch_inference.publish.record import PublishRecord, utc_now
from batch_inference.publish.skeleton import run_publish, run_rollback
from batch_inference.publish.target import SUFFIX_DEAD_LETTERS, SUFFIX_PREVIOUS, PublishTarget


def _record_maker(inv: RunInventory, min_success_ratio: float) -> Callable[[Coverage], PublishRecord]:
    def make(cov: Coverage) -> PublishRecord:
        return PublishRecord(
            run_id=inv.run_id,
            fingerprint=inv.fingerprint,
            rows_input=cov.rows_input,
            rows_published=cov.rows_published,
            rows_dead_letter=cov.rows_dead_letter,
            rows_missing=cov.rows_missing,
            duplicates_removed=cov.duplicates_removed,
            success_ratio=cov.success_ratio,
            min_success_ratio=min_success_ratio,
            published_at=utc_now(),
            files_digest=inv.files_digest,
            duplicate_ids_across_shards=cov.duplicate_ids_across_shards,
            dead_letter_reasons=dict(cov.dead_letter_reasons),
            files_quarantined=inv.files_quarantined,
        )

    return make


def publish_run(
    run_dir: str,
    target: PublishTarget,
    *,
    min_success_ratio: float = 1.0,
    after_staging: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Publish every committed result of a run into ``target`` atomically.

    Steps: read manifest + markers (every shard must have one, all with the same fingerprint) and verify
    every committed file (size against the marker's commit record, Parquet footer, fingerprint; a file
    that fails is quarantined, and if the marker counted it the marker is removed and ``PublishError``
    raised so the shard runs again); if the
    live table already holds this run id + fingerprint + committed files (names, sizes, SHA-256 as
    recorded), return at once (``noop``);
    else check coverage
    (every manifest id exactly once across results and dead letters, duplicates from retried chunks
    dropped deterministically), load ``<table>__staging`` and ``<table>__dead_letters__staging`` with the
    primary key built, then in ONE transaction move the live tables to ``__previous`` (dropping the
    older previous) and staging to live.

    Args:
        run_dir: ``<output_root>/runs/<run_id>``.
        target: where to publish.
        min_success_ratio: fraction in (0, 1] of input rows that must have a result or a dead letter;
            1.0 (default) fails on any missing row. The summary states the ratio published under.
        after_staging: test/instrumentation hook called after staging is committed, before the swap.

    Returns:
        Summary dict: ``table``, ``backend``, ``run_id``, ``fingerprint``, ``rows_input``,
        ``rows_published``, ``rows_dead_letter``, ``rows_missing``, ``duplicates_removed``,
        ``duplicate_ids_across_shards`` (input rows dead-lettered as ``duplicate_id`` because their
        id's winning row lies in another shard; included in ``rows_dead_letter``),
        ``dead_letter_reasons`` (published dead letters by reason), ``files_quarantined`` (leftover files
        this publish set aside),
        ``publish_seconds`` (wall seconds of this call), ``noop``, ``success_ratio``,
        ``min_success_ratio``, ``dead_letters_table``, ``previous_table``, ``published_at``,
        ``stage_seconds`` (wall seconds of ``coverage``, ``load`` (staging + primary key), ``swap``;
        empty for a no-op).

    Raises:
        ForeignTableError: a table publish would replace, rename or drop (live, ``__previous``,
            ``__staging``, dead letters, log) exists but publish did not create it; checked before any
            table is written.
        PublishConnectionError: the database or catalog could not be opened (no DSN in the message).
        PublishError: missing markers, mixed fingerprints, a counted file torn, unreadable or stale
            (set aside, see above).
        CoverageError: ids outside the manifest, or missing rows below ``min_success_ratio``.
        ValueError: ``min_success_ratio`` outside (0, 1].
    """
    if not 0.0 < min_success_ratio <= 1.0:
        raise ValueError(f"min_success_ratio: {min_success_ratio} is not in (0, 1]")
    start = time.perf_counter()
    inv = load_inventory(run_dir)
    stages: dict[str, float] = {}
    record, noop = run_publish(
        backend_for(target), inv, min_success_ratio=min_success_ratio,
        make_record=_record_maker(inv, min_success_ratio), after_staging=after_staging, stages=stages,
    )
    summary = _summary(target, record, noop, time.perf_counter() - start)
    summary["stage_seconds"] = stages
    return summary


def _summary(target: PublishTarget, record: PublishRecord, noop: bool, seconds: float) -> dict[str, Any]:
    return {
        "table": target.name(),
        "schema": target.schema,
        "backend": target.backend,
        "run_id": record.run_id,
        "fingerprint": record.fingerprint,
        "rows_input": record.rows_input,
        "rows_published": record.rows_published,
        "rows_dead_letter": record.rows_dead_letter,
        "rows_missing": record.rows_missing,
        "duplicates_removed": record.duplicates_removed,
        "duplicate_ids_across_shards": record.duplicate_ids_across_shards,
        "dead_letter_reasons": dict(record.dead_letter_reasons),
        "files_quarantined": record.files_quarantined,
        "publish_seconds": round(seconds, 3),
        "noop": noop,
        "success_ratio": record.success_ratio,
        "min_success_ratio": record.min_success_ratio,
        "published_at": record.published_at,
        "dead_letters_table": target.name(SUFFIX_DEAD_LETTERS),
        "previous_table": target.name(SUFFIX_PREVIOUS),
    }


def rollback(target: PublishTarget) -> dict[str, Any]:
    """Restore ``<table>__previous`` as ``<table>`` (the replaced live table becomes the previous one,
    so a second rollback undoes the first). Dead-letter tables follow; one transaction.

    Returns:
        ``{"table", "backend", "restored_run_id", "restored_fingerprint", "replaced_run_id",
        "replaced_fingerprint", "rollback_seconds"}`` (run fields ``None`` for tables publish did not
        write).

    Raises:
        ForeignTableError: a table it would rename or drop exists but publish did not create it.
        PublishConnectionError: the database or catalog could not be opened (no DSN in the message).
        PublishError: there is no previous table.
    """
    start = time.perf_counter()
    restored, replaced = run_rollback(backend_for(target))
    return {
        "table": target.name(),
        "schema": target.schema,
        "backend": target.backend,
        "restored_run_id": restored.run_id if restored else None,
        "restored_fingerprint": restored.fingerprint if restored else None,
        "replaced_run_id": replaced.run_id if replaced else None,
        "replaced_fingerprint": replaced.fingerprint if replaced else None,
        "rollback_seconds": round(time.perf_counter() - start, 3),
    }


def check_target(target: PublishTarget) -> None:
    """Preflight for the plan task: refuse a target naming a table publish did not create, before any
    shard runs. Reads only: creates no schema, namespace, registry, database or catalog file and takes
    no lock (a DuckDB file or SQLite catalog that does not exist yet passes at once).

    Raises:
        ForeignTableError: a table of the target (live, ``__previous``, ``__staging``, dead letters and
            theirs, ``__publish_log``) exists without publish's mark; the message names them.
        PublishConnectionError: the database or catalog could not be opened (no DSN in the message).
        ImportError: the backend's driver is not installed.
    """
    if nothing_stored(target):
        return
    with backend_for(target, inspect_only=True) as backend:
        check_owned(backend)
