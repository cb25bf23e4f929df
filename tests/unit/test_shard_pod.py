"""ShardPodOperator's re-entry decisions with the API calls recorded (the live suite, tests/k8s, runs
the same paths against a real API server): relaunch within the try, fail now, retry, stuck pods."""

from __future__ import annotations

from types import SimpleNamespace
from unittest import mock

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred
from batch_contract import storage
from batch_contract.layout import RunLayout
from batch_contract.marker import ShardMarker
from batch_inference.pod_outcome import PREEMPTIONS_ANNOTATION, PREEMPTIONS_EVENT_KEY
from batch_inference.pod_spec import K8sSettings, kpo_expand_kwargs, kpo_partial_kwargs
from batch_inference.shard_pod import ShardPodOperator
from kubernetes.client import models as k8s
from kubernetes.client.exceptions import ApiException
from test_pod_outcome import UNSCHEDULED, pod

IMAGE = "europe-docker.pkg.dev/acme/ml/batch-worker@sha256:" + "ab" * 32
RUN_ID = "manual__2026-12-01T05:00:00+00:00"
REF = {"run_dir": "", "shard_id": "00002", "rows": 10}
"""The shard every test's operator runs; ``run_dir`` is set per test (:func:`local_run`)."""


@pytest.fixture(autouse=True)
def local_run(tmp_path, monkeypatch) -> RunLayout:
    """Each test's run lives under its own ``tmp_path`` (the operator reads the shard's marker there)."""
    layout = RunLayout(str(tmp_path / "out"), "r")
    monkeypatch.setitem(REF, "run_dir", layout.run_dir)
    return layout


def complete(layout: RunLayout, shard_id: str = "00002") -> None:
    """Write the shard's complete marker, as its worker does last."""
    storage.write_replace(layout.marker_uri(shard_id), ShardMarker(
        run_id=layout.run_id, shard_id=shard_id, fingerprint="f" * 32, rows_input=10, rows_ok=10,
        rows_dead_letter=0).to_json_bytes())


class Api:
    """Records pod creates/deletes; ``pods`` is what the API server holds (name -> V1Pod)."""

    def __init__(self) -> None:
        self.pods: dict[str, k8s.V1Pod] = {}
        self.created: list[k8s.V1Pod] = []
        self.deleted: list[str] = []

    def get_pod(self, name: str, namespace: str) -> k8s.V1Pod:
        if name not in self.pods:
            raise ApiException(status=404, reason="Not Found")
        return self.pods[name]

    def create_pod(self, pod: k8s.V1Pod) -> k8s.V1Pod:
        self.created.append(pod)
        return pod

    def delete_pod(self, pod: k8s.V1Pod) -> None:
        self.deleted.append(pod.metadata.name)
        self.pods.pop(pod.metadata.name, None)


def operator(api: Api, **overrides) -> ShardPodOperator:
    settings = K8sSettings(image=IMAGE, **overrides)
    kw = {**kpo_partial_kwargs(settings), **kpo_expand_kwargs(REF, RUN_ID), "get_logs": False}
    op = ShardPodOperator(task_id="infer_k8s", **kw)
    hook = mock.MagicMock(get_pod=api.get_pod)
    manager = mock.MagicMock(create_pod=api.create_pod, delete_pod=api.delete_pod,
                             await_pod_completion=lambda p, *a: p)
    op.__dict__.update(hook=hook, pod_manager=manager, client=mock.MagicMock())
    return op


def context(try_number: int = 1) -> dict:
    ti = mock.MagicMock(dag_id="d", task_id="infer_k8s", run_id=RUN_ID, map_index=2, try_number=try_number)
    return {"ti": ti, "task_instance": ti, "run_id": RUN_ID, "dag": SimpleNamespace(dag_id="d", parent_dag=None),
            "dag_run": mock.MagicMock(run_id=RUN_ID), "params": {}}


def finished(api: Api, name: str, **kw) -> dict:
    p = pod(**kw)
    p.metadata.name, p.metadata.namespace = name, "batch-inference"
    api.pods[name] = p
    return {"status": "success" if kw.get("code") == 0 else "failed", "name": name,
            "namespace": "batch-inference", "message": "x"}


def test_exit_75_relaunches_in_the_same_try_and_counts() -> None:
    api = Api()
    op, ctx = operator(api), context()
    event = finished(api, "batch-worker-old", code=75)
    with pytest.raises(TaskDeferred) as deferred:
        op.trigger_reentry(ctx, event)
    assert api.deleted == ["batch-worker-old"] and len(api.created) == 1
    new = api.created[0]
    assert new.metadata.annotations[PREEMPTIONS_ANNOTATION] == "1"
    assert new.metadata.labels["batch-inference/shard-id"] == "00002"
    assert new.metadata.labels["try_number"] == "1" and new.metadata.name != "batch-worker-old"
    trigger = deferred.value.trigger
    assert trigger.pod_name == new.metadata.name and trigger.trigger_kwargs[PREEMPTIONS_EVENT_KEY] == 1
    assert deferred.value.method_name == "trigger_reentry"


def test_vanished_pod_relaunches_with_the_count_from_the_event() -> None:
    api = Api()
    op = operator(api)
    event = {"status": "error", "name": "gone", "namespace": "batch-inference", "message": "404",
             PREEMPTIONS_EVENT_KEY: 4}
    with pytest.raises(TaskDeferred) as deferred:
        op.trigger_reentry(context(), event)
    assert api.deleted == [] and api.created[0].metadata.annotations[PREEMPTIONS_ANNOTATION] == "5"
    assert deferred.value.trigger.trigger_kwargs[PREEMPTIONS_EVENT_KEY] == 5


def test_past_max_preemptions_the_try_fails_normally() -> None:
    api = Api()
    op = operator(api, max_preemptions=2)
    event = {**finished(api, "p", code=75), PREEMPTIONS_EVENT_KEY: 2}
    with pytest.raises(AirflowException) as exc:
        op.trigger_reentry(context(), event)
    assert not isinstance(exc.value, AirflowFailException)
    assert "preempted 3 times" in str(exc.value) and api.created == [] and api.deleted == ["p"]


@pytest.mark.parametrize("event_of", [
    lambda api: finished(api, "batch-worker-old", code=75),
    lambda api: finished(api, "batch-worker-old", code=137, term_reason="ContainerStatusUnknown"),
    lambda api: {"status": "error", "name": "gone", "namespace": "batch-inference", "message": "404"},
])
def test_a_preempted_pod_of_a_complete_shard_is_not_relaunched(local_run: RunLayout, event_of) -> None:
    """Whatever made the pod read as preempted (exit 75, a lost exit status, a vanished pod), a shard whose
    marker is complete needs no new pod: the task succeeds and the old pod is deleted."""
    api = Api()
    op = operator(api)
    complete(local_run)
    event = event_of(api)
    held = event["name"] in api.pods
    assert op.trigger_reentry(context(), event) is None
    assert api.created == [] and api.deleted == ([event["name"]] if held else [])


def test_a_lost_exit_status_relaunches_in_the_same_try() -> None:
    api = Api()
    op = operator(api)
    with pytest.raises(TaskDeferred):
        op.trigger_reentry(context(), finished(api, "lost", code=137, term_reason="ContainerStatusUnknown"))
    assert api.deleted == ["lost"] and api.created[0].metadata.labels["try_number"] == "1"


@pytest.mark.parametrize("leftover", [None, "Succeeded", "Running"])
def test_a_try_of_a_complete_shard_creates_no_pod_and_removes_a_leftover(local_run: RunLayout,
                                                                          leftover: str | None) -> None:
    """A try that runs again after its shard completed (reset by a restarted scheduler, cleared) returns
    before the budget check and the provider's create-or-reattach; the pod an earlier run of the task
    left (found as the provider's reattach finds it), finished or idle, is deleted."""
    api = Api()
    op = operator(api)
    complete(local_run)
    found = None
    if leftover:
        finished(api, "batch-worker-left", phase=leftover, code=0 if leftover == "Succeeded" else None)
        found = api.pods["batch-worker-left"]
    with mock.patch("airflow.providers.cncf.kubernetes.operators.pod.KubernetesPodOperator.execute") as provider, \
            mock.patch.object(ShardPodOperator, "over_budget") as budget, \
            mock.patch.object(ShardPodOperator, "find_pod", return_value=found) as lookup:
        assert op.execute(context(2)) is None
    provider.assert_not_called()
    budget.assert_not_called()
    lookup.assert_called_once()
    assert api.created == [] and api.deleted == (["batch-worker-left"] if leftover else [])


def test_an_unreadable_marker_relaunches_a_preempted_pod(monkeypatch) -> None:
    """A storage error reading the marker costs a pod (whose worker reads the marker itself), not a retry."""
    from batch_contract.storage import StorageError

    def broken(self) -> bool:
        raise StorageError("503 from the bucket")

    monkeypatch.setattr(ShardPodOperator, "shard_complete", broken)
    api = Api()
    op = operator(api)
    with pytest.raises(TaskDeferred):
        op.trigger_reentry(context(), finished(api, "old", code=75))
    assert api.deleted == ["old"] and len(api.created) == 1


def test_a_try_of_an_unfinished_shard_goes_on_to_the_provider(local_run: RunLayout) -> None:
    api = Api()
    op = operator(api)
    complete(local_run, "00003")   # another shard's marker does not count
    with mock.patch("airflow.providers.cncf.kubernetes.operators.pod.KubernetesPodOperator.execute",
                    return_value="deferred") as provider, \
            mock.patch.object(ShardPodOperator, "over_budget", return_value=None):
        assert op.execute(context()) == "deferred"
    provider.assert_called_once()


def test_exit_2_fails_without_retries() -> None:
    api = Api()
    op = operator(api)
    with pytest.raises(AirflowFailException, match="exited 2"):
        op.trigger_reentry(context(), finished(api, "p", code=2))
    assert api.created == []


def test_exit_1_fails_the_try_for_a_normal_retry() -> None:
    api = Api()
    op = operator(api)
    with pytest.raises(AirflowException) as exc:
        op.trigger_reentry(context(), finished(api, "p", code=1))
    assert not isinstance(exc.value, AirflowFailException) and api.created == []


def test_success_returns() -> None:
    api = Api()
    op = operator(api)
    assert op.trigger_reentry(context(), finished(api, "p", phase="Succeeded", code=0)) is None
    assert api.created == [] and api.deleted == ["p"]   # delete_succeeded_pod


def test_unschedulable_pod_is_deleted_and_the_reason_named() -> None:
    api = Api()
    op = operator(api, startup_timeout_seconds=7)
    finished(api, "stuck", phase="Pending", node=None, conditions=UNSCHEDULED)
    event = {"status": "timeout", "name": "stuck", "namespace": "batch-inference", "message": "too long"}
    with pytest.raises(AirflowException, match="didn't match node selector") as exc:
        op.trigger_reentry(context(), event)
    assert "7 s" in str(exc.value) and api.deleted == ["stuck"]


def test_reattached_pod_brings_back_its_count_and_defers_with_it() -> None:
    api = Api()
    op = operator(api)
    running = pod(phase="Running", annotations={PREEMPTIONS_ANNOTATION: "3"})
    with mock.patch("airflow.providers.cncf.kubernetes.operators.pod.KubernetesPodOperator.get_or_create_pod",
                    return_value=running):
        assert op.get_or_create_pod(mock.MagicMock(), context()) is running
    assert op.preemptions == 3


def test_max_preemptions_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="max_preemptions"):
        ShardPodOperator(task_id="x", image=IMAGE, max_preemptions=-1)


def test_settings_from_env_carry_max_preemptions_and_pod_env() -> None:
    from batch_contract.engine_config import ConfigError

    settings = K8sSettings.from_env({"BATCH_K8S_IMAGE": IMAGE, "BATCH_K8S_MAX_PREEMPTIONS": "3",
                                     "BATCH_K8S_ENV": '{"STORAGE_EMULATOR_HOST": "http://127.0.0.1:9"}'})
    kw = kpo_partial_kwargs(settings)
    assert kw["max_preemptions"] == 3 and ShardPodOperator(task_id="t", **kw).max_preemptions == 3
    env = {var.name: var for var in kw["env_vars"]}  # V1EnvVars: plain values and the downward API's POD_NAME
    assert env["STORAGE_EMULATOR_HOST"].value == "http://127.0.0.1:9"
    assert env["HF_HUB_OFFLINE"].value == "1"
    assert env["POD_NAME"].value is None and env["POD_NAME"].value_from.field_ref.field_path == "metadata.name"
    with pytest.raises(ConfigError, match="max_preemptions"):
        K8sSettings(image=IMAGE, max_preemptions=-1)
