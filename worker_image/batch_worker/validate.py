"""Validation: turn raw input rows into engine-ready rows or dead letters; nothing is silently lost.

Rules, applied to every row of the shard in shard order (so a rerun classifies rows identically):

1. unreadable record (bad JSONL line) -> ``invalid_record``; null id -> ``null_id``; an id that is not an
   integer or non-empty string -> ``invalid_id``;
2. an id seen earlier in the shard -> ``duplicate_id`` (the first occurrence is the one processed);
3. null text -> ``null_text``; non-string text -> ``non_string_text``; empty or whitespace-only text ->
   ``empty_text``; invalid UTF-8 -> repaired with U+FFFD and flagged ``text_repaired`` (kept);
4. rows already committed under the current fingerprint (the resume ledger) are skipped: results by id,
   dead letters (including those an engine produced) by source position.

Every id is converted to a string (integers in decimal).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
from batch_contract.enums import DeadLetterReason

from batch_worker.engines.base import ChunkRows
from batch_worker.reader import RawBlock


@dataclass(frozen=True)
class DeadLetter:
    """One rejected row (becomes a row of ``batch_contract.schemas.DEAD_LETTER_SCHEMA``)."""

    id: str | None
    reason: DeadLetterReason
    detail: str
    source_uri: str
    source_row: int


def id_to_str(value: object) -> tuple[str | None, DeadLetterReason | None, str]:
    """Convert a raw id to its string form.

    Returns:
        ``(id, None, "")`` when valid, else ``(id or None, reason, detail)``. An id that is neither an
        integer nor a string (bool, float, list, ...) has no canonical string form, so its dead letter
        carries ``id=None`` and is matched by ``(source_uri, source_row)`` like a null id (publish's
        coverage check does the same); the detail names the value.
    """
    if value is None:
        return None, DeadLetterReason.NULL_ID, "id is null"
    if isinstance(value, bool) or not isinstance(value, int | str):
        return None, DeadLetterReason.INVALID_ID, f"id {value!r:.200} is a {type(value).__name__}, not an integer or string"
    text = str(value)
    if isinstance(value, str) and not text.strip():
        return text, DeadLetterReason.INVALID_ID, "id is an empty or whitespace-only string"
    return text, None, ""


def text_problem(value: object) -> tuple[DeadLetterReason | None, str]:
    """Why a text value cannot be encoded, or ``(None, "")`` if it can."""
    if value is None:
        return DeadLetterReason.NULL_TEXT, "text is null"
    if not isinstance(value, str):
        return DeadLetterReason.NON_STRING_TEXT, f"text is a {type(value).__name__}, not a string"
    if not value.strip():
        return DeadLetterReason.EMPTY_TEXT, "text is empty or whitespace-only"
    return None, ""


@dataclass
class ValidatedBlock:
    """Result of validating one :class:`~batch_worker.reader.RawBlock`.

    Attributes:
        rows: rows to process (not yet committed).
        dead: newly rejected rows (not yet committed).
        skipped: rows skipped because already committed (results or dead letters).
    """

    rows: ChunkRows
    dead: list[DeadLetter] = field(default_factory=list)
    skipped: int = 0


class Validator:
    """Stateful shard-wide validator (remembers ids seen, for duplicate detection).

    Args:
        id_column: the input's id column (in ``ChunkRows.fields`` it is replaced by the string ids).
        done_ids: ids with a committed result under the current fingerprint (resume ledger).
        done_dead: ``(source_uri, source_row)`` of rows already dead-lettered under the fingerprint.
    """

    def __init__(
        self, id_column: str, done_ids: set[str] | None = None, done_dead: set[tuple[str, int]] | None = None
    ) -> None:
        self.id_column = id_column
        self.done_ids = done_ids or set()
        self.done_dead = done_dead or set()
        self.seen: set[str] = set()

    def validate(self, block: RawBlock) -> ValidatedBlock:
        """Classify every row of ``block`` (see the module docstring)."""
        keep: list[int] = []
        ids: list[str] = []
        dead: list[DeadLetter] = []
        skipped = 0
        errors = block.record_errors or [None] * len(block)
        for i in range(len(block)):
            uri, row = block.source_uri, block.source_rows[i]
            rid, reason, detail = (None, DeadLetterReason.INVALID_RECORD, errors[i]) if errors[i] else id_to_str(block.ids[i])
            if reason is None:
                if rid in self.seen:
                    reason, detail = DeadLetterReason.DUPLICATE_ID, f"id {rid!r} appears earlier in the shard"
                else:
                    self.seen.add(rid)
            if (uri, row) in self.done_dead or (reason is None and rid in self.done_ids):
                skipped += 1  # committed before (a dead letter by position, a result by id)
                continue
            if reason is None:
                reason, detail = text_problem(block.texts[i])
            if reason is not None:
                dead.append(DeadLetter(rid, reason, detail, uri, row))
                continue
            keep.append(i)
            ids.append(rid)
        fields = block.fields.take(pa.array(keep, pa.int64())) if block.fields.num_columns else block.fields
        return ValidatedBlock(
            rows=ChunkRows(
                ids=ids,
                texts=[block.texts[i] for i in keep],
                text_repaired=[block.text_bad_utf8[i] for i in keep],
                source_uri=[block.source_uri] * len(keep),
                source_row=[block.source_rows[i] for i in keep],
                fields=_ids_as_strings(fields, self.id_column, ids),
            ),
            dead=dead,
            skipped=skipped,
        )


def _ids_as_strings(fields: pa.Table, id_column: str, ids: list[str]) -> pa.Table:
    """``fields`` with column ``id_column`` replaced by the string ids."""
    if id_column in fields.column_names and fields.num_rows == len(ids):
        idx = fields.column_names.index(id_column)
        return fields.set_column(idx, id_column, pa.array(ids, pa.string()))
    return fields


def concat_rows(parts: list[ChunkRows]) -> ChunkRows:
    """Concatenate chunk rows in order (fields tables are unified by column name)."""
    tables = [p.fields for p in parts if p.fields.num_rows or p.fields.num_columns]
    try:
        fields = pa.concat_tables(tables, promote_options="permissive") if tables else pa.table({})
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        fields = pa.concat_tables([t.cast(pa.schema([(n, pa.string()) for n in t.column_names])) for t in tables],
                                  promote_options="permissive")
    return ChunkRows(
        ids=[x for p in parts for x in p.ids],
        texts=[x for p in parts for x in p.texts],
        text_repaired=[x for p in parts for x in p.text_repaired],
        source_uri=[x for p in parts for x in p.source_uri],
        source_row=[x for p in parts for x in p.source_row],
        fields=fields,
    )
