"""Read one run's measured stats from storage: manifest, shard markers and attempt records.

Only :mod:`batch_contract.storage` is used, so local paths, ``file://`` and ``gs://`` all work.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from batch_contract import storage
from batch_contract.layout import RunLayout, join_uri
from batch_contract.manifest import Manifest
from batch_contract.marker import AttemptRecord, ShardMarker, ShardProgress

IO_THREADS = 16
"""Shards read concurrently (storage reads are I/O bound; on GCS each is an HTTP round trip)."""


@dataclass
class RunData:
    """Everything the report reads from storage for one run.

    Attributes:
        layout: the run's URIs.
        manifest: the plan (shard ids, rows per shard, engine and worker settings).
        markers: shard id -> completion marker, for shards that completed.
        attempts: shard id -> attempt records (dicts, :class:`AttemptRecord` fields), sorted by
            ``started_at``; records under ``attempts/`` win over the copies inside the marker.
        progress: shard id -> live progress object, for shards without a marker.
    """

    layout: RunLayout
    manifest: Manifest
    markers: dict[str, ShardMarker] = field(default_factory=dict)
    attempts: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    progress: dict[str, ShardProgress] = field(default_factory=dict)


def read_manifest(layout: RunLayout) -> Manifest:
    """The run's manifest.

    Raises:
        FileNotFoundError: no ``manifest.json`` under the run directory (the message names the URI).
    """
    try:
        raw = storage.read_bytes(layout.manifest_uri)
    except FileNotFoundError:
        raise FileNotFoundError(f"{layout.manifest_uri}: no manifest; was the run planned?") from None
    return Manifest.from_json_bytes(raw)


def read_marker(layout: RunLayout, shard_id: str) -> ShardMarker | None:
    """The shard's ``_SUCCESS.json`` or ``None`` if the shard has not completed."""
    try:
        raw = storage.read_bytes(layout.marker_uri(shard_id))
    except FileNotFoundError:
        return None
    return ShardMarker.from_json_bytes(raw)


def read_progress(layout: RunLayout, shard_id: str) -> ShardProgress | None:
    """The shard's ``_PROGRESS.json`` or ``None`` if no worker has written one yet."""
    try:
        raw = storage.read_bytes(layout.progress_uri(shard_id))
    except FileNotFoundError:
        return None
    return ShardProgress.from_json_bytes(raw)


def read_attempts(layout: RunLayout, shard_id: str, marker: ShardMarker | None) -> list[dict[str, Any]]:
    """Attempt records of one shard, merged by ``attempt_id`` and sorted by start time.

    The marker carries the attempts known when it was written; the ``attempts/`` directory holds each
    record as last rewritten by its worker (a killed worker leaves its ``running`` record behind).
    """
    merged: dict[str, dict[str, Any]] = {}
    for rec in marker.attempts if marker is not None else []:
        merged[str(rec.get("attempt_id", f"marker-{len(merged)}"))] = dict(rec)
    adir = layout.attempts_dir(shard_id)
    for name in storage.list_names(adir):
        if not name.endswith(".json"):
            continue
        rec = AttemptRecord.from_json_bytes(storage.read_bytes(join_uri(adir, name)))
        merged[rec.attempt_id] = {**merged.get(rec.attempt_id, {}), **json.loads(rec.to_json_bytes())}
    return sorted(merged.values(), key=lambda r: (str(r.get("started_at", "")), str(r.get("attempt_id"))))


def load_run(run_dir: str) -> RunData:
    """Read the manifest, every shard's marker and attempts, and progress of unfinished shards.

    Args:
        run_dir: ``<output_root>/runs/<run_id>`` (local path, ``file://`` or ``gs://``).

    Raises:
        FileNotFoundError: the manifest is missing.
        ValueError: a marker/record has an unreadable ``schema_version`` or the run dir is malformed.
    """
    layout = RunLayout.from_run_dir(run_dir)
    manifest = read_manifest(layout)
    data = RunData(layout=layout, manifest=manifest)

    def read_shard(shard_id: str) -> tuple[ShardMarker | None, ShardProgress | None, list[dict[str, Any]]]:
        marker = read_marker(layout, shard_id)
        progress = read_progress(layout, shard_id) if marker is None else None
        return marker, progress, read_attempts(layout, shard_id, marker)

    ids = [spec.shard_id for spec in manifest.shards]
    with ThreadPoolExecutor(max_workers=max(1, min(IO_THREADS, len(ids)))) as pool:
        for shard_id, (marker, progress, attempts) in zip(ids, pool.map(read_shard, ids), strict=True):
            if marker is not None:
                data.markers[shard_id] = marker
            if progress is not None:
                data.progress[shard_id] = progress
            data.attempts[shard_id] = attempts
    return data
