"""Local paths for the run's Parquet files (DuckDB reads local files; ``gs://`` files are copied)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.fs as pafs
from batch_contract import storage


def localize(uris: list[str], workdir: Path) -> list[str]:
    """Local paths of ``uris``, in the same order and sorting the same way.

    Local paths and ``file://`` URIs are returned resolved. ``gs://`` objects are streamed to
    ``workdir/<shard_id>/<name>`` (64 MiB buffers; never whole files in memory) because DuckDB reads
    object stores only through an extension that needs network access to install.

    Args:
        uris: part or dead-letter file URIs (``.../shards/<shard_id>/<name>``), sorted.
        workdir: scratch directory for copies; the caller removes it.

    Raises:
        StorageError / FileNotFoundError: an object could not be read.
    """
    out: list[str] = []
    for uri in uris:
        if not storage.is_gcs(uri):
            out.append(str(storage.local_path(uri).resolve()))
            continue
        shard_id, name = uri.rstrip("/").split("/")[-2:]
        dest = workdir / shard_id / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        fs, path = storage.arrow_filesystem(uri)
        pafs.copy_files(path, str(dest), source_filesystem=fs,
                        destination_filesystem=pafs.LocalFileSystem(), chunk_size=64 << 20)
        out.append(str(dest))
    return out
