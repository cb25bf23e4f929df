"""What a run has committed: manifest, shard markers, part and dead-letter files (read from storage).

Storage is the truth: publish reads the markers and file listings, never Airflow task state.
"""

from __future__ import annotations

from dataclasses import dataclass

from batch_contract import storage
from batch_contract.jsonutil import sha256_hex
from batch_contract.layout import (
    DEAD_LETTER_PREFIX,
    PARQUET_SUFFIX,
    PART_PREFIX,
    RunLayout,
    chunk_of,
    join_uri,
)
from batch_contract.manifest import Manifest
from batch_contract.marker import ShardMarker

from batch_inference.publish.errors import PublishError


@dataclass(frozen=True)
class RunInventory:
    """A run ready to publish.

    Attributes:
        layout: the run's URIs.
        manifest: the plan (input files, shard row ranges).
        markers: one completion marker per shard, in shard order.
        fingerprint: the result fingerprint every marker carries.
        part_files: URIs of committed ``part-*.parquet`` files, sorted (shard, then file name).
        dead_letter_files: URIs of committed ``dead-letter-*.parquet`` files, sorted the same way.
    """

    layout: RunLayout
    manifest: Manifest
    markers: list[ShardMarker]
    fingerprint: str
    part_files: list[str]
    dead_letter_files: list[str]

    @property
    def run_id(self) -> str:
        return self.layout.run_id

    @property
    def files_digest(self) -> str:
        """SHA-256 (32 hex chars) of the committed ``<shard_id>/<name>`` of every part and dead-letter
        file: the same for a local and a ``gs://`` copy of a run, different once any file is added."""
        names = sorted("/".join(uri.rsplit("/", 2)[-2:]) for uri in self.part_files + self.dead_letter_files)
        return sha256_hex("\n".join(names))[:32]

    @property
    def rows_input(self) -> int:
        """Rows the manifest assigns to all shards."""
        return self.manifest.rows


def _list_shard_files(layout: RunLayout, shard_id: str) -> tuple[list[str], list[str]]:
    shard_dir = layout.shard_dir(shard_id)
    parts: list[str] = []
    dead: list[str] = []
    for name in storage.list_names(shard_dir):
        if not name.endswith(PARQUET_SUFFIX) or chunk_of(name) is None:
            continue
        if name.startswith(PART_PREFIX):
            parts.append(join_uri(shard_dir, name))
        elif name.startswith(DEAD_LETTER_PREFIX):
            dead.append(join_uri(shard_dir, name))
    return parts, dead


def _read_marker(layout: RunLayout, shard_id: str) -> ShardMarker | None:
    try:
        raw = storage.read_bytes(layout.marker_uri(shard_id))
    except FileNotFoundError:
        return None
    return ShardMarker.from_json_bytes(raw)


def load_inventory(run_dir: str) -> RunInventory:
    """Read the manifest, every shard marker and the committed file listing of a run.

    Args:
        run_dir: ``<output_root>/runs/<run_id>`` (local path, ``file://`` or ``gs://``).

    Returns:
        The run's :class:`RunInventory`.

    Raises:
        PublishError: no manifest; manifest run id differs from the directory; a shard has no marker
            (the message lists up to 20 of them and the count); markers disagree on the fingerprint or
            are not ``complete``.
    """
    layout = RunLayout.from_run_dir(run_dir)
    try:
        manifest = Manifest.from_json_bytes(storage.read_bytes(layout.manifest_uri))
    except FileNotFoundError:
        raise PublishError(f"run {layout.run_id}: no manifest at {layout.manifest_uri}") from None
    if manifest.run_id != layout.run_id:
        raise PublishError(
            f"{layout.manifest_uri}: manifest run_id {manifest.run_id!r} does not match the run "
            f"directory {layout.run_id!r}"
        )
    markers: list[ShardMarker] = []
    missing: list[str] = []
    parts: list[str] = []
    dead: list[str] = []
    for spec in manifest.shards:
        marker = _read_marker(layout, spec.shard_id)
        if marker is None:
            missing.append(spec.shard_id)
            continue
        if marker.status != "complete":
            raise PublishError(
                f"run {layout.run_id}: shard {spec.shard_id} marker status is {marker.status!r}, "
                "not 'complete'"
            )
        markers.append(marker)
        shard_parts, shard_dead = _list_shard_files(layout, spec.shard_id)
        parts.extend(shard_parts)
        dead.extend(shard_dead)
    if missing:
        raise PublishError(
            f"run {layout.run_id}: {len(missing)} of {len(manifest.shards)} shard(s) have no "
            f"completion marker: {', '.join(missing[:20])}{' ...' if len(missing) > 20 else ''}"
        )
    fingerprints = sorted({m.fingerprint for m in markers})
    if len(fingerprints) > 1:
        by_fp = {fp: [m.shard_id for m in markers if m.fingerprint == fp][:5] for fp in fingerprints}
        raise PublishError(
            f"run {layout.run_id}: shard markers carry {len(fingerprints)} different fingerprints "
            f"(fingerprint -> first shards: {by_fp}); rerun the stale shards"
        )
    if not markers:
        raise PublishError(f"run {layout.run_id}: the manifest has no shards")
    return RunInventory(
        layout=layout,
        manifest=manifest,
        markers=markers,
        fingerprint=fingerprints[0],
        part_files=parts,
        dead_letter_files=dead,
    )
