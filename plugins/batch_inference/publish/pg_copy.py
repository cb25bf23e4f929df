"""PostgreSQL binary ``COPY`` encoding of Arrow record batches, vectorised (no per-row Python).

Each column is encoded to an Arrow binary array whose elements are complete COPY fields (4-byte
big-endian length + value, or length -1 for NULL), built with NumPy structured arrays for fixed-width
values; ``binary_join_element_wise`` then concatenates the fields of each row, and the resulting value
buffer *is* the COPY payload for the batch. Format: PostgreSQL docs, "COPY - Binary Format".

Column types (Arrow -> PostgreSQL): string -> ``text``; int16/int32/int64 -> ``smallint``/``integer``/
``bigint``; bool -> ``boolean``; float32/float64 -> ``real``/``double precision``;
``fixed_size_list<float32>[n]`` -> ``real[]`` (one dimension, ``n`` elements) or pgvector ``vector(n)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from batch_inference.publish.errors import PublishError

COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + (0).to_bytes(4, "big") + (0).to_bytes(4, "big")
"""Signature, flags (no OIDs) and header-extension length."""
COPY_TRAILER = (-1).to_bytes(2, "big", signed=True)
NULL_FIELD = (-1).to_bytes(4, "big", signed=True)
FLOAT4_OID = 700

_SCALARS: dict[pa.DataType, tuple[str, str]] = {
    pa.int16(): ("smallint", ">i2"),
    pa.int32(): ("integer", ">i4"),
    pa.int64(): ("bigint", ">i8"),
    pa.float32(): ("real", ">f4"),
    pa.float64(): ("double precision", ">f8"),
    pa.bool_(): ("boolean", "u1"),
}


@dataclass(frozen=True)
class PgColumn:
    """One column of a COPY: its name, Arrow type and PostgreSQL type text."""

    name: str
    arrow_type: pa.DataType
    pg_type: str


def pg_columns(schema: pa.Schema, *, use_vector: bool) -> list[PgColumn]:
    """PostgreSQL column types for an Arrow schema.

    Args:
        schema: schema of the batches to copy.
        use_vector: map float32 fixed-size lists to pgvector ``vector(n)`` instead of ``real[]``.

    Raises:
        PublishError: a column type with no mapping (the message names the column).
    """
    out = []
    for f in schema:
        t = f.type
        if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
            pg = "text"
        elif t in _SCALARS:
            pg = _SCALARS[t][0]
        elif pa.types.is_fixed_size_list(t) and pa.types.is_float32(t.value_type):
            pg = f"vector({t.list_size})" if use_vector else "real[]"
        else:
            raise PublishError(f"column {f.name!r}: type {t} has no PostgreSQL mapping")
        out.append(PgColumn(f.name, t, pg))
    return out


def _fsb(raw: np.ndarray, width: int, n: int) -> pa.Array:
    data = pa.py_buffer(np.ascontiguousarray(raw).view(np.uint8))  # zero-copy view of the NumPy rows
    fixed = pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), n, [None, data])
    return fixed.cast(pa.binary())


def _with_nulls(encoded: pa.Array, col: pa.Array) -> pa.Array:
    if col.null_count == 0:
        return encoded
    return pc.if_else(pc.is_valid(col), encoded, pa.scalar(NULL_FIELD, pa.binary()))


def _scalar_fields(col: pa.Array, dtype: str) -> pa.Array:
    vals = col.fill_null(False if pa.types.is_boolean(col.type) else 0).to_numpy(zero_copy_only=False)
    rec = np.empty(len(col), dtype=[("len", ">i4"), ("v", dtype)])
    rec["len"] = np.dtype(dtype).itemsize
    rec["v"] = vals
    return _with_nulls(_fsb(rec, rec.dtype.itemsize, len(col)), col)


def _text_fields(col: pa.Array) -> pa.Array:
    col = col.cast(pa.string())
    lengths = pc.binary_length(col).fill_null(0).to_numpy(zero_copy_only=False).astype(">i4")
    joined = pc.binary_join_element_wise(_fsb(lengths, 4, len(col)), col.cast(pa.binary()), b"")
    return _with_nulls(joined, col)


def _float_vector_fields(col: pa.Array, name: str, use_vector: bool) -> pa.Array:
    dim = col.type.list_size
    n = len(col)
    if col.null_count:
        raise PublishError(f"column {name!r}: {col.null_count} null embedding(s)")
    values = col.flatten()
    if values.null_count:
        raise PublishError(f"column {name!r}: embeddings contain {values.null_count} null element(s)")
    matrix = values.to_numpy(zero_copy_only=False).reshape(n, dim)
    if use_vector:
        rec = np.empty(n, dtype=[("len", ">i4"), ("dim", ">i2"), ("unused", ">i2"), ("v", ">f4", (dim,))])
        rec["len"], rec["dim"], rec["unused"] = 4 + 4 * dim, dim, 0
        rec["v"] = matrix
    else:
        elem = np.dtype([("l", ">i4"), ("v", ">f4")])
        rec = np.empty(n, dtype=[("len", ">i4"), ("ndim", ">i4"), ("flags", ">i4"), ("oid", ">i4"),
                                 ("dim", ">i4"), ("lbound", ">i4"), ("e", elem, (dim,))])
        rec["len"], rec["ndim"], rec["flags"], rec["oid"] = 20 + 8 * dim, 1, 0, FLOAT4_OID
        rec["dim"], rec["lbound"] = dim, 1
        rec["e"]["l"] = 4
        rec["e"]["v"] = matrix
    return _fsb(rec, rec.dtype.itemsize, n)


def encode_batch(batch: pa.RecordBatch, columns: list[PgColumn]) -> memoryview:
    """The binary COPY rows of ``batch`` (no header/trailer), as one contiguous buffer.

    Args:
        batch: rows to copy; columns in ``columns`` order.
        columns: from :func:`pg_columns` on the batch schema.

    Raises:
        PublishError: null embeddings or null embedding elements (the message names the column).
    """
    n = batch.num_rows
    header = np.full(n, len(columns), dtype=">i2")
    fields = [_fsb(header, 2, n)]
    for col_def, col in zip(columns, batch.columns, strict=True):
        if col_def.pg_type == "text":
            fields.append(_text_fields(col))
        elif pa.types.is_fixed_size_list(col_def.arrow_type):
            fields.append(_float_vector_fields(col, col_def.name, col_def.pg_type.startswith("vector")))
        else:
            fields.append(_scalar_fields(col, _SCALARS[col_def.arrow_type][1]))
    rows = pc.binary_join_element_wise(*fields, b"")
    offsets = np.frombuffer(rows.buffers()[1], dtype=np.int32, count=len(rows) + 1, offset=4 * rows.offset)
    data = rows.buffers()[2]
    return memoryview(data)[int(offsets[0]) : int(offsets[-1])]
