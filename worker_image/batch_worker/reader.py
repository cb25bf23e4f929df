"""Read only one shard's rows (its segments) from Parquet or JSONL, in bounded memory.

Parquet: only the row groups overlapping a segment are read, ``read_batch_rows`` rows at a time.
JSONL: lines are streamed; row numbers count non-blank lines (as the planner does). Either way the
reader yields :class:`RawBlock` s of at most ``read_batch_rows`` rows in shard order.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pyarrow.types as pat
from batch_contract import storage
from batch_contract.enums import InputFormat
from batch_contract.manifest import InputSpec, Segment

from batch_worker.errors import BadInputError


@dataclass
class RawBlock:
    """Up to ``read_batch_rows`` consecutive input rows of one file, before validation.

    Attributes:
        source_uri: the file the rows come from.
        source_rows: 0-based row number of each row in that file.
        ids: raw id values (``int``, ``str``, ``None`` or anything a JSONL line held).
        texts: raw text values (``str`` expected; ``None``/other types are dead-lettered later).
        text_bad_utf8: the text held invalid UTF-8 and was decoded with U+FFFD replacements.
        record_errors: per row, ``None`` or why the record itself is unreadable (bad JSON line).
        fields: all input columns of the rows, same order (raw types).
    """

    source_uri: str
    source_rows: list[int]
    ids: list[Any]
    texts: list[Any]
    text_bad_utf8: list[bool]
    fields: pa.Table
    record_errors: list[str | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ids)


ID_TYPES_OK = "integer or string"


def _check_id_type(typ: pa.DataType, uri: str, column: str) -> None:
    if not (pat.is_integer(typ) or pat.is_string(typ) or pat.is_large_string(typ) or pat.is_null(typ)):
        raise BadInputError(
            f"{uri}: id column {column!r} has type {typ}; it must be {ID_TYPES_OK} "
            "(set input id_column to a column of that type)"
        )


def _decode_text(values: list[Any]) -> tuple[list[Any], list[bool]]:
    out: list[Any] = []
    bad: list[bool] = []
    for v in values:
        if isinstance(v, bytes):
            try:
                out.append(v.decode("utf-8"))
                bad.append(False)
            except UnicodeDecodeError:
                out.append(v.decode("utf-8", errors="replace"))
                bad.append(True)
        else:
            out.append(v)
            bad.append(False)
    return out, bad


def _parquet_blocks(spec: InputSpec, uri: str, seg: Segment, batch_rows: int) -> Iterator[RawBlock]:
    fs, path = storage.arrow_filesystem(uri)
    with fs.open_input_file(path) as fh:
        pf = pq.ParquetFile(fh)
        schema = pf.schema_arrow
        for col in (spec.id_column, spec.text_column):
            if schema.get_field_index(col) < 0:
                raise BadInputError(f"{uri}: column {col!r} not found; columns are {schema.names}")
        _check_id_type(schema.field(spec.id_column).type, uri, spec.id_column)
        meta = pf.metadata
        groups: list[int] = []
        first_row = None
        offset = 0
        for g in range(meta.num_row_groups):
            n = meta.row_group(g).num_rows
            if offset < seg.row_stop and offset + n > seg.row_start:
                groups.append(g)
                first_row = offset if first_row is None else first_row
            offset += n
        if seg.row_stop > offset:
            raise BadInputError(f"{uri}: segment rows {seg.row_start}..{seg.row_stop} beyond the file's {offset} rows")
        if not groups:
            return
        row = first_row
        for rb in pf.iter_batches(batch_size=batch_rows, row_groups=groups):
            lo = max(seg.row_start - row, 0)
            hi = min(seg.row_stop - row, rb.num_rows)
            if hi > lo:
                table = pa.Table.from_batches([rb.slice(lo, hi - lo)])
                texts, bad = _decode_text(table.column(spec.text_column).to_pylist())
                n = table.num_rows
                yield RawBlock(
                    source_uri=uri,
                    source_rows=list(range(row + lo, row + hi)),
                    ids=table.column(spec.id_column).to_pylist(),
                    texts=texts,
                    text_bad_utf8=bad,
                    fields=table,
                    record_errors=[None] * n,
                )
            row += rb.num_rows
            if row >= seg.row_stop:
                break


def _fields_table(records: list[dict[str, Any]]) -> pa.Table:
    try:
        return pa.Table.from_pylist(records)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
        # mixed types in a column across lines: keep every value, as its JSON text
        names = sorted({k for r in records for k in r})
        cols = {k: [None if k not in r else json.dumps(r[k], ensure_ascii=False) for r in records] for k in names}
        return pa.table(cols) if names else pa.table({"_": [None] * len(records)}).drop(["_"])


def _jsonl_block(spec: InputSpec, uri: str, lines: list[tuple[int, bytes]]) -> RawBlock:
    records: list[dict[str, Any]] = []
    errors: list[str | None] = []
    bad_utf8: list[bool] = []
    for _rowno, raw in lines:
        try:
            text = raw.decode("utf-8")
            bad = False
        except UnicodeDecodeError:
            text = raw.decode("utf-8", errors="replace")
            bad = True
        try:
            rec = json.loads(text)
            err = None if isinstance(rec, dict) else f"line is JSON {type(rec).__name__}, not an object"
        except json.JSONDecodeError as exc:
            rec, err = None, f"invalid JSON: {exc.msg} at column {exc.colno}"
        records.append(rec if isinstance(rec, dict) else {})
        errors.append(err)
        bad_utf8.append(bad)
    return RawBlock(
        source_uri=uri,
        source_rows=[r for r, _ in lines],
        ids=[r.get(spec.id_column) for r in records],
        texts=[r.get(spec.text_column) for r in records],
        text_bad_utf8=bad_utf8,
        fields=_fields_table(records),
        record_errors=errors,
    )


def _jsonl_blocks(spec: InputSpec, uri: str, seg: Segment, batch_rows: int) -> Iterator[RawBlock]:
    fs, path = storage.arrow_filesystem(uri)
    row = 0
    pending: list[tuple[int, bytes]] = []
    with fs.open_input_stream(path) as fh:
        buf = b""
        while row < seg.row_stop:
            block = fh.read(1 << 20)
            data = buf + block
            parts = data.split(b"\n")
            buf = parts.pop() if block else b""
            for raw in parts:
                if not raw.strip():
                    continue
                if seg.row_start <= row < seg.row_stop:
                    pending.append((row, raw))
                    if len(pending) >= batch_rows:
                        yield _jsonl_block(spec, uri, pending)
                        pending = []
                row += 1
                if row >= seg.row_stop:
                    break
            if not block:
                break
    if pending:
        yield _jsonl_block(spec, uri, pending)
    if row < seg.row_stop:
        raise BadInputError(f"{uri}: segment rows {seg.row_start}..{seg.row_stop} beyond the file's {row} rows")


def iter_shard_blocks(spec: InputSpec, segments: list[Segment], batch_rows: int) -> Iterator[RawBlock]:
    """Yield the shard's rows as :class:`RawBlock` s, segment by segment, in file row order.

    Args:
        spec: the manifest's input spec (format, id/text columns, files).
        segments: the shard's segments.
        batch_rows: max rows per block (``WorkerSettings.read_batch_rows``).

    Raises:
        BadInputError: missing id/text column, id column of a type other than integer/string, or a
            segment beyond the end of its file.
    """
    for seg in segments:
        if not 0 <= seg.file_index < len(spec.files):
            raise BadInputError(f"segment file_index {seg.file_index} is not in input.files (0..{len(spec.files) - 1})")
        uri = spec.files[seg.file_index].uri
        if spec.format == InputFormat.PARQUET.value:
            yield from _parquet_blocks(spec, uri, seg, batch_rows)
        else:
            yield from _jsonl_blocks(spec, uri, seg, batch_rows)
