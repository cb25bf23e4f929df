"""ShardPodOperator's re-entry decisions with the API calls recorded (the live suite, tests/k8s, runs
the same paths against a real API server): relaunch within the try, fail now, retry, stuck pods."""

from __future__ import annotations

from types import SimpleNamespace
from unittest import mock

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred
from batch_inference.pod_outcome import PREEMPTIONS_ANNOTATION, PREEMPTIONS_EVENT_KEY
from batch_inference.pod_spec import K8sSettings, kpo_expand_kwargs, kpo_partial_kwargs
from batch_inference.shard_pod import ShardPodOperator
from kubernetes.client import models as k8s
from kubernetes.client.exceptions import ApiException
from test_pod_outcome import UNSCHEDULED, pod

IMAGE = "europe-docker.pkg.dev/acme/ml/batch-worker@sha256:" + "ab" * 32
RUN_ID = "manual__2026-12-01T05:00:00+00:00"
REF = {"run_dir": "gs://b/out/runs/r", "shard_id": "00002", "rows": 10}


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
