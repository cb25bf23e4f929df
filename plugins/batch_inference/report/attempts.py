"""Classify worker attempts and count preemptions and re-done rows."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from batch_contract.enums import ExitCode, ShardStatus

OUTCOMES = ("ok", "preempted", "killed", "failed", "running")
"""Attempt outcomes in the report:

* ``ok`` - exit code 0.
* ``preempted`` - exit code 75 (``ExitCode.INTERRUPTED``: SIGTERM, finished chunks committed).
* ``killed`` - no exit code and still ``running`` although the shard completed: SIGKILL / node loss.
* ``failed`` - any other exit code.
* ``running`` - no exit code and the shard has not completed (still running, or killed and not yet
  retried: the report cannot tell the two apart).
"""


def classify(record: dict[str, Any], shard_complete: bool) -> str:
    """Outcome of one attempt record (see :data:`OUTCOMES`)."""
    code = record.get("exit_code")
    if code is None:
        status = record.get("status", ShardStatus.RUNNING.value)
        if status == ShardStatus.COMPLETE.value:
            return "ok"
        return "killed" if shard_complete else "running"
    if code == ExitCode.OK:
        return "ok"
    if code == ExitCode.INTERRUPTED:
        return "preempted"
    return "failed"


def rows_redone(record: dict[str, Any], outcome: str) -> int:
    """Rows an interrupted or killed attempt processed but did not commit (done again by a retry).

    ``rows_processed - rows_committed`` of a ``preempted`` or ``killed`` attempt, else 0.
    """
    if outcome not in {"preempted", "killed"}:
        return 0
    return max(0, int(record.get("rows_processed", 0)) - int(record.get("rows_committed", 0)))


def _span_seconds(start: str | None, end: str | None) -> float:
    """Seconds from ``start`` to ``end`` (ISO timestamps); 0 when either is missing or unreadable."""
    try:
        return max(0.0, (datetime.fromisoformat(str(end)) - datetime.fromisoformat(str(start))).total_seconds())
    except (TypeError, ValueError):
        return 0.0


def attempt_seconds(record: dict[str, Any], outcome: str) -> float:
    """Worker seconds of one attempt: the sum of its ``stage_seconds``; for a ``killed`` or ``running``
    attempt at least the span from its start to its last write (``updated_at``: the last commit or
    progress tick), so an attempt killed before it finished a stage is not counted as 0 s."""
    seconds = float(sum((record.get("stage_seconds") or {}).values()))
    if outcome in {"killed", "running"}:
        seconds = max(seconds, _span_seconds(record.get("started_at"), record.get("updated_at")))
    return seconds


def summarize_attempts(records: list[dict[str, Any]], shard_complete: bool) -> dict[str, Any]:
    """Per-shard attempt summary.

    Returns:
        ``{"attempts": int, "by_outcome": {outcome: int}, "preemptions": int, "killed": int,
        "rows_redone": int, "list": [{attempt_id, outcome, exit_code, started_at, ended_at,
        rows_committed, rows_processed, rows_redone, host, seconds}]}`` where ``seconds`` is
        :func:`attempt_seconds` and a killed attempt's ``rows_processed`` / ``rows_redone`` are those of
        its last progress tick (rows in flight when it was killed).
    """
    listed = []
    by_outcome = dict.fromkeys(OUTCOMES, 0)
    for rec in records:
        outcome = classify(rec, shard_complete)
        by_outcome[outcome] += 1
        listed.append(
            {
                "attempt_id": str(rec.get("attempt_id", "")),
                "outcome": outcome,
                "exit_code": rec.get("exit_code"),
                "started_at": rec.get("started_at") or "",
                "ended_at": rec.get("ended_at") or "",
                "host": rec.get("host", ""),
                "rows_committed": int(rec.get("rows_committed", 0)),
                "rows_processed": int(rec.get("rows_processed", 0)),
                "rows_redone": rows_redone(rec, outcome),
                "seconds": attempt_seconds(rec, outcome),
            }
        )
    return {
        "attempts": len(listed),
        "by_outcome": by_outcome,
        "preemptions": by_outcome["preempted"],
        "killed": by_outcome["killed"],
        "rows_redone": sum(a["rows_redone"] for a in listed),
        "list": listed,
    }
