"""The small protocol every publish backend implements, and the factory of backend instances.

Which backends exist is :mod:`batch_inference.publish.registry`'s; :func:`backend_for` builds one from it.
The publish and rollback skeletons (:mod:`~batch_inference.publish.skeleton`) own the order of the
steps (inventory, no-op check, coverage, staging, ``after_staging`` hook, swap + log); a backend only
says how each step is done on its storage. Backend modules are imported when first used, so psycopg
and pyiceberg are needed only by the backends that use them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol

import duckdb
import pyarrow as pa

from batch_inference.publish.coverage import Coverage
from batch_inference.publish.errors import ForeignTableError
from batch_inference.publish.record import PublishRecord
from batch_inference.publish.registry import backend_class
from batch_inference.publish.target import PublishTarget

if TYPE_CHECKING:
    from batch_inference.params import RunConfig
    from batch_inference.policy import DagPolicy


class PublishBackend(Protocol):
    """One publish or rollback against one target; a context manager that holds the connection.

    ``__enter__`` connects (and creates the schema / namespace if missing, unless the backend was built
    with ``inspect_only``), ``__exit__`` closes; a failed connect raises
    :class:`~batch_inference.publish.errors.PublishConnectionError` (no DSN in it). Every method may raise
    the storage driver's errors (``duckdb.Error``, ``psycopg.Error``, pyiceberg's exceptions); the live
    table is unchanged whenever one does before :meth:`swap` commits. A method that would drop, rename
    or write to a table publish did not create raises
    :class:`~batch_inference.publish.errors.ForeignTableError` instead.
    """

    target: PublishTarget

    dsn_required: ClassVar[bool]
    """Whether a target of this backend needs a ``dsn`` (the publish CLI refuses to run without one)."""

    @classmethod
    def target_from_config(cls, cfg: RunConfig, resolve_conn: Callable[[str, str], str]) -> PublishTarget:
        """The run's target; ``resolve_conn(field, conn_id)`` gives the DSN of an Airflow connection Param
        (and raises ``ConfigError`` for an unusable one)."""
        ...

    @staticmethod
    def validate_target(target: PublishTarget) -> None:
        """This backend's rules for a target (run by the :class:`PublishTarget` constructor after the
        shared ones). Raises ``ValueError`` naming the field."""
        ...

    @staticmethod
    def check_run_config(cfg: RunConfig) -> None:
        """The checks of this backend's Params a trigger form cannot make. Raises ``ConfigError``."""
        ...

    @staticmethod
    def check_policy(cfg: RunConfig, policy: DagPolicy) -> None:
        """This backend's Params against the DAG's deployment settings. Raises ``ConfigError``."""
        ...

    @staticmethod
    def nothing_stored(target: PublishTarget) -> bool:
        """Whether the target's storage does not exist yet (checked without creating anything)."""
        ...

    def __enter__(self) -> PublishBackend: ...

    def __exit__(self, *exc: object) -> None: ...

    def foreign_suffixes(self) -> list[str]:
        """Suffixes (``""``: the live table) of the tables of the target that publish would create,
        replace, rename or drop and that exist without publish's mark."""
        ...

    def read_record(self, previous: bool = False) -> PublishRecord | None:
        """The record of the live table (or of the rollback target when ``previous``); ``None`` when
        there is none or it was not written by publish."""
        ...

    def read_rows(self, ids: Sequence[str], columns: Sequence[str]) -> pa.Table | None:
        """The live table's rows whose ``id`` is in ``ids``: a table with ``id`` (string) and those of
        ``columns`` the live table has (embeddings as lists of float32, labels and LLM outputs as strings),
        in no particular order; ``None`` when there is no live table. Reads only; used by the upgrade
        canary to compare a new model's outputs with the published ones."""
        ...

    def coverage_db(self, work: Path) -> AbstractContextManager[duckdb.DuckDBPyConnection]:
        """The DuckDB connection coverage runs in (temp tables; ``work`` is a scratch directory the
        caller removes after :meth:`load_staging`)."""
        ...

    def load_staging(self, con: duckdb.DuckDBPyConnection, cov: Coverage, record: PublishRecord) -> None:
        """Write the results and dead letters of ``cov`` where readers cannot see them yet.

        Raises:
            PublishError: the rows written differ from ``cov.rows_published``.
        """
        ...

    def swap(self, record: PublishRecord) -> None:
        """Make the staged data live in one commit (the old live data becomes the rollback target)
        and log the publish."""
        ...

    def has_previous(self) -> bool:
        """Whether there is a rollback target."""
        ...

    def restore_previous(self, restored: PublishRecord | None) -> None:
        """Exchange the live data and the rollback target in one commit and log the rollback of
        ``restored`` (nothing logged when ``None``)."""
        ...

def backend_for(target: PublishTarget, *, inspect_only: bool = False) -> PublishBackend:
    """A (not yet entered) backend instance for ``target``; ``inspect_only``: for reading only (creates
    no schema, namespace, registry or lock; a DuckDB file is attached read-only).

    Raises:
        ImportError: the backend's driver (psycopg, pyiceberg) is not installed.
    """
    return backend_class(target.backend)(target, inspect_only=inspect_only)


def check_owned(backend: PublishBackend) -> None:
    """Refuse a target whose family of tables holds one publish did not create (an entered backend).

    Raises:
        ForeignTableError: naming every such table (``schema.table``).
    """
    foreign = backend.foreign_suffixes()
    if foreign:
        raise ForeignTableError(backend.target.describe(), [backend.target.display_name(s) for s in foreign])


def nothing_stored(target: PublishTarget) -> bool:
    """Whether the target's storage does not exist yet, so it holds no table (checked without creating
    anything): the backend's ``nothing_stored`` (a missing DuckDB file or SQLite Iceberg catalog file;
    ``False`` for PostgreSQL).

    Raises:
        ImportError: the backend's driver is not installed.
    """
    return backend_class(target.backend).nothing_stored(target)


def read_published(target: PublishTarget, ids: Sequence[str],
                   columns: Sequence[str]) -> tuple[PublishRecord | None, pa.Table | None]:
    """The live table's publish record and its rows for ``ids`` (:meth:`PublishBackend.read_rows`).

    A target whose storage does not exist yet (:func:`nothing_stored`) has no live table:
    ``(None, None)`` without creating anything. A live table that publish did not write (no record, or
    no publish mark) gives ``(None, None)`` too. Reads only (``inspect_only`` backend).

    Raises:
        ImportError: the backend's driver is not installed.
        PublishConnectionError: the database or catalog could not be opened.
        The storage driver's errors as the backend's.
    """
    if nothing_stored(target):
        return None, None
    with backend_for(target, inspect_only=True) as backend:
        if "" in backend.foreign_suffixes():
            return None, None
        record = backend.read_record()
        if record is None:
            return None, None
        return record, backend.read_rows(list(ids), list(columns))
