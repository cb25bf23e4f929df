"""Coverage check and de-duplication, computed in DuckDB over the committed files of a run.

Set logic runs in DuckDB (which spills to disk), not in Python sets, so it scales to tens of millions of
ids. Only key columns are read for the checks (``id``, ``fingerprint``, file name, row number); the wide
columns (embeddings) are read once, when the staging table is loaded, through :meth:`Coverage.results_sql`.

De-duplication rule (deterministic): for an id with several result rows, the row kept is the one from
the lowest shard id, then the part file whose URI sorts first, then the lowest row number within that file.
Result rows of the same id in the same shard are one input row committed twice (a chunk re-done after a
lost commit reply; the worker de-duplicates ids within a shard): they are dropped silently and counted in
``duplicates_removed``. A result of the same id in another shard is a distinct input row sharing the id:
it becomes a ``duplicate_id`` dead letter at that shard's input row, naming the shard that kept the id.
Dead letters are de-duplicated by ``(source_uri, source_row)`` the same way; a dead letter whose id also
has a result in the same shard is superseded by the result unless its reason is ``duplicate_id`` (a second
input row carrying an id already seen).

Coverage counts input rows, not ids: an id occurring ``n`` times in the input needs ``n`` rows between its
result (at most one) and its dead letters.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
from batch_contract import storage
from batch_contract.enums import DeadLetterReason, InputFormat
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
        duplicate_ids_across_shards: input rows whose id has a result in a lower shard too: their own
            result is not published, they are ``duplicate_id`` dead letters (counted in
            ``rows_dead_letter``).
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
        if inv.manifest.input.format != InputFormat.PARQUET.value or storage.is_gcs(info.uri):
            streamed.add(file_index)
            continue
        _load_expected_parquet(con, info.uri, file_index, column, ranges)
    if streamed:
        _load_expected_streamed(con, inv, streamed)


def _load_expected_parquet(con: duckdb.DuckDBPyConnection, uri: str, file_index: int, column: str,
                           ranges: list[tuple[int, int]]) -> None:
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
    con.execute(f"INSERT INTO _pub_expected SELECT CAST({col} AS VARCHAR), {int(file_index)}, file_row_number "
                f"FROM {scan} AND {col} IS NOT NULL", {"path": path})
    con.execute(f"INSERT INTO _pub_expected_null SELECT $uri, file_row_number FROM {scan} AND {col} IS NULL",
                {"path": path, "uri": uri})


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
    """``table(filename, shard)`` for the given local file paths."""
    con.register("_pub_file_shards_src", pa.table({
        "filename": pa.array(paths, pa.string()),
        "shard": pa.array([_shard_of(p) for p in paths], pa.string()),
    }))
    try:
        con.execute(f"CREATE OR REPLACE TEMP TABLE {table} AS SELECT * FROM _pub_file_shards_src")
    finally:
        con.unregister("_pub_file_shards_src")


def _load_part_keys(con: duckdb.DuckDBPyConnection, inv: RunInventory, parts: list[str]) -> int:
    """Key columns (and shard) of every result row into ``_pub_keys``; result rows to drop into
    ``_pub_drop``; ids with results in several shards into ``_pub_xshard`` (one row per id and shard
    other than the lowest, ``kept_shard`` naming the lowest).

    Returns:
        Number of result rows dropped as duplicates within a shard (retried chunks); the rows of
        ``_pub_xshard`` are not counted (they become dead letters).
    """
    _register_file_shards(con, "_pub_part_shards", parts)
    con.execute(
        "CREATE OR REPLACE TEMP TABLE _pub_keys AS SELECT k.id, k.fingerprint, k.filename, k.file_row_number, "
        "s.shard FROM read_parquet($parts, filename=true, file_row_number=true, union_by_name=true) k "
        "LEFT JOIN _pub_part_shards s ON s.filename = k.filename",
        {"parts": parts},
    )
    unmapped = con.execute("SELECT min(filename) FROM _pub_keys WHERE shard IS NULL").fetchall()[0][0]
    if unmapped is not None:
        raise PublishError(f"{unmapped}: part file path not in the run's file list")
    nulls = con.execute("SELECT filename, count(*) FROM _pub_keys WHERE id IS NULL GROUP BY 1 LIMIT 1").fetchall()
    if nulls:
        raise PublishError(f"{nulls[0][0]}: {nulls[0][1]} result row(s) with a null id")
    _check_fingerprint(con, "_pub_keys", inv.fingerprint, "part file")
    total, distinct = con.execute("SELECT count(*), count(DISTINCT id) FROM _pub_keys").fetchall()[0]
    where = "" if total != distinct else "WHERE false"  # skip the window when there are no duplicates
    con.execute(
        "CREATE OR REPLACE TEMP TABLE _pub_drop AS SELECT id, shard, kept_shard, filename, file_row_number "
        "FROM (SELECT id, shard, filename, file_row_number, row_number() OVER w AS rn, "
        f" first_value(shard) OVER w AS kept_shard FROM _pub_keys {where}"
        " WINDOW w AS (PARTITION BY id ORDER BY shard, filename, file_row_number)) WHERE rn > 1"
    )
    con.execute(
        "CREATE OR REPLACE TEMP TABLE _pub_xshard AS SELECT id, shard, min(kept_shard) AS kept_shard "
        "FROM _pub_drop WHERE shard <> kept_shard GROUP BY id, shard"
    )
    dropped, across = con.execute(
        "SELECT (SELECT count(*) FROM _pub_drop), (SELECT count(*) FROM _pub_xshard)"
    ).fetchall()[0]
    return int(dropped) - int(across)


def _check_fingerprint(con: duckdb.DuckDBPyConnection, table: str, expected: str, what: str) -> None:
    bad = con.execute(
        f"SELECT fingerprint, count(*), min(filename) FROM {table} WHERE fingerprint IS DISTINCT FROM $fp "
        "GROUP BY 1 ORDER BY 2 DESC LIMIT 1",
        {"fp": expected},
    ).fetchall()
    if bad:
        fp, count, filename = bad[0]
        raise PublishError(
            f"{count} {what} row(s) carry fingerprint {fp!r}, not the markers' {expected!r} "
            f"(first file: {filename}); stale results must not be published"
        )


def _load_dead_letters(con: duckdb.DuckDBPyConnection, inv: RunInventory, dead: list[str]) -> int:
    """De-duplicated dead letters into ``_pub_dead`` (column ``keep``); returns rows dropped.

    A dead letter is superseded by a result of its id in the same shard only (the same input row
    reprocessed); a result in another shard belongs to a different input row.
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
        " (rn = 1 AND (d.id IS NULL OR d.reason = $dup OR k.id IS NULL)) AS keep FROM ("
        "  SELECT r.*, s.shard, row_number() OVER (PARTITION BY r.source_uri, r.source_row ORDER BY r.filename,"
        "  r.file_row_number) AS rn FROM _pub_dead_raw r LEFT JOIN _pub_dead_shards s ON s.filename = r.filename) d"
        " LEFT JOIN (SELECT DISTINCT id, shard FROM _pub_keys) k ON k.id = d.id AND k.shard = d.shard",
        {"dup": DeadLetterReason.DUPLICATE_ID.value},
    )
    unmapped = con.execute("SELECT min(filename) FROM _pub_dead WHERE shard IS NULL").fetchall()[0][0]
    if unmapped is not None:
        raise PublishError(f"{unmapped}: dead-letter file path not in the run's file list")
    return con.execute("SELECT count(*) FROM _pub_dead WHERE NOT keep").fetchall()[0][0]


def _add_cross_shard_dead_letters(con: duckdb.DuckDBPyConnection, inv: RunInventory) -> int:
    """Turn each result of ``_pub_xshard`` (an id whose result a lower shard kept) into a kept
    ``duplicate_id`` dead letter in ``_pub_dead`` at the input row of that shard carrying the id (the
    lowest such row without a dead letter of its own). Returns the number added.

    Raises:
        PublishError: a shard has a result for an id that none of its remaining input rows carries.
    """
    n = con.execute("SELECT count(*) FROM _pub_xshard").fetchall()[0][0]
    if not n:
        return 0
    con.execute(
        "CREATE OR REPLACE TEMP TABLE _pub_xshard_rows AS SELECT id, shard, kept_shard, uri, source_row FROM ("
        " SELECT x.id, x.shard, x.kept_shard, f.uri, e.source_row, row_number() OVER ("
        "  PARTITION BY x.id, x.shard ORDER BY e.file_index, e.source_row) AS rn"
        " FROM _pub_xshard x JOIN _pub_expected e ON e.id = x.id"
        " JOIN _pub_segments s ON s.shard = x.shard AND s.file_index = e.file_index"
        "  AND e.source_row >= s.row_start AND e.source_row < s.row_stop"
        " JOIN _pub_input_files f ON f.file_index = e.file_index"
        " WHERE NOT EXISTS (SELECT 1 FROM _pub_dead d WHERE d.keep AND d.source_uri = f.uri"
        "  AND d.source_row = e.source_row)"
        ") WHERE rn = 1"
    )
    unmatched = con.execute(
        "SELECT x.id, x.shard FROM _pub_xshard x ANTI JOIN _pub_xshard_rows r ON r.id = x.id AND r.shard = x.shard "
        f"ORDER BY 1, 2 LIMIT {SAMPLE_SIZE}"
    ).fetchall()
    if unmatched:
        raise PublishError(
            f"run {inv.run_id}: result(s) for id(s) also published from a lower shard, with no input row of "
            f"their own shard left to dead-letter (id, shard): {unmatched}; the run directory does not "
            "match its manifest"
        )
    con.execute(
        "INSERT INTO _pub_dead BY NAME SELECT id, $dup AS reason, "
        " 'id ' || id || ' also occurs in shard ' || kept_shard || ', which kept it (lowest shard id); the '"
        " || 'result of this row (shard ' || shard || ') is not published' AS detail,"
        " uri AS source_uri, source_row, $fp AS fingerprint, shard, 1 AS rn, true AS keep FROM _pub_xshard_rows",
        {"dup": DeadLetterReason.DUPLICATE_ID.value, "fp": inv.fingerprint},
    )
    return int(n)


def _duck_type(t: pa.DataType) -> str:
    return {pa.string(): "VARCHAR", pa.int64(): "BIGINT"}[t]


_COVERED = ("(SELECT id, count(*) AS n FROM (SELECT DISTINCT id FROM _pub_keys "
            "UNION ALL SELECT id FROM _pub_dead WHERE keep AND id IS NOT NULL) GROUP BY id)")
_EXPECTED = "(SELECT id, count(*) AS n FROM _pub_expected GROUP BY id)"
_NULL_COVERED = "(SELECT source_uri, source_row FROM _pub_dead WHERE keep AND id IS NULL)"


def _coverage_counts(con: duckdb.DuckDBPyConnection) -> tuple[int, int]:
    """``(rows_missing, unexpected)`` in one full outer join of expected and covered ids (+ null ids).

    Rows, not ids: an id expected ``n`` times and covered ``c`` times misses ``n - c`` rows."""
    missing, unexpected = con.execute(
        "SELECT coalesce(sum(greatest(e.n - coalesce(c.n, 0), 0)) FILTER (WHERE e.id IS NOT NULL), 0), "
        f"count(*) FILTER (WHERE e.id IS NULL) FROM {_EXPECTED} e FULL OUTER JOIN {_COVERED} c ON e.id = c.id"
    ).fetchall()[0]
    null_missing, null_unexpected = con.execute(
        f"SELECT count(*) FILTER (WHERE c.source_row IS NULL), count(*) FILTER (WHERE e.source_row IS NULL) "
        f"FROM _pub_expected_null e FULL OUTER JOIN {_NULL_COVERED} c "
        "ON e.source_uri = c.source_uri AND e.source_row = c.source_row"
    ).fetchall()[0]
    return int(missing) + int(null_missing), int(unexpected) + int(null_unexpected)


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
    _load_expected(con, inv)
    if parts:
        columns = _result_columns(con, parts)
        dup_results = _load_part_keys(con, inv, parts)
    else:
        columns = [("id", "VARCHAR"), ("fingerprint", "VARCHAR")]
        con.execute("CREATE OR REPLACE TEMP TABLE _pub_keys (id VARCHAR, fingerprint VARCHAR, "
                    "filename VARCHAR, file_row_number BIGINT, shard VARCHAR)")
        con.execute("CREATE OR REPLACE TEMP TABLE _pub_xshard (id VARCHAR, shard VARCHAR, kept_shard VARCHAR)")
        con.execute("CREATE OR REPLACE TEMP TABLE _pub_empty_results (id VARCHAR, fingerprint VARCHAR)")
        dup_results = 0
    dup_dead = _load_dead_letters(con, inv, dead)
    across = _add_cross_shard_dead_letters(con, inv)
    rows_missing, n_unexpected = _coverage_counts(con)
    if n_unexpected:
        unexpected_sample = _sample(con, missing=False)
        raise CoverageError(
            f"run {inv.run_id}: {n_unexpected} result/dead-letter id(s) are not in the manifest's input "
            f"rows (sample: {unexpected_sample}); the run directory does not match its manifest",
            missing=0, unexpected=n_unexpected, sample=unexpected_sample,
        )
    sample = _sample(con, missing=True) if rows_missing else []
    published = con.execute("SELECT count(DISTINCT id) FROM _pub_keys").fetchall()[0][0]
    dead_rows = con.execute("SELECT count(*) FROM _pub_dead WHERE keep").fetchall()[0][0]
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
