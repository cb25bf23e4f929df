"""Fan-out at scale: Airflow's own scheduler expands a planned run's shard refs into mapped task
instances (``bench-scale``'s ``fanout`` stage, issue #35; docs/scale.md).

The DAG (:func:`build_dag`, loaded from ``bench/fanout_dags/``) has the product's fan-out shape on a
plan the ``plan`` stage wrote: ``plan`` pushes :func:`batch_inference.planner.shard_refs` of that
manifest (the XCom the product's plan task pushes), ``infer_local`` maps over the refs
(``.expand(ref=...)``, as the local runner does), ``kpo_args`` turns them into the pods' kwargs
(:func:`batch_inference.tasks.kpo_args_task`) and ``infer_k8s`` is the product's ``ShardPodOperator``
mapped over those (``.expand_kwargs``). Both mapped tasks sit in a pool of zero slots, so the
scheduler creates and schedules every task instance but runs none: the figure is the scheduler's, not
1,024 task processes' on two cores.

:func:`measure` starts PostgreSQL and Airflow's four services (``tests/airflow_services.py``: api-server,
scheduler with the LocalExecutor, triggerer, dag-processor), triggers one run and reads the task
instances from the metadata database until every mapped one is ``scheduled``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

DAG_ID = "scale_fanout"
HOLD_POOL = "scale_fanout_hold"
"""A pool of zero slots: the mapped task instances are created and scheduled, never queued."""
MAPPED = ("infer_local", "infer_k8s")
DAGS_DIR = Path(__file__).resolve().parent / "fanout_dags"
WAIT_S = 900.0
"""Longest wait for the services and the expansion (seconds)."""


def plan_refs(run_dir: str) -> list[dict[str, Any]]:
    """The shard refs of the manifest under ``run_dir``: what the product's plan task pushes."""
    from batch_inference.planned import manifest_for
    from batch_inference.planner import shard_refs

    return shard_refs(manifest_for(run_dir), run_dir)


def build_dag():
    """The fan-out DAG: ``plan`` -> ``infer_local`` (mapped) and ``plan`` -> ``kpo_args`` ->
    ``infer_k8s`` (mapped ``ShardPodOperator``), both mapped tasks in :data:`HOLD_POOL`."""
    import pendulum
    from airflow.sdk import DAG, task
    from batch_inference.dag_factory import K8S_SHARD_LABEL
    from batch_inference.pod_spec import K8sSettings, kpo_partial_kwargs
    from batch_inference.shard_pod import ShardPodOperator

    with DAG(dag_id=DAG_ID, schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
             catchup=False, max_active_runs=1) as dag:

        @task
        def plan(**context: Any) -> list[dict[str, Any]]:
            return plan_refs(context["dag_run"].conf["run_dir"])

        @task
        def kpo_args(refs: list[dict[str, Any]], **context: Any) -> list[dict[str, Any]]:
            from batch_inference import tasks

            return tasks.kpo_args_task(refs, context)

        @task(pool=HOLD_POOL)
        def infer_local(ref: dict[str, Any]) -> int:
            return len(json.dumps(ref))

        planned = plan()
        infer_local.expand(ref=planned)
        ShardPodOperator.partial(task_id="infer_k8s", pool=HOLD_POOL, map_index_template=K8S_SHARD_LABEL,
                                 **kpo_partial_kwargs(K8sSettings.from_env())).expand_kwargs(kpo_args(planned))
    return dag


def _task_rows(dsn: str, run_id: str) -> dict[str, dict[str, Any]]:
    """From the ``airflow`` database of the server at ``dsn``, per task id: ``mapped`` (task instances with ``map_index >= 0``), ``scheduled`` (of those in
    state ``scheduled``), ``first_scheduled``/``last_scheduled`` (``scheduled_dttm``) and ``end``
    (``end_date`` of an unmapped task), from the metadata database."""
    import psycopg

    sql = ("SELECT task_id, count(*) FILTER (WHERE map_index >= 0), "
           "count(*) FILTER (WHERE map_index >= 0 AND state = 'scheduled'), "
           "min(scheduled_dttm), max(scheduled_dttm), max(end_date) "
           "FROM task_instance WHERE dag_id = %s AND run_id = %s GROUP BY task_id")
    with psycopg.connect(dsn, dbname="airflow") as con:
        rows = con.execute(sql, (DAG_ID, run_id)).fetchall()
    return {r[0]: {"mapped": r[1], "scheduled": r[2], "first_scheduled": r[3], "last_scheduled": r[4],
                   "end": r[5]} for r in rows}


def _wait_expanded(dsn: str, run_id: str, shards: int, deadline: float) -> dict[str, dict[str, Any]]:
    """Poll until every mapped task has ``shards`` scheduled task instances. Raises ``TimeoutError``."""
    while time.monotonic() < deadline:
        rows = _task_rows(dsn, run_id)
        if all(rows.get(t, {}).get("scheduled") == shards for t in MAPPED):
            return rows
        time.sleep(1.0)
    raise TimeoutError(f"mapped task instances not all scheduled in time: {_task_rows(dsn, run_id)}")


def _figures(rows: dict[str, dict[str, Any]], shards: int) -> dict[str, Any]:
    """Seconds from each mapped task's upstream end to its first and last scheduled instance."""
    upstream = {"infer_local": "plan", "infer_k8s": "kpo_args"}
    out: dict[str, Any] = {"mapped_task_instances": {t: rows[t]["mapped"] for t in MAPPED}, "shards": shards}
    for task_id in MAPPED:
        end = rows[upstream[task_id]]["end"]
        out[f"{task_id}_first_scheduled_s"] = round((rows[task_id]["first_scheduled"] - end).total_seconds(), 3)
        out[f"{task_id}_all_scheduled_s"] = round((rows[task_id]["last_scheduled"] - end).total_seconds(), 3)
    out["create_all_mapped_s"] = max(out[f"{t}_all_scheduled_s"] for t in MAPPED)
    return out


def _payload_bytes(refs: list[dict[str, Any]]) -> dict[str, int]:
    """Bytes each mapped task instance receives: its ref (``infer_local``) and its pod kwargs
    (``infer_k8s``), as JSON; the largest of each."""
    from batch_inference.tasks import kpo_args_task

    kwargs = kpo_args_task(refs, {"run_id": "scheduled__2026-01-01T00:00:00+00:00"})
    return {"infer_local_arg_bytes_max": max(len(json.dumps(r)) for r in refs),
            "infer_k8s_kwargs_bytes_max": max(len(json.dumps(k)) for k in kwargs),
            "plan_xcom_bytes": len(json.dumps(refs)), "kpo_args_xcom_bytes": len(json.dumps(kwargs))}


def measure(run_dir: str, work: Path) -> dict[str, Any]:
    """Start PostgreSQL and Airflow's services, trigger :data:`DAG_ID` on ``run_dir``'s plan, wait until
    every mapped task instance is scheduled, stop everything. Returns the figures (seconds, bytes).

    Raises:
        RuntimeError: a service did not start. TimeoutError: the expansion took over :data:`WAIT_S`.
    """
    import os
    import sys

    import pg_fixture
    from airflow_services import AirflowServices, create_database, sqlalchemy_url
    from batch_inference.cli import airflow_env

    refs = plan_refs(run_dir)
    env = airflow_env(work / "airflow_home")
    env.update({"AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_DIR),
                "PYTHONPATH": os.pathsep.join([str(DAGS_DIR.parent), env["PYTHONPATH"]]),
                "AIRFLOW__CORE__MAX_MAP_LENGTH": str(max(1024, len(refs)))})
    env = {k: v for k, v in env.items() if not k.startswith("OTEL_")}
    dsn, pg_dir = pg_fixture.start_cluster()
    try:
        create_database(dsn, "airflow")
        svc = AirflowServices(work / "airflow_home", env, sqlalchemy_url(dsn, "airflow"))
        deadline = time.monotonic() + WAIT_S
        svc.start((DAG_ID,))
        try:
            svc.api("POST", "/api/v2/pools", {"name": HOLD_POOL, "slots": 0})
            run_id = svc.trigger(DAG_ID, {"run_dir": run_dir})
            rows = _wait_expanded(dsn, run_id, len(refs), deadline)
        except BaseException:
            sys.stderr.write(svc.log_tail("scheduler", 4000))
            raise
        finally:
            svc.stop()
    finally:
        pg_fixture.stop_cluster(pg_dir)
    return {**_figures(rows, len(refs)), **_payload_bytes(refs), "services_start_s": round(svc.start_seconds, 1)}
