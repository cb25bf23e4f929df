"""Attack: trigger a run of one DAG with another DAG's run id, to make the plan task reuse that run's
manifest (its input, model and table) and the UI serve it to this DAG's audience.

Two real DAG runs (``dag.test()``, dry runs: plan and pod manifests only) share one output root and one
logical date, so Airflow gives both the run id ``manual__<date>``. Each must plan into its own
``runs/<dag_id>/<run_id>`` from its own input, never reading the other's manifest.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import airflow_test_home
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from run_helpers import REPO_ROOT

pytestmark = [pytest.mark.integration, pytest.mark.dagrun]

RUN_BOTH = textwrap.dedent("""
    import json, sys
    from datetime import datetime, timezone
    from airflow.dag_processing.dagbag import DagBag
    bag = DagBag(dag_folder=sys.argv[2])
    assert not bag.import_errors, bag.import_errors
    when = datetime(2026, 4, 1, tzinfo=timezone.utc)
    for dag_id, conf in json.loads(sys.argv[1]):
        dr = bag.dags[dag_id].test(run_conf=conf, logical_date=when, run_after=when)
        print("RESULT " + json.dumps({"dag_id": dag_id, "state": str(dr.state), "run_id": dr.run_id}), flush=True)
""")


def test_a_run_id_shared_by_two_dags_never_reuses_the_other_dags_plan(tmp_path: Path) -> None:
    from batch_inference.params import PARAM_FIELDS, param_default

    out = tmp_path / "out"
    inputs = {}
    for name, rows in (("team_a", 30), ("team_b", 7)):
        inputs[name] = tmp_path / f"{name}.parquet"
        pq.write_table(pa.table({"id": list(range(rows)), "text": [f"{name} row {i}" for i in range(rows)]}),
                       inputs[name])
    base = {name: param_default(name) for name in PARAM_FIELDS}
    base |= {"output_root": str(out), "duckdb_path": str(out / "w.duckdb"), "runner": "local", "dry_run": True,
             "canary": False, "reuse": "off", "rows_per_shard": 10}
    runs = [("batch_inference_backfill", {**base, "input_uri": str(inputs["team_a"]), "output_table": "team_a"}),
            ("batch_inference_on_model_upgrade", {**base, "input_uri": str(inputs["team_b"]), "output_table": "team_b",
                                                  "model": param_default("model") or "/models/m"})]
    env = airflow_test_home.airflow_env(tmp_path / "home", {"OMP_NUM_THREADS": "1"})
    proc = subprocess.run([sys.executable, "-c", RUN_BOTH, json.dumps(runs), str(REPO_ROOT / "dags")], env=env,
                          capture_output=True, text=True, timeout=900)
    console = proc.stdout + proc.stderr
    results = [json.loads(x[7:]) for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and len(results) == 2, console[-6000:]
    assert results[0]["run_id"] == results[1]["run_id"], "the attack needs one run id for both DAGs"
    for result, (dag_id, conf) in zip(results, runs, strict=True):
        assert result["state"].endswith("success"), console[-6000:]
        manifest = json.loads((out / "runs" / dag_id / result["run_id"] / "manifest.json").read_text())
        assert manifest["params"]["dag_id"] == dag_id
        assert manifest["input"]["uri"] == conf["input_uri"] and manifest["params"]["output_table"] == conf["output_table"]
    assert not (out / "runs" / results[0]["run_id"]).exists(), "no run directory outside a DAG's namespace"
    assert "already exists: reusing" not in console
