"""The pre-flight canary and the budget guardrails on the production path, on the live cluster.

One ``airflow dags test batch_inference_backfill`` per case (``runner=kubernetes``, gs:// in and out, the
pods watched from the API server; the node agent runs the real ``batch-worker`` with MiniLM):

* a run within its budget: the ``canary`` task runs ``batch-worker canary`` as a pod (the shard pods'
  spec, labelled ``batch-inference/role=canary``), writes ``canary.json`` and ``projection.json`` (the
  kubernetes runner's options, 1..``max_gpus`` pods), and only then do the shard pods start; every row
  is published;
* a budget below the projection: the canary pod runs, the task fails with ``REFUSED (budget)`` in its
  first try, and no shard pod is ever created.

The in-run budget stop (``ShardPodOperator.over_budget``) runs under Airflow's real scheduler, with pods in
parallel, in ``test_k8s_scheduler_live.py``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import gcs_fixture
import pytest
from batch_contract import storage
from batch_contract.layout import RunLayout
from batch_inference.cli import dags_test
from batch_inference.pod_spec import label_value
from batch_inference.terminal import DagTestOutput
from k8s_live import (
    SHARD_LABEL,
    PodLedger,
    airflow_k8s_env,
    live_pods,
    make_bucket,
    migrated_airflow_home,
    record,
    run_dir_of,
    task_instances,
    upload_rows,
)

fake_gcs = gcs_fixture.fake_gcs

pytestmark = [pytest.mark.k8s, pytest.mark.integration]

ROWS = 12
ROWS_PER_SHARD = 6
CANARY_ROWS = 4
ROLE_LABEL = "batch-inference/role"
SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample" / "debian_descriptions_sample.parquet"


@pytest.fixture(scope="module")
def setup(k8s_cluster, fake_gcs, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("k8s-canary")
    home, env = migrated_airflow_home(tmp)
    return {"tmp": tmp, "home": home, "env": env, "bucket": make_bucket(fake_gcs, "k8s-canary")}


def _run(setup, k8s_cluster, fake_gcs, name: str, conf: dict) -> dict:
    """One backfill run named ``name`` (2 shards of 6 rows); returns its exit code, run id, log, pods
    (ledger), run label and run dir."""
    tmp, bucket = setup["tmp"], setup["bucket"]
    input_uri = upload_rows(SAMPLE, ROWS, f"{bucket}/{name}/in.parquet", tmp)
    env = airflow_k8s_env(setup["env"], k8s_cluster, fake_gcs.url)
    full = {"input_uri": input_uri, "output_root": f"{bucket}/{name}/out", "runner": "kubernetes", "reuse": "off",
            "rows_per_shard": ROWS_PER_SHARD, "shard_by": "rows", "token_budget": 256,
            "canary_min_rows": CANARY_ROWS, "duckdb_path": str(tmp / f"{name}.duckdb"),
            "output_table": f"{name}_emb", **conf}
    ledger = PodLedger(k8s_cluster.api()).start()
    out = DagTestOutput()
    t0 = time.monotonic()
    code, report_uri = dags_test("batch_inference_backfill", full, env, tmp / f"{name}.log", output=out)
    seconds = time.monotonic() - t0
    time.sleep(0.5)
    ledger.stop()
    run_label = label_value(out.run_id)
    return {"code": code, "run_id": out.run_id, "log": (tmp / f"{name}.log").read_text(errors="replace"),
            "ledger": ledger, "run_label": run_label, "report_uri": report_uri, "seconds": seconds,
            "run_dir": RunLayout(full["output_root"], out.run_id, "batch_inference_backfill").run_dir}


def _split(run: dict) -> tuple[list, list]:
    pods = run["ledger"].matching(run=run["run_label"])
    return ([p for p in pods if p.labels.get(ROLE_LABEL) == "canary"],
            [p for p in pods if SHARD_LABEL in p.labels])


def _cleanup(k8s_cluster, run_label: str) -> None:
    """Delete the failed pods a task keeps for ``kubectl logs`` (so later tests count from zero)."""
    api = k8s_cluster.api()
    for pod in live_pods(api, f"batch-inference/run-id={run_label}"):
        api.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0)


def test_the_canary_runs_as_a_pod_then_the_shards_fan_out(setup, k8s_cluster, fake_gcs) -> None:
    run = _run(setup, k8s_cluster, fake_gcs, "go", {"budget_usd": 1000.0, "max_gpus": 3})
    assert run["code"] == 0, run["log"][-5000:]
    canary, shards = _split(run)
    assert len(canary) == 1, [(p.name, p.labels) for p in run["ledger"].matching(run=run["run_label"])]
    pod = canary[0]
    assert pod.args[:3] == ["canary", "--run-dir", run["run_dir"]] and run_dir_of(pod) == run["run_dir"]
    assert pod.args[pod.args.index("--min-rows") + 1] == str(CANARY_ROWS)
    assert pod.exit_code == 0 and pod.deleted                         # delete_succeeded_pod
    assert sorted(p.labels[SHARD_LABEL] for p in shards) == ["00000", "00001"]
    assert min(p.first_seen for p in shards) > pod.last_seen, "a shard pod started before the canary ended"
    layout = RunLayout.from_run_dir(run["run_dir"])
    canary_json = json.loads(storage.read_bytes(layout.canary_uri))
    assert canary_json["sample_rows"] == CANARY_ROWS and sum(canary_json["shard_rows"].values()) == CANARY_ROWS
    projection = json.loads(storage.read_bytes(layout.projection_uri))
    assert projection["runner"] == "kubernetes" and projection["decision"] == "go"
    assert [o["parallelism"] for o in projection["options"]] == [1, 2, 3]
    # the pod's wall (creation to exit) includes its start-up, which the canary's own clock does not
    assert projection["canary"]["wall_seconds"] > canary_json["elapsed_seconds"]
    assert "canary pod" in run["log"] and "GO: projected" in run["log"]
    assert task_instances(setup["home"], run["run_id"], "canary") == {-1: (1, "success")}
    report = json.loads(storage.read_bytes(run["report_uri"]))
    assert report["rows_published"] == ROWS and report["projection"]["decision"] == "go"
    record(canary_pods=len(canary), canary_pod_wall_s=projection["canary"]["wall_seconds"],
           canary_projected_usd=projection["cost_usd"], canary_run_seconds=round(run["seconds"], 1))


def test_a_budget_below_the_projection_refuses_with_no_shard_pod(setup, k8s_cluster, fake_gcs) -> None:
    run = _run(setup, k8s_cluster, fake_gcs, "refuse", {"budget_usd": 0.0})
    canary, shards = _split(run)
    assert len(canary) == 1 and canary[0].exit_code == 0, canary
    assert shards == [], [p.name for p in shards]
    projection = json.loads(storage.read_bytes(RunLayout.from_run_dir(run["run_dir"]).projection_uri))
    assert projection["decision"] == "refused_budget" and projection["cost_usd"] > 0
    assert "REFUSED (budget)" in run["log"] and "the canary refused the run" in run["log"]
    assert task_instances(setup["home"], run["run_id"], "canary") == {-1: (1, "failed")}   # no retry
    assert all(state != "success" for _, state in task_instances(setup["home"], run["run_id"]).values())
    assert run["code"] != 0
    record(refused_shard_pods=len(shards))
    _cleanup(k8s_cluster, run["run_label"])
