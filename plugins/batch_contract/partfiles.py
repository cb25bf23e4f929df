"""Committed part and dead-letter files: their digests, verification and quarantine.

A committed file is trusted only as far as it can be checked. Each commit records the file's size and
SHA-256 (:func:`digest_of`, in the attempt record, then in the shard marker's ``files``); readers check
what they read (:func:`verify`: the recorded size, and a Parquet footer that parses) before
relying on a file. A file that fails is *quarantined*: moved to ``<shard_dir>/quarantine/<name>`` with a
log line, never deleted, and counted (marker ``files_quarantined``, publish summary, report). Its rows
are then missing from the shard, so the worker recomputes them. Files committed under another
fingerprint are set aside the same way.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from batch_contract import storage
from batch_contract.layout import join_uri

log = logging.getLogger(__name__)

QUARANTINE_DIR = "quarantine"
"""Sub-directory of a shard directory holding files set aside (torn, unreadable, stale fingerprint)."""


def digest_of(data: bytes) -> dict[str, Any]:
    """``{"bytes": size, "sha256": hex digest}`` of a file's exact bytes (what a commit records)."""
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def read_footer(uri: str) -> pq.FileMetaData:
    """The Parquet footer (metadata) of a committed file; reads only the file's tail.

    Raises:
        pyarrow.ArrowInvalid / OSError: the file is not a complete Parquet file (torn, truncated,
            not Parquet) or cannot be read.
    """
    fs, path = storage.arrow_filesystem(uri)
    with fs.open_input_file(path) as fh:
        return pq.read_metadata(fh)


class TornFileError(ValueError):
    """A committed file is not what was committed (size differs, footer unreadable); the message says why."""


def verify(uri: str, size: int | None = None, recorded: dict[str, Any] | None = None) -> pq.FileMetaData:
    """Check a committed file and return its Parquet footer.

    Args:
        uri: the file.
        size: its size in bytes as listed (``None``: not checked).
        recorded: its commit record (:func:`digest_of`), when known.

    Raises:
        TornFileError: the size differs from the commit record, or the file is not a complete Parquet
            file (truncated, overwritten, unreadable).
    """
    if size is not None and recorded and int(recorded.get("bytes", -1)) != size:
        raise TornFileError(f"size is {size} bytes but {recorded.get('bytes')} were committed")
    try:
        return read_footer(uri)
    except FileNotFoundError:
        raise
    except (pa.ArrowInvalid, OSError) as exc:
        raise TornFileError(f"not a readable Parquet file ({exc})") from None


def stats_fingerprint(meta: pq.FileMetaData) -> str | None:
    """The single ``fingerprint`` value of a committed file according to its column statistics, or
    ``None`` when the statistics do not tell (absent, or min != max)."""
    names = meta.schema.to_arrow_schema().names
    if "fingerprint" not in names or meta.num_row_groups == 0:
        return None
    col = names.index("fingerprint")
    values: set[Any] = set()
    for g in range(meta.num_row_groups):
        stats = meta.row_group(g).column(col).statistics
        if stats is None or not stats.has_min_max:
            return None
        values.update((stats.min, stats.max))
    return values.pop() if len(values) == 1 else None


def quarantine(shard_dir: str, name: str, why: str) -> str:
    """Move the committed file ``name`` of ``shard_dir`` to ``<shard_dir>/quarantine/<name>``.

    Returns:
        The file's new URI. A file already gone (another process moved it) is not an error.
    """
    dest = join_uri(shard_dir, QUARANTINE_DIR, name)
    try:
        storage.move(join_uri(shard_dir, name), dest)
    except FileNotFoundError:
        return dest
    log.warning("quarantined %s: %s (moved to %s; its rows will be recomputed)", join_uri(shard_dir, name), why, dest)
    return dest


def quarantined_count(shard_dir: str) -> int:
    """Number of files set aside in ``<shard_dir>/quarantine``."""
    return len(storage.list_names(join_uri(shard_dir, QUARANTINE_DIR)))
