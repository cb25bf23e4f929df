"""The main job with input and output on gs:// (fake-gcs-server): plan, worker CLI, gate, publish, report.

The worker runs as a real subprocess (``python -m batch_worker run``) with the real MiniLM encoder; it
inherits ``STORAGE_EMULATOR_HOST`` from the session fixture. The second test runs the whole Airflow DAG
(``airflow dags test batch_inference_backfill``, local runner) with gs:// input and output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import gcs_fixture
import pyarrow.parquet as pq
import pytest
from batch_contract import storage
from batch_contract.enums import ExitCode
from batch_contract.layout import MARKER_NAME, PART_PREFIX, RunLayout
from batch_contract.marker import ShardMarker
from run_helpers import WORKER_ENV
from st_reference import check_published, texts_by_id

fake_gcs, gcs_bucket = gcs_fixture.fake_gcs, gcs_fixture.gcs_bucket

pytestmark = [pytest.mark.integration, pytest.mark.dagrun]

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "data" / "sample" / "debian_descriptions_sample.parquet"


def upload_sample(bucket_uri: str) -> str:
    """Upload the bundled sample Parquet to ``<bucket>/input/``; returns its gs:// URI."""
    uri = f"{bucket_uri}/input/descriptions.parquet"
    storage.write_create_only(uri, SAMPLE.read_bytes())
    return uri


def run_worker(run_dir: str, shard_id: str) -> subprocess.CompletedProcess[str]:
    """``python -m batch_worker run`` for one shard, with this process's environment (emulator host)."""
    return subprocess.run(
        [sys.executable, "-m", "batch_worker", "run", "--run-dir", run_dir, "--shard", shard_id],
        env={**os.environ, **WORKER_ENV}, capture_output=True, text=True, timeout=300,
    )


def part_names(layout: RunLayout, shard_id: str) -> list[str]:
    return [n for n in storage.list_names(layout.shard_dir(shard_id)) if n.startswith(PART_PREFIX)]


def test_planner_resolves_gcs_directories_like_local_ones(gcs_bucket: str, tmp_path: Path) -> None:
    """A gs:// directory (with the empty ``dir/`` object some writers leave) lists like a local one."""
    from batch_contract import gcs
    from batch_inference.planner import resolve_input_files

    data = SAMPLE.read_bytes()
    for name in ("a.parquet", "b.parquet", "sub/c.parquet", "_SUCCESS"):
        storage.write_create_only(f"{gcs_bucket}/in/{name}", data)
        (tmp_path / "in" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "in" / name).write_bytes(data)
    gcs.client().bucket(gcs_bucket[len("gs://"):]).blob("in/").upload_from_string(b"")
    for suffix in ("", "/", "/*.parquet"):
        fmt, uris = resolve_input_files(f"{gcs_bucket}/in{suffix}")
        local_fmt, local_paths = resolve_input_files(f"{tmp_path}/in{suffix}")
        assert fmt == local_fmt
        assert [u[len(gcs_bucket):] for u in uris] == [p[len(str(tmp_path)):] for p in local_paths]
        assert len(uris) == 3


def test_worker_gate_publish_report_on_gcs(gcs_bucket: str, tmp_path: Path) -> None:
    from batch_inference.completion import check_completion
    from batch_inference.planner import PlanRequest, plan
    from batch_inference.publish import PublishTarget, publish_run
    from batch_inference.report import build_report

    input_uri = upload_sample(gcs_bucket)
    output_root = f"{gcs_bucket}/results"
    request = PlanRequest(input_uri=input_uri, id_column="id", text_column="text", output_root=output_root,
                          run_id="gcs_e2e", engine={"kind": "encoder"}, rows_per_shard=20, row_limit=40)
    manifest, refs = plan(request)
    layout = RunLayout(output_root, "gcs_e2e")
    assert [r["shard_id"] for r in refs] == ["00000", "00001"]
    assert storage.exists(layout.manifest_uri)
    assert all(f.uri.startswith("gs://") for f in manifest.input.files)

    first = run_worker(layout.run_dir, "00000")
    assert first.returncode == ExitCode.OK, first.stderr[-3000:]
    status = check_completion(layout.run_dir)
    assert (status.shards_complete, status.missing) == (1, ["00001"])

    second = run_worker(layout.run_dir, "00001")
    assert second.returncode == ExitCode.OK, second.stderr[-3000:]
    assert check_completion(layout.run_dir).missing == []

    marker = ShardMarker.from_json_bytes(storage.read_bytes(layout.marker_uri("00000")))
    parts = part_names(layout, "00000")
    assert parts and MARKER_NAME in storage.list_names(layout.shard_dir("00000"))
    fs, path = storage.arrow_filesystem(f"{layout.shard_dir('00000')}/{parts[0]}")
    assert pq.read_table(path, filesystem=fs).num_rows > 0

    # Resume from storage: without its marker, the shard finds every id in committed parts on gs://.
    storage.delete(layout.marker_uri("00000"))
    again = run_worker(layout.run_dir, "00000")
    assert again.returncode == ExitCode.OK, again.stderr[-3000:]
    assert part_names(layout, "00000") == parts  # nothing re-done, nothing re-committed
    assert ShardMarker.from_json_bytes(storage.read_bytes(layout.marker_uri("00000"))).fingerprint == marker.fingerprint

    db = tmp_path / "warehouse.duckdb"
    summary = publish_run(layout.run_dir, PublishTarget(backend="duckdb", table="emb", duckdb_path=str(db)))
    assert (summary["rows_published"], summary["rows_missing"]) == (40, 0)
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("select count(distinct id) from batch_inference.emb").fetchone() == (40,)

    build_report(layout.run_dir, dag_id="gcs_e2e", publish_summary=summary, cost_params=None)
    report = json.loads(storage.read_bytes(layout.report_json_uri))
    assert report and storage.exists(layout.report_html_uri)


def test_backfill_dag_with_gcs_input_and_output(gcs_bucket: str, tmp_path: Path) -> None:
    """``airflow dags test batch_inference_backfill`` (local runner): gs:// input, gs:// output root."""
    from batch_inference.cli import airflow_env, dags_test, ensure_db

    input_uri = upload_sample(gcs_bucket)
    output_root = f"{gcs_bucket}/dag-out"
    env = airflow_env(tmp_path / "airflow_home")
    env.update(WORKER_ENV, PYTHONPATH=f"{WORKER_ENV['PYTHONPATH']}{os.pathsep}{env['PYTHONPATH']}")
    ensure_db(env)
    conf = {"input_uri": input_uri, "output_root": output_root, "duckdb_path": str(tmp_path / "w.duckdb"),
            "runner": "local", "rows_per_shard": 30, "row_limit": 30, "parallelism": 1,
            "output_table": "gcs_dag_emb"}
    log_path = tmp_path / "dags-test.log"
    code, report_uri = dags_test("batch_inference_backfill", conf, env, log_path)
    assert code == 0, log_path.read_text(errors="replace")[-4000:]
    assert report_uri.startswith(f"{output_root}/runs/") and report_uri.endswith("/report.json")
    layout = RunLayout.from_run_dir(report_uri.rsplit("/", 1)[0])
    assert storage.list_names(layout.shards_dir()) == ["00000"]
    assert MARKER_NAME in storage.list_names(layout.shard_dir("00000"))
    with duckdb.connect(str(tmp_path / "w.duckdb"), read_only=True) as con:
        assert con.execute("select count(*) from batch_inference.gcs_dag_emb").fetchone() == (30,)
        published = con.execute("select id, embedding from batch_inference.gcs_dag_emb order by id").fetchall()
    check_published(published, texts_by_id(pq.read_table(SAMPLE)))  # every row against sentence-transformers
