"""The completion gate: a deferrable sensor over shard markers in storage.

The storage side (run store, completion check, trigger) is imported inside the methods: a DAG file that
builds this sensor pays no pyarrow import at parse time.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from batch_inference.approval import rejection_message
from batch_inference.params import PARAM_FIELDS

if TYPE_CHECKING:
    from batch_contract.runstore import RunStore

MAX_CAUSE_READS = 50
"""Most missing shards whose attempt records the gate reads to name why they stopped."""


def _cause_of(attempt: Any) -> str:
    """A missing shard's cause and fix, from its last attempt record (``None``: it never started)."""
    if attempt is None:
        return ("no attempt record (the worker stopped before its attempt began, e.g. on a bad model path "
                "or engine option, or its task never ran): the shard's task error names the cause; fix "
                "that Param and trigger a new run, or clear the task if it never ran")
    code = attempt.exit_code
    if code == 2:
        return ("bad config or input (worker exit 2; the shard's task log names the field): fix that Param "
                "(e.g. a bad model path -> the model Param) and trigger a new run; a retry cannot fix it")
    if code == 75:
        return "interrupted (exit 75) and out of retries: clear the shard's task to resume after its committed chunks"
    if code is None:
        return ("killed while running (no exit code: SIGKILL, out of memory, node loss): check memory "
                "(lower token_budget) and clear the shard's task to resume")
    return f"worker failed (exit {code}; traceback in the shard's task log): fix it, then clear the shard's task"


class ShardMarkerSensor(BaseSensorOperator):
    """Succeed when the run's complete shards hold ``min_success_ratio`` of its rows; fail at the
    deadline naming the missing shards.

    Checks storage once in the worker; if not yet satisfied and ``deferrable``, hands the wait to
    :class:`~batch_inference.triggers.ShardMarkerTrigger` (no worker slot held while waiting).

    Args:
        run_dir: ``<output_root>/runs/<dag_id>/<run_id>`` (templated).
        deadline_hours: hours after the DAG run's start at which the gate fails (templated; the planned
            value recorded in the manifest wins: :meth:`_adopt_planned`).
        min_success_ratio: 0..1 (templated; the planned value wins).
        dry_run: skip (nothing was run) when true (templated; the planned value wins).
        wait_for_stragglers: when the shards are not complete at the first check, wait instead of failing
            at once (kubernetes: a pod being deleted can still commit in its termination grace after its
            task gave up; local: a worker never outlives its task) (templated; ``"True"``/``"False"``).
        straggler_grace_seconds: how long that wait lasts after the first check (the pods' termination
            grace plus a margin); ``0``: until the deadline (templated).
        poll_seconds: trigger poll interval (seconds).
        deferrable: wait in the triggerer (default) or poke in the worker.

    Returns (XCom): the completion status dict (``shards_total``, ``shards_complete``, ``rows_total``,
    ``rows_complete``, ``missing``, ``ratio``).
    """

    template_fields: Sequence[str] = ("run_dir", "deadline_hours", "min_success_ratio", "dry_run",
                                      "wait_for_stragglers", "straggler_grace_seconds")

    def __init__(self, *, run_dir: str, deadline_hours: Any = PARAM_FIELDS["deadline_hours"].default,
                 min_success_ratio: Any = PARAM_FIELDS["min_success_ratio"].default,
                 dry_run: Any = PARAM_FIELDS["dry_run"].default, wait_for_stragglers: Any = True,
                 straggler_grace_seconds: Any = 0, poll_seconds: float = 10.0,
                 deferrable: bool = True,
                 **kwargs: Any) -> None:
        kwargs.setdefault("poke_interval", poll_seconds)
        super().__init__(**kwargs)
        self.run_dir = run_dir
        self.deadline_hours = deadline_hours
        self.min_success_ratio = min_success_ratio
        self.dry_run = dry_run
        self.wait_for_stragglers = wait_for_stragglers
        self.straggler_grace_seconds = straggler_grace_seconds
        self.poll_seconds = poll_seconds
        self.deferrable = deferrable

    def _run_deadline(self, context: Any) -> float:
        """The run's deadline (epoch seconds): its start plus ``deadline_hours``."""
        dag_run = context.get("dag_run")
        start = getattr(dag_run, "start_date", None) if dag_run is not None else None
        return (start.timestamp() if start is not None else time.time()) + float(self.deadline_hours) * 3600.0

    def _deadline_epoch(self, context: Any) -> float:
        """When the wait ends (epoch seconds): the run's deadline, or earlier, ``straggler_grace_seconds``
        after the gate's first check when that is set."""
        deadline = self._run_deadline(context)
        grace = float(self.straggler_grace_seconds or 0)
        if grace > 0:
            if getattr(self, "_first_check", None) is None:
                self._first_check = time.time()
            deadline = min(deadline, self._first_check + grace)
        return deadline

    def _timeout_reason(self, context: Any) -> str:
        """Why the wait ended: the run's deadline, or the straggler grace (well before the deadline)."""
        if float(self.straggler_grace_seconds or 0) > 0 and time.time() < self._run_deadline(context) - 1.0:
            return (f"the fan-out finished and pods still being deleted had {float(self.straggler_grace_seconds):g} s "
                    "(their termination grace) to commit")
        return "deadline passed"

    @staticmethod
    def _truthy(value: Any) -> bool:
        return value is True or str(value).strip().lower() == "true"

    def _is_dry_run(self) -> bool:
        return self._truthy(self.dry_run)

    PLANNED_FIELDS = ("deadline_hours", "min_success_ratio", "dry_run")
    """Settings the gate takes from the run as planned (the manifest's ``params``) when recorded there."""

    def _adopt_planned(self) -> None:
        """Take :data:`PLANNED_FIELDS` from the config the plan task resolved and recorded in the manifest
        (the one every task of the run sees: validated, within the deployment's ceilings), over the
        templated values; a manifest without them (a run planned outside a DAG) keeps the templated ones."""
        try:
            params = self._store().manifest.params
        except FileNotFoundError:
            return
        for name in self.PLANNED_FIELDS:
            if name in params:
                setattr(self, name, params[name])

    def _store(self) -> RunStore:
        """One store for this task's life (manifest read once, markers once each)."""
        if getattr(self, "_run_store", None) is None:
            from batch_contract.runstore import RunStore  # parse time: pyarrow

            self._run_store = RunStore.open(self.run_dir)
        return self._run_store

    def poke(self, context: Any) -> bool:
        from batch_inference.completion import gate_check  # parse time: pyarrow

        status, line = gate_check(self._store(), float(self.min_success_ratio))
        self.log.info("%s", line)
        if status.satisfied:
            return True
        if time.time() >= self._deadline_epoch(context):
            self._fail(status.to_dict(), self._timeout_reason(context))
        return False

    def execute(self, context: Any) -> dict:
        # parse time: pyarrow (the run store); this module is imported when a DAG file parses
        from batch_inference.canary_task import refusal_message
        from batch_inference.completion import check_completion, gate_check
        from batch_inference.triggers import ShardMarkerTrigger

        if str(self.run_dir).strip() not in {"", "None"}:
            self._adopt_planned()
        if self._is_dry_run():
            raise AirflowSkipException("dry run: no shards were run, nothing to wait for")
        if str(self.run_dir).strip() in {"", "None"}:
            raise AirflowFailException(
                "completion gate: nothing to wait for: the plan task failed, so no shards were planned "
                "(its error, e.g. a missing column or a bad Param, is in the plan task's log); fix it and "
                "trigger a new run"
            )
        refused = refusal_message(str(self.run_dir))
        if refused:
            raise AirflowFailException(f"completion gate: nothing to wait for: the canary refused the run "
                                       f"before the fan-out: {refused}")
        rejected = rejection_message(str(self.run_dir))
        if rejected:
            raise AirflowFailException(f"completion gate: nothing to wait for: {rejected}")
        status, line = gate_check(self._store(), float(self.min_success_ratio))
        self.log.info("%s", line)
        if status.satisfied:
            return status.to_dict()
        if not self._truthy(self.wait_for_stragglers):
            self._fail(status.to_dict(), "the fan-out finished")
        if not self.deferrable:
            super().execute(context)
            return check_completion(self._store(), float(self.min_success_ratio)).to_dict()
        deadline = self._deadline_epoch(context)
        if time.time() >= deadline:
            self._fail(status.to_dict(), self._timeout_reason(context))
        self.defer(
            trigger=ShardMarkerTrigger(self.run_dir, deadline, float(self.min_success_ratio),
                                       self.poll_seconds),
            method_name="execute_complete",
            timeout=timedelta(seconds=max(1.0, deadline - time.time() + 60.0)),
        )

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict:
        """Resume after the trigger's event: return the status, or fail naming the missing shards."""
        if event.get("status") == "success":
            return {k: v for k, v in event.items() if k != "status"}
        if event.get("status") == "error":
            raise AirflowFailException(f"completion gate for {self.run_dir}: {event.get('message')}")
        self._fail(event, self._timeout_reason(context))
        return {}

    def _fail(self, status: dict[str, Any], why: str) -> None:
        from batch_inference.completion import name_shards  # parse time: pyarrow

        missing = list(status.get("missing", []))
        raise AirflowFailException(
            f"completion gate for {self.run_dir}: {why} with {len(missing)} shard(s) missing their "
            f"_SUCCESS.json marker: {name_shards(missing)}; rows complete {status.get('rows_complete')}/"
            f"{status.get('rows_total')} (ratio {status.get('ratio', 0):.4f} < min_success_ratio "
            f"{status.get('min_success_ratio')}). {self._causes(missing)}"
        )

    def _not_started_cause(self) -> str:
        """Why a shard with no attempt record never started: the in-run budget stop when the run is over
        its budget (``budget.budget_exceeded``), else :func:`_cause_of` ``(None)``. Computed once."""
        if getattr(self, "_not_started", None) is None:
            from batch_inference.budget import BUDGET_STOP_FIX, budget_exceeded  # parse time: pyarrow
            from batch_inference.planned import run_config_of

            try:
                exceeded = budget_exceeded(self.run_dir, run_config_of(self._store().manifest))
            except (OSError, ValueError):
                exceeded = None
            self._not_started = (f"not started: BUDGET EXCEEDED, {exceeded}. {BUDGET_STOP_FIX}" if exceeded
                                 else _cause_of(None))
        return self._not_started

    def _causes(self, missing: list[str]) -> str:
        """Why the missing shards stopped, from their last attempt records, and what fixes each cause."""
        from batch_inference.completion import name_shards  # parse time: pyarrow

        by_cause: dict[str, list[str]] = {}
        for sid in missing[:MAX_CAUSE_READS]:
            try:
                attempts = self._store().attempts(sid)
            except (OSError, ValueError):
                attempts = []
            cause = _cause_of(attempts[-1]) if attempts else self._not_started_cause()
            by_cause.setdefault(cause, []).append(sid)
        parts = [f"{cause}: {name_shards(ids)}" for cause, ids in by_cause.items()]
        return "Causes: " + "; ".join(parts) if parts else ""

