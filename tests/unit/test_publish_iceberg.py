"""Iceberg-only publish checks (the backend-agnostic cases run for Iceberg in test_publish.py): one
snapshot per publish, a no-op rerun adds none, rollback restores the previous snapshot, readers see the
old or the new snapshot, never a mix."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from batch_inference.publish import PublishTarget, publish_run, rollback
from batch_inference.publish.iceberg_backend import catalog_uri, load_catalog
from publish_backends import Published, snapshot_runs
from synthetic_runs import RunSpec, build_run, write_input

pytest.importorskip("pyiceberg")


@pytest.fixture
def pub(tmp_path: Path) -> Published:
    return Published("iceberg", tmp_path)


@pytest.fixture
def runs(tmp_path: Path):
    inp = write_input(tmp_path / "in.parquet", [f"r{i:04d}" for i in range(300)], row_group_rows=64)
    run1 = build_run(tmp_path / "out", "run1", inp, RunSpec(shards=2, chunk_rows=50, dead_rows={5}))
    run2 = build_run(tmp_path / "out", "run2", inp, RunSpec(shards=3, fingerprint="a" * 32, dead_rows={1, 2}))
    return run1, run2


def _table(target: PublishTarget, suffix: str = ""):
    return load_catalog(target).load_table((target.schema, target.name(suffix)))


def test_one_snapshot_per_publish_and_noop_rerun_adds_none(pub: Published, runs) -> None:
    run1, run2 = runs
    target = pub.target()
    publish_run(run1.run_dir, target)
    assert snapshot_runs(target) == ["run1"] and snapshot_runs(target, "__dead_letters") == ["run1"]
    assert publish_run(run1.run_dir, target)["noop"] is True
    assert len(_table(target).snapshots()) == 1 and len(_table(target, "__dead_letters").snapshots()) == 1
    publish_run(run2.run_dir, target)
    assert snapshot_runs(target) == ["run1", "run2"]
    assert publish_run(run2.run_dir, target)["noop"] is True
    assert len(_table(target).snapshots()) == 2
    assert [r[0] for r in pub.query("SELECT action FROM batch_inference.emb__publish_log ORDER BY rowid")] == ["publish"] * 2


def test_rollback_restores_the_previous_snapshot_rows(pub: Published, runs) -> None:
    run1, run2 = runs
    target = pub.target()
    publish_run(run1.run_dir, target)
    first = _table(target).current_snapshot().snapshot_id
    rows1 = sorted(pub.query("SELECT id, fingerprint, embedding FROM batch_inference.emb"))
    publish_run(run2.run_dir, target)
    assert pub.query("SELECT count(*), min(fingerprint) FROM batch_inference.emb")[0] == (298, "a" * 32)
    back = rollback(target)
    assert (back["restored_run_id"], back["replaced_run_id"]) == ("run1", "run2")
    assert _table(target).current_snapshot().snapshot_id == first, "the old snapshot itself, not a copy"
    assert sorted(pub.query("SELECT id, fingerprint, embedding FROM batch_inference.emb")) == rows1
    assert pub.query("SELECT id, reason FROM batch_inference.emb__dead_letters") == [("r0005", "empty_text")]
    assert pub.query("SELECT count(*) FROM batch_inference.emb__previous")[0][0] == 298
    assert rollback(target)["restored_run_id"] == "run2", "a second rollback undoes the first"
    assert pub.query("SELECT count(*) FROM batch_inference.emb__dead_letters")[0][0] == 2


def test_readers_during_publish_see_the_old_or_the_new_snapshot(pub: Published, runs) -> None:
    run1, run2 = runs
    target = pub.target()
    publish_run(run1.run_dir, target)
    stale = _table(target)  # a reader that loaded the table before the publish
    seen: set[tuple[int, tuple[str, ...]]] = set()
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            data = _table(target).scan(selected_fields=("fingerprint",)).to_arrow()
            seen.add((data.num_rows, tuple(sorted(set(data["fingerprint"].to_pylist())))))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        publish_run(run2.run_dir, target)
    finally:
        stop.set()
        reader.join()
    assert seen <= {(299, ("f" * 32,)), (298, ("a" * 32,))} and seen
    assert stale.scan().to_arrow().num_rows == 299, "an already loaded snapshot stays readable"


def test_target_and_catalog_settings(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="^iceberg_warehouse:"):
        PublishTarget(backend="iceberg", table="emb")
    local = PublishTarget(backend="iceberg", table="emb", iceberg_warehouse=str(tmp_path / "ice" / "wh"))
    assert catalog_uri(local) == f"sqlite:///{tmp_path / 'ice' / 'catalog.db'}"
    pg = PublishTarget(backend="iceberg", table="emb", iceberg_warehouse="gs://b/wh", dsn="postgresql://u@h/db")
    assert catalog_uri(pg) == "postgresql+psycopg://u@h/db"
    with pytest.raises(ValueError, match="^dsn:.*PostgreSQL catalog"):
        catalog_uri(PublishTarget(backend="iceberg", table="emb", iceberg_warehouse="gs://b/wh"))
    with pytest.raises(ValueError, match="^dsn:.*URI"):
        catalog_uri(PublishTarget(backend="iceberg", table="emb", iceberg_warehouse="x", dsn="host=h dbname=d"))
