"""Read one run's measured stats from storage: manifest, shard markers and attempt records.

Every read goes through the contract's :class:`~batch_contract.runstore.RunStore`, so local paths,
``file://`` and ``gs://`` all work.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from batch_contract.layout import RunLayout
from batch_contract.manifest import Manifest
from batch_contract.marker import AttemptRecord, ShardMarker, ShardProgress
from batch_contract.runstore import RunStore

IO_THREADS = 16
"""Shards read concurrently (storage reads are I/O bound; on GCS each is an HTTP round trip)."""



@dataclass
class RunData:
    """Everything the report reads from storage for one run.

    Attributes:
        layout: the run's URIs.
        manifest: the plan (shard ids, rows per shard, engine and worker settings).
        markers: shard id -> completion marker, for complete shards only
            (:meth:`~batch_contract.runstore.RunStore.is_complete`: a marker that is unreadable or of another
            status is left out, with a warning for the former).
        attempts: shard id -> attempt records (dicts, :class:`AttemptRecord` fields), sorted by
            ``started_at``; records under ``attempts/`` win over the copies inside the marker.
        progress: shard id -> live progress object, for shards not complete.
    """

    layout: RunLayout
    manifest: Manifest
    markers: dict[str, ShardMarker] = field(default_factory=dict)
    attempts: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    progress: dict[str, ShardProgress] = field(default_factory=dict)


def merged_attempts(store: RunStore, shard_id: str, marker: ShardMarker | None,
                    records: list[AttemptRecord] | None = None) -> list[dict[str, Any]]:
    """Attempt records of one shard, merged by ``attempt_id`` and sorted by start time.

    The marker carries the attempts known when it was written; the ``attempts/`` directory holds each
    record as last rewritten by its worker (a killed worker leaves its ``running`` record behind).
    ``records``: the shard's ``attempts/`` records already read (:meth:`RunStore.attempts_of`); ``None``:
    read them here.
    """
    merged: dict[str, dict[str, Any]] = {}
    for rec in marker.attempts if marker is not None else []:
        merged[str(rec.get("attempt_id", f"marker-{len(merged)}"))] = dict(rec)
    for rec in store.attempts(shard_id) if records is None else records:
        merged[rec.attempt_id] = {**merged.get(rec.attempt_id, {}), **json.loads(rec.to_json_bytes())}
    return sorted(merged.values(), key=lambda r: (str(r.get("started_at", "")), str(r.get("attempt_id"))))


def load_run(run: str | RunStore) -> RunData:
    """Read the manifest, every shard's marker and attempts, and progress of unfinished shards.

    Args:
        run: ``<output_root>/runs/<run_id>`` (local path, ``file://`` or ``gs://``) or its store.

    Raises:
        FileNotFoundError: the manifest is missing.
        ValueError: the manifest or a progress object is unreadable, or the run dir is malformed (an
            unreadable marker only makes its shard not complete; an unreadable attempt record is skipped).
    """
    store = run if isinstance(run, RunStore) else RunStore.open(run)
    data = RunData(layout=store.layout, manifest=store.manifest)
    ids = [spec.shard_id for spec in store.manifest.shards]
    data.markers.update(store.complete_markers(ids))
    data.progress.update(store.progress_of(sid for sid in ids if sid not in data.markers))
    records = store.attempts_of(ids)  # one listing for the run, not one per shard
    data.attempts.update((sid, merged_attempts(store, sid, data.markers.get(sid), records[sid])) for sid in ids)
    return data
