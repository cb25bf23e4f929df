"""Live progress of a run while the gate waits: shard markers + ``_PROGRESS.json`` -> one summary.

Counts follow a batch API's request counts (``total`` / ``completed`` / ``failed``) plus ``running``
and ``pending``. Storage is the truth: a shard is completed only when its ``_SUCCESS.json`` exists.
Never imports Airflow; the completion trigger calls :func:`collect_progress` and logs
:func:`format_progress`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from batch_contract.enums import ShardStatus
from batch_contract.runstore import RunStore

STALE_AFTER_SECONDS = 300.0
"""A running shard whose progress object is older than this is reported as ``stale`` (its worker may
be gone) and its rate is left out of the run's rows/s."""

_MAX_LISTED = 10


def _manifest_rows(store: RunStore) -> dict[str, int]:
    """Rows per shard id from the manifest (``{}`` if it cannot be read: progress must not fail)."""
    try:
        return {s.shard_id: s.rows for s in store.manifest.shards}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _age_seconds(updated_at: str, now: datetime) -> float | None:
    try:
        ts = datetime.fromisoformat(updated_at)
    except (TypeError, ValueError):
        return None
    ts = ts if ts.tzinfo else ts.replace(tzinfo=UTC)
    return (now - ts).total_seconds()


def collect_progress(run: str | RunStore, shard_ids: list[str], *, now: datetime | None = None,
                     per_shard: bool = False) -> dict[str, Any]:
    """Summarise the progress of ``shard_ids`` of a run.

    Args:
        run: ``<output_root>/runs/<run_id>`` (local path, ``file://`` or ``gs://``), or a
            :class:`~batch_contract.runstore.RunStore` kept across calls (then complete markers are
            read once each): a call costs one listing of the markers and progress objects together
            (:meth:`~batch_contract.runstore.RunStore.poll_with_progress`), one read per newly complete
            shard and one per shard with a progress object and no marker.
        shard_ids: the shards to watch (five-digit ids).
        now: the current time (UTC) for staleness; default: the clock.
        per_shard: also return each shard's figures (key ``shards``), from the same reads.

    Returns:
        ``{"total", "completed", "failed", "running", "pending", "stale"}`` (shard counts),
        ``rows_total`` (rows of all watched shards: marker, progress object or manifest; ``None`` when
        some shard's size is unknown), ``rows_done`` (rows committed incl. dead letters),
        ``rows_dead_letter``, ``rows_per_s`` (sum of fresh running shards' rates, rows/s),
        ``eta_s`` (remaining rows / rows_per_s, seconds; ``None`` without a rate), ``fraction_done``,
        ``missing`` (ids without marker), ``failed_ids``, ``stale_ids``; with ``per_shard``, ``shards``:
        ``{shard_id: {"state", "rows_total", "rows_done", "rows_dead_letter", "rows_per_s"}}`` where
        ``state`` is the count it went to (``completed``, ``failed``, ``running``, ``pending``,
        ``stale``), ``rows_total`` is ``None`` when unknown and ``rows_per_s`` is the live rate (rows/s)
        of a fresh running shard, 0.0 for every other.
    """
    store = run if isinstance(run, RunStore) else RunStore.open(run)
    now = now or datetime.now(UTC)
    manifest_rows: dict[str, int] | None = None
    counts = dict.fromkeys(("completed", "failed", "running", "pending", "stale"), 0)
    rows_total: int | None = 0
    rows_done = rows_dead = 0
    rate = 0.0
    missing, failed_ids, stale_ids = [], [], []
    shards: dict[str, dict[str, Any]] = {}
    markers, has_progress = store.poll_with_progress()  # one listing for both
    progress = store.progress_of((sid for sid in shard_ids if sid not in markers), listed=has_progress)
    for sid in shard_ids:
        marker = markers.get(sid)
        if marker is not None:
            counts["completed"] += 1
            rows_total = None if rows_total is None else rows_total + marker.rows_input
            rows_done += marker.rows_ok + marker.rows_dead_letter
            rows_dead += marker.rows_dead_letter
            shards[sid] = _shard("completed", marker.rows_input, marker.rows_ok + marker.rows_dead_letter,
                                 marker.rows_dead_letter)
            continue
        missing.append(sid)
        prog = progress.get(sid)
        if prog is None:
            counts["pending"] += 1
            if manifest_rows is None:
                manifest_rows = _manifest_rows(store)
            size = manifest_rows.get(sid)
            rows_total = None if rows_total is None or size is None else rows_total + size
            shards[sid] = _shard("pending", size, 0, 0)
            continue
        rows_total = None if rows_total is None else rows_total + prog.rows_total
        rows_done += prog.rows_done
        rows_dead += prog.rows_dead_letter
        if prog.status == ShardStatus.FAILED.value:
            counts["failed"] += 1
            failed_ids.append(sid)
            shards[sid] = _shard("failed", prog.rows_total, prog.rows_done, prog.rows_dead_letter)
            continue
        age = _age_seconds(prog.updated_at, now)
        if prog.status == ShardStatus.RUNNING.value and age is not None and age > STALE_AFTER_SECONDS:
            counts["stale"] += 1
            stale_ids.append(sid)
            shards[sid] = _shard("stale", prog.rows_total, prog.rows_done, prog.rows_dead_letter)
            continue
        counts["running"] += 1
        shard_rate = max(0.0, prog.rows_per_s) if prog.status == ShardStatus.RUNNING.value else 0.0
        rate += shard_rate
        shards[sid] = _shard("running", prog.rows_total, prog.rows_done, prog.rows_dead_letter, shard_rate)
    remaining = None if rows_total is None else max(0, rows_total - rows_done)
    return {
        "total": len(shard_ids),
        **counts,
        "rows_total": rows_total,
        "rows_done": rows_done,
        "rows_dead_letter": rows_dead,
        "rows_per_s": rate,
        "eta_s": (remaining / rate) if remaining is not None and rate > 0 else None,
        "fraction_done": (rows_done / rows_total) if rows_total else None,
        "missing": missing,
        "failed_ids": failed_ids,
        "stale_ids": stale_ids,
        **({"shards": shards} if per_shard else {}),
    }


def _shard(state: str, rows_total: int | None, rows_done: int, rows_dead_letter: int,
           rows_per_s: float = 0.0) -> dict[str, Any]:
    """One shard's entry of :func:`collect_progress`'s ``shards`` (rows; rows/s)."""
    return {"state": state, "rows_total": rows_total, "rows_done": rows_done,
            "rows_dead_letter": rows_dead_letter, "rows_per_s": rows_per_s}


def _eta(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, sec = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else (f"{minutes}m{sec:02d}s" if minutes else f"{sec}s")


def format_progress(summary: dict[str, Any]) -> str:
    """One compact log line from :func:`collect_progress`'s summary, rate and ETA first.

    Example: ``85.0 rows/s | ETA 23s | rows 1,200/3,200 (37.5%), 4 dead letters | shards 3/8 completed,
    0 failed, 2 running, 3 pending | waiting on 00003, 00004, ...``
    """
    s = summary
    total_rows = "?" if s["rows_total"] is None else f"{s['rows_total']:,}"
    frac = "" if s["fraction_done"] is None else f" ({100 * s['fraction_done']:.1f}%)"
    dead = f", {s['rows_dead_letter']:,} dead letters" if s["rows_dead_letter"] else ""
    parts = [
        f"{s['rows_per_s']:,.1f} rows/s",
        f"ETA {_eta(s['eta_s'])}",
        f"rows {s['rows_done']:,}/{total_rows}{frac}{dead}",
        f"shards {s['completed']}/{s['total']} completed, {s['failed']} failed, {s['running']} running, "
        f"{s['pending']} pending" + (f", {s['stale']} stale" if s["stale"] else ""),
    ]
    if s["missing"]:
        shown = ", ".join(s["missing"][:_MAX_LISTED]) + (", ..." if len(s["missing"]) > _MAX_LISTED else "")
        parts.append(f"waiting on {shown}")
    return " | ".join(parts)
