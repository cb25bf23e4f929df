"""Run alerts (batch_inference.alerts) and their delivery through Airflow notifiers
(batch_inference.notifiers): the figures come from the run store, every alert goes out even when the
run cannot be read, and the user's notifier gets the alert in its context, sync and async."""

from __future__ import annotations

import asyncio
import json
import sys
import types
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk import BaseNotifier
from batch_inference import notifiers
from batch_inference.alerts import AlertKind, classify_gate_failure, describe_run, run_dir_for
from batch_inference.sensors import ShardMarkerSensor
from test_progress import IDS, NOW, run  # noqa: F401 - the fixture: 6 shards, 300 of 600 rows, 20 rows/s

RECEIVED: list[tuple[str, dict[str, Any]]] = []


class _SyncOnly(BaseNotifier):
    def __init__(self, alert: dict[str, Any]) -> None:
        super().__init__()
        self.alert = alert

    def notify(self, context: Any) -> None:
        RECEIVED.append(("sync", context["batch_alert"]))


class _Async(_SyncOnly):
    async def async_notify(self, context: Any) -> None:
        RECEIVED.append(("async", context["batch_alert"]))


@pytest.fixture()
def user_notifiers(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    module = types.ModuleType("alert_sinks_for_tests")
    module.sync_only = _SyncOnly
    module.with_async = _Async
    module.not_a_notifier = lambda alert: "text"
    monkeypatch.setitem(sys.modules, module.__name__, module)
    RECEIVED.clear()
    return RECEIVED


def test_an_alert_names_the_run_rows_left_and_the_projected_finish(run) -> None:  # noqa: F811
    alert = describe_run(AlertKind.DEADLINE_MISSED, "dag_a", "progress_run", run.run_dir, "late.", now=NOW)
    assert (alert.rows_total, alert.rows_done, alert.rows_left) == (600, 300, 300)
    assert alert.rows_per_s == 20.0 and alert.shards_missing == len(IDS) - 2
    assert alert.projected_finish == datetime.fromtimestamp(NOW.timestamp() + 300 / 20.0, UTC).isoformat(
        timespec="seconds")
    for part in ("deadline missed", "dag_a", "progress_run", "300 of 600 rows left", "late."):
        assert part in alert.message
    assert json.loads(json.dumps(alert.to_dict()))["message"] == alert.message


@pytest.mark.parametrize("run_dir", ["", "/nonexistent/runs/d/r", "gs://"])
def test_an_unreadable_run_still_alerts(run_dir: str) -> None:
    alert = describe_run(AlertKind.BUDGET_STOP, "dag_a", "r", run_dir, "stopped.")
    assert alert.rows_total is None and alert.rows_left is None and alert.projected_finish is None
    assert "budget stop" in alert.message and "stopped." in alert.message and "progress is" in alert.message


def test_gate_failures_are_classified_from_the_gates_own_messages(tmp_path: Path) -> None:
    sensor = ShardMarkerSensor(task_id="g", run_dir=str(tmp_path))
    sensor._not_started = "not started: BUDGET EXCEEDED, the run has spent $2 > budget_usd=1 + 10%. Fix."
    with pytest.raises(Exception) as budget:  # noqa: PT011 - the gate's own AirflowFailException
        sensor._fail({"missing": ["00001"], "rows_complete": 5, "rows_total": 9, "ratio": 0.5,
                      "min_success_ratio": 1.0}, "the fan-out finished")
    assert classify_gate_failure(str(budget.value)) is AlertKind.BUDGET_STOP
    sensor._not_started = "not started: no attempt record"
    with pytest.raises(Exception) as short:  # noqa: PT011
        sensor._fail({"missing": ["00001"], "ratio": 0.5, "min_success_ratio": 1.0}, "deadline passed")
    assert classify_gate_failure(str(short.value)) is AlertKind.BELOW_MIN_SUCCESS_RATIO
    assert classify_gate_failure("completion gate: nothing to wait for: the plan task failed") is AlertKind.GATE_FAILED


def test_the_deadline_callback_reads_the_run_and_awaits_an_async_notifier(
        run, user_notifiers, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    assert run_dir_for(run.output_root, "dag_a", "progress_run") == run.run_dir
    monkeypatch.setenv(notifiers.ALERT_NOTIFIER_ENV, "alert_sinks_for_tests.with_async")
    context = {"dag_run": {"run_id": "progress_run", "conf": {"output_root": run.output_root}}}
    message = asyncio.run(notifiers.log_deadline_missed(context, dag_id="dag_a", deadline_hours=0.5,
                                                        output_root="/elsewhere"))
    ((how, alert),) = user_notifiers
    assert how == "async" and alert["message"] == message and alert["kind"] == "deadline_missed"
    assert alert["rows_left"] == 300 and "0.5 h" in message  # the run's conf output_root won


def test_a_notifier_without_an_async_form_runs_in_a_thread(user_notifiers, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(notifiers.ALERT_NOTIFIER_ENV, "alert_sinks_for_tests:sync_only")
    asyncio.run(notifiers.log_deadline_missed(None, dag_id="d", deadline_hours=1, output_root=""))
    assert [how for how, _ in user_notifiers] == ["sync"]


def test_the_gate_notifier_delivers_the_classified_alert(run, user_notifiers,  # noqa: F811
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(notifiers.ALERT_NOTIFIER_ENV, "alert_sinks_for_tests.sync_only")
    ti = types.SimpleNamespace(xcom_pull=lambda task_ids, key: run.run_dir if (task_ids, key) == ("plan", "run_dir")
                               else None)
    context = {"dag_run": types.SimpleNamespace(run_id="progress_run", dag_id="dag_a"), "ti": ti,
               "exception": "completion gate for x: deadline passed with 4 shard(s) missing their "
                            "_SUCCESS.json marker: 00002..."}
    notifiers.RunAlertNotifier()(context)
    ((how, alert),) = user_notifiers
    assert (how, alert["kind"], alert["dag_id"], alert["rows_left"]) == ("sync", "below_min_success_ratio",
                                                                         "dag_a", 300)


@pytest.mark.parametrize(("path", "error"), [("no_such_module_xyz.f", "cannot import"),
                                             ("alert_sinks_for_tests.missing", "cannot import"),
                                             ("alert_sinks_for_tests.not_a_notifier", "not an airflow.sdk.BaseNotifier")])
def test_a_bad_notifier_setting_is_a_clear_error(user_notifiers, monkeypatch: pytest.MonkeyPatch, path: str,
                                                 error: str) -> None:
    monkeypatch.setenv(notifiers.ALERT_NOTIFIER_ENV, path)
    alert = describe_run(AlertKind.GATE_FAILED, "d", "r", "", "x")
    with pytest.raises(notifiers.AlertDeliveryError, match=error):
        notifiers.deliver(alert)


@pytest.mark.parametrize("state", ["failed", "success"])
def test_a_run_that_already_ended_gets_no_deadline_alert(user_notifiers, monkeypatch: pytest.MonkeyPatch,
                                                        state: str) -> None:
    monkeypatch.setenv(notifiers.ALERT_NOTIFIER_ENV, "alert_sinks_for_tests.with_async")
    context = {"dag_run": {"run_id": "r", "state": state, "conf": {}}}
    assert asyncio.run(notifiers.log_deadline_missed(context, dag_id="d", deadline_hours=1, output_root="")) == ""
    assert user_notifiers == []
    context["dag_run"]["state"] = "running"
    assert asyncio.run(notifiers.log_deadline_missed(context, dag_id="d", deadline_hours=1, output_root=""))
    assert [alert["kind"] for _, alert in user_notifiers] == ["deadline_missed"]


class _Templated(BaseNotifier):
    """A notifier with a templated field, built the way docs/observability.md shows (Slack's ``text``)."""

    template_fields = ("text",)

    def __init__(self, alert: dict[str, Any]) -> None:
        super().__init__()
        self.text = alert["message"]

    def notify(self, context: Any) -> None:
        RECEIVED.append(("text", {"message": self.text}))


@pytest.mark.parametrize("detail", ["{{ 7 * 7 }}", "x {{ unclosed", "{% for x in y %}", "{# c #}"])
def test_an_alerts_text_is_delivered_verbatim_never_rendered(user_notifiers, monkeypatch: pytest.MonkeyPatch,
                                                             detail: str) -> None:
    sys.modules["alert_sinks_for_tests"].templated = _Templated
    monkeypatch.setenv(notifiers.ALERT_NOTIFIER_ENV, "alert_sinks_for_tests.templated")
    alert = describe_run(AlertKind.GATE_FAILED, "d", "r", "", detail)
    notifiers.deliver(alert, {"dag_run": None})
    asyncio.run(notifiers.deliver_async(alert))
    assert [sent["message"] for _, sent in user_notifiers] == [alert.message] * 2
    assert detail in alert.message


@pytest.mark.parametrize(("context", "kwargs"), [
    ({"dag_run": {"run_id": "a/../x"}}, {"dag_id": "d", "output_root": "/srv/out"}),
    ({"dag_run": {"run_id": "r"}}, {"output_root": "/srv/out"}),                      # no dag_id
    ({"dag_run": {"run_id": "r", "conf": "not a dict"}}, {"dag_id": "d"}),
    ({"dag_run": {"run_id": "r", "conf": ["x"]}}, {"dag_id": "d", "output_root": ""}),
    (None, {}),
])
def test_an_odd_deadline_context_still_alerts(user_notifiers, monkeypatch: pytest.MonkeyPatch,
                                              context: Any, kwargs: dict[str, Any]) -> None:
    monkeypatch.setenv(notifiers.ALERT_NOTIFIER_ENV, "alert_sinks_for_tests.sync_only")
    message = asyncio.run(notifiers.log_deadline_missed(context, deadline_hours=1, **kwargs))
    ((_, alert),) = user_notifiers
    assert message and alert["kind"] == "deadline_missed" and alert["rows_left"] is None


def test_the_deadline_callback_reads_only_an_allowed_conf_output_root(run, user_notifiers,  # noqa: F811
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path) -> None:
    monkeypatch.setenv(notifiers.ALERT_NOTIFIER_ENV, "alert_sinks_for_tests.sync_only")
    monkeypatch.setenv("BATCH_INFERENCE_ALLOWED_ROOTS", str(tmp_path / "allowed"))
    context = {"dag_run": {"run_id": "progress_run", "conf": {"output_root": run.output_root}}}
    asyncio.run(notifiers.log_deadline_missed(context, dag_id="dag_a", deadline_hours=1, output_root="/srv/default"))
    ((_, alert),) = user_notifiers
    assert alert["run_dir"].startswith("/srv/default/") and alert["rows_left"] is None  # the conf root refused


def test_the_gate_notifier_alerts_when_the_run_dir_cannot_be_read(user_notifiers,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(notifiers.ALERT_NOTIFIER_ENV, "alert_sinks_for_tests.sync_only")

    def down(**_: Any) -> None:
        raise ConnectionError("API server down")

    context = {"dag_run": types.SimpleNamespace(run_id="r", dag_id="d"), "ti": types.SimpleNamespace(xcom_pull=down),
               "exception": "completion gate: nothing to wait for: the plan task failed"}
    notifiers.RunAlertNotifier()(context)
    ((_, alert),) = user_notifiers
    assert alert["kind"] == "gate_failed" and "no run dir" in alert["message"]
