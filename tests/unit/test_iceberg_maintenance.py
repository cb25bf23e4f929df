"""Iceberg publish expires old snapshots and removes orphan files by a documented retention
(``publish.iceberg_maintenance``), on the real local SQLite catalog and warehouse the publish tests use.

The class of defect: files orphaned by a rollback (or by a crashed publish's staging) were never removed,
while nothing may ever delete a file a kept snapshot references. A property over random sequences of
publishes and rollbacks, each followed by maintenance under a random retention and clock: every file any
remaining snapshot or metadata file references exists; the current and the tagged (rollback) snapshot
read back the rows of the runs they hold; rollback still works. Then the rollback-orphan case through
``publish_run`` itself, the retention's rules (days, last K, orphan age) and its settings.
"""

from __future__ import annotations

import os
from pathlib import Path

import gcs_fixture
import pytest
from batch_contract.engine_config import ConfigError
from batch_inference.publish import PublishTarget, publish_run, rollback
from batch_inference.publish.iceberg_backend import load_catalog, previous_snapshot
from batch_inference.publish.iceberg_maintenance import (
    KEEP_DAYS_ENV,
    KEEP_LAST_ENV,
    ORPHAN_AGE_ENV,
    IcebergRetention,
    expire_and_clean,
    fs_path,
    referenced_files,
    snapshots_to_expire,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from publish_backends import Published, snapshot_runs
from synthetic_runs import RunSpec, build_run, write_input

pytest.importorskip("pyiceberg")

fake_gcs, gcs_bucket = gcs_fixture.fake_gcs, gcs_fixture.gcs_bucket

TABLES = ("", "__dead_letters", "__publish_log")
DAY = 86_400.0


def _table(target: PublishTarget, suffix: str = ""):
    return load_catalog(target).load_table((target.schema, target.name(suffix)))


def _files(table) -> set[str]:
    """Every file under the table location (filesystem paths)."""
    root = Path(fs_path(table.location()))
    return {str(p) for p in root.rglob("*") if p.is_file()}


def _snapshot_data_files(table, snapshot_id: int) -> set[str]:
    return {fs_path(t.file.file_path) for t in table.scan(snapshot_id=snapshot_id).plan_files()}


def _check_nothing_referenced_is_gone(target: PublishTarget) -> None:
    for suffix in TABLES:
        table = _table(target, suffix)
        missing = referenced_files(table) - _files(table)
        assert not missing, f"{suffix or 'results'}: referenced files deleted: {sorted(missing)[:3]}"
        for snap in table.snapshots():  # every remaining snapshot still reads
            table.scan(snapshot_id=snap.snapshot_id).to_arrow()


@pytest.fixture
def runs(tmp_path: Path) -> list:
    inp = write_input(tmp_path / "in.parquet", [f"r{i:04d}" for i in range(120)], row_group_rows=64)
    return [build_run(tmp_path / "out", f"run{k}", inp,
                      RunSpec(shards=2, chunk_rows=40, fingerprint=f"{k}" * 32, version=float(k), dead_rows={k}))
            for k in range(4)]


def _dead_ids(target: PublishTarget) -> list[str]:
    return _table(target, "__dead_letters").scan(selected_fields=("id",)).to_arrow()["id"].to_pylist()


def _fingerprints(table, snapshot_id: int | None = None) -> set[str]:
    data = table.scan(snapshot_id=snapshot_id, selected_fields=("fingerprint",)).to_arrow()
    return set(data["fingerprint"].to_pylist())


def test_a_rollback_orphan_is_expired_and_its_files_removed_by_publish(runs, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """publish 0, publish 1, rollback (0 current, 1 tagged), publish 2 (1 is now on no branch or tag):
    with a retention of 0 days, the last 1 snapshot and orphans of any age, publish 2 expires snapshot 1
    and deletes its data files and manifests; the current (2) and tagged (0) snapshots stay whole."""
    target = Published("iceberg", tmp_path).target()
    publish_run(runs[0].run_dir, target)
    publish_run(runs[1].run_dir, target)
    rollback(target)
    orphaned = _table(target).metadata.snapshot_by_name(target.name("__previous"))
    orphan_files = _snapshot_data_files(_table(target), orphaned.snapshot_id) | {fs_path(orphaned.manifest_list)}
    assert orphan_files <= _files(_table(target))
    monkeypatch.setenv(KEEP_DAYS_ENV, "0")
    monkeypatch.setenv(KEEP_LAST_ENV, "1")
    monkeypatch.setenv(ORPHAN_AGE_ENV, "0")
    publish_run(runs[2].run_dir, target)
    table = _table(target)
    assert table.snapshot_by_id(orphaned.snapshot_id) is None, "the rollback orphan was expired"
    assert not orphan_files & _files(table), "its files were deleted"
    assert {s.snapshot_id for s in table.snapshots()} == {table.current_snapshot().snapshot_id,
                                                          previous_snapshot(table, target.name("__previous")).snapshot_id}
    _check_nothing_referenced_is_gone(target)
    assert _fingerprints(table) == {"2" * 32}
    assert rollback(target)["restored_run_id"] == "run0"
    assert _fingerprints(_table(target)) == {"0" * 32}
    assert _dead_ids(target) == ["r0000"], "the dead letters follow the rollback"
    log = _table(target, "__publish_log").scan().to_arrow()
    assert log["action"].to_pylist().count("publish") == 3, "the log keeps every row (its files stay live)"


def test_the_default_retention_keeps_recent_snapshots_and_young_files(runs, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (KEEP_DAYS_ENV, KEEP_LAST_ENV, ORPHAN_AGE_ENV):
        monkeypatch.delenv(var, raising=False)
    target = Published("iceberg", tmp_path).target()
    publish_run(runs[0].run_dir, target)
    publish_run(runs[1].run_dir, target)
    rollback(target)
    publish_run(runs[2].run_dir, target)  # run1's snapshot is now on no branch or tag
    table = _table(target)
    assert len(table.snapshots()) == 3 and snapshot_runs(target) == ["run0", "run1", "run2"]
    kept = {table.current_snapshot().snapshot_id, previous_snapshot(table, target.name("__previous")).snapshot_id}
    orphan = next(s for s in table.snapshots() if s.snapshot_id not in kept)
    now = orphan.timestamp_ms / 1000
    retention = IcebergRetention(keep_days=5, keep_last=1, orphan_min_age_hours=72)
    assert snapshots_to_expire(table, retention, int((now + 4 * DAY) * 1000)) == []  # newer than 5 days
    assert snapshots_to_expire(table, retention, int((now + 6 * DAY) * 1000)) == [orphan.snapshot_id]
    assert snapshots_to_expire(table, IcebergRetention(keep_days=5, keep_last=3),
                               int((now + 6 * DAY) * 1000)) == [], "the last 3 are kept whatever their age"
    files = _snapshot_data_files(table, orphan.snapshot_id)
    # a clock 2 days on: expired (older than 1 day), but its files are 48 h old, under the 72 h orphan age
    done = expire_and_clean(table, IcebergRetention(keep_days=1, keep_last=1, orphan_min_age_hours=72), now + 2 * DAY)
    assert done["snapshots_expired"] == 1 and done["files_removed"] == 0 and files <= _files(_table(target))
    done = expire_and_clean(_table(target), retention, now + 4 * DAY)
    assert done["files_removed"] >= len(files) and not files & _files(_table(target))
    _check_nothing_referenced_is_gone(target)


def test_a_crashed_publishs_staged_files_are_removed_once_old_enough(runs, tmp_path: Path) -> None:
    target = Published("iceberg", tmp_path).target()
    publish_run(runs[0].run_dir, target)
    before = _files(_table(target))

    def crash() -> None:
        raise RuntimeError("killed after staging")

    with pytest.raises(RuntimeError, match="killed after staging"):
        publish_run(runs[1].run_dir, target, after_staging=crash)
    staged = _files(_table(target)) - before
    assert staged and not staged & referenced_files(_table(target))
    assert expire_and_clean(_table(target), IcebergRetention(), now=None)["files_removed"] == 0  # young
    import time

    assert expire_and_clean(_table(target), IcebergRetention(), now=time.time() + 3.5 * DAY)["files_removed"] >= len(staged)
    assert not staged & _files(_table(target))
    _check_nothing_referenced_is_gone(target)
    assert _fingerprints(_table(target)) == {"0" * 32}


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(st.sampled_from(["publish", "rollback"]), st.integers(0, 3),
                              st.floats(0, 3), st.integers(0, 3), st.sampled_from([0.0, 1.0, 72.0]),
                              st.floats(0, 8)), min_size=2, max_size=5))
def test_maintenance_never_deletes_a_referenced_file(runs, tmp_path_factory: pytest.TempPathFactory, ops) -> None:
    """Random publishes and rollbacks, each followed by maintenance under a random retention (days, last
    K, orphan age) and a clock moved up to 8 days on: nothing referenced is ever gone, the current
    snapshot holds the run it should, and the tagged one the run a rollback would restore."""
    import time

    target = Published("iceberg", tmp_path_factory.mktemp("ice")).target()
    live, previous = None, None
    for op, k, keep_days, keep_last, orphan_hours, shift_days in ops:
        if op == "publish":
            noop = publish_run(runs[k].run_dir, target)["noop"]
            assert noop == (k == live), "publishing the live run again is a no-op"
            if not noop:
                live, previous = k, live
        elif previous is not None:
            rollback(target)
            live, previous = previous, live
        if live is None:
            continue
        for suffix in TABLES:
            expire_and_clean(_table(target, suffix), IcebergRetention(keep_days, keep_last, orphan_hours),
                             now=time.time() + shift_days * DAY)
        _check_nothing_referenced_is_gone(target)
        table = _table(target)
        assert _fingerprints(table) == {f"{live}" * 32} and _dead_ids(target) == [f"r{live:04d}"]
        if previous is not None and previous != live:
            tagged = previous_snapshot(table, target.name("__previous"))
            assert _fingerprints(table, tagged.snapshot_id) == {f"{previous}" * 32}


def test_retention_settings_are_checked_naming_the_variable() -> None:
    assert IcebergRetention.from_env({}) == IcebergRetention(keep_days=5.0, keep_last=10, orphan_min_age_hours=72.0)
    assert IcebergRetention.from_env({KEEP_DAYS_ENV: "0.5", KEEP_LAST_ENV: "2", ORPHAN_AGE_ENV: " "}) == \
        IcebergRetention(keep_days=0.5, keep_last=2)
    for env, name in (({KEEP_DAYS_ENV: "soon"}, KEEP_DAYS_ENV), ({KEEP_LAST_ENV: "2.5"}, KEEP_LAST_ENV),
                      ({ORPHAN_AGE_ENV: "-1"}, "orphan_min_age_hours"), ({KEEP_DAYS_ENV: "inf"}, "keep_days")):
        with pytest.raises(ConfigError, match=name):
            IcebergRetention.from_env(env)


def test_a_broken_retention_setting_fails_the_plan_of_an_iceberg_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from batch_inference.params import RunConfig
    from batch_inference.publish.iceberg_backend import IcebergBackend

    monkeypatch.setenv(ORPHAN_AGE_ENV, "three days")
    with pytest.raises(ConfigError, match=ORPHAN_AGE_ENV):
        IcebergBackend.check_run_config(RunConfig(publish_backend="iceberg"))


def test_a_broken_retention_setting_fails_the_publish_before_any_commit(runs, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    target = Published("iceberg", tmp_path).target()
    publish_run(runs[0].run_dir, target)
    monkeypatch.setenv(KEEP_LAST_ENV, "-3")
    with pytest.raises(ConfigError, match=KEEP_LAST_ENV):
        publish_run(runs[1].run_dir, target)
    assert snapshot_runs(target) == ["run0"]
    assert os.environ[KEEP_LAST_ENV] == "-3"


def test_on_a_gs_warehouse_orphans_are_listed_and_deleted_through_the_projects_gcs_setup(
        gcs_bucket: str, tmp_path: Path) -> None:
    """The production layout: the warehouse on gs:// (the fake-gcs-server emulator) through
    ``StorageFileIO``; a replaced snapshot expired and its files deleted from the bucket, the current
    snapshot's files kept (object mtimes come from the store's listing)."""
    import time

    import pyarrow as pa
    from batch_contract import storage
    from batch_inference.publish.iceberg_backend import StorageFileIO
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.io import PY_IO_IMPL

    catalog = SqlCatalog("batch_inference", uri=f"sqlite:///{tmp_path / 'catalog.db'}",
                         warehouse=f"{gcs_bucket}/iceberg/warehouse",
                         **{PY_IO_IMPL: f"{StorageFileIO.__module__}.{StorageFileIO.__qualname__}"})
    catalog.create_namespace("ns")
    data = pa.table({"id": pa.array(["a", "b"]), "v": pa.array([1, 2], pa.int64())})
    table = catalog.create_table(("ns", "t"), schema=data.schema)
    table.append(data)
    first = table.current_snapshot()
    table.overwrite(pa.table({"id": pa.array(["c"]), "v": pa.array([3], pa.int64())}))
    gone = {f"gs://{fs_path(t.file.file_path)}" for t in table.scan(snapshot_id=first.snapshot_id).plan_files()}
    assert all(storage.exists(u) for u in gone)
    done = expire_and_clean(table, IcebergRetention(keep_days=0, keep_last=1, orphan_min_age_hours=0),
                            now=time.time() + 60)
    assert done["snapshots_expired"] >= 1 and done["files_removed"] >= len(gone)  # overwrite: delete + append
    table = catalog.load_table(("ns", "t"))
    assert not any(storage.exists(u) for u in gone)
    assert all(storage.exists(f"gs://{p}") for p in referenced_files(table))
    assert table.scan().to_arrow()["id"].to_pylist() == ["c"]
