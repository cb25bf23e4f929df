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
from batch_contract.claims import CLAIMS_DIR, ClaimBook, Lease, unit_segments
from batch_contract.layout import MARKER_NAME
from batch_contract.manifest import Manifest
from batch_contract.runstore import RunStore

log = logging.getLogger("batch_worker")


class LeaseKeeper:
    """Renews one held lease on a background thread every third of its duration until :meth:`stop`.

    A renewal that finds the lease lost (expired, or taken over: :meth:`ClaimBook.renew`) marks it
    released and stops; the holder then commits nothing more under it (``Lease.safe_to_commit``). A
    storage error in a renewal is logged and retried at the next tick (the lease may run out meanwhile,
    which the commit check sees).
    """

    def __init__(self, book: ClaimBook, lease: Lease) -> None:
        self.book = book
        self.lease = lease
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease-{lease.unit}", daemon=True)

    def start(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)

    def _run(self) -> None:
        interval = self.lease.lease_seconds / 3.0
        while not self._stop.wait(interval):
            try:
                if not self.book.renew(self.lease):
                    log.warning("lease of unit %d (generation %d) lost: no more commits under it",
                                self.lease.unit, self.lease.generation)
                    return
            except Exception:  # noqa: BLE001 - a storage hiccup; the next tick retries
                log.exception("renewing the lease of unit %d failed", self.lease.unit)


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
