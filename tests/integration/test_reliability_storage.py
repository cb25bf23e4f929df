"""Storage faults: the worker and the main job on ``gs://`` through a fault-injecting proxy.

fake-gcs-server is the storage; :class:`fault_proxy.FaultProxyProcess` sits in front of it and answers a
seeded share of requests with 429, 503, a reset before forwarding, a reset *after* forwarding (the
"lost commit reply": the write happened, the client never heard) or a slow reply. The same shard is run
once against the emulator directly (clean) and once through the proxy (faulty); the faulty run must
complete and commit exactly the clean run's rows, with byte-equal vectors (fp32, one thread: the same
batches give the same numbers).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from batch_contract import storage
from fault_proxy import FAULT_KINDS, FaultPlan, FaultProxyProcess
from gcs_fixture import fake_gcs, gcs_bucket  # noqa: F401 - pytest fixtures

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import chaos_lib  # noqa: E402

pytestmark = pytest.mark.integration

ROWS = 30
CHUNK_ROWS = 10
FAULT_RATE = 0.3


@pytest.fixture(scope="module")
def chaos_input(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("storage_faults") / "input.parquet"
    chaos_lib.make_chaos_input(path, ROWS, seed=3)
    return path


def _upload(local: Path, uri: str) -> None:
    storage.write_create_only(uri, local.read_bytes())


COSINE_TOLERANCE = 0.9999
"""docs/reliability.md: the same row through another process agrees to cosine >= 0.9999. Not bit for
bit: each worker process races its CPU kernels on its first calls (``cpu_tuning.OnlineChoice``), and on
a host where packed and stock linears run about as fast, two processes can pick differently (an AVX2
host: vectors equal to 1e-7, not bitwise)."""


def _assert_close(clean: dict, faulty: dict) -> None:
    """Same ids; each vector at cosine >= :data:`COSINE_TOLERANCE` of the clean run's."""
    assert sorted(clean) == sorted(faulty)
    for rid, vec in clean.items():
        a, b = np.asarray(vec, dtype=np.float64), np.asarray(faulty[rid], dtype=np.float64)
        cosine = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
        assert cosine >= COSINE_TOLERANCE, f"vector of {rid!r} differs from the clean run (cosine {cosine})"


def _assert_same_outputs(clean: chaos_lib.ShardOutputs, faulty: chaos_lib.ShardOutputs) -> None:
    assert faulty.marker is not None, "the faulty run completed (marker written)"
    assert set(faulty.id_counts) == set(clean.id_counts) and len(clean.id_counts) == ROWS
    assert all(c == 1 for c in faulty.id_counts.values()), "an id committed twice"
    assert dict(faulty.dead_counts) == dict(clean.dead_counts), "same dead letters, once each"
    _assert_close(clean.vectors, faulty.vectors)
    assert faulty.marker.rows_ok == clean.marker.rows_ok
    assert faulty.marker.rows_dead_letter == clean.marker.rows_dead_letter


def test_worker_on_gcs_through_faults_matches_clean_run(fake_gcs, gcs_bucket: str, chaos_input: Path) -> None:  # noqa: F811
    input_uri = f"{gcs_bucket}/in/input.parquet"
    _upload(chaos_input, input_uri)
    runs = {}
    with FaultProxyProcess(fake_gcs.url, FaultPlan(rate=FAULT_RATE, seed=11, delay_seconds=0.2)) as proxy:
        for name, endpoint in (("clean", fake_gcs.url), ("faulty", proxy.url)):
            layout = chaos_lib.write_manifest(f"{gcs_bucket}/{name}", "gcs_faults", chaos_input,
                                              chunk_rows=CHUNK_ROWS, input_uri=input_uri,
                                              worker={"progress_interval_seconds": 1.0})
            proc = chaos_lib.run_worker(layout, env={"STORAGE_EMULATOR_HOST": endpoint})
            assert proc.returncode == 0, f"{name} run exited {proc.returncode}: {proc.stderr[-4000:]}"
            runs[name] = chaos_lib.read_shard(layout.shard_dir(chaos_lib.SHARD))
        stats = proxy.stats
    _assert_same_outputs(runs["clean"], runs["faulty"])
    assert stats.faults >= 5, f"too few faults injected to mean anything: {stats.by_kind}"
    assert len(stats.by_kind) >= 3, f"fault kinds injected: {dict(stats.by_kind)} (of {FAULT_KINDS})"
    writes_faulted = [p for m, p, f in stats.log if m == "POST" and "/upload/" in p and f != "ok"]
    assert writes_faulted, "at least one upload (a commit) was faulted"


MAIN_JOB = textwrap.dedent("""
    # plan -> local runner (worker subprocess) -> publish to DuckDB, all on gs:// via STORAGE_EMULATOR_HOST
    import json, sys
    from batch_inference.planner import PlanRequest, plan
    from batch_inference.local_runner import run_shard
    from batch_inference.publish import publish_run
    from batch_inference.publish.target import PublishTarget
    input_uri, output_root, duckdb_path = sys.argv[1:4]
    manifest, refs = plan(PlanRequest(input_uri=input_uri, id_column="id", text_column="text",
                                      output_root=output_root, run_id="main_job", rows_per_shard=20,
                                      engine={"kind": "encoder", "dtype": "float32"},
                                      worker={"progress_interval_seconds": 1.0}))
    for ref in refs:
        run_shard(ref["run_dir"], ref["shard_id"])
    summary = publish_run(refs[0]["run_dir"], PublishTarget(backend="duckdb", table="emb", duckdb_path=duckdb_path))
    print("RESULT " + json.dumps({"shards": len(refs), "rows_published": summary["rows_published"],
                                  "rows_dead_letter": summary["rows_dead_letter"]}))
""")


def _table(duckdb_path: Path) -> dict[str, list[float]]:
    import duckdb

    with duckdb.connect(str(duckdb_path), read_only=True) as con:
        return {rid: list(vec) for rid, vec in con.execute("SELECT id, embedding FROM batch_inference.emb").fetchall()}


def test_main_job_on_gcs_through_faults_publishes_the_clean_table(fake_gcs, gcs_bucket: str,  # noqa: F811
                                                                  chaos_input: Path, tmp_path: Path) -> None:
    input_uri = f"{gcs_bucket}/main/in/input.parquet"
    _upload(chaos_input, input_uri)
    results = {}
    with FaultProxyProcess(fake_gcs.url, FaultPlan(rate=FAULT_RATE, seed=5, delay_seconds=0.2)) as proxy:
        for name, endpoint in (("clean", fake_gcs.url), ("faulty", proxy.url)):
            env = {**chaos_lib.worker_env(), "STORAGE_EMULATOR_HOST": endpoint}
            db = tmp_path / f"{name}.duckdb"
            proc = subprocess.run([sys.executable, "-c", MAIN_JOB, input_uri, f"{gcs_bucket}/main/{name}", str(db)],
                                  env=env, capture_output=True, text=True, timeout=900, cwd=REPO)
            lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
            assert proc.returncode == 0 and lines, f"{name} main job failed: {proc.stderr[-4000:]}"
            results[name] = (json.loads(lines[-1][7:]), _table(db))
        stats = proxy.stats
    (clean_summary, clean_table), (faulty_summary, faulty_table) = results["clean"], results["faulty"]
    assert clean_summary["shards"] == faulty_summary["shards"] == 2
    assert clean_summary == faulty_summary
    assert clean_summary["rows_published"] == ROWS and clean_summary["rows_dead_letter"] == len(chaos_lib.BAD_ROWS)
    _assert_close(clean_table, faulty_table)  # the published table: the clean run's ids, the same vectors
    assert stats.faults >= 5 and len(stats.by_kind) >= 3, dict(stats.by_kind)


def test_fault_proxy_is_transparent_when_rate_is_zero(fake_gcs, gcs_bucket: str) -> None:  # noqa: F811
    """The proxy itself neither loses nor changes bytes (so faults, not the proxy, are what is tested)."""
    data = os.urandom(300_000)
    with FaultProxyProcess(fake_gcs.url, FaultPlan(rate=0.0)) as proxy:
        env = {**os.environ, "STORAGE_EMULATOR_HOST": proxy.url, "PYTHONPATH": f"{REPO}/plugins"}
        script = ("import sys; from batch_contract import storage; storage.write_create_only(sys.argv[1], "
                  "sys.stdin.buffer.read()); sys.stdout.buffer.write(storage.read_bytes(sys.argv[1]))")
        proc = subprocess.run([sys.executable, "-c", script, f"{gcs_bucket}/blob.bin"], input=data, env=env,
                              capture_output=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout == data
        assert proxy.stats.faults == 0 and proxy.stats.forwarded >= 2
