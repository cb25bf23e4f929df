"""PostgreSQL backend (psycopg 3): binary ``COPY`` into staging tables, swap in one transaction.

Coverage and de-duplication run in a scratch DuckDB database (a file in a temp directory, so it spills
instead of growing memory); the de-duplicated rows stream from DuckDB as Arrow record batches, are
encoded by :mod:`~batch_inference.publish.pg_copy` and written with ``COPY ... FROM STDIN (FORMAT
BINARY)``. The primary key is added after the load (one index build instead of per-row maintenance)
and before the swap. A session advisory lock per target serialises concurrent publishes/rollbacks.

Ownership: every table publish creates is marked by its OID in
:data:`~batch_inference.publish.target.REGISTRY_TABLE` (in the target's schema, created with the schema),
in the transaction that creates it; an OID stays with a table through renames, and a table dropped and
created again by someone else gets a new one. Every drop and rename first checks the mark
(:class:`~batch_inference.publish.errors.ForeignTableError` otherwise). Connection errors are re-raised
as :class:`~batch_inference.publish.errors.PublishConnectionError` with the DSN and password taken out.
"""

from __future__ import annotations

import queue
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import duckdb
import psycopg
import pyarrow as pa
from psycopg import sql

from batch_inference.params import check_conn_allowed
from batch_inference.publish import duckdb_backend
from batch_inference.publish.coverage import Coverage
from batch_inference.publish.errors import ForeignTableError, PublishConnectionError, PublishError
from batch_inference.publish.pg_copy import COPY_HEADER, COPY_TRAILER, PgColumn, encode_batch, pg_columns
from batch_inference.publish.record import LOG_COLUMNS, PublishRecord
from batch_inference.publish.redact import redact
from batch_inference.publish.sql_tables import SqlDialect, SqlTableBackend
from batch_inference.publish.target import (
    DSN_SCHEMES,
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

NAME = "postgres"
"""This backend's name in :data:`batch_inference.publish.registry.BACKEND_CLASSES`."""

COPY_WORKERS = 2
"""Parallel COPY connections for the result rows (PostgreSQL parses ``real[]`` on one core per
connection; measured at 1M x 384: server 17 CPU-s vs 6 CPU-s for this process)."""
BATCH_ROWS = 8192
"""Rows per Arrow batch streamed into COPY (about 25 MB of COPY data at 384 float32 dims)."""
LOCK_TIMEOUT = "60s"
"""How long the swap waits for readers' locks on the live table before failing (and rolling back)."""
STAGING_DL = SUFFIX_DEAD_LETTERS + SUFFIX_STAGING


def _ident(target: PublishTarget, suffix: str = "") -> sql.Composable:
    return sql.SQL(target.qualified(suffix))


def connect_dsn(dsn: str, where: str, **kwargs: object) -> psycopg.Connection:
    """``psycopg.connect(dsn, **kwargs)`` whose failure never shows ``dsn``.

    Args:
        dsn: libpq connection string or URI.
        where: what is connecting, for the message (``target.describe()``; never the DSN).

    Raises:
        PublishConnectionError: connecting failed; the message is ``where`` and psycopg's reason through
            :func:`~batch_inference.publish.redact.redact`, with no exception chained.
    """
    try:
        return psycopg.connect(dsn, **kwargs)
    except Exception as exc:  # noqa: BLE001 - every failure is re-raised below, without the DSN
        reason = redact(str(exc), dsn) or type(exc).__name__
    raise PublishConnectionError(f"{where}: cannot connect to PostgreSQL: {reason}")


def _registry(target: PublishTarget) -> sql.Composable:
    return sql.SQL(f"{quote_ident(target.schema)}.{quote_ident(REGISTRY_TABLE)}")


def _connect(target: PublishTarget, inspect_only: bool = False) -> psycopg.Connection:
    """An autocommit connection, holding the target's session advisory lock unless ``inspect_only``."""
    conn = connect_dsn(target.dsn or "", target.describe(), autocommit=True)
    try:
        conn.execute("SET client_encoding TO 'UTF8'")
        if not inspect_only:
            conn.execute("SELECT pg_advisory_lock(hashtext(%s))", [f"batch_inference.publish:{target.qualified()}"])
    except BaseException:
        conn.close()
        raise
    return conn


def _prepare(conn: psycopg.Connection, target: PublishTarget) -> None:
    """Create the schema and the registry of marked tables if missing, under a transaction-level
    advisory lock per schema (``CREATE ... IF NOT EXISTS`` is not safe against a concurrent twin)."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [f"batch_inference.publish.schema:{target.schema}"])
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.SQL(quote_ident(target.schema))))
        conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (relid oid PRIMARY KEY, created_as text NOT NULL, "
                             "created_at timestamptz NOT NULL DEFAULT now())").format(_registry(target)))


def table_exists(conn: psycopg.Connection, target: PublishTarget, suffix: str = "") -> bool:
    """Whether a relation ``<schema>.<table><suffix>`` exists (a table, or a view or sequence by that name)."""
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", [target.qualified(suffix)]).fetchone()
    return bool(row and row[0])


def is_marked(conn: psycopg.Connection, target: PublishTarget, suffix: str = "") -> bool:
    """Whether ``<table><suffix>`` exists and its OID is in the registry (publish created it)."""
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL",
                       [f"{quote_ident(target.schema)}.{quote_ident(REGISTRY_TABLE)}"]).fetchone()
    if not (row and row[0]):
        return False
    row = conn.execute(sql.SQL("SELECT EXISTS (SELECT 1 FROM {} WHERE relid = to_regclass(%s)::oid)").format(
        _registry(target)), [target.qualified(suffix)]).fetchone()
    return bool(row and row[0])


def _mark(conn: psycopg.Connection, target: PublishTarget, suffix: str) -> None:
    conn.execute(sql.SQL("INSERT INTO {} (relid, created_as) VALUES (to_regclass(%s)::oid, %s) "
                         "ON CONFLICT (relid) DO NOTHING").format(_registry(target)),
                 [target.qualified(suffix), target.name(suffix)])


def _require_marked(conn: psycopg.Connection, target: PublishTarget, suffix: str) -> None:
    """Raise :class:`ForeignTableError` if ``<table><suffix>`` exists without publish's mark."""
    if table_exists(conn, target, suffix) and not is_marked(conn, target, suffix):
        raise ForeignTableError(target.describe(), [target.display_name(suffix)])


def _drop(conn: psycopg.Connection, target: PublishTarget, suffix: str) -> None:
    """Drop ``<table><suffix>`` if it exists, after checking publish's mark (then removed with it).

    Raises:
        ForeignTableError: the table exists without the mark (nothing dropped).
    """
    if not table_exists(conn, target, suffix):
        return
    _require_marked(conn, target, suffix)
    with conn.transaction():
        conn.execute(sql.SQL("DELETE FROM {} WHERE relid = to_regclass(%s)::oid").format(_registry(target)),
                     [target.qualified(suffix)])
        conn.execute(sql.SQL("DROP TABLE {}").format(_ident(target, suffix)))


def read_record(conn: psycopg.Connection, target: PublishTarget, suffix: str = "") -> PublishRecord | None:
    """The :class:`PublishRecord` in the comment of ``<table><suffix>``, or ``None``."""
    row = conn.execute("SELECT obj_description(to_regclass(%s), 'pg_class')", [target.qualified(suffix)]).fetchone()
    return PublishRecord.from_comment(row[0]) if row else None


def _has_pgvector(conn: psycopg.Connection) -> bool:
    row = conn.execute("SELECT count(*) FROM pg_extension WHERE extname = 'vector'").fetchone()
    return bool(row and row[0])


def _ensure_log(conn: psycopg.Connection, target: PublishTarget) -> None:
    """Create ``<table>__publish_log`` (marked) if missing.

    Raises:
        ForeignTableError: it exists without publish's mark.
    """
    if table_exists(conn, target, SUFFIX_PUBLISH_LOG):
        _require_marked(conn, target, SUFFIX_PUBLISH_LOG)
        return
    cols = sql.SQL(", ").join(
        sql.SQL("{} {}").format(sql.SQL(quote_ident(n)), sql.SQL("TEXT" if t == "VARCHAR" else t))
        for n, t in LOG_COLUMNS
    )
    with conn.transaction():
        conn.execute(sql.SQL("CREATE TABLE {} ({})").format(_ident(target, SUFFIX_PUBLISH_LOG), cols))
        _mark(conn, target, SUFFIX_PUBLISH_LOG)


def _insert_log(conn: psycopg.Connection, target: PublishTarget, record: PublishRecord, action: str) -> None:
    marks = sql.SQL(", ").join(sql.Placeholder() for _ in LOG_COLUMNS)
    conn.execute(sql.SQL("INSERT INTO {} VALUES ({})").format(_ident(target, SUFFIX_PUBLISH_LOG), marks),
                 record.log_row(action))


def _copy_sql(table: sql.Composable, columns: list[PgColumn]) -> sql.Composed:
    names = sql.SQL(", ").join(sql.Identifier(c.name) for c in columns)
    return sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(table, names)


def _copy_batches(conn: psycopg.Connection, table: sql.Composable, batches: Iterator[pa.RecordBatch],
                  columns: list[PgColumn]) -> int:
    """One binary COPY of every batch into ``table`` on ``conn``; returns rows copied."""
    rows = 0
    with conn.cursor().copy(_copy_sql(table, columns)) as copy:
        copy.write(COPY_HEADER)
        for batch in batches:
            if batch.num_rows:
                copy.write(encode_batch(batch, columns))
                rows += batch.num_rows
        copy.write(COPY_TRAILER)
    return rows


def _drain(q: queue.Queue) -> Iterator[pa.RecordBatch]:
    while (batch := q.get()) is not None:
        yield batch


def _put(q: queue.Queue, item: pa.RecordBatch | None, threads: list[threading.Thread]) -> bool:
    """Put ``item`` unless every consumer thread has died (then ``False``; never blocks forever)."""
    while True:
        try:
            q.put(item, timeout=0.5)
            return True
        except queue.Full:
            if not any(t.is_alive() for t in threads):
                return False


def _parallel_copy(target: PublishTarget, table: sql.Composable, reader: pa.RecordBatchReader,
                   columns: list[PgColumn], workers: int) -> int:
    """COPY the batches of ``reader`` into the committed, empty ``table`` over ``workers`` connections.

    Batches are handed out through a bounded queue (at most ``2 * workers`` batches in flight, about
    25 MB each at 384 dims), encoded in the worker threads (NumPy/Arrow kernels release the GIL) and
    committed per connection. The server parses arrays on one core per connection, which is the
    bottleneck of a single COPY.

    Returns:
        Rows copied.

    Raises:
        The first worker error (after every worker has stopped); a failed connect as
        :class:`PublishConnectionError` (no DSN in it).
    """
    q: queue.Queue = queue.Queue(maxsize=2 * workers)
    counts = [0] * workers
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            with connect_dsn(target.dsn or "", target.describe()) as conn:
                conn.execute("SET client_encoding TO 'UTF8'")
                counts[i] = _copy_batches(conn, table, _drain(q), columns)
                conn.commit()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,), name=f"publish-copy-{i}") for i in range(workers)]
    for t in threads:
        t.start()
    try:
        for batch in reader:
            if errors or not _put(q, batch, threads):
                break
    finally:
        for _ in threads:
            _put(q, None, threads)
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    return sum(counts)


def _create_table(conn: psycopg.Connection, target: PublishTarget, suffix: str, columns: list[PgColumn],
                  not_null: set[str]) -> None:
    """(Re)create ``<table><suffix>`` marked as publish's, in one transaction (a savepoint inside one).

    Raises:
        ForeignTableError: a table of that name exists without publish's mark (nothing changed).
    """
    defs = sql.SQL(", ").join(
        sql.SQL("{} {}{}").format(sql.Identifier(c.name), sql.SQL(c.pg_type),
                                  sql.SQL(" NOT NULL" if c.name in not_null else ""))
        for c in columns
    )
    with conn.transaction():
        _drop(conn, target, suffix)
        conn.execute(sql.SQL("CREATE TABLE {} ({})").format(_ident(target, suffix), defs))
        _mark(conn, target, suffix)


def _add_primary_key(conn: psycopg.Connection, table: sql.Composable, key: list[str]) -> None:
    """Primary key built once after the load; a fresh constraint name per publish, because index names
    stay with a table through renames and must not collide with the live or previous table's."""
    pk_name = sql.Identifier(f"pk_{uuid.uuid4().hex[:16]}")
    conn.execute(sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} PRIMARY KEY ({})").format(
        table, pk_name, sql.SQL(", ").join(sql.Identifier(k) for k in key)))


def _load_staging(conn: psycopg.Connection, scratch: duckdb.DuckDBPyConnection, target: PublishTarget,
                  cov: Coverage, record: PublishRecord) -> None:
    """Fill both staging tables (results over :data:`COPY_WORKERS` connections), then build keys,
    comments and statistics in one transaction. Staging tables are never read by consumers; a crash at
    any point leaves them for the next publish to drop."""
    use_vector = _has_pgvector(conn)
    staging, staging_dl = _ident(target, SUFFIX_STAGING), _ident(target, STAGING_DL)
    params = {"parts": cov.part_files} if cov.part_files else None
    results = scratch.sql(cov.results_sql(), params=params).to_arrow_reader(BATCH_ROWS)
    columns = pg_columns(results.schema, use_vector=use_vector)
    _create_table(conn, target, SUFFIX_STAGING, columns, set())  # committed: visible to the copy connections
    loaded = _parallel_copy(target, staging, results, columns, COPY_WORKERS)
    if loaded != cov.rows_published:
        raise PublishError(f"{target.qualified(SUFFIX_STAGING)}: copied {loaded} rows, coverage "
                           f"counted {cov.rows_published}")
    dead = scratch.sql(cov.dead_letters_sql()).to_arrow_reader(BATCH_ROWS)
    comment = sql.Literal(record.to_comment())
    with conn.transaction():
        dl_columns = pg_columns(dead.schema, use_vector=False)
        _create_table(conn, target, STAGING_DL, dl_columns,
                      {"reason", "detail", "source_uri", "source_row", "fingerprint"})
        _copy_batches(conn, staging_dl, iter(dead), dl_columns)
        _add_primary_key(conn, staging, ["id"])
        _add_primary_key(conn, staging_dl, ["source_uri", "source_row"])
        conn.execute(sql.SQL("COMMENT ON TABLE {} IS {}").format(staging, comment))
        conn.execute(sql.SQL("COMMENT ON TABLE {} IS {}").format(staging_dl, comment))
        conn.execute(sql.SQL("ANALYZE {}").format(staging))
        _ensure_log(conn, target)


def _rename(conn: psycopg.Connection, target: PublishTarget, old: str, new: str) -> None:
    """Rename ``<table><old>`` to ``<table><new>`` if it exists (the OID, so the mark, goes with it).

    Raises:
        ForeignTableError: ``<table><old>`` exists without publish's mark (nothing renamed).
    """
    if not table_exists(conn, target, old):
        return
    _require_marked(conn, target, old)
    conn.execute(sql.SQL("ALTER TABLE {} RENAME TO {}").format(
        _ident(target, old), sql.SQL(quote_ident(target.name(new)))))


def _swap(conn: psycopg.Connection, target: PublishTarget, record: PublishRecord) -> None:
    """One transaction: live -> previous (older previous dropped), staging -> live, for both tables;
    every table checked for publish's mark first (:class:`ForeignTableError`, nothing changed)."""
    with conn.transaction():
        conn.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        for base in ("", SUFFIX_DEAD_LETTERS):
            if not table_exists(conn, target, base + SUFFIX_STAGING):
                raise PublishError(f"{target.display_name(base + SUFFIX_STAGING)} vanished before the swap")
            for suffix in (base + SUFFIX_STAGING, base, base + SUFFIX_PREVIOUS):
                _require_marked(conn, target, suffix)
            _drop(conn, target, base + SUFFIX_PREVIOUS)
            _rename(conn, target, base, base + SUFFIX_PREVIOUS)
            _rename(conn, target, base + SUFFIX_STAGING, base)
        _insert_log(conn, target, record, "publish")


class PostgresBackend(SqlTableBackend):
    """:class:`~batch_inference.publish.backend.PublishBackend` for PostgreSQL: coverage in a scratch
    DuckDB file, binary COPY into staging tables, renames in one transaction. The connection holds a
    session advisory lock per target for the whole publish / rollback."""

    dialect = SqlDialect(table_exists=table_exists, read_record=read_record, ensure_log=_ensure_log,
                         insert_log=_insert_log, is_marked=is_marked)

    dsn_required: ClassVar[bool] = True
    """The target needs a ``dsn`` (the server to publish into)."""

    @classmethod
    def target_from_config(cls, cfg: RunConfig, resolve_conn: Callable[[str, str], str]) -> PublishTarget:
        """The target of a run: the server of the Airflow connection ``cfg.postgres_conn_id``
        (``resolve_conn(field, conn_id)`` gives its DSN).

        Raises:
            Whatever ``resolve_conn`` raises (the caller's ``ConfigError`` for an unknown connection).
            ValueError: the target is not valid (:meth:`validate_target`).
        """
        return PublishTarget(backend=NAME, table=cfg.output_table,
                             dsn=resolve_conn("postgres_conn_id", cfg.postgres_conn_id))

    @staticmethod
    def validate_target(target: PublishTarget) -> None:
        """This backend's rules for a :class:`PublishTarget` (called by its constructor).

        Raises:
            ValueError: no ``dsn``, or a ``dsn`` URI whose scheme is not in :data:`DSN_SCHEMES` (the
                message never quotes the DSN).
        """
        if not target.dsn:
            raise ValueError(f"dsn: required when backend is {NAME!r}")
        check_dsn_scheme(target.dsn, DSN_SCHEMES)

    @staticmethod
    def check_run_config(cfg: RunConfig) -> None:
        """Nothing beyond the Params' own rules (the connection is resolved when the target is built)."""

    @staticmethod
    def check_policy(cfg: RunConfig, policy: DagPolicy) -> None:
        """Refuse a ``postgres_conn_id`` outside the deployment's ``postgres_conn_ids``.

        Raises:
            ConfigError: ``params.postgres_conn_id: ...``.
        """
        check_conn_allowed("postgres_conn_id", cfg.postgres_conn_id, policy.postgres_conn_ids,
                           "postgres_conn_ids")

    @staticmethod
    def nothing_stored(target: PublishTarget) -> bool:
        """``False``: whether a server holds the table is known only by connecting."""
        return False

    def open(self) -> psycopg.Connection:
        return _connect(self.target, self.inspect_only)

    def prepare(self) -> None:
        _prepare(self.connection(), self.target)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        conn = self.connection()
        with conn.transaction():
            conn.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
            yield

    def rename(self, old: str, new: str) -> None:
        _rename(self.connection(), self.target, old, new)

    def drop(self, suffix: str) -> None:
        _drop(self.connection(), self.target, suffix)

    def coverage_db(self, work: Path) -> AbstractContextManager[duckdb.DuckDBPyConnection]:
        return duckdb_backend.scratch_db(work)

    def read_rows(self, ids: Sequence[str], columns: Sequence[str]) -> pa.Table | None:
        """The live table's rows for ``ids`` (see :class:`~batch_inference.publish.backend.PublishBackend`):
        one ``WHERE id = ANY(...)`` query; ``real[]`` and pgvector ``vector`` columns come back as lists of
        float32 (``vector`` cast to ``real[]`` in the query)."""
        conn = self.connection()
        if not self.table_exists():
            return None
        types = dict(conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped", [self.target.qualified()],
        ).fetchall())
        cols = ["id"] + [c for c in dict.fromkeys(columns) if c in types and c != "id"]
        select = sql.SQL(", ").join(
            sql.SQL("{}::real[]").format(sql.Identifier(c)) if types[c].startswith("vector") else sql.Identifier(c)
            for c in cols)
        rows = conn.execute(sql.SQL("SELECT {} FROM {} WHERE {} = ANY(%s)").format(
            select, _ident(self.target), sql.Identifier("id")), [list(ids)]).fetchall()
        arrays = []
        for i, c in enumerate(cols):
            values = [r[i] for r in rows]
            floats = types[c].startswith(("vector", "real[]"))
            arrays.append(pa.array(values, pa.list_(pa.float32()) if floats else None))
        return pa.Table.from_arrays(arrays, names=cols)

    def load_staging(self, con: duckdb.DuckDBPyConnection, cov: Coverage, record: PublishRecord) -> None:
        _load_staging(self.connection(), con, self.target, cov, record)

    def swap(self, record: PublishRecord) -> None:
        _swap(self.connection(), self.target, record)
