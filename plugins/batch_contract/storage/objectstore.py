"""Rules shared by the object-store backends whose URIs are ``<scheme>://<bucket>/<key>`` (``s3://``,
``az://``): splitting and normalizing URIs, glob listings, and the read-back that resolves a create-only
write whose reply was lost.

The read-back rule (the same as ``gs://``'s, see :mod:`batch_contract.gcs`): a conditional create
(``If-None-Match: *``) that is refused, or that failed in a way after which the bytes may have landed,
is resolved by looking at what is there. The writer stores the SHA-256 of the bytes in the object's user
metadata (:data:`SHA256_METADATA`); the read-back compares the size, then that digest, and only for an
object written without it (by another tool) the bytes themselves, :data:`COMPARE_PIECE_BYTES` at a time.
An entity tag is not used: with server-side encryption (SSE-KMS) or multipart uploads it is not an MD5
of the bytes.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass

from batch_contract.storage.base import StorageError

SHA256_METADATA = "sha256"
"""User-metadata key holding the hex SHA-256 of an object's bytes, set by every create-only write
(S3: header ``x-amz-meta-sha256``; Azure: ``x-ms-meta-sha256``)."""
COMPARE_PIECE_BYTES = 8 * 2**20
"""Bytes per ranged read when a read-back must compare bytes (an object with no SHA-256 metadata)."""


def sha256_hex(data: bytes) -> str:
    """Hex SHA-256 of ``data`` (64 lower-case characters), the value stored under :data:`SHA256_METADATA`."""
    return hashlib.sha256(data).hexdigest()


REFUSED_SEGMENTS = frozenset({"", ".", ".."})
"""Path segments refused in a bucket or key: an HTTP client or server may collapse ``.``/``..`` in a
request path (``/inputs/../secrets/x`` reaches bucket ``secrets``) and ``a//b`` is another object
than ``a/b``, so a URI holding one could name an object other than the one an allow-list check saw."""


def split_uri(uri: str, scheme: str, container_word: str = "bucket") -> tuple[str, str]:
    """Split ``<scheme>://bucket/key`` into ``(bucket, key)``; ``key`` may be ``""`` (the bucket root) and
    may end with ``/`` (a directory prefix). The scheme matches in any case (``S3://`` is ``s3://``).

    Args:
        uri: the URI.
        scheme: its expected scheme, lower case, without ``://`` (``"s3"``).
        container_word: what the store calls a bucket, for messages (``"container"`` on Azure).

    Raises:
        StorageError: ``uri`` is not of ``scheme``, names no bucket, or its bucket or key holds a
            segment of :data:`REFUSED_SEGMENTS` (``..``, ``.``, or an empty one as in ``a//b``).
    """
    prefix = f"{scheme}://"
    if uri[:len(prefix)].lower() != prefix:
        raise StorageError(f"{uri}: not a {prefix} URI")
    bucket, _, key = uri[len(prefix):].partition("/")
    if not bucket:
        raise StorageError(f"{uri}: no {container_word} name (expected {prefix}{container_word}/prefix)")
    segments = [bucket, *(key[:-1] if key.endswith("/") else key).split("/")] if key else [bucket]
    bad = next((s for s in segments if s in REFUSED_SEGMENTS), None)
    if bad is not None:
        raise StorageError(f"{uri}: {'an empty' if not bad else repr(bad)} path segment; {prefix} URIs must "
                           "name each object plainly (no '.', '..' or '//'), as a client may resolve them to "
                           f"another object or {container_word}")
    return bucket, key


def object_key(uri: str, scheme: str, container_word: str = "bucket") -> tuple[str, str]:
    """``(bucket, key)`` of an object URI: like :func:`split_uri`, and the key must name an object.

    Raises:
        StorageError: not of ``scheme``, no bucket, or no object name (``s3://b`` or ``s3://b/dir/``).
    """
    bucket, key = split_uri(uri, scheme, container_word)
    if not key or key.endswith("/"):
        raise StorageError(f"{uri}: an object URI needs a name after the {container_word} "
                           f"({scheme}://{container_word}/name)")
    return bucket, key


def dir_prefix(key: str) -> str:
    """The listing prefix of the "directory" ``key``: ``"a/b"`` -> ``"a/b/"``, ``""`` -> ``""``."""
    return f"{key.rstrip('/')}/" if key.strip("/") else ""


def normalize(uri: str, scheme: str, container_word: str = "bucket") -> str:
    """Canonical form of ``uri``: lower-case scheme, no trailing ``/`` (``S3://b/a/`` -> ``s3://b/a``).
    Nothing is collapsed: a URI with a dot or empty segment is refused (:func:`split_uri`).

    Raises:
        StorageError: not of ``scheme``, no bucket name, or a refused segment.
    """
    bucket, key = split_uri(uri, scheme, container_word)
    return f"{scheme}://{bucket}/{key}".rstrip("/")


def glob_regex(pattern: str) -> re.Pattern[str]:
    """The compiled regex of the glob ``pattern`` in which ``*`` does not cross ``/``
    (``"*/_SUCCESS.json"`` matches ``"00001/_SUCCESS.json"``, not ``"a/b/_SUCCESS.json"``)."""
    return re.compile(fnmatch.translate(pattern).replace(".*", "[^/]*"))


@dataclass(frozen=True)
class ObjectStat:
    """What a read-back needs of a committed object.

    Attributes:
        size: bytes.
        sha256: the hex digest of its :data:`SHA256_METADATA` user metadata, ``None`` when absent.
        version: an opaque version (entity tag) that ranged reads pin, so the bytes compared all come
            from one version of the object.
    """

    size: int
    sha256: str | None
    version: str


def same_content(stat: ObjectStat | None, data: bytes, read_range: Callable[[int, int, str], bytes]) -> bool | None:
    """Whether the committed object described by ``stat`` holds exactly ``data``; ``None`` when there is
    no object (``stat`` is ``None``).

    A size other than ``len(data)`` is a mismatch; else the SHA-256 metadata decides when present; else
    the bytes are read with ``read_range(start, end_inclusive, version)`` :data:`COMPARE_PIECE_BYTES` at a
    time and compared piece by piece (a big object is never held in memory twice).
    """
    if stat is None:
        return None
    if stat.size != len(data):
        return False
    if stat.sha256:
        return stat.sha256.lower() == sha256_hex(data)
    view = memoryview(data)
    for start in range(0, len(data), COMPARE_PIECE_BYTES):
        end = min(start + COMPARE_PIECE_BYTES, len(data)) - 1
        if read_range(start, end, stat.version) != view[start:end + 1]:
            return False
    return True
