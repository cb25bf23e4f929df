"""One result per key, through the real worker (MiniLM, bf16 where the host has it), the real planner and
the real DuckDB publish.

Generated inputs draw their texts from a small pool, so most texts occur many times, in several shards
and chunks at once; the shards of a run run **concurrently** (threads, in-process workers). Then a rerun
with random edits (changed, deleted and new ids) under other sharding and batching settings.
Properties:

1. within a run every text has exactly one published result (bit for bit), whichever shard, chunk or
   worker computed it;
2. the published table and the result cache's winners agree bit for bit;
3. on the rerun every row whose text the first run published gets exactly the first run's bytes,
   whatever the sharding, chunking and token budget chosen this time;
4. both runs equal a from-scratch run (``reuse: off``) of the same input within 1e-2 (bf16) and list
   every id exactly once;
5. copies of an identical input cost no tokens: every marker's ``tokens_real <= tokens_padded``.

Examples are few by default (each runs about six model loads); ``PROPS_EXAMPLES`` sets how many.
"""

from __future__ import annotations

import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from batch_contract import resultcache
from batch_contract.enums import ExitCode
from batch_contract.layout import RunLayout
from batch_contract.runstore import RunStore
from batch_inference.planner import PlanRequest, plan
from batch_inference.publish import PublishTarget, publish_run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.integration

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample" / "debian_descriptions_sample.parquet"
ENGINE = {"kind": "encoder", "dtype": "auto"}
POOL = 9
"""Distinct texts an input draws from (the pool's last text only ever appears as an edit)."""

os.environ.setdefault("TQDM_DISABLE", "1")


def _pool() -> list[str]:
    texts = pq.read_table(SAMPLE, columns=["text"]).column("text").to_pylist()
    return [t[: 40 + 37 * i] for i, t in enumerate(texts[:POOL])]


TEXTS = _pool()


def _run(root: Path, run_id: str, ids: list[str], picks: list[int], rows_per_shard: int, worker: dict,
         reuse: str = "same_root") -> dict[str, tuple]:
    """Plan, run every shard at once (threads), publish; ``{id: (text index, n_tokens, embedding bytes)}``."""
    from batch_worker.runtime import run_shard

    src = root.parent / "in" / f"{root.name}-{run_id}.parquet"
    src.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": ids, "text": [TEXTS[p] for p in picks]}), src)
    manifest, _ = plan(PlanRequest(input_uri=str(src), id_column="id", text_column="text", output_root=str(root),
                                   run_id=run_id, engine=ENGINE, rows_per_shard=rows_per_shard, shard_by="rows",
                                   worker={**worker, "reuse": reuse, "progress_interval_seconds": 60.0}))
    run_dir = RunLayout(str(root), run_id).run_dir
    with ThreadPoolExecutor(len(manifest.shards)) as pool:
        codes = list(pool.map(lambda s: run_shard(run_dir, s.shard_id, install_signals=False), manifest.shards))
    assert codes == [int(ExitCode.OK)] * len(codes)
    db = str(root.parent / "in" / f"{root.name}-{run_id}.duckdb")
    publish_run(run_dir, PublishTarget(backend="duckdb", table="emb", duckdb_path=db))
    with duckdb.connect(db, read_only=True) as con:
        rows = con.execute("SELECT id, n_tokens, embedding FROM batch_inference.emb").fetchall()
    pick = dict(zip(ids, picks, strict=True))
    table = {rid: (pick[rid], n, np.asarray(emb, np.float32).tobytes()) for rid, n, emb in rows}
    assert sorted(table) == sorted(ids)
    markers = [RunStore.open(run_dir).marker(spec.shard_id) for spec in manifest.shards]
    for m in markers:  # copies of an identical input cost no tokens: padding efficiency stays <= 1
        assert m.tokens_real <= m.tokens_padded, (m.shard_id, m.tokens_real, m.tokens_padded)
    fingerprint = markers[0].fingerprint
    return table | {"__fingerprint__": fingerprint}


def _one_result_per_text(table: dict) -> dict[int, bytes]:
    by_text: dict[int, set[bytes]] = {}
    for rid, row in table.items():
        if rid != "__fingerprint__":
            by_text.setdefault(row[0], set()).add(row[2])
    assert all(len(v) == 1 for v in by_text.values()), {k: len(v) for k, v in by_text.items() if len(v) > 1}
    return {k: next(iter(v)) for k, v in by_text.items()}


def _close(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for rid in a:
        if rid != "__fingerprint__":
            x, y = np.frombuffer(a[rid][2], np.float32), np.frombuffer(b[rid][2], np.float32)
            assert a[rid][:2] == b[rid][:2] and float(np.max(np.abs(x - y))) <= 1e-2, rid


settings_ = settings(max_examples=int(os.environ.get("PROPS_EXAMPLES", "2")), deadline=None, derandomize=True,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
worker_settings = st.fixed_dictionaries({"chunk_rows": st.sampled_from([3, 5, 8]),
                                         "token_budget": st.sampled_from([256, 1024, 4096])})


@settings_
@given(picks=st.lists(st.integers(0, POOL - 2), min_size=10, max_size=24),
       shards=st.integers(2, 3), worker=worker_settings, worker2=worker_settings, shards2=st.integers(1, 3),
       edits=st.lists(st.tuples(st.sampled_from(["change", "delete", "add"]), st.integers(0, 10_000),
                                st.integers(0, POOL - 1)), max_size=6))
def test_identical_texts_publish_one_result_and_reruns_keep_it(picks: list[int], shards: int, worker: dict,
                                                                worker2: dict, shards2: int, edits: list) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "out"
        ids = [f"r{i}" for i in range(len(picks))]
        first = _run(root, "first", ids, picks, -(-len(ids) // shards), worker)
        published = _one_result_per_text(first)

        fingerprint = first["__fingerprint__"]
        found = resultcache.lookup(str(root), fingerprint, resultcache.text_keys([TEXTS[k] for k in published]))
        assert found.hits == len(published)
        cached = found.table.take(found.row_hit).column("embedding").to_pylist()
        assert [np.asarray(c, np.float32).tobytes() for c in cached] == list(published.values())

        ids2, picks2 = list(ids), list(picks)
        for op, where, text in edits:
            if op == "add":
                ids2.append(f"new{len(ids2)}")
                picks2.append(text)
            elif ids2:
                i = where % len(ids2)
                if op == "change":
                    picks2[i] = text
                else:
                    del ids2[i], picks2[i]
        if not ids2:
            return
        second = _run(root, "second", ids2, picks2, -(-len(ids2) // shards2), worker2)
        again = _one_result_per_text(second)
        assert {k: v for k, v in again.items() if k in published} == {k: published[k] for k in again if k in published}

        scratch = _run(Path(tmp) / "scratch", "scratch", ids2, picks2, len(ids2), worker2, reuse="off")
        _close(second, scratch)
