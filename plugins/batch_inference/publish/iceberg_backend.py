"""Apache Iceberg backend (pyiceberg, SQL catalog): one snapshot commit per table, rollback by snapshot.

- Catalog: a pyiceberg ``SqlCatalog`` in a SQLite file beside the warehouse
  (``<warehouse>/../catalog.db``), or in PostgreSQL when the target has a ``dsn``. Namespace: the
  target's schema (default ``batch_inference``). The files of a warehouse whose storage backend has
  ``arrow_filesystem_required`` (``gs://``) go through :class:`StorageFileIO` (the catalog property
  ``py-io-impl``): the same client setup as every other access of the project to that storage (GCS:
  ``STORAGE_EMULATOR_HOST``, ``BATCH_GCS_CREDENTIALS_JSON``, else Application Default Credentials), see
  :func:`catalog_properties`.
- Staging: coverage runs in a scratch DuckDB file; the de-duplicated results stream from it as Arrow
  record batches of :data:`BATCH_ROWS` rows into Parquet data files in the warehouse (pyiceberg's
  writer, files of at most :data:`TARGET_FILE_BYTES` of Arrow data, so memory stays bounded).
  Written data files are not part of any snapshot until the swap: readers cannot see them.
- Swap: per table ONE transaction that adds the new data files and removes the live ones, producing
  ONE snapshot whose summary holds the publish record (:data:`RECORD_PROPERTY`), and moves the tag
  ``<table>__previous`` to the replaced snapshot (the rollback target, kept from snapshot expiry by
  the tag). ``<table>__dead_letters`` commits first, then ``<table>`` (whose snapshot names the dead
  letters snapshot it belongs with, :data:`DEAD_LETTERS_SNAPSHOT_PROPERTY`); the results commit is the
  publish point. Concurrent publishes are serialised by the catalog's optimistic commit: the second
  fails with ``CommitFailedException`` and leaves the table as the first left it.
- Rollback: the current snapshot becomes the one tagged ``<table>__previous`` and the tag moves to the
  replaced snapshot, in one commit (so a second rollback undoes the first); the dead letters table
  follows to the snapshot the restored results snapshot names.
- ``<table>__publish_log``: an Iceberg table, one row appended per publish / rollback after the commit.
- Maintenance: after every publish and rollback each table of the target expires old snapshots and
  deletes orphan files by the deployment's retention (:mod:`batch_inference.publish.iceberg_maintenance`);
  a maintenance failure is logged, never raised (the publish has committed).
- Ownership: every table publish creates carries the table property :data:`OWNER_PROPERTY` = ``"1"``;
  publish and rollback refuse (:class:`~batch_inference.publish.errors.ForeignTableError`) to write to a
  table of the target's family (:data:`ICEBERG_FAMILY`) without it, before writing any data file.
- A catalog that cannot be opened raises :class:`~batch_inference.publish.errors.PublishConnectionError`
  with the DSN and password taken out of the driver's message.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import duckdb
import pyarrow as pa
import pyarrow.fs as pafs
from batch_contract import storage
from batch_contract.engine_config import ConfigError
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.io import PY_IO_IMPL
from pyiceberg.io.pyarrow import PyArrowFileIO, _dataframe_to_data_files
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table, Transaction
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.table.update.snapshot import ManageSnapshots

import batch_inference.publish.duckdb_backend as duckdb_backend
from batch_inference.params import check_conn_allowed, is_shared
from batch_inference.publish.coverage import Coverage
from batch_inference.publish.errors import ForeignTableError, PublishConnectionError, PublishError
from batch_inference.publish.iceberg_maintenance import IcebergRetention, expire_and_clean
from batch_inference.publish.record import LOG_COLUMNS, PublishRecord
from batch_inference.publish.redact import redact
from batch_inference.publish.target import (
    DSN_SCHEMES,
    SUFFIX_DEAD_LETTERS,
    SUFFIX_PREVIOUS,
    SUFFIX_PUBLISH_LOG,
    PublishTarget,
    check_dsn_scheme,
)

if TYPE_CHECKING:
    from batch_inference.params import RunConfig
    from batch_inference.policy import DagPolicy

log = logging.getLogger(__name__)

NAME = "iceberg"
"""This backend's name in :data:`batch_inference.publish.registry.BACKEND_CLASSES`."""
CATALOG_DSN_SCHEMES = (*DSN_SCHEMES, "postgresql+psycopg")
"""URI schemes the catalog ``dsn`` may have (SQLAlchemy's psycopg 3 form too)."""
WAREHOUSE_DIR = "iceberg/warehouse"
"""The warehouse of a run, relative to its ``output_root``."""

RECORD_PROPERTY = "batch-inference.publish-record"
"""Snapshot summary property holding the :class:`PublishRecord` JSON of the run the snapshot holds."""
DEAD_LETTERS_SNAPSHOT_PROPERTY = "batch-inference.dead-letters-snapshot-id"
"""Results snapshot summary property: the ``<table>__dead_letters`` snapshot published with it."""
OWNER_PROPERTY = "batch-inference.publish"
"""Table property (value ``"1"``) marking a table publish created; publish writes to no table without it."""
ICEBERG_FAMILY = ("", SUFFIX_DEAD_LETTERS, SUFFIX_PUBLISH_LOG)
"""Suffixes of the Iceberg tables of a target (``__previous`` is a tag, staging is uncommitted files)."""
BATCH_ROWS = 8192
"""Rows per Arrow batch streamed from DuckDB into the Parquet writer (about 12.6 MB at 384 float32)."""
TARGET_FILE_BYTES = 128 << 20
"""``write.target-file-size-bytes``: pyiceberg buffers this many bytes of Arrow batches per data file
(uncompressed in-memory bytes), so it bounds the writer's memory (pyiceberg's default is 512 MiB)."""
TABLE_PROPERTIES = {
    OWNER_PROPERTY: "1",
    "write.target-file-size-bytes": str(TARGET_FILE_BYTES),
    # embeddings barely compress (docs/publish.md: zstd saved 8-9% of the bytes for twice the CPU)
    "write.parquet.compression-codec": "snappy",
}
"""Properties of the result and dead-letter tables publish creates (existing tables keep theirs)."""


def catalog_uri(target: PublishTarget) -> str:
    """SQLAlchemy URI of the catalog database: PostgreSQL (psycopg 3) from ``target.dsn``, else SQLite
    ``catalog.db`` in the directory holding the warehouse.

    Raises:
        ValueError: a keyword DSN (``host=... dbname=...``; use a URI), or no DSN with a warehouse that
            is not a local directory (``gs://``: a SQLite file cannot live in a bucket).
        StorageError: the warehouse has a scheme no storage backend serves.
    """
    if target.dsn:
        scheme, sep, rest = target.dsn.partition("://")
        if not sep or scheme not in CATALOG_DSN_SCHEMES:
            raise ValueError("dsn: the iceberg catalog needs a postgresql:// URI, not a keyword DSN")
        return "postgresql+psycopg://" + rest
    warehouse = target.iceberg_warehouse or ""
    if not storage.is_local(warehouse):
        raise ValueError("dsn: a gs:// iceberg warehouse needs a PostgreSQL catalog (dsn); "
                         "a SQLite catalog file must be local")
    path = storage.local_path(warehouse).absolute()
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path.parent / 'catalog.db'}"


def sqlite_catalog_file(target: PublishTarget) -> Path | None:
    """The SQLite catalog file of a target without ``dsn`` and with a local warehouse (not created);
    ``None`` when the catalog is in PostgreSQL or the warehouse is not local (``gs://``).

    Raises:
        StorageError: no ``dsn`` and the warehouse has a scheme no storage backend serves.
    """
    warehouse = target.iceberg_warehouse or ""
    if target.dsn or not storage.is_local(warehouse):
        return None
    return storage.local_path(warehouse).absolute().parent / "catalog.db"


def warehouse_uri(target: PublishTarget) -> str:
    """The warehouse location as pyiceberg wants it: a remote URI (``gs://...``) as is, without a trailing
    ``/``; a local path as a ``file://`` URI (the directory is created).

    Raises:
        StorageError: the warehouse has a scheme no storage backend serves.
    """
    warehouse = target.iceberg_warehouse or ""
    if not storage.is_local(warehouse):
        return warehouse.rstrip("/")
    path = storage.local_path(warehouse).absolute()
    path.mkdir(parents=True, exist_ok=True)
    return path.as_uri()


PYICEBERG_SCHEME_ALIASES = {"gcs": "gs"}
"""pyiceberg's other names for a URI scheme of :mod:`batch_contract.storage` (it reads ``gcs://`` as GCS)."""


class StorageFileIO(PyArrowFileIO):
    """pyiceberg's PyArrow FileIO whose filesystem, for a scheme whose storage backend has
    ``arrow_filesystem_required`` (``gs://``, also as pyiceberg's ``gcs://``), is
    :func:`batch_contract.storage.arrow_filesystem`'s.

    pyiceberg's own ``GcsFileSystem`` knows only its ``gcs.*`` catalog properties: it ignores
    ``STORAGE_EMULATOR_HOST`` and ``BATCH_GCS_CREDENTIALS_JSON`` and cannot be anonymous, so against the
    emulator (or on a machine without Application Default Credentials) it retries the metadata server for
    minutes. Every other scheme (local files, a scheme no storage backend serves) is PyArrowFileIO's.
    """

    def _initialize_fs(self, scheme: str, netloc: str | None = None) -> pafs.FileSystem:
        uri = f"{PYICEBERG_SCHEME_ALIASES.get(scheme, scheme)}://{netloc or ''}"
        try:
            required = storage.backend_for(uri).arrow_filesystem_required
        except storage.StorageError:  # a scheme of pyiceberg's only: its own filesystem
            required = False
        if required:
            return storage.arrow_filesystem(uri)[0]
        return super()._initialize_fs(scheme, netloc)


def catalog_properties(target: PublishTarget) -> dict[str, str]:
    """pyiceberg catalog properties of the target: ``uri`` (:func:`catalog_uri`), ``warehouse``
    (:func:`warehouse_uri`) and, for a warehouse whose storage backend has ``arrow_filesystem_required``
    (``gs://``), ``py-io-impl`` = :class:`StorageFileIO`.

    Raises:
        ValueError: see :func:`catalog_uri`.
        StorageError: the warehouse has a scheme no storage backend serves.
    """
    props = {"uri": catalog_uri(target), "warehouse": warehouse_uri(target)}
    if storage.backend_for(props["warehouse"]).arrow_filesystem_required:
        props[PY_IO_IMPL] = f"{StorageFileIO.__module__}.{StorageFileIO.__qualname__}"
    return props


def load_catalog(target: PublishTarget) -> Catalog:
    """The target's SQL catalog (its tables are created on first use)."""
    return SqlCatalog("batch_inference", **catalog_properties(target))


def namespace(target: PublishTarget) -> str:
    """Iceberg namespace of the target: its schema (``PublishTarget.schema``, default
    :data:`~batch_inference.publish.target.DEFAULT_SCHEMA`)."""
    return target.schema


def is_owned(table: Table) -> bool:
    """Whether publish created ``table`` (its :data:`OWNER_PROPERTY` is ``"1"``)."""
    return table.properties.get(OWNER_PROPERTY) == "1"


def snapshot_record(snapshot: Snapshot | None) -> PublishRecord | None:
    """The publish record in a snapshot's summary, or ``None``."""
    if snapshot is None or snapshot.summary is None:
        return None
    return PublishRecord.from_comment(snapshot.summary.additional_properties.get(RECORD_PROPERTY))


def previous_snapshot(table: Table, tag: str) -> Snapshot | None:
    """The snapshot tagged ``tag`` (the rollback target), or ``None``."""
    ref = table.refs().get(tag)
    return table.snapshot_by_id(ref.snapshot_id) if ref else None


@dataclass
class _Staged:
    """Data files written for one table, not yet in any snapshot."""

    table: Table
    tx: Transaction
    files: list[DataFile]

    @property
    def rows(self) -> int:
        return sum(f.record_count for f in self.files)


class IcebergBackend:
    """:class:`~batch_inference.publish.backend.PublishBackend` for Apache Iceberg (see module doc).

    Args:
        target: where to publish.
        inspect_only: open the catalog for reading only (no namespace created).
    """

    dsn_required: ClassVar[bool] = False
    """The target's ``dsn`` (a PostgreSQL catalog) is optional: without it the catalog is a SQLite file."""

    @classmethod
    def target_from_config(cls, cfg: RunConfig, resolve_conn: Callable[[str, str], str]) -> PublishTarget:
        """The target of a run: the warehouse ``<output_root>/iceberg/warehouse``; the catalog in the
        database of the Airflow connection ``cfg.iceberg_catalog_conn_id`` when set
        (``resolve_conn(field, conn_id)`` gives its DSN), else a SQLite file beside the warehouse.

        Raises:
            Whatever ``resolve_conn`` raises (the caller's ``ConfigError`` for an unknown connection).
            ValueError: the target is not valid (:meth:`validate_target`).
        """
        conn_id = cfg.iceberg_catalog_conn_id
        dsn = resolve_conn("iceberg_catalog_conn_id", conn_id) if conn_id else None
        warehouse = f"{cfg.output_root.rstrip('/')}/{WAREHOUSE_DIR}"
        return PublishTarget(backend=NAME, table=cfg.output_table, iceberg_warehouse=warehouse, dsn=dsn)

    @staticmethod
    def validate_target(target: PublishTarget) -> None:
        """This backend's rules for a :class:`PublishTarget` (called by its constructor).

        Raises:
            ValueError: a ``dsn`` URI whose scheme is not in :data:`CATALOG_DSN_SCHEMES` (the message never
                quotes the DSN); no ``iceberg_warehouse``.
        """
        if target.dsn is not None:
            check_dsn_scheme(target.dsn, CATALOG_DSN_SCHEMES)
        if not target.iceberg_warehouse:
            raise ValueError(f"iceberg_warehouse: required when backend is {NAME!r}")

    @staticmethod
    def check_run_config(cfg: RunConfig) -> None:
        """Refuse an ``output_root`` on shared storage (``gs://``) without ``iceberg_catalog_conn_id``:
        the SQLite catalog file must be local; and a broken retention setting
        (:meth:`~batch_inference.publish.iceberg_maintenance.IcebergRetention.from_env`), before any shard.

        Raises:
            ConfigError: ``params.iceberg_catalog_conn_id: ...``, or naming the retention variable.
        """
        IcebergRetention.from_env()
        if is_shared(cfg.output_root) and not cfg.iceberg_catalog_conn_id:
            raise ConfigError("params.iceberg_catalog_conn_id: the iceberg backend with a remote output_root "
                              "needs a PostgreSQL catalog connection (a SQLite catalog file must be local)")

    @staticmethod
    def check_policy(cfg: RunConfig, policy: DagPolicy) -> None:
        """Refuse an ``iceberg_catalog_conn_id`` (when set) outside the deployment's
        ``iceberg_catalog_conn_ids``.

        Raises:
            ConfigError: ``params.iceberg_catalog_conn_id: ...``.
        """
        if cfg.iceberg_catalog_conn_id is not None:
            check_conn_allowed("iceberg_catalog_conn_id", cfg.iceberg_catalog_conn_id,
                               policy.iceberg_catalog_conn_ids, "iceberg_catalog_conn_ids")

    @staticmethod
    def nothing_stored(target: PublishTarget) -> bool:
        """Whether the catalog is a SQLite file (:func:`sqlite_catalog_file`) that does not exist
        (checked without creating it); ``False`` for a PostgreSQL catalog.

        Raises:
            StorageError: no ``dsn`` and the warehouse has a scheme no storage backend serves.
        """
        path = sqlite_catalog_file(target)
        return path is not None and not path.exists()

    def __init__(self, target: PublishTarget, inspect_only: bool = False) -> None:
        self.target = target
        self.inspect_only = inspect_only
        self.catalog: Catalog | None = None
        self.staged: dict[str, _Staged] = {}

    def __enter__(self) -> IcebergBackend:
        """Open the catalog; unless ``inspect_only``, refuse a target with a foreign table before writing
        anything, then create the namespace if missing.

        Raises:
            ValueError: see :func:`catalog_uri`.
            PublishConnectionError: the catalog could not be opened (no DSN or password in the message).
            ForeignTableError: a table of :data:`ICEBERG_FAMILY` exists without :data:`OWNER_PROPERTY`.
        """
        props = catalog_properties(self.target)
        try:
            self.catalog = SqlCatalog("batch_inference", **props)
        except Exception as exc:  # noqa: BLE001 - re-raised below without the DSN
            reason = redact(str(exc), self.target.dsn) or type(exc).__name__
        else:
            reason = None
        if reason is not None:
            raise PublishConnectionError(f"{self.target.describe()}: cannot open the Iceberg catalog: {reason}")
        try:
            if not self.inspect_only:
                foreign = self.foreign_suffixes()
                if foreign:
                    raise ForeignTableError(self.target.describe(), [self.target.display_name(s) for s in foreign])
                self.catalog.create_namespace_if_not_exists(namespace(self.target))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        engine = getattr(self.catalog, "engine", None)
        if engine is not None:
            engine.dispose()
        self.catalog, self.staged = None, {}

    def _catalog(self) -> Catalog:
        assert self.catalog is not None, "use the backend as a context manager"
        return self.catalog

    def ident(self, suffix: str = "") -> tuple[str, str]:
        return (namespace(self.target), self.target.name(suffix))

    def table(self, suffix: str = "") -> Table | None:
        """``<table><suffix>`` or ``None`` if it does not exist."""
        try:
            return self._catalog().load_table(self.ident(suffix))
        except NoSuchTableError:
            return None

    def foreign_suffixes(self) -> list[str]:
        """Suffixes (``""``: the results table) of the target's tables (:data:`ICEBERG_FAMILY`) that exist
        without :data:`OWNER_PROPERTY`."""
        return [s for s in ICEBERG_FAMILY if (t := self.table(s)) is not None and not is_owned(t)]

    def _owned_or_refuse(self, table: Table, suffix: str) -> Table:
        if not is_owned(table):
            raise ForeignTableError(self.target.describe(), [self.target.display_name(suffix)])
        return table

    def read_record(self, previous: bool = False) -> PublishRecord | None:
        table = self.table()
        if table is None:
            return None
        snap = previous_snapshot(table, self.target.name(SUFFIX_PREVIOUS)) if previous else table.current_snapshot()
        return snapshot_record(snap)

    def coverage_db(self, work: Path) -> AbstractContextManager[duckdb.DuckDBPyConnection]:
        return duckdb_backend.scratch_db(work)

    def read_rows(self, ids: Sequence[str], columns: Sequence[str]) -> pa.Table | None:
        """The current snapshot's rows for ``ids`` (see :class:`~batch_inference.publish.backend.PublishBackend`):
        a scan with an ``id IN (...)`` filter (pyiceberg prunes data files by their id statistics)."""
        from pyiceberg.expressions import In

        table = self.table()
        if table is None or table.current_snapshot() is None:
            return None
        have = {f.name for f in table.schema().fields}
        cols = ["id"] + [c for c in dict.fromkeys(columns) if c in have and c != "id"]
        if not ids:
            return table.schema().as_arrow().empty_table().select(cols)
        return table.scan(row_filter=In("id", set(ids)), selected_fields=tuple(cols)).to_arrow()

    def _stage(self, suffix: str, reader: pa.RecordBatchReader) -> _Staged:
        """Write the batches of ``reader`` as data files of ``<table><suffix>`` (created if missing; new
        columns added by name in the transaction that will commit them).

        Raises:
            ForeignTableError: the table exists without :data:`OWNER_PROPERTY` (no file written).
        """
        table = self._catalog().create_table_if_not_exists(self.ident(suffix), schema=reader.schema,
                                                           properties=TABLE_PROPERTIES)
        self._owned_or_refuse(table, suffix)
        tx = table.transaction()
        with tx.update_schema() as update:
            update.union_by_name(reader.schema)
        files = list(_dataframe_to_data_files(tx.table_metadata, reader, table.io, write_uuid=uuid.uuid4()))
        return _Staged(table, tx, files)

    def load_staging(self, con: duckdb.DuckDBPyConnection, cov: Coverage, record: PublishRecord) -> None:
        """Write both tables' data files (bounded memory; invisible until :meth:`swap`).

        Raises:
            ForeignTableError: a table exists without :data:`OWNER_PROPERTY`.
            PublishError: the data files hold another row count than coverage counted.
        """
        params = {"parts": cov.part_files} if cov.part_files else None
        results = con.sql(cov.results_sql(), params=params).to_arrow_reader(BATCH_ROWS)
        self.staged = {"": self._stage("", results)}
        if self.staged[""].rows != cov.rows_published:
            raise PublishError(f"{self.target.describe()}: wrote {self.staged[''].rows} rows, coverage counted "
                               f"{cov.rows_published}")
        dead = con.sql(cov.dead_letters_sql()).to_arrow_reader(BATCH_ROWS)
        self.staged[SUFFIX_DEAD_LETTERS] = self._stage(SUFFIX_DEAD_LETTERS, dead)

    def _commit(self, staged: _Staged, suffix: str, properties: dict[str, str],
                previous_id: int | None) -> Table:
        """One snapshot replacing every live data file of ``staged.table`` by the staged ones; the tag
        ``<table><suffix>__previous`` moves to ``previous_id`` (if any) in the same commit."""
        tx = staged.tx
        live = tx.table_metadata.current_snapshot()
        old_files = [task.file for task in staged.table.scan(snapshot_id=live.snapshot_id).plan_files()] if live else []
        with tx.update_snapshot(snapshot_properties=properties).overwrite() as overwrite:
            for data_file in staged.files:
                overwrite.append_data_file(data_file)
            for data_file in old_files:
                overwrite.delete_data_file(data_file)
        if previous_id is not None:
            ManageSnapshots(tx).create_tag(previous_id, self.target.name(suffix + SUFFIX_PREVIOUS)).commit()
        return tx.commit_transaction()

    def swap(self, record: PublishRecord) -> None:
        """Commit the dead letters, then the results (the publish point), then log, then maintain
        (:meth:`maintain`).

        Raises:
            ConfigError: a broken retention setting (checked before any commit).
        """
        retention = IcebergRetention.from_env()
        props = {RECORD_PROPERTY: record.to_comment()}
        results, dead = self.staged[""], self.staged[SUFFIX_DEAD_LETTERS]
        live = results.tx.table_metadata.current_snapshot()
        paired = _paired_dead_letters(live)
        dead_live = dead.tx.table_metadata.current_snapshot()
        dead_prev = paired if paired is not None else (dead_live.snapshot_id if dead_live else None)
        dead_table = self._commit(dead, SUFFIX_DEAD_LETTERS, props, dead_prev)
        dead_snap = dead_table.current_snapshot()
        if dead_snap is not None:
            props[DEAD_LETTERS_SNAPSHOT_PROPERTY] = str(dead_snap.snapshot_id)
        self._commit(results, "", props, live.snapshot_id if live else None)
        self.staged = {}
        self._log(record, "publish")
        self.maintain(retention)

    def maintain(self, retention: IcebergRetention) -> dict[str, dict[str, int]]:
        """:func:`~batch_inference.publish.iceberg_maintenance.expire_and_clean` on each existing table of
        the target (results, dead letters, publish log). A failure is logged as a warning and that
        table is skipped: it runs after the commit, which stands.

        Returns:
            Table suffix (``""``: the results) -> its counts (``snapshots_expired``, ``files_removed``,
            ``bytes_removed``), for the tables maintained.
        """
        done = {}
        for suffix in ICEBERG_FAMILY:
            table = self.table(suffix)
            if table is None or not is_owned(table):
                continue
            try:
                done[suffix] = expire_and_clean(table, retention)
            except Exception as exc:  # noqa: BLE001 - maintenance never fails a committed publish
                log.warning("iceberg maintenance of %s skipped: %s: %s", self.target.display_name(suffix),
                            type(exc).__name__, redact(str(exc), self.target.dsn))
        return done

    def has_previous(self) -> bool:
        table = self.table()
        return table is not None and previous_snapshot(table, self.target.name(SUFFIX_PREVIOUS)) is not None

    def restore_previous(self, restored: PublishRecord | None) -> None:
        """Dead letters to the snapshot the restored results name, then results to the tagged snapshot;
        each tag moves to the snapshot it replaces.

        Raises:
            ForeignTableError: a table exists without :data:`OWNER_PROPERTY` (nothing changed).
            ConfigError: a broken retention setting (nothing changed).
        """
        retention = IcebergRetention.from_env()
        table = self.table()
        assert table is not None
        self._owned_or_refuse(table, "")
        for suffix in (SUFFIX_DEAD_LETTERS, SUFFIX_PUBLISH_LOG):
            if (other := self.table(suffix)) is not None:
                self._owned_or_refuse(other, suffix)
        prev_tag = self.target.name(SUFFIX_PREVIOUS)
        prev, cur = previous_snapshot(table, prev_tag), table.current_snapshot()
        assert prev is not None and cur is not None
        dead = self.table(SUFFIX_DEAD_LETTERS)
        want, replaced = _paired_dead_letters(prev), _paired_dead_letters(cur)
        if dead is not None and want is not None and dead.snapshot_by_id(want) is not None:
            _set_current(dead, want, self.target.name(SUFFIX_DEAD_LETTERS + SUFFIX_PREVIOUS),
                         replaced if replaced is not None and dead.snapshot_by_id(replaced) else None)
        _set_current(table, prev.snapshot_id, prev_tag, cur.snapshot_id)
        if restored is not None:
            self._log(restored, "rollback")
        self.maintain(retention)

    def _log(self, record: PublishRecord, action: str) -> None:
        schema = pa.schema([(n, pa.string() if t == "VARCHAR" else pa.int64()) for n, t in LOG_COLUMNS])
        row = pa.Table.from_pylist([dict(zip([n for n, _ in LOG_COLUMNS], record.log_row(action), strict=True))],
                                   schema=schema)
        log = self._catalog().create_table_if_not_exists(self.ident(SUFFIX_PUBLISH_LOG), schema=schema,
                                                         properties={OWNER_PROPERTY: "1"})
        self._owned_or_refuse(log, SUFFIX_PUBLISH_LOG).append(row)


def _paired_dead_letters(snapshot: Snapshot | None) -> int | None:
    if snapshot is None or snapshot.summary is None:
        return None
    value = snapshot.summary.additional_properties.get(DEAD_LETTERS_SNAPSHOT_PROPERTY)
    return int(value) if value else None


def _set_current(table: Table, snapshot_id: int, tag: str, tag_to: int | None) -> None:
    """One commit: ``snapshot_id`` becomes current; ``tag`` moves to ``tag_to`` (if given)."""
    tx = table.transaction()
    manage = ManageSnapshots(tx).set_current_snapshot(snapshot_id)
    if tag_to is not None:
        manage.create_tag(tag_to, tag)
    manage.commit()
    tx.commit_transaction()
