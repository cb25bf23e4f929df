"""Metrics of the three runs (conftest.py) through Airflow's own OTel backend to a real OTLP receiver, from
the task processes and the triggerer of a real deployment: the run's figures by the names and tags of
``batch_inference.metrics.METRICS``, and Airflow's own deadline metric for the run that missed it."""

from __future__ import annotations

import pytest
from obs_deployment import record

pytestmark = [pytest.mark.integration]

PREFIX = "airflow."


def test_the_runs_metrics_arrive_with_their_tags(deployment) -> None:
    from batch_inference.metrics import METRICS

    receiver = deployment["metrics"]
    ours = sorted(n[len(PREFIX):] for n in receiver.names() if n.startswith(PREFIX + "batch_inference."))
    record(metrics_received=ours)
    documented = {spec.name for spec in METRICS}
    assert set(ours) <= documented, set(ours) - documented
    slow = deployment["runs"]["obs_slow"]["run_id"]
    done = receiver.latest(PREFIX + "batch_inference.run.rows_done", dag_id="obs_slow", run_id=slow, stage="report")
    assert done is not None and done.value == 3000
    fail = deployment["runs"]["obs_fail"]["run_id"]
    gate = receiver.latest(PREFIX + "batch_inference.run.rows_done", dag_id="obs_fail", run_id=fail, stage="gate")
    assert gate is not None and gate.value == 100                   # the failed shard's rows never came
    shards = receiver.latest(PREFIX + "batch_inference.run.shards", dag_id="obs_fail", run_id=fail, stage="gate",
                             state="completed")
    assert shards is not None and shards.value == 1


def test_airflows_own_deadline_metric_names_the_run(deployment) -> None:
    slow = deployment["runs"]["obs_slow"]["run_id"]
    missed = deployment["metrics"].points(PREFIX + "deadline_alerts.deadline_missed", dag_id="obs_slow",
                                          dagrun_id=slow)
    record(airflow_deadline_missed_metric=bool(missed))
    assert missed, sorted(deployment["metrics"].names())[:50]
