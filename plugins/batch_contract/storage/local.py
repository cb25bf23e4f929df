"""Local disk backend: plain paths and ``file://`` URIs.

Create-only commits write a temp file (name starting with :data:`~batch_contract.layout.TEMP_MARK`),
fsync it, hard-link it to its final name (``link`` fails if the name exists) and fsync the directory;
replaces use ``os.replace``. A killed writer may leave temp files: :meth:`LocalBackend.clean_temp`.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs

from batch_contract.layout import TEMP_MARK
from batch_contract.storage.base import (
    AlreadyExistsError,
    InputRefusedError,
    StorageBackend,
    StorageError,
    is_segment_prefix,
)

HASH_TAG_MAX_BYTES = 256 << 20
"""Local files up to this size (bytes) get a content hash as their version tag; larger ones a stat tag."""

FILE_PREFIX = "file://"


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


class LocalBackend(StorageBackend):
    """Files on a local (or mounted) file system, named by a path or a ``file://`` URI.

    Not ``shared``: another machine (a Kubernetes pod) does not see the same files. Not
    ``arrow_filesystem_required``: any library's local file access reaches the same files.
    """

    scheme = "file"
    shared = False
    arrow_filesystem_required = False

    def path(self, uri: str) -> Path:
        """The path named by ``uri`` (``file://`` stripped; not resolved).

        Raises:
            StorageError: ``uri`` is a URI of another scheme, or holds a NUL byte (no file system path
                can: the OS calls would raise ``ValueError``).
        """
        if "\x00" in uri:
            raise StorageError(f"{uri!r}: a path cannot contain a NUL byte")
        if uri[:len(FILE_PREFIX)].lower() == FILE_PREFIX:  # FILE:// is file://, as scheme_of dispatches it
            return Path(uri[len(FILE_PREFIX) :])
        if "://" in uri:
            raise StorageError(f"{uri}: not a local path or file:// URI")
        return Path(uri)

    def local_path(self, uri: str) -> Path:
        """Same as :meth:`path`: every object of this backend is a local file."""
        return self.path(uri)

    def read_bytes(self, uri: str) -> bytes:
        """The file's bytes. Raises ``FileNotFoundError`` if absent."""
        return self.path(uri).read_bytes()

    def write_create_only(self, uri: str, data: bytes) -> None:
        """Temp file + fsync + ``link`` to the final name + directory fsync.

        Raises:
            AlreadyExistsError: the file exists with other content (same content: no-op).
        """
        final = self.path(uri)
        tmp = _write_temp(final, data)
        try:
            os.link(tmp, final)
        except FileExistsError:
            if final.read_bytes() != data:
                raise AlreadyExistsError(f"{uri} already exists with other content") from None
        finally:
            tmp.unlink(missing_ok=True)
        _fsync_dir(final.parent)

    def write_replace(self, uri: str, data: bytes) -> None:
        """Temp file + fsync + ``os.replace`` + directory fsync."""
        final = self.path(uri)
        tmp = _write_temp(final, data)
        os.replace(tmp, final)
        _fsync_dir(final.parent)

    def exists(self, uri: str) -> bool:
        """Whether the path exists (file or directory)."""
        return self.path(uri).exists()

    def list_names(self, dir_uri: str) -> list[str]:
        """``iterdir`` names (files and sub-directories); ``[]`` when the directory does not exist."""
        path = self.path(dir_uri)
        return [p.name for p in path.iterdir()] if path.is_dir() else []

    def list_sizes(self, dir_uri: str) -> dict[str, int]:
        """``{name: st_size}`` of the files (not sub-directories); ``{}`` when the directory is absent."""
        path = self.path(dir_uri)
        return {p.name: p.stat().st_size for p in path.iterdir() if p.is_file()} if path.is_dir() else {}

    def list_glob(self, dir_uri: str, pattern: str) -> list[str]:
        """``Path.glob`` of the files matching ``pattern`` below the directory (``[]`` if absent)."""
        path = self.path(dir_uri)
        return [p.relative_to(path).as_posix() for p in path.glob(pattern) if p.is_file()] if path.is_dir() else []

    def list_tree(self, dir_uri: str, roots: Sequence[str] | None = None) -> list[str]:
        """Paths of every file below the directory (its resolved path, as :meth:`arrow_filesystem`
        names it), following symbolic links to files and directories; each real directory is listed once
        (a link loop, or two links to one directory, cannot repeat or multiply the tree). ``[]`` when the
        directory does not exist. Entries that cannot be stat'ed (a dangling link) are skipped.

        Args:
            dir_uri: the directory.
            roots: roots the real path of every directory walked must lie under (checked before it is
                listed, so nothing outside is ever listed); ``None``: no check.

        Raises:
            InputRefusedError: a directory of the tree resolves outside ``roots`` (the message names
                the directory as ``dir_uri`` + its path below it, not the roots nor a link's target).
            OSError: a directory could not be listed (permissions).
        """
        base = self.path(dir_uri).resolve()
        if not base.is_dir():
            return []
        real_roots = None if roots is None else [self.normalize(r) for r in roots]
        out: list[str] = []
        seen: set[tuple[int, int]] = set()
        stack = [(str(base), dir_uri.rstrip("/") or dir_uri)]  # (path walked, path as the caller named it)
        while stack:
            directory, shown = stack.pop()
            if real_roots is not None and not _under_any(os.path.realpath(directory), real_roots):
                raise InputRefusedError(f"{shown}: a directory that resolves outside the allowed input "
                                        "locations (a symbolic link out of the input tree?)")
            st = os.stat(directory)
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            with os.scandir(directory) as entries:
                for entry in entries:
                    try:
                        if entry.is_dir():
                            stack.append((entry.path, f"{shown}/{entry.name}"))
                        elif entry.is_file():
                            out.append(entry.path)
                    except OSError:  # a link loop (ELOOP) or an entry removed meanwhile
                        continue
        return out

    def open_input(self, uri: str, roots: Sequence[str] | None = None, *,
                   random_access: bool = True) -> pa.NativeFile:
        """Open the file for reading, checking the file actually opened: the path is opened first
        (non-blocking, so a FIFO cannot hang the reader) and must be a regular file; its real path is read
        back from the open descriptor (``/proc/self/fd/<fd>``; without ``/proc``, ``os.path.realpath``)
        and must lie under one of ``roots``; the returned pyarrow file is opened through that descriptor
        (without ``/proc``: at the real path) and must be the same inode. Replacing the path by a
        symbolic link at any moment therefore cannot redirect the read out of the roots.

        Args:
            uri: the file.
            roots: roots its real path must lie under; ``None``: no roots check.
            random_access: unused locally (the file is seekable either way).

        Raises:
            InputRefusedError: the file resolves outside ``roots``, or is not a regular file.
            FileNotFoundError / OSError: it could not be opened.
        """
        path = self.path(uri)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise InputRefusedError(f"{uri}: not a regular file")
            proc = f"/proc/self/fd/{fd}"
            try:
                real = os.readlink(proc)
            except OSError:  # no /proc: the real path, checked below against the open file's inode
                proc, real = "", os.path.realpath(path)
            if roots is not None and not _under_any(real, [self.normalize(r) for r in roots]):
                raise InputRefusedError(f"{uri}: resolves outside the allowed input locations "
                                        "(a symbolic link out of the input tree?)")
            handle = pa.OSFile(proc or real)
        finally:
            os.close(fd)
        if not os.path.samestat(st, os.fstat(handle.fileno())):
            handle.close()
            raise InputRefusedError(f"{uri}: changed while being opened")
        return handle

    def delete(self, uri: str) -> None:
        """Unlink the file if it exists."""
        try:
            self.path(uri).unlink()
        except FileNotFoundError:
            pass

    def copy(self, src: str, dst: str) -> None:
        """A hard link (free, atomic, create-only) when both paths are on one file system, else the
        default read + create-only write; the target's directory is created and fsync'ed.

        Raises:
            FileNotFoundError: ``src`` does not exist.
            AlreadyExistsError: ``dst`` exists with other content.
        """
        source, target = self.path(src), self.path(dst)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source, target)
        except FileExistsError:
            if not target.samefile(source) and target.read_bytes() != source.read_bytes():
                raise AlreadyExistsError(f"{dst} already exists with other content") from None
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                raise
            super().copy(src, dst)
            return
        _fsync_dir(target.parent)

    def content_tag(self, uri: str) -> str | None:
        """``size=<bytes>;sha256=<hex>`` for a file up to :data:`HASH_TAG_MAX_BYTES` (hashed: about
        1 s per GB), else ``size=<bytes>;mtime_ns=<ns>;ino=<inode>``: a rewrite in place changes the
        mtime and a replace by rename the inode (the rule ``make`` and ``rsync`` use; a tool that
        restores an old mtime on purpose defeats it). ``None`` ("cannot tell") for anything but a regular
        file (a FIFO or a device such as ``/dev/zero`` behind a link), which is never read. The size and
        the hash are those of the one file opened.

        Raises:
            FileNotFoundError: ``uri`` does not exist.
        """
        fd = os.open(self.path(uri), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None
            if st.st_size > HASH_TAG_MAX_BYTES:
                return f"size={st.st_size};mtime_ns={st.st_mtime_ns};ino={st.st_ino}"
            digest = hashlib.sha256()
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
        return f"size={st.st_size};sha256={digest.hexdigest()}"

    def move(self, src: str, dst: str) -> None:
        """Atomic rename; the target's directory is created and fsync'ed.

        Raises:
            FileNotFoundError: ``src`` does not exist.
        """
        target = self.path(dst)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self.path(src), target)
        _fsync_dir(target.parent)

    def arrow_filesystem(self, uri: str) -> tuple[pafs.FileSystem, str]:
        """``LocalFileSystem`` and the absolute (resolved) path."""
        return pafs.LocalFileSystem(), str(self.path(uri).resolve())

    def uri_from_arrow_path(self, path: str) -> str:
        """The path itself (local URIs are plain paths)."""
        return path

    def normalize(self, uri: str) -> str:
        """``os.path.realpath`` of the path: absolute, symlinks of existing parts resolved, ``..``
        collapsed, ``file://`` stripped.

        Raises:
            StorageError: ``uri`` is a URI of another scheme.
        """
        return os.path.realpath(self.path(uri))

    def is_under(self, uri: str, root: str) -> bool:
        """Whether the real path of ``uri`` is ``root``'s or inside it (whole path segments)."""
        return is_segment_prefix(self.normalize(uri), self.normalize(root), os.sep)

    def clean_temp(self, dir_uri: str, temp_mark: str, older_than_seconds: float = 0.0) -> int:
        """Unlink the files directly under ``dir_uri`` whose name starts with ``temp_mark`` (with
        ``older_than_seconds`` > 0: only those whose mtime is at least that many seconds old)."""
        path = self.path(dir_uri)
        removed = 0
        cutoff = time.time() - older_than_seconds
        if path.is_dir():
            for p in path.iterdir():
                if p.name.startswith(temp_mark):
                    try:
                        if older_than_seconds > 0 and p.stat().st_mtime > cutoff:
                            continue  # another live writer's commit in flight
                        p.unlink()
                        removed += 1
                    except OSError as exc:  # pragma: no cover - racing cleaner
                        if exc.errno != errno.ENOENT:
                            raise
        return removed

    def makedirs(self, dir_uri: str) -> None:
        """``mkdir -p``."""
        self.path(dir_uri).mkdir(parents=True, exist_ok=True)


def _under_any(real: str, real_roots: Sequence[str]) -> bool:
    """Whether the resolved path ``real`` is one of the resolved ``real_roots`` or inside one."""
    return any(is_segment_prefix(real, root, os.sep) for root in real_roots)
