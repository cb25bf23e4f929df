"""Storage: one small API over every URI scheme, each scheme a backend in a registry.

Callers use the module functions (:func:`read_bytes`, :func:`write_create_only`, ...) and never test a
scheme themselves: :func:`backend_for` is the one dispatch point. :data:`BACKENDS` maps URI schemes to
backends (``""``, a plain path, and ``file`` -> :class:`~batch_contract.storage.local.LocalBackend`;
``gs`` -> :class:`batch_contract.gcs.GcsBackend`, ``s3`` -> :class:`batch_contract.storage.s3.S3Backend`,
``az`` -> :class:`batch_contract.storage.azure.AzureBlobBackend`, each imported on first use so their
client libraries stay optional). Adding a scheme is one module with a :class:`StorageBackend` subclass plus one line in
:data:`BACKENDS` (``docs/extending.md``, "Storage scheme").

Commit semantics (the heart of exactly-once at the row level):

* :func:`write_create_only` makes an object visible only complete and never overwrites: locally a temp
  file is written, fsync'ed, hard-linked to its final name (``link`` fails if the name exists) and the
  directory fsync'ed; on GCS an upload with ``if_generation_match=0``.
* :func:`write_replace` atomically replaces small mutable objects (progress, attempt records).
* Temp files carry :data:`~batch_contract.layout.TEMP_MARK` in their name; readers ignore them and
  :func:`clean_temp` removes strays left by a killed process.
"""

from __future__ import annotations

import importlib
import re
import threading
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs

from batch_contract.layout import TEMP_MARK
from batch_contract.storage.base import AlreadyExistsError, InputRefusedError, StorageBackend, StorageError

__all__ = [
    "BACKENDS", "AlreadyExistsError", "InputRefusedError", "StorageBackend", "StorageError", "arrow_filesystem",
    "backend_for", "check_under_roots", "clean_temp", "config_env_names", "content_tag", "copy", "delete", "exists",
    "is_local",
    "is_under", "list_names", "list_sizes", "list_tree", "local_path", "localize", "makedirs", "move", "normalize",
    "open_input_file", "open_input_stream", "read_bytes", "register_backend", "scheme_of", "unregister_backend",
    "write_create_only", "write_replace",
]

BACKENDS: dict[str, str] = {
    "": "batch_contract.storage.local:LocalBackend",
    "file": "batch_contract.storage.local:LocalBackend",
    "gs": "batch_contract.gcs:GcsBackend",
    "s3": "batch_contract.storage.s3:S3Backend",
    "az": "batch_contract.storage.azure:AzureBlobBackend",
}
"""URI scheme (``""`` for a plain path) -> ``"module:Class"`` of its :class:`StorageBackend`. The module
is imported and the class instantiated (once per process, shared by schemes naming the same class) on the
first URI of that scheme."""

_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_SCHEME_TYPO_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
"""``s3:/bucket``, ``gs:bucket``, ``az:\\c``: a known scheme and a colon without ``//`` (a typo that would
otherwise name a local folder called ``s3:``)."""
_lock = threading.Lock()
_instances: dict[str, StorageBackend] = {}
"""``"module:Class"`` -> its instance."""
_registered: dict[str, StorageBackend] = {}
"""Backends registered at run time (:func:`register_backend`); they take precedence over BACKENDS."""


def scheme_of(uri: str) -> str:
    """The lower-cased URI scheme of ``uri`` (``"gs"`` for ``gs://b/k``), ``""`` for a plain path.

    Raises:
        StorageError: ``uri`` contains ``://`` but does not start with a valid scheme, or starts with a
            known scheme and a colon without ``//`` (``s3:/bucket/key``: a typo, not a local path).
    """
    match = _SCHEME_RE.match(uri)
    if match:
        return match.group(1).lower()
    if "://" in uri:
        raise StorageError(f"{uri}: not a local path nor a URI of the form scheme://...")
    typo = _SCHEME_TYPO_RE.match(uri)
    if typo and typo.group(1).lower() in {s for s in (*BACKENDS, *_registered) if s}:
        raise StorageError(f"{uri}: a {typo.group(1).lower()}:// URI with a malformed separator (write "
                           f"{typo.group(1).lower()}://...); a local path may not start with a storage scheme")
    return ""


def register_backend(scheme: str, backend: StorageBackend) -> None:
    """Serve URIs of ``scheme`` (lower case, no ``://``) with ``backend`` in this process, replacing any
    backend that served it (for plugins and tests; a permanent scheme belongs in :data:`BACKENDS`, so
    that worker subprocesses and pods know it too)."""
    with _lock:
        _registered[scheme.lower()] = backend


def unregister_backend(scheme: str) -> None:
    """Undo :func:`register_backend` for ``scheme`` (:data:`BACKENDS` serves it again, if listed)."""
    with _lock:
        _registered.pop(scheme.lower(), None)


def backend_for(uri: str) -> StorageBackend:
    """The backend serving ``uri``'s scheme: the one dispatch point of the storage API.

    Raises:
        StorageError: ``uri`` has a scheme no backend serves (the message lists the known ones).
    """
    scheme = scheme_of(uri)
    with _lock:
        backend = _registered.get(scheme)
    if backend is not None:
        return backend
    spec = BACKENDS.get(scheme)
    if spec is None:
        known = sorted({s for s in (*BACKENDS, *_registered) if s})
        raise StorageError(f"{uri}: no storage backend for scheme {scheme!r} (known: "
                           f"{', '.join(s + '://' for s in known)} and local paths)")
    with _lock:
        backend = _instances.get(spec)
    if backend is None:
        module, _, name = spec.partition(":")
        made = getattr(importlib.import_module(module), name)()
        with _lock:
            backend = _instances.setdefault(spec, made)
    return backend


def config_env_names() -> tuple[str, ...]:
    """Names of the plain (non-secret) environment variables the backends of :data:`BACKENDS` read for
    their settings (emulator or custom endpoints, region, project, account), sorted: what a worker
    container must be handed besides its secrets. Imports each backend's module (their client libraries
    are imported lazily, so this needs none of them)."""
    names: set[str] = set()
    for spec in set(BACKENDS.values()):
        module, _, name = spec.partition(":")
        names.update(getattr(importlib.import_module(module), name).config_envs)
    return tuple(sorted(names))


# ------------------------------------------------------------------------------------------ schemes


def is_local(uri: str) -> bool:
    """Whether ``uri``'s object is a file on the local file system (see :func:`local_path`).

    Raises:
        StorageError: unknown scheme.
    """
    return backend_for(uri).local_path(uri) is not None


def local_path(uri: str) -> Path:
    """Local file system path of ``uri`` (a plain path or ``file://`` URI; not resolved).

    Raises:
        StorageError: ``uri``'s object is not a local file (``gs://``, unknown scheme).
    """
    try:
        path = backend_for(uri).local_path(uri)
    except StorageError:
        path = None
    if path is None:
        raise StorageError(f"{uri}: not a local path or file:// URI")
    return path


def normalize(uri: str) -> str:
    """Canonical form of ``uri`` (local: ``os.path.realpath``, ``file://`` stripped; ``gs://``: bucket
    checked, ``.``/``..`` collapsed, no trailing ``/``; ``s3://``, ``az://``: lower-case scheme, no
    trailing ``/``, dot and empty segments refused), for comparisons such as the allow-list.

    Raises:
        StorageError: unknown scheme, or ``uri`` malformed for its scheme (``gs://`` without a bucket,
            ``s3://b/a/../c``).
    """
    return backend_for(uri).normalize(uri)


def is_under(uri: str, root: str) -> bool:
    """Whether ``uri`` is ``root`` or inside it: same backend and whole path segments (the allow-list
    check). ``False`` when the two belong to different backends.

    Raises:
        StorageError: unknown scheme, or either is malformed for its scheme.
    """
    backend = backend_for(uri)
    return backend_for(root) is backend and backend.is_under(uri, root)


def _own_roots(backend: StorageBackend, roots: Sequence[str]) -> list[str] | None:
    """``None`` (no check) for no roots, else the roots ``backend`` serves (those of other backends
    can hold nothing of it)."""
    return None if not roots else [r for r in roots if backend_for(r) is backend]


def check_under_roots(uri: str, roots: Sequence[str]) -> None:
    """Refuse ``uri`` unless it lies under one of ``roots`` by :func:`is_under` (local: real paths, so
    after following symbolic links; object stores: bucket and object prefix). No roots: no check.

    Raises:
        InputRefusedError: ``uri`` lies outside every root (the message names ``uri``, never the roots
            nor where a link points).
        StorageError: unknown scheme, or a URI malformed for its scheme.
    """
    if roots and not any(is_under(uri, root) for root in roots):
        raise InputRefusedError(f"{uri}: lies outside the allowed input locations (locally: after following "
                                "symbolic links)")


def list_tree(dir_uri: str, roots: Sequence[str] = ()) -> list[str]:
    """Every file below ``dir_uri``, recursively, as paths of :func:`arrow_filesystem` (any order; ``[]``
    when nothing is there); see :meth:`StorageBackend.list_tree`. Locally symbolic links are followed,
    each real directory is listed once, and with ``roots`` a directory resolving outside them is
    refused before it is listed. The files themselves are not checked: pass each one the caller keeps
    to :func:`check_under_roots` (or open it with :func:`open_input_file`).

    Raises:
        InputRefusedError: a directory of the tree resolves outside ``roots``.
        StorageError / OSError: unknown scheme, or the listing failed.
    """
    backend = backend_for(dir_uri)
    return backend.list_tree(dir_uri, _own_roots(backend, roots))


def open_input_file(uri: str, roots: Sequence[str] = ()) -> pa.NativeFile:
    """Open the object ``uri`` as a seekable pyarrow file (Parquet), refusing it unless it lies under
    one of ``roots`` (no roots: no check). Locally the check is made on the file actually opened (its
    real path read back from the open descriptor) and the file must be a regular file, so a path
    swapped for a symbolic link between a check and the read cannot redirect it.

    Raises:
        InputRefusedError: outside every root, or (locally) not a regular file.
        FileNotFoundError / StorageError: the object could not be opened.
    """
    backend = backend_for(uri)
    return backend.open_input(uri, _own_roots(backend, roots), random_access=True)


def open_input_stream(uri: str, roots: Sequence[str] = ()) -> pa.NativeFile:
    """Like :func:`open_input_file`, for sequential reading (JSONL).

    Raises:
        InputRefusedError: outside every root, or (locally) not a regular file.
        FileNotFoundError / StorageError: the object could not be opened.
    """
    backend = backend_for(uri)
    return backend.open_input(uri, _own_roots(backend, roots), random_access=False)


def localize(uri: str, dest: Path) -> str:
    """A local file path holding the object ``uri``: the (resolved) file itself when it is local, else
    a copy streamed to ``dest`` (parent created). The caller removes ``dest``.

    Raises:
        FileNotFoundError / StorageError: the object could not be read.
    """
    return backend_for(uri).localize(uri, dest)


# ------------------------------------------------------------------------------------------ objects


def write_create_only(uri: str, data: bytes) -> None:
    """Commit ``data`` at ``uri`` atomically; never overwrite.

    Raises:
        AlreadyExistsError: ``uri`` already exists with different content (same content: no-op, which
            resolves a retried commit whose first reply was lost).
        StorageError: unknown scheme, or the backend failed.
    """
    backend_for(uri).write_create_only(uri, data)


def write_replace(uri: str, data: bytes) -> None:
    """Atomically create or replace the small object at ``uri`` (progress, attempt records)."""
    backend_for(uri).write_replace(uri, data)


def read_bytes(uri: str) -> bytes:
    """Whole object. Raises ``FileNotFoundError`` if absent."""
    return backend_for(uri).read_bytes(uri)


def exists(uri: str) -> bool:
    """Whether the object ``uri`` exists."""
    return backend_for(uri).exists(uri)


def list_names(dir_uri: str) -> list[str]:
    """Sorted names of committed objects directly under ``dir_uri`` (temp files excluded; ``[]`` if
    the directory does not exist)."""
    return sorted(n for n in backend_for(dir_uri).list_names(dir_uri) if TEMP_MARK not in n)


def list_sizes(dir_uri: str) -> dict[str, int]:
    """``{name: size in bytes}`` of the committed objects (files) directly under ``dir_uri``, temp files
    excluded (``{}`` if the directory does not exist); sub-directories are not listed."""
    sizes = backend_for(dir_uri).list_sizes(dir_uri)
    return {n: s for n, s in sorted(sizes.items()) if TEMP_MARK not in n}


def list_glob(dir_uri: str, pattern: str) -> list[str]:
    """Sorted paths (relative to ``dir_uri``, ``/``-separated) of the objects below ``dir_uri`` that
    match the glob ``pattern`` (``*`` does not cross ``/``), e.g. ``"*/_SUCCESS.json"``: one listing on
    backends that can (local ``glob``, GCS ``match_glob``) instead of one request per sub-directory.
    Temp files excluded."""
    names = backend_for(dir_uri).list_glob(dir_uri, pattern)
    return sorted(n for n in names if TEMP_MARK not in n.rsplit("/", 1)[-1])


def move(src: str, dst: str) -> None:
    """Move the object ``src`` to ``dst`` (same backend): locally an atomic rename (the target's
    directory is created and fsync'ed); on GCS a server-side copy then a delete.

    Raises:
        FileNotFoundError: ``src`` does not exist.
        StorageError: ``src`` and ``dst`` belong to different backends, either is malformed for its
            scheme (refused before anything is read), or the backend failed.
    """
    backend = backend_for(src)
    if backend_for(dst) is not backend:
        raise StorageError(f"{src} -> {dst}: a move stays within one storage backend")
    backend.normalize(src), backend.normalize(dst)  # a malformed URI is refused before any I/O
    backend.move(src, dst)


def copy(src: str, dst: str) -> None:
    """Copy the object ``src`` to ``dst`` create-only, within one backend: locally a hard link, on GCS a
    server-side copy that never overwrites.

    Raises:
        FileNotFoundError: ``src`` does not exist.
        AlreadyExistsError: ``dst`` exists with other content.
        StorageError: ``src`` and ``dst`` belong to different backends, either is malformed for its
            scheme (refused before anything is read), or the backend failed.
    """
    backend = backend_for(src)
    if backend_for(dst) is not backend:
        raise StorageError(f"{src} -> {dst}: a copy stays within one storage backend")
    backend.normalize(src), backend.normalize(dst)  # a malformed URI is refused before any I/O
    backend.copy(src, dst)


def content_tag(uri: str) -> str | None:
    """A version tag of the object ``uri`` that changes whenever its bytes change (local: size, mtime,
    inode; GCS: generation and CRC32C), or ``None`` when the backend cannot tell.

    Raises:
        FileNotFoundError: ``uri`` does not exist.
    """
    return backend_for(uri).content_tag(uri)


def delete(uri: str) -> None:
    """Delete ``uri`` if it exists."""
    backend_for(uri).delete(uri)


def clean_temp(dir_uri: str, older_than_seconds: float = 0.0) -> int:
    """Remove temp files left under ``dir_uri`` by a killed writer; returns how many were removed
    (always ``0`` on GCS, whose uploads are atomic). ``older_than_seconds`` > 0: only those last
    modified at least that long ago, so the in-flight commit of another live writer of the same directory
    (work stealing: several workers commit into one shard) is left alone."""
    return backend_for(dir_uri).clean_temp(dir_uri, TEMP_MARK, older_than_seconds)


def arrow_filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem and path for reading ``uri`` with pyarrow (Parquet/JSON readers)."""
    return backend_for(uri).arrow_filesystem(uri)


def makedirs(dir_uri: str) -> None:
    """Create a local directory (no-op on object stores, which have no directories)."""
    backend_for(dir_uri).makedirs(dir_uri)
