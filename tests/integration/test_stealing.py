"""Work stealing with real workers (``worker.steal``; issue #34): real MiniLM subprocesses, local paths and
the GCS emulator, each run checked exactly once against an uninterrupted one-shard reference
(``bench/chaos_steal.py``'s checker: every id once over the union of the shards, every bad row one dead
letter, vectors within tolerance, a marker per shard matching its committed rows).

* chaos: workers SIGKILLed at random while they steal, one shard's worker never started (1-row units:
  claims of several units, chunks holding rows of several units);
* two workers of the same shard at once (a zombie pod beside its retry) racing for the same units;
* a lease expiring under a worker stalled with SIGSTOP: another worker takes the unit over, and the
  stalled one, resumed, commits nothing more of it and still exits 0;
* a shard whose worker never starts (an unschedulable pod), on ``gs://``: the other worker computes it
  and writes its marker; the owner started afterwards exits 0 at once, writing nothing.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import chaos_lib  # noqa: E402
import chaos_steal  # noqa: E402
import gcs_fixture  # noqa: E402
from batch_contract import storage  # noqa: E402
from batch_contract.claims import claims_dir  # noqa: E402
from batch_contract.runstore import RunStore  # noqa: E402
from batch_inference.publish import PublishTarget, publish_run  # noqa: E402
from batch_inference.report import build_report  # noqa: E402
from batch_inference.report.schema import validate_report  # noqa: E402

pytestmark = pytest.mark.integration

fake_gcs, gcs_bucket = gcs_fixture.fake_gcs, gcs_fixture.gcs_bucket

ROWS = 40
CHUNK_ROWS = 5
GCS_WORKER = {**chaos_steal.STEAL_WORKER, "steal_unit_rows": 7}
"""On the GCS emulator 7-row units (each unit's lease and done object are requests to the emulator)."""


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, chaos_lib.ShardOutputs]:
    work = tmp_path_factory.mktemp("steal")
    src = work / "input.parquet"
    chaos_lib.make_chaos_input(src, ROWS, seed=5)
    outputs, _ = chaos_lib.run_reference(work / "ref", src, CHUNK_ROWS)
    return src, outputs


def _verdict(layout, shards: int, ref: chaos_lib.ShardOutputs, absent: bool = False) -> chaos_steal.StealVerdict:
    return chaos_steal.check_steal_trial(0, "-", layout, shards, ref, chaos_steal.StealRun(0, 0, [], [], 0, True, 0.0),
                                         absent)


def _worker(layout, shard: str, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "batch_worker", "run", "--run-dir", layout.run_dir, "--shard", shard],
                            env=chaos_lib.worker_env(), stdout=open(log, "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
                            cwd=REPO)


def test_workers_killed_while_stealing_stay_exactly_once(reference, tmp_path: Path) -> None:
    src, ref = reference
    layout = chaos_lib.write_manifest(tmp_path, "chaos", src, chunk_rows=CHUNK_ROWS, shards=3,
                                      worker=chaos_steal.STEAL_WORKER)
    run = chaos_steal.run_steal_trial(layout, 3, signal.SIGKILL, random.Random(3), max_kills=2, window_seconds=6.0,
                                      absent_owner=True)
    v = chaos_steal.check_steal_trial(0, "SIGKILL", layout, 3, ref, run, True)
    assert run.kills >= 1 and -9 in run.codes and run.codes.count(0) == 2 and run.completed
    assert run.wrong_exits == 0 and set(run.killed_codes) <= {-9, 0}, run
    assert (v.lost_rows, v.duplicate_rows, v.unexpected_rows) == (0, 0, 0), v
    assert v.markers_ok and v.exact and v.units_stolen >= 1, v
    # 1-row units: claims of several units (claim_units), so fewer result parts than units
    parts = [n for sid in chaos_lib.shard_ids(3) for n in storage.list_names(layout.shard_dir(sid)) if n.startswith("part-")]
    assert len(parts) < ROWS, parts


def test_two_workers_of_one_shard_race_for_its_units(reference, tmp_path: Path) -> None:
    src, ref = reference
    layout = chaos_lib.write_manifest(tmp_path, "race", src, chunk_rows=CHUNK_ROWS, shards=2,
                                      worker={**chaos_steal.STEAL_WORKER, "steal_unit_rows": 3})
    procs = [_worker(layout, "00000", tmp_path / f"w{i}.log") for i in range(2)] + [_worker(layout, "00001", tmp_path / "w2.log")]
    assert [p.wait(timeout=300) for p in procs] == [0, 0, 0]
    v = _verdict(layout, 2, ref)
    assert v.exact, v
    claimed = storage.list_names(claims_dir(layout.shard_dir("00000")))
    assert not [n for n in claimed if n.endswith(".0001.json")], "no unit needed a take-over"


def test_a_lease_expiring_under_a_stalled_worker_is_taken_over(reference, tmp_path: Path) -> None:
    src, ref = reference
    layout = chaos_lib.write_manifest(tmp_path, "stall", src, chunk_rows=CHUNK_ROWS, shards=2,
                                      worker={"steal": True, "steal_unit_rows": 100, "lease_seconds": 3.0})
    lease0 = f"{claims_dir(layout.shard_dir('00000'))}/unit-00000.0000.json"
    slow = _worker(layout, "00000", tmp_path / "slow.log")
    deadline = time.monotonic() + 180
    while not storage.exists(lease0):
        assert slow.poll() is None and time.monotonic() < deadline, "the worker never claimed its unit"
        time.sleep(0.02)
    slow.send_signal(signal.SIGSTOP)  # stalled while holding the shard's only unit
    try:
        time.sleep(3.5)  # its lease expires
        thief = _worker(layout, "00001", tmp_path / "thief.log")
        assert thief.wait(timeout=300) == 0
    finally:
        slow.send_signal(signal.SIGCONT)
    assert slow.wait(timeout=120) == 0
    log = (tmp_path / "slow.log").read_text()
    names = storage.list_names(claims_dir(layout.shard_dir("00000")))
    assert "unit-00000.0001.json" in names and "unit-00000.done" in names, (names, log[-3000:])
    v = _verdict(layout, 2, ref)
    assert (v.lost_rows, v.unexpected_rows) == (0, 0) and v.markers_ok and v.min_cosine > 0.999, (v, log[-3000:])
    # The one window leases leave open (docs/adr/0004-claimable-units.md): a holder stopped between its last
    # lease check and the end of that chunk's commit still commits the chunk after the take-over. Rows of
    # that chunk are then in two part files of the shard; publish keeps the first of each id.
    summary = publish_run(layout.run_dir, PublishTarget(backend="duckdb", table="stall",
                                                        duckdb_path=str(tmp_path / "w.duckdb")))
    assert (summary["rows_missing"], summary["duplicates_removed"]) == (0, v.duplicate_rows), (summary, v)
    assert summary["rows_published"] + summary["rows_dead_letter"] == summary["rows_input"]


def test_a_shard_whose_worker_never_starts_is_computed_by_the_other_on_gcs(reference, gcs_bucket: str,
                                                                           tmp_path: Path) -> None:
    src, ref = reference
    input_uri = f"{gcs_bucket}/in/input.parquet"
    storage.write_create_only(input_uri, src.read_bytes())
    layout = chaos_lib.write_manifest(f"{gcs_bucket}/out", "absent", src, chunk_rows=CHUNK_ROWS, shards=2,
                                      worker=GCS_WORKER, input_uri=input_uri)
    assert _worker(layout, "00000", tmp_path / "w0.log").wait(timeout=300) == 0
    v = _verdict(layout, 2, ref, absent=True)
    rows = sum(seg.rows for seg in RunStore.open(layout.run_dir).manifest.shard("00001").segments)
    assert v.exact and v.units_stolen == -(-rows // GCS_WORKER["steal_unit_rows"]), v
    marker_before = storage.read_bytes(layout.marker_uri("00001"))
    attempts_before = storage.list_names(layout.attempts_dir("00001"))
    late = subprocess.run([sys.executable, "-m", "batch_worker", "run", "--run-dir", layout.run_dir, "--shard", "00001"],
                          env=chaos_lib.worker_env(), capture_output=True, text=True, cwd=REPO, timeout=300)
    assert late.returncode == 0, late.stderr[-2000:]
    assert storage.read_bytes(layout.marker_uri("00001")) == marker_before
    assert storage.list_names(layout.attempts_dir("00001")) == attempts_before, "the late owner wrote nothing"

    report = build_report(layout.run_dir, dag_id="steal", publish_summary=None, cost_params={"accelerator": "cpu"})
    validate_report(report)
    st = report["stealing"]
    assert st["chunks_stolen"] == v.units_stolen and st["shards_with_stolen_chunks"] == 1
    unit = GCS_WORKER["steal_unit_rows"]
    assert st["chunks"] == sum(-(-s.rows // unit) for s in RunStore.open(layout.run_dir).manifest.shards)
    assert st["idle_seconds_saved"] > 0
    by_shard = {row["shard_id"]: row["chunks_stolen"] for row in report["shards"]}
    assert by_shard == {"00000": 0, "00001": v.units_stolen}
    assert 'id="stealing"' in storage.read_bytes(layout.report_html_uri).decode()


def test_a_failing_shard_does_not_fail_the_worker_that_steals_from_it(reference, tmp_path: Path) -> None:
    """Shard 00001 reads past the end of its file (BadInputError in its worker, exit 2): the worker of
    shard 00000 tries its units, logs the failure, leaves it, and still completes its own shard (exit 0)."""
    import json

    src, ref = reference
    layout = chaos_lib.write_manifest(tmp_path, "bad", src, chunk_rows=CHUNK_ROWS, shards=2,
                                      worker=chaos_steal.STEAL_WORKER)
    data = json.loads(storage.read_bytes(layout.manifest_uri))
    data["shards"][1]["segments"][0]["row_stop"] += 50  # rows the file does not have
    storage.write_replace(layout.manifest_uri, json.dumps(data).encode())
    assert _worker(layout, "00000", tmp_path / "w0.log").wait(timeout=300) == 0
    log = (tmp_path / "w0.log").read_text()
    assert "computing units of shard 00001 failed" in log, log[-3000:]
    assert storage.exists(layout.marker_uri("00000")) and not storage.exists(layout.marker_uri("00001"))
    own = chaos_lib.read_shard(layout.shard_dir("00000"))
    assert own.marker is not None and own.marker.rows_input == own.rows
