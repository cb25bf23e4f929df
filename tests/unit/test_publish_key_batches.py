"""DuckDB publish in batches (``duckdb_backend.PRIMARY_KEY_BULK_ROWS``): whatever the batch size, the
published table is the one a single-batch load gives, row for row, with the primary key on ``id`` live;
and :func:`part_batches` cuts the part files into consecutive batches of bounded rows."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from batch_inference.publish import PublishTarget, duckdb_backend, publish_run
from batch_inference.publish.duckdb_backend import part_batches
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from synthetic_runs import RunSpec, build_run, write_input


def _publish(tmp: Path, name: str, run_dir: str, bulk_rows: int, monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    monkeypatch.setattr(duckdb_backend, "PRIMARY_KEY_BULK_ROWS", bulk_rows)
    path = tmp / f"{name}.duckdb"
    summary = publish_run(run_dir, PublishTarget(backend="duckdb", table="emb", duckdb_path=str(path)))
    con = duckdb.connect(str(path))
    try:
        rows = con.execute("SELECT * FROM batch_inference.emb ORDER BY id").fetchall()
        keys = con.execute("SELECT constraint_type, constraint_column_names FROM duckdb_constraints() "
                           "WHERE table_name = 'emb' AND constraint_type = 'PRIMARY KEY'").fetchall()
        assert keys == [("PRIMARY KEY", ["id"])]
        with pytest.raises(duckdb.ConstraintException):  # the key is enforced on the published table
            con.execute(f"INSERT INTO batch_inference.emb (id) VALUES ('{rows[0][0]}')")
    finally:
        con.close()
    assert summary["rows_published"] == len(rows)
    return rows


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(20, 160), shards=st.integers(1, 4), chunk_rows=st.integers(3, 40),
       bulk_rows=st.integers(1, 60), duplicate_chunk=st.booleans(), data=st.data())
def test_batched_load_equals_one_batch(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
                                       n: int, shards: int, chunk_rows: int, bulk_rows: int,
                                       duplicate_chunk: bool, data: st.DataObject) -> None:
    tmp = tmp_path_factory.mktemp("keybatch")
    dead = set(data.draw(st.lists(st.integers(0, n - 1), max_size=5)))
    inp = write_input(tmp / "input.parquet", [f"id-{i:05d}" for i in range(n)], row_group_rows=16)
    layout = build_run(tmp / "out", "run1", inp, RunSpec(shards=shards, chunk_rows=chunk_rows, dead_rows=dead,
                                                         duplicate_chunk=duplicate_chunk))
    one = _publish(tmp, "one", layout.run_dir, 10**9, monkeypatch)
    batched = _publish(tmp, "batched", layout.run_dir, bulk_rows, monkeypatch)
    assert batched == one
    assert len(one) == n - len(dead)


@given(counts=st.lists(st.integers(1, 50), max_size=12), max_rows=st.integers(1, 80))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_part_batches_are_consecutive_and_bounded(tmp_path_factory: pytest.TempPathFactory, counts: list[int],
                                                  max_rows: int) -> None:
    tmp = tmp_path_factory.mktemp("parts")
    paths = []
    for i, c in enumerate(counts):
        path = str(tmp / f"p{i}.parquet")
        pq.write_table(pa.table({"id": [str(j) for j in range(c)]}), path)
        paths.append(path)
    batches = part_batches(paths, max_rows)
    assert [p for b in batches for p in b] == paths
    rows = dict(zip(paths, counts, strict=True))
    for i, batch in enumerate(batches):
        total = sum(rows[p] for p in batch)
        assert batch and (total <= max_rows or len(batch) == 1)
        if i + 1 < len(batches):  # a batch ends only where the next file would not fit
            assert total + rows[batches[i + 1][0]] > max_rows
