"""The publish record: which run a live table holds, stored as the table's comment.

A table comment travels with the table through ``RENAME``, so after a swap or a rollback the live table
still says which run (id + fingerprint) it holds; that is what makes a rerun of publish a no-op.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

RECORD_KIND = "batch_inference.publish/v1"

LOG_COLUMNS = (
    ("logged_at", "VARCHAR"),
    ("action", "VARCHAR"),
    ("run_id", "VARCHAR"),
    ("fingerprint", "VARCHAR"),
    ("rows_published", "BIGINT"),
    ("rows_dead_letter", "BIGINT"),
    ("rows_missing", "BIGINT"),
    ("record", "VARCHAR"),
)
"""Columns of ``<table>__publish_log`` (one row per publish or rollback; ``record`` is JSON).
``VARCHAR`` is spelled ``TEXT`` in PostgreSQL."""


def utc_now() -> str:
    """Current UTC time, ISO 8601 with seconds."""
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class PublishRecord:
    """What a published table holds.

    Attributes:
        run_id / fingerprint: identity of the published run.
        rows_*: counts from the coverage check (rows).
        success_ratio / min_success_ratio: covered fraction and the threshold it was published under.
        published_at: UTC ISO time of the swap.
        files_digest: :attr:`RunInventory.files_digest` of the published run (the committed file set).
        duplicate_ids_across_shards: input rows dead-lettered as ``duplicate_id`` because their id's
            winning row lies in another shard (included in ``rows_dead_letter``; 0 in records written
            before).
        dead_letter_reasons: published dead letters by reason code (empty in records written before).
        files_quarantined: committed files publish set aside (stale fingerprint; 0 in older records).
    """

    run_id: str
    fingerprint: str
    rows_input: int
    rows_published: int
    rows_dead_letter: int
    rows_missing: int
    duplicates_removed: int
    success_ratio: float
    min_success_ratio: float
    published_at: str
    files_digest: str = ""
    kind: str = RECORD_KIND
    duplicate_ids_across_shards: int = 0
    dead_letter_reasons: dict[str, int] = field(default_factory=dict)
    files_quarantined: int = 0

    def matches(self, run_id: str, fingerprint: str, files_digest: str) -> bool:
        """Whether this record is the same publish: run id, fingerprint and committed file set.

        The digest covers every committed file's name, size and recorded SHA-256, so a shard re-run
        after a partial publish (``min_success_ratio`` < 1), a file replaced or set aside all change it
        and publish runs again; a retried publish task finds everything equal (no-op).
        An empty digest (record written without one) compares on run id and fingerprint only.
        """
        same_files = not self.files_digest or self.files_digest == files_digest
        return self.run_id == run_id and self.fingerprint == fingerprint and same_files

    def to_comment(self) -> str:
        """Compact JSON for a table comment."""
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_comment(cls, comment: str | None) -> PublishRecord | None:
        """Parse a table comment; ``None`` when the table was not written by publish (not JSON, another
        ``kind``, or a required field missing)."""
        if not comment:
            return None
        try:
            data: dict[str, Any] = json.loads(comment)
        except ValueError:
            return None
        if not isinstance(data, dict) or data.get("kind") != RECORD_KIND:
            return None
        try:
            return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})
        except TypeError:
            return None

    def log_row(self, action: str) -> tuple[Any, ...]:
        """A row for ``<table>__publish_log`` in :data:`LOG_COLUMNS` order."""
        return (utc_now(), action, self.run_id, self.fingerprint, self.rows_published,
                self.rows_dead_letter, self.rows_missing, self.to_comment())


def sql_string_literal(text: str) -> str:
    """Single-quoted SQL string literal (quotes doubled) for statements that take no parameters
    (``COMMENT ON``). Rejects NUL characters, which no SQL literal can hold."""
    if "\x00" in text:
        raise ValueError("string literal contains a NUL character")
    return "'" + text.replace("'", "''") + "'"
