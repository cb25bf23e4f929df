"""Planner properties (hypothesis, no model): the shards partition the input rows exactly.

For random file sizes (empty files included), row-group sizes, JSONL blank lines, ``rows_per_shard``,
``max_map_length``, ``row_limit`` and ``shard_by``: every planned row lies in exactly one shard segment,
shards are in input order and never empty, segments stay inside their file, and the shard count is
``shard_count(rows, rows_per_shard, max_map_length)`` (``shard_by: rows``) or at most ``max_map_length``
(``tokens``).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from batch_inference.planner import PlanRequest, _Block, plan, shard_count, split_boundaries
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


def _check_partition(manifest, file_rows: list[int], planned_rows: int) -> None:
    covered = [(seg.file_index, r) for s in manifest.shards for seg in s.segments
               for r in range(seg.row_start, seg.row_stop)]
    everything = [(f, r) for f, n in enumerate(file_rows) for r in range(n)]
    assert covered == everything[:planned_rows], "every planned row in exactly one shard, in input order"
    for s in manifest.shards:
        assert s.rows >= 1, f"shard {s.shard_id} is empty"
        for seg in s.segments:
            assert 0 <= seg.row_start < seg.row_stop <= file_rows[seg.file_index], seg
    assert [s.shard_id for s in manifest.shards] == [f"{k:05d}" for k in range(len(manifest.shards))]


@SETTINGS
@given(
    fmt=st.sampled_from(["parquet", "jsonl"]),
    file_rows=st.lists(st.integers(0, 40), min_size=1, max_size=5),
    row_group=st.integers(1, 16),
    blank_every=st.integers(0, 5),
    rows_per_shard=st.integers(1, 60),
    max_map_length=st.integers(1, 12),
    row_limit=st.one_of(st.none(), st.integers(0, 120)),
    shard_by=st.sampled_from(["rows", "tokens"]),
    text_len=st.lists(st.integers(1, 300), min_size=1, max_size=4),
)
def test_plan_partitions_the_input_rows(fmt, file_rows, row_group, blank_every, rows_per_shard, max_map_length,
                                       row_limit, shard_by, text_len) -> None:
    work = Path(tempfile.mkdtemp(prefix="planprop-"))
    try:
        d = work / "in"
        d.mkdir()
        for k, n in enumerate(file_rows):
            texts = ["x" * text_len[(k + i) % len(text_len)] for i in range(n)]
            if fmt == "parquet":
                pq.write_table(pa.table({"id": pa.array([f"{k}-{i}" for i in range(n)], pa.string()), "text": pa.array(texts, pa.string())}),
                               d / f"f{k}.parquet", row_group_size=row_group)
            else:
                lines = []
                for i in range(n):
                    if blank_every and i % blank_every == 0:
                        lines.append("   ")
                    lines.append(json.dumps({"id": f"{k}-{i}", "text": texts[i]}))
                (d / f"f{k}.jsonl").write_text("\n".join(lines) + ("\n" if lines else ""))
        total = sum(file_rows)
        manifest, refs = plan(PlanRequest(
            input_uri=str(d), id_column="id", text_column="text", output_root=str(work / "out"), run_id="p",
            engine={"kind": "encoder"}, rows_per_shard=rows_per_shard, max_map_length=max_map_length,
            row_limit=row_limit, shard_by=shard_by))
        planned = min(total, row_limit) if row_limit else total
        assert [f.rows for f in manifest.input.files] == file_rows
        if shard_by == "rows":
            assert len(refs) == len(manifest.shards) == shard_count(planned, rows_per_shard, max_map_length)
        else:  # token-balanced: cut per file (tests/unit/test_planner_stability.py), never over the cap
            assert len(refs) == len(manifest.shards) and (1 if planned else 0) <= len(refs) <= max_map_length
        assert sum(r["rows"] for r in refs) == planned
        _check_partition(manifest, file_rows, planned)
    finally:
        shutil.rmtree(work, ignore_errors=True)


@SETTINGS
@given(
    blocks=st.lists(st.tuples(st.integers(1, 50), st.floats(0.5, 5000, allow_nan=False)), min_size=1, max_size=8),
    data=st.data(),
    by_tokens=st.booleans(),
)
def test_split_boundaries_are_monotonic_and_non_empty(blocks, data, by_tokens) -> None:
    total = sum(r for r, _ in blocks)
    n = data.draw(st.integers(1, total), label="n_shards")
    bounds = split_boundaries([_Block(r, w) for r, w in blocks], n, by_tokens)
    assert len(bounds) == n + 1 and bounds[0] == 0 and bounds[-1] == total
    assert all(b > a for a, b in zip(bounds, bounds[1:], strict=False)), bounds
