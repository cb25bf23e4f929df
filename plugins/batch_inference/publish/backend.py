"""The small protocol every publish backend implements, and the registry that maps backend names to it.

The publish and rollback skeletons (:mod:`~batch_inference.publish.skeleton`) own the order of the
steps (inventory, no-op check, coverage, staging, ``after_staging`` hook, swap + log); a backend only
says how each step is done on its storage. Backend modules are imported when first used, so psycopg
and pyiceberg are needed only by the backends that use them.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

import duckdb
import pyarrow as pa

from batch_inference.publish.coverage import Coverage
from batch_inference.publish.record import PublishRecord
from batch_inference.publish.target import BACKEND_CLASSES, PublishTarget


class PublishBackend(Protocol):
    """One publish or rollback against one target; a context manager that holds the connection.

    ``__enter__`` connects (and creates the schema / namespace if missing), ``__exit__`` closes. Every
    method may raise the storage driver's errors (``duckdb.Error``, ``psycopg.Error``, pyiceberg's
    exceptions); the live table is unchanged whenever one does before :meth:`swap` commits.
    """

    target: PublishTarget

    def __enter__(self) -> PublishBackend: ...

    def __exit__(self, *exc: object) -> None: ...

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

def backend_for(target: PublishTarget) -> PublishBackend:
    """A (not yet entered) backend instance for ``target``.

    Raises:
        ImportError: the backend's driver (psycopg, pyiceberg) is not installed.
    """
    module, cls = BACKEND_CLASSES[target.backend].split(":")
    return getattr(importlib.import_module(module), cls)(target)


def read_published(target: PublishTarget, ids: Sequence[str],
                   columns: Sequence[str]) -> tuple[PublishRecord | None, pa.Table | None]:
    """The live table's publish record and its rows for ``ids`` (:meth:`PublishBackend.read_rows`).

    A DuckDB target whose database file does not exist yet has no live table: ``(None, None)`` without
    creating the file. A live table that publish did not write (no record) gives ``(None, None)`` too.

    Raises:
        ImportError: the backend's driver is not installed; the storage driver's errors as the backend's.
    """
    if target.backend == "duckdb" and not Path(target.duckdb_path or "").exists():
        return None, None
    with backend_for(target) as backend:
        record = backend.read_record()
        if record is None:
            return None, None
        return record, backend.read_rows(list(ids), list(columns))
