"""The report's projection-versus-actual section: how good the canary's plan was.

Reads the run's ``projection.json`` (written by the ``canary`` task, ``batch_inference.projection``)
and sets it beside what the markers say: fan-out worker-seconds (the report's ``worker_seconds``), cost
(the same price, the canary's own worker-seconds added on both sides) and finish time (seconds from
the DAG run's start to the last shard's marker: the plan's elapsed time recorded in the projection plus
the time from the manifest's creation to the last marker).
"""

from __future__ import annotations

from typing import Any

from batch_inference.pricing import CostParams, worker_cost
from batch_inference.report.aggregate import parse_time


def _error(projected: float | None, actual: float | None) -> float | None:
    """``(projected - actual) / actual``, ``None`` when either is missing or actual is 0."""
    if projected is None or not actual:
        return None
    return round((projected - actual) / actual, 4)


def projection_section(projection: dict[str, Any] | None, *, worker_seconds: float, canary_worker_seconds: float,
                       plan_created_at: str | None, last_shard_finished_at: str | None,
                       params: CostParams) -> dict[str, Any] | None:
    """The ``projection`` section of ``report.json``, or ``None`` for a run without a canary.

    Returns:
        ``{"decision", "message", "parallelism", "token_budget", "projected": {...}, "actual": {...},
        "error": {...}}``; each of ``projected`` / ``actual`` has ``worker_seconds`` (fan-out),
        ``cost_usd`` and ``finish_seconds`` (``None`` when unknown); ``error`` is
        ``(projected - actual) / actual`` per figure.
    """
    if not projection:
        return None
    start, end = parse_time(plan_created_at or ""), parse_time(last_shard_finished_at or "")
    finish = ((end - start).total_seconds() + float(projection.get("elapsed_seconds", 0.0))
              if start and end else None)
    actual = {"worker_seconds": worker_seconds,
              "cost_usd": worker_cost(worker_seconds + canary_worker_seconds, params),
              "finish_seconds": finish}
    projected = {"worker_seconds": projection.get("fanout_worker_seconds"),
                 "cost_usd": projection.get("cost_usd"), "finish_seconds": projection.get("finish_seconds")}
    return {
        "decision": projection.get("decision"),
        "message": projection.get("message"),
        "parallelism": (projection.get("chosen") or {}).get("parallelism"),
        "token_budget": (projection.get("canary") or {}).get("token_budget"),
        "projected": projected,
        "actual": actual,
        "error": {k: _error(projected[k], actual[k]) for k in projected},
    }


__all__ = ["projection_section"]
