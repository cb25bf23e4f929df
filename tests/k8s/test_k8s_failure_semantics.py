"""What each worker failure does to the Airflow task, on the live cluster through the real DAG.

One ``airflow dags test batch_inference_backfill`` per case (one small shard, ``runner=kubernetes``,
gs:// in and out), with the pods watched from the API server:

* exit 2 (bad config: a model directory the image does not have) -> one pod, the task failed in try 1;
* exit 1 (a crash: the input object vanished after planning; put back once the pod failed) -> the
  normal retry, a second pod, the shard completes in try 2;
* a pod no node can take (a node selector for another GPU type) -> each try fails when the startup
  timeout runs out, naming the scheduler's reason, and its pod is deleted;
* a memory limit below what the worker needs (kubelet node only: the agent does not enforce limits) ->
  the kernel kills the worker at its cgroup's limit, the kubelet reports ``OOMKilled``, and the task
  fails at once naming the limit.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import gcs_fixture
import pytest
from batch_contract import storage
from batch_inference.cli import dags_test
from batch_inference.pod_spec import label_value
from batch_inference.terminal import DagTestOutput
from k8s_live import (
    PodLedger,
    airflow_k8s_env,
    live_pods,
    make_bucket,
    migrated_airflow_home,
    record,
    task_instances,
    upload_rows,
)

fake_gcs = gcs_fixture.fake_gcs

pytestmark = [pytest.mark.k8s, pytest.mark.integration]

ROWS = 6
STARTUP_TIMEOUT_S = 5


@pytest.fixture(scope="module")
def setup(k8s_cluster, fake_gcs, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("k8s-failures")
    home, env = migrated_airflow_home(tmp)
    return {"tmp": tmp, "home": home, "env": env, "bucket": make_bucket(fake_gcs, "k8s-fail")}


def _run(setup, k8s_cluster, fake_gcs, name: str, conf: dict, during=None, **k8s_env: str):
    """One backfill run named ``name``; ``during(ledger, output_root)`` runs in a thread meanwhile.
    Returns ``(exit code, run id, log text, ledger, run label)``."""
    tmp, bucket = setup["tmp"], setup["bucket"]
    input_uri = upload_rows(Path(__file__).resolve().parents[2] / "data" / "sample" /
                            "debian_descriptions_sample.parquet", ROWS, f"{bucket}/{name}/in.parquet", tmp)
    output_root = f"{bucket}/{name}/out"
    env = airflow_k8s_env(setup["env"], k8s_cluster, fake_gcs.url, **k8s_env)
    full = {"input_uri": input_uri, "output_root": output_root, "runner": "kubernetes", "reuse": "off",
            "rows_per_shard": 1000, "duckdb_path": str(tmp / f"{name}.duckdb"), "output_table": f"{name}_emb",
            # the gate waits for straggler pods until the deadline with runner=kubernetes: keep it short
            # (the Param's minimum, 36 s after the run started) so a failed shard fails the run soon
            "deadline_hours": 0.01,
            # the shard pods' semantics; the canary pod's are in test_k8s_canary_live.py
            "canary": False, **conf}
    ledger = PodLedger(k8s_cluster.api()).start()
    helper = threading.Thread(target=during, args=(ledger, input_uri), daemon=True) if during else None
    if helper:
        helper.start()
    out = DagTestOutput()
    code, _ = dags_test("batch_inference_backfill", full, env, tmp / f"{name}.log", output=out)
    if helper:
        helper.join(timeout=30)
    time.sleep(0.5)
    ledger.stop()
    run_label = label_value(out.run_id)
    return code, out.run_id, (tmp / f"{name}.log").read_text(errors="replace"), ledger, run_label


def _cleanup(k8s_cluster, run_label: str) -> None:
    """Delete the failed pods the task keeps for ``kubectl logs`` (so later tests count from zero)."""
    api = k8s_cluster.api()
    for pod in live_pods(api, f"batch-inference/run-id={run_label}"):
        api.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0)


def test_exit_2_fails_the_task_at_once_with_one_pod(setup, k8s_cluster, fake_gcs) -> None:
    code, run_id, log, ledger, run_label = _run(setup, k8s_cluster, fake_gcs, "exit2",
                                               {"model": "/models/not-in-this-image"})
    pods = ledger.matching(run=run_label)
    tis = task_instances(setup["home"], run_id)
    record(exit2_pods=len(pods), exit2_tries=tis.get(0, (None,))[0])
    assert [p.exit_code for p in pods] == [2], [(p.name, p.exit_code) for p in pods]
    assert tis == {0: (1, "failed")}, tis                       # try 1, failed, no retry left pending
    assert "exited 2 (bad config or input" in log and "engine.model_path" in log
    assert code != 0
    _cleanup(k8s_cluster, run_label)


def test_exit_1_uses_the_normal_retries(setup, k8s_cluster, fake_gcs) -> None:
    original: dict[str, bytes] = {}

    def crash_then_heal(ledger: PodLedger, input_uri: str) -> None:
        deadline = time.monotonic() + 240
        runs = f"{input_uri.rsplit('/', 1)[0]}/out/runs/batch_inference_backfill"
        while time.monotonic() < deadline and not storage.list_glob(runs, "*/manifest.json"):
            time.sleep(0.2)
        original["bytes"] = storage.read_bytes(input_uri)
        storage.delete(input_uri)                                # planned, then the input vanishes
        ledger.wait_for(lambda r: r.exit_code is not None, 240, dag_id="batch_inference_backfill")
        storage.write_replace(input_uri, original["bytes"])       # back before the retry reads it

    code, run_id, log, ledger, run_label = _run(setup, k8s_cluster, fake_gcs, "exit1", {}, crash_then_heal)
    pods = ledger.matching(run=run_label)
    assert [p.exit_code for p in pods] == [1, 0], [(p.name, p.exit_code) for p in pods]
    assert [p.labels["try_number"] for p in pods] == ["1", "2"]
    tis = task_instances(setup["home"], run_id)
    assert tis == {0: (2, "success")}, tis
    assert code == 0, log[-4000:]
    record(exit1_pods=len(pods), exit1_tries=tis[0][0])
    _cleanup(k8s_cluster, run_label)


def test_unschedulable_pod_fails_within_the_startup_timeout(setup, k8s_cluster, fake_gcs) -> None:
    selector = json.dumps({"cloud.google.com/gke-spot": "true",
                           "cloud.google.com/gke-accelerator": "nvidia-h100-80gb"})
    code, run_id, log, ledger, run_label = _run(
        setup, k8s_cluster, fake_gcs, "unsched", {}, node_selector=selector,
        startup_timeout_seconds=str(STARTUP_TIMEOUT_S), retries="2")
    pods = ledger.matching(run=run_label)
    assert len(pods) == 3 and all(p.deleted for p in pods), pods   # one per try, each deleted at its timeout
    first = pods[0]
    assert first.scheduled_reason and first.scheduled_reason.startswith("Unschedulable:"), first
    failed_in = first.last_seen - first.first_seen
    assert failed_in < STARTUP_TIMEOUT_S + 10, failed_in
    assert f"was not scheduled within the startup timeout ({STARTUP_TIMEOUT_S} s): Unschedulable:" in log
    assert first.scheduled_reason.split(": ", 1)[1] in log         # the scheduler's own message
    assert task_instances(setup["home"], run_id) == {0: (3, "failed")}
    assert live_pods(k8s_cluster.api(), f"batch-inference/run-id={run_label}") == []
    assert code != 0
    record(unschedulable_failed_in_s=round(failed_in, 1), unschedulable_pods_left=0)


OOM_LIMIT = "150Mi"
"""Below what the worker needs to import torch and load MiniLM (300Mi was enough for a 6-row shard on one thread)."""


def test_a_memory_limit_below_the_workers_need_is_oom_killed_and_fails_at_once(setup, k8s_cluster,
                                                                               fake_gcs) -> None:
    if k8s_cluster.real_node is None:
        pytest.skip("the agent node runs pods as host processes without memory limits; the kubelet node enforces them")
    code, run_id, log, ledger, run_label = _run(setup, k8s_cluster, fake_gcs, "oom", {}, memory=OOM_LIMIT)
    pods = ledger.matching(run=run_label)
    tis = task_instances(setup["home"], run_id)
    classified = f"was OOMKilled: the worker needed more than its memory limit {OOM_LIMIT}" in log
    record(oom_killed=sum(p.exit_reason == "OOMKilled" for p in pods), oom_classified=classified,
           oom_tries=tis.get(0, (None,))[0])
    assert [(p.exit_code, p.exit_reason) for p in pods] == [(137, "OOMKilled")], [
        (p.name, p.exit_code, p.exit_reason) for p in pods]
    assert tis == {0: (1, "failed")}, tis
    assert classified, log[-3000:]
    assert code != 0
    _cleanup(k8s_cluster, run_label)
