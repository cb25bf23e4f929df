"""Alerts that fire, under Airflow's own scheduler and triggerer (not ``dags test``): the deadline alert of
a run whose shard is slowed past its deadline, and the gate's notifier for a budget stop and for a run
below ``min_success_ratio`` (conftest.py sets up the deployment and the three runs)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from obs_deployment import DEADLINE_HOURS, record

pytestmark = [pytest.mark.integration]


def _of(alerts: list[dict[str, Any]], deployment, dag_id: str) -> list[dict[str, Any]]:
    run_id = deployment["runs"][dag_id]["run_id"]
    return [a for a in alerts if a["dag_id"] == dag_id and a["run_id"] == run_id]


def test_the_deadline_alert_fires_in_the_triggerer_while_the_slow_shard_runs(deployment, alerts) -> None:
    fired = [a for a in _of(alerts, deployment, "obs_slow") if a["kind"] == "deadline_missed"]
    record(deadline_alert_fired=len(fired) == 1, deadline_alert=fired[0] if fired else None)
    assert len(fired) == 1, alerts
    alert = fired[0]
    assert alert["delivered"] == "async"                          # the triggerer awaited the notifier
    assert alert["rows_total"] == 3000 and 0 < alert["rows_left"] < 3000, alert
    assert alert["rows_per_s"] > 0 and alert["projected_finish"] is not None, alert
    assert datetime.fromisoformat(alert["projected_finish"]).tzinfo is not None
    assert deployment["runs"]["obs_slow"]["run_id"] in alert["message"]
    assert f"Not finished {DEADLINE_HOURS} h after it was queued" in alert["message"]
    assert deployment["runs"]["obs_slow"]["state"] == "success"  # an alert, not a failure: the run went on


def test_a_run_below_min_success_ratio_notifies_from_the_gate(deployment, alerts) -> None:
    sent = _of(alerts, deployment, "obs_fail")
    gate = [a for a in sent if a["kind"] == "below_min_success_ratio"]
    record(min_success_ratio_alert_fired=len(gate) == 1)
    assert deployment["runs"]["obs_fail"]["state"] == "failed"
    assert len(gate) == 1, sent
    assert gate[0]["delivered"] == "sync" and gate[0]["rows_total"] == 200 and gate[0]["rows_left"] == 100
    assert gate[0]["shards_missing"] == 1 and "00001" in gate[0]["detail"]


def test_a_budget_stop_notifies_from_the_gate(deployment, alerts) -> None:
    sent = _of(alerts, deployment, "obs_budget")
    stop = [a for a in sent if a["kind"] == "budget_stop"]
    record(budget_stop_alert_fired=len(stop) == 1)
    assert deployment["runs"]["obs_budget"]["state"] == "failed"
    assert len(stop) == 1, sent
    assert "BUDGET EXCEEDED" in stop[0]["detail"] and stop[0]["rows_left"] > 0
