"""One check of the completion gate (``completion.gate_check``, what the trigger and the sensor run every
poll) lists the run's markers and progress objects once, whatever the number of shards, and reads only
what changed (issue #35): locally counted at the storage API, on the GCS emulator counted in HTTP
list requests at 1,100 shards."""

from __future__ import annotations

import math
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gcs_fixture
import pytest
from batch_contract import storage
from batch_contract.layout import RunLayout
from batch_contract.marker import ShardMarker, ShardProgress
from batch_contract.runstore import RunStore
from batch_inference.completion import gate_check
from run_helpers import SAMPLE_PARQUET, write_run

fake_gcs, gcs_bucket, fault_proxy = gcs_fixture.fake_gcs, gcs_fixture.gcs_bucket, gcs_fixture.fault_proxy


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Counter:
    counter: Counter = Counter()
    for name in ("read_bytes", "list_names", "list_glob", "list_sizes", "exists"):
        real = getattr(storage, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            counter[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(storage, name, counted)
    return counter


def _fill(run_dir: str, complete: range, running: range) -> None:
    """Markers for ``complete``, progress objects for ``running`` and for every complete shard (a worker
    leaves its last ``_PROGRESS.json`` beside the marker), written concurrently."""
    layout = RunLayout.from_run_dir(run_dir)

    def write(i: int) -> None:
        sid = f"{i:05d}"
        storage.write_replace(layout.progress_uri(sid), ShardProgress(
            shard_id=sid, status="complete" if i in complete else "running", rows_total=1, rows_done=0,
            rows_dead_letter=0, rows_per_s=1.0, eta_s=1.0, updated_at="2026-12-01T00:00:00+00:00").to_json_bytes())
        if i in complete:
            storage.write_replace(layout.marker_uri(sid), ShardMarker(
                run_id=layout.run_id, shard_id=sid, fingerprint="f" * 32, rows_input=1, rows_ok=1,
                rows_dead_letter=0).to_json_bytes())

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(write, [*complete, *running]))


@pytest.mark.parametrize("shards", [12, 120])
def test_a_check_lists_once_and_reads_only_what_changed(tmp_path: Path, calls: Counter, shards: int) -> None:
    run_dir = write_run(tmp_path, SAMPLE_PARQUET, rows=shards, shards=shards)
    done = range(shards - 2)
    _fill(run_dir, done, range(shards - 2, shards))
    store = RunStore.open(run_dir)
    _ = store.manifest
    calls.clear()
    status, line = gate_check(store)
    assert status.shards_complete == shards - 2 and not status.satisfied and "2 stale" in line
    assert calls["list_glob"] == 1 and calls["list_names"] == calls["list_sizes"] == 0
    # every new marker once, the 2 running shards' progress objects, canary.json and projection.json
    assert calls["read_bytes"] == len(done) + 2 + 2
    calls.clear()
    gate_check(store)
    assert (calls["list_glob"], calls["read_bytes"]) == (1, 4), "the next check: nothing re-read but progress"


def test_a_check_of_1100_shards_on_gcs_makes_a_few_list_requests(gcs_bucket: str, fault_proxy, tmp_path: Path) -> None:
    shards = 1100
    run_dir = write_run(gcs_bucket, SAMPLE_PARQUET, rows=shards, shards=shards)  # type: ignore[arg-type]
    _fill(run_dir, range(shards), range(0))
    store = RunStore.open(run_dir)
    _ = store.manifest
    for _check in range(2):
        fault_proxy.seen.clear()
        status, _line = gate_check(store)
        assert status.satisfied
        lists = [path for method, path, _ in fault_proxy.seen
                 if method == "GET" and path.split("?", 1)[0].rstrip("/").endswith("/o")]
        assert len(lists) == math.ceil(2 * shards / 1000), lists  # one listing of 2,200 names, 1,000 a page


def test_the_report_and_the_ui_read_every_shards_attempts_from_one_listing(tmp_path: Path, calls: Counter) -> None:
    from batch_contract.layout import join_uri
    from batch_contract.marker import AttemptRecord
    from batch_inference.report.collect import load_run

    run_dir = write_run(tmp_path, SAMPLE_PARQUET, rows=30, shards=30)
    layout = RunLayout.from_run_dir(run_dir)
    for i in range(0, 30, 3):
        sid = f"{i:05d}"
        for k in range(2):
            rec = AttemptRecord(attempt_id=f"2026120{k}T000000.000000Z-{i:08x}", shard_id=sid,
                                started_at=f"2026-12-0{k + 1}T00:00:00+00:00")
            storage.write_replace(join_uri(layout.attempts_dir(sid), f"{rec.attempt_id}.json"), rec.to_json_bytes())
    store = RunStore.open(run_dir)
    ids = [s.shard_id for s in store.manifest.shards]
    calls.clear()
    together = store.attempts_of(ids)
    assert (calls["list_glob"], calls["list_names"], calls["read_bytes"]) == (1, 0, 20)
    assert together == {sid: store.attempts(sid) for sid in ids}
    assert sum(len(v) for v in together.values()) == 20 and together["00001"] == []
    calls.clear()
    data = load_run(RunStore.open(run_dir))
    assert calls["list_names"] == 0, "no listing per shard"
    assert [a["attempt_id"] for a in data.attempts["00003"]] == [r.attempt_id for r in together["00003"]]
