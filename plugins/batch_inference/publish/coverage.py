"""Coverage check and de-duplication, computed in DuckDB over the committed files of a run.

Set logic runs in DuckDB (which spills to disk), not in Python sets, so it scales to tens of millions of
ids. Only key columns are read for the checks (``id``, ``fingerprint``, file name, row number); the wide
columns (embeddings) are read once, when the staging table is loaded, through :meth:`Coverage.results_sql`.

De-duplication (deterministic, independent of shard boundaries):

* Result rows of the same id in the same shard are one input row committed twice (a chunk re-done after
  a lost commit reply; the worker gives an id one result per shard): the first by part file name and
  row number is kept, the others are dropped silently and counted in ``duplicates_removed``.
* Ids on several input rows follow the contract's duplicate rule (:mod:`batch_contract.rows`): the
  first row in input order that is not dead-lettered for a reason of its own wins; results of that id
  from other shards are dropped (counted in ``duplicate_ids_across_shards``) and every other such row
  is one ``duplicate_id`` dead letter naming the winner (``file#row``), whichever shard it was in.
* Dead letters are de-duplicated by ``(source_uri, source_row)`` the same way; an engine's dead letter
  (``too_long``, ``invalid_output``, ...) whose id also has a result in the same shard is superseded by
  that result.

Coverage counts input rows, not ids: an id occurring ``n`` times in the input needs ``n`` rows between its
result (at most one) and its dead letters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
from batch_contract import storage
from batch_contract.enums import DeadLetterReason, InputFormat
from batch_contract.rows import DUPLICATE_DETAIL_TAIL, ROW_REASONS
from batch_contract.schemas import DEAD_LETTER_SCHEMA

from batch_inference.publish.errors import CoverageError, PublishError
from batch_inference.publish.expected import (
    ID_BATCH_SCHEMA,
    NULL_ROW_SCHEMA,
    check_id_type,
    iter_expected,
    merged_ranges,
)
from batch_inference.publish.inventory import RunInventory

SAMPLE_SIZE = 10
_OWN_REASONS = sorted(r.value for r in ROW_REASONS)
HIDDEN_COLUMNS = ("filename", "file_row_number")


@dataclass(frozen=True)
class Coverage:
    """Outcome of the coverage check of one run (all counts are rows).

    Attributes:
        rows_input: rows the manifest assigns to the run's shards.
        rows_published: result rows after de-duplication (one per id).
        rows_dead_letter: dead-letter rows after de-duplication.
        rows_missing: input rows with neither a result nor a dead letter.
        duplicates_removed: result rows dropped as duplicates of an id within a shard (retried chunks),
            plus dead letters dropped as duplicates or superseded by a result.
        missing_sample: up to 10 missing ids (``<source_uri>#<row>`` for null ids).
        part_files / dead_letter_files: local paths of the files read.
        columns: ``(name, duckdb_type)`` of the published result columns, in file order.
        duplicate_ids_across_shards: input rows with a result whose id's winning row (the contract's
            duplicate rule) lies in another shard: their result is not published, they are
            ``duplicate_id`` dead letters (counted in ``rows_dead_letter``).
        dead_letter_reasons: published dead letters by reason code (sums to ``rows_dead_letter``).
    """

    rows_input: int
    rows_published: int
    rows_dead_letter: int
    rows_missing: int
    duplicates_removed: int
    missing_sample: list[str]
    part_files: list[str]
    dead_letter_files: list[str]
    columns: list[tuple[str, str]]
    duplicate_ids_across_shards: int = 0
    dead_letter_reasons: dict[str, int] = field(default_factory=dict)

    @property
    def success_ratio(self) -> float:
        """Fraction of input rows covered by a result or a dead letter (1.0 for an empty run)."""
        if self.rows_input == 0:
            return 1.0
        return (self.rows_input - self.rows_missing) / self.rows_input

    def results_sql(self) -> str:
        """SELECT over the part files giving one row per id (needs ``$parts`` bound to
        :attr:`part_files`). Empty result set when the run has no part files."""
        cols = ", ".join(f"CAST(p.{_q(n)} AS {t}) AS {_q(n)}" for n, t in self.columns)
        if not self.part_files:
            return f"SELECT {cols} FROM _pub_empty_results p"
        if self.duplicates_removed == 0 and self.duplicate_ids_across_shards == 0:
            return f"SELECT {cols} FROM read_parquet($parts, union_by_name=true) p"
        scan = "read_parquet($parts, filename=true, file_row_number=true, union_by_name=true)"
        return (
            f"SELECT {cols} FROM {scan} p ANTI JOIN _pub_drop d "
            "ON d.filename = p.filename AND d.file_row_number = p.file_row_number"
        )

    def dead_letters_sql(self) -> str:
        """SELECT over the de-duplicated dead letters (columns of ``DEAD_LETTER_SCHEMA``)."""
        return f"SELECT {', '.join(_q(f.name) for f in DEAD_LETTER_SCHEMA)} FROM _pub_dead WHERE keep"


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _load_expected(con: duckdb.DuckDBPyConnection, inv: RunInventory) -> None:
    """Expected ids (one row per input row, with its position) into ``_pub_expected``, null-id positions
    into ``_pub_expected_null``, the input files into ``_pub_input_files`` and the shards' segments into
    ``_pub_segments``.

    Local Parquet inputs are read by DuckDB itself (id column only, row ranges filtered on
    ``file_row_number``); JSONL and ``gs://`` inputs stream through :func:`iter_expected`.
    """
    con.execute("CREATE OR REPLACE TEMP TABLE _pub_expected (id VARCHAR, file_index INTEGER, source_row BIGINT)")
    con.execute("CREATE OR REPLACE TEMP TABLE _pub_expected_null (source_uri VARCHAR, source_row BIGINT)")
    files = inv.manifest.input.files
    con.register("_pub_input_files_src", pa.table({
        "file_index": pa.array(range(len(files)), pa.int32()),
        "uri": pa.array([f.uri for f in files], pa.string()),
    }))
    segs = [(spec.shard_id, seg) for spec in inv.manifest.shards for seg in spec.segments]
    con.register("_pub_segments_src", pa.table({
        "shard": pa.array([shard for shard, _ in segs], pa.string()),
        "file_index": pa.array([seg.file_index for _, seg in segs], pa.int32()),
        "row_start": pa.array([seg.row_start for _, seg in segs], pa.int64()),
        "row_stop": pa.array([seg.row_stop for _, seg in segs], pa.int64()),
    }))
    try:
        con.execute("CREATE OR REPLACE TEMP TABLE _pub_input_files AS SELECT * FROM _pub_input_files_src")
        con.execute("CREATE OR REPLACE TEMP TABLE _pub_segments AS SELECT * FROM _pub_segments_src")
    finally:
        con.unregister("_pub_input_files_src")
        con.unregister("_pub_segments_src")
    column = inv.manifest.input.id_column
    streamed: set[int] = set()
    for file_index, ranges in merged_ranges(inv.manifest).items():
        info = inv.manifest.input.files[file_index]
        if inv.manifest.input.format != InputFormat.PARQUET.value or not storage.is_local(info.uri):
            streamed.add(file_index)
            continue
        if not _load_expected_parquet(con, info.uri, file_index, column, ranges):
            streamed.add(file_index)
    if streamed:
        _load_expected_streamed(con, inv, streamed)


def _load_expected_parquet(con: duckdb.DuckDBPyConnection, uri: str, file_index: int, column: str,
                           ranges: list[tuple[int, int]]) -> bool:
    """Expected ids of one local Parquet file, read by DuckDB. Returns False (nothing loaded) when the
    id column holds a string that is not valid UTF-8, which DuckDB refuses to read: the caller streams
    that file through :func:`iter_expected`, which applies the contract's id rule row by row."""
    path = str(storage.local_path(uri).resolve())
    meta = pq.read_metadata(path)
    schema = meta.schema.to_arrow_schema()
    if column not in schema.names:
        raise PublishError(f"{uri}: no id column {column!r} (columns: {schema.names})")
    check_id_type(schema.field(column).type, column, uri)
    if ranges[-1][1] > meta.num_rows:
        raise PublishError(f"{uri}: has {meta.num_rows} rows but the manifest asks for rows up to {ranges[-1][1]}")
    if ranges == [(0, meta.num_rows)]:
        cond = "true"
    else:
        cond = " OR ".join(f"(file_row_number >= {int(lo)} AND file_row_number < {int(hi)})" for lo, hi in ranges)
    scan = f"read_parquet($path, file_row_number=true) WHERE ({cond})"
    col = _q(column)
    try:
        con.execute(f"INSERT INTO _pub_expected SELECT CAST({col} AS VARCHAR), {int(file_index)}, "
                    f"file_row_number FROM {scan} AND {col} IS NOT NULL", {"path": path})
        con.execute(f"INSERT INTO _pub_expected_null SELECT $uri, file_row_number FROM {scan} AND {col} IS NULL",
                    {"path": path, "uri": uri})
    except duckdb.InvalidInputException as exc:
        if "not valid UTF8" not in str(exc):
            raise
        con.execute(f"DELETE FROM _pub_expected WHERE file_index = {int(file_index)}")
        con.execute("DELETE FROM _pub_expected_null WHERE source_uri = $uri", {"uri": uri})
        return False
    return True


def _load_expected_streamed(con: duckdb.DuckDBPyConnection, inv: RunInventory, files: set[int]) -> None:
    null_batches: list[pa.RecordBatch] = []

    def ids():
        for batch in iter_expected(inv.manifest, file_indices=files):
            if batch.null_rows.num_rows:
                null_batches.append(batch.null_rows)
            yield batch.ids

    reader = pa.RecordBatchReader.from_batches(ID_BATCH_SCHEMA, ids())
    con.register("_pub_expected_src", reader)
    try:
        con.execute("INSERT INTO _pub_expected SELECT id, file_index, source_row FROM _pub_expected_src")
    finally:
        con.unregister("_pub_expected_src")
    if null_batches:
        con.register("_pub_null_src", pa.Table.from_batches(null_batches, schema=NULL_ROW_SCHEMA))
        try:
            con.execute("INSERT INTO _pub_expected_null SELECT * FROM _pub_null_src")
        finally:
            con.unregister("_pub_null_src")


def _result_columns(con: duckdb.DuckDBPyConnection, parts: list[str]) -> list[tuple[str, str]]:
    rows = con.execute(
        "DESCRIBE SELECT * FROM read_parquet($parts, union_by_name=true)", {"parts": parts}
    ).fetchall()
    arrow_schema = pq.read_schema(parts[0])
    cols = [(r[0], _fixed_array_type(arrow_schema, r[0]) or r[1]) for r in rows if r[0] not in HIDDEN_COLUMNS]
    names = [c[0] for c in cols]
    for required in ("id", "fingerprint"):
        if required not in names:
            raise PublishError(f"part files lack required column {required!r} (columns: {names})")
    return cols


def _fixed_array_type(schema: pa.Schema, name: str) -> str | None:
    """``FLOAT[n]`` for a ``fixed_size_list<float32>[n]`` column (DuckDB reads it as ``FLOAT[]``)."""
    if name not in schema.names:
        return None
    t = schema.field(name).type
    if pa.types.is_fixed_size_list(t) and pa.types.is_float32(t.value_type):
        return f"FLOAT[{t.list_size}]"
    return None


def _shard_of(path: str) -> str:
    """Shard id of a committed file: its parent directory (``.../shards/<shard_id>/<name>``; ``gs://``
    copies keep ``<shard_id>/<name>``, see :func:`~batch_inference.publish.files.localize`)."""
    return Path(path).parent.name


def _register_file_shards(con: duckdb.DuckDBPyConnection, table: str, paths: list[str]) -> None:
    """``table(filename, shard, file_id)`` for the given local file paths; ``file_id`` numbers the files
    in ``filename`` order (1-based)."""
    con.register("_pub_file_shards_src", pa.table({
        "filename": pa.array(paths, pa.string()),
        "shard": pa.array([_shard_of(p) for p in paths], pa.string()),
    }))
    try:
        con.execute(f"CREATE OR REPLACE TEMP TABLE {table} AS SELECT filename, shard, "
                    "CAST(row_number() OVER (ORDER BY filename) AS INTEGER) AS file_id FROM _pub_file_shards_src")
    finally:
        con.unregister("_pub_file_shards_src")


def _load_part_keys(con: duckdb.DuckDBPyConnection, inv: RunInventory, parts: list[str]) -> tuple[int, bool]:
    """Key columns of every result row into ``_pub_key_rows`` (``id``, ``file_id``, ``file_row_number``,
    and ``fingerprint`` only where it is not the run's: NULL otherwise), with the view ``_pub_keys``
    adding each row's ``filename`` and ``shard``; result rows of an id committed twice in one shard (a
    chunk re-done after a lost commit reply) into ``_pub_drop`` (the first by file name and row number
    is kept).

    The table holds ~30 bytes a row, not the file path and fingerprint strings a row (issue #35: at 40M
    rows those were ~5 GB that a 1 GB DuckDB buffer spilled to disk).

    Returns:
        ``(dropped, distinct)``: result rows dropped as duplicates within a shard, and whether every
        result id is on one row only (then no id has results in two shards either).
    """
    _register_file_shards(con, "_pub_part_shards", parts)
    con.execute(
        "CREATE OR REPLACE TEMP TABLE _pub_key_rows AS SELECT k.id, s.file_id, k.file_row_number, "
        "CASE WHEN k.fingerprint IS DISTINCT FROM $fp THEN coalesce(k.fingerprint, $null_fp) END AS fingerprint "
        "FROM read_parquet($parts, filename=true, file_row_number=true, union_by_name=true) k "
        "LEFT JOIN _pub_part_shards s ON s.filename = k.filename",
        {"parts": parts, "fp": inv.fingerprint, "null_fp": _NULL_FP},
    )
    con.execute("CREATE OR REPLACE TEMP VIEW _pub_keys AS SELECT r.id, r.fingerprint, s.filename, r.file_row_number, "
                "s.shard, r.file_id FROM _pub_key_rows r JOIN _pub_part_shards s ON s.file_id = r.file_id")
    if con.execute("SELECT count(*) FROM _pub_key_rows WHERE file_id IS NULL").fetchall()[0][0]:
        raise PublishError("a part file path read back is not in the run's file list")
    nulls = con.execute("SELECT filename, count(*) FROM _pub_keys WHERE id IS NULL GROUP BY 1 LIMIT 1").fetchall()
    if nulls:
        raise PublishError(f"{nulls[0][0]}: {nulls[0][1]} result row(s) with a null id")
    bad = con.execute("SELECT fingerprint, count(*), min(filename) FROM _pub_keys WHERE fingerprint IS NOT NULL "
                      "GROUP BY 1 ORDER BY 2 DESC LIMIT 1").fetchall()
    if bad:
        _stale(bad[0], inv.fingerprint, "part file")
    total, distinct = con.execute("SELECT count(*), count(DISTINCT id) FROM _pub_key_rows").fetchall()[0]
    where = "" if total != distinct else "WHERE false"  # skip the window when there are no duplicates
    con.execute(
        "CREATE OR REPLACE TEMP TABLE _pub_drop AS SELECT id, shard, filename, file_row_number, file_id "
        "FROM (SELECT id, shard, filename, file_row_number, file_id, row_number() OVER ("
        f" PARTITION BY id, shard ORDER BY filename, file_row_number) AS rn FROM _pub_keys {where}) WHERE rn > 1"
    )
    return int(con.execute("SELECT count(*) FROM _pub_drop").fetchall()[0][0]), total == distinct


_NULL_FP = "\x00null"
"""What a NULL fingerprint is stored as in ``_pub_key_rows`` (where NULL means: the run's fingerprint)."""


def _stale(row: tuple, expected: str, what: str) -> None:
    """Raise the stale-fingerprint :class:`PublishError` for ``(fingerprint, count, first file)``."""
    fp, count, filename = row
    fp = None if fp == _NULL_FP else fp
    raise PublishError(
        f"{count} {what} row(s) carry fingerprint {fp!r}, not the markers' {expected!r} "
        f"(first file: {filename}); stale results must not be published"
    )


def _check_fingerprint(con: duckdb.DuckDBPyConnection, table: str, expected: str, what: str) -> None:
    bad = con.execute(
        f"SELECT fingerprint, count(*), min(filename) FROM {table} WHERE fingerprint IS DISTINCT FROM $fp "
        "GROUP BY 1 ORDER BY 2 DESC LIMIT 1",
        {"fp": expected},
    ).fetchall()
    if bad:
        _stale(bad[0], expected, what)


def _load_dead_letters(con: duckdb.DuckDBPyConnection, inv: RunInventory, dead: list[str]) -> int:
    """De-duplicated dead letters into ``_pub_dead`` (column ``keep``); returns rows dropped.

    An engine's dead letter (``too_long``, ``invalid_output``, ...) is superseded by a result of its id
    in the same shard (the same winning row reprocessed); a row's own reasons and ``duplicate_id`` name
    other input rows and are never superseded.
    """
    cols = ", ".join(f"{_q(f.name)}::{_duck_type(f.type)} AS {_q(f.name)}" for f in DEAD_LETTER_SCHEMA)
    if dead:
        source = "read_parquet($dead, filename=true, file_row_number=true, union_by_name=true)"
        params: dict[str, object] = {"dead": dead}
    else:
        source = "(SELECT * FROM (VALUES (NULL, NULL, NULL, NULL, NULL, NULL, '', 0)) t(id, reason, " \
            "detail, source_uri, source_row, fingerprint, filename, file_row_number) WHERE false)"
        params = {}
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE _pub_dead_raw AS SELECT {cols}, filename, file_row_number FROM {source}",
        params,
    )
    _check_fingerprint(con, "_pub_dead_raw", inv.fingerprint, "dead-letter")
    _register_file_shards(con, "_pub_dead_shards", dead)
    con.execute(
        "CREATE OR REPLACE TEMP TABLE _pub_dead AS SELECT d.*, "
        " (rn = 1 AND (d.id IS NULL OR list_contains($kept, d.reason) OR k.id IS NULL)) AS keep FROM ("
        "  SELECT r.*, s.shard, row_number() OVER (PARTITION BY r.source_uri, r.source_row ORDER BY r.filename,"
        "  r.file_row_number) AS rn FROM _pub_dead_raw r LEFT JOIN _pub_dead_shards s ON s.filename = r.filename) d"
        " LEFT JOIN (SELECT DISTINCT id, shard FROM _pub_keys) k ON k.id = d.id AND k.shard = d.shard",
        {"kept": [*_OWN_REASONS, DeadLetterReason.DUPLICATE_ID.value]},
    )
    unmapped = con.execute("SELECT min(filename) FROM _pub_dead WHERE shard IS NULL").fetchall()[0][0]
    if unmapped is not None:
        raise PublishError(f"{unmapped}: dead-letter file path not in the run's file list")
    return con.execute("SELECT count(*) FROM _pub_dead WHERE NOT keep").fetchall()[0][0]


def _apply_duplicate_rule(con: duckdb.DuckDBPyConnection, inv: RunInventory, keys_distinct: bool = False) -> int:
    """Apply the contract's duplicate rule (:mod:`batch_contract.rows`) across shards.

    For each id on several input rows, the winner is its first row in input order (file, row) that is
    not dead-lettered for a reason of its own (``ROW_REASONS``). Results of that id from other shards
    are dropped (into ``_pub_drop``); every other such row gets exactly one kept ``duplicate_id`` dead
    letter naming the winner (replacing what its shard's worker wrote there: a dead letter, or the
    result of the shard's own first row of the id), so the outcome does not depend on shard boundaries.
    A row its shard committed nothing for stays missing.

    Args:
        con / inv: as :func:`check_coverage`.
        keys_distinct: every id of ``_pub_keys`` is on one result row only (``False``: not known).

    Returns:
        Result rows dropped because the id's winner lies in another shard.

    Raises:
        PublishError: an id on one input row has results in several shards (the run directory does
            not match its manifest).
    """
    # an id in several shards' results is an id on several result rows: when every result id is distinct
    # (known from _load_part_keys' count) the grouped scan of every key, the costliest query of a
    # 40M-row publish after the load itself, finds nothing and is skipped
    stray = [] if keys_distinct else con.execute(
        "SELECT k.id, list(DISTINCT k.shard ORDER BY k.shard) FROM _pub_keys k ANTI JOIN (SELECT id FROM _pub_expected "
        "GROUP BY id HAVING count(*) > 1) d ON d.id = k.id GROUP BY k.id HAVING count(DISTINCT k.shard) > 1 "
        f"ORDER BY 1 LIMIT {SAMPLE_SIZE}"
    ).fetchall()
    if stray:
        raise PublishError(f"run {inv.run_id}: id(s) of one input row with results in several shards "
                           f"(id, shards): {stray}; the run directory does not match its manifest")
    con.execute(
        "CREATE OR REPLACE TEMP TABLE _pub_dup_rows AS SELECT e.id, f.uri, e.source_row, s.shard, "
        " row_number() OVER (PARTITION BY e.id ORDER BY e.file_index, e.source_row) AS rank"
        " FROM _pub_expected e SEMI JOIN (SELECT id FROM _pub_expected GROUP BY id HAVING count(*) > 1) d"
        " ON d.id = e.id JOIN _pub_input_files f ON f.file_index = e.file_index"
        " JOIN _pub_segments s ON s.file_index = e.file_index AND e.source_row >= s.row_start"
        "  AND e.source_row < s.row_stop"
        " ANTI JOIN (SELECT source_uri, source_row FROM _pub_dead WHERE keep AND list_contains($own, reason)) x"
        " ON x.source_uri = f.uri AND x.source_row = e.source_row",
        {"own": _OWN_REASONS},
    )
    if not con.execute("SELECT count(*) FROM _pub_dup_rows").fetchall()[0][0]:
        # no input id on two rows: nothing below can change anything; skipped, as their correlated joins
        # over every result key cost seconds at 40M rows
        con.execute("CREATE OR REPLACE TEMP TABLE _pub_dup_losers (id VARCHAR, uri VARCHAR, source_row BIGINT, "
                    "shard VARCHAR, win_uri VARCHAR, win_row BIGINT)")
        return 0
    # a losing row is re-labelled only where its shard committed something for it: a dead letter at its
    # position, or (the shard's first eligible row of the id) a result; otherwise it stays missing
    con.execute(
        "CREATE OR REPLACE TEMP TABLE _pub_dup_losers AS SELECT l.id, l.uri, l.source_row, l.shard, "
        " w.uri AS win_uri, w.source_row AS win_row FROM (SELECT *, row_number() OVER ("
        "  PARTITION BY id, shard ORDER BY rank) AS local_rank FROM _pub_dup_rows) l"
        " JOIN _pub_dup_rows w ON w.id = l.id AND w.rank = 1 WHERE l.rank > 1 AND ("
        "  EXISTS (SELECT 1 FROM _pub_dead d WHERE d.keep AND d.source_uri = l.uri AND d.source_row = l.source_row)"
        "  OR (l.local_rank = 1 AND EXISTS (SELECT 1 FROM _pub_keys k WHERE k.id = l.id AND k.shard = l.shard)))"
    )
    before = con.execute("SELECT count(*) FROM _pub_drop").fetchall()[0][0]
    con.execute(
        "INSERT INTO _pub_drop SELECT k.id, k.shard, k.filename, k.file_row_number, k.file_id FROM _pub_keys k"
        " JOIN _pub_dup_rows w ON w.id = k.id AND w.rank = 1"
        " WHERE k.shard <> w.shard AND NOT EXISTS (SELECT 1 FROM _pub_drop d"
        "  WHERE d.file_id = k.file_id AND d.file_row_number = k.file_row_number)"
    )
    across = con.execute("SELECT count(*) FROM _pub_drop").fetchall()[0][0] - before
    con.execute(
        "UPDATE _pub_dead SET keep = false FROM _pub_dup_losers l"
        " WHERE _pub_dead.keep AND l.uri = _pub_dead.source_uri AND l.source_row = _pub_dead.source_row"
    )
    con.execute(
        "INSERT INTO _pub_dead BY NAME SELECT id, $dup AS reason,"
        " 'duplicate of ' || win_uri || '#' || CAST(win_row AS VARCHAR) || $tail AS detail,"
        " uri AS source_uri, source_row, $fp AS fingerprint, shard, 1 AS rn, true AS keep FROM _pub_dup_losers",
        {"dup": DeadLetterReason.DUPLICATE_ID.value, "tail": DUPLICATE_DETAIL_TAIL, "fp": inv.fingerprint},
    )
    return int(across)


def _duck_type(t: pa.DataType) -> str:
    return {pa.string(): "VARCHAR", pa.int64(): "BIGINT"}[t]


_LIVE_KEYS = ("(SELECT k.id FROM _pub_key_rows k ANTI JOIN _pub_drop d "
              "ON d.file_id = k.file_id AND d.file_row_number = k.file_row_number)")
"""Result rows that are published (not dropped as duplicates)."""
_COVERED = (f"(SELECT id, count(*) AS n FROM (SELECT DISTINCT id FROM {_LIVE_KEYS} "
            "UNION ALL SELECT id FROM _pub_dead WHERE keep AND id IS NOT NULL) GROUP BY id)")
_EXPECTED = "(SELECT id, count(*) AS n FROM _pub_expected GROUP BY id)"
_NULL_COVERED = "(SELECT source_uri, source_row FROM _pub_dead WHERE keep AND id IS NULL)"

COVERAGE_BYTES_PER_ROW = 64
"""DuckDB memory the coverage check's one hash aggregate needs per input row (the id, its two counts and
the table's overhead, measured at 40M rows): :func:`check_coverage` raises the connection's
``memory_limit`` to ``rows x this`` (at most :data:`COVERAGE_MEMORY_CAP_MB`) when that is above it."""
COVERAGE_MEMORY_CAP_MB = 2048
"""Most memory (MiB) :func:`check_coverage` gives DuckDB: a 40M-row run's publish stays under 3 GB RSS."""


def _coverage_counts(con: duckdb.DuckDBPyConnection, keys_distinct: bool = False) -> tuple[int, int]:
    """``(rows_missing, unexpected)``: rows, not ids (an id expected ``n`` times and covered ``c`` times
    misses ``n - c`` rows); unexpected: covered ids no input row has (+ null-id positions).

    One hash aggregate over the expected ids, the published result ids (distinct) and the kept dead
    letters' ids, counting each side per id (issue #35: the full outer join of two grouped tables it
    replaces ran out of DuckDB's memory at 40M rows). ``keys_distinct`` (no result id on two rows, and
    so nothing dropped): the results need no DISTINCT."""
    live = "(SELECT id FROM _pub_key_rows)" if keys_distinct else f"(SELECT DISTINCT id FROM {_LIVE_KEYS})"
    missing, unexpected = con.execute(
        "SELECT coalesce(sum(greatest(n_e - n_c, 0)) FILTER (WHERE n_e > 0), 0), count(*) FILTER (WHERE n_e = 0) "
        "FROM (SELECT id, sum(e) AS n_e, sum(c) AS n_c FROM ("
        " SELECT id, 1 AS e, 0 AS c FROM _pub_expected"
        f" UNION ALL SELECT id, 0, 1 FROM {live}"
        " UNION ALL SELECT id, 0, 1 FROM _pub_dead WHERE keep AND id IS NOT NULL) GROUP BY id)"
    ).fetchall()[0]
    null_missing, null_unexpected = con.execute(
        f"SELECT count(*) FILTER (WHERE c.source_row IS NULL), count(*) FILTER (WHERE e.source_row IS NULL) "
        f"FROM _pub_expected_null e FULL OUTER JOIN {_NULL_COVERED} c "
        "ON e.source_uri = c.source_uri AND e.source_row = c.source_row"
    ).fetchall()[0]
    return int(missing) + int(null_missing), int(unexpected) + int(null_unexpected)


def _raise_memory_limit(con: duckdb.DuckDBPyConnection, rows: int) -> None:
    """Raise the connection's ``memory_limit`` to what the coverage check of ``rows`` input rows needs
    (:data:`COVERAGE_BYTES_PER_ROW`, capped at :data:`COVERAGE_MEMORY_CAP_MB`); never lowers it."""
    want_mb = min(COVERAGE_MEMORY_CAP_MB, rows * COVERAGE_BYTES_PER_ROW >> 20)
    current = con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0]
    units = {"KiB": 1 / 1024, "MiB": 1, "GiB": 1024, "TiB": 1 << 20, "KB": 1 / 1024, "MB": 1, "GB": 1024}
    number, _, unit = str(current).partition(" ")
    try:
        current_mb = float(number) * units[unit]
    except (KeyError, ValueError):
        return
    if want_mb > current_mb:
        con.execute(f"SET memory_limit = '{int(want_mb)}MB'")


def _sample(con: duckdb.DuckDBPyConnection, *, missing: bool) -> list[str]:
    """Up to 10 missing (or unexpected) ids, then ``<source_uri>#<row>`` of null-id positions."""
    if missing:  # ids with fewer covered rows than input rows
        query = (f"SELECT e.id FROM {_EXPECTED} e LEFT JOIN {_COVERED} c ON e.id = c.id "
                 f"WHERE coalesce(c.n, 0) < e.n ORDER BY 1 LIMIT {SAMPLE_SIZE}")
    else:
        query = f"SELECT a.id FROM {_COVERED} a ANTI JOIN {_EXPECTED} b ON a.id = b.id ORDER BY 1 LIMIT {SAMPLE_SIZE}"
    ids = [r[0] for r in con.execute(query).fetchall()]
    left, right = ("_pub_expected_null", _NULL_COVERED) if missing else (_NULL_COVERED, "_pub_expected_null")
    nulls = con.execute(
        f"SELECT a.source_uri, a.source_row FROM {left} a ANTI JOIN {right} b "
        f"ON a.source_uri = b.source_uri AND a.source_row = b.source_row ORDER BY 1, 2 LIMIT {SAMPLE_SIZE}"
    ).fetchall()
    return (ids + [f"{u}#{r}" for u, r in nulls])[:SAMPLE_SIZE]


def check_coverage(
    con: duckdb.DuckDBPyConnection,
    inv: RunInventory,
    parts: list[str],
    dead: list[str],
    *,
    min_success_ratio: float = 1.0,
) -> Coverage:
    """Load keys into temp tables of ``con`` and prove every manifest id is covered exactly once.

    Args:
        con: a DuckDB connection (the target database or a scratch one); temp tables ``_pub_*`` are
            created in it and used by :meth:`Coverage.results_sql`.
        inv: the run.
        parts / dead: local paths of the run's part and dead-letter files (sorted).
        min_success_ratio: fraction (0..1] of input rows that must be covered; below 1.0 a run with
            missing rows may still publish.

    Returns:
        The :class:`Coverage` counts.

    Raises:
        CoverageError: result/dead-letter ids that are not in the manifest (always fatal), missing
            rows pushing the success ratio below ``min_success_ratio``, or a non-empty input whose every
            row was dead-lettered (an empty table never replaces the current one).
        PublishError: stale fingerprints or null result ids.
    """
    if not 0.0 < min_success_ratio <= 1.0:
        raise ValueError(f"min_success_ratio: {min_success_ratio} is not in (0, 1]")
    _raise_memory_limit(con, inv.rows_input)
    _load_expected(con, inv)
    if parts:
        columns = _result_columns(con, parts)
        dup_results, keys_distinct = _load_part_keys(con, inv, parts)
    else:
        columns = [("id", "VARCHAR"), ("fingerprint", "VARCHAR")]
        con.execute("CREATE OR REPLACE TEMP TABLE _pub_key_rows (id VARCHAR, file_id INTEGER, "
                    "file_row_number BIGINT, fingerprint VARCHAR)")
        con.execute("CREATE OR REPLACE TEMP VIEW _pub_keys AS SELECT id, fingerprint, CAST(NULL AS VARCHAR) AS "
                    "filename, file_row_number, CAST(NULL AS VARCHAR) AS shard, file_id FROM _pub_key_rows")
        con.execute("CREATE OR REPLACE TEMP TABLE _pub_drop (id VARCHAR, shard VARCHAR, filename VARCHAR, "
                    "file_row_number BIGINT, file_id INTEGER)")
        con.execute("CREATE OR REPLACE TEMP TABLE _pub_empty_results (id VARCHAR, fingerprint VARCHAR)")
        dup_results, keys_distinct = 0, True
    dup_dead = _load_dead_letters(con, inv, dead)
    across = _apply_duplicate_rule(con, inv, keys_distinct)
    rows_missing, n_unexpected = _coverage_counts(con, keys_distinct and not dup_results and not across)
    if n_unexpected:
        unexpected_sample = _sample(con, missing=False)
        raise CoverageError(
            f"run {inv.run_id}: {n_unexpected} result/dead-letter id(s) are not in the manifest's input "
            f"rows (sample: {unexpected_sample}); the run directory does not match its manifest",
            missing=0, unexpected=n_unexpected, sample=unexpected_sample,
        )
    sample = _sample(con, missing=True) if rows_missing else []
    published = (con.execute("SELECT count(*) FROM _pub_key_rows").fetchall()[0][0]
                 if keys_distinct and not dup_results and not across
                 else con.execute(f"SELECT count(DISTINCT id) FROM {_LIVE_KEYS}").fetchall()[0][0])
    reasons = dict(con.execute("SELECT reason, count(*) FROM _pub_dead WHERE keep GROUP BY 1 ORDER BY 1").fetchall())
    dead_rows = sum(reasons.values())
    cov = Coverage(
        rows_input=inv.rows_input,
        rows_published=published,
        rows_dead_letter=dead_rows,
        rows_missing=rows_missing,
        duplicates_removed=dup_results + dup_dead,
        missing_sample=sample,
        part_files=parts,
        dead_letter_files=dead,
        columns=columns,
        duplicate_ids_across_shards=across,
        dead_letter_reasons={str(k): int(v) for k, v in reasons.items()},
    )
    if rows_missing and cov.success_ratio < min_success_ratio:
        raise CoverageError(
            f"run {inv.run_id}: {rows_missing} of {inv.rows_input} input row(s) have neither a result nor "
            f"a dead letter (success ratio {cov.success_ratio:.6f} < min_success_ratio "
            f"{min_success_ratio}); sample: {sample}",
            missing=rows_missing, unexpected=0, sample=sample,
        )
    if inv.rows_input and not published:
        raise CoverageError(
            f"run {inv.run_id}: none of its {inv.rows_input} input row(s) has a result ({dead_rows} dead "
            "letter(s)); refusing to swap an empty table over the current one. Read the dead letters in "
            "the run's shard directories for the reasons",
            missing=rows_missing, unexpected=0, sample=sample,
        )
    return cov
