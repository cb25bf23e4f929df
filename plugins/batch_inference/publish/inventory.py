"""What a run has committed: manifest, shard markers, part and dead-letter files (read from storage).

Storage is the truth: publish reads the markers and file listings, never Airflow task state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from batch_contract import partfiles
from batch_contract.jsonutil import sha256_hex
from batch_contract.layout import (
    PART_PREFIX,
    RunLayout,
    join_uri,
)
from batch_contract.manifest import Manifest
from batch_contract.marker import ShardMarker
from batch_contract.runstore import RunStore, is_complete

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

    file_records: dict[str, str] = field(default_factory=dict)
    """``<shard_id>/<name>`` -> ``"<bytes>:<sha256>"`` of every committed file (size as listed; the
    SHA-256 from the shard marker's commit records, empty when the marker has none)."""
    files_quarantined: int = 0
    """Leftover files this inventory moved to a shard's ``quarantine/`` (torn, unreadable or another
    fingerprint, and not counted by the shard's marker)."""

    @property
    def files_digest(self) -> str:
        """SHA-256 (32 hex chars) of every committed file's ``<shard_id>/<name>``, size and recorded
        SHA-256: the same for a local and a ``gs://`` copy of a run, different once any file is added,
        removed, or changes size or recorded content."""
        lines = sorted(f"{key}:{rec}" for key, rec in self.file_records.items())
        return sha256_hex("\n".join(lines))[:32]

    @property
    def rows_input(self) -> int:
        """Rows the manifest assigns to all shards."""
        return self.manifest.rows


@dataclass
class _ShardFiles:
    parts: list[str] = field(default_factory=list)
    dead: list[str] = field(default_factory=list)
    records: dict[str, str] = field(default_factory=dict)
    broken: list[tuple[str, str]] = field(default_factory=list)
    set_aside: int = 0


def _file_problem(uri: str, size: int, recorded: dict | None, fingerprint: str) -> str | None:
    """Why a committed file cannot be published (torn, unreadable, another fingerprint), or ``None``."""
    try:
        footer = partfiles.verify(uri, size, recorded)
    except partfiles.TornFileError as exc:
        return str(exc)
    found = partfiles.stats_fingerprint(footer)
    if found is not None and found != fingerprint:
        return f"committed under fingerprint {found!r}, not the marker's {fingerprint!r}"
    return None


def _check_shard_files(store: RunStore, marker: ShardMarker) -> _ShardFiles:
    """List a complete shard's committed files and verify each (:mod:`batch_contract.partfiles`): size
    against the marker's commit record, a readable Parquet footer, the fingerprint in its statistics.

    A file that fails is quarantined. If the marker counted it (it is in the marker's ``files``, or
    ``parts``/``dead_letter_parts`` for older markers) the shard is broken (``broken``: the caller
    removes the marker); otherwise it was a leftover (``set_aside``) and the shard stays complete.
    """
    shard_dir = store.layout.shard_dir(marker.shard_id)
    counted = set(marker.files) or set(marker.parts) | set(marker.dead_letter_parts)
    out = _ShardFiles()
    for name, size in store.committed_files(marker.shard_id).items():
        uri = join_uri(shard_dir, name)
        recorded = marker.files.get(name)
        why = _file_problem(uri, size, recorded, marker.fingerprint)
        if why is not None:
            partfiles.quarantine(shard_dir, name, why)
            if name in counted:
                out.broken.append((name, why))
            else:
                out.set_aside += 1
            continue
        (out.parts if name.startswith(PART_PREFIX) else out.dead).append(uri)
        out.records[f"{marker.shard_id}/{name}"] = f"{size}:{(recorded or {}).get('sha256', '')}"
    return out


def _reopen_broken_shards(store: RunStore, broken: dict[str, list[tuple[str, str]]]) -> None:
    """Remove the markers of shards whose counted files were quarantined (so those shards run again
    and recompute the rows) and raise a ``PublishError`` saying so."""
    layout = store.layout
    for shard_id in broken:
        store.delete_marker(shard_id)
    detail = "; ".join(f"shard {sid}: {name}: {why}" for sid, files in broken.items() for name, why in files[:3])
    raise PublishError(
        f"run {layout.run_id}: {sum(map(len, broken.values()))} committed file(s) of shard(s) "
        f"{', '.join(sorted(broken))} cannot be published ({detail}). They were moved to the shard's "
        f"{partfiles.QUARANTINE_DIR}/ directory and the shard marker removed: run those shards again "
        "(Airflow: clear their mapped infer tasks; CLI: rerun the run) to recompute their rows, then publish"
    )


def load_inventory(run_dir: str | RunStore) -> RunInventory:
    """Read the manifest, every shard marker and the committed file listing of a run.

    Args:
        run_dir: ``<output_root>/runs/<run_id>`` (local path, ``file://`` or ``gs://``), or its store.

    Returns:
        The run's :class:`RunInventory`.

    Raises:
        PublishError: no manifest; manifest run id differs from the directory; a shard has no marker
            (the message lists up to 20 of them and the count); markers disagree on the fingerprint or
            are not ``complete``; a file a marker counted is torn, unreadable or of another fingerprint
            (it is quarantined and the shard's marker removed first, so the shard runs again).
    """
    store = run_dir if isinstance(run_dir, RunStore) else RunStore.open(run_dir)
    layout = store.layout
    try:
        manifest = store.manifest
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
    found = store.markers()
    for spec in manifest.shards:
        marker = found.get(spec.shard_id)
        if marker is None:
            missing.append(spec.shard_id)
            continue
        if not is_complete(marker):
            raise PublishError(
                f"run {layout.run_id}: shard {spec.shard_id} marker status is {marker.status!r}, "
                "not 'complete'"
            )
        markers.append(marker)
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
    records: dict[str, str] = {}
    broken: dict[str, list[tuple[str, str]]] = {}
    set_aside = 0
    for marker in markers:
        files = _check_shard_files(store, marker)
        parts.extend(files.parts)
        dead.extend(files.dead)
        records.update(files.records)
        set_aside += files.set_aside
        if files.broken:
            broken[marker.shard_id] = files.broken
    if broken:
        _reopen_broken_shards(store, broken)
    return RunInventory(
        layout=layout,
        manifest=manifest,
        markers=markers,
        fingerprint=fingerprints[0],
        part_files=parts,
        dead_letter_files=dead,
        file_records=records,
        files_quarantined=set_aside,
    )
