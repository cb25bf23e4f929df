"""Publish into a real PostgreSQL server: types, dedup, no-op rerun, rollback, readers during the swap,
and a crash (process exit) after the staging load."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from batch_contract import storage
from batch_contract.partfiles import digest_of
from batch_inference.publish import CoverageError, PublishTarget, publish_run, rollback
from batch_inference.publish.__main__ import main as cli_main
from pg_fixture import pg_dsn  # noqa: F401  (module-scoped server fixture)
from synthetic_runs import RunSpec, build_run, write_input

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "data" / "sample" / "debian_descriptions_sample.parquet"


@pytest.fixture(scope="module")
def input_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """400 real ids from the Debian sample, a null id and a repeated id: 402 input rows."""
    ids = pq.read_table(SAMPLE, columns=["id"]).column("id").cast(pa.string()).to_pylist()[:400]
    return write_input(tmp_path_factory.mktemp("pg-input") / "input.parquet", ids + [None, ids[0]],
                       row_group_rows=100)


def _q(dsn: str, sql: str) -> list[tuple]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(sql).fetchall()


@pytest.mark.parametrize("task", ["embedding", "classification", "llm"])
def test_publish_all_part_schemas(pg_dsn: str, input_path: str, tmp_path: Path, task: str) -> None:  # noqa: F811
    layout = build_run(tmp_path / "out", f"run-{task}", input_path,
                       RunSpec(task=task, dim=16, shards=3, chunk_rows=64, dead_rows={7}, duplicate_chunk=True))
    target = PublishTarget(backend="postgres", table=f"t_{task}", schema="pub", dsn=pg_dsn)
    summary = publish_run(layout.run_dir, target)
    assert (summary["rows_published"], summary["rows_dead_letter"], summary["rows_missing"]) == (399, 3, 0)
    assert summary["duplicates_removed"] == 63  # chunk 0 of shard 0: 64 rows, row 7 dead-lettered
    # every published row equals the row of the first-sorted part file holding its id
    expected: dict[str, dict] = {}
    for shard in ("00000", "00001", "00002"):
        for path in sorted(storage.local_path(layout.shard_dir(shard)).glob("part-*.parquet")):
            for row in pq.read_table(path).to_pylist():
                expected.setdefault(row["id"], row)
    with psycopg.connect(pg_dsn) as conn:
        cur = conn.execute(f"SELECT * FROM pub.t_{task}")
        names = [d.name for d in cur.description]
        got = {r[0]: dict(zip(names, r, strict=True)) for r in cur.fetchall()}
        pk = conn.execute("SELECT count(*) FROM pg_index WHERE indrelid = %s::regclass AND indisprimary",
                          [f"pub.t_{task}"]).fetchone()[0]
    assert pk == 1
    assert got.keys() == expected.keys()
    for rid, row in list(expected.items())[:50]:
        for col, value in row.items():
            if isinstance(value, float) or col == "embedding":
                assert got[rid][col] == pytest.approx(value, rel=1e-7), col
            else:
                assert got[rid][col] == value, col
    if task == "embedding":
        assert _q(pg_dsn, "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = "
                          "'pub.t_embedding'::regclass AND attname = 'embedding'")[0][0] == "real[]"
    dead = _q(pg_dsn, f"SELECT id, reason, source_row FROM pub.t_{task}__dead_letters ORDER BY source_row")
    assert [(r[1], r[2]) for r in dead] == [("empty_text", 7), ("null_id", 400), ("duplicate_id", 401)]


def test_noop_rollback_and_quoted_reserved_names(pg_dsn: str, input_path: str, tmp_path: Path) -> None:  # noqa: F811
    target = PublishTarget(backend="postgres", table="select", schema="order", dsn=pg_dsn)
    run1 = build_run(tmp_path / "out", "run1", input_path, RunSpec())
    run2 = build_run(tmp_path / "out", "run2", input_path, RunSpec(fingerprint="c" * 32, dead_rows={1, 2}))
    assert publish_run(run1.run_dir, target)["noop"] is False
    assert publish_run(run1.run_dir, target)["noop"] is True
    publish_run(run2.run_dir, target)
    assert _q(pg_dsn, 'SELECT count(*), min(fingerprint) FROM "order"."select"')[0] == (398, "c" * 32)
    back = rollback(target)
    assert (back["restored_run_id"], back["replaced_run_id"]) == ("run1", "run2")
    assert _q(pg_dsn, 'SELECT count(*), min(fingerprint) FROM "order"."select"')[0] == (400, "f" * 32)
    assert _q(pg_dsn, 'SELECT count(*) FROM "order"."select__dead_letters"')[0][0] == 2
    log = _q(pg_dsn, 'SELECT action, run_id FROM "order"."select__publish_log" ORDER BY logged_at, ctid')
    assert log == [("publish", "run1"), ("publish", "run2"), ("rollback", "run1")]


def test_missing_rows_never_reach_postgres(pg_dsn: str, input_path: str, tmp_path: Path) -> None:  # noqa: F811
    target = PublishTarget(backend="postgres", table="gaps", dsn=pg_dsn)
    layout = build_run(tmp_path / "out", "run1", input_path, RunSpec(drop_rows={3, 4}))
    with pytest.raises(CoverageError, match=r"^run run1: 2 of 402 input row\(s\) have neither a result nor a "
                                            r"dead letter") as err:
        publish_run(layout.run_dir, target)
    assert err.value.missing == 2
    assert _q(pg_dsn, f"SELECT to_regclass('{target.qualified()}') IS NULL, "
                      f"to_regclass('{target.qualified('__staging')}') IS NULL")[0] == (True, True)


def test_readers_never_see_a_missing_table_or_mixed_versions(
    pg_dsn: str, input_path: str, tmp_path: Path  # noqa: F811
) -> None:
    target = PublishTarget(backend="postgres", table="live", dsn=pg_dsn)
    runs = [
        build_run(tmp_path / "out", "v1", input_path, RunSpec(fingerprint="1" * 32, dim=64)),
        build_run(tmp_path / "out", "v2", input_path, RunSpec(fingerprint="2" * 32, dim=64, dead_rows={5, 6, 7})),
    ]
    versions = {("1" * 32, 400, 2), ("2" * 32, 397, 5)}
    publish_run(runs[0].run_dir, target)
    seen: list[tuple] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def reader() -> None:
        try:
            with psycopg.connect(pg_dsn, autocommit=True) as conn:
                while not stop.is_set():
                    seen.append(conn.execute(
                        "SELECT (SELECT min(fingerprint) || max(fingerprint) FROM batch_inference.live), "
                        "(SELECT count(*) FROM batch_inference.live), "
                        "(SELECT count(*) FROM batch_inference.live__dead_letters)").fetchone())
        except BaseException as exc:  # a missing table raises UndefinedTable here
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for i in range(4):  # v2, v1 (new run ids so none is a no-op), v2, v1
            run = build_run(tmp_path / f"re{i}", f"v{i % 2 + 2}-{i}", input_path,
                            RunSpec(fingerprint=("2" if i % 2 == 0 else "1") * 32, dim=64,
                                    dead_rows={5, 6, 7} if i % 2 == 0 else set()))
            publish_run(run.run_dir, target)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert not errors, errors
    assert seen
    print(f"reader observations: {len(seen)}, distinct: {sorted(set(seen))}")
    for fps, n, n_dead in seen:
        assert fps[:32] == fps[32:], "mixed fingerprints in one table"
        assert (fps[:32], n, n_dead) in versions
    assert (seen[-1][0][:32], seen[-1][1]) == ("1" * 32, 400)


CRASH_CHILD = """
import os, sys
sys.path.insert(0, {plugins!r})
from batch_inference.publish import PublishTarget, publish_run
target = PublishTarget(backend="postgres", table="crashy", dsn={dsn!r})
publish_run({run_dir!r}, target, after_staging=lambda: os._exit(17))
"""


def test_crash_after_staging_keeps_old_table_and_rerun_completes(
    pg_dsn: str, input_path: str, tmp_path: Path  # noqa: F811
) -> None:
    target = PublishTarget(backend="postgres", table="crashy", dsn=pg_dsn)
    run1 = build_run(tmp_path / "out", "run1", input_path, RunSpec())
    run2 = build_run(tmp_path / "out", "run2", input_path, RunSpec(fingerprint="9" * 32, dead_rows={0}))
    publish_run(run1.run_dir, target)
    code = CRASH_CHILD.format(plugins=str(REPO / "plugins"), dsn=pg_dsn, run_dir=run2.run_dir)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO / "plugins")})
    assert proc.returncode == 17, proc.stderr
    assert _q(pg_dsn, "SELECT count(*), min(fingerprint) FROM batch_inference.crashy")[0] == (400, "f" * 32)
    assert _q(pg_dsn, "SELECT count(*) FROM batch_inference.crashy__staging")[0][0] == 400  # staged, never swapped (row 0 is dead, row 401 repeats its id and wins)
    summary = publish_run(run2.run_dir, target)
    assert summary["noop"] is False
    assert _q(pg_dsn, "SELECT count(*), min(fingerprint) FROM batch_inference.crashy")[0] == (400, "9" * 32)
    assert _q(pg_dsn, "SELECT to_regclass('batch_inference.crashy__staging') IS NULL")[0][0] is True


def test_cli_against_postgres(pg_dsn: str, input_path: str, tmp_path: Path,  # noqa: F811
                              capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    layout = build_run(tmp_path / "out", "run1", input_path, RunSpec(task="classification"))
    monkeypatch.setenv("BATCH_PUBLISH_DSN", pg_dsn)
    args = ["publish", "--backend", "postgres", "--table", "cli_t", "--run-dir", layout.run_dir]
    assert cli_main(args) == 0
    assert json.loads(capsys.readouterr().out)["rows_published"] == 400
    assert cli_main(["rollback", "--backend", "postgres", "--table", "cli_t"]) == 1
    assert "no cli_t__previous" in capsys.readouterr().err


def test_copy_error_in_a_worker_fails_cleanly(pg_dsn: str, input_path: str, tmp_path: Path) -> None:  # noqa: F811
    target = PublishTarget(backend="postgres", table="nul_text", dsn=pg_dsn)
    good = build_run(tmp_path / "good", "run1", input_path, RunSpec(task="classification"))
    publish_run(good.run_dir, target)
    bad = build_run(tmp_path / "bad", "run2", input_path, RunSpec(task="classification", fingerprint="b" * 32))
    path = next(storage.local_path(bad.shard_dir("00001")).glob("part-*.parquet"))
    table = pq.read_table(path)
    labels = table.column("label").to_pylist()
    labels[0] = "bad\x00label"  # PostgreSQL text cannot hold NUL: the COPY connection fails
    broken = table.set_column(table.schema.get_field_index("label"), "label", pa.array(labels, pa.string()))
    path.unlink()
    pq.write_table(broken, path)
    marker = json.loads(storage.read_bytes(bad.marker_uri("00001")))
    marker["files"][path.name] = digest_of(path.read_bytes())  # as if committed like this
    storage.write_replace(bad.marker_uri("00001"), json.dumps(marker).encode())
    with pytest.raises(psycopg.Error):
        publish_run(bad.run_dir, target)
    assert _q(pg_dsn, "SELECT count(*), min(fingerprint) FROM batch_inference.nul_text")[0] == (400, "f" * 32)


def test_read_rows_returns_the_published_rows_for_the_asked_ids(pg_dsn: str, input_path: str,  # noqa: F811
                                                                tmp_path: Path) -> None:
    """What the upgrade check reads (``read_published``): the live table's record and the rows of the asked
    ids only (unknown ids left out), embeddings as float32 lists equal to the published ones, and
    ``(None, None)`` before any publish."""
    from batch_inference.publish.backend import read_published

    target = PublishTarget(backend="postgres", table="t_read", schema="pub", dsn=pg_dsn)
    assert read_published(target, ["x"], ["embedding"]) == (None, None)
    layout = build_run(tmp_path / "out", "run-read", input_path, RunSpec(task="embedding", dim=16, shards=2))
    publish_run(layout.run_dir, target)
    with psycopg.connect(pg_dsn) as conn:
        want = dict(conn.execute("SELECT id, embedding FROM pub.t_read ORDER BY id LIMIT 5").fetchall())
    record, rows = read_published(target, [*want, "no-such-id"], ["embedding", "no_such_column"])
    assert record is not None and record.run_id == "run-read"
    assert rows.column_names == ["id", "embedding"] and rows.schema.field("embedding").type == pa.list_(pa.float32())
    got = dict(zip(rows.column("id").to_pylist(), rows.column("embedding").to_pylist(), strict=True))
    assert got.keys() == want.keys()
    for rid, vec in want.items():
        assert got[rid] == pytest.approx(vec, rel=1e-7)


def test_registry_marks_exactly_the_tables_publish_made(pg_dsn: str, input_path: str, tmp_path: Path) -> None:  # noqa: F811
    """Every table of the target is in publish's registry by OID (through swaps, rollback and a crashed
    publish's staging), and nothing else; ``check_target`` creates no schema."""
    from batch_inference.publish import check_target
    from batch_inference.publish.target import REGISTRY_TABLE

    target = PublishTarget(backend="postgres", table="marked", schema="owned", dsn=pg_dsn)
    check_target(target)
    assert _q(pg_dsn, "SELECT count(*) FROM pg_namespace WHERE nspname = 'owned'")[0][0] == 0

    def marked() -> tuple[set[str], set[str]]:
        tables = {r[0] for r in _q(pg_dsn, "SELECT tablename FROM pg_tables WHERE schemaname = 'owned'")}
        registry = {r[0] for r in _q(pg_dsn, f'SELECT c.relname FROM owned."{REGISTRY_TABLE}" r '
                                             "JOIN pg_class c ON c.oid = r.relid")}
        return tables - {REGISTRY_TABLE}, registry

    run1 = build_run(tmp_path / "out", "run1", input_path, RunSpec())
    run2 = build_run(tmp_path / "out", "run2", input_path, RunSpec(fingerprint="d" * 32))
    publish_run(run1.run_dir, target)
    tables, registry = marked()
    assert tables == registry == {"marked", "marked__dead_letters", "marked__publish_log"}
    publish_run(run2.run_dir, target)
    rollback(target)
    family = {"marked", "marked__previous", "marked__dead_letters", "marked__dead_letters__previous",
              "marked__publish_log"}
    assert marked() == (family, family)

    def crash() -> None:
        raise RuntimeError("after staging")

    with pytest.raises(RuntimeError, match="after staging"):
        publish_run(run2.run_dir, target, after_staging=crash)
    staged = family | {"marked__staging", "marked__dead_letters__staging"}
    assert marked() == (staged, staged)
    assert publish_run(run2.run_dir, target)["noop"] is False
    assert marked() == (family, family)
    check_target(target)
