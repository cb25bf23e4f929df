"""A run's dead-letter rows as one downloadable "error file" (JSONL or CSV), like a batch API's error file.

Rows come from the committed ``dead-letter-*.parquet`` files of every shard (schema
:data:`batch_contract.schemas.DEAD_LETTER_SCHEMA`), found with one listing per shard through the run
store (:meth:`batch_contract.runstore.RunStore.committed_files`; temp files of a running worker are never
read). A chunk committed twice by two attempts holds the same input rows: a row is written once per
``(source_uri, source_row)``, the first one met in shard and file-name (commit) order.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from batch_contract import storage
from batch_contract.layout import DEAD_LETTER_PREFIX, join_uri
from batch_contract.runstore import RunStore

COLUMNS = ("shard_id", "id", "reason", "detail", "source_uri", "source_row", "fingerprint")
"""Columns of the error file: the shard, then :data:`~batch_contract.schemas.DEAD_LETTER_SCHEMA`'s."""


def dead_letter_files(store: RunStore) -> list[tuple[str, str]]:
    """``[(shard_id, uri)]`` of every committed dead-letter file of the run, in shard and commit order."""
    out = []
    for spec in store.manifest.shards:
        names = sorted(n for n in store.committed_files(spec.shard_id) if n.startswith(DEAD_LETTER_PREFIX))
        out.extend((spec.shard_id, join_uri(store.layout.shard_dir(spec.shard_id), n)) for n in names)
    return out


def iter_dead_letters(store: RunStore) -> Iterator[dict[str, Any]]:
    """Dead-letter rows of the run as dicts with :data:`COLUMNS` (each input row once).

    Raises:
        FileNotFoundError / StorageError: a listed file vanished or could not be read.
        pyarrow.ArrowInvalid: a committed file is not Parquet.
    """
    seen: set[tuple[str, int]] = set()
    for shard_id, uri in dead_letter_files(store):
        table = pq.read_table(pa.BufferReader(storage.read_bytes(uri)))
        for row in table.to_pylist():
            key = (str(row.get("source_uri")), int(row.get("source_row") or -1))
            if key in seen:
                continue
            seen.add(key)
            yield {"shard_id": shard_id, **{c: row.get(c) for c in COLUMNS[1:]}}


def to_jsonl(rows: Iterator[dict[str, Any]]) -> Iterator[bytes]:
    """One JSON object per line (UTF-8), one chunk per row."""
    for row in rows:
        yield (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8")


def to_csv(rows: Iterator[dict[str, Any]]) -> Iterator[bytes]:
    """CSV with a header of :data:`COLUMNS` (RFC 4180 quoting, UTF-8), one chunk per row."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\r\n")
    writer.writeheader()
    yield buf.getvalue().encode("utf-8")
    for row in rows:
        buf.seek(0)
        buf.truncate()
        writer.writerow(row)
        yield buf.getvalue().encode("utf-8")
