"""Storage: one small API over local paths, ``file://`` URIs and (see ``gcs`` backend) ``gs://``.

Commit semantics (the heart of exactly-once at the row level):

* :func:`write_create_only` makes an object visible only complete and never overwrites: locally a temp
  file is written, fsync'ed, hard-linked to its final name (``link`` fails if the name exists) and the
  directory fsync'ed; on GCS an upload with ``if_generation_match=0``.
* :func:`write_replace` atomically replaces small mutable objects (progress, attempt records).
* Temp files carry :data:`~batch_contract.layout.TEMP_MARK` in their name; readers ignore them and
  :func:`clean_temp` removes strays left by a killed process.
"""

from __future__ import annotations

import errno
import os
import uuid
from pathlib import Path

import pyarrow.fs as pafs

from batch_contract.layout import TEMP_MARK


class AlreadyExistsError(FileExistsError):
    """A create-only write found the object already committed (and with different content)."""


class StorageError(OSError):
    """A storage operation failed; the message names the URI (never credentials)."""


def is_gcs(uri: str) -> bool:
    return uri.startswith("gs://")


def local_path(uri: str) -> Path:
    """Local filesystem path of a local path or ``file://`` URI."""
    if uri.startswith("file://"):
        return Path(uri[len("file://") :])
    if "://" in uri:
        raise StorageError(f"{uri}: not a local path or file:// URI")
    return Path(uri)


def _backend(uri: str):
    if is_gcs(uri):
        from batch_contract import gcs  # imported lazily: google-cloud-storage is optional locally

        return gcs
    return None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_temp(final: Path, data: bytes) -> Path:
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f"{TEMP_MARK}{final.name}-{uuid.uuid4().hex[:8]}"
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    return tmp


def write_create_only(uri: str, data: bytes) -> None:
    """Commit ``data`` at ``uri`` atomically; never overwrite.

    Raises:
        AlreadyExistsError: ``uri`` already exists with different content (same content: no-op, which
            resolves a retried commit whose first reply was lost).
    """
    backend = _backend(uri)
    if backend is not None:
        backend.write_create_only(uri, data)
        return
    final = local_path(uri)
    tmp = _write_temp(final, data)
    try:
        os.link(tmp, final)
    except FileExistsError:
        if final.read_bytes() != data:
            raise AlreadyExistsError(f"{uri} already exists with other content") from None
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(final.parent)


def write_replace(uri: str, data: bytes) -> None:
    """Atomically create or replace the small object at ``uri`` (progress, attempt records)."""
    backend = _backend(uri)
    if backend is not None:
        backend.write_replace(uri, data)
        return
    final = local_path(uri)
    tmp = _write_temp(final, data)
    os.replace(tmp, final)
    _fsync_dir(final.parent)


def read_bytes(uri: str) -> bytes:
    """Whole object. Raises ``FileNotFoundError`` if absent."""
    backend = _backend(uri)
    if backend is not None:
        return backend.read_bytes(uri)
    return local_path(uri).read_bytes()


def exists(uri: str) -> bool:
    backend = _backend(uri)
    if backend is not None:
        return backend.exists(uri)
    return local_path(uri).exists()


def list_names(dir_uri: str) -> list[str]:
    """Sorted names of committed objects directly under ``dir_uri`` (temp files excluded; ``[]`` if
    the directory does not exist)."""
    backend = _backend(dir_uri)
    if backend is not None:
        names = backend.list_names(dir_uri)
    else:
        path = local_path(dir_uri)
        names = [p.name for p in path.iterdir()] if path.is_dir() else []
    return sorted(n for n in names if TEMP_MARK not in n)


def list_sizes(dir_uri: str) -> dict[str, int]:
    """``{name: size in bytes}`` of the committed objects (files) directly under ``dir_uri``, temp files
    excluded (``{}`` if the directory does not exist); sub-directories are not listed."""
    backend = _backend(dir_uri)
    if backend is not None:
        sizes = backend.list_sizes(dir_uri)
    else:
        path = local_path(dir_uri)
        sizes = {p.name: p.stat().st_size for p in path.iterdir() if p.is_file()} if path.is_dir() else {}
    return {n: s for n, s in sorted(sizes.items()) if TEMP_MARK not in n}


def list_glob(dir_uri: str, pattern: str) -> list[str]:
    """Sorted paths (relative to ``dir_uri``, ``/``-separated) of the objects below ``dir_uri`` that
    match the glob ``pattern`` (``*`` does not cross ``/``), e.g. ``"*/_SUCCESS.json"``: one listing
    (paged on GCS) instead of one request per sub-directory. Temp files excluded."""
    backend = _backend(dir_uri)
    if backend is not None:
        names = backend.list_glob(dir_uri, pattern)
    else:
        path = local_path(dir_uri)
        names = [p.relative_to(path).as_posix() for p in path.glob(pattern) if p.is_file()] if path.is_dir() else []
    return sorted(n for n in names if TEMP_MARK not in n.rsplit("/", 1)[-1])


def move(src: str, dst: str) -> None:
    """Move the object ``src`` to ``dst`` (same scheme): locally an atomic rename (the target's directory
    is created and fsync'ed); on GCS a server-side copy then a delete.

    Raises:
        FileNotFoundError: ``src`` does not exist.
    """
    backend = _backend(src)
    if backend is not None:
        backend.move(src, dst)
        return
    target = local_path(dst)
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(local_path(src), target)
    _fsync_dir(target.parent)


def delete(uri: str) -> None:
    """Delete ``uri`` if it exists."""
    backend = _backend(uri)
    if backend is not None:
        backend.delete(uri)
        return
    try:
        local_path(uri).unlink()
    except FileNotFoundError:
        pass


def clean_temp(dir_uri: str) -> int:
    """Remove temp files left under ``dir_uri`` by a killed writer; returns how many were removed."""
    if is_gcs(dir_uri):
        return 0  # GCS uploads are atomic: no partial objects to clean
    path = local_path(dir_uri)
    removed = 0
    if path.is_dir():
        for p in path.iterdir():
            if p.name.startswith(TEMP_MARK):
                try:
                    p.unlink()
                    removed += 1
                except OSError as exc:  # pragma: no cover - racing cleaner
                    if exc.errno != errno.ENOENT:
                        raise
    return removed


def arrow_filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem and path for reading ``uri`` with pyarrow (Parquet/JSON readers)."""
    backend = _backend(uri)
    if backend is not None:
        return backend.arrow_filesystem(uri)
    return pafs.LocalFileSystem(), str(local_path(uri).resolve())


def makedirs(dir_uri: str) -> None:
    """Create a local directory (no-op on object stores, which have no directories)."""
    if not is_gcs(dir_uri):
        local_path(dir_uri).mkdir(parents=True, exist_ok=True)
