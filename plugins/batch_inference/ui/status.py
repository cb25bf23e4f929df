"""A run's status in the vocabulary of the hosted batch APIs, from Airflow states and shard markers.

The hosted batch APIs (OpenAI Batch, Anthropic Message Batches, Vertex batch prediction) show one status a
user can glance at. This module maps an Airflow DagRun of a batch-inference DAG onto that vocabulary:

============  ===========================================================================================
status        when
============  ===========================================================================================
validating    the run is queued, or ``plan`` (read input metadata, validate, write the manifest) has not
              succeeded yet
in_progress   ``plan`` succeeded; shards are running or the completion gate waits for their markers
finalizing    the gate opened (``wait_for_shards`` succeeded), ``publish`` / ``summary`` are queued or
              running, or every shard of the manifest has its ``_SUCCESS.json`` marker while the run runs
completed     the DagRun succeeded (a dry run too: nothing was run, nothing failed)
failed        the DagRun failed and some task failed (a shard, the gate below its success ratio, publish)
expired       the DagRun failed because the gate's ``deadline_hours`` passed before enough shards completed
cancelled     the DagRun was marked failed by hand: no task failed (Airflow sets unfinished tasks to
              skipped when a user marks a run failed)
============  ===========================================================================================

Pure functions: no Airflow import, no I/O. :mod:`batch_inference.ui.discovery` gathers the inputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum

FAILED_TI_STATES = frozenset({"failed", "upstream_failed"})
"""TaskInstance states that count as a task failure (a run with none of them was cancelled by hand)."""
ACTIVE_TI_STATES = frozenset({"scheduled", "queued", "running", "deferred", "up_for_retry", "restarting",
                              "up_for_reschedule", "success"})
"""TaskInstance states of a finalizing task that mean it has started or is about to (``success`` too)."""
FINALIZE_TASKS = ("publish", "summary")
GATE_TASK = "wait_for_shards"
PLAN_TASK = "plan"


class BatchStatus(str, Enum):
    """A run's status, batch-API style (see the module docstring for when each applies)."""

    VALIDATING = "validating"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        """Whether the status can no longer change."""
        return self in (BatchStatus.COMPLETED, BatchStatus.FAILED, BatchStatus.EXPIRED, BatchStatus.CANCELLED)


@dataclass(frozen=True)
class RunFacts:
    """What the status is decided from.

    Attributes:
        dag_run_state: the DagRun's state (``queued``, ``running``, ``success``, ``failed``).
        task_states: task id -> state of each unmapped task instance (``None`` state as ``"none"``);
            mapped tasks (``infer_local`` / ``infer_k8s``) may be given as ``"<task_id>[<map_index>]"``.
        shards_total: shards in the manifest (``None``: no manifest yet).
        shards_complete: shards with a complete ``_SUCCESS.json`` marker.
        gate_ended_at: when ``wait_for_shards`` ended (``None`` if it has not).
        deadline_at: the run's start + ``deadline_hours`` (``None`` when unknown).
    """

    dag_run_state: str
    task_states: Mapping[str, str] = field(default_factory=dict)
    shards_total: int | None = None
    shards_complete: int = 0
    gate_ended_at: datetime | None = None
    deadline_at: datetime | None = None


def deadline_of(started_at: datetime | None, deadline_hours: float | None) -> datetime | None:
    """``started_at + deadline_hours`` (the gate's deadline, :class:`~batch_inference.sensors.ShardMarkerSensor`),
    or ``None`` when either is unknown."""
    if started_at is None or deadline_hours is None:
        return None
    return started_at + timedelta(hours=float(deadline_hours))


def _gate_expired(facts: RunFacts) -> bool:
    if facts.task_states.get(GATE_TASK) != "failed":
        return False
    return (facts.gate_ended_at is not None and facts.deadline_at is not None
            and facts.gate_ended_at >= facts.deadline_at)


def batch_status(facts: RunFacts) -> BatchStatus:
    """The run's :class:`BatchStatus` (rules in the module docstring).

    Args:
        facts: the DagRun's and its task instances' states and the markers' count.

    Returns:
        One status; an unknown DagRun state counts as running.
    """
    state = facts.dag_run_state
    if state == "success":
        return BatchStatus.COMPLETED
    if state == "failed":
        if _gate_expired(facts):
            return BatchStatus.EXPIRED
        if any(s in FAILED_TI_STATES for s in facts.task_states.values()):
            return BatchStatus.FAILED
        return BatchStatus.CANCELLED
    if state == "queued" or facts.task_states.get(PLAN_TASK) != "success":
        return BatchStatus.VALIDATING
    if facts.task_states.get(GATE_TASK) == "success":
        return BatchStatus.FINALIZING
    if any(facts.task_states.get(t) in ACTIVE_TI_STATES for t in FINALIZE_TASKS):
        return BatchStatus.FINALIZING
    if facts.shards_total and facts.shards_complete >= facts.shards_total:
        return BatchStatus.FINALIZING
    return BatchStatus.IN_PROGRESS
