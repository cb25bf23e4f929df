"""A run's dead-letter rows as one downloadable "error file" (JSONL or CSV), like a batch API's error file.

Rows come from the committed ``dead-letter-*.parquet`` files of every shard (schema
:data:`batch_contract.schemas.DEAD_LETTER_SCHEMA`), found with one listing per shard through the run
store (:meth:`batch_contract.runstore.RunStore.committed_files`; temp files of a running worker are never
read). A chunk committed twice by two attempts holds the same input rows: a row is written once per
``(source_uri, source_row)``, the first one met in shard and file-name (commit) order.

Memory is bounded whatever the size of the files: each file is read :data:`BATCH_ROWS` rows at a time
(:meth:`pyarrow.parquet.ParquetFile.iter_batches`, no pre-buffering), the output leaves in chunks of about
:data:`CHUNK_BYTES`, and the de-duplication keeps one bit per input row of the shard being written (the
rows its manifest segments cover). A row whose ``(source_uri, source_row)`` lies outside its shard's
segments (not an input row of that shard) is written without de-duplication.

CSV cells are neutralised against formula injection (OWASP "CSV Injection"): a cell that starts with
``=``, ``+``, ``-``, ``@``, a tab or a carriage return gets a ``'`` in front, in every column; every cell
is quoted.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Iterator
from itertools import groupby
from operator import itemgetter
from typing import Any

import pyarrow.parquet as pq
from batch_contract import storage
from batch_contract.layout import DEAD_LETTER_PREFIX, join_uri
from batch_contract.manifest import Manifest, ShardSpec
from batch_contract.runstore import RunStore

COLUMNS = ("shard_id", "id", "reason", "detail", "source_uri", "source_row", "fingerprint")
"""Columns of the error file: the shard, then :data:`~batch_contract.schemas.DEAD_LETTER_SCHEMA`'s."""
BATCH_ROWS = 1024
"""Rows decoded from a dead-letter file at a time."""
READ_BUFFER_BYTES = 1 << 20
"""Read buffer of a dead-letter file (bytes): column chunks are streamed through it, not loaded whole."""
CHUNK_BYTES = 64 << 10
"""The download leaves in chunks of about this many bytes (one row may make a chunk bigger)."""
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")
"""Leading characters that make a spreadsheet read a CSV cell as a formula (OWASP "CSV Injection")."""


def dead_letter_files(store: RunStore) -> list[tuple[str, str]]:
    """``[(shard_id, uri)]`` of every committed dead-letter file of the run, in shard and commit order."""
    out = []
    for spec in store.manifest.shards:
        names = sorted(n for n in store.committed_files(spec.shard_id) if n.startswith(DEAD_LETTER_PREFIX))
        out.extend((spec.shard_id, join_uri(store.layout.shard_dir(spec.shard_id), n)) for n in names)
    return out


class _ShardRows:
    """Which input rows of one shard were written already: one bit per row its segments cover."""

    def __init__(self, manifest: Manifest, spec: ShardSpec) -> None:
        self._ranges: dict[str, list[tuple[int, int, int]]] = {}
        offset = 0
        for seg in spec.segments:
            uri = manifest.input.files[seg.file_index].uri
            self._ranges.setdefault(uri, []).append((seg.row_start, seg.row_stop, offset))
            offset += seg.rows
        self._bits = bytearray((offset + 7) // 8)

    def first_time(self, source_uri: Any, source_row: Any) -> bool:
        """Whether the row is met for the first time (then it is marked); ``True`` for a row outside the
        shard's segments."""
        if not isinstance(source_row, int):
            return True
        for start, stop, offset in self._ranges.get(source_uri, ()):
            if start <= source_row < stop:
                bit = offset + source_row - start
                byte, mask = bit >> 3, 1 << (bit & 7)
                if self._bits[byte] & mask:
                    return False
                self._bits[byte] |= mask
                return True
        return True


def _read_rows(uri: str) -> Iterator[dict[str, Any]]:
    """The rows of one Parquet file, :data:`BATCH_ROWS` at a time."""
    fs, path = storage.arrow_filesystem(uri)
    with fs.open_input_file(path) as fh:
        parquet = pq.ParquetFile(fh, buffer_size=READ_BUFFER_BYTES, pre_buffer=False)
        for batch in parquet.iter_batches(batch_size=BATCH_ROWS):
            yield from batch.to_pylist()


def iter_dead_letters(store: RunStore) -> Iterator[dict[str, Any]]:
    """Dead-letter rows of the run as dicts with :data:`COLUMNS` (each input row once), read lazily.

    Raises:
        FileNotFoundError / StorageError: the manifest or a listed file is missing or unreadable.
        pyarrow.ArrowInvalid: a committed file is not Parquet.
    """
    manifest = store.manifest
    specs = {spec.shard_id: spec for spec in manifest.shards}
    for shard_id, files in groupby(dead_letter_files(store), key=itemgetter(0)):
        seen = _ShardRows(manifest, specs[shard_id])
        for _, uri in files:
            for row in _read_rows(uri):
                if seen.first_time(row.get("source_uri"), row.get("source_row")):
                    yield {"shard_id": shard_id, **{c: row.get(c) for c in COLUMNS[1:]}}


def _chunked(pieces: Iterable[str]) -> Iterator[bytes]:
    """``pieces`` joined and encoded as UTF-8, in chunks of about :data:`CHUNK_BYTES`."""
    buf: list[str] = []
    size = 0
    for piece in pieces:
        buf.append(piece)
        size += len(piece)
        if size >= CHUNK_BYTES:
            yield "".join(buf).encode("utf-8")
            buf, size = [], 0
    if buf:
        yield "".join(buf).encode("utf-8")


def to_jsonl(rows: Iterable[dict[str, Any]]) -> Iterator[bytes]:
    """One JSON object per line (UTF-8), in chunks of about :data:`CHUNK_BYTES`."""
    return _chunked(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def safe_cell(value: Any) -> str:
    """The CSV text of one cell: ``""`` for ``None``, else ``str(value)`` with a ``'`` in front when it
    starts with one of :data:`FORMULA_PREFIXES` (a negative number too: ``-1`` becomes ``'-1``)."""
    text = "" if value is None else str(value)
    return "'" + text if text.startswith(FORMULA_PREFIXES) else text


def to_csv(rows: Iterable[dict[str, Any]]) -> Iterator[bytes]:
    """CSV with a header of :data:`COLUMNS` (every cell quoted, RFC 4180, CRLF line ends, UTF-8; cells
    neutralised by :func:`safe_cell`), in chunks of about :data:`CHUNK_BYTES`."""

    def lines() -> Iterator[str]:
        buf = io.StringIO()
        writer = csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\r\n")
        writer.writerow([safe_cell(c) for c in COLUMNS])
        yield buf.getvalue()
        for row in rows:
            buf.seek(0)
            buf.truncate()
            writer.writerow([safe_cell(row.get(c)) for c in COLUMNS])
            yield buf.getvalue()

    return _chunked(lines())
