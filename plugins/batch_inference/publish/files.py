"""Local paths for the run's Parquet files (DuckDB reads local files; remote ones, ``gs://``, are copied)."""

from __future__ import annotations

from pathlib import Path

from batch_contract import storage


def localize(uris: list[str], workdir: Path) -> list[str]:
    """Local paths of ``uris``, in the same order and sorting the same way.

    Each URI's storage backend decides (:func:`batch_contract.storage.localize`): local paths and
    ``file://`` URIs are returned resolved; remote objects (``gs://``) are streamed to
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
        shard_id, name = uri.rstrip("/").split("/")[-2:]
        out.append(storage.localize(uri, workdir / shard_id / name))
    return out
