"""The ``approve`` task: a person approves the canary's projection before the fan-out (``require_approval``).

Between ``canary`` and ``choose_runner``. :class:`ProjectionApprovalOperator` is Airflow's own
human-in-the-loop :class:`~airflow.providers.standard.operators.hitl.ApprovalOperator` (Approve /
Reject) whose subject and body are filled when it runs, from the run's ``projection.json``: the cost
(spot and on-demand), fan-out worker-seconds, GPU-hours, projected finish, chosen parallelism and token
budget, and the canary's table (:func:`batch_inference.projection.format_table`).

* ``require_approval`` false (the default), or no projection to approve (the canary was skipped: the
  ``canary`` Param off, a dry run, no rows, every shard already complete): the task
  returns at once (``decision: not_required``); nothing waits and the run goes on as without this task.
  A refused canary fails its task, so this task is ``upstream_failed`` and never asks.
* Otherwise it writes the request into Airflow's HITL detail (``hitl_detail`` table; on Airflow 3.3+
  the task then waits in the ``awaiting_input`` state, holding no worker slot) and the Airflow UI lists
  it under Required Actions. The answer comes back through the Core API
  (``PATCH /api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/approve/-1/hitlDetails``, what the UI's
  buttons call), which records who answered and resumes the task.
* **Approve**: the task succeeds; the fan-out runs.
* **Reject**: the task succeeds (a person answered) and skips ``choose_runner``, so no shard task
  starts (``infer_local`` / ``kpo_args`` / ``infer_k8s`` / ``render_k8s`` are skipped); the completion
  gate then fails with :func:`rejection_message` (``REJECTED (approval): <who> rejected ...``).
* **No answer**: the wait ends at the run's deadline (``deadline_hours`` after the DAG run started, at
  least :data:`MIN_WAIT_SECONDS` from the request), after which Airflow's scheduler answers with the
  request's default, ``Reject`` (``responded_by`` empty): the run ends as rejected for no answer.
  (``dag.test()`` / ``airflow dags test`` run no scheduler, so there the wait has no end.)

Every outcome is recorded in ``runs/<run_id>/approval.json`` (:func:`read_approval`): ``pending`` when
the request is written, then ``approved`` / ``rejected`` with who answered and when.

Airflow side only (no torch); the DAG file imports this module when it is parsed (the HITL operator's
import costs about 10 ms of CPU).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.providers.standard.operators.hitl import ApprovalOperator
from batch_contract.layout import APPROVAL_NAME, join_uri

log = logging.getLogger(__name__)

APPROVAL_DECISIONS = ("pending", "approved", "rejected")
MIN_WAIT_SECONDS = 300.0
"""Shortest wait for an answer (seconds), when the run's deadline is nearer than this (or past)."""
TASK_ID = "approve"


def approval_uri(run_dir: str) -> str:
    """``<run_dir>/approval.json``."""
    return join_uri(run_dir, APPROVAL_NAME)


def read_approval(run_dir: str) -> dict[str, Any] | None:
    """The run's approval record, or ``None`` when the run never asked for one.

    Returns:
        ``{"decision": "pending" | "approved" | "rejected", "asked_at": ISO-8601 UTC, "wait_seconds":
        float, "responded_by": {"id", "name"} | None, "responded_at": ISO-8601 | None, "timed_out": bool,
        "projection": {figures the person saw}}``.

    Raises:
        ValueError: the file is not JSON, or ``run_dir`` is not a run directory.
    """
    from batch_contract.runstore import RunStore  # parse time: pyarrow

    return RunStore.open(run_dir).approval()


def write_approval(run_dir: str, record: Mapping[str, Any]) -> None:
    """Write (replace) the run's approval record (see :func:`read_approval` for its fields)."""
    from batch_contract.runstore import RunStore  # parse time: pyarrow

    if record.get("decision") not in APPROVAL_DECISIONS:
        raise ValueError(f"approval decision must be one of {APPROVAL_DECISIONS}, got {record.get('decision')!r}")
    RunStore.open(run_dir).write_approval(record)


def not_required_reason(require_approval: bool, canary_result: Mapping[str, Any] | None,
                        projection: Mapping[str, Any] | None) -> str | None:
    """Why the run does not wait for approval, or ``None`` when it must.

    Args:
        require_approval: the run's ``require_approval`` Param.
        canary_result: the ``canary`` task's XCom (``decision`` ``go`` or ``skipped`` with a ``message``).
        projection: the run's ``projection.json`` (``None``: none was written).
    """
    if not require_approval:
        return "require_approval is off"
    if canary_result and canary_result.get("decision") == "skipped":
        return f"the canary was skipped ({canary_result.get('message')}), so there is no projection to approve"
    if not projection:
        return "the run has no projection.json to approve"
    if projection.get("decision", "go") != "go":
        return f"the canary refused the run ({projection.get('decision')})"
    return None


def _hours(seconds: float) -> str:
    return f"{seconds / 3600.0:.3f} h"


def key_figures(projection: Mapping[str, Any]) -> dict[str, Any]:
    """The figures a person approves, from a ``go`` projection (:func:`batch_inference.projection.project`).

    Returns:
        ``{"cost_usd", "cost_spot_usd", "cost_on_demand_usd"`` (USD, canary included),
        ``"pricing"``, ``"fanout_worker_seconds"`` (s), ``"gpu_hours"``, ``"finish_seconds"`` (s from the
        DAG run's start), ``"parallelism"``, ``"token_budget"`` (tokens per batch), ``"rows"``,
        ``"projected_tokens"``, ``"budget_usd"``, ``"deadline_hours"``}.
    """
    chosen = projection["chosen"]
    return {
        "cost_usd": chosen["cost_usd"],
        "cost_spot_usd": chosen["cost_spot_usd"],
        "cost_on_demand_usd": chosen["cost_on_demand_usd"],
        "pricing": projection.get("pricing"),
        "fanout_worker_seconds": chosen["worker_seconds"],
        "gpu_hours": chosen["gpu_hours"],
        "finish_seconds": chosen["finish_seconds"],
        "parallelism": chosen["parallelism"],
        "token_budget": projection["canary"]["token_budget"],
        "rows": projection.get("rows"),
        "projected_tokens": projection.get("projected_tokens"),
        "budget_usd": projection.get("budget_usd"),
        "deadline_hours": projection.get("deadline_hours"),
    }


def approval_subject(projection: Mapping[str, Any], run_id: str) -> str:
    """One line: ``Approve batch run <run_id>: $0.0017 (spot), 0.064 GPU-h, finish in 0.078 h``."""
    f = key_figures(projection)
    return (f"Approve batch run {run_id}: ${f['cost_usd']:.4g} ({f['pricing']}), {f['gpu_hours']:.4g} GPU-h, "
            f"finish in {_hours(f['finish_seconds'])} at parallelism {f['parallelism']}")


def approval_body(projection: Mapping[str, Any], *, run_dir: str, shards: int,
                  run_started_at: datetime | None = None) -> str:
    """The request's Markdown body: the key figures as a table, the canary's table
    (:func:`~batch_inference.projection.format_table`) as a code block, and what each answer does.

    Args:
        projection: a ``go`` projection.
        run_dir: the run directory (named so the person can find ``projection.json``).
        shards: shards the fan-out would start.
        run_started_at: the DAG run's start (aware datetime); when given, the finish is also shown as a
            UTC time.
    """
    from batch_inference.projection import format_table  # parse time: pyarrow (projection reads storage)

    f = key_figures(projection)
    finish = _hours(f["finish_seconds"]) + " after the run started"
    if run_started_at is not None:
        at = run_started_at + timedelta(seconds=float(f["finish_seconds"]))
        finish += f" ({at.astimezone(UTC):%Y-%m-%d %H:%M} UTC)"
    budget = "none" if f["budget_usd"] is None else f"${f['budget_usd']:g}"
    rows = [
        ("Projected cost, spot", f"${f['cost_spot_usd']:.6g}"),
        ("Projected cost, on-demand", f"${f['cost_on_demand_usd']:.6g}"),
        ("Pricing of this run", str(f["pricing"])),
        ("Fan-out worker-seconds", f"{f['fanout_worker_seconds']:,.1f}"),
        ("GPU-hours (canary included)", f"{f['gpu_hours']:.4g}"),
        ("Projected finish", finish + ", not counting the wait for this approval"),
        ("Parallelism (chosen)", str(f["parallelism"])),
        ("Token budget per batch", f"{f['token_budget']:,}"),
        ("Rows / shards", f"{f['rows']:,} rows in {shards} shard(s)" if f["rows"] is not None else f"{shards} shard(s)"),
        ("Limits", f"budget_usd {budget}, deadline_hours {f['deadline_hours']:g}"),
    ]
    lines = [f"**{projection['message']}**", "", "| Figure | Projected |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in rows]
    lines += ["", "Canary measurement and projection per parallelism (`*` = chosen):", "", "```text",
              format_table(dict(projection)), "```", "",
              f"**Approve** starts the fan-out of {shards} shard(s). **Reject** starts no shard (no further "
              "cost; the rows the canary computed stay committed) and the run fails as rejected. Without an "
              "answer by the run's deadline the run is rejected.", "",
              f"Projection: `{run_dir}/projection.json`"]
    return "\n".join(lines)


def wait_seconds(run_started_at: datetime | None, deadline_hours: float, now: float | None = None) -> float:
    """How long the request waits for an answer (seconds): until the run's deadline (its start plus
    ``deadline_hours``), at least :data:`MIN_WAIT_SECONDS`."""
    now = time.time() if now is None else now
    start = run_started_at.timestamp() if run_started_at is not None else now
    return max(MIN_WAIT_SECONDS, start + deadline_hours * 3600.0 - now)


def _who(user: Mapping[str, Any] | None) -> str:
    if not user:
        return "nobody"
    name, uid = user.get("name"), user.get("id")
    return f"{name} (id {uid})" if uid and uid != name else str(name or uid)


def rejection_message(run_dir: str) -> str | None:
    """Why the run stopped before the fan-out at the approval step, or ``None`` (approved, not asked,
    or unreadable).

    Returns:
        ``REJECTED (approval): <who> rejected the projection ... at <time>; no shard was started. ...``,
        ``REJECTED (approval): no answer ...`` for a wait that timed out, or ``NOT APPROVED: ...`` when
        the request is still ``pending`` (the ``approve`` task failed or was stopped before an answer).
    """
    try:
        record = read_approval(run_dir)
    except (OSError, ValueError):
        return None
    if not record or record.get("decision") == "approved":
        return None
    figures = record.get("projection") or {}
    seen = ""
    if figures:
        seen = (f" (${figures.get('cost_usd', 0):.6g} {figures.get('pricing')}, {figures.get('gpu_hours', 0):.4g} "
                f"GPU-hours, finish in {_hours(float(figures.get('finish_seconds', 0)))} at parallelism "
                f"{figures.get('parallelism')})")
    again = ("To run it: trigger a new run, or clear the approve task and its downstream tasks to be asked "
             "again.")
    if record.get("decision") == "pending":
        return (f"NOT APPROVED: the approval request for the projection{seen} (asked {record.get('asked_at')}) "
                f"got no answer before the approve task stopped (see its log); no shard was started. {again}")
    if record.get("timed_out"):
        return (f"REJECTED (approval): nobody answered the approval request for the projection{seen} within "
                f"{float(record.get('wait_seconds', 0)) / 3600.0:.3f} h (the wait ends at the run's "
                f"deadline, then rejects); no shard was started. {again}")
    return (f"REJECTED (approval): {_who(record.get('responded_by'))} rejected the projection{seen} at "
            f"{record.get('responded_at')}; no shard was started. {again}")


class ProjectionApprovalOperator(ApprovalOperator):
    """Airflow's ``ApprovalOperator`` asking a person to approve the run's projection (module docstring).

    The subject and body are placeholders until :meth:`execute` fills them from ``projection.json``; the
    response timeout is set there too (:func:`wait_seconds`), with ``Reject`` as the answer on timeout.

    Returns (XCom): ``{"decision": "not_required", "message": why}`` when nothing is asked, else the
    approval record (:func:`read_approval`) once answered.
    """

    def __init__(self, *, task_id: str = TASK_ID, **kwargs: Any) -> None:
        kwargs.setdefault("subject", "Approve the batch run's projection")
        kwargs.setdefault("body", "Filled in from the run's projection.json when the task runs.")
        super().__init__(task_id=task_id, defaults=ApprovalOperator.REJECT, **kwargs)

    def execute(self, context: Any) -> Any:
        # parse time: both read storage (pyarrow); this module is imported when a DAG file parses
        from batch_inference.planned import planned_run
        from batch_inference.projection import read_projection

        cfg, manifest, run_dir = planned_run(context)
        canary_result = context["ti"].xcom_pull(task_ids="canary")
        projection = read_projection(run_dir) if cfg.require_approval else None
        why = not_required_reason(cfg.require_approval, canary_result, projection)
        if why:
            if cfg.require_approval:
                log.warning("approval not asked: %s; the run goes on", why)
            else:
                log.info("approval not asked: %s", why)
            return {"decision": "not_required", "message": why}
        started = getattr(context.get("dag_run"), "start_date", None)
        wait = wait_seconds(started, cfg.deadline_hours)
        self.subject = approval_subject(projection, manifest.run_id)
        self.body = approval_body(projection, run_dir=run_dir, shards=len(manifest.shards), run_started_at=started)
        self.response_timeout = timedelta(seconds=wait)
        write_approval(run_dir, {"decision": "pending", "asked_at": datetime.now(UTC).isoformat(timespec="seconds"),
                                 "wait_seconds": round(wait, 1), "responded_by": None, "responded_at": None,
                                 "timed_out": False, "projection": key_figures(projection)})
        log.info("asking for approval (Airflow UI: Required Actions), waiting up to %.2f h: %s", wait / 3600.0,
                 self.subject)
        return super().execute(context)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        """Record the answer in ``approval.json``, then let ``ApprovalOperator`` act on it (Reject skips
        ``choose_runner``, so no shard starts). Returns the approval record."""
        from batch_inference.planned import planned_run  # parse time: pyarrow (the run store)

        _cfg, _manifest, run_dir = planned_run(context)
        record = read_approval(run_dir) or {}
        if "error" not in event:
            chosen = list(event.get("chosen_options") or [])
            responded_at = event.get("responded_at")
            record.update({
                "decision": "approved" if chosen == [self.APPROVE] else "rejected",
                "responded_by": event.get("responded_by_user"),
                "responded_at": responded_at.isoformat() if isinstance(responded_at, datetime) else responded_at,
                "timed_out": bool(event.get("timedout")),
            })
            write_approval(run_dir, record)
            log.info("approval: %s by %s at %s%s", record["decision"], _who(record["responded_by"]),
                     record["responded_at"], " (no answer before the deadline: the default)" if record["timed_out"] else "")
        super().execute_complete(context, event)
        return record


__all__ = ["APPROVAL_DECISIONS", "APPROVAL_NAME", "MIN_WAIT_SECONDS", "ProjectionApprovalOperator", "TASK_ID",
           "approval_body", "approval_subject", "approval_uri", "key_figures", "not_required_reason",
           "read_approval", "rejection_message", "wait_seconds", "write_approval"]
