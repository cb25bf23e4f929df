"""The observability suite's Airflow DAGs: the product's factory (``batch_inference.dag_factory.build_dag``) with
a deadline of ``OBS_DEADLINE_HOURS`` (seconds, not a day), one DAG per scenario; the worker wrapper
(``throttled_worker.py``) slows or fails shards by the DAG id's suffix."""

from __future__ import annotations

import os

from batch_inference.dag_factory import DagSpec, build_dag
from batch_inference.params import replace_field

DEADLINE_HOURS = float(os.environ.get("OBS_DEADLINE_HOURS", "0.04"))

for suffix in ("slow", "fail", "budget"):
    dag_id = f"obs_{suffix}"
    globals()[dag_id] = build_dag(DagSpec(
        dag_id=dag_id, description=f"observability suite: {suffix}", schedule=None, tags=["observability"],
        params={"deadline_hours": replace_field("deadline_hours", default=DEADLINE_HOURS).param()},
        output_table=dag_id,
    ), runners=("local",))
