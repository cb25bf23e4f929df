"""The canary task in a real Airflow run (``dag.test()``): a run over its budget is refused before the
fan-out, starts no shard, and the gate says why; a run within budget records its projection."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import airflow_test_home
import pytest
from run_helpers import dag_run_dir

pytestmark = [pytest.mark.integration, pytest.mark.dagrun]

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "data" / "sample" / "debian_descriptions_sample.parquet"

RUN_DAG = textwrap.dedent("""
    import json, sys
    from airflow.dag_processing.dagbag import DagBag
    dag_id, conf = sys.argv[1], json.loads(sys.argv[2])
    bag = DagBag(dag_folder=sys.argv[3])
    assert not bag.import_errors, bag.import_errors
    dr = bag.dags[dag_id].test(run_conf=conf)
    states = {ti.task_id + ("" if ti.map_index < 0 else f"[{ti.map_index}]"): str(ti.state) for ti in dr.get_task_instances()}
    print("RESULT " + json.dumps({"state": str(dr.state), "run_id": dr.run_id, "tasks": states}))
""")


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return airflow_test_home.airflow_env(tmp_path_factory.mktemp("airflow_home_canary"))


def run_dag(conf: dict, env: dict[str, str], dag_id: str = "batch_inference_backfill") -> tuple[dict, str]:
    """``dag.test()`` of ``dag_id`` with ``conf`` in a subprocess (Airflow home from ``env``): the run's
    result (``state``, ``run_id``, ``tasks``: task id -> state) and the process's output. Shared by the
    canary, approval and upgrade-check DAG tests."""
    proc = subprocess.run([sys.executable, "-c", RUN_DAG, dag_id, json.dumps(conf), str(REPO / "dags")],
                          env=env, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, out[-6000:]
    return json.loads(lines[-1][len("RESULT "):]), out


def _conf(tmp_path: Path, **kw) -> dict:
    conf = {"input_uri": str(SAMPLE), "output_root": str(tmp_path / "out"),
            "duckdb_path": str(tmp_path / "out" / "warehouse.duckdb"), "runner": "local", "reuse": "off",
            "rows_per_shard": 100, "row_limit": 200, "shard_by": "rows", "output_table": "emb_canary",
            "canary_min_rows": 40, "accelerator": "nvidia-l4"}
    conf.update(kw)
    return conf


def test_a_run_over_budget_is_refused_before_the_fan_out_and_starts_no_shard(tmp_path: Path,
                                                                             airflow_env: dict[str, str]) -> None:
    result, out = run_dag(_conf(tmp_path, budget_usd=0.0), airflow_env)
    assert result["state"].endswith("failed"), out[-4000:]
    tasks = result["tasks"]
    assert tasks["plan"].endswith("success") and tasks["canary"].endswith("failed")
    assert not any(k.startswith("infer_local") and v.endswith("success") for k, v in tasks.items()), tasks
    assert not tasks.get("publish", "").endswith("success")
    run_dir = dag_run_dir(tmp_path / "out", result["run_id"])
    projection = json.loads((run_dir / "projection.json").read_text())
    assert projection["decision"] == "refused_budget" and projection["cost_usd"] > 0
    assert "REFUSED (budget)" in out and "budget_usd=0" in out
    assert "Nothing smaller fits" in projection["message"]  # a zero budget cannot pay the canary already run
    for shard in ("00000", "00001"):
        assert not (run_dir / "shards" / shard / "attempts").exists(), "no shard worker started"
        assert not (run_dir / "shards" / shard / "_SUCCESS.json").exists()
    assert "the canary refused the run" in out, "the gate names the refusal"


def test_a_run_within_budget_records_its_projection_and_publishes_every_row(tmp_path: Path,
                                                                            airflow_env: dict[str, str]) -> None:
    result, out = run_dag(_conf(tmp_path, budget_usd=1000.0), airflow_env)
    assert result["state"].endswith("success"), out[-6000:]
    run_dir = dag_run_dir(tmp_path / "out", result["run_id"])
    projection = json.loads((run_dir / "projection.json").read_text())
    assert projection["decision"] == "go" and projection["options"]
    assert result["tasks"]["approve"].endswith("success"), "require_approval off (default): passes at once"
    assert not (run_dir / "approval.json").exists() and "Waiting for Human-in-the-loop input" not in out
    report = json.loads((run_dir / "report.json").read_text())
    assert report["rows_published"] == 200
    section = report["projection"]
    assert section["decision"] == "go" and section["actual"]["worker_seconds"] == pytest.approx(
        report["worker_seconds"] - report["stage_seconds"]["canary"])  # the fan-out's: the canary is a stage
    assert section["projected"]["worker_seconds"] == projection["fanout_worker_seconds"]
