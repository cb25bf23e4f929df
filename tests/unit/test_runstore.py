"""The contract's run store: manifest read once, markers cached, the one shard-state rule, and a gate
poll whose storage calls grow with the shards completed since the last poll, not with the run's size."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from batch_contract import storage
from batch_contract.carryover import CarryOverPlan
from batch_contract.layout import RunLayout
from batch_contract.marker import ShardMarker, ShardProgress
from batch_contract.runstore import MarkerConflictError, RunStore, is_complete
from batch_inference.completion import check_completion
from batch_inference.progress import collect_progress
from run_helpers import SAMPLE_PARQUET, write_run

SHARDS = 40


@pytest.fixture
def run_dir(tmp_path: Path) -> str:
    return write_run(tmp_path, SAMPLE_PARQUET, rows=400, shards=SHARDS)


def _complete(run_dir: str, shard_id: str, fingerprint: str = "f" * 32, status: str = "complete") -> None:
    layout = RunLayout.from_run_dir(run_dir)
    marker = ShardMarker(run_id=layout.run_id, shard_id=shard_id, fingerprint=fingerprint, rows_input=10,
                         rows_ok=10, rows_dead_letter=0, status=status)
    storage.write_replace(layout.marker_uri(shard_id), marker.to_json_bytes())


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """Counts storage reads and listings (by function name) made through ``batch_contract.storage``."""
    counter: Counter = Counter()
    for name in ("read_bytes", "list_names", "list_glob", "list_sizes", "exists"):
        real = getattr(storage, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            counter[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(storage, name, counted)
    return counter


def test_is_complete_is_the_one_rule() -> None:
    def marker(status: str = "complete", fp: str = "a") -> ShardMarker:
        return ShardMarker(run_id="r", shard_id="00000", fingerprint=fp, rows_input=1, rows_ok=1,
                           rows_dead_letter=0, status=status)

    assert not is_complete(None)
    assert is_complete(marker()) and is_complete(marker(), "a")
    assert not is_complete(marker(), "b"), "another fingerprint is stale"
    assert not is_complete(marker(status="failed"))


def test_manifest_is_read_once_and_markers_once_each(run_dir: str, calls: Counter) -> None:
    store = RunStore.open(run_dir)
    for _ in range(3):
        assert len(store.manifest.shards) == SHARDS
    assert calls["read_bytes"] == 1
    _complete(run_dir, "00003")
    calls.clear()
    for _ in range(3):
        assert store.marker("00003").shard_id == "00003"
    assert calls["read_bytes"] == 1, "a complete marker is cached"


def test_gate_poll_costs_one_listing_plus_one_read_per_newly_completed_shard(run_dir: str, calls: Counter) -> None:
    store = RunStore.open(run_dir)
    status = check_completion(store)
    assert status.shards_complete == 0 and len(status.missing) == SHARDS
    for sid in ("00001", "00007", "00020"):
        _complete(run_dir, sid)
    calls.clear()
    status = check_completion(store)
    assert status.shards_complete == 3
    assert (calls["list_glob"], calls["read_bytes"], calls["list_names"], calls["exists"]) == (1, 3, 0, 0)
    _complete(run_dir, "00030")
    calls.clear()
    assert check_completion(store).shards_complete == 4
    assert (calls["list_glob"], calls["read_bytes"]) == (1, 1), "only the new marker is read"
    calls.clear()
    assert check_completion(store).shards_complete == 4
    assert (calls["list_glob"], calls["read_bytes"]) == (1, 0), "nothing new: one listing, no read"


def test_poll_notices_a_reopened_shard_and_ignores_other_objects(run_dir: str) -> None:
    store = RunStore.open(run_dir)
    _complete(run_dir, "00002")
    _complete(run_dir, "00004", status="failed")
    layout = store.layout
    storage.write_replace(layout.progress_uri("00005"), b"{}")  # not a marker
    assert set(store.poll()) == {"00002"}, "a marker that is not complete does not count"
    store.delete_marker("00002")
    assert store.poll() == {}
    _complete(run_dir, "00002")
    assert "00002" in store.poll()
    storage.delete(layout.marker_uri("00002"))  # reopened by another process (publish)
    assert "00002" not in store.poll()


def test_progress_reads_only_shards_with_a_progress_object(run_dir: str, calls: Counter) -> None:
    store = RunStore.open(run_dir)
    ids = [s.shard_id for s in store.manifest.shards]
    _complete(run_dir, "00000")
    progress = ShardProgress(shard_id="00001", status="running", rows_total=10, rows_done=4, rows_dead_letter=0,
                             rows_per_s=2.0, eta_s=3.0, updated_at="2026-12-01T00:00:00+00:00")
    storage.write_replace(store.layout.progress_uri("00001"), progress.to_json_bytes())
    calls.clear()
    summary = collect_progress(store, ids)
    assert (summary["completed"], summary["running"] + summary["stale"], summary["pending"]) == (1, 1, SHARDS - 2)
    assert calls["read_bytes"] == 2, "the new marker and the one progress object; no read per pending shard"
    assert calls["list_glob"] == 1, "markers and progress objects from one listing"


# -- the one marker rule (ADR 0002): create-only, the marker in place wins a conflict -----------------
def _marker(run_dir: str, shard_id: str, fingerprint: str = "f" * 32, status: str = "complete",
            rows_ok: int = 10) -> ShardMarker:
    return ShardMarker(run_id=RunLayout.from_run_dir(run_dir).run_id, shard_id=shard_id, fingerprint=fingerprint,
                       rows_input=10, rows_ok=rows_ok, rows_dead_letter=0, status=status)


def test_write_marker_is_create_only_and_a_retried_identical_write_succeeds(run_dir: str) -> None:
    store = RunStore.open(run_dir)
    first = _marker(run_dir, "00004")
    assert store.write_marker(first) is True
    assert store.write_marker(first) is True, "the same bytes again: a retried commit, no conflict"
    assert store.is_complete("00004") and store.is_complete("00004", first.fingerprint)
    again = _marker(run_dir, "00004", rows_ok=9)  # another attempt under the same fingerprint
    assert store.write_marker(again) is False, "the marker in place already completes the shard"
    assert RunStore.open(run_dir).marker("00004").rows_ok == 10, "never replaced"


def test_a_carried_marker_never_replaces_a_complete_one(run_dir: str) -> None:
    store = RunStore.open(run_dir)
    assert store.write_marker(_marker(run_dir, "00006", fingerprint="a" * 32)) is True
    carried = _marker(run_dir, "00006", fingerprint="b" * 32, rows_ok=7)
    assert store.write_marker(carried, carried_over=True) is False, "complete under any fingerprint: kept"
    assert RunStore.open(run_dir).marker("00006").fingerprint == "a" * 32
    assert store.write_marker(_marker(run_dir, "00008"), carried_over=True) is True, "no marker: written"
    assert RunStore.open(run_dir).is_complete("00008")


def test_a_conflicting_marker_is_kept_and_raises(run_dir: str) -> None:
    store = RunStore.open(run_dir)
    assert store.write_marker(_marker(run_dir, "00009", fingerprint="a" * 32)) is True
    with pytest.raises(MarkerConflictError, match="fingerprint"):  # a worker's marker under another fingerprint
        store.write_marker(_marker(run_dir, "00009", fingerprint="b" * 32))
    _complete(run_dir, "00010", status="failed")
    with pytest.raises(MarkerConflictError):
        store.write_marker(_marker(run_dir, "00010"), carried_over=True)
    assert RunStore.open(run_dir).marker("00010").status == "failed", "kept"
    assert issubclass(MarkerConflictError, storage.AlreadyExistsError)


def test_an_unreadable_marker_is_not_complete_and_is_never_replaced(run_dir: str) -> None:
    layout = RunLayout.from_run_dir(run_dir)
    storage.write_replace(layout.marker_uri("00011"), b"{not json")
    store = RunStore.open(run_dir)
    assert not store.is_complete("00011")
    with pytest.raises(json.JSONDecodeError):
        store.marker("00011")  # the raw read still says why
    with pytest.raises(MarkerConflictError):
        store.write_marker(_marker(run_dir, "00011"), carried_over=True)
    assert storage.read_bytes(layout.marker_uri("00011")) == b"{not json"


@pytest.mark.no_report_check  # a hand-written stub report.json: only the round trip is checked
def test_run_level_records_round_trip(run_dir: str) -> None:
    store = RunStore.open(run_dir)
    assert (store.projection(), store.approval(), store.carryover_plan(), store.report(), store.report_html()) == (
        None, None, None, None, None)
    store.write_projection({"decision": "go"})
    store.write_approval({"decision": "pending"})
    store.write_carryover_plan(CarryOverPlan(keys={"00000": "0" * 64}))
    store.write_report({"run_id": "r"}, "<p>r</p>")
    again = RunStore.open(run_dir)
    assert again.projection() == {"decision": "go"} and again.approval() == {"decision": "pending"}
    assert again.carryover_plan().keys == {"00000": "0" * 64}
    assert again.report() == {"run_id": "r"} and again.report_html() == b"<p>r</p>"
    assert again.manifest_bytes() is not None


def test_poll_reads_an_unreadable_marker_as_not_complete(tmp_path) -> None:
    """The gate's poll follows the one is_complete rule: a torn or foreign marker is not complete, and
    does not stop the poll (it is read again next time)."""
    from batch_contract import storage as _storage
    from batch_contract.layout import RunLayout as _Layout
    from batch_contract.runstore import RunStore as _Store
    from run_helpers import SAMPLE_PARQUET, write_run

    run_dir = write_run(tmp_path, SAMPLE_PARQUET, rows=100, shards=2)
    layout = _Layout.from_run_dir(run_dir)
    _storage.makedirs(layout.shard_dir("00000"))
    _storage.write_replace(layout.marker_uri("00000"), b"{not json")
    store = _Store.open(run_dir)
    assert store.poll() == {} and not store.is_complete("00000")
