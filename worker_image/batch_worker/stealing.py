"""Work stealing helpers (``worker.steal``; :mod:`batch_contract.claims`): keep a unit's lease renewed while
it is computed, say whether the run still lets a worker take units of other shards, and pick the shard to
take them from.

The unit loop itself (claim -> compute -> commit -> done) is :meth:`batch_worker.runtime.ShardRun.run_units`.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime

from batch_contract import storage
from batch_contract.claims import CLAIMS_DIR, ClaimBook, Lease, UnitState, unit_segments
from batch_contract.layout import MARKER_NAME
from batch_contract.manifest import Manifest
from batch_contract.runstore import RunStore

log = logging.getLogger("batch_worker")


class LeaseKeeper:
    """Renews the leases of one claim (one or more units) on a background thread every third of their
    duration until :meth:`stop`.

    A renewal that finds a lease lost (expired, or taken over: :meth:`ClaimBook.renew`) marks it
    released and the keeper stops; the holder then commits nothing more of the claim
    (``Lease.safe_to_commit`` of every lease). A storage error in a renewal is logged and retried at the
    next tick (the lease may run out meanwhile, which the commit check sees).
    """

    def __init__(self, book: ClaimBook, leases: list[Lease]) -> None:
        self.book = book
        self.leases = leases
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease-{leases[0].unit}", daemon=True)

    def start(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)

    def _run(self) -> None:
        interval = self.leases[0].lease_seconds / 3.0
        while not self._stop.wait(interval):
            for lease in self.leases:
                try:
                    if not self.book.renew(lease):
                        log.warning("lease of unit %d (generation %d) lost: no more commits under it",
                                    lease.unit, lease.generation)
                        return
                except Exception:  # noqa: BLE001 - a storage hiccup; the next tick retries
                    log.exception("renewing the lease of unit %d failed", lease.unit)


def claim_adjacent(book: ClaimBook, order: list[UnitState], want: int, holder: str, shard_owner: bool) -> list[Lease]:
    """Leases on up to ``want`` adjacent units of ``book``'s shard, taken in ``order`` (the units not done,
    first up for a shard's owner, last down for a thief) from the first claimable one.

    A unit that is not adjacent to the last one taken (a done unit between them) or that another worker
    holds ends the claim: the claim's rows are then one stretch in shard order, which the validator needs
    to decide ``duplicate_id`` as a one-worker run would.

    Args:
        book: the shard's claims.
        order: unit states in claiming order (:meth:`ClaimBook.states`, done ones left out).
        want: units to take at most (:func:`batch_contract.claims.claim_units`), >= 1.
        holder / shard_owner: as :meth:`ClaimBook.try_claim`.

    Returns:
        The leases taken, by unit number ascending; empty when no unit in ``order`` was claimable.

    Raises:
        StorageError: the storage backend failed.
    """
    leases: list[Lease] = []
    for st in order:
        if leases and abs(st.unit - leases[-1].unit) != 1:
            break
        lease = book.try_claim(st, holder, shard_owner=shard_owner)
        if lease is None:
            if leases:
                break
            continue
        leases.append(lease)
        if len(leases) >= want:
            break
    return sorted(leases, key=lambda lease: lease.unit)


def deadline_passed(manifest: Manifest, now: float | None = None) -> bool:
    """Whether the run's deadline (``params.deadline_hours`` after the manifest's ``created_at``) has
    passed; ``False`` when either is missing or unreadable."""
    try:
        hours = float(manifest.params.get("deadline_hours") or 0)
        created = datetime.fromisoformat(manifest.created_at).timestamp()
    except (TypeError, ValueError):
        return False
    if hours <= 0:
        return False
    return (time.time() if now is None else now) > created + hours * 3600.0


def steal_stop_reason(store: RunStore) -> str | None:
    """Why this worker must take no units of other shards: the run's budget stop
    (:meth:`RunStore.steal_stop`) or its deadline (:func:`deadline_passed`); ``None`` when it may."""
    reason = store.steal_stop()
    if reason is not None:
        return reason
    if deadline_passed(store.manifest):
        return f"the run's deadline ({store.manifest.params.get('deadline_hours')} h) has passed"
    return None


@dataclass
class Candidate:
    """A shard another worker may take units of: ``rows`` of its units nobody holds or finished (never
    claimed, or whose newest lease was released or expired); ``all_done``: every unit is done although the
    shard has no marker (its last holder died before writing it: any worker may write it)."""

    shard_id: str
    rows: int
    units: int
    all_done: bool = False


def claimable_rows(store: RunStore, shard_id: str, unit_rows: int, lease_seconds: float,
                   listed: list[str] | None = None) -> Candidate:
    """Rows of shard ``shard_id``'s units that may be claimed now.

    Args:
        store: the run.
        shard_id: the shard.
        unit_rows / lease_seconds: the run's ``worker.steal_unit_rows`` / ``worker.lease_seconds``.
        listed: the shard's claim object names when already listed (``None``: listed here).
    """
    units = unit_segments(store.manifest.shard(shard_id).segments, unit_rows)
    book = ClaimBook(store.layout.shard_dir(shard_id), len(units), lease_seconds)
    states = book.states() if listed is None else book.states_from(listed)
    rows = n = 0
    for st in states:
        if book.claimable(st):
            rows += sum(s.rows for s in units[st.unit])
            n += 1
    return Candidate(shard_id, rows, n, all_done=all(st.done for st in states))


def unfinished_shards(store: RunStore, own_shard: str, skip: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """The run's shards with rows but no marker, other than ``own_shard`` and those in ``skip`` (one
    listing of the run's markers)."""
    complete = {p.split("/", 1)[0] for p in storage.list_glob(store.layout.shards_dir(), f"*/{MARKER_NAME}")}
    return [s.shard_id for s in store.manifest.shards
            if s.rows and s.shard_id != own_shard and s.shard_id not in complete and s.shard_id not in skip]


def pick_victim(store: RunStore, own_shard: str, unit_rows: int, lease_seconds: float,
                skip: set[str] | frozenset[str] = frozenset()) -> Candidate | None:
    """The shard with the most claimable rows (:func:`claimable_rows`) among the run's shards other than
    ``own_shard`` and ``skip`` that have no marker, else one whose units are all done but that has no
    marker; ``None`` when there is neither. Two listings of the run's shards directory (markers, claims)
    however many shards the run has."""
    claims: dict[str, list[str]] = {}
    for path in storage.list_glob(store.layout.shards_dir(), f"*/{CLAIMS_DIR}/*"):
        shard, _, name = path.split("/", 2)
        claims.setdefault(shard, []).append(name)
    best: Candidate | None = None
    unfinished: Candidate | None = None
    for sid in unfinished_shards(store, own_shard, skip):
        cand = claimable_rows(store, sid, unit_rows, lease_seconds, listed=claims.get(sid, []))
        if cand.rows and (best is None or cand.rows > best.rows):
            best = cand
        elif cand.all_done and unfinished is None:
            unfinished = cand
    return best or unfinished
