"""Validation: turn raw input rows into engine-ready rows or dead letters; nothing is silently lost.

Rules (the row rules of :mod:`batch_contract.rows`), applied to every row of the shard in shard order
(so a rerun classifies rows identically):

1. a row's own problems first: unreadable record (bad JSONL line) -> ``invalid_record``; a row refused
   before the run (``input.rejection_key``: a converted OpenAI batch line) -> its own code; null id ->
   ``null_id``; an id that is not an integer or a non-blank valid-Unicode string -> ``invalid_id``;
   null text -> ``null_text``; non-string text -> ``non_string_text``; empty or whitespace-only text ->
   ``empty_text`` (text that was not valid Unicode was already repaired by the reader and is kept,
   flagged ``text_repaired``);
2. among the remaining (eligible) rows, the first with an id wins; a later eligible row with the same
   id -> ``duplicate_id``, its detail naming the winner's position (publish applies the same rule across
   shards, so the outcome does not depend on where shard boundaries fall);
3. rows already committed under the current fingerprint (the resume ledger) are skipped: results by id,
   dead letters (including those an engine produced) by source position.

Every id is converted to its canonical string (:func:`batch_contract.rows.canonical_id`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pyarrow as pa
from batch_contract.enums import DeadLetterReason
from batch_contract.rows import canonical_id, duplicate_detail

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
    """Convert a raw id to its string form (:func:`batch_contract.rows.canonical_id` as a tuple).

    Returns:
        ``(id, None, "")`` when valid, else ``(id or None, reason, detail)``. An id that is neither an
        integer nor a valid-Unicode string has no canonical string form, so its dead letter carries
        ``id=None`` and is matched by ``(source_uri, source_row)`` (publish does the same).
    """
    cid = canonical_id(value)
    return cid.id, cid.reason, cid.detail


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
    """Stateful shard-wide validator (remembers the winning row of each id, for duplicates).

    Args:
        id_column / text_column: the input's column names (``ChunkRows.fields`` carries them, with the
            canonical string ids and the repaired texts, beside the engine's extra columns).
        done_ids: ids with a committed result under the current fingerprint (resume ledger).
        done_dead: ``(source_uri, source_row)`` of rows already dead-lettered under the fingerprint.
    """

    def __init__(
        self, id_column: str, done_ids: set[str] | None = None, done_dead: set[tuple[str, int]] | None = None,
        text_column: str = "text",
    ) -> None:
        self.id_column = id_column
        self.text_column = text_column
        self.done_ids = done_ids or set()
        self.done_dead = done_dead or set()
        self.winners: dict[str, tuple[str, int]] = {}

    def _classify(self, block: RawBlock, i: int) -> tuple[str | None, DeadLetterReason | None, str]:
        """``(id, reason, detail)`` of row ``i`` of ``block``; registers the winner of a new id."""
        error = block.record_errors[i] if block.record_errors else None
        if error:
            return None, DeadLetterReason.INVALID_RECORD, error
        refused = block.rejections[i] if block.rejections else None
        if refused is not None:
            return self._refused(block.ids[i], *refused)
        rid, reason, detail = id_to_str(block.ids[i])
        if reason is None:
            reason, detail = text_problem(block.texts[i])
        if reason is not None:
            return rid, reason, detail
        winner = self.winners.setdefault(rid, (block.source_uri, block.source_rows[i]))
        if winner != (block.source_uri, block.source_rows[i]):
            return rid, DeadLetterReason.DUPLICATE_ID, duplicate_detail(*winner)
        return rid, None, ""

    @staticmethod
    def _refused(raw_id: object, code: str, message: str) -> tuple[str | None, DeadLetterReason, str]:
        """A row refused before the run (``input.rejection_key``): its reason is its code (an unknown
        code is ``invalid_record``, the code kept in the detail), its id the canonical one if any."""
        rid, _reason, _detail = id_to_str(raw_id)
        try:
            return rid, DeadLetterReason(code), message
        except ValueError:
            return rid, DeadLetterReason.INVALID_RECORD, f"{code}: {message}"

    def validate(self, block: RawBlock) -> ValidatedBlock:
        """Classify every row of ``block`` (see the module docstring)."""
        keep: list[int] = []
        ids: list[str] = []
        dead: list[DeadLetter] = []
        skipped = 0
        for i in range(len(block)):
            uri, row = block.source_uri, block.source_rows[i]
            rid, reason, detail = self._classify(block, i)
            if (uri, row) in self.done_dead or (reason is None and rid in self.done_ids):
                skipped += 1  # committed before (a dead letter by position, a result by id)
                continue
            if reason is not None:
                dead.append(DeadLetter(rid, reason, detail, uri, row))
                continue
            keep.append(i)
            ids.append(rid)
        texts = [block.texts[i] for i in keep]
        return ValidatedBlock(
            rows=ChunkRows(
                ids=ids,
                texts=texts,
                text_repaired=[block.text_repaired[i] for i in keep],
                source_uri=[block.source_uri] * len(keep),
                source_row=[block.source_rows[i] for i in keep],
                fields=self._fields(block, keep, ids, texts),
            ),
            dead=dead,
            skipped=skipped,
        )

    def _fields(self, block: RawBlock, keep: list[int], ids: list[str], texts: list[str]) -> pa.Table:
        """Row fields of the kept rows: id (canonical string), text (repaired), extra columns."""
        fields = {self.id_column: pa.array(ids, pa.string()), self.text_column: pa.array(texts, pa.string())}
        extras = block.extras.take(pa.array(keep, pa.int64())) if block.extras.num_columns else None
        for name in extras.column_names if extras is not None else []:
            if name not in fields:
                fields[name] = extras.column(name)
        return pa.table(fields)


def concat_rows(parts: list[ChunkRows]) -> ChunkRows:
    """Concatenate chunk rows in order (fields tables are unified by column name; a column whose type
    differs between parts, e.g. a JSON list in one block and a string in another, becomes JSON text)."""
    tables = [p.fields for p in parts if p.fields.num_rows or p.fields.num_columns]
    try:
        fields = pa.concat_tables(tables, promote_options="permissive") if tables else pa.table({})
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        fields = pa.concat_tables([_as_json_text(t) for t in tables], promote_options="permissive")
    return ChunkRows(
        ids=[x for p in parts for x in p.ids],
        texts=[x for p in parts for x in p.texts],
        text_repaired=[x for p in parts for x in p.text_repaired],
        source_uri=[x for p in parts for x in p.source_uri],
        source_row=[x for p in parts for x in p.source_row],
        fields=fields,
    )


def _as_json_text(table: pa.Table) -> pa.Table:
    """Every non-string column of ``table`` as JSON text (nulls stay null)."""
    cols = {}
    for name in table.column_names:
        col = table.column(name)
        if pa.types.is_string(col.type):
            cols[name] = col
        else:
            cols[name] = pa.array([None if v is None else json.dumps(v, ensure_ascii=False, default=str)
                                   for v in col.to_pylist()], pa.string())
    return pa.table(cols)
