"""What the two SQL-table backends (DuckDB, PostgreSQL) share: one connection held for a publish or
rollback, the live record read from the table comment, and a rollback that exchanges ``<table>`` and
``<table>__previous`` (and their dead-letter tables) through the staging name in one transaction.
A subclass supplies the dialect: its table functions (:class:`SqlDialect`) and the small methods marked
abstract (connect, transaction, rename, drop). Every table of the target's family
(:data:`~batch_inference.publish.target.TABLE_FAMILY`) must carry publish's mark (the backend's
``is_marked``) before it is renamed or dropped; :meth:`SqlTableBackend.foreign_suffixes` lists those
that do not.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, ClassVar

from batch_inference.publish.errors import ForeignTableError
from batch_inference.publish.record import PublishRecord
from batch_inference.publish.target import (
    SUFFIX_DEAD_LETTERS,
    SUFFIX_PREVIOUS,
    SUFFIX_STAGING,
    TABLE_FAMILY,
    PublishTarget,
)


@dataclass(frozen=True)
class SqlDialect:
    """A backend's table functions, each taking ``(connection, target, ...)``: ``table_exists(con,
    target, suffix)``, ``read_record(con, target, suffix)``, ``ensure_log(con, target)``,
    ``insert_log(con, target, record, action)``, ``is_marked(con, target, suffix)`` (the table exists
    and publish created it)."""

    table_exists: Callable[..., bool]
    read_record: Callable[..., PublishRecord | None]
    ensure_log: Callable[..., None]
    insert_log: Callable[..., None]
    is_marked: Callable[..., bool]


class SqlTableBackend(ABC):
    """Base of :class:`~batch_inference.publish.backend.PublishBackend` s that publish into SQL tables.

    Args:
        target: where to publish.
        inspect_only: connect for reading only: create no schema, registry or database file, take no
            lock (:func:`~batch_inference.publish.api.check_target`, ``read_published``).
    """

    dialect: ClassVar[SqlDialect]
    """The backend's table functions."""

    def __init__(self, target: PublishTarget, inspect_only: bool = False) -> None:
        self.target = target
        self.inspect_only = inspect_only
        self.con: Any = None

    # -- the dialect --------------------------------------------------------------------------------
    @abstractmethod
    def open(self) -> Any:
        """Connect to the target (writing nothing); returns the connection."""

    @abstractmethod
    def prepare(self) -> None:
        """Create the schema and the registry of marked tables if missing (not for ``inspect_only``)."""

    @abstractmethod
    def transaction(self) -> AbstractContextManager[Any]:
        """Run the ``with`` body in one transaction of the held connection (rolled back on error)."""

    def table_exists(self, suffix: str = "") -> bool:
        """Whether ``<table><suffix>`` exists."""
        return self.dialect.table_exists(self.connection(), self.target, suffix)

    def record_of(self, suffix: str = "") -> PublishRecord | None:
        """The publish record in the comment of ``<table><suffix>`` (``None``: absent or not ours)."""
        return self.dialect.read_record(self.connection(), self.target, suffix)

    def foreign_suffixes(self) -> list[str]:
        """Suffixes (``""``: the live table) of the tables of the target's family that exist without
        publish's mark, in :data:`~batch_inference.publish.target.TABLE_FAMILY` order."""
        con = self.connection()
        return [s for s in TABLE_FAMILY
                if self.dialect.table_exists(con, self.target, s) and not self.dialect.is_marked(con, self.target, s)]

    def ensure_log(self) -> None:
        """Create ``<table>__publish_log`` if missing (outside any transaction).

        Raises:
            ForeignTableError: it exists without publish's mark.
        """
        self.dialect.ensure_log(self.connection(), self.target)

    def insert_log(self, record: PublishRecord, action: str) -> None:
        """Append one row for ``record`` and ``action`` to the publish log."""
        self.dialect.insert_log(self.connection(), self.target, record, action)

    @abstractmethod
    def rename(self, old: str, new: str) -> None:
        """Rename ``<table><old>`` to ``<table><new>`` if it exists (its mark follows).

        Raises:
            ForeignTableError: ``<table><old>`` exists without publish's mark (nothing renamed).
        """

    @abstractmethod
    def drop(self, suffix: str) -> None:
        """Drop ``<table><suffix>`` if it exists (and its mark).

        Raises:
            ForeignTableError: it exists without publish's mark (nothing dropped).
        """

    # -- shared -------------------------------------------------------------------------------------
    def __enter__(self) -> SqlTableBackend:
        """Connect; unless ``inspect_only``, refuse a target with a foreign table before writing
        anything, then :meth:`prepare`.

        Raises:
            ForeignTableError: a table of the family exists without publish's mark (nothing written).
            PublishConnectionError: connecting failed (no DSN in the message).
        """
        self.con = self.open()
        try:
            if not self.inspect_only:
                foreign = self.foreign_suffixes()
                if foreign:
                    raise ForeignTableError(self.target.describe(), [self.target.display_name(s) for s in foreign])
                self.prepare()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.con is not None:
            self.con.close()
            self.con = None

    def connection(self) -> Any:
        """The held connection (only inside the ``with`` block)."""
        assert self.con is not None, "use the backend as a context manager"
        return self.con

    def read_record(self, previous: bool = False) -> PublishRecord | None:
        """The publish record of the live table (or of ``<table>__previous``)."""
        return self.record_of(SUFFIX_PREVIOUS if previous else "")

    def has_previous(self) -> bool:
        """Whether ``<table>__previous`` exists."""
        return self.table_exists(SUFFIX_PREVIOUS)

    def restore_previous(self, restored: PublishRecord | None) -> None:
        """One transaction exchanging ``<table>`` and ``<table>__previous`` (and their dead letters, when
        there are any), through the staging name; the rollback of ``restored`` is logged in it.

        Raises:
            ForeignTableError: a table it would drop or rename lacks publish's mark (nothing changed).
        """
        self.ensure_log()
        with self.transaction():
            for base in ("", SUFFIX_DEAD_LETTERS):
                live, prev, tmp = base, base + SUFFIX_PREVIOUS, base + SUFFIX_STAGING
                if not self.table_exists(prev):
                    continue
                self.drop(tmp)
                self.rename(live, tmp)
                self.rename(prev, live)
                self.rename(tmp, prev)
            if restored is not None:
                self.insert_log(restored, "rollback")
