"""Read only one shard's rows (its segments) from Parquet or JSONL, in bounded memory.

Parquet: only the row groups overlapping a segment are read, ``read_batch_rows`` rows at a time, and
only the columns the job uses (id, text, and the engine's extra columns). JSONL: lines are streamed by
the contract's line rule (:func:`batch_contract.rows.iter_jsonl_lines`); only the used keys of each
record are kept. Either way the reader yields :class:`RawBlock` s of at most ``read_batch_rows`` rows
in shard order. Text that is not valid Unicode is repaired here (:func:`batch_contract.rows.repair_text`);
ids are left raw for validation (:func:`batch_contract.rows.canonical_id`).

Guards (:class:`~batch_contract.engine_config.WorkerSettings`): every file is opened through the
manifest's ``input.roots`` (:func:`batch_contract.storage.open_input_file`: locally the real path of the
file actually opened must lie under one; a file swapped for a link out of them after planning is refused,
``BadInputError``); a Parquet row group larger than ``max_row_group_bytes`` is refused before it is read
(``BadInputError``); a JSONL line longer than ``max_line_bytes`` is an unreadable record (dead letter
``invalid_record``), and a JSONL block also ends once its raw lines reach ``max_row_group_bytes``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pyarrow.types as pat
from batch_contract import storage
from batch_contract.engine_config import WorkerSettings
from batch_contract.enums import InputFormat
from batch_contract.manifest import InputSpec, Segment
from batch_contract.rows import (
    OversizedLine,
    decode_line,
    iter_jsonl_lines,
    repair_text,
    repair_value,
    row_group_read_bytes,
)

from batch_worker.errors import BadInputError


@dataclass
class RawBlock:
    """Up to ``read_batch_rows`` consecutive input rows of one file, before validation.

    Attributes:
        source_uri: the file the rows come from.
        source_rows: 0-based row number of each row in that file.
        ids: raw id values (``int``, ``str``, ``bytes`` for a string id that is not valid UTF-8,
            ``None`` or anything a JSONL line held).
        texts: text values, strings already valid Unicode (``None``/other types are dead-lettered later).
        text_repaired: the text was not valid Unicode and was repaired with U+FFFD.
        extras: the engine's extra columns of the rows (zero columns for the encoder), same order,
            strings valid Unicode.
        record_errors: per row, ``None`` or why the record itself is unreadable (bad JSON line).
        rejections: per row, ``None`` or ``(reason, detail)`` of a row refused before the run (the
            manifest's ``input.rejection_key``); empty when the input has no such key.
    """

    source_uri: str
    source_rows: list[int]
    ids: list[Any]
    texts: list[Any]
    text_repaired: list[bool]
    extras: pa.Table
    record_errors: list[str | None] = field(default_factory=list)
    rejections: list[tuple[str, str] | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ids)


ID_TYPES_OK = "integer or string"


def _check_id_type(typ: pa.DataType, uri: str, column: str) -> None:
    if not (pat.is_integer(typ) or pat.is_string(typ) or pat.is_large_string(typ) or pat.is_null(typ)):
        raise BadInputError(
            f"{uri}: id column {column!r} has type {typ}; it must be {ID_TYPES_OK} "
            "(set input id_column to a column of that type)"
        )


def _values(col: pa.ChunkedArray | pa.Array) -> list[Any]:
    """Python values of a column; a string column holding invalid UTF-8 comes back as ``bytes``
    (``to_pylist`` would raise ``UnicodeDecodeError`` for the whole block)."""
    try:
        return col.to_pylist()
    except UnicodeDecodeError:
        binary = pa.large_binary() if pat.is_large_string(col.type) else pa.binary()
        return col.cast(binary).to_pylist()


def _repaired_texts(values: list[Any]) -> tuple[list[Any], list[bool]]:
    pairs = [repair_text(v) for v in values]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _sanitize(table: pa.Table) -> pa.Table:
    """``table`` with every top-level string column made valid UTF-8 (U+FFFD replacements)."""
    for i, f in enumerate(table.schema):
        if not (pat.is_string(f.type) or pat.is_large_string(f.type)):
            continue
        try:
            table.column(i).validate(full=True)
        except pa.ArrowInvalid:
            fixed = [repair_text(v)[0] for v in _values(table.column(i))]
            table = table.set_column(i, f.name, pa.array(fixed, f.type))
    return table


def _parquet_columns(spec: InputSpec, schema: pa.Schema, uri: str, extra: Sequence[str]) -> list[str]:
    for col in (spec.id_column, spec.text_column):
        if schema.get_field_index(col) < 0:
            raise BadInputError(f"{uri}: column {col!r} not found; columns are {schema.names}")
    _check_id_type(schema.field(spec.id_column).type, uri, spec.id_column)
    wanted = [spec.id_column, spec.text_column]
    return wanted + [c for c in extra if c not in wanted and schema.get_field_index(c) >= 0]


def _parquet_block(spec: InputSpec, uri: str, table: pa.Table, first_row: int) -> RawBlock:
    texts, repaired = _repaired_texts(_values(table.column(spec.text_column)))
    extras = _sanitize(table.drop_columns([spec.id_column, spec.text_column]))
    return RawBlock(
        source_uri=uri,
        source_rows=list(range(first_row, first_row + table.num_rows)),
        ids=_values(table.column(spec.id_column)),
        texts=texts,
        text_repaired=repaired,
        extras=extras,
        record_errors=[None] * table.num_rows,
    )


def _open(spec: InputSpec, uri: str, random_access: bool) -> pa.NativeFile:
    """Open an input file through the manifest's roots (:func:`batch_contract.storage.open_input_file`).

    Raises:
        BadInputError: the file resolves outside ``spec.roots`` or is not a regular file.
    """
    try:
        if random_access:
            return storage.open_input_file(uri, spec.roots)
        return storage.open_input_stream(uri, spec.roots)
    except storage.InputRefusedError as exc:
        raise BadInputError(f"input: {exc}; refusing to read it") from None


def _parquet_blocks(spec: InputSpec, uri: str, seg: Segment, batch_rows: int,
                    extra: Sequence[str], settings: WorkerSettings) -> Iterator[RawBlock]:
    with _open(spec, uri, random_access=True) as fh:
        pf = pq.ParquetFile(fh)
        columns = _parquet_columns(spec, pf.schema_arrow, uri, extra)
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
        sizes = row_group_read_bytes(meta, pf.schema_arrow, columns)
        for g in groups:
            if sizes[g] > settings.max_row_group_bytes:
                raise BadInputError(f"{uri}: row group {g} holds {sizes[g]} bytes (uncompressed) of the columns "
                                    f"read, above worker.max_row_group_bytes ({settings.max_row_group_bytes})")
        row = first_row
        for rb in pf.iter_batches(batch_size=batch_rows, row_groups=groups, columns=columns):
            lo = max(seg.row_start - row, 0)
            hi = min(seg.row_stop - row, rb.num_rows)
            if hi > lo:
                yield _parquet_block(spec, uri, pa.Table.from_batches([rb.slice(lo, hi - lo)]), row + lo)
            row += rb.num_rows
            if row >= seg.row_stop:
                break


def _extras_table(records: list[dict[str, Any]], extra: Sequence[str]) -> pa.Table:
    if not extra:
        return pa.table({})
    cols = {k: [repair_value(r.get(k)) for r in records] for k in extra}
    try:
        return pa.table(cols)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        # mixed types in a column across lines, integers beyond int64: keep every value as its JSON text
        return pa.table({k: [None if v is None else json.dumps(v, ensure_ascii=False) for v in vals]
                         for k, vals in cols.items()})


def _parse_line(raw: bytes) -> tuple[dict[str, Any], str | None]:
    """``(record, error)`` of one JSONL line (``{}`` and a reason when unreadable: not JSON, not an
    object, or an :class:`~batch_contract.rows.OversizedLine`). Invalid UTF-8 bytes stay in the values as
    lone surrogates (:func:`batch_contract.rows.decode_line`)."""
    if isinstance(raw, OversizedLine):
        return {}, (f"line is {raw.length} bytes, above worker.max_line_bytes; "
                    "not read (split the record or raise the limit)")
    try:
        rec = json.loads(decode_line(raw))
    except json.JSONDecodeError as exc:
        return {}, f"invalid JSON at column {exc.colno}: {exc.msg}"
    if not isinstance(rec, dict):
        return {}, f"line is JSON {type(rec).__name__}, not an object"
    return rec, None


def _jsonl_block(spec: InputSpec, uri: str, lines: list[tuple[int, bytes]], extra: Sequence[str]) -> RawBlock:
    records: list[dict[str, Any]] = []
    errors: list[str | None] = []
    texts: list[Any] = []
    repaired: list[bool] = []
    for _rowno, raw in lines:
        rec, err = _parse_line(raw)
        text, bad_text = repair_text(rec.get(spec.text_column))
        records.append(rec)
        errors.append(err)
        texts.append(text)
        repaired.append(bad_text)
    return RawBlock(
        source_uri=uri,
        source_rows=[r for r, _ in lines],
        ids=[r.get(spec.id_column) for r in records],
        texts=texts,
        text_repaired=repaired,
        extras=_extras_table(records, [c for c in extra if c not in (spec.id_column, spec.text_column)]),
        record_errors=errors,
        rejections=[_rejection(r, spec.rejection_key) for r in records] if spec.rejection_key else [],
    )


def _rejection(record: dict[str, Any], key: str) -> tuple[str, str] | None:
    """``(reason, detail)`` a row refused before the run carries under ``key``, else ``None``; a value
    that is not ``{"code": str, "message": str}`` is not a refusal the planner wrote (it stays ``None``)."""
    value = record.get(key)
    if isinstance(value, dict) and isinstance(value.get("code"), str) and isinstance(value.get("message"), str):
        return value["code"], value["message"]
    return None


def _jsonl_blocks(spec: InputSpec, uri: str, seg: Segment, batch_rows: int,
                  extra: Sequence[str], settings: WorkerSettings) -> Iterator[RawBlock]:
    rows = 0
    pending: list[tuple[int, bytes]] = []
    pending_bytes = 0
    with _open(spec, uri, random_access=False) as fh:
        for row, raw in iter_jsonl_lines(fh, max_line_bytes=settings.max_line_bytes):
            if row >= seg.row_stop:
                break
            rows = row + 1
            if row < seg.row_start:
                continue
            pending.append((row, raw))
            pending_bytes += len(raw)
            if len(pending) >= batch_rows or pending_bytes >= settings.max_row_group_bytes:
                yield _jsonl_block(spec, uri, pending, extra)
                pending = []
                pending_bytes = 0
    if pending:
        yield _jsonl_block(spec, uri, pending, extra)
    if rows < seg.row_stop:
        raise BadInputError(f"{uri}: segment rows {seg.row_start}..{seg.row_stop} beyond the file's {rows} rows")


def iter_shard_blocks(spec: InputSpec, segments: list[Segment], batch_rows: int,
                      extra_columns: Sequence[str] = (), settings: WorkerSettings | None = None) -> Iterator[RawBlock]:
    """Yield the shard's rows as :class:`RawBlock` s, segment by segment, each in file row order.

    A *scattered* shard (:func:`is_scattered`: a file read by more than one segment, as the prefix-aware
    plan makes) is read file by file once (:func:`_scattered_blocks`) and yielded in segment order.

    Args:
        spec: the manifest's input spec (format, id/text columns, files, roots).
        segments: the shard's segments.
        batch_rows: max rows per block (``WorkerSettings.read_batch_rows``).
        extra_columns: input columns the engine reads besides id and text (LLM template fields;
            see ``Engine.extra_columns``); no other column is read. Absent ones are skipped.
        settings: the run's worker settings (``max_line_bytes``, ``max_row_group_bytes``); ``None``:
            the defaults.

    Raises:
        BadInputError: missing id/text column, id column of a type other than integer/string, a
            segment beyond the end of its file, a file outside ``spec.roots`` (or not a regular file),
            or a Parquet row group over ``max_row_group_bytes``.
    """
    settings = settings or WorkerSettings()
    for seg in segments:
        if not 0 <= seg.file_index < len(spec.files):
            raise BadInputError(f"segment file_index {seg.file_index} is not in input.files (0..{len(spec.files) - 1})")
    if is_scattered(segments):
        yield from _scattered_blocks(spec, segments, batch_rows, extra_columns, settings)
        return
    for seg in segments:
        uri = spec.files[seg.file_index].uri
        if spec.format == InputFormat.PARQUET.value:
            yield from _parquet_blocks(spec, uri, seg, batch_rows, extra_columns, settings)
        else:
            yield from _jsonl_blocks(spec, uri, seg, batch_rows, extra_columns, settings)


def is_scattered(segments: Sequence[Segment]) -> bool:
    """Whether some file is read by more than one of ``segments`` (the prefix-aware plan's shards: one
    segment per run of rows of a group); such a shard is read file by file, not segment by segment."""
    files = [seg.file_index for seg in segments]
    return len(set(files)) < len(files)


def _wanted_rows(segments: Sequence[Segment]) -> dict[int, set[int]]:
    wanted: dict[int, set[int]] = {}
    for seg in segments:
        wanted.setdefault(seg.file_index, set()).update(range(seg.row_start, seg.row_stop))
    return wanted


def _parquet_rows(spec: InputSpec, uri: str, rows: set[int], extra: Sequence[str],
                  settings: WorkerSettings) -> tuple[pa.Table, dict[int, int]]:
    """The wanted ``rows`` of one Parquet file as one table (the columns read) and each row's position in
    it; each overlapping row group is read once, only its wanted rows kept."""
    with _open(spec, uri, random_access=True) as fh:
        pf = pq.ParquetFile(fh)
        columns = _parquet_columns(spec, pf.schema_arrow, uri, extra)
        meta = pf.metadata
        sizes = row_group_read_bytes(meta, pf.schema_arrow, columns)
        if rows and max(rows) >= meta.num_rows:
            raise BadInputError(f"{uri}: segment row {max(rows)} beyond the file's {meta.num_rows} rows")
        pieces: list[pa.Table] = []
        position: dict[int, int] = {}
        offset = 0
        for g in range(meta.num_row_groups):
            n = meta.row_group(g).num_rows
            local = sorted(r - offset for r in rows if offset <= r < offset + n)
            if local:
                if sizes[g] > settings.max_row_group_bytes:
                    raise BadInputError(f"{uri}: row group {g} holds {sizes[g]} bytes (uncompressed) of the columns "
                                        f"read, above worker.max_row_group_bytes ({settings.max_row_group_bytes})")
                base = len(position)
                position.update({offset + r: base + k for k, r in enumerate(local)})
                pieces.append(pf.read_row_group(g, columns=columns).take(pa.array(local, pa.int64())))
            offset += n
    table = pa.concat_tables(pieces) if pieces else pa.table({})
    return table, position


def _jsonl_rows(spec: InputSpec, uri: str, rows: set[int], settings: WorkerSettings) -> dict[int, bytes]:
    """The raw lines of the wanted ``rows`` of one JSONL file (streamed once)."""
    out: dict[int, bytes] = {}
    last = max(rows) if rows else -1
    with _open(spec, uri, random_access=False) as fh:
        for row, raw in iter_jsonl_lines(fh, max_line_bytes=settings.max_line_bytes):
            if row in rows:
                out[row] = raw
            if row >= last:
                break
    if len(out) < len(rows):
        raise BadInputError(f"{uri}: segment row {last} beyond the file's rows")
    return out


def _scattered_blocks(spec: InputSpec, segments: Sequence[Segment], batch_rows: int, extra: Sequence[str],
                      settings: WorkerSettings) -> Iterator[RawBlock]:
    """A scattered shard's rows in segment order, each file read once: memory holds the shard's rows
    (the columns read) plus one Parquet row group, never a whole file."""
    loaded: dict[int, Any] = {}
    for file_index, rows in _wanted_rows(segments).items():
        uri = spec.files[file_index].uri
        if spec.format == InputFormat.PARQUET.value:
            loaded[file_index] = _parquet_rows(spec, uri, rows, extra, settings)
        else:
            loaded[file_index] = _jsonl_rows(spec, uri, rows, settings)
    pending: list[int] = []
    current = -1
    for seg in segments:
        for row in range(seg.row_start, seg.row_stop):
            if pending and (seg.file_index != current or len(pending) >= batch_rows):
                yield _loaded_block(spec, current, pending, loaded[current], extra)
                pending = []
            current = seg.file_index
            pending.append(row)
    if pending:
        yield _loaded_block(spec, current, pending, loaded[current], extra)


def _loaded_block(spec: InputSpec, file_index: int, rows: list[int], loaded: Any, extra: Sequence[str]) -> RawBlock:
    uri = spec.files[file_index].uri
    if spec.format == InputFormat.PARQUET.value:
        table, position = loaded
        block = _parquet_block(spec, uri, table.take(pa.array([position[r] for r in rows], pa.int64())), 0)
        block.source_rows = list(rows)
        return block
    return _jsonl_block(spec, uri, [(r, loaded[r]) for r in rows], extra)

