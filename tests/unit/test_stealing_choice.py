"""Which shard a worker that finished its own takes units of, when it takes none, and which adjacent
units one claim takes (``batch_worker.stealing``; work stealing, issue #34)."""

from __future__ import annotations

import dataclasses
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from batch_contract import storage
from batch_contract.claims import CLAIM_FACTOR, ClaimBook, claim_units
from batch_contract.layout import join_uri
from batch_contract.runstore import RunStore
from batch_worker.stealing import (
    claim_adjacent,
    claimable_rows,
    deadline_passed,
    pick_victim,
    steal_stop_reason,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from run_helpers import write_run

UNIT = 10
LEASE = 30.0


def _store(tmp_path: Path, rows: int = 90, shards: int = 3) -> RunStore:
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": [str(i) for i in range(rows)], "text": [f"t{i}" for i in range(rows)]}), src)
    run_dir = write_run(tmp_path / "out", src, shards=shards,
                        worker={"steal": True, "steal_unit_rows": UNIT, "lease_seconds": LEASE})
    return RunStore.open(run_dir)


def _book(store: RunStore, shard: str, units: int = 3) -> ClaimBook:
    return ClaimBook(store.layout.shard_dir(shard), units, LEASE)


def test_the_shard_with_most_claimable_rows_is_picked(tmp_path: Path) -> None:
    store = _store(tmp_path)
    b1, b2 = _book(store, "00001"), _book(store, "00002")
    b1.mark_done(0)
    assert b1.try_claim(b1.states()[1], "w", shard_owner=True) is not None  # live: not claimable
    b2.mark_done(0)
    victim = pick_victim(store, "00000", UNIT, LEASE)
    assert victim is not None and (victim.shard_id, victim.rows, victim.units) == ("00002", 20, 2)
    assert claimable_rows(store, "00001", UNIT, LEASE).rows == 10


def test_own_and_complete_shards_are_never_picked(tmp_path: Path) -> None:
    store = _store(tmp_path, shards=2)
    assert pick_victim(store, "00000", UNIT, LEASE).shard_id == "00001"
    storage.write_replace(store.layout.marker_uri("00001"), b"{}")  # any marker object: the shard is done
    assert pick_victim(store, "00000", UNIT, LEASE) is None


def test_a_shard_whose_units_are_done_but_has_no_marker_is_picked_to_finish(tmp_path: Path) -> None:
    store = _store(tmp_path, shards=2)
    book = _book(store, "00001", units=5)
    for unit in range(5):
        book.mark_done(unit)
    victim = pick_victim(store, "00000", UNIT, LEASE)
    assert victim is not None and victim.all_done and victim.rows == 0


def test_stealing_stops_on_the_budget_stop_and_past_the_deadline(tmp_path: Path) -> None:
    store = _store(tmp_path, shards=2)
    assert steal_stop_reason(store) is None
    store.write_steal_stop("BUDGET EXCEEDED: spent $2 > budget_usd=1 + 10%")
    assert steal_stop_reason(RunStore.open(store.run_dir)).startswith("BUDGET EXCEEDED")
    storage.write_replace(join_uri(store.run_dir, "steal_stop.json"), b"not json")
    assert steal_stop_reason(RunStore.open(store.run_dir)) == "not json"

    manifest = store.manifest
    past = (datetime.now(UTC) - timedelta(hours=2)).isoformat(timespec="seconds")
    late = dataclasses.replace(manifest, created_at=past, params={"deadline_hours": 1.0})
    assert deadline_passed(late) and not deadline_passed(late, now=time.time() - 7200)
    assert not deadline_passed(dataclasses.replace(late, params={"deadline_hours": 3.0}))
    assert not deadline_passed(dataclasses.replace(late, created_at=""))


def test_steal_settings_are_written_only_when_on_and_validated(tmp_path: Path) -> None:
    import pytest
    from batch_contract.engine_config import ConfigError, WorkerSettings
    from batch_contract.manifest import Manifest

    manifest = _store(tmp_path).manifest
    data = manifest.to_dict()
    assert data["worker"]["steal"] is True and data["worker"]["steal_unit_rows"] == UNIT
    assert Manifest.from_dict(data).worker == manifest.worker
    off = WorkerSettings(steal_unit_rows=5)
    assert not {"steal", "steal_unit_rows", "lease_seconds"} & set(off.to_dict())
    assert WorkerSettings.from_dict(off.to_dict()) == WorkerSettings()
    for bad, field in (({"steal_unit_rows": 0}, "steal_unit_rows"), ({"lease_seconds": 0.5}, "lease_seconds"),
                       ({"steal": "yes"}, "steal")):
        with pytest.raises(ConfigError, match=f"^worker.{field}: "):
            WorkerSettings(**bad)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(units=st.integers(1, 40), workers=st.integers(1, 4),
       steps=st.lists(st.tuples(st.integers(0, 3), st.booleans()), min_size=1, max_size=200))
def test_adjacent_claims_from_both_ends_take_every_unit_once(tmp_path: Path, units: int, workers: int,
                                                            steps: list[tuple[int, bool]]) -> None:
    """Claimers interleaved at random, each from the front (an owner) or the tail (a thief), each claim
    sized by ``claim_units``: every unit is claimed exactly once, each claim is adjacent units no more
    than it wanted, and a claim made with fewer than ``2 x CLAIM_FACTOR x workers`` units unclaimed is one
    unit."""
    book = ClaimBook(str(tmp_path / f"s{units}-{workers}-{len(steps)}-{time.monotonic_ns()}"), units, LEASE)
    claimed: list[int] = []
    for who, from_tail in steps + [(0, False)] * units:
        pending = [s for s in book.states() if not s.done and s.generation < 0]
        if not pending:
            break
        want = claim_units(len(pending), workers)
        got = claim_adjacent(book, list(reversed(pending)) if from_tail else pending, want, f"w{who}", who == 0)
        nums = [lease.unit for lease in got]
        assert got and len(got) <= want and nums == list(range(nums[0], nums[0] + len(nums)))
        assert nums[-1 if from_tail else 0] == pending[-1 if from_tail else 0].unit
        if len(pending) < 2 * CLAIM_FACTOR * workers:
            assert len(got) == 1
        claimed += nums
    assert sorted(claimed) == list(range(units))


def test_a_claim_stops_at_a_unit_another_worker_holds(tmp_path: Path) -> None:
    book = ClaimBook(str(tmp_path / "shard"), 6, LEASE)
    assert book.try_claim(book.states()[2], "other", shard_owner=False) is not None
    states = [s for s in book.states()]
    got = claim_adjacent(book, states, 5, "owner", True)
    assert [lease.unit for lease in got] == [0, 1]
    got = claim_adjacent(book, list(reversed(book.states())), 5, "thief", False)
    assert [lease.unit for lease in got] == [3, 4, 5]
    assert claim_adjacent(book, book.states(), 5, "late", False) == []


def test_a_claim_stops_at_a_gap_of_done_units(tmp_path: Path) -> None:
    book = ClaimBook(str(tmp_path / "shard"), 6, LEASE)
    book.mark_done(1)
    pending = [s for s in book.states() if not s.done]
    assert [lease.unit for lease in claim_adjacent(book, pending, 5, "owner", True)] == [0]
    pending = [s for s in book.states() if not s.done]
    assert [lease.unit for lease in claim_adjacent(book, pending, 5, "owner", True)] == [2, 3, 4, 5]
