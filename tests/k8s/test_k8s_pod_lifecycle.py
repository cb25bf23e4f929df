"""The shard pod task's lifecycle around the Airflow side going away, on the live cluster.

``dag.test`` runs triggers inline and cannot kill a task or restart a triggerer, so these tests drive
``ShardPodOperator`` and its ``KubernetesPodTrigger`` the way the Airflow 3.3 task runner and triggerer
do, against the real API server and node agent (a real worker in each pod):

* killing the task (``on_kill`` of the running task; ``KubernetesPodTrigger.on_kill``, which the 3.3
  triggerer calls when a deferred task is killed or cleared) deletes its pod: no pod left;
* a triggerer restart (the trigger's task cancelled, ``cleanup()`` awaited, the trigger rebuilt from its
  serialized kwargs by the next triggerer) and a task process that restarts (``durable``: a fresh
  operator instance executing the same try) both reattach to the running pod: one pod for the shard.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import time
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import gcs_fixture
import pytest
from airflow.sdk.exceptions import TaskDeferred
from batch_inference.pod_spec import K8sSettings
from k8s_live import PodLedger, live_pods, make_bucket, record, upload_rows, wait_gone
from run_helpers import write_run

from scripts.k8s.cluster import POD_CPU, POD_MEMORY

fake_gcs = gcs_fixture.fake_gcs

pytestmark = [pytest.mark.k8s, pytest.mark.integration]

GONE_TIMEOUT_S = K8sSettings.termination_grace_seconds + 30
"""How long a deleted pod may take to vanish: its termination grace period (``K8sSettings``' default, 60 s,
which the kubelet may use in full on a loaded node) plus the kubelet's sync and the API server's removal."""
SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample" / "debian_descriptions_sample.parquet"


@pytest.fixture(scope="module")
def run_dir(fake_gcs, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A planned run with three 20-row shards on gs:// (one shard per test)."""
    tmp = tmp_path_factory.mktemp("k8s-lifecycle")
    bucket = make_bucket(fake_gcs, "k8s-life")
    upload_rows(SAMPLE, 60, f"{bucket}/in.parquet", tmp)
    return write_run(f"{bucket}/out", tmp / "input-60.parquet", shards=3, run_id="lifecycle",
                     worker={"reuse": "off"}, input_uri=f"{bucket}/in.parquet")


def operator(cluster, run_dir: str, shard: str, gcs_url: str, run_id: str = "lifecycle"):
    from batch_inference.pod_spec import K8sSettings, kpo_expand_kwargs, kpo_partial_kwargs
    from batch_inference.shard_pod import ShardPodOperator

    settings = K8sSettings(image=cluster.worker_image, host_network=cluster.real_node is not None,
                           cpu=POD_CPU, memory=POD_MEMORY, termination_grace_seconds=30,
                           env={"STORAGE_EMULATOR_HOST": gcs_url, "OMP_NUM_THREADS": "1"})
    kw = {**kpo_partial_kwargs(settings), **kpo_expand_kwargs({"run_dir": run_dir, "shard_id": shard, "rows": 20},
                                                              run_id)}
    kw.pop("max_active_tis_per_dagrun")
    return ShardPodOperator(task_id="infer_k8s", kubernetes_conn_id=None, in_cluster=False,
                            config_file=str(cluster.kubeconfig("airflow-worker")), poll_interval=1, **kw)


def context(op, shard: str, run_id: str = "lifecycle") -> dict:
    ti = mock.MagicMock(dag_id="batch_inference_backfill", task_id="infer_k8s", run_id=run_id,
                        map_index=int(shard), try_number=1)
    dag = SimpleNamespace(dag_id=ti.dag_id, parent_dag=None)  # a MagicMock's parent_dag would become a label
    return {"ti": ti, "task_instance": ti, "run_id": run_id, "dag": dag,
            "dag_run": mock.MagicMock(run_id=run_id), "task": op, "params": {}}


def defer(op, ctx) -> TaskDeferred:
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(ctx)
    return deferred.value


def rebuilt(trigger):
    """The trigger as the next triggerer builds it: from its serialized classpath and kwargs."""
    classpath, kwargs = trigger.serialize()
    module, name = classpath.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)(**kwargs)


async def first_event(trigger):
    async for event in trigger.run():
        return event.payload
    return None


def selector(shard: str) -> str:
    return f"batch-inference/run-id=lifecycle,batch-inference/shard-id={shard}"


def test_killing_the_task_deletes_its_pod(k8s_cluster, fake_gcs, run_dir) -> None:
    api = k8s_cluster.api()
    ledger = PodLedger(api).start()
    # a deferred task killed or cleared: the 3.3 triggerer calls the trigger's on_kill
    op = operator(k8s_cluster, run_dir, "00000", fake_gcs.url)
    deferred = defer(op, context(op, "00000"))
    ledger.wait_for(lambda r: r.phase == "Running", 60, shard="00000")
    asyncio.run(deferred.trigger.on_kill())
    left_deferred = wait_gone(api, selector("00000"), GONE_TIMEOUT_S)
    # a running task killed (e.g. marked failed while it creates the pod): the operator's on_kill
    op2 = operator(k8s_cluster, run_dir, "00001", fake_gcs.url)
    defer(op2, context(op2, "00001"))
    ledger.wait_for(lambda r: r.phase == "Running", 60, shard="00001")
    op2.on_kill()
    left_running = wait_gone(api, selector("00001"), GONE_TIMEOUT_S)
    ledger.stop()
    assert left_deferred == [] and left_running == []
    killed = ledger.matching(shard="00000") + ledger.matching(shard="00001")
    assert len(killed) == 2 and all(p.deleted for p in killed)
    record(orphan_pods=len(left_deferred) + len(left_running))


def test_triggerer_restart_and_task_restart_reattach_to_the_same_pod(k8s_cluster, fake_gcs, run_dir) -> None:
    api = k8s_cluster.api()
    ledger = PodLedger(api).start()
    op = operator(k8s_cluster, run_dir, "00002", fake_gcs.url)
    ctx = context(op, "00002")
    deferred = defer(op, ctx)
    pod_name = deferred.trigger.pod_name

    async def run_then_stop(trigger) -> None:
        task = asyncio.create_task(first_event(trigger))
        await asyncio.sleep(3)
        task.cancel()                       # the triggerer shuts down: its trigger tasks are cancelled
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await trigger.cleanup()             # Airflow 3.3: no pod deletion on a restart

    ledger.wait_for(lambda r: r.phase == "Running", 60, shard="00002")
    asyncio.run(run_then_stop(deferred.trigger))
    assert [p.metadata.name for p in live_pods(api, selector("00002"))] == [pod_name]
    # the task process restarts too (durable): a fresh operator executing the same try finds the pod
    op2 = operator(k8s_cluster, run_dir, "00002", fake_gcs.url)
    again = defer(op2, context(op2, "00002"))
    assert again.trigger.pod_name == pod_name
    # the next triggerer runs the stored trigger to the end; the task resumes on its event
    t0 = time.monotonic()
    event = asyncio.run(first_event(rebuilt(again.trigger)))
    assert event["status"] == "success" and event["name"] == pod_name, event
    op3 = operator(k8s_cluster, run_dir, "00002", fake_gcs.url)
    op3.trigger_reentry(context(op3, "00002"), event)
    left = wait_gone(api, selector("00002"), 20)
    ledger.stop()
    pods = ledger.matching(shard="00002")
    assert [p.name for p in pods] == [pod_name] and pods[0].exit_code == 0, pods
    assert left == []
    record(reattach_duplicate_pods=len(pods) - 1, reattach_resume_seconds=round(time.monotonic() - t0, 1))


def test_preempted_mid_shard_resumes_from_its_committed_chunks(k8s_cluster, fake_gcs, tmp_path) -> None:
    """240 rows in 20-row chunks: the pod is preempted once its first chunk is committed (eleven chunks,
    seconds of work, still ahead of it however fast the model loaded); the worker commits what it
    finished and exits 75; the operator relaunches in the same try; the new pod skips the committed rows.
    Every id ends up in the parts exactly once, at most one chunk was done twice."""
    import pyarrow.parquet as pq
    from batch_contract import storage
    from batch_contract.layout import PART_PREFIX, RunLayout
    from batch_contract.runstore import RunStore
    from k8s_live import NAMESPACE

    bucket = make_bucket(fake_gcs, "k8s-resume")
    upload_rows(SAMPLE, 240, f"{bucket}/in.parquet", tmp_path)
    run_dir = write_run(f"{bucket}/out", tmp_path / "input-240.parquet", run_id="resume",
                        worker={"reuse": "off", "chunk_rows": 20}, input_uri=f"{bucket}/in.parquet")
    layout = RunLayout.from_run_dir(run_dir)
    ledger = PodLedger(k8s_cluster.api()).start()
    op = operator(k8s_cluster, run_dir, "00000", fake_gcs.url, run_id="resume")
    ctx = context(op, "00000", run_id="resume")
    first = defer(op, ctx)
    deadline = time.monotonic() + 120
    while not [n for n in storage.list_names(layout.shard_dir("00000")) if n.startswith(PART_PREFIX)]:
        assert time.monotonic() < deadline, "no chunk committed in 120 s"
        time.sleep(0.1)
    k8s_cluster.preempt(NAMESPACE, first.trigger.pod_name)
    event = asyncio.run(first_event(first.trigger))
    with pytest.raises(TaskDeferred) as relaunched:
        op.trigger_reentry(ctx, event)                  # exit 75 -> a fresh pod, same try
    second = relaunched.value.trigger
    assert second.pod_name != first.trigger.pod_name
    done = asyncio.run(first_event(second))
    assert done["status"] == "success", done
    op.trigger_reentry(ctx, done)
    ledger.stop()
    pods = ledger.matching(run="resume")
    assert [(p.exit_code, p.labels["try_number"]) for p in pods] == [(75, "1"), (0, "1")], pods
    attempts = RunStore(layout).attempts("00000")
    assert [a.exit_code for a in attempts] == [75, 0], attempts
    interrupted, resumed = attempts
    assert interrupted.rows_committed >= 20                       # at least the first chunk survived
    assert resumed.rows_skipped_resume == interrupted.rows_committed  # resume skipped exactly those
    assert interrupted.rows_processed - interrupted.rows_committed <= 20   # at most one chunk re-done
    ids = []
    for name in storage.list_names(layout.shard_dir("00000")):
        if name.startswith(PART_PREFIX):
            fs, path = storage.arrow_filesystem(f"{layout.shard_dir('00000')}/{name}")
            ids += pq.read_table(path, filesystem=fs, columns=["id"]).column("id").to_pylist()
    assert len(ids) == len(set(ids)) == 240                       # nothing lost, nothing duplicated
    record(mid_shard_rows_committed_before_preemption=interrupted.rows_committed,
           mid_shard_rows_redone=interrupted.rows_processed - interrupted.rows_committed)
