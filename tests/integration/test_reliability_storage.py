"""Storage faults: the worker and the main job on ``gs://``, ``s3://`` and ``az://`` through a
fault-injecting proxy.

Each scheme's emulator (fake-gcs-server, moto's S3 server, Azurite: :mod:`object_stores`) is the storage;
:class:`fault_proxy.FaultProxyProcess` sits in front of it and answers a seeded share of requests with
429, 503, a reset before forwarding (a connection cut mid-upload), a reset *after* forwarding (the "lost
commit reply": the write happened, the client never heard) or a slow reply. The same shard (and the same
main job) is run once on local paths without faults (clean) and once per scheme through the proxy
(faulty); the faulty run must complete and commit exactly the clean run's rows, with the same vectors.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import object_stores
import pytest
from batch_contract import storage
from fault_proxy import FAULT_KINDS, FaultPlan, FaultProxyProcess

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
    def by_row(counts) -> dict:  # the clean run read a local copy of the input: compare source rows
        return {row: n for (_uri, row), n in counts.items()}

    assert by_row(faulty.dead_counts) == by_row(clean.dead_counts), "same dead letters, once each"
    assert all(n == 1 for n in faulty.dead_counts.values())
    _assert_close(clean.vectors, faulty.vectors)
    assert faulty.marker.rows_ok == clean.marker.rows_ok
    assert faulty.marker.rows_dead_letter == clean.marker.rows_dead_letter


@pytest.fixture(scope="module")
def clean_shard(chaos_input: Path, tmp_path_factory: pytest.TempPathFactory) -> chaos_lib.ShardOutputs:
    """The shard run once on local paths, without faults: what every scheme's faulty run must match."""
    layout = chaos_lib.write_manifest(tmp_path_factory.mktemp("clean_shard"), "clean", chaos_input,
                                      chunk_rows=CHUNK_ROWS, worker={"progress_interval_seconds": 1.0})
    proc = chaos_lib.run_worker(layout)
    assert proc.returncode == 0, f"clean run exited {proc.returncode}: {proc.stderr[-4000:]}"
    return chaos_lib.read_shard(layout.shard_dir(chaos_lib.SHARD))


@pytest.fixture(params=object_stores.SCHEMES)
def store(request: pytest.FixtureRequest) -> Iterator[object_stores.EmulatedStore]:
    """Each scheme's emulator, its environment set in this process (reads go to it directly)."""
    with object_stores.started(request.param) as emulated:
        yield emulated


def _writes(log: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """The proxy log's write requests: uploads of every scheme (POST / PUT), not reads or listings."""
    return [(m, p, f) for m, p, f in log if m in ("POST", "PUT")]


def test_worker_through_faults_matches_clean_run(store: object_stores.EmulatedStore, chaos_input: Path,
                                                 clean_shard: chaos_lib.ShardOutputs) -> None:
    root = store.new_root("faults")
    input_uri = f"{root}/in/input.parquet"
    _upload(chaos_input, input_uri)
    with FaultProxyProcess(store.url, FaultPlan(rate=FAULT_RATE, seed=11, delay_seconds=0.2,
                                                      error_style=store.error_style)) as proxy:
        layout = chaos_lib.write_manifest(f"{root}/faulty", "storage_faults", chaos_input,
                                          chunk_rows=CHUNK_ROWS, input_uri=input_uri,
                                          worker={"progress_interval_seconds": 1.0})
        proc = chaos_lib.run_worker(layout, env=store.env(proxy.url))
        assert proc.returncode == 0, f"faulty run exited {proc.returncode}: {proc.stderr[-4000:]}"
        stats = proxy.stats
    _assert_same_outputs(clean_shard, chaos_lib.read_shard(layout.shard_dir(chaos_lib.SHARD)))
    assert stats.faults >= 5, f"too few faults injected to mean anything: {stats.by_kind}"
    assert len(stats.by_kind) >= 3, f"fault kinds injected: {dict(stats.by_kind)} (of {FAULT_KINDS})"
    assert [w for w in _writes(stats.log) if w[2] != "ok"], "at least one upload (a commit) was faulted"


MAIN_JOB = textwrap.dedent("""
    # plan -> local runner (worker subprocess) -> publish to DuckDB, all on gs:// via STORAGE_EMULATOR_HOST
    import json, sys
    from batch_inference.planner import PlanRequest, plan
    from batch_inference.local_runner import run_shard
    from batch_inference.publish import publish_run
    from batch_inference.publish.target import PublishTarget
    input_uri, output_root, duckdb_path = sys.argv[1:4]
    manifest, refs = plan(PlanRequest(input_uri=input_uri, id_column="id", text_column="text",
                                      output_root=output_root, run_id="main_job", rows_per_shard=20, shard_by="rows",
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


def _main_job(input_uri: str, output_root: str, db: Path, env: dict[str, str]) -> tuple[dict, dict]:
    """Run :data:`MAIN_JOB` in a subprocess; returns its summary line and the published table."""
    proc = subprocess.run([sys.executable, "-c", MAIN_JOB, input_uri, output_root, str(db)],
                          env={**chaos_lib.worker_env(), **env}, capture_output=True, text=True, timeout=900,
                          cwd=REPO)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"main job failed: {proc.stderr[-4000:]}"
    return json.loads(lines[-1][7:]), _table(db)


@pytest.fixture(scope="module")
def clean_main_job(chaos_input: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict]:
    """The main job on local paths, without faults."""
    out = tmp_path_factory.mktemp("clean_main_job")
    return _main_job(str(chaos_input), str(out / "output"), out / "clean.duckdb", {})


def test_main_job_through_faults_publishes_the_local_table(store: object_stores.EmulatedStore, chaos_input: Path,
                                                           clean_main_job: tuple[dict, dict],
                                                           tmp_path: Path) -> None:
    """Input and output on the scheme, every request through the fault proxy: the published table is the
    one the same job publishes from local paths."""
    root = store.new_root("mainjob")
    input_uri = f"{root}/main/in/input.parquet"
    _upload(chaos_input, input_uri)
    with FaultProxyProcess(store.url, FaultPlan(rate=FAULT_RATE, seed=5, delay_seconds=0.2,
                                                      error_style=store.error_style)) as proxy:
        summary, table = _main_job(input_uri, f"{root}/main/out", tmp_path / "faulty.duckdb", store.env(proxy.url))
        stats = proxy.stats
    clean_summary, clean_table = clean_main_job
    assert clean_summary["shards"] == summary["shards"] == 2
    assert clean_summary == summary
    assert clean_summary["rows_published"] == ROWS and clean_summary["rows_dead_letter"] == len(chaos_lib.BAD_ROWS)
    _assert_close(clean_table, table)  # the published table: the local run's ids, the same vectors
    assert stats.faults >= 5 and len(stats.by_kind) >= 3, dict(stats.by_kind)


def test_fault_proxy_is_transparent_when_rate_is_zero(store: object_stores.EmulatedStore) -> None:
    """The proxy itself neither loses nor changes bytes (so faults, not the proxy, are what is tested)."""
    data = os.urandom(300_000)
    root = store.new_root("transparent")
    with FaultProxyProcess(store.url, FaultPlan(rate=0.0)) as proxy:
        env = {**os.environ, **store.env(proxy.url), "PYTHONPATH": f"{REPO}/plugins"}
        script = ("import sys; from batch_contract import storage; storage.write_create_only(sys.argv[1], "
                  "sys.stdin.buffer.read()); sys.stdout.buffer.write(storage.read_bytes(sys.argv[1]))")
        proc = subprocess.run([sys.executable, "-c", script, f"{root}/blob.bin"], input=data, env=env,
                              capture_output=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout == data
        assert proxy.stats.faults == 0 and proxy.stats.forwarded >= 2
