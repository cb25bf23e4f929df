"""Publish a run that lives on s3:// (moto) or az:// (Azurite): DuckDB reading the run from the store
equals the same run published from local disk, and Iceberg with its warehouse on the store (a SQL
catalog in PostgreSQL, as a deployment has it) holds the same rows, its data files on the store.
(gs:// has the same in test_publish_gcs.py and, through a DAG run, test_iceberg_dag.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import object_stores
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from batch_contract import storage
from batch_inference.publish import PublishTarget, publish_run
from pg_fixture import pg_dsn  # noqa: F401  (module-scoped server fixture)
from synthetic_runs import RunSpec, build_run, write_input

pytestmark = pytest.mark.integration

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample" / "debian_descriptions_sample.parquet"


@pytest.fixture(params=["s3", "az"])
def store(request: pytest.FixtureRequest) -> Iterator[object_stores.EmulatedStore]:
    with object_stores.started(request.param) as emulated:
        yield emulated


def _copy_run(layout_dir: Path, dest: str) -> None:
    for path in sorted(p for p in layout_dir.rglob("*") if p.is_file()):
        storage.write_create_only(f"{dest}/{path.relative_to(layout_dir)}", path.read_bytes())


def _rows(table: pa.Table) -> dict[str, list[float]]:
    return dict(zip(table.column("id").to_pylist(), table.column("embedding").to_pylist(), strict=True))


def test_publish_from_the_store_matches_local_publish(store: object_stores.EmulatedStore, pg_dsn: str,  # noqa: F811
                                                      tmp_path: Path) -> None:
    root = store.new_root("publish")
    ids = pq.read_table(SAMPLE, columns=["id"]).column("id").cast(pa.string()).to_pylist()[:150]
    local_input = write_input(tmp_path / "in.parquet", ids + [None], row_group_rows=40)
    remote_input = f"{root}/input/in.parquet"
    storage.write_create_only(remote_input, Path(local_input).read_bytes())
    layout = build_run(tmp_path / "out", "run1", remote_input,
                       RunSpec(shards=2, chunk_rows=40, dead_rows={3}, duplicate_chunk=True))
    _copy_run(Path(storage.local_path(layout.run_dir)), f"{root}/out/runs/run1")

    db = tmp_path / "w.duckdb"
    remote = publish_run(f"{root}/out/runs/run1", PublishTarget(table="remote", duckdb_path=str(db)))
    local = publish_run(layout.run_dir, PublishTarget(table="local", duckdb_path=str(db)))
    for key in ("rows_input", "rows_published", "rows_dead_letter", "rows_missing", "duplicates_removed"):
        assert remote[key] == local[key], key
    assert (remote["rows_published"], remote["rows_dead_letter"]) == (149, 2)
    with duckdb.connect(str(db), read_only=True) as con:
        diff = con.execute("SELECT count(*) FROM (SELECT * FROM batch_inference.remote EXCEPT "
                           "SELECT * FROM batch_inference.local)").fetchall()
        local_rows = _rows(con.sql("SELECT id, embedding FROM batch_inference.local").to_arrow_table())
    assert diff[0][0] == 0

    warehouse = f"{root}/iceberg/warehouse"
    target = PublishTarget(backend="iceberg", table="emb", iceberg_warehouse=warehouse, dsn=pg_dsn,
                           schema=f"ns_{store.scheme}_{root.rsplit('-', 1)[-1]}")
    summary = publish_run(f"{root}/out/runs/run1", target)
    assert summary["rows_published"] == 149
    from batch_inference.publish.iceberg_backend import load_catalog

    table = load_catalog(target).load_table((target.schema, "emb"))
    files = [t.file.file_path for t in table.scan().plan_files()]
    assert files and all(f.startswith(f"{warehouse}/") for f in files), files
    assert storage.list_glob(f"{warehouse}/{target.schema}/emb/data", "*.parquet"), "data files on the store"
    assert _rows(table.scan(selected_fields=("id", "embedding")).to_arrow()) == local_rows
