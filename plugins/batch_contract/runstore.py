"""The run store: every read and write of a run's objects in storage, in one place, for both sides.

The planner writes the manifest once; workers write attempt records, progress objects, committed files
and, last, the shard marker; the Airflow side writes the carry-over plan, carried shards' markers, the
projection, the approval record and the report. The reads of the records among these (the gate, the
local runner, the worker's resume and fast path, carry-over, the report, the progress line, the CLI, the
UI), every marker write and the Airflow side's writes of run-level records go through a
:class:`RunStore`, which

* reads the manifest once per store and caches it;
* caches every *complete* marker it has read (a marker is written once and only removed when a shard is
  reopened, see :meth:`RunStore.forget`);
* decides shard state with one rule, :func:`is_complete` (:meth:`RunStore.is_complete` for a shard id);
* writes every marker with one rule, :meth:`RunStore.write_marker` (create-only; the existing marker
  wins a conflict; ADR 0002);
* finds the completed shards of a run with one listing of the markers (:meth:`RunStore.poll`) and
  reads only the markers it has not seen, so a poll costs one listing plus one read per shard completed
  since the previous poll, not a read per shard.

The planner commits the manifest through :meth:`RunStore.write_manifest`. Still written by the worker
outside the store: attempt records, ``_PROGRESS.json``, committed part and dead-letter files and
``quality_gate.json`` (``canary.json`` goes through :meth:`RunStore.write_canary`). Part and dead-letter files are read as Parquet by their
readers (publish, the report's token counts, the worker's ledger), not through the store.

A store is cheap; keep one per task, trigger or worker run (or per poll loop) and reuse it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import cached_property
from typing import Any

from batch_contract import storage
from batch_contract.canary import CanaryResult
from batch_contract.carryover import CarryOverPlan, ShardIndexEntry, carryover_uri, index_uri
from batch_contract.enums import ShardStatus
from batch_contract.jsonutil import pretty_json
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

STEAL_STOP_NAME = "steal_stop.json"
"""``<run_dir>/steal_stop.json``: the run's workers take no more units of other shards (:meth:`RunStore.steal_stop`)."""

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


class MarkerConflictError(storage.AlreadyExistsError):
    """A marker write found another marker in place that does not already complete the shard (see
    :meth:`RunStore.write_marker`)."""


def _read(uri: str) -> bytes | None:
    try:
        return storage.read_bytes(uri)
    except FileNotFoundError:
        return None


class RunStore:
    """Reads and writes of one run (see the module docstring).

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

    def manifest_bytes(self) -> bytes | None:
        """The manifest's bytes as stored (for a download), ``None`` when the run was never planned."""
        return _read(self.layout.manifest_uri)

    def write_manifest(self, manifest: Manifest) -> bool:
        """Commit the run's manifest create-only (the run directory is created first; a plan never
        changes under a run id, ADR 0002).

        Returns:
            ``True`` when this call committed it (then :attr:`manifest` is ``manifest``); ``False`` when
            another manifest was already committed (a concurrent planner): :attr:`manifest` reads that one.

        Raises:
            StorageError: the write failed.
        """
        self.__dict__.pop("manifest", None)
        storage.makedirs(self.layout.run_dir)
        try:
            storage.write_create_only(self.layout.manifest_uri, manifest.to_json_bytes())
        except storage.AlreadyExistsError:
            return False
        self.__dict__["manifest"] = manifest
        return True

    def canary(self) -> CanaryResult | None:
        """The run's ``canary.json`` (:class:`~batch_contract.canary.CanaryResult`), ``None`` when the run
        had no canary (or it has not finished).

        Raises:
            ValueError: the record is unreadable (schema version, strategy).
        """
        raw = _read(self.layout.canary_uri)
        return None if raw is None else CanaryResult.from_json_bytes(raw)

    def write_canary(self, result: CanaryResult) -> CanaryResult:
        """Commit ``canary.json`` create-only (one canary per run).

        Returns:
            ``result``, or the record already in place when another canary committed first.

        Raises:
            StorageError: the write failed.
            ValueError: the record in place is unreadable.
        """
        try:
            storage.write_create_only(self.layout.canary_uri, result.to_json_bytes())
        except storage.AlreadyExistsError:
            return self.canary() or result
        return result

    # -- run-level records written by the Airflow side ------------------------------------------------
    def projection(self) -> dict[str, Any] | None:
        """The run's ``projection.json`` (``batch_inference.projection``), ``None`` when the run had no
        canary (or it has not run).

        Raises:
            ValueError: the file is not JSON.
            StorageError / OSError: the read failed (other than not found).
        """
        raw = _read(self.layout.projection_uri)
        return None if raw is None else json.loads(raw)

    def write_projection(self, projection: Mapping[str, Any]) -> None:
        """Write (replace) ``projection.json``: a retried canary task projects again."""
        storage.write_replace(self.layout.projection_uri, pretty_json(dict(projection)))

    def steal_stop(self) -> str | None:
        """Why workers must take no more units of other shards (``steal_stop.json``, written by the Airflow
        side's budget stop: :meth:`write_steal_stop`), ``None`` when stealing may go on. An unreadable
        file counts as a stop (its raw text is the reason)."""
        raw = _read(join_uri(self.layout.run_dir, STEAL_STOP_NAME))
        if raw is None:
            return None
        try:
            return str(json.loads(raw).get("reason") or "steal stop")
        except (ValueError, AttributeError):
            return raw.decode("utf-8", "replace")[:200] or "steal stop"

    def write_steal_stop(self, reason: str) -> None:
        """Write (replace) ``steal_stop.json``: from now on no worker of the run takes units of another
        shard (work stealing, ``worker.steal``); each still finishes its own shard."""
        storage.write_replace(join_uri(self.layout.run_dir, STEAL_STOP_NAME), pretty_json({"reason": reason}))

    def approval(self) -> dict[str, Any] | None:
        """The run's ``approval.json`` (fields: ``batch_inference.approval.read_approval``), ``None`` when
        the run never asked for one.

        Raises:
            ValueError: the file is not JSON.
        """
        raw = _read(self.layout.approval_uri)
        return None if raw is None else json.loads(raw)

    def write_approval(self, record: Mapping[str, Any]) -> None:
        """Write (replace) ``approval.json``: ``pending`` first, then the answer. The record is written as
        given (``batch_inference.approval.write_approval`` validates the decision)."""
        storage.write_replace(self.layout.approval_uri, pretty_json(dict(record)))

    def carryover_plan(self) -> CarryOverPlan | None:
        """The run's ``carryover.json`` (:class:`~batch_contract.carryover.CarryOverPlan`), ``None`` when
        the plan task wrote none (reuse off, older runs).

        Raises:
            ValueError / TypeError: the record is unreadable.
        """
        raw = _read(carryover_uri(self.run_dir))
        return None if raw is None else CarryOverPlan.from_json_bytes(raw)

    def write_carryover_plan(self, plan: CarryOverPlan) -> None:
        """Write (replace) ``carryover.json``. The plan task writes it once, before any copy; a retried
        plan task reads it back instead of deciding again."""
        storage.write_replace(carryover_uri(self.run_dir), plan.to_json_bytes())

    def index_entry(self, key: str) -> ShardIndexEntry | None:
        """The carry-over index entry of an input key in this run's output root
        (``<output_root>/cache/shards/<key>.json``), ``None`` when there is none.

        Raises:
            ValueError: ``key`` is not a shard input key, or the entry is unreadable.
        """
        raw = _read(index_uri(self.layout.output_root, key))
        return None if raw is None else ShardIndexEntry.from_json_bytes(raw)

    def write_index_entry(self, key: str, entry: ShardIndexEntry) -> None:
        """Write (replace) the index entry of ``key`` in this run's output root: the newest published
        shard of an input key is the one a later run carries over.

        Raises:
            ValueError: ``key`` is not a shard input key.
        """
        storage.write_replace(index_uri(self.layout.output_root, key), entry.to_json_bytes())

    def report(self) -> dict[str, Any] | None:
        """The run's ``report.json``, ``None`` when publish has not written it.

        Raises:
            ValueError: the file is not JSON.
        """
        raw = _read(self.layout.report_json_uri)
        return None if raw is None else json.loads(raw)

    def report_html(self) -> bytes | None:
        """The run's ``report.html`` bytes (UTF-8), ``None`` when publish has not written it."""
        return _read(self.layout.report_html_uri)

    def write_report(self, report: Mapping[str, Any], html: str | None = None) -> None:
        """Write (replace) ``report.json`` and, when ``html`` is given, ``report.html`` (UTF-8): a
        rerun of the report task rewrites both."""
        storage.write_replace(self.layout.report_json_uri, pretty_json(dict(report)))
        if html is not None:
            storage.write_replace(self.layout.report_html_uri, html.encode("utf-8"))

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

    def is_complete(self, shard_id: str, fingerprint: str | None = None) -> bool:
        """:func:`is_complete` of the shard's marker as stored now. A marker that exists but cannot be
        read as a :class:`~batch_contract.marker.ShardMarker` (not JSON, unknown schema version, missing
        fields) is *not* complete: logged as a warning, ``False``.

        Raises:
            StorageError / OSError: the read failed (other than not found).
        """
        return is_complete(self._readable_marker(shard_id), fingerprint)

    def _readable_marker(self, shard_id: str) -> ShardMarker | None:
        """:meth:`marker`, with an unreadable marker logged as a warning and read as ``None``."""
        try:
            return self.marker(shard_id)
        except (ValueError, TypeError, KeyError) as exc:
            log.warning("shard %s: unreadable marker %s is not complete: %s", shard_id,
                        self.layout.marker_uri(shard_id), exc)
            return None

    def complete_markers(self, shard_ids: Iterable[str] | None = None) -> dict[str, ShardMarker]:
        """``{shard_id: marker}`` of the given shards (default: every manifest shard) that are complete
        by :meth:`is_complete` (an unreadable marker, or one of another status, is left out; the former
        with a warning), read concurrently like :meth:`markers`.

        Raises:
            StorageError / OSError: a read failed (other than not found).
        """
        ids = [s.shard_id for s in self.manifest.shards] if shard_ids is None else list(shard_ids)
        if not ids:
            return {}
        with ThreadPoolExecutor(max_workers=max(1, min(IO_THREADS, len(ids)))) as pool:
            read = dict(zip(ids, pool.map(self._readable_marker, ids), strict=True))
        return {sid: m for sid, m in read.items() if is_complete(m)}

    def write_marker(self, marker: ShardMarker, *, carried_over: bool = False) -> bool:
        """Write the marker of ``marker.shard_id``, create-only (ADR 0002): a marker never replaces
        another.

        Args:
            marker: the shard's marker (status ``complete``).
            carried_over: the plan task carried the shard over from an earlier run (no worker ran it).

        Returns:
            ``True`` when this call wrote the marker (or the identical bytes were already there: a retried
            write), ``False`` when another marker was in place that already completes the shard - under
            ``marker.fingerprint`` for a worker's marker, under any fingerprint for a carried one (carry-over
            only fills shards nobody completed). The marker in place is kept either way.

        Raises:
            MarkerConflictError: another marker is in place and does not complete the shard as above
                (unreadable, another status, or a worker's marker under another fingerprint). It is kept;
                the shard must be reopened (:meth:`delete_marker`) to run again.
            StorageError: the write failed.
        """
        sid = marker.shard_id
        uri = self.layout.marker_uri(sid)
        try:
            storage.write_create_only(uri, marker.to_json_bytes())
        except storage.AlreadyExistsError:
            self.forget(sid)
            if self.is_complete(sid, None if carried_over else marker.fingerprint):
                log.info("shard %s: a marker was already in place (%s): kept", sid,
                         "shard already complete, not carried over" if carried_over else "another attempt won")
                return False
            raise MarkerConflictError(
                f"{uri}: a marker is already in place that does not complete shard {sid}"
                f"{'' if carried_over else f' under fingerprint {marker.fingerprint}'}; kept (delete it to "
                "run the shard again)") from None
        if is_complete(marker):
            self._markers[sid] = marker
        return True

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
        is dropped. An unreadable marker is not complete (:meth:`is_complete`'s rule: a warning, read
        again at the next poll). Returns ``{shard_id: marker}`` of complete shards."""
        listed = {name.split("/", 1)[0] for name in storage.list_glob(self.layout.shards_dir(), f"*/{MARKER_NAME}")}
        return self._complete_of(listed)

    def poll_with_progress(self) -> tuple[dict[str, ShardMarker], set[str]]:
        """:meth:`poll` and the shards that have a progress object, from ONE listing of the shards'
        ``_*.json`` objects (``_SUCCESS.json`` and ``_PROGRESS.json``; paged: on GCS 1,000 names a
        request, so a run of 1,024 shards costs about 3 list requests however many files its shards
        hold), then a read of each marker not seen before.

        Returns:
            ``({shard_id: marker} of complete shards, {shard_id with a _PROGRESS.json})``; pass the
            latter to :meth:`progress_of` as ``listed`` so it does not list again.

        Raises:
            StorageError / OSError: the listing or a read failed (other than not found).
        """
        markers, progress = set(), set()
        for name in storage.list_glob(self.layout.shards_dir(), "*/_*.json"):
            sid, _, leaf = name.partition("/")
            if leaf == MARKER_NAME:
                markers.add(sid)
            elif leaf == PROGRESS_NAME:
                progress.add(sid)
        return self._complete_of(markers), progress

    def _complete_of(self, listed: set[str]) -> dict[str, ShardMarker]:
        """Complete markers among the ``listed`` shard ids (see :meth:`poll`)."""
        for sid in set(self._markers) - listed:
            del self._markers[sid]
        new = sorted(listed - set(self._markers))
        if new:  # marker() caches the complete ones
            with ThreadPoolExecutor(max_workers=max(1, min(IO_THREADS, len(new)))) as pool:
                list(pool.map(self._readable_marker, new))
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

    def progress_of(self, shard_ids: Iterable[str], listed: set[str] | None = None) -> dict[str, ShardProgress]:
        """Progress objects of the given shards that have one: one listing of
        ``shards/*/_PROGRESS.json`` (none when ``listed``, the shard ids a listing just found with one:
        :meth:`poll_with_progress`), then a concurrent read of only the listed ones among ``shard_ids``."""
        wanted = set(shard_ids)
        if listed is None:
            listed = {n.split("/", 1)[0] for n in storage.list_glob(self.layout.shards_dir(), f"*/{PROGRESS_NAME}")}
        listed = sorted(wanted & listed)
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
        names = [n for n in storage.list_names(adir) if n.endswith(".json")]
        return self._read_attempts(adir, names, fingerprint)

    def _read_attempts(self, adir: str, names: list[str], fingerprint: str | None = None) -> list[AttemptRecord]:
        """The readable records ``names`` under ``adir`` (see :meth:`attempts`), oldest first."""
        out = []
        for name in names:
            try:
                rec = AttemptRecord.from_json_bytes(storage.read_bytes(join_uri(adir, name)))
            except (ValueError, TypeError, FileNotFoundError) as exc:
                log.warning("ignoring unreadable attempt record %s: %s", join_uri(adir, name), exc)
                continue
            if fingerprint is None or rec.fingerprint == fingerprint:
                out.append(rec)
        return sorted(out, key=lambda a: a.attempt_id)

    def attempts_of(self, shard_ids: Iterable[str]) -> dict[str, list[AttemptRecord]]:
        """:meth:`attempts` of many shards from ONE listing of the run's ``shards/*/attempts/*.json``
        (paged) instead of one listing per shard, then a concurrent read of each listed record (issue
        #35: the report and the UI read every shard's attempts; at 1,024 shards on GCS that was 1,024
        list requests).

        Returns:
            ``{shard_id: records, oldest first}`` for every shard of ``shard_ids`` (``[]`` when none).

        Raises:
            StorageError / OSError: the listing or a read failed (other than not found).
        """
        wanted = list(dict.fromkeys(shard_ids))
        names: dict[str, list[str]] = {sid: [] for sid in wanted}
        for path in storage.list_glob(self.layout.shards_dir(), "*/attempts/*.json"):
            sid, _, name = path.partition("/attempts/")
            if sid in names:
                names[sid].append(name)
        todo = [sid for sid in wanted if names[sid]]
        out: dict[str, list[AttemptRecord]] = {sid: [] for sid in wanted}
        if todo:
            with ThreadPoolExecutor(max_workers=max(1, min(IO_THREADS, len(todo)))) as pool:
                read = pool.map(lambda sid: self._read_attempts(self.layout.attempts_dir(sid), sorted(names[sid])),
                                todo)
                out.update(zip(todo, read, strict=True))
        return out

    # -- committed files ----------------------------------------------------------------------------
    def committed_files(self, shard_id: str) -> dict[str, int]:
        """``{name: size in bytes}`` of the shard's committed part and dead-letter files (one listing;
        temp files and other objects excluded)."""
        return {name: size for name, size in storage.list_sizes(self.layout.shard_dir(shard_id)).items()
                if chunk_of(name) is not None and name.startswith((PART_PREFIX, DEAD_LETTER_PREFIX))}
