"""The runs the Batch inference page shows, from Airflow's metadata DB (never from worker processes).

A batch-inference DAG is any DAG tagged :data:`DAG_TAG` (every DAG the factory builds is). Its runs are
DagRuns; a run's storage directory is the ``run_dir`` XCom of its ``plan`` task; its tasks' states and
the gate's end feed :func:`batch_inference.ui.status.batch_status`. Runs only on the API server (imports
Airflow's ORM models).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from airflow.models.dag import DagTag
from airflow.models.dagrun import DagRun
from airflow.models.taskinstance import TaskInstance
from airflow.models.xcom import XComModel
from sqlalchemy import select
from sqlalchemy.orm import Session

from batch_inference.dag_factory import BASE_TAGS
from batch_inference.ui.status import GATE_TASK, PLAN_TASK

DAG_TAG = BASE_TAGS[0]
"""The tag that marks a batch-inference DAG (``batch-inference``, :data:`batch_inference.dag_factory.BASE_TAGS`)."""
RUN_DIR_XCOM_KEY = "run_dir"
"""XCom key under which ``plan`` pushes ``<output_root>/runs/<dag_id>/<run_id>`` (:func:`batch_inference.tasks.plan_task`)."""


@dataclass
class RunRecord:
    """One DagRun of a batch-inference DAG, as the metadata DB knows it.

    Attributes:
        dag_id / run_id: the run's identity.
        state: DagRun state (``queued``, ``running``, ``success``, ``failed``).
        queued_at / start_date / end_date: UTC datetimes (``None`` until set).
        conf: the run's conf (trigger-form values).
        run_dir: the ``plan`` task's ``run_dir`` XCom (``None`` before ``plan`` pushed it).
        task_states: task id -> state; mapped task instances as ``"<task_id>[<map_index>]"``.
        gate_ended_at: end of ``wait_for_shards`` (``None`` until it ended).
    """

    dag_id: str
    run_id: str
    state: str
    queued_at: datetime | None = None
    start_date: datetime | None = None
    end_date: datetime | None = None
    conf: dict[str, Any] = field(default_factory=dict)
    run_dir: str | None = None
    task_states: dict[str, str] = field(default_factory=dict)
    gate_ended_at: datetime | None = None


def batch_dag_ids(session: Session) -> list[str]:
    """Ids of the DAGs tagged :data:`DAG_TAG`, sorted."""
    return sorted(session.scalars(select(DagTag.dag_id).where(DagTag.name == DAG_TAG)).all())


def _state(value: Any) -> str:
    return "none" if value is None else str(getattr(value, "value", value))


def find_runs(session: Session, dag_ids: Iterable[str], *, limit: int = 50,
              run_id: str | None = None) -> list[RunRecord]:
    """The newest runs of ``dag_ids`` (by ``run_after``), with their run dirs and task states.

    Args:
        session: a metadata DB session.
        dag_ids: DAGs to look in (the caller has checked the user may read them).
        limit: at most this many runs.
        run_id: only the run with this id (then ``dag_ids`` should be one DAG).

    Returns:
        Newest first; three queries in all (runs, their task instances, their ``run_dir`` XComs).
    """
    ids = list(dag_ids)
    if not ids:
        return []
    query = select(DagRun).where(DagRun.dag_id.in_(ids)).order_by(DagRun.run_after.desc()).limit(limit)
    if run_id is not None:
        query = query.where(DagRun.run_id == run_id)
    runs = {(dr.dag_id, dr.run_id): RunRecord(
        dag_id=dr.dag_id, run_id=dr.run_id, state=_state(dr.state), queued_at=dr.queued_at,
        start_date=dr.start_date, end_date=dr.end_date, conf=dict(dr.conf or {}),
    ) for dr in session.scalars(query)}
    if not runs:
        return []
    run_ids = sorted({rid for _, rid in runs})
    tis = session.execute(select(TaskInstance.dag_id, TaskInstance.run_id, TaskInstance.task_id,
                                 TaskInstance.map_index, TaskInstance.state, TaskInstance.end_date)
                          .where(TaskInstance.dag_id.in_(ids), TaskInstance.run_id.in_(run_ids)))
    for dag_id, rid, task_id, map_index, state, end_date in tis:
        rec = runs.get((dag_id, rid))
        if rec is None:
            continue
        rec.task_states[task_id if map_index < 0 else f"{task_id}[{map_index}]"] = _state(state)
        if task_id == GATE_TASK:
            rec.gate_ended_at = end_date
    xcoms = session.scalars(select(XComModel).where(
        XComModel.dag_id.in_(ids), XComModel.run_id.in_(run_ids), XComModel.task_id == PLAN_TASK,
        XComModel.key == RUN_DIR_XCOM_KEY, XComModel.map_index == -1))
    for row in xcoms:
        rec = runs.get((row.dag_id, row.run_id))
        value = XComModel.deserialize_value(row)
        if rec is not None and isinstance(value, str):
            rec.run_dir = value
    return list(runs.values())
