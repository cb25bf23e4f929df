"""Iceberg table maintenance after every publish and rollback: expire old snapshots, remove orphan files.

A publish adds one snapshot per table and a rollback moves the current snapshot back; the replaced
snapshots and their data files stay until something removes them, and a rollback followed by a publish
leaves the rolled-back snapshot reachable from no branch or tag. :func:`expire_and_clean` does, by the
retention :class:`IcebergRetention` (deployment settings, ``docs/publish.md``):

1. **Expire snapshots** with pyiceberg's own ``table.maintenance.expire_snapshots()`` (0.12): every
   snapshot older than ``keep_days`` that is not among the ``keep_last`` newest, and is not protected
   (the current snapshot and every tagged one, ``<table>__previous`` included: pyiceberg never expires a
   branch head or a tag). That only edits the table metadata.
2. **Remove orphan files** (pyiceberg 0.12 has no orphan-file action): list the table location and
   delete every file that no remaining snapshot and no metadata file references (manifest lists,
   manifests, data files of every entry, live or deleted, of every remaining snapshot; the current
   metadata file and those in its metadata log; statistics files) and that is older than
   ``orphan_min_age_hours``. The age guard keeps the data files a concurrent publish has staged but not
   yet committed; a file a remaining snapshot references is never deleted, whatever its age.

Airflow side only; pyiceberg and pyarrow are imported with the Iceberg backend.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

import pyarrow.fs as pafs
from batch_contract import storage
from batch_contract.engine_config import ConfigError

if TYPE_CHECKING:
    from pyiceberg.table import Table

log = logging.getLogger(__name__)

KEEP_DAYS_ENV = "BATCH_ICEBERG_KEEP_SNAPSHOT_DAYS"
KEEP_LAST_ENV = "BATCH_ICEBERG_KEEP_SNAPSHOTS"
ORPHAN_AGE_ENV = "BATCH_ICEBERG_ORPHAN_MIN_AGE_HOURS"
MS_PER_DAY = 86_400_000


@dataclass(frozen=True)
class IcebergRetention:
    """How long a published Iceberg table keeps old snapshots and unreferenced files.

    Attributes:
        keep_days: snapshots newer than this many days are kept (default 5, Iceberg's own
            ``history.expire.max-snapshot-age-ms``); env :data:`KEEP_DAYS_ENV`.
        keep_last: the newest this many snapshots are kept whatever their age (default 10); env
            :data:`KEEP_LAST_ENV`. The current snapshot and tagged ones (the rollback target) are kept
            regardless of both.
        orphan_min_age_hours: an unreferenced file is deleted only when older than this (default 72, the
            default of Iceberg's ``DeleteOrphanFiles``); keep it above the longest publish, whose staged
            data files are unreferenced until its commit. Env :data:`ORPHAN_AGE_ENV`.

    Raises:
        ConfigError: a value is negative or not finite (the message names the field).
    """

    keep_days: float = 5.0
    keep_last: int = 10
    orphan_min_age_hours: float = 72.0

    def __post_init__(self) -> None:
        for name in ("keep_days", "orphan_min_age_hours"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
                raise ConfigError(f"{name}: {value!r} is not a number >= 0")
        if isinstance(self.keep_last, bool) or not isinstance(self.keep_last, int) or self.keep_last < 0:
            raise ConfigError(f"keep_last: {self.keep_last!r} is not an integer >= 0")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> IcebergRetention:
        """The retention from :data:`KEEP_DAYS_ENV`, :data:`KEEP_LAST_ENV` and :data:`ORPHAN_AGE_ENV`
        (unset or empty: the default).

        Raises:
            ConfigError: a variable is not a number >= 0 (an integer for :data:`KEEP_LAST_ENV`); the
                message names it.
        """
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for field_name, var, kind in (("keep_days", KEEP_DAYS_ENV, float), ("keep_last", KEEP_LAST_ENV, int),
                                      ("orphan_min_age_hours", ORPHAN_AGE_ENV, float)):
            raw = env.get(var, "").strip()
            if not raw:
                continue
            try:
                values[field_name] = kind(raw)
            except ValueError:
                raise ConfigError(f"{var}={raw!r}: not {'an integer' if kind is int else 'a number'} >= 0") from None
        try:
            return cls(**values)
        except ConfigError as exc:
            raise ConfigError(f"{exc} (deployment settings {KEEP_DAYS_ENV}, {KEEP_LAST_ENV}, {ORPHAN_AGE_ENV})") from None


def protected_snapshot_ids(table: Table) -> set[int]:
    """Ids of the snapshots a branch or a tag points at (the current one, ``<table>__previous``)."""
    return {ref.snapshot_id for ref in table.metadata.refs.values()}


def snapshots_to_expire(table: Table, retention: IcebergRetention, now_ms: int) -> list[int]:
    """Ids of the snapshots :func:`expire_and_clean` expires: older than ``keep_days`` before ``now_ms``,
    not among the ``keep_last`` newest (by commit time), and not protected; oldest first."""
    snapshots = sorted(table.metadata.snapshots, key=lambda s: (s.timestamp_ms, s.snapshot_id))
    newest = {s.snapshot_id for s in snapshots[len(snapshots) - retention.keep_last:]} if retention.keep_last else set()
    keep = newest | protected_snapshot_ids(table)
    cutoff = now_ms - retention.keep_days * MS_PER_DAY
    return [s.snapshot_id for s in snapshots if s.timestamp_ms < cutoff and s.snapshot_id not in keep]


def fs_path(uri: str) -> str:
    """A file location as its filesystem's path: ``file:///a%20b/x`` -> ``/a b/x``, ``gs://b/k`` -> ``b/k``,
    a plain path as is (how pyiceberg's locations and a listing of the table location compare)."""
    parts = urlsplit(uri)
    if parts.scheme == "file":
        return unquote(parts.path)
    if not parts.scheme or len(parts.scheme) == 1:  # a plain path (or a Windows drive letter)
        return uri
    return parts.netloc + parts.path


def referenced_files(table: Table) -> set[str]:
    """Every file the table's metadata references (as :func:`fs_path`): the current metadata file and
    those of its metadata log, statistics files, and for every snapshot its manifest list, its manifests
    and the data file of each of their entries (deleted entries too)."""
    meta = table.metadata
    refs = {table.metadata_location, *(e.metadata_file for e in meta.metadata_log)}
    refs |= {s.statistics_path for s in meta.statistics} | {s.statistics_path for s in meta.partition_statistics}
    seen_manifests: set[str] = set()
    for snapshot in meta.snapshots:
        refs.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(table.io):
            if manifest.manifest_path in seen_manifests:
                continue
            seen_manifests.add(manifest.manifest_path)
            refs.update(e.data_file.file_path for e in manifest.fetch_manifest_entry(table.io, discard_deleted=False))
    refs |= seen_manifests
    return {fs_path(r) for r in refs if r}


def _location_fs(location: str) -> tuple[pafs.FileSystem, str]:
    if urlsplit(location).scheme in ("", "file"):
        return pafs.LocalFileSystem(), fs_path(location)
    return storage.arrow_filesystem(location)


def orphan_files(table: Table, min_age_hours: float, now: float) -> list[pafs.FileInfo]:
    """Files under the table location that :func:`referenced_files` does not name and that were last
    modified more than ``min_age_hours`` before ``now`` (seconds since the epoch)."""
    fs, root = _location_fs(table.location())
    infos = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    referenced = referenced_files(table)
    cutoff = now - min_age_hours * 3600.0
    return [i for i in infos if i.type == pafs.FileType.File and i.path not in referenced
            and i.mtime is not None and i.mtime.timestamp() < cutoff]


def expire_and_clean(table: Table, retention: IcebergRetention, now: float | None = None) -> dict[str, int]:
    """Expire the snapshots :func:`snapshots_to_expire` names (one metadata commit, pyiceberg's
    ``ExpireSnapshots``), then delete the orphan files :func:`orphan_files` finds in the table as it is
    after that commit.

    Args:
        table: a loaded table (refreshed here after the commit).
        retention: what to keep.
        now: the current time, seconds since the epoch (default ``time.time()``; tests move it).

    Returns:
        ``{"snapshots_expired", "files_removed", "bytes_removed"}``.

    Raises:
        pyiceberg.exceptions.CommitFailedException: another writer committed meanwhile (nothing deleted).
        OSError: a listing or a delete failed (the files deleted before it stay deleted: they were
            unreferenced).
    """
    now = time.time() if now is None else now
    expire = snapshots_to_expire(table, retention, int(now * 1000))
    if expire:
        table.maintenance.expire_snapshots().by_ids(expire).commit()
        table = table.refresh()
    orphans = orphan_files(table, retention.orphan_min_age_hours, now)
    fs, _ = _location_fs(table.location())
    for info in orphans:
        fs.delete_file(info.path)
    removed = {"snapshots_expired": len(expire), "files_removed": len(orphans),
               "bytes_removed": int(sum(i.size or 0 for i in orphans))}
    if expire or orphans:
        log.info("iceberg maintenance of %s: %s", table.name(), removed)
    return removed
