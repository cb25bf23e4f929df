"""The real worker inside a pod of the live cluster: the exact pod the kubernetes runner submits for a
shard (``shard_pod.build_pod``), run by the node (the kubelet with the built worker image, or the agent
with ``.venv/bin/batch-worker``) with the real MiniLM, commits the shard (``_SUCCESS.json`` with every row
accounted for) on ``gs://`` (the GCS emulator)."""

from __future__ import annotations

import gcs_fixture
import pytest
from batch_contract import storage
from batch_contract.layout import RunLayout
from batch_contract.marker import ShardMarker
from k8s_fixture import shard_pod_manifest
from k8s_live import make_bucket, upload_rows
from run_helpers import SAMPLE_PARQUET, write_run

from scripts.k8s.cluster import NAMESPACE

pytestmark = [pytest.mark.k8s, pytest.mark.integration]

POD = "worker-pod-00001"
fake_gcs = gcs_fixture.fake_gcs


def test_worker_pod_commits_its_shard(k8s_cluster, fake_gcs, tmp_path):
    bucket = make_bucket(fake_gcs, "k8s-worker-pod")
    upload_rows(SAMPLE_PARQUET, 60, f"{bucket}/in.parquet", tmp_path)
    run_dir = write_run(f"{bucket}/out", tmp_path / "input-60.parquet", shards=2, run_id="k8s_worker_pod",
                        input_uri=f"{bucket}/in.parquet")
    layout = RunLayout.from_run_dir(run_dir)
    ref = {"run_dir": run_dir, "shard_id": "00001", "rows": 30}
    manifest = shard_pod_manifest(k8s_cluster, ref, "manual__2026-12-01T00:00:00+00:00", POD,
                                  env={"STORAGE_EMULATOR_HOST": fake_gcs.url})
    container = manifest["spec"]["containers"][0]
    assert container["command"] == ["tini", "--", "batch-worker"]
    assert container["args"] == ["run", "--run-dir", run_dir, "--shard", "00001"]
    api = k8s_cluster.api("airflow-worker")
    api.create_namespaced_pod(NAMESPACE, manifest)
    done = k8s_cluster.wait_for_pod(NAMESPACE, POD, lambda p: p.status.phase in ("Succeeded", "Failed"), 240)
    log = api.read_namespaced_pod_log(POD, NAMESPACE, _preload_content=False).data.decode()
    assert done.status.phase == "Succeeded", log[-3000:]
    assert done.status.container_statuses[0].state.terminated.exit_code == 0
    marker = ShardMarker.from_json_bytes(storage.read_bytes(layout.marker_uri("00001")))
    assert (marker.shard_id, marker.rows_input, marker.rows_ok + marker.rows_dead_letter) == ("00001", 30, 30)
    assert not storage.exists(layout.marker_uri("00000")), "the pod ran only its own shard"
    assert "shard 00001: complete: 30 results" in log  # the worker's own log, read through pods/log
