"""Claimable chunks of a shard: fixed row ranges ("units") that any worker of the run may compute, one at
a time, under a create-only lease (issue #34, work stealing; ``docs/reliability.md``).

A shard's rows (its segments, in order) are cut into units of ``unit_rows`` rows (:func:`unit_segments`).
Before computing a unit, a worker (the shard's owner or a worker that finished its own shard) claims it:

```
<shard_dir>/claims/unit-<unit:05d>.<generation:04d>.json   a lease: owner, expiry (create-only)
<shard_dir>/claims/unit-<unit:05d>.done                     every row of the unit is committed (create-only)
```

* **Claim**: create generation 0, or generation ``g + 1`` once generation ``g`` has expired or was
  released. Creation is create-only (``storage.write_create_only``; local: link, GCS:
  ``ifGenerationMatch=0``), and every lease body carries a random nonce, so of two workers racing for the
  same generation exactly one gets it.
* **Renew**: the holder rewrites its own generation with a later expiry, then checks that no next
  generation exists (a renewal that finished after its expiry may have been overtaken: the lease is lost).
* **Commit only under a held lease**: the holder commits a chunk only while its lease has at least
  :func:`commit_margin` seconds left (:meth:`Lease.safe_to_commit`); a taker waits for the expiry itself,
  so a commit and a take-over never overlap while clocks agree within that margin. Resume by id (the
  ledger skips committed ids) and create-only part files stay the final guard behind the leases.
* **Done**: after a unit's rows are committed the holder creates ``unit-<k>.done``; a unit with a done
  object is never claimed again. A worker that died between its commit and the done object leaves an
  expiring lease: the next holder finds every row of the unit in the ledger, computes nothing and marks it
  done.

Times are wall-clock Unix seconds (``time.time()``): leases are read by workers on other hosts.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import asdict, dataclass

from batch_contract import storage
from batch_contract.layout import join_uri
from batch_contract.manifest import Segment

CLAIMS_DIR = "claims"
UNIT_PREFIX = "unit-"
DONE_SUFFIX = ".done"


def claims_dir(shard_dir: str) -> str:
    """``<shard_dir>/claims``: the shard's lease and done objects."""
    return join_uri(shard_dir, CLAIMS_DIR)


def unit_segments(segments: list[Segment], unit_rows: int) -> list[list[Segment]]:
    """Cut a shard's segments into units of ``unit_rows`` rows (the last unit may be shorter).

    Args:
        segments: the shard's segments, in order (``ShardSpec.segments``).
        unit_rows: rows per unit, >= 1.

    Returns:
        One list of segments per unit; together they cover the shard's rows exactly once, in order. An
        empty shard has no unit.

    Raises:
        ValueError: ``unit_rows`` < 1.
    """
    if unit_rows < 1:
        raise ValueError(f"unit_rows must be >= 1, got {unit_rows}")
    units: list[list[Segment]] = []
    current: list[Segment] = []
    room = unit_rows
    for seg in segments:
        start = seg.row_start
        while start < seg.row_stop:
            take = min(room, seg.row_stop - start)
            current.append(Segment(seg.file_index, start, start + take))
            start += take
            room -= take
            if room == 0:
                units.append(current)
                current, room = [], unit_rows
    if current:
        units.append(current)
    return units


CLAIM_FACTOR = 2
"""A claim takes at most ``1 / (CLAIM_FACTOR x workers)`` of a shard's unclaimed units (:func:`claim_units`):
factoring's halving (Hummel, Schonberg & Flynn, "Factoring", CACM 1992), so the units left always
outnumber what the claims in flight hold."""

CLAIM_SECONDS = 10.0
"""A claim takes at most the units its claimer computes in this many seconds at the rate it measured on its
own last claim (:func:`claim_units`), so a slow worker's claim (a preempted-and-throttled node, a slower
GPU type) never holds more than about this much of a shard's tail while faster workers wait for it. On
bench-stragglers (issue #34) the slowed worker's first factoring claim, 15 of 60 units, was still
computing when the other worker had finished every other unit: 16 s of a 275 s run."""


def claim_units(unclaimed: int, workers: int, units_per_second: float | None = math.inf) -> int:
    """How many consecutive units one claim takes: ``unclaimed // (CLAIM_FACTOR x workers)``, at most
    ``units_per_second x CLAIM_SECONDS``, at least 1.

    Guided self-scheduling as factoring does it: while much of a shard is unclaimed, a claim takes several
    units, which its holder computes as one stretch of rows (length-sorted batches across all of them,
    one producer, fewer part files: small units alone batch poorly, +20% CPU seconds measured with
    20-row units of MiniLM on this machine); as the shard runs out, claims shrink to one unit, so the
    last claim a slow worker holds, the one that sets the shard's tail, is one unit. The time cap sizes
    claims by the claimer's own speed: a worker three times slower than the others takes claims a third
    the size (:data:`CLAIM_SECONDS`); a worker that has not measured itself yet (its first claim) takes
    one unit, as a probe.

    Args:
        unclaimed: units of the shard nobody has claimed yet (the claims listing), >= 0.
        workers: workers that may claim units of this shard: the run's shards with rows (each has a
            worker, and every worker may steal), >= 1 (smaller counts as 1).
        units_per_second: the claimer's rate on its last claim (units / wall seconds of that claim);
            ``None``: not measured yet (one unit); ``math.inf`` (default): no time cap.

    Returns:
        Units to claim, >= 1 (a caller with nothing claimable claims nothing whatever this says).
    """
    share = max(1, unclaimed // (CLAIM_FACTOR * max(1, workers)))
    if units_per_second is None:
        return 1
    if math.isinf(units_per_second):
        return share
    return max(1, min(share, int(max(0.0, units_per_second) * CLAIM_SECONDS)))


def commit_margin(lease_seconds: float) -> float:
    """Seconds a lease must still have left for its holder to commit: a third of ``lease_seconds`` (the
    renewal interval is also a third, so a lease renewed on time always has two thirds left)."""
    return lease_seconds / 3.0


@dataclass
class Lease:
    """One generation of one unit's lease, as its holder knows it.

    Attributes:
        uri: the lease object.
        unit: unit number within the shard.
        generation: 0 for the first claim, +1 per take-over.
        holder: the holder's attempt id (``AttemptRecord.attempt_id``).
        shard_owner: whether the holder is the shard's own worker (``False``: a stolen unit).
        expires_at: Unix seconds after which any worker may take the unit over.
        lease_seconds: the lease's duration, seconds (renewals extend it by this much from now).
        released: the holder gave it up before its expiry (a take-over need not wait).
        nonce: random hex, so two claimants' bodies always differ (create-only is a no-op on equal bytes).
    """

    uri: str
    unit: int
    generation: int
    holder: str
    shard_owner: bool
    expires_at: float
    lease_seconds: float
    released: bool = False
    nonce: str = ""

    def body(self) -> bytes:
        data = asdict(self)
        data.pop("uri")
        return json.dumps(data, sort_keys=True).encode()

    def live(self, now: float | None = None) -> bool:
        """Whether another worker must leave the unit alone (not released and not expired)."""
        return not self.released and (time.time() if now is None else now) < self.expires_at

    def safe_to_commit(self, now: float | None = None) -> bool:
        """Whether the holder may commit now: not released and at least :func:`commit_margin` left."""
        left = self.expires_at - (time.time() if now is None else now)
        return not self.released and left >= commit_margin(self.lease_seconds)


def _lease_name(unit: int, generation: int) -> str:
    return f"{UNIT_PREFIX}{unit:05d}.{generation:04d}.json"


def _done_name(unit: int) -> str:
    return f"{UNIT_PREFIX}{unit:05d}{DONE_SUFFIX}"


def _parse_name(name: str) -> tuple[int, int | None] | None:
    """``(unit, generation)`` of a lease name, ``(unit, None)`` of a done name, else ``None``."""
    if not name.startswith(UNIT_PREFIX):
        return None
    rest = name[len(UNIT_PREFIX):]
    try:
        if rest.endswith(DONE_SUFFIX):
            return int(rest[: -len(DONE_SUFFIX)]), None
        if rest.endswith(".json"):
            unit, gen = rest[: -len(".json")].split(".")
            return int(unit), int(gen)
    except ValueError:
        return None
    return None


@dataclass
class UnitState:
    """What the claims listing says of one unit: ``done``, and its newest lease generation (``-1``: never
    claimed)."""

    unit: int
    done: bool = False
    generation: int = -1


class ClaimBook:
    """The claims of one shard (``<shard_dir>/claims``).

    Args:
        shard_dir: the shard's directory (local path, ``file://`` or ``gs://``).
        units: number of units of the shard (:func:`unit_segments`).
        lease_seconds: lease duration, seconds (``WorkerSettings.lease_seconds``).
    """

    def __init__(self, shard_dir: str, units: int, lease_seconds: float) -> None:
        self.dir = claims_dir(shard_dir)
        self.units = units
        self.lease_seconds = lease_seconds

    def states(self) -> list[UnitState]:
        """Every unit's state from one listing of the claims directory."""
        return self.states_from(storage.list_names(self.dir))

    def states_from(self, names: list[str]) -> list[UnitState]:
        """Every unit's state from the claims directory's object names (listed by the caller)."""
        out = [UnitState(k) for k in range(self.units)]
        for name in names:
            parsed = _parse_name(name)
            if parsed is None or not 0 <= parsed[0] < self.units:
                continue
            unit, gen = parsed
            if gen is None:
                out[unit].done = True
            else:
                out[unit].generation = max(out[unit].generation, gen)
        return out

    def read(self, unit: int, generation: int) -> Lease | None:
        """The lease object of ``unit``/``generation``; ``None`` when it is absent or unreadable (a torn or
        foreign object counts as expired: the next generation may be claimed)."""
        uri = join_uri(self.dir, _lease_name(unit, generation))
        try:
            data = json.loads(storage.read_bytes(uri))
            return Lease(uri=uri, **data)
        except (FileNotFoundError, ValueError, TypeError):
            return None

    def claimable(self, state: UnitState, now: float | None = None) -> bool:
        """Whether ``state``'s unit may be claimed now: not done, and never claimed or its newest lease is
        released, expired or unreadable (one read of the lease object)."""
        if state.done:
            return False
        if state.generation < 0:
            return True
        lease = self.read(state.unit, state.generation)
        return lease is None or not lease.live(now)

    def try_claim(self, state: UnitState, holder: str, shard_owner: bool) -> Lease | None:
        """Claim ``state``'s unit: create its next lease generation when :meth:`claimable`.

        Returns:
            The held lease, or ``None`` when the unit is done, held by a live lease, or another worker
            created the same generation first.

        Raises:
            StorageError: the storage backend failed.
        """
        if not self.claimable(state):
            return None
        gen = state.generation + 1
        lease = Lease(uri=join_uri(self.dir, _lease_name(state.unit, gen)), unit=state.unit, generation=gen,
                      holder=holder, shard_owner=shard_owner, expires_at=time.time() + self.lease_seconds,
                      lease_seconds=self.lease_seconds, nonce=uuid.uuid4().hex)
        try:
            storage.write_create_only(lease.uri, lease.body())
        except storage.AlreadyExistsError:
            return None
        return lease

    def renew(self, lease: Lease) -> bool:
        """Extend ``lease`` to ``lease_seconds`` from now; ``False`` (and the lease marked released) when it
        had already expired or a next generation exists (another worker took the unit over).

        Raises:
            StorageError: the storage backend failed.
        """
        if lease.released or not lease.live():
            lease.released = True
            return False
        started = time.time()
        renewed = Lease(**{**asdict(lease), "expires_at": started + lease.lease_seconds})
        storage.write_replace(lease.uri, renewed.body())
        if storage.exists(join_uri(self.dir, _lease_name(lease.unit, lease.generation + 1))):
            lease.released = True
            return False
        lease.expires_at = renewed.expires_at
        return True

    def release(self, lease: Lease) -> None:
        """Give ``lease`` up before its expiry (an interrupted holder): the unit may be claimed at once.
        Nothing is written when the lease was already lost."""
        if lease.released:
            return
        lease.released = True
        if not storage.exists(join_uri(self.dir, _lease_name(lease.unit, lease.generation + 1))):
            storage.write_replace(lease.uri, lease.body())

    def mark_done(self, unit: int) -> None:
        """Create ``unit-<k>.done`` (every row of the unit is committed); a done object already there is
        kept."""
        try:
            storage.write_create_only(join_uri(self.dir, _done_name(unit)), b"{}")
        except storage.AlreadyExistsError:
            pass
