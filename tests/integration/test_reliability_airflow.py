"""Orchestrator-level reliability: real Airflow (``dag.test()``), the local runner, the real worker.

One module-scoped Airflow home (SQLite) serves three scenarios that build on each other:

1. **A shard task killed mid-way and retried resumes where it stopped**: the local runner's worker
   command is ``bench/chaos_lib.py kill-once`` (a stand-in for a preempted pod), which SIGKILLs the worker
   once its first chunk is committed. The ``infer_local`` task fails, Airflow retries it (retries=3), the
   retry's ledger skips exactly the committed rows, and the run publishes every id once.
2. **Re-running one mapped shard re-does only what is missing**: the shard's last chunk and its marker
   are deleted (a lost object), then ``airflow tasks test ... infer_local <run_id> --map-index 0`` re-runs
   that one mapped task: it commits exactly the missing rows, duplicates nothing, and rewrites the marker.
3. **Killing publish after the staging load leaves the old table intact and a rerun completes**: a
   second run whose process SIGKILLs itself right after ``publish_run`` committed the staging tables;
   the live table still holds run 1, and ``airflow tasks test ... publish <run_id>`` then swaps run 2 in.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import airflow_test_home
import pytest
from batch_contract import storage
from batch_contract.layout import PART_PREFIX, RunLayout, chunk_of, join_uri
from batch_contract.marker import AttemptRecord

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import chaos_lib  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.dagrun]

ROWS = 300  # > min_chunk_rows (256): the adaptive chunker makes two chunks (256 + 44)
TABLE = "reliability_emb"

RUN_DAG = textwrap.dedent("""
    import json, os, signal, sys
    from airflow.dag_processing.dagbag import DagBag
    dag_id, conf, folder, crash = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4] == "crash"
    if crash:  # die like a killed pod right after the staging tables are committed
        import batch_inference.publish as pub
        original = pub.publish_run
        def publish_then_die(*args, **kwargs):
            kwargs["after_staging"] = lambda: os.kill(os.getpid(), signal.SIGKILL)
            return original(*args, **kwargs)
        pub.publish_run = publish_then_die
    bag = DagBag(dag_folder=folder)
    assert not bag.import_errors, bag.import_errors
    dr = bag.dags[dag_id].test(run_conf=conf)
    print("RESULT " + json.dumps({"state": str(dr.state), "run_id": dr.run_id}))
""")


@pytest.fixture(scope="module")
def airflow(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    home = tmp_path_factory.mktemp("airflow_reliability")
    env = airflow_test_home.airflow_env(home, {
        "OMP_NUM_THREADS": "1",
        "BATCH_WORKER_COMMAND": f"{sys.executable} {REPO / 'bench' / 'chaos_lib.py'} kill-once "
                                f"--flag-dir {home / 'kills'} --after-commits 2 --signal KILL --",
    })
    inputs = home / "inputs"
    chaos_lib.make_chaos_input(inputs / "run1.parquet", ROWS - len(chaos_lib.BAD_ROWS), seed=1, max_chars=200)
    chaos_lib.make_chaos_input(inputs / "run2.parquet", 20, seed=2, max_chars=200)
    return {"env": env, "home": home, "inputs": inputs, "out": home / "out"}


def _conf(ctx: dict, input_name: str) -> dict:
    out = Path(ctx["out"])
    return {"input_uri": str(Path(ctx["inputs"]) / input_name), "output_root": str(out),
            "duckdb_path": str(out / "warehouse.duckdb"), "runner": "local", "rows_per_shard": 1000,
            "shard_by": "rows", "output_table": TABLE,
            # these tests count what resume skips and re-does; the sample repeats some texts, so the result
            # cache would also carry rows over (reuse is tested in test_incremental.py); the canary would
            # commit part of the 300-row shard before it starts and leave it one chunk to kill in
            # (the canary's commits are tested in test_canary_worker.py)
            "reuse": "off", "canary": False}


def _dag_test(ctx: dict, conf: dict, crash: bool = False,
              env: dict | None = None) -> tuple[subprocess.CompletedProcess, dict | None]:
    proc = subprocess.run([sys.executable, "-c", RUN_DAG, "batch_inference_backfill", json.dumps(conf),
                           str(REPO / "dags"), "crash" if crash else "-"],
                          env={**ctx["env"], **(env or {})}, capture_output=True, text=True, timeout=900)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    return proc, (json.loads(lines[-1][7:]) if lines else None)


def _tasks_test(ctx: dict, task_id: str, run_id: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "airflow", "tasks", "test", "batch_inference_backfill", task_id,
                           run_id, *extra], env=ctx["env"], capture_output=True, text=True, timeout=900)


def _attempts(layout: RunLayout, shard: str) -> list[AttemptRecord]:
    adir = layout.attempts_dir(shard)
    return [AttemptRecord.from_json_bytes(storage.read_bytes(join_uri(adir, n)))
            for n in storage.list_names(adir) if n.endswith(".json")]


def _table_ids(duckdb_path: str, table: str) -> tuple[int, int, set[str]]:
    import duckdb

    with duckdb.connect(duckdb_path, read_only=True) as con:
        n, distinct = con.execute(f'SELECT count(*), count(DISTINCT id) FROM "batch_inference"."{table}"').fetchone()
        runs = {r[0] for r in con.execute(f'SELECT DISTINCT run_id FROM "batch_inference"."{table}__publish_log"').fetchall()}
    return n, distinct, runs


@pytest.fixture(scope="module")
def run1(airflow: dict) -> dict:
    conf = _conf(airflow, "run1.parquet")
    proc, result = _dag_test(airflow, conf)
    assert proc.returncode == 0 and result and result["state"].endswith("success"), (proc.stdout + proc.stderr)[-6000:]
    return {"conf": conf, "run_id": result["run_id"], "log": proc.stdout + proc.stderr,
            "layout": RunLayout(conf["output_root"], result["run_id"], "batch_inference_backfill")}


def test_killed_shard_task_is_retried_and_resumes_where_it_stopped(airflow: dict, run1: dict) -> None:
    layout: RunLayout = run1["layout"]
    kill = json.loads((Path(airflow["home"]) / "kills" / f"{run1['run_id']}-00000.killed").read_text())
    assert kill["killed"] and kill["exit_code"] == -9, kill
    assert "worker failed with exit code 137" in run1["log"], "the task saw the kill and was retried"
    attempts = sorted(_attempts(layout, "00000"), key=lambda a: a.attempt_id)
    assert len(attempts) == 2
    killed, retry = attempts
    assert killed.exit_code is None and killed.status == "running", "SIGKILL: no exit record"
    outputs = chaos_lib.read_shard(layout.shard_dir("00000"))
    # the retry skipped everything the killed attempt had committed and committed only the rest
    done_at_kill = kill["rows_committed_at_exit"]
    assert 0 < done_at_kill < ROWS, "the kill landed mid-shard"
    assert retry.exit_code == 0 and retry.rows_skipped_resume == done_at_kill
    assert retry.rows_committed == ROWS - done_at_kill
    assert outputs.rows == ROWS and all(c == 1 for c in outputs.id_counts.values())
    assert all(c == 1 for c in outputs.dead_counts.values())
    assert _table_ids(run1["conf"]["duckdb_path"], TABLE)[:2] == (ROWS - len(chaos_lib.BAD_ROWS),) * 2


def test_rerunning_one_mapped_shard_redoes_only_what_is_missing(airflow: dict, run1: dict) -> None:
    layout: RunLayout = run1["layout"]
    sdir = layout.shard_dir("00000")
    parts = [n for n in storage.list_names(sdir) if n.startswith(PART_PREFIX) and chunk_of(n) is not None]
    assert len(parts) >= 2, f"the shard needs >= 2 part files for this test: {parts}"
    lost = max(parts, key=chunk_of)
    lost_ids = set(chaos_lib._read_parquet(join_uri(sdir, lost)).column("id").to_pylist())
    kept_rows = ROWS - len(lost_ids)
    storage.delete(join_uri(sdir, lost))
    storage.delete(layout.marker_uri("00000"))
    n_attempts = len(_attempts(layout, "00000"))
    proc = _tasks_test(airflow, "infer_local", run1["run_id"], "--map-index", "0")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    attempts = sorted(_attempts(layout, "00000"), key=lambda a: a.attempt_id)
    assert len(attempts) == n_attempts + 1
    rerun = attempts[-1]
    assert rerun.rows_skipped_resume == kept_rows and rerun.rows_committed == len(lost_ids)
    outputs = chaos_lib.read_shard(sdir)
    assert outputs.marker is not None and outputs.rows == ROWS
    assert all(c == 1 for c in outputs.id_counts.values()), "nothing duplicated"
    new_parts = set(n for n in storage.list_names(sdir) if n.startswith(PART_PREFIX)) - set(parts)
    redone = set().union(*(chaos_lib._read_parquet(join_uri(sdir, n)).column("id").to_pylist() for n in new_parts))
    assert redone == lost_ids, "exactly the lost chunk's rows were re-done"


def test_publish_killed_after_staging_keeps_old_table_and_rerun_completes(airflow: dict, run1: dict) -> None:
    db = run1["conf"]["duckdb_path"]
    before = _table_ids(db, TABLE)
    assert before[2] == {run1["run_id"]}
    conf = _conf(airflow, "run2.parquet")
    proc, result = _dag_test(airflow, conf, crash=True, env={"BATCH_WORKER_COMMAND": ""})  # no worker kill
    assert proc.returncode == -9 and result is None, "the DAG process died inside publish"
    runs_dir = Path(conf["output_root"]) / "runs" / "batch_inference_backfill"
    run2_id = next(p.name for p in runs_dir.iterdir() if p.name != run1["run_id"])
    # the crash came after staging: staging exists, the live table is still run 1's
    import duckdb

    with duckdb.connect(db, read_only=True) as con:
        tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    assert f"{TABLE}__staging" in tables, "the kill landed after the staging load"
    assert _table_ids(db, TABLE) == before, "the old table is intact"
    rerun = _tasks_test(airflow, "publish", run2_id)
    assert rerun.returncode == 0, (rerun.stdout + rerun.stderr)[-6000:]
    n, distinct, runs = _table_ids(db, TABLE)
    assert (n, distinct) == (20, 20) and run2_id in runs
    with duckdb.connect(db, read_only=True) as con:
        prev = con.execute(f'SELECT count(*) FROM "batch_inference"."{TABLE}__previous"').fetchone()[0]
        tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    assert prev == before[0], "run 1 kept as the previous table for rollback"
    assert f"{TABLE}__staging" not in tables
    shutil.rmtree(Path(airflow["home"]) / "kills", ignore_errors=True)
