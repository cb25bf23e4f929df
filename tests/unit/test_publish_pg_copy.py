"""Binary COPY encoding (PostgreSQL "COPY - Binary Format"; pgvector ``vector_recv``) checked byte by byte
against rows packed with ``struct``, independently of the vectorised encoder."""

from __future__ import annotations

import struct

import pyarrow as pa
import pytest
from batch_inference.publish.errors import PublishError
from batch_inference.publish.pg_copy import encode_batch, pg_columns


def _field(payload: bytes | None) -> bytes:
    return struct.pack(">i", -1) if payload is None else struct.pack(">i", len(payload)) + payload


def _real_array(values: list[float]) -> bytes:
    head = struct.pack(">iiiii", 1, 0, 700, len(values), 1)
    return head + b"".join(struct.pack(">i", 4) + struct.pack(">f", v) for v in values)


def _batch() -> pa.RecordBatch:
    emb = pa.FixedSizeListArray.from_arrays(pa.array([0.5, -1.25, 3.0, 1e-3], pa.float32()), 2)
    return pa.record_batch(
        [
            pa.array(["a\tb", "é"], pa.string()),
            pa.array([7, None], pa.int32()),
            pa.array([True, False]),
            pa.array([None, 2.5], pa.float32()),
            pa.array([1, 2**40], pa.int64()),
            emb,
        ],
        names=["id", "n", "flag", "score", "big", "embedding"],
    )


def test_real_array_rows_match_the_binary_format() -> None:
    batch = _batch()
    cols = pg_columns(batch.schema, use_vector=False)
    assert [c.pg_type for c in cols] == ["text", "integer", "boolean", "real", "bigint", "real[]"]
    expected = b""
    rows = [("a\tb", 7, True, None, 1, [0.5, -1.25]), ("é", None, False, 2.5, 2**40, [3.0, 1e-3])]
    for text, n, flag, score, big, emb in rows:
        expected += struct.pack(">h", 6)
        expected += _field(text.encode())
        expected += _field(None if n is None else struct.pack(">i", n))
        expected += _field(bytes([flag]))
        expected += _field(None if score is None else struct.pack(">f", score))
        expected += _field(struct.pack(">q", big))
        expected += _field(_real_array(emb))
    assert bytes(encode_batch(batch, cols)) == expected


def test_pgvector_rows_match_vector_recv() -> None:
    batch = _batch().select(["id", "embedding"])
    cols = pg_columns(batch.schema, use_vector=True)
    assert cols[1].pg_type == "vector(2)"
    vec = struct.pack(">hh", 2, 0) + struct.pack(">ff", 0.5, -1.25)
    first_row = struct.pack(">h", 2) + _field(b"a\tb") + _field(vec)
    assert bytes(encode_batch(batch, cols)).startswith(first_row)


def test_sliced_batches_encode_only_their_rows() -> None:
    batch = _batch()
    cols = pg_columns(batch.schema, use_vector=False)
    whole = bytes(encode_batch(batch, cols))
    assert bytes(encode_batch(batch.slice(0, 1), cols)) + bytes(encode_batch(batch.slice(1), cols)) == whole


def test_unmappable_type_and_null_embedding_are_named() -> None:
    with pytest.raises(PublishError, match="column 'when'"):
        pg_columns(pa.schema([pa.field("when", pa.timestamp("s"))]), use_vector=False)
    emb = pa.FixedSizeListArray.from_arrays(pa.array([1.0, 2.0], pa.float32()), 2)
    batch = pa.record_batch([pa.concat_arrays([emb, pa.nulls(1, emb.type)])], names=["embedding"])
    with pytest.raises(PublishError, match="column 'embedding': 1 null embedding"):
        encode_batch(batch, pg_columns(batch.schema, use_vector=False))
