"""The backfill DAG through the production path on a live cluster: ``runner=kubernetes``, gs:// in and out.

``airflow dags test batch_inference_backfill`` (real Airflow, real mapped deferrable ``ShardPodOperator``,
``KubernetesPodTrigger`` run inline by ``dag.test``) talks to the local kube-apiserver as the
``airflow-worker`` service account (RBAC of ``deploy/k8s/rbac.yaml``); the node agent runs each pod's
``batch-worker`` (real MiniLM) with the GCS emulator's address from the pod's env. 3 shards; while the run
goes, one shard's pod is preempted like a spot reclaim (SIGTERM -> the worker commits, exits 75). The same
input through the local runner is the reference the published table must equal.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import duckdb
import gcs_fixture
import numpy as np
import pyarrow.parquet as pq
import pytest
from batch_contract import storage
from batch_contract.layout import RunLayout
from k8s_live import (
    NAMESPACE,
    PodLedger,
    airflow_k8s_env,
    live_pods,
    record,
    run_dir_of,
    task_instances,
)

fake_gcs = gcs_fixture.fake_gcs

pytestmark = [pytest.mark.k8s, pytest.mark.integration]

ROWS = 900
ROWS_PER_SHARD = 300
"""Shards of 300 rows: seconds of inference per pod on these CPUs, so a SIGTERM sent just after the
worker starts lands mid-shard however fast the model loads (20-row shards finished inside the
preemption's latency once the model loaded in 0.1 s)."""
COSINE_TOLERANCE = 0.9999
"""docs/reliability.md: vectors of re-batched rows agree to cosine >= 0.9999 (fp32)."""
PREEMPT_SHARDS = ("00001", "00002")
"""The shards whose pod the test preempts (the first one still running when its worker is up)."""


def _input(tmp: Path, bucket: str, sample: Path) -> str:
    table = pq.read_table(sample).slice(0, ROWS)
    local = tmp / "input.parquet"
    pq.write_table(table, local)
    uri = f"{bucket}/input/descriptions.parquet"
    storage.write_create_only(uri, local.read_bytes())
    return uri


def _reference(input_uri: str, tmp: Path) -> dict[str, np.ndarray]:
    """The same input through the local runner (one shard, the worker as a local subprocess)."""
    from batch_inference import local_runner
    from batch_inference.planner import PlanRequest, plan
    from batch_inference.publish import PublishTarget, publish_run

    request = PlanRequest(input_uri=input_uri, id_column="id", text_column="text", output_root=str(tmp / "local"),
                          run_id="local_reference", engine={"kind": "encoder"}, worker={"reuse": "off"},
                          rows_per_shard=10_000)
    _, refs = plan(request)
    run_dir = RunLayout(str(tmp / "local"), "local_reference").run_dir
    for ref in refs:
        assert local_runner.run_shard(run_dir, ref["shard_id"]).exit_code == 0
    db = tmp / "local.duckdb"
    publish_run(run_dir, PublishTarget(backend="duckdb", table="ref_emb", duckdb_path=str(db)))
    return _vectors(db, "ref_emb")


def _vectors(db: Path, table: str) -> dict[str, np.ndarray]:
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute(f"select id, embedding from batch_inference.{table}").fetchall()
    ids = [str(r[0]) for r in rows]
    assert len(ids) == len(set(ids)), "an id published twice"
    return {i: np.asarray(v, dtype=np.float32) for i, (_, v) in zip(ids, rows, strict=True)}


class Preempter(threading.Thread):
    """Preempts the first pod of :data:`PREEMPT_SHARDS` whose worker has started (its attempt record is
    in storage, so its SIGTERM handler is installed), ``delay`` seconds later, once. The worker then still
    has its model load (0.1-1 s) and a 300-row shard (seconds) ahead of it, so it is far from done."""

    def __init__(self, cluster, ledger: PodLedger, delay: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.cluster, self.ledger, self.delay = cluster, ledger, delay
        self.preempted: list[tuple[str, str]] = []
        self.stop = threading.Event()

    @staticmethod
    def _worker_started(rec) -> bool:
        layout = RunLayout.from_run_dir(run_dir_of(rec))
        return bool(storage.list_names(layout.attempts_dir(rec.labels["batch-inference/shard-id"])))

    def run(self) -> None:
        while not self.stop.is_set() and not self.preempted:
            for shard in PREEMPT_SHARDS:
                running = [r for r in self.ledger.matching(shard=shard) if r.phase == "Running" and not r.deleted]
                if running and self._worker_started(running[0]):
                    time.sleep(self.delay)
                    try:
                        self.cluster.preempt(NAMESPACE, running[0].name)
                    except Exception:  # noqa: BLE001 - it finished first: try the next shard
                        continue
                    self.preempted.append((shard, running[0].name))
                    return
            time.sleep(0.2)


@pytest.fixture(scope="module")
def k8s_run(k8s_cluster, fake_gcs, tmp_path_factory: pytest.TempPathFactory, sample_parquet: Path):
    """The backfill DAG on the cluster with one pod preempted, and the local-runner reference."""
    from batch_inference.cli import airflow_env, dags_test, ensure_db
    from batch_inference.terminal import DagTestOutput

    tmp = tmp_path_factory.mktemp("k8s-backfill")
    bucket = fake_gcs.create_bucket(f"k8s-{os.getpid()}-{int(time.time())}")
    roots = os.environ.get("BATCH_INFERENCE_ALLOWED_ROOTS", "")
    os.environ["BATCH_INFERENCE_ALLOWED_ROOTS"] = f"{roots},{bucket}" if roots else bucket
    input_uri = _input(tmp, bucket, sample_parquet)
    output_root = f"{bucket}/out"
    home = tmp / "airflow_home"
    env = airflow_k8s_env(airflow_env(home), k8s_cluster.kubeconfig("airflow-worker"), fake_gcs.url)
    ensure_db(env)
    conf = {"input_uri": input_uri, "output_root": output_root, "runner": "kubernetes",
            "rows_per_shard": ROWS_PER_SHARD, "shard_by": "rows", "reuse": "off", "token_budget": 256,
            "duckdb_path": str(tmp / "k8s.duckdb"), "output_table": "k8s_live_emb",
            # the canary pod has its own test (test_k8s_canary_live.py); here every row is left to the
            # shard pods, so the preempted shard's rows are all the worker's
            "canary": False}
    ledger = PodLedger(k8s_cluster.api()).start()
    preempter = Preempter(k8s_cluster, ledger)
    preempter.start()
    out = DagTestOutput()
    t0 = time.monotonic()
    code, report_uri = dags_test("batch_inference_backfill", conf, env, tmp / "dags-test.log", output=out)
    seconds = time.monotonic() - t0
    preempter.stop.set()
    time.sleep(1.0)
    ledger.stop()
    log_text = (tmp / "dags-test.log").read_text(errors="replace")
    reference = _reference(input_uri, tmp)
    return {"code": code, "report_uri": report_uri, "run_id": out.run_id, "log": log_text, "env": env,
            "home": home, "ledger": ledger, "preempted": preempter.preempted, "db": tmp / "k8s.duckdb",
            "reference": reference, "seconds": seconds, "output_root": output_root}


def test_backfill_on_gcs_equals_the_local_runner(k8s_run, k8s_cluster) -> None:
    assert k8s_run["code"] == 0, k8s_run["log"][-5000:]
    report = json.loads(storage.read_bytes(k8s_run["report_uri"]))
    layout = RunLayout.from_run_dir(k8s_run["report_uri"].rsplit("/", 1)[0])
    shards = storage.list_names(layout.shards_dir())
    got = _vectors(k8s_run["db"], "k8s_live_emb")
    ref = k8s_run["reference"]
    assert sorted(got) == sorted(ref) and len(got) == ROWS          # every id exactly once
    cosines = [float(np.dot(got[i], ref[i]) / (np.linalg.norm(got[i]) * np.linalg.norm(ref[i]))) for i in ref]
    assert min(cosines) >= COSINE_TOLERANCE, min(cosines)
    run_label = k8s_run["ledger"].matching()[0].labels["batch-inference/run-id"] if k8s_run["ledger"].pods else ""
    pods = k8s_run["ledger"].matching(run=run_label)
    assert {p.labels["batch-inference/shard-id"] for p in pods} == set(shards) and len(shards) >= 3
    left = live_pods(k8s_cluster.api(), f"batch-inference/run-id={run_label}")
    assert left == [], [p.metadata.name for p in left]                # succeeded and preempted pods deleted
    tis = task_instances(k8s_run["home"], k8s_run["run_id"])
    assert len(tis) == len(shards) and all(state == "success" for _, state in tis.values()), tis
    publish = report["publish"]
    record(shards=len(shards), shards_complete=sum(1 for s in shards if storage.exists(layout.marker_uri(s))),
           pods_created=len(pods), rows_input=ROWS, rows_published=publish["rows_published"],
           rows_dead_letter=publish["rows_dead_letter"], equal_to_local=True,
           min_cosine_vs_local=round(min(cosines), 6), backfill_seconds=round(k8s_run["seconds"], 1))


def test_preempted_pod_is_relaunched_in_the_same_try(k8s_run) -> None:
    """SIGTERM mid-shard -> exit 75 -> a fresh pod for the shard, same try, resumes from committed parts."""
    assert k8s_run["code"] == 0, k8s_run["log"][-5000:]
    assert k8s_run["preempted"], "no pod was running long enough to preempt"
    shard, first_pod = k8s_run["preempted"][0]
    pods = k8s_run["ledger"].matching(shard=shard)
    names = [p.name for p in pods]
    assert names[0] == first_pod and len(pods) == 2, names
    first, second = pods
    assert first.exit_code == 75 and first.reason == "Terminated" and first.deleted, first
    assert second.annotations["batch-inference/preemptions"] == "1" and second.exit_code == 0
    assert first.labels["try_number"] == second.labels["try_number"] == "1"
    tis = task_instances(k8s_run["home"], k8s_run["run_id"])
    assert all(try_number == 1 for try_number, _ in tis.values()), tis   # no retry consumed
    assert "Relaunching preemption 1/20 in the same try" in k8s_run["log"]
    report = json.loads(storage.read_bytes(k8s_run["report_uri"]))
    attempts = [a for a in report["attempts"]["list"] if a["shard_id"] == shard]
    assert [a["outcome"] for a in attempts] == ["preempted", "ok"], attempts
    # resume: the second attempt computed only what the first had not committed; at most one chunk
    # (<= ROWS_PER_SHARD rows) re-done
    assert report["attempts"]["rows_redone"] <= ROWS_PER_SHARD
    assert attempts[0]["rows_committed"] + attempts[1]["rows_committed"] == ROWS_PER_SHARD, attempts
    record(preemptions=report["attempts"]["preemptions"],
           preemption_retries_consumed=sum(t - 1 for t, _ in tis.values()),
           preempted_rows_committed=attempts[0]["rows_committed"], rows_redone=report["attempts"]["rows_redone"])
