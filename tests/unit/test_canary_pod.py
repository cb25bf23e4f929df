"""The canary pod task and the kubernetes runner's in-run budget stop, with the API calls recorded (the
live suite, tests/k8s/test_k8s_canary_live.py, runs the same paths against a real API server):

* ``CanaryPodOperator`` with ``runner=kubernetes`` creates one pod running ``batch-worker canary`` with the
  shard pods' spec, and on the pod's success projects from ``canary.json`` (1..max_gpus pods, the pod's
  wall time) and decides like the local path; a refused projection fails the task without a retry;
* ``ShardPodOperator`` fails a shard with ``BUDGET EXCEEDED`` (no retry) and creates no pod once the run's
  spend has passed ``budget_usd`` by the tolerance; within it, the pod is created as before.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
from airflow.sdk.exceptions import AirflowFailException, TaskDeferred
from batch_contract import storage
from batch_contract.canary import CanaryResult
from batch_contract.layout import RunLayout
from batch_inference.budget import BUDGET_TOLERANCE
from batch_inference.canary_pod import CanaryPodOperator
from batch_inference.pod_outcome import run_window
from batch_inference.pod_spec import (
    K8sSettings,
    canary_pod_kwargs,
    kpo_expand_kwargs,
    kpo_partial_kwargs,
    shard_of,
    worker_arguments,
)
from batch_inference.shard_pod import ShardPodOperator
from kubernetes.client import models as k8s
from synthetic_runs import RunSpec, build_run, write_input
from test_shard_pod import IMAGE, RUN_ID, Api

COST = {"accelerator": "nvidia-l4", "gpu_hour_usd_spot": 3.6}  # $0.001 per worker-second
START = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5)
"""The DAG run's start: minutes ago, so the deadline counts from now (a fixed date expires a day later)."""


def _run(tmp_path: Path, params: dict, *, markers: bool, seconds_per_shard: float = 50.0) -> str:
    """A synthetic 2-shard run whose manifest records ``params`` (what the plan task resolved)."""
    src = write_input(tmp_path / "in.parquet", [f"r{i}" for i in range(200)])
    spec = RunSpec(shards=2, skip_markers=() if markers else ("00000", "00001"))
    layout = build_run(tmp_path / "out", "r1", src, spec)
    manifest = json.loads(storage.read_bytes(layout.manifest_uri))
    manifest["params"] = {**COST, **params}
    for shard in manifest["shards"]:
        shard["est_tokens"] = 10_000                      # what the planner estimates (text bytes / 4)
    storage.write_replace(layout.manifest_uri, json.dumps(manifest).encode())
    if markers:
        for shard in ("00000", "00001"):
            path = Path(layout.marker_uri(shard))
            marker = json.loads(path.read_text())
            marker["stage_seconds"] = {"model_load": 1.0, "inference": seconds_per_shard - 1.0}
            path.write_text(json.dumps(marker))
    return layout.run_dir


def _wire(op, api: Api):
    hook = mock.MagicMock(get_pod=api.get_pod)
    manager = mock.MagicMock(create_pod=api.create_pod, delete_pod=api.delete_pod,
                             await_pod_completion=lambda p, *a: p)
    client = mock.MagicMock()
    client.list_namespaced_pod.return_value = k8s.V1PodList(items=[])   # nothing to reattach to
    op.__dict__.update(hook=hook, pod_manager=manager, client=client)
    return op


def _context(run_dir: str, task_id: str) -> dict:
    pushed: dict = {}
    ti = mock.MagicMock(dag_id="d", task_id=task_id, run_id=RUN_ID, map_index=-1, try_number=1)
    ti.xcom_pull.side_effect = lambda task_ids, key: run_dir if (task_ids, key) == ("plan", "run_dir") else None
    ti.xcom_push.side_effect = lambda key, value: pushed.__setitem__(key, value)
    return {"ti": ti, "task_instance": ti, "run_id": RUN_ID, "dag": SimpleNamespace(dag_id="d", parent_dag=None),
            "dag_run": mock.MagicMock(run_id=RUN_ID, start_date=START), "params": {}, "pushed": pushed}


def _canary_json(run_dir: str) -> CanaryResult:
    result = CanaryResult(
        run_id="r1", fingerprint="f", engine_kind="encoder", model_digest="d" * 64, device="cpu", device_name="cpu",
        threads=1, sample_rows=20, sample_text_bytes=8_000, sample_tokens_real=2_000, sample_tokens_padded=2_100,
        model_load_seconds=2.0, steady_rows_per_s=100.0, steady_tokens_per_s=10_000.0, worker_seconds_per_token=1e-3,
        padding_efficiency=0.95, strategy="fixed", chosen={"token_budget": 4096, "max_batch_rows": 256},
        shard_rows={"00000": 10, "00001": 10}, shard_tokens={"00000": 1_000, "00001": 1_000},
        stage_seconds={"model_load": 2.0, "inference": 1.0}, elapsed_seconds=4.0)
    storage.write_create_only(RunLayout.from_run_dir(run_dir).canary_uri, result.to_json_bytes())
    return result


def _succeeded(api: Api, created: datetime, finished: datetime, name: str = "batch-worker-canary-x") -> dict:
    state = k8s.V1ContainerState(terminated=k8s.V1ContainerStateTerminated(exit_code=0, finished_at=finished))
    api.pods[name] = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name=name, namespace="batch-inference", creation_timestamp=created),
        spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="base")], node_name="n1"),
        status=k8s.V1PodStatus(phase="Succeeded", container_statuses=[k8s.V1ContainerStatus(
            name="base", image="i", image_id="", ready=False, restart_count=0, state=state)]))
    return {"status": "success", "name": name, "namespace": "batch-inference", "message": "ok"}


def _canary_op(api: Api, **settings) -> CanaryPodOperator:
    kw = {**canary_pod_kwargs(K8sSettings(image=IMAGE, **settings)), "get_logs": False}
    return _wire(CanaryPodOperator(task_id="canary", **kw), api)


def test_kubernetes_runner_runs_the_canary_as_a_pod_with_the_shard_pod_spec(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, {"runner": "kubernetes", "canary_min_rows": 40}, markers=False)
    api = Api()
    op, ctx = _canary_op(api), _context(run_dir, "canary")
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(ctx)
    assert deferred.value.method_name == "trigger_reentry" and len(api.created) == 1
    pod = api.created[0]
    container = pod.spec.containers[0]
    assert container.args[:3] == ["canary", "--run-dir", run_dir]
    assert container.args[container.args.index("--min-rows") + 1] == "40"
    assert pod.metadata.labels["batch-inference/role"] == "canary"
    assert pod.metadata.name.startswith("batch-worker-canary")
    shard_pod = _wire(ShardPodOperator(task_id="infer_k8s", **{
        **kpo_partial_kwargs(K8sSettings(image=IMAGE)), **kpo_expand_kwargs(
            {"run_dir": run_dir, "shard_id": "00000", "rows": 100}, RUN_ID)}), Api()).build_pod_request_obj(ctx)
    same = shard_pod.spec.containers[0]
    assert (container.image, container.resources, container.env) == (same.image, same.resources, same.env)
    assert (pod.spec.node_selector, pod.spec.tolerations, pod.spec.affinity, pod.spec.security_context) == (
        shard_pod.spec.node_selector, shard_pod.spec.tolerations, shard_pod.spec.affinity,
        shard_pod.spec.security_context)
    assert ctx["pushed"] == {"pod_name": pod.metadata.name, "pod_namespace": "batch-inference"}


def test_a_succeeded_canary_pod_is_projected_over_1_to_max_gpus_with_the_pods_wall(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, {"runner": "kubernetes", "max_gpus": 3, "budget_usd": 100.0}, markers=False)
    _canary_json(run_dir)
    api = Api()
    created = START + timedelta(seconds=30)
    event = _succeeded(api, created, created + timedelta(seconds=17))
    op, ctx = _canary_op(api), _context(run_dir, "canary")
    summary = op.trigger_reentry(ctx, event)
    projection = json.loads(storage.read_bytes(RunLayout.from_run_dir(run_dir).projection_uri))
    assert projection["runner"] == "kubernetes" and [o["parallelism"] for o in projection["options"]] == [1, 2, 3]
    assert projection["canary"]["wall_seconds"] == 17.0 and projection["startup_seconds"] == 13.0  # 17 - 4 s
    assert projection["elapsed_seconds"] == 30.0        # the pod was created 30 s after the run started
    assert summary["decision"] == "go" and ctx["pushed"]["return_value"] == summary
    assert api.deleted == [event["name"]]               # delete_succeeded_pod
    # a retry after the projection: no pod, the same decision
    again = _context(run_dir, "canary")
    assert _canary_op(Api()).execute(again)["decision"] == "go"


def test_a_canary_pod_projection_over_budget_refuses_without_retry(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, {"runner": "kubernetes", "budget_usd": 1e-6}, markers=False)
    _canary_json(run_dir)
    api = Api()
    event = _succeeded(api, START, START + timedelta(seconds=10))
    with pytest.raises(AirflowFailException, match=r"^REFUSED \(budget\)"):
        _canary_op(api).trigger_reentry(_context(run_dir, "canary"), event)
    projection = json.loads(storage.read_bytes(RunLayout.from_run_dir(run_dir).projection_uri))
    assert projection["decision"] == "refused_budget"


def test_local_runner_and_skips_create_no_pod(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, {"runner": "kubernetes", "canary": False}, markers=False)
    api = Api()
    ctx = _context(run_dir, "canary")
    assert _canary_op(api).execute(ctx) == {"decision": "skipped", "message": "the canary Param is off"}
    assert api.created == [] and ctx["pushed"]["return_value"]["decision"] == "skipped"


def test_canary_pod_exit_2_fails_without_retries(tmp_path: Path) -> None:
    from test_pod_outcome import pod

    run_dir = _run(tmp_path, {"runner": "kubernetes"}, markers=False)
    api = Api()
    failed = pod(code=2)
    failed.metadata.namespace = "batch-inference"
    api.pods[failed.metadata.name] = failed
    event = {"status": "failed", "name": failed.metadata.name, "namespace": "batch-inference", "message": "x"}
    with pytest.raises(AirflowFailException, match="canary pod .* exited 2"):
        _canary_op(api).trigger_reentry(_context(run_dir, "canary"), event)
    assert not storage.exists(RunLayout.from_run_dir(run_dir).projection_uri)


def test_run_window_is_creation_to_container_exit() -> None:
    from test_pod_outcome import pod

    p = pod(code=0)
    assert run_window(p, "base") is None and run_window(None, "base") is None   # no timestamps
    p.metadata.creation_timestamp = START
    p.status.container_statuses[0].state.terminated.finished_at = START + timedelta(seconds=5)
    assert run_window(p, "base") == (START, START + timedelta(seconds=5))


def _shard_op(api: Api, run_dir: str, shard_id: str) -> ShardPodOperator:
    kw = {**kpo_partial_kwargs(K8sSettings(image=IMAGE)), "get_logs": False,
          **kpo_expand_kwargs({"run_dir": run_dir, "shard_id": shard_id, "rows": 100}, RUN_ID)}
    return _wire(ShardPodOperator(task_id="infer_k8s", **kw), api)


def test_no_shard_pod_is_created_once_spend_passes_the_budget(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, {"runner": "kubernetes", "budget_usd": 0.10 / (1 + BUDGET_TOLERANCE) * 0.99},
                   markers=True)                       # 2 complete shards, 100 worker-seconds: $0.10 spent
    api = Api()
    with pytest.raises(AirflowFailException, match=r"^BUDGET EXCEEDED: .* shard 00002 is not started"):
        _shard_op(api, run_dir, "00002").execute(_context(run_dir, "infer_k8s"))
    assert api.created == []


def test_within_the_budget_the_shard_pod_is_created(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, {"runner": "kubernetes", "budget_usd": 0.10}, markers=True)   # within 10%
    api = Api()
    with pytest.raises(TaskDeferred):
        _shard_op(api, run_dir, "00002").execute(_context(run_dir, "infer_k8s"))
    assert [p.spec.containers[0].args for p in api.created] == [worker_arguments(run_dir, "00002")]


def test_shard_of_reads_only_shard_commands() -> None:
    assert shard_of(worker_arguments("gs://b/runs/r", "00003")) == ("gs://b/runs/r", "00003")
    assert shard_of(["canary", "--run-dir", "gs://b/runs/r"]) is None and shard_of(None) is None


@pytest.mark.integration
def test_local_runner_runs_the_canary_subprocess_and_creates_no_pod(tmp_path: Path) -> None:
    """``runner=local`` in a DAG built with both runners: the real ``batch-worker canary`` (MiniLM) runs as
    the task's subprocess, the projection is the local runner's, and the kube API is never called."""
    from batch_inference.params import RunConfig
    from batch_inference.planner import PlanRequest, plan

    sample = Path(__file__).resolve().parents[2] / "data" / "sample" / "debian_descriptions_sample.parquet"
    cfg = RunConfig(input_uri=str(sample), id_column="id", text_column="text", output_root=str(tmp_path / "out"),
                    runner="local", row_limit=8, rows_per_shard=4, shard_by="rows", reuse="off", token_budget=256,
                    canary_min_rows=4, parallelism=1, budget_usd=1000.0)
    plan(PlanRequest(input_uri=cfg.input_uri, id_column=cfg.id_column, text_column=cfg.text_column,
                     output_root=cfg.output_root, run_id="r-local", engine=cfg.engine_dict(),
                     worker={"token_budget": cfg.token_budget, "reuse": cfg.reuse},
                     rows_per_shard=cfg.rows_per_shard, shard_by=cfg.shard_by, row_limit=cfg.row_limit,
                     params=cfg.to_dict()))
    run_dir = RunLayout(cfg.output_root, "r-local").run_dir
    op = _canary_op(Api())
    op.__dict__.update(hook=None, pod_manager=None, client=None)     # any kube call would raise
    ctx = _context(run_dir, "canary")
    summary = op.execute(ctx)
    assert summary["decision"] == "go" and ctx["pushed"] == {"return_value": summary}
    projection = json.loads(storage.read_bytes(RunLayout.from_run_dir(run_dir).projection_uri))
    assert projection["runner"] == "local" and [o["parallelism"] for o in projection["options"]] == [1]
    assert projection["canary"]["rows"] == 4
