"""DuckDB backend: staging tables loaded with DuckDB's Parquet reader, swapped in one transaction.

The coverage check runs in the target database's connection (temp tables, spilled to DuckDB's temp
directory when large), so the wide columns are read exactly once, by ``INSERT ... SELECT`` from
``read_parquet`` into the staging table, whose primary key is built in bulk after the first batch
(:data:`PRIMARY_KEY_BULK_ROWS`) and kept up by the later ones.

Ownership: every table publish creates is marked twice, in the transaction that creates it: by name in
:data:`~batch_inference.publish.target.REGISTRY_TABLE` (in the target's schema; a rename updates the row
and a drop deletes it in the same transaction, as DuckDB table OIDs are not stable across restarts), and
by its comment (the publish record, or :data:`LOG_COMMENT` for the log), which travels with the table
through renames. A table is publish's only when both agree, so a table someone else created under a
registered name (after dropping publish's) is refused too. Every drop and rename checks the mark first
(:class:`~batch_inference.publish.errors.ForeignTableError` otherwise).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import duckdb
import pyarrow as pa
from batch_contract.schemas import DEAD_LETTER_SCHEMA

from batch_inference.publish.coverage import Coverage
from batch_inference.publish.errors import ForeignTableError, PublishError
from batch_inference.publish.record import LOG_COLUMNS, RECORD_KIND, PublishRecord, sql_string_literal
from batch_inference.publish.sql_tables import SqlDialect, SqlTableBackend
from batch_inference.publish.target import (
    DSN_SCHEMES,
    DUCKDB_ALIAS,
    DUCKDB_RESERVED_SCHEMAS,
    REGISTRY_TABLE,
    SUFFIX_DEAD_LETTERS,
    SUFFIX_PREVIOUS,
    SUFFIX_PUBLISH_LOG,
    SUFFIX_STAGING,
    PublishTarget,
    check_dsn_scheme,
    quote_ident,
)

if TYPE_CHECKING:
    from batch_inference.params import RunConfig
    from batch_inference.policy import DagPolicy

NAME = "duckdb"
"""This backend's name in :data:`batch_inference.publish.registry.BACKEND_CLASSES`."""

DEAD_LETTER_DDL = (
    '"id" VARCHAR, "reason" VARCHAR NOT NULL, "detail" VARCHAR NOT NULL, "source_uri" VARCHAR NOT NULL, '
    '"source_row" BIGINT NOT NULL, "fingerprint" VARCHAR NOT NULL, PRIMARY KEY ("source_uri", "source_row")'
)
assert [f.name for f in DEAD_LETTER_SCHEMA] == ["id", "reason", "detail", "source_uri", "source_row",
                                                 "fingerprint"], "DEAD_LETTER_DDL out of date"

STAGING_DL = SUFFIX_DEAD_LETTERS + SUFFIX_STAGING
PREVIOUS_DL = SUFFIX_DEAD_LETTERS + SUFFIX_PREVIOUS


LOG_COMMENT = '{"kind":"' + RECORD_KIND + '/publish_log"}'
"""Comment of ``<table>__publish_log`` (the data tables' comment is their publish record)."""


DUCKDB_MEMORY_LIMIT = "1GB"
"""DuckDB buffer-manager limit for publish connections: keeps the publishing process under 2 GB RSS
(DuckDB's default is 80% of RAM, which it fills with cached blocks during a large load); larger
intermediate state spills to the temp directory."""


def configure(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """Settings for a publish connection: bounded memory, no insertion-order bookkeeping."""
    con.execute(f"SET memory_limit = '{DUCKDB_MEMORY_LIMIT}'")
    con.execute("SET preserve_insertion_order = false")
    return con


TABLE_ROW_GROUP_ROWS = 61440
"""Rows per row group of the tables publish writes (DuckDB's default is 122,880). A 384-d float32
embedding is 1.5 KiB, so a default row group is about 190 MB and DuckDB's bulk-ingestion write buffer
(several row groups per thread) presses against :data:`DUCKDB_MEMORY_LIMIT`; half-size row groups
made the 1M x 384 staging load 15-25% faster and steadier on the 2-core development machine
(``bench/publish.py``). Readers are unaffected: it is a write-time setting of this attachment."""


@contextmanager
def scratch_db(work: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    """A configured DuckDB database file in ``work`` for the coverage check of backends that are not
    DuckDB themselves (PostgreSQL, Iceberg); closed on exit."""
    scratch = configure(duckdb.connect(str(work / "scratch.duckdb")))
    try:
        yield scratch
    finally:
        scratch.close()


def connect(target: PublishTarget, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """Open the target database file (created with its parent directory if missing; ``read_only``: the
    file must exist and is attached read-only).

    The file is attached to an in-memory connection as :data:`~batch_inference.publish.target.DUCKDB_ALIAS`
    and made the default catalog (``USE``), so that the write-time ``ROW_GROUP_SIZE`` can be set; the
    in-memory ``memory`` catalog is then detached, so a schema of that name is not ambiguous. Spill
    files go to ``<database file>.tmp`` beside the file, as with a direct ``duckdb.connect(path)``
    (not to ``./.tmp`` under whatever directory the task runs in).
    """
    path = Path(target.duckdb_path or "").absolute()
    if not read_only:
        path.parent.mkdir(parents=True, exist_ok=True)
    con = configure(duckdb.connect())
    try:
        con.execute(f"SET temp_directory = {sql_string_literal(str(path) + '.tmp')}")
        options = "READ_ONLY" if read_only else f"ROW_GROUP_SIZE {TABLE_ROW_GROUP_ROWS}"
        con.execute(f"ATTACH {sql_string_literal(str(path))} AS {DUCKDB_ALIAS} ({options})")
        con.execute(f"USE {DUCKDB_ALIAS}")
        con.execute("DETACH memory")
    except BaseException:
        con.close()
        raise
    return con


def _schema(target: PublishTarget) -> str:
    return target.schema


def _relation_exists(con: duckdb.DuckDBPyConnection, schema: str, name: str) -> bool:
    """Whether a table or view ``schema.name`` exists in the attached file (not counting temp tables),
    compared case-insensitively as DuckDB's catalog resolves names (``"EMB"`` blocks ``emb``)."""
    row = con.execute(
        "SELECT (SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database() "
        "AND lower(schema_name) = lower($s) AND lower(table_name) = lower($t) AND NOT temporary) + "
        "(SELECT count(*) FROM duckdb_views() WHERE database_name = current_database() "
        "AND lower(schema_name) = lower($s) AND lower(view_name) = lower($t) AND NOT temporary)",
        {"s": schema, "t": name},
    ).fetchall()
    return bool(row and row[0][0])


def table_exists(con: duckdb.DuckDBPyConnection, target: PublishTarget, suffix: str = "") -> bool:
    """Whether ``<table><suffix>`` exists as a table or view (not counting temp tables)."""
    return _relation_exists(con, _schema(target), target.name(suffix))


def _registry(target: PublishTarget) -> str:
    return f"{quote_ident(target.schema)}.{quote_ident(REGISTRY_TABLE)}"


def _ensure_registry(con: duckdb.DuckDBPyConnection, target: PublishTarget) -> None:
    con.execute(f"CREATE TABLE IF NOT EXISTS {_registry(target)} "
                "(table_name VARCHAR NOT NULL, created_at TIMESTAMPTZ NOT NULL DEFAULT current_timestamp)")


def _comment(con: duckdb.DuckDBPyConnection, target: PublishTarget, suffix: str) -> str | None:
    row = con.execute(
        "SELECT comment FROM duckdb_tables() WHERE database_name = current_database() "
        "AND lower(schema_name) = lower($s) AND lower(table_name) = lower($t) AND NOT temporary",
        {"s": _schema(target), "t": target.name(suffix)},
    ).fetchall()
    return row[0][0] if row else None


def is_marked(con: duckdb.DuckDBPyConnection, target: PublishTarget, suffix: str = "") -> bool:
    """Whether ``<table><suffix>`` is a table named in the registry whose comment is a publish record
    (or :data:`LOG_COMMENT`): publish created it."""
    comment = _comment(con, target, suffix)
    if comment != LOG_COMMENT and PublishRecord.from_comment(comment) is None:
        return False
    if not _relation_exists(con, _schema(target), REGISTRY_TABLE):
        return False
    row = con.execute(f"SELECT count(*) FROM {_registry(target)} WHERE table_name = ?", [target.name(suffix)]).fetchall()
    return bool(row and row[0][0])


def _mark(con: duckdb.DuckDBPyConnection, target: PublishTarget, suffix: str) -> None:
    # no primary key on the registry: DuckDB refuses to re-insert a key deleted in the same transaction
    con.execute(f"DELETE FROM {_registry(target)} WHERE table_name = ?", [target.name(suffix)])
    con.execute(f"INSERT INTO {_registry(target)} (table_name) VALUES (?)", [target.name(suffix)])


def _require_marked(con: duckdb.DuckDBPyConnection, target: PublishTarget, suffix: str) -> None:
    """Raise :class:`ForeignTableError` if ``<table><suffix>`` exists without publish's mark."""
    if table_exists(con, target, suffix) and not is_marked(con, target, suffix):
        raise ForeignTableError(target.describe(), [target.display_name(suffix)])


def _drop(con: duckdb.DuckDBPyConnection, target: PublishTarget, suffix: str) -> None:
    """Drop ``<table><suffix>`` and its mark if it exists (inside the caller's transaction).

    Raises:
        ForeignTableError: it exists without publish's mark (nothing dropped).
    """
    if not table_exists(con, target, suffix):
        return
    _require_marked(con, target, suffix)
    con.execute(f"DELETE FROM {_registry(target)} WHERE table_name = ?", [target.name(suffix)])
    con.execute(f"DROP TABLE {target.qualified(suffix)}")


def _rename(con: duckdb.DuckDBPyConnection, target: PublishTarget, old: str, new: str) -> None:
    """Rename ``<table><old>`` to ``<table><new>`` and its mark if it exists (inside the caller's
    transaction).

    Raises:
        ForeignTableError: ``<table><old>`` exists without publish's mark (nothing renamed).
    """
    if not table_exists(con, target, old):
        return
    _require_marked(con, target, old)
    con.execute(f"ALTER TABLE {target.qualified(old)} RENAME TO {quote_ident(target.name(new))}")
    con.execute(f"UPDATE {_registry(target)} SET table_name = ? WHERE table_name = ?",
                [target.name(new), target.name(old)])


def read_record(con: duckdb.DuckDBPyConnection, target: PublishTarget, suffix: str = "") -> PublishRecord | None:
    """The :class:`PublishRecord` in the comment of ``<table><suffix>``, or ``None``."""
    return PublishRecord.from_comment(_comment(con, target, suffix))


def _ensure_log(con: duckdb.DuckDBPyConnection, target: PublishTarget) -> None:
    """Create ``<table>__publish_log`` (marked) if missing.

    Raises:
        ForeignTableError: it exists without publish's mark.
    """
    if table_exists(con, target, SUFFIX_PUBLISH_LOG):
        _require_marked(con, target, SUFFIX_PUBLISH_LOG)
        return
    cols = ", ".join(f"{quote_ident(n)} {t}" for n, t in LOG_COLUMNS)
    con.execute(f"CREATE TABLE {target.qualified(SUFFIX_PUBLISH_LOG)} ({cols})")
    con.execute(f"COMMENT ON TABLE {target.qualified(SUFFIX_PUBLISH_LOG)} IS {sql_string_literal(LOG_COMMENT)}")
    _mark(con, target, SUFFIX_PUBLISH_LOG)


def _insert_log(con: duckdb.DuckDBPyConnection, target: PublishTarget, record: PublishRecord, action: str) -> None:
    marks = ", ".join("?" for _ in LOG_COLUMNS)
    con.execute(f"INSERT INTO {target.qualified(SUFFIX_PUBLISH_LOG)} VALUES ({marks})", record.log_row(action))


PRIMARY_KEY_BULK_ROWS = 8_000_000
"""Rows loaded before the primary key is added in one bulk build (the first batch of the load); the
rest follows in batches of this many rows, each its own transaction, into the table that has the key.

Why: ``ALTER TABLE ... ADD PRIMARY KEY`` builds DuckDB's ART index with memory outside the buffer
manager's ``memory_limit``, about 55 bytes per row on top of it (measured at 40M ``doc-<10 digits>``
ids on the 2-core development machine: 4.1-4.5 GB peak RSS under a 1.9 GiB limit, against 1.9 GB
for ``CREATE UNIQUE INDEX`` and 1.4-1.9 GB for appends to a keyed table in 4-10M-row batches).
DuckDB's own guidance is that an ART index must fit in memory while it is built. One bulk build is
several times faster than maintaining the index row by row, so loads up to this size keep it; above,
the later batches pay the per-row upkeep (docs/scale.md)."""


def part_batches(paths: Sequence[str], max_rows: int) -> list[list[str]]:
    """``paths`` (local Parquet files, in load order) in consecutive batches of at most ``max_rows``
    rows each by their footers' row counts; a single file above ``max_rows`` is a batch of its own."""
    import pyarrow.parquet as pq

    batches: list[list[str]] = []
    rows = 0
    for path in paths:
        n = pq.read_metadata(path).num_rows
        if not batches or rows + n > max_rows:
            batches.append([])
            rows = 0
        batches[-1].append(path)
        rows += n
    return batches


def _load_staging(con: duckdb.DuckDBPyConnection, target: PublishTarget, cov: Coverage, record: PublishRecord) -> None:
    """Create and fill ``<table>__staging`` (primary key on ``id``) and ``<table>__dead_letters__staging``.

    The first transaction creates both tables, marks them as publish's, loads the first
    :data:`PRIMARY_KEY_BULK_ROWS` rows of results, adds the primary key in one bulk build and loads the
    dead letters; each further batch of that many rows is appended in a transaction of its own. A
    publish that dies between batches leaves a partial staging table, which the next publish drops and
    loads again; the row count is checked before anything is swapped in.

    Embeddings barely compress, so compression is forced off for the load: it cuts the load's CPU by
    about 30% for about 6% more disk (measured at 1M x 384 float32). The setting is reset afterwards.

    Raises:
        ForeignTableError: a staging or log table of that name exists without publish's mark.
        PublishError: the rows loaded differ from ``cov.rows_published``.
    """
    cols = ", ".join(f"{_dq(n)} {t}" for n, t in cov.columns)
    staging, staging_dl = target.qualified(SUFFIX_STAGING), target.qualified(STAGING_DL)
    comment = sql_string_literal(record.to_comment())
    batches = part_batches(cov.part_files, PRIMARY_KEY_BULK_ROWS) if cov.part_files else [[]]
    con.execute("SET force_compression = 'uncompressed'")
    try:
        with _transaction(con):
            _drop(con, target, SUFFIX_STAGING)
            _drop(con, target, STAGING_DL)
            con.execute(f"CREATE TABLE {staging} ({cols})")
            _mark(con, target, SUFFIX_STAGING)
            _insert_results(con, staging, cov, batches[0])
            # one bulk index build after the first batch is several times faster than per-row upkeep
            con.execute(f'ALTER TABLE {staging} ADD PRIMARY KEY ("id")')
            con.execute(f"CREATE TABLE {staging_dl} ({DEAD_LETTER_DDL})")
            _mark(con, target, STAGING_DL)
            con.execute(f"INSERT INTO {staging_dl} {cov.dead_letters_sql()}")
            con.execute(f"COMMENT ON TABLE {staging} IS {comment}")
            con.execute(f"COMMENT ON TABLE {staging_dl} IS {comment}")
            _ensure_log(con, target)
        for batch in batches[1:]:
            with _transaction(con):
                _insert_results(con, staging, cov, batch)
    finally:
        con.execute("RESET force_compression")
    loaded = con.execute(f"SELECT count(*) FROM {staging}").fetchall()[0][0]
    if loaded != cov.rows_published:
        raise PublishError(f"{staging}: loaded {loaded} rows, coverage counted {cov.rows_published}")


def _insert_results(con: duckdb.DuckDBPyConnection, staging: str, cov: Coverage, parts: list[str]) -> None:
    """Append the results of ``parts`` (a batch of ``cov.part_files``; none: the run has no part files)."""
    con.execute(f"INSERT INTO {staging} {cov.results_sql()}", {"parts": parts} if parts else {})


@contextmanager
def _transaction(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """``BEGIN`` ... ``COMMIT``, or ``ROLLBACK`` on any exception (re-raised)."""
    con.execute("BEGIN")
    try:
        yield
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def _dq(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _swap(con: duckdb.DuckDBPyConnection, target: PublishTarget, record: PublishRecord) -> None:
    """One transaction: live -> previous (older previous dropped), staging -> live, for both tables;
    every table checked for publish's mark first.

    Raises:
        ForeignTableError: one of them exists without publish's mark (nothing changed).
        PublishError: a staging table is missing.
    """
    con.execute("BEGIN")
    try:
        for base in ("", SUFFIX_DEAD_LETTERS):
            prev, live, staging = base + SUFFIX_PREVIOUS, base, base + SUFFIX_STAGING
            if not table_exists(con, target, staging):
                raise PublishError(f"{target.display_name(staging)} vanished before the swap")
            for suffix in (staging, live, prev):
                _require_marked(con, target, suffix)
            _drop(con, target, prev)
            _rename(con, target, live, prev)
            _rename(con, target, staging, live)
        _insert_log(con, target, record, "publish")
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


class DuckDBBackend(SqlTableBackend):
    """:class:`~batch_inference.publish.backend.PublishBackend` for a DuckDB file: coverage runs in the
    target connection itself, staging tables are swapped in by renames in one transaction."""

    dialect = SqlDialect(table_exists=table_exists, read_record=read_record, ensure_log=_ensure_log,
                         insert_log=_insert_log, is_marked=is_marked)

    dsn_required: ClassVar[bool] = False
    """The target needs no ``dsn``."""

    @classmethod
    def target_from_config(cls, cfg: RunConfig, resolve_conn: Callable[[str, str], str]) -> PublishTarget:
        """The target of a run: ``cfg.duckdb_path`` (its directory is created); no connection is resolved.

        Raises:
            ValueError: the target is not valid (:meth:`validate_target`).
            OSError: the directory could not be created.
        """
        Path(cfg.duckdb_path).parent.mkdir(parents=True, exist_ok=True)
        return PublishTarget(backend=NAME, table=cfg.output_table, duckdb_path=cfg.duckdb_path)

    @staticmethod
    def validate_target(target: PublishTarget) -> None:
        """This backend's rules for a :class:`PublishTarget` (called by its constructor).

        Raises:
            ValueError: no ``duckdb_path``; a schema in :data:`DUCKDB_RESERVED_SCHEMAS`; a ``dsn`` URI
                whose scheme is not in :data:`DSN_SCHEMES`.
        """
        if not target.duckdb_path:
            raise ValueError(f"duckdb_path: required when backend is {NAME!r}")
        if target.schema in DUCKDB_RESERVED_SCHEMAS:
            raise ValueError(f"schema: {target.schema!r} names a DuckDB catalog, which makes table references "
                             f"ambiguous; not one of {', '.join(DUCKDB_RESERVED_SCHEMAS)}")
        if target.dsn is not None:
            check_dsn_scheme(target.dsn, DSN_SCHEMES)

    @staticmethod
    def check_run_config(cfg: RunConfig) -> None:
        """Nothing beyond the Params' own rules (the file's location is checked by the policy)."""

    @staticmethod
    def check_policy(cfg: RunConfig, policy: DagPolicy) -> None:
        """Nothing: ``duckdb_path`` is checked against the output roots with every output location."""

    @staticmethod
    def nothing_stored(target: PublishTarget) -> bool:
        """Whether the database file does not exist (checked without creating it)."""
        return not Path(target.duckdb_path or "").exists()

    def open(self) -> duckdb.DuckDBPyConnection:
        """The connection (:func:`connect`; ``inspect_only`` attaches the file read-only)."""
        return connect(self.target, read_only=self.inspect_only)

    def prepare(self) -> None:
        """Create the schema and the registry if missing."""
        self.connection().execute(f"CREATE SCHEMA IF NOT EXISTS {quote_ident(self.target.schema)}")
        _ensure_registry(self.connection(), self.target)

    def transaction(self) -> AbstractContextManager[None]:
        return _transaction(self.connection())

    def rename(self, old: str, new: str) -> None:
        _rename(self.connection(), self.target, old, new)

    def drop(self, suffix: str) -> None:
        _drop(self.connection(), self.target, suffix)

    @contextmanager
    def coverage_db(self, work: Path) -> Iterator[duckdb.DuckDBPyConnection]:
        yield self.connection()

    def read_rows(self, ids: Sequence[str], columns: Sequence[str]) -> pa.Table | None:
        """The live table's rows for ``ids`` (see :class:`~batch_inference.publish.backend.PublishBackend`);
        the ids are joined as a registered Arrow table, so any number of them is one query."""
        con = self.connection()
        if not self.table_exists():
            return None
        have = {r[0] for r in con.execute(
            "SELECT column_name FROM duckdb_columns() WHERE database_name = current_database() "
            "AND schema_name = $s AND table_name = $t", {"s": _schema(self.target), "t": self.target.name()},
        ).fetchall()}
        cols = ["id"] + [c for c in dict.fromkeys(columns) if c in have and c != "id"]
        con.register("batch_inference_wanted_ids", pa.table({"id": pa.array(list(ids), pa.string())}))
        try:
            return con.sql(f"SELECT {', '.join(_dq(c) for c in cols)} FROM {self.target.qualified()} "
                           "WHERE \"id\" IN (SELECT \"id\" FROM batch_inference_wanted_ids)").to_arrow_table()
        finally:
            con.unregister("batch_inference_wanted_ids")

    def load_staging(self, con: duckdb.DuckDBPyConnection, cov: Coverage, record: PublishRecord) -> None:
        _load_staging(con, self.target, cov, record)

    def swap(self, record: PublishRecord) -> None:
        _swap(self.connection(), self.target, record)
