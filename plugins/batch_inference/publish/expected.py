"""The ids a run must cover, read from the manifest's input rows (id column only, streamed).

The manifest holds row ranges, not ids. This module reads only the id column of every shard segment
(Parquet column projection, row groups outside the range skipped) and yields Arrow batches, so the set
logic can run in DuckDB and scale to tens of millions of rows without Python sets.

Ids follow the contract's rule (:func:`batch_contract.rows.canonical_id`, as the worker): strings,
integer ids in decimal. Rows whose id has no canonical form (null; in JSONL not a string or integer;
not valid Unicode) cannot be matched by id: they are expected as dead letters and matched by
``(source_uri, source_row)``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from batch_contract import storage
from batch_contract.enums import InputFormat
from batch_contract.manifest import InputFile, Manifest, Segment
from batch_contract.rows import canonical_id, decode_line, iter_jsonl_lines

from batch_inference.publish.errors import PublishError

ID_BATCH_SCHEMA = pa.schema([pa.field("id", pa.string()), pa.field("file_index", pa.int32()),
                             pa.field("source_row", pa.int64())])
"""Batches of expected non-null ids (strings) with their input position (``file_index`` in the manifest's
input files, row number within that file): the position names the input row of an id that occurs in
several shards."""

NULL_ROW_SCHEMA = pa.schema([pa.field("source_uri", pa.string()), pa.field("source_row", pa.int64())])
"""Batches of input positions whose id is null: expected as dead letters with a null id."""


@dataclass(frozen=True)
class ExpectedBatch:
    """One batch of expected rows: ``ids`` (schema :data:`ID_BATCH_SCHEMA`, one row per input row, so
    an id repeated in the input appears as often as it occurs) and ``null_rows``
    (schema :data:`NULL_ROW_SCHEMA`); either may have zero rows."""

    ids: pa.RecordBatch
    null_rows: pa.RecordBatch


def _ids_to_string(col: pa.Array, column: str, uri: str) -> pa.Array:
    """Canonical string ids of a Parquet id column: integers in decimal, strings verbatim; a string
    that is not valid UTF-8 becomes null (its row is matched by position, as the worker dead-letters
    it ``invalid_id``)."""
    check_id_type(col.type, column, uri)
    if pa.types.is_integer(col.type):
        return pc.cast(col, pa.string())
    try:
        col.validate(full=True)
        return pc.cast(col, pa.string())
    except pa.ArrowInvalid:
        binary = col.view(pa.large_binary() if pa.types.is_large_string(col.type) else pa.binary())
        return pa.array([canonical_id(v).id for v in binary.to_pylist()], pa.string())


def _split(ids: pa.Array, uri: str, first_row: int, file_index: int) -> ExpectedBatch:
    """Split one id array (rows ``first_row..`` of input file ``file_index``) into non-null ids with
    their rows and null positions."""
    valid = pc.is_valid(ids)
    kept = pc.filter(ids, valid) if ids.null_count else ids
    if ids.null_count:
        kept_rows = pc.add(pc.cast(pc.indices_nonzero(valid), pa.int64()), first_row)
    else:
        kept_rows = pa.array(np.arange(first_row, first_row + len(ids), dtype=np.int64))
    file_col = pa.array(np.full(len(kept), file_index, dtype=np.int32))
    if ids.null_count:
        positions = pc.indices_nonzero(pc.invert(valid))
        rows = pc.add(pc.cast(positions, pa.int64()), first_row)
        uris = pa.array([uri] * len(rows), pa.string())
        null_batch = pa.record_batch([uris, rows], schema=NULL_ROW_SCHEMA)
    else:
        null_batch = pa.RecordBatch.from_pylist([], schema=NULL_ROW_SCHEMA)
    return ExpectedBatch(pa.record_batch([kept, file_col, kept_rows], schema=ID_BATCH_SCHEMA), null_batch)


def _parquet_segment(pf: pq.ParquetFile, seg: Segment, column: str, uri: str) -> Iterator[ExpectedBatch]:
    """Yield the ids of rows ``[seg.row_start, seg.row_stop)`` one row group at a time."""
    group_start = 0
    for g in range(pf.metadata.num_row_groups):
        n = pf.metadata.row_group(g).num_rows
        lo, hi = max(seg.row_start, group_start), min(seg.row_stop, group_start + n)
        if lo < hi:
            col = pf.read_row_group(g, columns=[column]).column(0).combine_chunks()
            ids = _ids_to_string(col.slice(lo - group_start, hi - lo), column, uri)
            yield _split(ids, uri, lo, seg.file_index)
        group_start += n
        if group_start >= seg.row_stop:
            break
    if group_start < seg.row_stop:
        raise PublishError(f"{uri}: has {group_start} rows but the manifest asks for rows up to {seg.row_stop}")


def _jsonl_ids(uri: str, file_index: int, segments: list[Segment], column: str,
               batch_rows: int, max_line_bytes: int) -> Iterator[ExpectedBatch]:
    """Yield ids of the wanted rows of a JSONL file (one pass; the contract's line rule, with the run's
    ``max_line_bytes`` so a line the worker dead-lettered as too long is expected by position as well)."""
    wanted = sorted((s.row_start, s.row_stop) for s in segments)
    fs, path = storage.arrow_filesystem(uri)
    ids: list[str | None] = []
    first = -1
    rows = 0
    seg_i = 0

    def flush() -> ExpectedBatch:
        batch = _split(pa.array(ids, pa.string()), uri, first, file_index)
        ids.clear()
        return batch

    with fs.open_input_stream(path) as fh:
        for row, raw in iter_jsonl_lines(fh, max_line_bytes=max_line_bytes):
            rows = row + 1
            while seg_i < len(wanted) and row >= wanted[seg_i][1]:
                seg_i += 1
            if seg_i == len(wanted):
                break
            if row >= wanted[seg_i][0]:
                if ids and first + len(ids) != row:
                    yield flush()
                if not ids:
                    first = row
                ids.append(_jsonl_id(raw, column))
                if len(ids) >= batch_rows:
                    yield flush()
    if ids:
        yield flush()
    if wanted and rows < wanted[-1][1]:
        raise PublishError(f"{uri}: has {rows} rows but the manifest asks for rows up to {wanted[-1][1]}")


def _jsonl_id(raw: bytes, column: str) -> str | None:
    """Canonical id of one JSONL line (:func:`batch_contract.rows.canonical_id`); ``None`` for a line
    that is not a JSON object and for ids matched by position."""
    try:
        record = json.loads(decode_line(raw))
    except ValueError:
        return None  # an unparsable line is dead-lettered by position
    if not isinstance(record, dict):
        return None
    return canonical_id(record.get(column)).id


def merged_ranges(manifest: Manifest) -> dict[int, list[tuple[int, int]]]:
    """Row ranges each input file contributes, adjacent/overlapping segments merged.

    Returns:
        ``{file_index: [(row_start, row_stop), ...]}`` sorted by start, half-open ranges.
    """
    by_file: dict[int, list[tuple[int, int]]] = {}
    for spec in manifest.shards:
        for seg in spec.segments:
            by_file.setdefault(seg.file_index, []).append((seg.row_start, seg.row_stop))
    merged: dict[int, list[tuple[int, int]]] = {}
    for file_index, ranges in sorted(by_file.items()):
        out: list[tuple[int, int]] = []
        for lo, hi in sorted(ranges):
            if out and lo <= out[-1][1]:
                out[-1] = (out[-1][0], max(out[-1][1], hi))
            else:
                out.append((lo, hi))
        merged[file_index] = out
    return merged


def check_id_type(id_type: pa.DataType, column: str, uri: str) -> None:
    """Raise ``PublishError`` unless the input id column is a string or integer type."""
    ok = (pa.types.is_string(id_type) or pa.types.is_large_string(id_type)
          or pa.types.is_string_view(id_type) or pa.types.is_integer(id_type))
    if not ok:
        raise PublishError(
            f"{uri}: id column {column!r} has type {id_type}; publish matches ids as strings or integers"
        )


def iter_expected(
    manifest: Manifest, batch_rows: int = 65536, file_indices: set[int] | None = None
) -> Iterator[ExpectedBatch]:
    """Yield every expected id of the run (each shard's segments), one bounded batch at a time.

    Args:
        manifest: the run's plan.
        batch_rows: max rows per batch for JSONL inputs (Parquet batches are one row group).
        file_indices: only these input files (``None``: all).

    Yields:
        :class:`ExpectedBatch` items; ids are not de-duplicated here (DuckDB does that).

    Raises:
        PublishError: an input file is shorter than the manifest says, or its id column has a type
            other than string/integer.
    """
    by_file: dict[int, list[Segment]] = {}
    for spec in manifest.shards:
        for seg in spec.segments:
            by_file.setdefault(seg.file_index, []).append(seg)
    column = manifest.input.id_column
    for file_index in sorted(by_file):
        if file_indices is not None and file_index not in file_indices:
            continue
        info: InputFile = manifest.input.files[file_index]
        segments = sorted(by_file[file_index], key=lambda s: s.row_start)
        if manifest.input.format == InputFormat.JSONL.value:
            yield from _jsonl_ids(info.uri, file_index, segments, column, batch_rows,
                                  manifest.worker.max_line_bytes)
            continue
        fs, path = storage.arrow_filesystem(info.uri)
        pf = pq.ParquetFile(path, filesystem=fs)
        if column not in pf.schema_arrow.names:
            raise PublishError(f"{info.uri}: no id column {column!r} (columns: {pf.schema_arrow.names})")
        for seg in segments:
            yield from _parquet_segment(pf, seg, column, info.uri)
