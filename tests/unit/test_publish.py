"""Publish to DuckDB: coverage, de-duplication, dead letters, min_success_ratio, no-op rerun, rollback,
identifier validation. Runs are generated with :mod:`synthetic_runs` (``tests/synthetic_runs.py``) over
real ids from the bundled Debian sample."""

from __future__ import annotations

import json
import re
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from batch_contract import storage
from batch_contract.layout import PART_PREFIX, RunLayout, part_name
from batch_contract.partfiles import digest_of
from batch_contract.rows import duplicate_detail
from batch_contract.schemas import part_schema
from batch_inference.publish import CoverageError, PublishError, PublishTarget, publish_run, rollback
from batch_inference.publish.__main__ import main as cli_main
from publish_backends import BACKENDS, Published, snapshot_runs
from synthetic_runs import RunSpec, build_run, write_input, write_jsonl_input

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "data" / "sample" / "debian_descriptions_sample.parquet"
N_REAL = 300


@pytest.fixture(scope="module")
def real_ids() -> list[str]:
    col = pq.read_table(SAMPLE, columns=["id"]).column("id").cast(pa.string())
    return col.to_pylist()[:N_REAL]


@pytest.fixture
def input_path(tmp_path: Path, real_ids: list[str]) -> str:
    """Real ids plus a null id (row 300) and a repeat of row 3's id (row 301): 302 input rows."""
    return write_input(tmp_path / "input.parquet", real_ids + [None, real_ids[3]], row_group_rows=64)


@pytest.fixture(params=BACKENDS)
def pub(request: pytest.FixtureRequest, tmp_path: Path) -> Published:
    """The backend-agnostic tests run once per backend: its target and a reader of what it published."""
    return Published(request.param, tmp_path)


def _target(tmp_path: Path, table: str = "emb", schema: str | None = None) -> PublishTarget:
    return PublishTarget(backend="duckdb", table=table, schema=schema, duckdb_path=str(tmp_path / "w.duckdb"))


def _query(tmp_path: Path, sql: str) -> list[tuple]:
    con = duckdb.connect(str(tmp_path / "w.duckdb"), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def _tables(tmp_path: Path) -> set[str]:
    return {r[0] for r in _query(tmp_path, "SELECT table_name FROM duckdb_tables()")}


def test_published_table_uses_the_bounded_row_group_size(tmp_path: Path) -> None:
    from batch_inference.publish.duckdb_backend import TABLE_ROW_GROUP_ROWS

    n = TABLE_ROW_GROUP_ROWS + 5000
    inp = write_input(tmp_path / "input.parquet", [f"r{i}" for i in range(n)])
    layout = build_run(tmp_path / "out", "rg", inp, RunSpec(shards=1, chunk_rows=n, dim=4))
    assert publish_run(layout.run_dir, _target(tmp_path))["rows_published"] == n
    counts = _query(tmp_path, "SELECT row_group_id, max(start + count) - min(start) "
                              "FROM pragma_storage_info('batch_inference.emb') "
                              "WHERE column_name = 'id' AND segment_type = 'VARCHAR' GROUP BY 1 ORDER BY 1")
    assert len(counts) == 2 and counts[0][1] == TABLE_ROW_GROUP_ROWS


def test_full_coverage_publishes_every_row(pub: Published, tmp_path: Path, input_path: str, real_ids: list[str]) -> None:
    layout = build_run(tmp_path / "out", "run1", input_path, RunSpec(shards=3, chunk_rows=50, dead_rows={5}))
    summary = publish_run(layout.run_dir, pub.target())
    assert summary["noop"] is False
    assert (summary["rows_input"], summary["rows_published"], summary["rows_dead_letter"]) == (302, 299, 3)
    assert summary["rows_missing"] == 0 and summary["duplicates_removed"] == 0
    assert summary["success_ratio"] == 1.0 and summary["min_success_ratio"] == 1.0
    published = {r[0] for r in pub.query("SELECT id FROM batch_inference.emb")}
    assert published == set(real_ids) - {real_ids[5]}
    cols = dict(pub.query("SELECT column_name, data_type FROM duckdb_columns() WHERE table_name='emb'"))
    # Iceberg has no fixed-size list type: the embedding is list<float> there
    assert cols["embedding"] == ("FLOAT[8]" if pub.backend == "duckdb" else "FLOAT[]")
    # embedding values survive exactly (row 7: 7e-3 + j)
    emb = pub.query(f"SELECT embedding FROM batch_inference.emb WHERE id = '{real_ids[7]}'")[0][0]
    assert emb == pytest.approx([0.007 + j for j in range(8)], rel=1e-6)
    if pub.backend != "duckdb":
        return  # Iceberg tables have no primary key
    with pytest.raises(duckdb.ConstraintException):  # primary key on id is live
        duckdb.connect(str(tmp_path / "w.duckdb")).execute(
            f"INSERT INTO batch_inference.emb (id) VALUES ('{real_ids[0]}')")


def test_dead_letters_published_with_reasons(pub: Published, tmp_path: Path, input_path: str, real_ids: list[str]) -> None:
    layout = build_run(tmp_path / "out", "run1", input_path, RunSpec(shards=2, chunk_rows=64, dead_rows={5, 9}))
    publish_run(layout.run_dir, pub.target())
    rows = pub.query("SELECT id, reason, source_row FROM batch_inference.emb__dead_letters ORDER BY source_row")
    assert rows == [(real_ids[5], "empty_text", 5), (real_ids[9], "empty_text", 9), (None, "null_id", 300),
                    (real_ids[3], "duplicate_id", 301)]


def test_every_row_dead_lettered_never_swaps_in_an_empty_table(pub: Published, tmp_path: Path) -> None:
    path = write_input(tmp_path / "in.parquet", ["a", "b", "c"])
    good = build_run(tmp_path / "out", "good", path, RunSpec(shards=1))
    publish_run(good.run_dir, pub.target())
    bad = build_run(tmp_path / "out", "bad", path, RunSpec(shards=1, dead_rows={0, 1, 2}))
    with pytest.raises(CoverageError, match=r"^run bad: none of its 3 input row\(s\) has a result"):
        publish_run(bad.run_dir, pub.target())
    assert pub.query("SELECT count(*) FROM batch_inference.emb")[0][0] == 3


def test_missing_rows_fail_with_count_and_sample(pub: Published, tmp_path: Path, input_path: str, real_ids: list[str]) -> None:
    layout = build_run(tmp_path / "out", "run1", input_path, RunSpec(drop_rows={10, 11, 12, 300}))
    with pytest.raises(CoverageError, match=r"^run run1: 4 of 302 input row\(s\) have neither a result nor a "
                                            r"dead letter") as err:
        publish_run(layout.run_dir, pub.target())
    assert err.value.missing == 4
    assert set(err.value.sample) == {real_ids[10], real_ids[11], real_ids[12], f"{input_path}#300"}
    assert "4 of 302" in str(err.value)
    assert "emb" not in pub.tables()


def test_min_success_ratio_allows_missing_rows(pub: Published, tmp_path: Path, input_path: str) -> None:
    layout = build_run(tmp_path / "out", "run1", input_path, RunSpec(drop_rows={10, 11, 12}))
    with pytest.raises(CoverageError, match=r"^run run1: 3 of 302 input row\(s\) have neither .* "
                                            r"< min_success_ratio 0\.995\)"):
        publish_run(layout.run_dir, pub.target(), min_success_ratio=0.995)
    summary = publish_run(layout.run_dir, pub.target(), min_success_ratio=0.99)
    assert summary["rows_missing"] == 3
    assert summary["success_ratio"] == pytest.approx(299 / 302)
    assert summary["min_success_ratio"] == 0.99
    assert pub.query("SELECT count(*) FROM batch_inference.emb")[0][0] == 297


def test_duplicates_keep_row_of_first_sorted_part_file(pub: Published, tmp_path: Path, input_path: str) -> None:
    layout = build_run(tmp_path / "out", "run1", input_path,
                       RunSpec(shards=2, chunk_rows=40, duplicate_chunk=True))
    shard_dir = storage.local_path(layout.shard_dir("00000"))
    chunk0 = sorted(p for p in shard_dir.iterdir() if p.name.startswith("part-00000-"))
    assert len(chunk0) == 2
    first = pq.read_table(chunk0[0]).to_pylist()
    summary = publish_run(layout.run_dir, pub.target())
    assert summary["duplicates_removed"] == len(first)
    assert summary["rows_published"] == 300
    for row in first[:5]:
        got = pub.query(f"SELECT embedding FROM batch_inference.emb WHERE id = '{row['id']}'")[0][0]
        assert got == pytest.approx(row["embedding"])


def test_same_id_in_two_shards_dead_letters_the_higher_shard_row(pub: Published, tmp_path: Path, input_path: str,
                                                                    real_ids: list[str]) -> None:
    """Rows 3 (shard 00000) and 301 (shard 00001) share an id and the worker de-duplicates within a shard
    only, so both shards commit a result for it. Shard 00000's first chunk is also committed twice (a
    retried chunk). The retried copy is dropped silently; the shard-00001 row becomes a duplicate_id dead
    letter naming row 3 (the first valid row with the id); no input row is lost."""
    layout = build_run(tmp_path / "out", "run1", input_path,
                       RunSpec(shards=2, chunk_rows=40, duplicate_chunk=True, dedupe_per_shard=True))
    shard1 = storage.local_path(layout.shard_dir("00001"))
    assert real_ids[3] in {r for p in shard1.glob("part-*.parquet") for r in pq.read_table(p)["id"].to_pylist()}
    summary = publish_run(layout.run_dir, pub.target())
    assert (summary["rows_input"], summary["rows_published"], summary["rows_dead_letter"]) == (302, 300, 2)
    assert summary["rows_published"] + summary["rows_dead_letter"] == summary["rows_input"]
    assert summary["rows_missing"] == 0 and summary["success_ratio"] == 1.0
    assert summary["duplicates_removed"] == 40  # shard 00000's retried first chunk, same shard: silent
    assert summary["duplicate_ids_across_shards"] == 1
    dead = pub.query("SELECT id, reason, detail, source_uri, source_row, fingerprint "
                            "FROM batch_inference.emb__dead_letters ORDER BY source_row")
    assert [(d[0], d[1], d[4]) for d in dead] == [(None, "null_id", 300), (real_ids[3], "duplicate_id", 301)]
    assert dead[1][2] == duplicate_detail(input_path, 3), "names the winning row (row 3, shard 00000)"
    assert dead[1][3] == input_path and dead[1][5] == "f" * 32
    # the lowest shard's result is published (row 3's values, from the first sorted part file of the two)
    chunk0 = sorted(storage.local_path(layout.shard_dir("00000")).glob("part-00000-*.parquet"))
    kept = next(r for r in pq.read_table(chunk0[0]).to_pylist() if r["id"] == real_ids[3])
    emb = pub.query(f"SELECT embedding FROM batch_inference.emb WHERE id = '{real_ids[3]}'")[0][0]
    assert emb == pytest.approx(kept["embedding"])
    assert publish_run(layout.run_dir, pub.target())["noop"] is True


def test_dead_letter_in_lower_shard_is_kept_beside_result_of_same_id_in_higher_shard(pub: Published, tmp_path: Path, input_path: str, real_ids: list[str]) -> None:
    """Row 3 (shard 00000) is dead-lettered, row 301 (shard 00001, same id) gets a result: two input rows,
    one result and one dead letter (a dead letter is superseded only by a result in its own shard)."""
    layout = build_run(tmp_path / "out", "run1", input_path,
                       RunSpec(shards=2, chunk_rows=64, dead_rows={3}, dedupe_per_shard=True))
    summary = publish_run(layout.run_dir, pub.target())
    assert (summary["rows_published"], summary["rows_dead_letter"], summary["rows_missing"]) == (300, 2, 0)
    assert summary["duplicate_ids_across_shards"] == 0
    assert pub.query("SELECT id, reason, source_row FROM batch_inference.emb__dead_letters ORDER BY source_row") == [
        (real_ids[3], "empty_text", 3), (None, "null_id", 300)]


def test_repeated_id_with_a_lost_row_counts_as_missing(tmp_path: Path, input_path: str) -> None:
    """Coverage counts rows: row 301 repeats row 3's id; dropping it (no result, no dead letter) is a
    missing row even though the id itself has a result."""
    layout = build_run(tmp_path / "out", "run1", input_path, RunSpec(shards=2, chunk_rows=64, drop_rows={301}))
    with pytest.raises(CoverageError, match=r"^run run1: 1 of 302 input row\(s\) have neither a result nor a "
                                            r"dead letter") as err:
        publish_run(layout.run_dir, _target(tmp_path))
    assert err.value.missing == 1


def test_ids_outside_manifest_are_refused(tmp_path: Path, input_path: str) -> None:
    layout = build_run(tmp_path / "out", "run1", input_path, RunSpec())
    table = pq.read_table(next(storage.local_path(layout.shard_dir("00001")).glob("part-*.parquet")))
    foreign = table.slice(0, 1).set_column(0, "id", pa.array(["not-in-input"], pa.string()))
    pq.write_table(foreign.cast(part_schema("embedding", 8)),
                   storage.local_path(layout.shard_dir("00001")) / part_name(PART_PREFIX, 99))
    with pytest.raises(CoverageError, match=re.escape("run run1: 1 result/dead-letter id(s) are not in the "
                                                      "manifest's input rows (sample: ['not-in-input'])")) as err:
        publish_run(layout.run_dir, _target(tmp_path))
    assert err.value.unexpected == 1 and err.value.sample == ["not-in-input"]


def test_missing_marker_and_mixed_fingerprints_are_refused(tmp_path: Path, input_path: str) -> None:
    layout = build_run(tmp_path / "a", "run1", input_path, RunSpec(shards=3, skip_markers={"00001"}))
    with pytest.raises(PublishError, match="1 of 3 shard.*00001"):
        publish_run(layout.run_dir, _target(tmp_path))
    layout = build_run(tmp_path / "b", "run1", input_path, RunSpec(shards=3, stale_fingerprint_shards={"00002"}))
    with pytest.raises(PublishError, match="2 different fingerprints"):
        publish_run(layout.run_dir, _target(tmp_path))


def test_stale_rows_under_a_good_marker_are_set_aside_and_the_shard_reopened(tmp_path: Path, input_path: str) -> None:
    """A file the marker counted turns out to hold another fingerprint: it is quarantined, the shard's
    marker removed (the shard must run again) and publish refuses, naming the fingerprint."""
    layout = build_run(tmp_path / "out", "run1", input_path, RunSpec(shards=2))
    path = next(storage.local_path(layout.shard_dir("00000")).glob("part-*.parquet"))
    table = pq.read_table(path)
    stale = table.set_column(1, "fingerprint", pa.array(["0" * 32] * table.num_rows, pa.string()))
    path.unlink()
    pq.write_table(stale.cast(table.schema), path)
    marker = json.loads(storage.read_bytes(layout.marker_uri("00000")))
    marker["files"][path.name] = digest_of(path.read_bytes())  # committed like this, by another fingerprint
    storage.write_replace(layout.marker_uri("00000"), json.dumps(marker).encode())
    with pytest.raises(PublishError, match="fingerprint '0{32}'.*run those shards again"):
        publish_run(layout.run_dir, _target(tmp_path))
    assert not path.exists() and (path.parent / "quarantine" / path.name).exists()
    assert not storage.exists(layout.marker_uri("00000")) and storage.exists(layout.marker_uri("00001"))


def _truncate(path: Path, keep: float) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


@pytest.mark.parametrize("table", ["emb", "emb_new"], ids=["published_table_noop_check", "new_table"])
@pytest.mark.parametrize("keep", [0.0, 0.5, 0.999])
def test_torn_counted_part_file_is_quarantined_before_any_publish(pub: Published, tmp_path: Path, input_path: str,
                                                                   keep: float, table: str) -> None:
    """A part file truncated after its shard completed (any length) never reaches DuckDB: publish to the
    already-published table (whose no-op check used to compare file names only) and to a new table
    both refuse with a clear error; the file is set aside and the shard reopened."""
    layout = build_run(tmp_path / "out", "run1", input_path, RunSpec(shards=2))
    assert publish_run(layout.run_dir, pub.target())["noop"] is False
    path = sorted(storage.local_path(layout.shard_dir("00001")).glob("part-*.parquet"))[0]
    _truncate(path, keep)
    with pytest.raises(PublishError, match=r"00001 cannot be published.*run those shards again"):
        publish_run(layout.run_dir, pub.target(table=table))
    assert (path.parent / "quarantine" / path.name).exists() and not path.exists()
    assert not storage.exists(layout.marker_uri("00001")) and storage.exists(layout.marker_uri("00000"))
    with pytest.raises(PublishError, match="no completion marker: 00001"):
        publish_run(layout.run_dir, pub.target(table=table))
    assert pub.query("SELECT count(*) FROM batch_inference.emb")[0][0] == 300, "the live table is untouched"


def test_noop_check_compares_sizes_and_recorded_digests_not_names(pub: Published, tmp_path: Path, input_path: str) -> None:
    """Same file names, other content (a file rewritten with the same name): not a no-op."""
    layout = build_run(tmp_path / "out", "run1", input_path, RunSpec(shards=1))
    assert publish_run(layout.run_dir, pub.target())["noop"] is False
    assert publish_run(layout.run_dir, pub.target())["noop"] is True
    marker_uri = layout.marker_uri("00000")
    marker = json.loads(storage.read_bytes(marker_uri))
    name = sorted(marker["files"])[0]
    marker["files"][name]["sha256"] = "0" * 64  # as if the file had been re-committed with other bytes
    storage.write_replace(marker_uri, json.dumps(marker).encode())
    assert publish_run(layout.run_dir, pub.target())["noop"] is False


def test_leftover_unreadable_file_not_counted_by_the_marker_is_set_aside(tmp_path: Path, input_path: str) -> None:
    layout = build_run(tmp_path / "out", "run1", input_path, RunSpec(shards=1))
    stray = storage.local_path(layout.shard_dir("00000")) / part_name(PART_PREFIX, 99)
    stray.write_bytes(b"PAR1 torn")
    summary = publish_run(layout.run_dir, _target(tmp_path))
    assert summary["files_quarantined"] == 1 and summary["rows_missing"] == 0
    assert (stray.parent / "quarantine" / stray.name).exists()


def test_rerun_is_noop_and_rollback_restores_previous(pub: Published, tmp_path: Path, input_path: str) -> None:
    target = pub.target(schema="analytics")
    run1 = build_run(tmp_path / "out", "run1", input_path, RunSpec(dead_rows={1}))
    run2 = build_run(tmp_path / "out", "run2", input_path,
                     RunSpec(fingerprint="a" * 32, version=1.0, dead_rows={1, 2, 3}))
    with pytest.raises(PublishError, match="no emb__previous"):
        rollback(target)
    publish_run(run1.run_dir, target)
    again = publish_run(run1.run_dir, target)
    assert again["noop"] is True and again["rows_published"] == 299
    assert pub.query("SELECT count(*) FROM analytics.emb__publish_log")[0][0] == 1

    publish_run(run2.run_dir, target)
    # rows 1-3 are dead letters; row 301 repeats row 3's id and wins it (row 3 is dead on its own)
    assert pub.query("SELECT count(*), min(fingerprint) FROM analytics.emb")[0] == (298, "a" * 32)
    assert pub.query("SELECT count(*) FROM analytics.emb__previous")[0][0] == 299

    back = rollback(target)
    assert (back["restored_run_id"], back["replaced_run_id"]) == ("run1", "run2")
    assert pub.query("SELECT count(*), min(fingerprint) FROM analytics.emb")[0] == (299, "f" * 32)
    assert pub.query("SELECT count(*) FROM analytics.emb__dead_letters")[0][0] == 3
    # after a rollback, publishing run1 again is a no-op and run2 is one rollback away
    assert publish_run(run1.run_dir, target)["noop"] is True
    assert rollback(target)["restored_run_id"] == "run2"
    actions = pub.query("SELECT action, run_id FROM analytics.emb__publish_log ORDER BY logged_at, rowid")
    assert actions == [("publish", "run1"), ("publish", "run2"), ("rollback", "run1"), ("rollback", "run2")]


def test_crash_after_staging_leaves_live_table_and_rerun_completes(pub: Published, tmp_path: Path, input_path: str) -> None:
    target = pub.target()
    run1 = build_run(tmp_path / "out", "run1", input_path, RunSpec())
    run2 = build_run(tmp_path / "out", "run2", input_path, RunSpec(fingerprint="a" * 32, dead_rows={1}))
    publish_run(run1.run_dir, target)

    def crash() -> None:
        raise KeyboardInterrupt("injected after staging")

    with pytest.raises(KeyboardInterrupt):
        publish_run(run2.run_dir, target, after_staging=crash)
    assert pub.query("SELECT min(fingerprint), count(*) FROM batch_inference.emb")[0] == ("f" * 32, 300)
    if pub.backend == "duckdb":
        assert "emb__staging" in pub.tables()
    else:  # the staged data files are in no snapshot: the live snapshot is still run1's
        assert snapshot_runs(target) == ["run1"]
    summary = publish_run(run2.run_dir, target)
    assert summary["noop"] is False and summary["rows_published"] == 299
    assert "emb__staging" not in pub.tables()
    assert pub.query("SELECT min(fingerprint), count(*) FROM batch_inference.emb")[0] == ("a" * 32, 299)


@pytest.mark.parametrize("task", ["classification", "llm"])
def test_other_part_schemas_publish_their_columns(pub: Published, tmp_path: Path, input_path: str, task: str) -> None:
    layout = build_run(tmp_path / "out", "run1", input_path, RunSpec(task=task, chunk_rows=70))
    publish_run(layout.run_dir, pub.target())
    cols = [r[0] for r in pub.query("SELECT column_name FROM duckdb_columns() WHERE table_name='emb' "
                                           "ORDER BY column_index")]
    assert cols == [f.name for f in part_schema(task)]
    if task == "llm":
        text, js, cached = pub.query("SELECT output_text, output_json, cached_tokens FROM batch_inference.emb "
                                            "ORDER BY id LIMIT 1")[0]
        assert "\ttab\nnewline \\ back" in text and js is not None and cached is None


def test_jsonl_input_with_integer_ids(pub: Published, tmp_path: Path) -> None:
    ids: list[int | None] = list(range(1000, 1080)) + [None, 1005]
    path = write_jsonl_input(tmp_path / "input.jsonl", ids)
    layout = build_run(tmp_path / "out", "run1", path, RunSpec(shards=3, chunk_rows=16))
    summary = publish_run(layout.run_dir, pub.target())
    assert (summary["rows_input"], summary["rows_published"], summary["rows_dead_letter"]) == (82, 80, 2)
    assert pub.query("SELECT min(id), max(id) FROM batch_inference.emb")[0] == ("1000", "1079")


def test_partial_manifest_over_integer_parquet_ids(tmp_path: Path) -> None:
    path = write_input(tmp_path / "ints.parquet", pa.array(range(500), pa.int64()), row_group_rows=50)
    layout = build_run(tmp_path / "out", "run1", path, RunSpec(shards=2, row_limit=123))
    summary = publish_run(layout.run_dir, _target(tmp_path))
    assert (summary["rows_input"], summary["rows_published"]) == (123, 123)
    assert _query(tmp_path, "SELECT max(CAST(id AS INTEGER)) FROM batch_inference.emb")[0][0] == 122


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("table", 'emb"; DROP TABLE emb; --'),
        ("table", "emb; DROP TABLE x"),
        ("table", "Emb"),
        ("table", "1emb"),
        ("table", ""),
        ("table", "a" * 40),
        ("table", "emb__previous"),
        ("table", "emb name"),
        ("table", "emb\n"),
        ("schema", "public\n"),
        ("schema", "public.emb"),
        ("schema", "x' OR '1'='1"),
        ("schema", "temp"),
        ("schema", "system"),
        ("schema", "batch_inference_publish"),
    ],
)
def test_identifier_injection_rejected(tmp_path: Path, field: str, value: str) -> None:
    kwargs = {"backend": "duckdb", "table": "emb", "duckdb_path": str(tmp_path / "w.duckdb"), field: value}
    with pytest.raises(ValueError, match=f"^{field}:"):
        PublishTarget(**kwargs)


def test_schema_named_memory_publishes_and_spills_beside_the_database(
    tmp_path: Path, input_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from batch_inference.publish import duckdb_backend

    layout = build_run(tmp_path / "out", "run1", input_path, RunSpec(shards=2, chunk_rows=50))
    monkeypatch.chdir("/proc")  # a read-only working directory: nothing may be written under it
    target = _target(tmp_path, schema="memory")
    con = duckdb_backend.connect(target)
    try:
        temp_dir = con.execute("SELECT current_setting('temp_directory')").fetchall()[0][0]
    finally:
        con.close()
    assert temp_dir == str(tmp_path / "w.duckdb") + ".tmp"
    assert publish_run(layout.run_dir, target)["rows_published"] == 300
    assert _query(tmp_path, 'SELECT count(*) FROM "memory"."emb"') == [(300,)]


def test_target_requires_backend_settings() -> None:
    with pytest.raises(ValueError, match="^backend:"):
        PublishTarget(backend="sqlite", table="emb", duckdb_path="x")
    with pytest.raises(ValueError, match="^duckdb_path:"):
        PublishTarget(backend="duckdb", table="emb")
    with pytest.raises(ValueError, match="^dsn:"):
        PublishTarget(backend="postgres", table="emb")


def test_min_success_ratio_is_validated(tmp_path: Path, input_path: str) -> None:
    layout = build_run(tmp_path / "out", "run1", input_path, RunSpec())
    with pytest.raises(ValueError, match="min_success_ratio"):
        publish_run(layout.run_dir, _target(tmp_path), min_success_ratio=0.0)


def test_cli_publish_and_rollback(tmp_path: Path, input_path: str, capsys: pytest.CaptureFixture[str]) -> None:
    run1 = build_run(tmp_path / "out", "run1", input_path, RunSpec())
    run2 = build_run(tmp_path / "out", "run2", input_path, RunSpec(fingerprint="b" * 32))
    db = str(tmp_path / "w.duckdb")
    for run in (run1, run2):
        assert cli_main(["publish", "--run-dir", run.run_dir, "--duckdb-path", db, "--table", "emb"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["run_id"] == "run2"
    assert cli_main(["rollback", "--duckdb-path", db, "--table", "emb"]) == 0
    assert json.loads(capsys.readouterr().out)["restored_run_id"] == "run1"
    assert cli_main(["publish", "--run-dir", run1.run_dir, "--duckdb-path", db, "--table", "bad;name"]) == 2
    missing = RunLayout(str(tmp_path / "out"), "nope").run_dir
    assert cli_main(["publish", "--run-dir", missing, "--duckdb-path", db, "--table", "emb"]) == 1
    assert "no manifest" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["emb", "_x1", "a" * 39, "a" * 40, "Emb", "9a", "a-b", "é"])
def test_table_name_pattern_matches_target_validation(tmp_path: Path, name: str) -> None:
    import re

    from batch_inference.publish.target import TABLE_NAME_PATTERN

    try:
        PublishTarget(backend="duckdb", table=name, duckdb_path=str(tmp_path / "w.duckdb"))
        accepted = True
    except ValueError:
        accepted = False
    assert accepted == bool(re.match(TABLE_NAME_PATTERN, name))


def test_republish_after_missing_rows_are_committed(pub: Published, tmp_path: Path, input_path: str) -> None:
    target = pub.target()
    partial = build_run(tmp_path / "a", "run1", input_path, RunSpec(shards=2, chunk_rows=50, drop_rows={10, 11}))
    complete = build_run(tmp_path / "b", "run1", input_path, RunSpec(shards=2, chunk_rows=50))
    first = publish_run(partial.run_dir, target, min_success_ratio=0.99)
    assert first["rows_missing"] == 2
    assert publish_run(partial.run_dir, target, min_success_ratio=0.99)["noop"] is True
    # the missing rows get committed later (a re-run chunk): the file set changes, so publish runs again
    redo = next(storage.local_path(complete.shard_dir("00000")).glob("part-00000-*.parquet"))
    dest = storage.local_path(partial.shard_dir("00000")) / part_name(PART_PREFIX, 0)
    dest.write_bytes(redo.read_bytes())
    second = publish_run(partial.run_dir, target)
    assert second["noop"] is False and second["rows_missing"] == 0 and second["rows_published"] == 300
    assert second["duplicates_removed"] == 48
    assert publish_run(partial.run_dir, target)["noop"] is True
