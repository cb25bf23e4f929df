"""Synthetic runs that follow the data contract, for publish tests and ``bench/publish.py``.

Test-only: lives under ``tests/`` (importable as ``synthetic_runs`` with ``tests`` on ``sys.path``, as
pytest's ``pythonpath`` and ``bench/publish.py`` set it), so it does not ship with the plugins.

Writes what the worker would: an input Parquet file, ``manifest.json``, per-shard ``part-*.parquet``
files (any of the three part schemas), ``dead-letter-*.parquet`` files and ``_SUCCESS.json`` markers.
Knobs inject the faults publish must catch: rows with neither result nor dead letter, a re-committed
chunk (duplicate ids), a missing marker, a stale fingerprint.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from batch_contract import storage
from batch_contract.enums import DeadLetterReason
from batch_contract.layout import DEAD_LETTER_PREFIX, PART_PREFIX, RunLayout, part_name, shard_id_for
from batch_contract.manifest import InputFile, InputSpec, Manifest, Segment, ShardSpec
from batch_contract.marker import ShardMarker
from batch_contract.partfiles import digest_of
from batch_contract.rows import canonical_id, decode_line, iter_jsonl_lines
from batch_contract.schemas import DEAD_LETTER_SCHEMA, parquet_write_options, part_schema


def write_input(path: str | Path, ids: Sequence[str | int | None] | pa.Array, *, row_group_rows: int = 100_000) -> str:
    """Write an input Parquet file with columns ``id`` and ``text``; returns its path as a string."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    id_arr = ids if isinstance(ids, pa.Array) else pa.array(list(ids))
    texts = pa.array([f"text {i}" for i in range(len(id_arr))], pa.string())
    pq.write_table(pa.table({"id": id_arr, "text": texts}), path, row_group_size=row_group_rows)
    return str(path)


@dataclass
class RunSpec:
    """How to build a synthetic run.

    Attributes:
        task: ``embedding``, ``classification`` or ``llm`` (the part schema).
        dim: embedding dimension (``embedding`` only).
        shards: number of shards (contiguous row ranges of the input).
        chunk_rows: rows per committed part file.
        fingerprint: the result fingerprint stamped on rows and markers.
        version: offset added to embedding values / scores, to tell two runs' rows apart.
        dead_rows: input row numbers to dead-letter (reason ``empty_text``).
        drop_rows: input row numbers that get neither a result nor a dead letter.
        duplicate_chunk: re-commit the first chunk of shard 0 under a new file name (a retried
            chunk); the copy's values are offset by 0.5 so de-duplication is observable.
        skip_markers: shard ids that get no ``_SUCCESS.json``.
        stale_fingerprint_shards: shard ids whose rows and marker carry another fingerprint.
        row_limit: plan only the first ``row_limit`` input rows (the manifest covers part of the file).
        dedupe_per_shard: de-duplicate ids within each shard only, as the real worker does (an id repeated
            in another shard gets a result there too); default: across the whole run.
        unit_embeddings: embeddings are seeded random unit vectors (the entropy of a real L2-normalised
            model output, for benchmarks) instead of the default readable grid ``row * 1e-3 + j``.
    """

    task: str = "embedding"
    dim: int = 8
    shards: int = 2
    chunk_rows: int = 100
    fingerprint: str = "f" * 32
    version: float = 0.0
    dead_rows: set[int] = field(default_factory=set)
    drop_rows: set[int] = field(default_factory=set)
    duplicate_chunk: bool = False
    skip_markers: set[str] = field(default_factory=set)
    stale_fingerprint_shards: set[str] = field(default_factory=set)
    row_limit: int | None = None
    dedupe_per_shard: bool = False
    unit_embeddings: bool = False


def _unit_vectors(rows: np.ndarray, dim: int) -> np.ndarray:
    """``(len(rows), dim)`` float32 random unit vectors, seeded by the first row number."""
    rng = np.random.default_rng(int(rows[0]) if len(rows) else 0)
    vectors = rng.standard_normal((len(rows), dim), dtype=np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def _results_table(ids: list[str], rows: np.ndarray, spec: RunSpec, fp: str, offset: float) -> pa.Table:
    n = len(ids)
    schema = part_schema(spec.task, spec.dim if spec.task == "embedding" else None)
    cols: dict[str, pa.Array] = {
        "id": pa.array(ids, pa.string()),
        "fingerprint": pa.array([fp] * n, pa.string()),
        "n_tokens": pa.array((rows % 50 + 1).astype(np.int32)),
        "truncated": pa.array(rows % 7 == 0),
        "text_repaired": pa.array(np.zeros(n, dtype=bool)),
    }
    value = spec.version + offset
    if spec.task == "embedding":
        grid = _unit_vectors(rows, spec.dim) if spec.unit_embeddings else (
            rows[:, None].astype(np.float32) * np.float32(1e-3) + np.arange(spec.dim, dtype=np.float32))
        flat = (grid + np.float32(value)).astype(np.float32).reshape(-1)
        cols["embedding"] = pa.FixedSizeListArray.from_arrays(pa.array(flat), spec.dim)
    elif spec.task == "classification":
        cols["label"] = pa.array([f"label_{r % 3}" for r in rows], pa.string())
        cols["score"] = pa.array((rows % 100 / 100 + value).astype(np.float32))
    else:
        cols["output_text"] = pa.array([f"out {r} v{value}\ttab\nnewline \\ back" for r in rows], pa.string())
        cols["output_json"] = pa.array([None if r % 2 else f'{{"r": {r}}}' for r in rows], pa.string())
        cols["prompt_tokens"] = pa.array((rows % 40 + 10).astype(np.int32))
        cols["cached_tokens"] = pa.array([None if r % 3 == 0 else int(r % 10) for r in rows], pa.int32())
        cols["output_tokens"] = pa.array((rows % 20).astype(np.int32))
        cols["finish_reason"] = pa.array(["stop"] * n, pa.string())
    return pa.table([cols[f.name] for f in schema], schema=schema)


def _dead_table(entries: list[tuple[str | None, str, int]], uri: str, fp: str) -> pa.Table:
    return pa.table(
        {
            "id": pa.array([e[0] for e in entries], pa.string()),
            "reason": pa.array([e[1] for e in entries], pa.string()),
            "detail": pa.array([f"synthetic {e[1]}" for e in entries], pa.string()),
            "source_uri": pa.array([uri] * len(entries), pa.string()),
            "source_row": pa.array([e[2] for e in entries], pa.int64()),
            "fingerprint": pa.array([fp] * len(entries), pa.string()),
        },
        schema=DEAD_LETTER_SCHEMA,
    )


def _write(shard_dir: str, prefix: str, chunk: int, table: pa.Table) -> str:
    name = part_name(prefix, chunk)
    path = storage.local_path(shard_dir) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, **parquet_write_options(table.schema))
    return name


def _records(shard_dir: str, names: list[str]) -> dict[str, dict]:
    """Commit records (size, SHA-256) of written files, as the worker puts them in its marker."""
    return {n: digest_of((storage.local_path(shard_dir) / n).read_bytes()) for n in names}


def write_jsonl_input(path: str | Path, ids: Sequence[str | int | None]) -> str:
    """Write a JSONL input (``{"id": ..., "text": ...}`` per line, a blank line every 10 rows)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, rid in enumerate(ids):
        lines.append(json.dumps({"id": rid, "text": f"text {i}"}))
        if i % 10 == 9:
            lines.append("")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def _read_ids(input_path: str) -> list[str | None]:
    """Input ids as the worker sees them: strings, integers in decimal, ``None`` for null."""
    if input_path.endswith(".jsonl"):
        with open(input_path, "rb") as fh:
            return [canonical_id(json.loads(decode_line(line)).get("id")).id for _, line in iter_jsonl_lines(fh)]
    fs, path = storage.arrow_filesystem(input_path)
    col = pq.read_table(path, columns=["id"], filesystem=fs).column("id").combine_chunks()
    return col.cast(pa.string()).to_pylist()


def build_run(output_root: str | Path, run_id: str, input_path: str, spec: RunSpec) -> RunLayout:
    """Write the manifest, part files, dead letters and markers of a synthetic run over ``input_path``.

    ``input_path`` ending in ``.jsonl`` gives a JSONL manifest, anything else Parquet. Input rows are
    split into ``spec.shards`` contiguous shards. Null ids become ``null_id`` dead
    letters, repeated ids ``duplicate_id`` dead letters (first occurrence wins; within each shard only
    with ``spec.dedupe_per_shard``, like the worker).

    Returns:
        The run's :class:`RunLayout`.
    """
    layout = RunLayout(str(output_root), run_id)
    all_ids = _read_ids(input_path)
    total = len(all_ids)
    n = total if spec.row_limit is None else min(spec.row_limit, total)
    bounds = np.linspace(0, n, spec.shards + 1).astype(int)
    shards = [ShardSpec(shard_id_for(i), [Segment(0, int(bounds[i]), int(bounds[i + 1]))])
              for i in range(spec.shards)]
    manifest = Manifest(
        run_id=run_id,
        input=InputSpec(uri=input_path, format="jsonl" if input_path.endswith(".jsonl") else "parquet",
                        id_column="id", text_column="text", files=[InputFile(uri=input_path, rows=total)]),
        shards=shards,
        engine={"kind": "encoder", "task": "classification" if spec.task == "classification" else "embedding"},
    )
    storage.write_create_only(layout.manifest_uri, manifest.to_json_bytes())
    seen: set[str] = set()
    for shard in shards:
        if spec.dedupe_per_shard:
            seen = set()
        _build_shard(layout, shard, all_ids, input_path, spec, seen)
    return layout


def _build_shard(layout: RunLayout, shard: ShardSpec, all_ids: list[str | None], input_path: str,
                 spec: RunSpec, seen: set[str]) -> None:
    seg = shard.segments[0]
    fp = ("0" * 32) if shard.shard_id in spec.stale_fingerprint_shards else spec.fingerprint
    shard_dir = layout.shard_dir(shard.shard_id)
    storage.makedirs(shard_dir)
    parts: list[str] = []
    dead_parts: list[str] = []
    rows_ok = rows_dead = 0
    for chunk, start in enumerate(range(seg.row_start, seg.row_stop, spec.chunk_rows)):
        ok_ids: list[str] = []
        ok_rows: list[int] = []
        dead: list[tuple[str | None, str, int]] = []
        for row in range(start, min(start + spec.chunk_rows, seg.row_stop)):
            rid = all_ids[row]
            if row in spec.drop_rows:
                continue
            if rid is None:
                dead.append((None, DeadLetterReason.NULL_ID.value, row))
            elif rid in seen:
                dead.append((rid, DeadLetterReason.DUPLICATE_ID.value, row))
            elif row in spec.dead_rows:  # a row dead on its own does not claim its id
                dead.append((rid, DeadLetterReason.EMPTY_TEXT.value, row))
            else:
                seen.add(rid)
                ok_ids.append(rid)
                ok_rows.append(row)
        if ok_ids:
            table = _results_table(ok_ids, np.asarray(ok_rows), spec, fp, 0.0)
            parts.append(_write(shard_dir, PART_PREFIX, chunk, table))
            if spec.duplicate_chunk and chunk == 0 and shard.shard_id == "00000":
                parts.append(_write(shard_dir, PART_PREFIX, chunk,
                                    _results_table(ok_ids, np.asarray(ok_rows), spec, fp, 0.5)))
        if dead:
            dead_parts.append(_write(shard_dir, DEAD_LETTER_PREFIX, chunk, _dead_table(dead, input_path, fp)))
        rows_ok += len(ok_ids)
        rows_dead += len(dead)
    if shard.shard_id in spec.skip_markers:
        return
    marker = ShardMarker(run_id=layout.run_id, shard_id=shard.shard_id, fingerprint=fp,
                         rows_input=shard.rows, rows_ok=rows_ok, rows_dead_letter=rows_dead,
                         parts=parts, dead_letter_parts=dead_parts,
                         files=_records(shard_dir, parts + dead_parts))
    storage.write_create_only(layout.marker_uri(shard.shard_id), marker.to_json_bytes())
