"""Arrow schemas of part files and dead-letter files.

Every committed row carries the stable source ``id`` (always a string: integer ids are written in
decimal), the run's result ``fingerprint``, its token count and whether it was truncated. Ids are unique
within one part file; across part files of a shard they are unique except for a chunk re-done after a
lost commit reply, which publish de-duplicates by id.
"""

from __future__ import annotations

import pyarrow as pa

COMMON_FIELDS = [
    pa.field("id", pa.string(), nullable=False),
    pa.field("fingerprint", pa.string(), nullable=False),
    pa.field("n_tokens", pa.int32(), nullable=False),
    pa.field("truncated", pa.bool_(), nullable=False),
    pa.field("text_repaired", pa.bool_(), nullable=False),
]
"""Columns of every part file. ``n_tokens``: real (non-pad) input tokens after truncation.
``text_repaired``: invalid UTF-8 was replaced with U+FFFD before encoding."""

LLM_OUTPUT_FIELDS = [
    pa.field("output_text", pa.string()),
    pa.field("output_json", pa.string()),
    pa.field("prompt_tokens", pa.int32()),
    pa.field("cached_tokens", pa.int32()),
    pa.field("output_tokens", pa.int32()),
    pa.field("finish_reason", pa.string()),
]
"""LLM output columns: raw text, the validated JSON (canonical text; null without a schema), token
accounting as reported by the engine (``cached_tokens``: prompt tokens served from the prefix cache)."""

CLASSIFICATION_FIELDS = [pa.field("label", pa.string()), pa.field("score", pa.float32())]

DEAD_LETTER_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string()),  # null when the input id itself was null
        pa.field("reason", pa.string(), nullable=False),  # a DeadLetterReason value
        pa.field("detail", pa.string(), nullable=False),
        pa.field("source_uri", pa.string(), nullable=False),
        pa.field("source_row", pa.int64(), nullable=False),  # row number within source_uri
        pa.field("fingerprint", pa.string(), nullable=False),
    ]
)


def embedding_type(dim: int) -> pa.DataType:
    """``fixed_size_list<float32>[dim]``: one embedding vector (dim = model hidden size, e.g. 384)."""
    if dim < 1:
        raise ValueError(f"embedding dim must be >= 1, got {dim}")
    return pa.list_(pa.float32(), dim)


def part_schema(task: str, embedding_dim: int | None = None) -> pa.Schema:
    """Part-file schema for a task: ``embedding`` (needs ``embedding_dim``), ``classification`` or ``llm``.

    Raises:
        ValueError: unknown task, or ``embedding`` without a dimension.
    """
    if task == "embedding":
        if embedding_dim is None:
            raise ValueError("part_schema('embedding') needs embedding_dim")
        extra = [pa.field("embedding", embedding_type(embedding_dim), nullable=False)]
    elif task == "classification":
        extra = CLASSIFICATION_FIELDS
    elif task == "llm":
        extra = LLM_OUTPUT_FIELDS
    else:
        raise ValueError(f"unknown task {task!r}: expected embedding, classification or llm")
    return pa.schema(COMMON_FIELDS + extra)


PART_ROW_GROUP_ROWS = 16384
"""Rows per Parquet row group in part files (a chunk of up to 100k rows gets a few row groups)."""


def _is_float_payload(t: pa.DataType) -> bool:
    """Float columns and fixed-size float lists: embeddings and scores (high-entropy values)."""
    if pa.types.is_fixed_size_list(t) or pa.types.is_list(t):
        t = t.value_type
    return pa.types.is_floating(t)


def parquet_write_options(schema: pa.Schema) -> dict[str, object]:
    """Keyword arguments for :func:`pyarrow.parquet.write_table` when writing a part file of ``schema``.

    Float payload columns (embeddings, scores) are written PLAIN, uncompressed and without a
    dictionary; every other column keeps zstd and dictionary encoding (ids, the repeated fingerprint,
    labels, text). Where the rule comes from (measured on MiniLM embeddings of the Debian sample and
    on 1M x 384 unit vectors, ``bench/publish.py``): dictionary encoding of float vectors falls back
    after the 1 MiB dictionary page and leaves the column about 40% *larger* than plain; zstd (even
    with BYTE_STREAM_SPLIT) saves only 8-9% of the bytes of unit-norm float32 vectors, while
    decompressing them doubles the publish scan CPU (0.5 s -> 1.0 s per million 384-d rows).

    Returns:
        ``{"compression": {column: codec}, "use_dictionary": [columns], "row_group_size": rows}``.
    """
    floats = {f.name for f in schema if _is_float_payload(f.type)}
    return {
        "compression": {f.name: ("none" if f.name in floats else "zstd") for f in schema},
        "use_dictionary": [f.name for f in schema if f.name not in floats],
        "row_group_size": PART_ROW_GROUP_ROWS,
    }
