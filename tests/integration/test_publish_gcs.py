"""Publish a run whose manifest, markers, part files and input live on gs:// (fake-gcs-server)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import gcs_fixture
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from batch_contract import storage
from batch_inference.publish import PublishTarget, publish_run
from synthetic_runs import RunSpec, build_run, write_input

pytestmark = pytest.mark.integration

fake_gcs, gcs_bucket = gcs_fixture.fake_gcs, gcs_fixture.gcs_bucket

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample" / "debian_descriptions_sample.parquet"


def test_publish_from_gcs_matches_local_publish(gcs_bucket: str, tmp_path: Path) -> None:
    ids = pq.read_table(SAMPLE, columns=["id"]).column("id").cast(pa.string()).to_pylist()[:150]
    local_input = write_input(tmp_path / "in.parquet", ids + [None], row_group_rows=40)
    gs_input = f"{gcs_bucket}/input/in.parquet"
    storage.write_create_only(gs_input, Path(local_input).read_bytes())
    layout = build_run(tmp_path / "out", "run1", gs_input,
                       RunSpec(shards=2, chunk_rows=40, dead_rows={3}, duplicate_chunk=True))
    run_dir = Path(storage.local_path(layout.run_dir))
    for path in sorted(p for p in run_dir.rglob("*") if p.is_file()):
        storage.write_create_only(f"{gcs_bucket}/out/runs/run1/{path.relative_to(run_dir)}", path.read_bytes())

    db = tmp_path / "w.duckdb"
    remote = publish_run(f"{gcs_bucket}/out/runs/run1", PublishTarget(table="remote", duckdb_path=str(db)))
    local = publish_run(layout.run_dir, PublishTarget(table="local", duckdb_path=str(db)))
    for key in ("rows_input", "rows_published", "rows_dead_letter", "rows_missing", "duplicates_removed"):
        assert remote[key] == local[key], key
    assert (remote["rows_published"], remote["rows_dead_letter"]) == (149, 2)
    con = duckdb.connect(str(db), read_only=True)
    try:
        diff = con.execute("SELECT count(*) FROM (SELECT * FROM batch_inference.remote EXCEPT "
                           "SELECT * FROM batch_inference.local)").fetchall()
        dead = con.execute("SELECT reason, source_uri FROM batch_inference.remote__dead_letters "
                           "ORDER BY source_row").fetchall()
    finally:
        con.close()
    assert diff[0][0] == 0
    assert dead == [("empty_text", gs_input), ("null_id", gs_input)]
