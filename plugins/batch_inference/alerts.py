"""Run alerts: what a platform team is told when a run misses its deadline, stops on its budget or ends
below ``min_success_ratio``, read from the run store. Airflow side; no Airflow import (the notifiers of
:mod:`batch_inference.notifiers` deliver these through Airflow's notifier mechanism).

An alert names the run, how many rows are left and, from the running shards' rates, when the run would
finish (:func:`batch_inference.progress.collect_progress`). One kind per cause, in
:class:`AlertKind`; a failed completion gate is classified by :func:`classify_gate_failure`.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from batch_contract.layout import RunLayout

log = logging.getLogger(__name__)


class AlertKind(enum.StrEnum):
    """Why a run alerts (the ``kind`` of a :class:`RunAlert`)."""

    DEADLINE_MISSED = "deadline_missed"
    """Airflow's deadline alert: the run is not finished ``deadline_hours`` after it was queued."""
    BUDGET_STOP = "budget_stop"
    """The in-run budget stop left shards unstarted (:func:`batch_inference.budget.budget_exceeded`)."""
    BELOW_MIN_SUCCESS_RATIO = "below_min_success_ratio"
    """The completion gate failed: the complete shards hold less than ``min_success_ratio`` of the rows."""
    GATE_FAILED = "gate_failed"
    """The completion gate failed before waiting (no plan, a refused or rejected run)."""


@dataclass(frozen=True)
class RunAlert:
    """One alert about one run.

    Attributes:
        kind: an :class:`AlertKind` value.
        dag_id: the DAG.
        run_id: the DAG run.
        run_dir: ``<output_root>/runs/<dag_id>/<run_id>``.
        rows_total: the run's input rows; ``None`` when not known (not planned yet).
        rows_done: rows committed (results and dead letters).
        rows_left: ``rows_total - rows_done``; ``None`` when ``rows_total`` is.
        rows_per_s: the running shards' summed rate (rows/s); 0 when none is running.
        projected_finish: ISO-8601 UTC time the run would finish at that rate; ``None`` without a rate.
        shards_missing: shards without a ``_SUCCESS.json`` marker.
        detail: the cause in words (the gate's message, the budget line, the deadline).
    """

    kind: str
    dag_id: str
    run_id: str
    run_dir: str
    rows_total: int | None
    rows_done: int
    rows_left: int | None
    rows_per_s: float
    projected_finish: str | None
    shards_missing: int
    detail: str

    @property
    def message(self) -> str:
        """One line for a pager: kind, run, rows left, projected finish, cause."""
        left = "unknown" if self.rows_left is None else f"{self.rows_left:,}"
        total = "?" if self.rows_total is None else f"{self.rows_total:,}"
        finish = self.projected_finish or "not projected (no shard is running)"
        return (f"batch inference {self.kind.replace('_', ' ')}: DAG {self.dag_id} run {self.run_id}: "
                f"{left} of {total} rows left, {self.shards_missing} shard(s) missing, "
                f"{self.rows_per_s:,.1f} rows/s, projected finish {finish}. {self.detail}").strip()

    def to_dict(self) -> dict[str, Any]:
        """The alert as JSON-ready values, with ``message``."""
        return {**asdict(self), "message": self.message}


def run_dir_for(output_root: str, dag_id: str, run_id: str) -> str:
    """``<output_root>/runs/<dag_id>/<run_id>`` (:class:`batch_contract.layout.RunLayout`)."""
    return RunLayout(output_root, run_id, dag_id).run_dir


def describe_run(kind: AlertKind | str, dag_id: str, run_id: str, run_dir: str, detail: str = "",
                 *, now: datetime | None = None) -> RunAlert:
    """The :class:`RunAlert` of ``kind`` for a run, its figures read from the run store.

    A run that cannot be read (no run dir, not planned yet, storage unreachable, any error) still gets
    an alert: its row figures are unknown and ``detail`` says why, because an alert must never be lost
    to a read error.

    Args:
        kind: why the run alerts.
        dag_id, run_id: the run.
        run_dir: its run dir (:func:`run_dir_for`).
        detail: the cause in words.
        now: the clock (UTC) for the projected finish; default: now.
    """
    from batch_contract.runstore import RunStore  # pyarrow: only when an alert is built

    from batch_inference.progress import collect_progress

    now = now or datetime.now(UTC)
    try:
        if not run_dir:
            raise FileNotFoundError("no run dir")
        store = RunStore.open(run_dir)
        summary = collect_progress(store, [s.shard_id for s in store.manifest.shards], now=now)
    except Exception as exc:  # noqa: BLE001 - any read error: the alert still goes out, saying so
        log.warning("alert for %s %s: progress unreadable: %s", dag_id, run_id, exc)
        reason = ("unknown: no run dir" if not run_dir else "not planned yet (no manifest)"
                  if isinstance(exc, FileNotFoundError) else f"unreadable ({exc})")
        return RunAlert(str(kind), dag_id, run_id, run_dir, None, 0, None, 0.0, None, 0,
                        f"{detail} The run's progress is {reason}.".strip())
    total = summary["rows_total"]
    eta = summary["eta_s"]
    return RunAlert(
        kind=str(kind), dag_id=dag_id, run_id=run_id, run_dir=run_dir, rows_total=total,
        rows_done=int(summary["rows_done"]),
        rows_left=None if total is None else max(0, int(total) - int(summary["rows_done"])),
        rows_per_s=round(float(summary["rows_per_s"]), 3),
        projected_finish=None if eta is None else (now + timedelta(seconds=float(eta))).isoformat(timespec="seconds"),
        shards_missing=len(summary["missing"]), detail=detail,
    )


def classify_gate_failure(message: str) -> AlertKind:
    """The :class:`AlertKind` of a failed completion gate from its error message
    (``batch_inference.sensors.ShardMarkerSensor``): ``BUDGET EXCEEDED`` among the causes -> budget
    stop; shards missing their markers -> below ``min_success_ratio``; anything else (no plan, a
    refused or rejected run) -> gate failed."""
    if "BUDGET EXCEEDED" in message:
        return AlertKind.BUDGET_STOP
    if "missing their _SUCCESS.json marker" in message:
        return AlertKind.BELOW_MIN_SUCCESS_RATIO
    return AlertKind.GATE_FAILED


__all__ = ["AlertKind", "RunAlert", "classify_gate_failure", "describe_run", "run_dir_for"]
