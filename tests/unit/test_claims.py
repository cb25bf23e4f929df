"""Claimable units and their leases (``batch_contract.claims``; work stealing, issue #34).

Units: every row of a shard in exactly one unit, in order, whatever the segments (property test).
Leases: of many workers racing for the same unit exactly one holds it; a live lease keeps everyone else
out; an expired or released one is taken over by exactly one; a renewal after a take-over reports the
lease lost and the holder may no longer commit; done units are never claimed again. Claim sizes
(``claim_units``): never more than a share of the unclaimed units, one unit near the end, and never more
than the claimer computes in CLAIM_SECONDS at its measured rate (property tests).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from batch_contract import storage
from batch_contract.claims import (
    CLAIM_FACTOR,
    CLAIM_SECONDS,
    ClaimBook,
    Lease,
    claim_units,
    claims_dir,
    commit_margin,
    unit_segments,
)
from batch_contract.manifest import Segment
from hypothesis import given, settings
from hypothesis import strategies as st


def _rows(segments: list[Segment]) -> list[tuple[int, int]]:
    return [(s.file_index, r) for s in segments for r in range(s.row_start, s.row_stop)]


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(0, 40), min_size=0, max_size=6), unit_rows=st.integers(1, 50),
       offset=st.integers(0, 5))
def test_units_cover_every_row_once_in_order(sizes: list[int], unit_rows: int, offset: int) -> None:
    segments = [Segment(i, offset, offset + n) for i, n in enumerate(sizes)]
    units = unit_segments(segments, unit_rows)
    assert [row for u in units for row in _rows(u)] == _rows(segments)
    assert all(sum(s.rows for s in u) == unit_rows for u in units[:-1])
    assert all(0 < sum(s.rows for s in u) <= unit_rows for u in units)
    assert len(units) == -(-sum(sizes) // unit_rows)


def test_unit_rows_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="unit_rows"):
        unit_segments([Segment(0, 0, 3)], 0)


def _book(tmp_path: Path, units: int = 3, lease_seconds: float = 30.0) -> ClaimBook:
    return ClaimBook(str(tmp_path / "shard"), units, lease_seconds)


def test_racing_workers_get_one_lease(tmp_path: Path) -> None:
    book = _book(tmp_path)
    state = book.states()[1]
    barrier = threading.Barrier(16)
    got: list[Lease | None] = []

    def claim(i: int) -> None:
        barrier.wait()
        got.append(book.try_claim(state, f"attempt-{i}", shard_owner=i == 0))

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [g for g in got if g is not None]
    assert len(winners) == 1
    on_disk = book.read(1, 0)
    assert on_disk is not None and on_disk.holder == winners[0].holder and on_disk.nonce == winners[0].nonce
    assert book.try_claim(book.states()[1], "late", shard_owner=False) is None  # live: nobody else


def test_expired_lease_is_taken_over_once_and_its_holder_loses_it(tmp_path: Path) -> None:
    book = _book(tmp_path, lease_seconds=1.0)
    slow = book.try_claim(book.states()[0], "slow", shard_owner=True)
    assert slow is not None and slow.safe_to_commit()
    time.sleep(1.1)  # the slow holder stalled past its expiry without renewing
    assert not slow.safe_to_commit()
    takers = [book.try_claim(book.states()[0], f"thief-{i}", shard_owner=False) for i in range(3)]
    taken = [t for t in takers if t is not None]
    assert len(taken) == 1 and taken[0].generation == 1
    assert book.renew(slow) is False and slow.released
    assert not slow.safe_to_commit()
    assert book.renew(taken[0]) is True and taken[0].safe_to_commit()


def test_renewal_extends_and_a_released_lease_is_claimable_at_once(tmp_path: Path) -> None:
    book = _book(tmp_path, lease_seconds=3.0)
    lease = book.try_claim(book.states()[2], "a", shard_owner=True)
    assert lease is not None
    before = lease.expires_at
    time.sleep(0.05)
    assert book.renew(lease) and lease.expires_at > before
    assert book.read(2, 0).expires_at == pytest.approx(lease.expires_at)
    book.release(lease)
    assert book.read(2, 0).released
    again = book.try_claim(book.states()[2], "b", shard_owner=False)
    assert again is not None and again.generation == 1


def test_done_units_are_never_claimed(tmp_path: Path) -> None:
    book = _book(tmp_path, lease_seconds=1.0)
    lease = book.try_claim(book.states()[0], "a", shard_owner=True)
    book.mark_done(0)
    book.mark_done(0)  # a second holder's done object: kept, no error
    states = book.states()
    assert states[0].done and not states[1].done
    time.sleep(1.1)
    assert book.try_claim(states[0], "b", shard_owner=False) is None
    assert lease is not None


def test_a_torn_lease_counts_as_expired(tmp_path: Path) -> None:
    book = _book(tmp_path)
    storage.makedirs(claims_dir(str(tmp_path / "shard")))
    (tmp_path / "shard" / "claims" / "unit-00001.0000.json").write_text("{not json")
    (tmp_path / "shard" / "claims" / "stray.txt").write_text("x")
    states = book.states()
    assert states[1].generation == 0
    lease = book.try_claim(states[1], "a", shard_owner=True)
    assert lease is not None and lease.generation == 1


def test_commit_margin_is_a_third_of_the_lease() -> None:
    assert commit_margin(60.0) == pytest.approx(20.0)
    lease = Lease(uri="x", unit=0, generation=0, holder="a", shard_owner=True, expires_at=100.0, lease_seconds=60.0)
    assert lease.safe_to_commit(now=79.0) and not lease.safe_to_commit(now=81.0)
    assert lease.live(now=99.0) and not lease.live(now=100.0)


@settings(max_examples=300, deadline=None)
@given(unclaimed=st.integers(0, 5000), workers=st.integers(-1, 64))
def test_a_claim_takes_at_most_a_share_of_the_unclaimed_units_and_one_near_the_end(unclaimed: int, workers: int) -> None:
    k = claim_units(unclaimed, workers)
    w = max(1, workers)
    assert k >= 1
    assert k == 1 or k * CLAIM_FACTOR * w <= unclaimed
    if unclaimed < 2 * CLAIM_FACTOR * w:
        assert k == 1
    assert claim_units(unclaimed + 1, workers) >= k


@settings(max_examples=300, deadline=None)
@given(unclaimed=st.integers(0, 5000), workers=st.integers(1, 64),
       rate=st.floats(0.0, 1e4, allow_nan=False), faster=st.floats(1.0, 100.0))
def test_a_claim_holds_at_most_claim_seconds_of_its_claimers_measured_rate(unclaimed: int, workers: int,
                                                                           rate: float, faster: float) -> None:
    """Capped by the claimer's speed: never more units than it computes in CLAIM_SECONDS (one at least),
    never more than factoring's share, a first (unmeasured) claim is one unit, and a faster claimer never
    takes fewer units than a slower one."""
    k = claim_units(unclaimed, workers, rate)
    assert 1 <= k <= claim_units(unclaimed, workers)
    assert k == 1 or k <= rate * CLAIM_SECONDS
    assert claim_units(unclaimed, workers, None) == 1
    assert claim_units(unclaimed, workers, rate * faster) >= k


def test_a_worker_three_times_slower_takes_claims_a_third_the_size() -> None:
    fast = claim_units(600, 2, 3.0)  # 3 units/s: 30 units in CLAIM_SECONDS, factoring allows 150
    slow = claim_units(600, 2, 1.0)
    assert (fast, slow) == (int(3.0 * CLAIM_SECONDS), int(CLAIM_SECONDS))
