"""The run store: every read of a run's objects in storage, in one place, for both sides.

The planner writes the manifest once; workers write attempt records, progress objects, committed files
and, last, the shard marker. Everything that *reads* them (the gate, the local runner, the worker's
resume and fast path, publish, the report, the progress line) goes through a :class:`RunStore`, which

* reads the manifest once per store and caches it;
* caches every *complete* marker it has read (a marker is written once and only removed when a shard is
  reopened, see :meth:`RunStore.forget`);
* decides shard state with one rule, :func:`is_complete`;
* finds the completed shards of a run with one listing of the markers (:meth:`RunStore.poll`) and
  reads only the markers it has not seen, so a poll costs one listing plus one read per shard completed
  since the previous poll, not a read per shard.

A store is cheap; keep one per task, trigger or worker run (or per poll loop) and reuse it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from functools import cached_property

from batch_contract import storage
from batch_contract.canary import CanaryResult
from batch_contract.enums import ShardStatus
from batch_contract.layout import (
    DEAD_LETTER_PREFIX,
    MARKER_NAME,
    PART_PREFIX,
    PROGRESS_NAME,
    RunLayout,
    chunk_of,
    join_uri,
)
from batch_contract.manifest import Manifest
from batch_contract.marker import AttemptRecord, ShardMarker, ShardProgress

log = logging.getLogger(__name__)

IO_THREADS = 16
"""Objects read concurrently by :meth:`RunStore.markers` / :meth:`RunStore.progress_of` (each read is
one storage round trip)."""


def is_complete(marker: ShardMarker | None, fingerprint: str | None = None) -> bool:
    """The one shard-state rule: a shard is complete when its marker exists with status ``complete``
    (and, when ``fingerprint`` is given, was written under that result fingerprint)."""
    if marker is None or marker.status != ShardStatus.COMPLETE.value:
        return False
    return fingerprint is None or marker.fingerprint == fingerprint


def _read(uri: str) -> bytes | None:
    try:
        return storage.read_bytes(uri)
    except FileNotFoundError:
        return None


class RunStore:
    """Reads of one run (see the module docstring).

    Args:
        layout: the run's URIs.
    """

    def __init__(self, layout: RunLayout) -> None:
        self.layout = layout
        self._markers: dict[str, ShardMarker] = {}

    @classmethod
    def open(cls, run_dir: str) -> RunStore:
        """The store of the run at ``<output_root>/runs/<run_id>`` (local path, ``file://``, ``gs://``).

        Raises:
            ValueError: ``run_dir`` is not of that form.
        """
        return cls(RunLayout.from_run_dir(run_dir))

    @property
    def run_id(self) -> str:
        return self.layout.run_id

    @property
    def run_dir(self) -> str:
        return self.layout.run_dir

    @cached_property
    def manifest(self) -> Manifest:
        """The run's manifest, read once.

        Raises:
            FileNotFoundError: no ``manifest.json`` (the message names the URI: the run was never planned).
            ValueError / KeyError / TypeError / ConfigError: the manifest is unreadable or invalid.
        """
        raw = _read(self.layout.manifest_uri)
        if raw is None:
            raise FileNotFoundError(f"{self.layout.manifest_uri}: no manifest; was the run planned?")
        return Manifest.from_json_bytes(raw)

    def canary(self) -> CanaryResult | None:
        """The run's ``canary.json`` (:class:`~batch_contract.canary.CanaryResult`), ``None`` when the run
        had no canary (or it has not finished).

        Raises:
            ValueError: the record is unreadable (schema version, strategy).
        """
        raw = _read(self.layout.canary_uri)
        return None if raw is None else CanaryResult.from_json_bytes(raw)

    # -- markers ------------------------------------------------------------------------------------
    def marker(self, shard_id: str) -> ShardMarker | None:
        """The shard's marker (``None`` if absent). A complete marker is cached; others are not."""
        if shard_id in self._markers:
            return self._markers[shard_id]
        raw = _read(self.layout.marker_uri(shard_id))
        if raw is None:
            return None
        marker = ShardMarker.from_json_bytes(raw)
        if is_complete(marker):
            self._markers[shard_id] = marker
        return marker

    def markers(self, shard_ids: Iterable[str] | None = None) -> dict[str, ShardMarker]:
        """``{shard_id: marker}`` of the given shards (default: every manifest shard) that have one,
        read concurrently; cached markers are not read again."""
        ids = [s.shard_id for s in self.manifest.shards] if shard_ids is None else list(shard_ids)
        found = {sid: self._markers[sid] for sid in ids if sid in self._markers}
        todo = [sid for sid in ids if sid not in self._markers]
        if todo:
            with ThreadPoolExecutor(max_workers=max(1, min(IO_THREADS, len(todo)))) as pool:
                found.update((sid, m) for sid, m in zip(todo, pool.map(self.marker, todo), strict=True) if m)
        return {sid: found[sid] for sid in ids if sid in found}

    def poll(self) -> dict[str, ShardMarker]:
        """The complete shards now: one listing of ``shards/*/_SUCCESS.json`` (paged), then a read of
        each marker not seen before. A cached marker that is no longer listed (its shard was reopened)
        is dropped. Returns ``{shard_id: marker}`` of complete shards."""
        listed = {name.split("/", 1)[0] for name in storage.list_glob(self.layout.shards_dir(), f"*/{MARKER_NAME}")}
        for sid in set(self._markers) - listed:
            del self._markers[sid]
        new = sorted(listed - set(self._markers))
        if new:
            self.markers(new)
        return {sid: m for sid, m in sorted(self._markers.items()) if is_complete(m)}

    def forget(self, shard_id: str) -> None:
        """Drop a cached marker (after the marker was deleted: a stale or reopened shard)."""
        self._markers.pop(shard_id, None)

    def delete_marker(self, shard_id: str) -> None:
        """Delete the shard's marker (the shard runs again) and forget it."""
        storage.delete(self.layout.marker_uri(shard_id))
        self.forget(shard_id)

    # -- progress and attempts ----------------------------------------------------------------------
    def progress(self, shard_id: str) -> ShardProgress | None:
        """The shard's ``_PROGRESS.json`` or ``None`` if no worker wrote one yet."""
        raw = _read(self.layout.progress_uri(shard_id))
        return None if raw is None else ShardProgress.from_json_bytes(raw)

    def progress_of(self, shard_ids: Iterable[str]) -> dict[str, ShardProgress]:
        """Progress objects of the given shards that have one: one listing of
        ``shards/*/_PROGRESS.json``, then a concurrent read of only the listed ones among ``shard_ids``."""
        wanted = set(shard_ids)
        listed = sorted(wanted & {n.split("/", 1)[0] for n in storage.list_glob(
            self.layout.shards_dir(), f"*/{PROGRESS_NAME}")})
        if not listed:
            return {}
        with ThreadPoolExecutor(max_workers=max(1, min(IO_THREADS, len(listed)))) as pool:
            read = dict(zip(listed, pool.map(self.progress, listed), strict=True))
        return {sid: p for sid, p in read.items() if p is not None}

    def attempts(self, shard_id: str, fingerprint: str | None = None) -> list[AttemptRecord]:
        """Attempt records of the shard (``attempts/*.json``), oldest first; only those written under
        ``fingerprint`` when given. An unreadable record is skipped with a warning (a worker killed
        while writing it)."""
        adir = self.layout.attempts_dir(shard_id)
        out = []
        for name in storage.list_names(adir):
            if not name.endswith(".json"):
                continue
            try:
                rec = AttemptRecord.from_json_bytes(storage.read_bytes(join_uri(adir, name)))
            except (ValueError, TypeError, FileNotFoundError) as exc:
                log.warning("ignoring unreadable attempt record %s: %s", join_uri(adir, name), exc)
                continue
            if fingerprint is None or rec.fingerprint == fingerprint:
                out.append(rec)
        return sorted(out, key=lambda a: a.attempt_id)

    # -- committed files ----------------------------------------------------------------------------
    def committed_files(self, shard_id: str) -> dict[str, int]:
        """``{name: size in bytes}`` of the shard's committed part and dead-letter files (one listing;
        temp files and other objects excluded)."""
        return {name: size for name, size in storage.list_sizes(self.layout.shard_dir(shard_id)).items()
                if chunk_of(name) is not None and name.startswith((PART_PREFIX, DEAD_LETTER_PREFIX))}
