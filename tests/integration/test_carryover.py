"""Shard carry-over through the real worker (MiniLM, in-process), the plan-time carry-over and DuckDB publish.

An unchanged input is published with no worker at all; a changed file's shards are computed and the
others carried; the published table equals a from-scratch run; a damaged source is recomputed, never
carried; a worker of a run that carried shards adopts their fingerprint or refuses with exit 2.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from batch_contract import storage
from batch_contract.carryover import CarryOverPlan, carryover_uri
from batch_contract.engine_config import ConfigError
from batch_contract.enums import ExitCode
from batch_contract.layout import RunLayout
from batch_contract.manifest import result_fingerprint
from batch_contract.runstore import RunStore
from batch_inference.carryover import carry_over, index_published
from batch_inference.params import default_model_path
from batch_inference.planner import PlanRequest, plan
from batch_inference.publish import PublishTarget, publish_run

pytestmark = pytest.mark.integration

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample" / "debian_descriptions_sample.parquet"
WORKER = {"chunk_rows": 16, "token_budget": 2048, "progress_interval_seconds": 60.0}
ROWS_PER_FILE = 30


@pytest.fixture()
def inputs(tmp_path: Path) -> Path:
    t = pq.read_table(SAMPLE, columns=["id", "text"]).slice(0, 2 * ROWS_PER_FILE)
    t = t.set_column(0, "id", pa.array([str(i) for i in t.column("id").to_pylist()]))
    folder = tmp_path / "in"
    folder.mkdir()
    pq.write_table(t.slice(0, ROWS_PER_FILE), folder / "a.parquet")
    texts = t.column("text").to_pylist()[ROWS_PER_FILE:]
    texts[3] = None  # a dead letter, carried like any committed row
    pq.write_table(pa.table({"id": t.column("id").slice(ROWS_PER_FILE), "text": texts}), folder / "b.parquet")
    return folder


def _run(root: Path, run_id: str, input_uri: str, engine: dict | None = None, reuse: str = "same_root") -> dict:
    """Plan, carry over, run the remaining shards in-process, publish, index; returns what happened."""
    from batch_worker.runtime import run_shard

    manifest, refs = plan(PlanRequest(input_uri=input_uri, id_column="id", text_column="text", output_root=str(root),
                                      run_id=run_id, engine=engine or {"kind": "encoder"},
                                      worker={**WORKER, "reuse": reuse}, rows_per_shard=15))
    run_dir = RunLayout(str(root), run_id).run_dir
    carried = set()
    if reuse == "same_root":
        carried = set(carry_over(manifest, run_dir, runner="local", image=None,
                                 default_model=default_model_path()).carried)
    computed = [r["shard_id"] for r in refs if r["shard_id"] not in carried]
    for shard_id in computed:
        assert run_shard(run_dir, shard_id, install_signals=False) == int(ExitCode.OK)
    db = str(root / f"{run_id}.duckdb")
    summary = publish_run(run_dir, PublishTarget(backend="duckdb", table="emb", duckdb_path=db))
    if reuse == "same_root":
        index_published(run_dir)
    store = RunStore.open(run_dir)
    markers = {s.shard_id: store.marker(s.shard_id) for s in manifest.shards}
    with duckdb.connect(db, read_only=True) as con:
        rows = con.execute("SELECT id, n_tokens, truncated, embedding FROM batch_inference.emb ORDER BY id").fetchall()
        dead = con.execute("SELECT count(*) FROM batch_inference.emb__dead_letters").fetchone()[0]
    return {"carried": carried, "computed": computed, "markers": markers, "summary": summary, "dead": dead,
            "rows": {r[0]: r[1:] for r in rows}, "run_dir": run_dir}


def _same(a: dict, b: dict, atol: float) -> float:
    assert sorted(a) == sorted(b)
    worst = 0.0
    for rid, row in a.items():
        assert row[:2] == b[rid][:2], rid
        worst = max(worst, float(np.max(np.abs(np.asarray(row[2]) - np.asarray(b[rid][2])))))
    assert worst <= atol
    return worst


def test_unchanged_input_publishes_without_workers_and_a_changed_file_is_recomputed(tmp_path: Path, inputs: Path) -> None:
    root = tmp_path / "out"
    first = _run(root, "r1", str(inputs))
    assert first["carried"] == set() and len(first["computed"]) == 4
    assert RunStore.open(first["run_dir"]).carryover_plan().keys.keys() == set(first["markers"])

    second = _run(root, "r2", str(inputs))
    assert second["computed"] == [] and second["carried"] == set(first["markers"])
    assert _same(first["rows"], second["rows"], atol=0.0) == 0.0  # bit-identical
    assert second["dead"] == first["dead"] == 1
    for marker in second["markers"].values():
        assert marker.engine["model_loaded"] is False and marker.engine["carried_from"]
        assert marker.rows_reused == marker.rows_ok and marker.tokens_real == 0
        assert marker.reuse_seconds_avoided > 0
        assert all(a["host"] == "plan task" for a in marker.attempts)

    table = pq.read_table(inputs / "b.parquet")
    texts = table.column("text").to_pylist()
    texts[0] = "an edited description of a package"
    pq.write_table(table.set_column(1, "text", pa.array(texts)), inputs / "b.parquet")
    third = _run(root, "r3", str(inputs))
    manifest = RunStore.open(third["run_dir"]).manifest
    before = {tuple(map(tuple, (vars(g).values() for g in s.segments))) for s in RunStore.open(second["run_dir"]).manifest.shards}
    unchanged = {s.shard_id for s in manifest.shards  # only file a, and split exactly as before
                 if all(manifest.input.files[g.file_index].uri.endswith("a.parquet") for g in s.segments)
                 and tuple(map(tuple, (vars(g).values() for g in s.segments))) in before}
    only_a = {s.shard_id for s in manifest.shards
              if all(manifest.input.files[g.file_index].uri.endswith("a.parquet") for g in s.segments)}
    assert unchanged == only_a and only_a and len(unchanged) < len(manifest.shards)  # token split points per file
    assert third["carried"] == unchanged and set(third["computed"]) == set(third["markers"]) - unchanged
    scratch = _run(tmp_path / "scratch", "s", str(inputs), reuse="off")
    assert not storage.exists(carryover_uri(scratch["run_dir"]))
    _same(third["rows"], scratch["rows"], atol=2e-2)  # bf16 vs bf16 run-to-run: same kernels
    assert {m.fingerprint for m in third["markers"].values()} == {first["markers"]["00000"].fingerprint}


def test_a_damaged_source_is_recomputed_not_carried(tmp_path: Path, inputs: Path) -> None:
    root = tmp_path / "out"
    first = _run(root, "r1", str(inputs))
    victim = first["markers"]["00001"]
    part = next(n for n in victim.files if n.startswith("part-"))
    shard_dir = Path(RunLayout.from_run_dir(first["run_dir"]).shard_dir("00001"))
    (shard_dir / part).write_bytes((shard_dir / part).read_bytes()[:-10])  # torn after the run
    second = _run(root, "r2", str(inputs))
    assert "00001" in second["computed"] and "00001" not in second["carried"]
    assert len(second["carried"]) == 3
    _same(first["rows"], second["rows"], atol=0.0)


def test_a_worker_adopts_the_pinned_dtype_or_exits_2(tmp_path: Path, inputs: Path) -> None:
    from batch_worker.runtime import load_context, run_shard

    root = tmp_path / "out"
    manifest, _ = plan(PlanRequest(input_uri=str(inputs), id_column="id", text_column="text", output_root=str(root),
                                   run_id="p", engine={"kind": "encoder", "dtype": "auto"}, worker=WORKER,
                                   rows_per_shard=15))
    run_dir = RunLayout(str(root), "p").run_dir
    host = load_context(run_dir, "00000")
    other = "float32" if host.engine.resolved_settings()["dtype"] == "bfloat16" else "bfloat16"
    pinned = result_fingerprint(manifest.config_fingerprint, host.engine.model_digest(), {"dtype": other})
    storage.write_replace(carryover_uri(run_dir), CarryOverPlan(
        pinned={"fingerprint": pinned, "resolved": {"dtype": other}}).to_json_bytes())
    ctx = load_context(run_dir, "00000")
    assert ctx.fingerprint == pinned and ctx.engine.resolved_settings() == {"dtype": other}
    assert run_shard(run_dir, "00000", install_signals=False) == int(ExitCode.OK)
    marker = RunStore.open(run_dir).marker("00000")
    assert marker.fingerprint == pinned and marker.engine["dtype"] == other
    assert marker.engine["resolved"] == {"dtype": other}

    storage.write_replace(carryover_uri(run_dir), CarryOverPlan(
        pinned={"fingerprint": "0" * 32, "resolved": {"dtype": other}}).to_json_bytes())
    with pytest.raises(ConfigError, match="reuse='off'"):  # the CLI's exit 2: no retry fixes it
        run_shard(run_dir, "00001", install_signals=False)
