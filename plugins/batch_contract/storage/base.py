"""The storage backend interface: what one URI scheme must provide to :mod:`batch_contract.storage`.

A backend is an object (usually one instance per process) that implements :class:`StorageBackend` for
the URIs of its scheme(s). :mod:`batch_contract.storage` finds it with ``backend_for(uri)``: callers never
test a scheme themselves. See ``docs/extending.md`` (section "Storage scheme") for a skeleton.
"""

from __future__ import annotations

import fnmatch
import posixpath
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs

ARROW_COPY_CHUNK_BYTES = 64 << 20
"""Buffer size in bytes of the streamed copy made by :meth:`StorageBackend.localize` (never a whole file
in memory)."""


class AlreadyExistsError(FileExistsError):
    """A create-only write found the object already committed (and with different content)."""


class StorageError(OSError):
    """A storage operation failed; the message names the URI (never credentials)."""


class InputRefusedError(StorageError):
    """An input object (or a directory above it) lies outside the allowed input roots once resolved
    (locally: after following symbolic links), or is not a regular file. The message names the object
    as the caller named it (or as a listing found it), never the roots nor where a link points."""


class StorageBackend(ABC):
    """One storage scheme (``file``, ``gs``, ...) behind the :mod:`batch_contract.storage` functions.

    URIs handed to a backend always belong to it (the registry dispatched them by scheme). Listing
    methods return raw names: :mod:`batch_contract.storage` drops temp files and sorts. Errors: a missing
    object raises ``FileNotFoundError`` where documented; a create-only conflict
    :class:`AlreadyExistsError`; any other failure :class:`StorageError` naming the URI (never
    credentials).

    Class attributes:
        scheme: the URI scheme this backend is registered under, for messages (``"file"``, ``"gs"``).
        shared: whether a URI names the same object from every machine (Kubernetes pods included); the
            kubernetes runner refuses input and output URIs whose backend is not shared, and the iceberg
            publish backend a shared output root without a PostgreSQL catalog.
        arrow_filesystem_required: whether a library that opens this scheme's URIs with a client of its
            own (pyiceberg's FileIO) must be handed :meth:`arrow_filesystem` instead, because this
            backend's client carries settings the library's does not read (GCS: the emulator host and
            ``BATCH_GCS_CREDENTIALS_JSON``). ``False``: the library's own client reaches the same objects.
        config_envs: names of the plain (non-secret) environment variables this backend reads for its
            settings (an emulator or custom endpoint, region, account), which a worker container must be
            handed (:func:`batch_contract.storage.config_env_names`); credentials are not listed.
    """

    scheme: str = ""
    shared: bool = False
    arrow_filesystem_required: bool = False
    config_envs: tuple[str, ...] = ()

    # ------------------------------------------------------------------ objects (must be implemented)

    @abstractmethod
    def read_bytes(self, uri: str) -> bytes:
        """The whole object. Raises ``FileNotFoundError`` if absent."""

    @abstractmethod
    def write_create_only(self, uri: str, data: bytes) -> None:
        """Commit ``data`` at ``uri`` so it becomes visible only complete; never overwrite.

        Raises:
            AlreadyExistsError: ``uri`` exists with other content (the same content is a no-op success,
                which resolves a retried commit whose first reply was lost).
        """

    @abstractmethod
    def write_replace(self, uri: str, data: bytes) -> None:
        """Atomically create or replace the small object ``uri`` (readers see the old or the new bytes)."""

    @abstractmethod
    def exists(self, uri: str) -> bool:
        """Whether the object ``uri`` exists."""

    @abstractmethod
    def list_names(self, dir_uri: str) -> list[str]:
        """Names directly under ``dir_uri`` (objects and sub-directories, no trailing ``/``, any order);
        ``[]`` when nothing is there."""

    @abstractmethod
    def list_sizes(self, dir_uri: str) -> dict[str, int]:
        """``{name: size in bytes}`` of the objects directly under ``dir_uri`` (no sub-directories)."""

    def list_glob(self, dir_uri: str, pattern: str) -> list[str]:
        """Paths (relative to ``dir_uri``, ``/``-separated, any order) of the objects below it matching
        the glob ``pattern`` (``*`` does not cross ``/``). Default: one :meth:`list_names` per directory
        level the pattern walks and one :meth:`list_sizes` for the last; a backend with a cheaper
        listing (one request for the whole pattern) overrides it."""
        head, _, rest = pattern.partition("/")
        if not rest:
            return [n for n in self.list_sizes(dir_uri) if fnmatch.fnmatchcase(n, head)]
        out: list[str] = []
        for name in self.list_names(dir_uri):
            if fnmatch.fnmatchcase(name, head):
                out += [f"{name}/{sub}" for sub in self.list_glob(f"{dir_uri.rstrip('/')}/{name}", rest)]
        return out

    def list_tree(self, dir_uri: str, roots: Sequence[str] | None = None) -> list[str]:
        """Paths, in :meth:`arrow_filesystem`'s terms, of every file below ``dir_uri`` (recursively; any
        order; ``[]`` when nothing is there). Default: one recursive pyarrow listing; object stores have
        no directories to refuse, so ``roots`` is not used here (callers check each object with
        :meth:`is_under`). A backend with links overrides it to refuse a directory outside ``roots``.

        Args:
            dir_uri: the directory (or object prefix).
            roots: roots of this backend the directories must lie under; ``None``: no check.

        Raises:
            InputRefusedError: (backends with links) a directory of the tree resolves outside ``roots``.
        """
        fs, base = self.arrow_filesystem(dir_uri.rstrip("/") + "/")
        infos = fs.get_file_info(pafs.FileSelector(base.rstrip("/"), recursive=True, allow_not_found=True))
        return [i.path for i in infos if i.type == pafs.FileType.File]

    def open_input(self, uri: str, roots: Sequence[str] | None = None, *,
                   random_access: bool = True) -> pa.NativeFile:
        """Open the object ``uri`` for reading, after checking it lies under one of ``roots``.

        Default: the :meth:`is_under` check, then :meth:`arrow_filesystem`'s ``open_input_file``
        (``random_access``) or ``open_input_stream``.

        Args:
            uri: the object.
            roots: roots of this backend; ``None``: no check (an empty list refuses everything).
            random_access: a seekable file (Parquet) rather than a stream (JSONL).

        Raises:
            InputRefusedError: ``uri`` lies outside every root.
            FileNotFoundError / StorageError: the object could not be opened.
        """
        if roots is not None and not any(self.is_under(uri, root) for root in roots):
            raise InputRefusedError(f"{uri}: lies outside the allowed input locations")
        fs, path = self.arrow_filesystem(uri)
        return fs.open_input_file(path) if random_access else fs.open_input_stream(path)

    @abstractmethod
    def delete(self, uri: str) -> None:
        """Delete ``uri`` if it exists (a missing object is not an error)."""

    @abstractmethod
    def move(self, src: str, dst: str) -> None:
        """Move the object ``src`` to ``dst`` (both of this backend). Raises ``FileNotFoundError`` if
        ``src`` does not exist."""

    @abstractmethod
    def arrow_filesystem(self, uri: str) -> tuple[pafs.FileSystem, str]:
        """A pyarrow filesystem and the path of ``uri`` in it (for pyarrow's Parquet/JSON readers)."""

    # ---------------------------------------------------------------------- paths (defaults provided)

    def uri_from_arrow_path(self, path: str) -> str:
        """The URI of ``path``, a path of this backend's :meth:`arrow_filesystem` (its inverse; used
        when a pyarrow listing names files). Default: ``<scheme>://<path>``."""
        return f"{self.scheme}://{path}"

    def local_path(self, uri: str) -> Path | None:
        """The local file system path holding ``uri``, or ``None`` when the object is not a local file
        (then callers read it through :meth:`read_bytes` / :meth:`arrow_filesystem`). Default ``None``."""
        return None

    def normalize(self, uri: str) -> str:
        """Canonical form of ``uri`` for comparisons (the allow-list): default ``scheme://`` followed by
        the path with ``.``/``..`` segments collapsed, no trailing ``/``.

        Raises:
            StorageError: ``uri`` is malformed for this scheme.
        """
        _, _, rest = uri.partition("://")
        path = posixpath.normpath("/" + rest).lstrip("/")
        return f"{self.scheme}://{path}".rstrip("/")

    def is_under(self, uri: str, root: str) -> bool:
        """Whether ``uri`` is ``root`` or lies inside it (whole path segments), both of this backend.
        Default: compares the :meth:`normalize` forms.

        Raises:
            StorageError: either is malformed for this scheme.
        """
        return is_segment_prefix(self.normalize(uri), self.normalize(root), "/")

    def localize(self, uri: str, dest: Path) -> str:
        """A local file path holding the bytes of the object ``uri`` (DuckDB reads local files only).

        Default: :meth:`local_path` when the object is a local file already (``dest`` untouched), else a
        streamed copy to ``dest`` (its parent created; :data:`ARROW_COPY_CHUNK_BYTES` buffers) through
        :meth:`arrow_filesystem`.

        Args:
            uri: the object.
            dest: where a copy goes when one is needed; the caller removes it.

        Returns:
            The local path, as a string.

        Raises:
            FileNotFoundError / StorageError: the object could not be read.
        """
        path = self.local_path(uri)
        if path is not None:
            return str(path.resolve())
        dest.parent.mkdir(parents=True, exist_ok=True)
        fs, src = self.arrow_filesystem(uri)
        pafs.copy_files(src, str(dest), source_filesystem=fs, destination_filesystem=pafs.LocalFileSystem(),
                        chunk_size=ARROW_COPY_CHUNK_BYTES)
        return str(dest)

    # ---------------------------------------------------------------- housekeeping (defaults provided)

    def clean_temp(self, dir_uri: str, temp_mark: str, older_than_seconds: float = 0.0) -> int:
        """Remove temp objects (names starting with ``temp_mark``) left under ``dir_uri`` by a killed
        writer, only those modified at least ``older_than_seconds`` ago when it is > 0; returns how many
        were removed. Default ``0``: a backend whose uploads are atomic leaves no partial objects."""
        return 0

    def makedirs(self, dir_uri: str) -> None:
        """Create the directory ``dir_uri`` and its parents. Default: no-op (object stores have no
        directories)."""
        return None

    def copy(self, src: str, dst: str) -> None:
        """Copy the object ``src`` to ``dst`` create-only (the same backend). Default: read ``src``
        whole and :meth:`write_create_only` it (the objects copied are part files, tens of MB at most).

        Raises:
            FileNotFoundError: ``src`` does not exist.
            AlreadyExistsError: ``dst`` exists with other content.
        """
        self.write_create_only(dst, self.read_bytes(src))

    def content_tag(self, uri: str) -> str | None:
        """A short string that changes whenever the object's bytes change (a version tag, not a hash
        of the content), or ``None`` when the backend cannot tell (default). Shard carry-over
        (:mod:`batch_contract.carryover`) treats ``None`` as "unknown": that input is never carried over.

        Raises:
            FileNotFoundError: ``uri`` does not exist.
        """
        return None


def is_segment_prefix(location: str, root: str, sep: str) -> bool:
    """Whether ``location`` equals ``root`` or starts with ``root`` + ``sep`` (whole path segments:
    ``/data/in`` is under ``/data`` but ``/database`` is not). Both must be normalized already."""
    return location == root or location.startswith(root.rstrip(sep) + sep)
