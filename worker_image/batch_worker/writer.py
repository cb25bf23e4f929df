"""Part-file and dead-letter writer: one Parquet object per chunk, committed create-only.

Encodings come from the contract (:func:`batch_contract.schemas.parquet_write_options`): zstd and
dictionary for ids and small columns, plain uncompressed floats for embeddings and scores.
"""

from __future__ import annotations

import io
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from batch_contract import storage
from batch_contract.layout import DEAD_LETTER_PREFIX, PART_PREFIX, join_uri, part_name
from batch_contract.partfiles import digest_of
from batch_contract.schemas import DEAD_LETTER_SCHEMA, parquet_write_options

from batch_worker.engines.base import ChunkOutput, ChunkRows
from batch_worker.validate import DeadLetter


def parquet_bytes(table: pa.Table) -> bytes:
    """Serialise ``table`` as Parquet with the contract's part-file encodings
    (:func:`~batch_contract.schemas.parquet_write_options`)."""
    sink = io.BytesIO()
    pq.write_table(table, sink, **parquet_write_options(table.schema))
    return sink.getvalue()


def assemble_part(rows: ChunkRows, out: ChunkOutput, fingerprint: str, schema: pa.Schema) -> pa.Table:
    """Join the engine's output table with the rows by id and cast it to the part schema.

    Adds ``fingerprint`` and ``text_repaired`` (looked up by id, never by position).

    Raises:
        KeyError: an output id is not in ``rows`` (``check_chunk_output`` catches this earlier).
        pyarrow.ArrowInvalid: the engine's columns do not match ``schema``.
    """
    table = out.table
    repaired_by_id = dict(zip(rows.ids, rows.text_repaired, strict=True))
    ids = table.column("id").to_pylist()
    cols = {}
    for f in schema:
        if f.name == "fingerprint":
            cols[f.name] = pa.array([fingerprint] * len(ids), f.type)
        elif f.name == "text_repaired":
            cols[f.name] = pa.array([repaired_by_id[i] for i in ids], f.type)
        else:
            cols[f.name] = table.column(f.name).cast(f.type)
    return pa.table(cols, schema=schema)


def dead_letter_table(dead: list[DeadLetter], fingerprint: str) -> pa.Table:
    """Rows of :data:`~batch_contract.schemas.DEAD_LETTER_SCHEMA` for ``dead``."""
    return pa.table(
        {
            "id": pa.array([d.id for d in dead], pa.string()),
            "reason": pa.array([d.reason.value for d in dead], pa.string()),
            "detail": pa.array([d.detail for d in dead], pa.string()),
            "source_uri": pa.array([d.source_uri for d in dead], pa.string()),
            "source_row": pa.array([d.source_row for d in dead], pa.int64()),
            "fingerprint": pa.array([fingerprint] * len(dead), pa.string()),
        },
        schema=DEAD_LETTER_SCHEMA,
    )


def commit_table(shard_dir: str, prefix: str, chunk: int, table: pa.Table,
                 reused: bool = False) -> tuple[str, dict[str, Any]]:
    """Commit ``table`` as a new part (``prefix`` = ``part-``) or dead-letter file.

    ``reused=True``: a part of rows carried over from the result cache (``part-<chunk>-reuse-...``).

    The object becomes visible only complete (``storage.write_create_only``: temp + fsync + link).

    Returns:
        ``(name, digest)``: the file name and its commit record
        (:func:`batch_contract.partfiles.digest_of`: size in bytes and SHA-256).
    """
    if prefix not in (PART_PREFIX, DEAD_LETTER_PREFIX):
        raise ValueError(f"prefix must be {PART_PREFIX!r} or {DEAD_LETTER_PREFIX!r}")
    name = part_name(prefix, chunk, reused=reused)
    data = parquet_bytes(table)
    storage.write_create_only(join_uri(shard_dir, name), data)
    return name, digest_of(data)
