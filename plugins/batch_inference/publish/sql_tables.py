"""What the two SQL-table backends (DuckDB, PostgreSQL) share: one connection held for a publish or
rollback, the live record read from the table comment, and a rollback that exchanges ``<table>`` and
``<table>__previous`` (and their dead-letter tables) through the staging name in one transaction.
A subclass supplies the dialect: its table functions (:class:`SqlDialect`) and the small methods marked
abstract (connect, transaction, rename, drop).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, ClassVar

from batch_inference.publish.record import PublishRecord
from batch_inference.publish.target import SUFFIX_DEAD_LETTERS, SUFFIX_PREVIOUS, SUFFIX_STAGING, PublishTarget


@dataclass(frozen=True)
class SqlDialect:
    """A backend's table functions, each taking ``(connection, target, ...)``: ``table_exists(con,
    target, suffix)``, ``read_record(con, target, suffix)``, ``ensure_log(con, target)``,
    ``insert_log(con, target, record, action)``."""

    table_exists: Callable[..., bool]
    read_record: Callable[..., PublishRecord | None]
    ensure_log: Callable[..., None]
    insert_log: Callable[..., None]


class SqlTableBackend(ABC):
    """Base of :class:`~batch_inference.publish.backend.PublishBackend` s that publish into SQL tables.

    Args:
        target: where to publish.
    """

    dialect: ClassVar[SqlDialect]
    """The backend's table functions."""

    def __init__(self, target: PublishTarget) -> None:
        self.target = target
        self.con: Any = None

    # -- the dialect --------------------------------------------------------------------------------
    @abstractmethod
    def open(self) -> Any:
        """Connect to the target (and create its schema if missing); returns the connection."""

    @abstractmethod
    def transaction(self) -> AbstractContextManager[Any]:
        """Run the ``with`` body in one transaction of the held connection (rolled back on error)."""

    def table_exists(self, suffix: str = "") -> bool:
        """Whether ``<table><suffix>`` exists."""
        return self.dialect.table_exists(self.connection(), self.target, suffix)

    def record_of(self, suffix: str = "") -> PublishRecord | None:
        """The publish record in the comment of ``<table><suffix>`` (``None``: absent or not ours)."""
        return self.dialect.read_record(self.connection(), self.target, suffix)

    def ensure_log(self) -> None:
        """Create ``<table>__publish_log`` if missing (outside any transaction)."""
        self.dialect.ensure_log(self.connection(), self.target)

    def insert_log(self, record: PublishRecord, action: str) -> None:
        """Append one row for ``record`` and ``action`` to the publish log."""
        self.dialect.insert_log(self.connection(), self.target, record, action)

    @abstractmethod
    def rename(self, old: str, new: str) -> None:
        """Rename ``<table><old>`` to ``<table><new>`` if it exists."""

    @abstractmethod
    def drop(self, suffix: str) -> None:
        """Drop ``<table><suffix>`` if it exists."""

    # -- shared -------------------------------------------------------------------------------------
    def __enter__(self) -> SqlTableBackend:
        self.con = self.open()
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
        there are any), through the staging name; the rollback of ``restored`` is logged in it."""
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
