"""``s3://`` backend of :mod:`batch_contract.storage` (boto3 + pyarrow ``S3FileSystem``): Amazon S3 and
S3-compatible stores (MinIO, Ceph RGW, R2, moto) reached through a custom endpoint.

:class:`S3Backend` is registered for ``s3`` in :data:`batch_contract.storage.BACKENDS`; boto3 is imported on
the first ``s3://`` URI, and a missing install raises :class:`~batch_contract.storage.StorageError`
saying what to install.

Semantics (the same guarantees as ``gs://``, see ``docs/storage.md``):

* **Create-only commits** (:func:`write_create_only`): a conditional write with ``If-None-Match: *``
  (S3 conditional writes, 2024): one ``PutObject`` up to :data:`MULTIPART_THRESHOLD_BYTES`, else a
  multipart upload of :data:`PART_BYTES` parts whose ``CompleteMultipartUpload`` carries the condition,
  so the object appears whole and only if no object had that name. The SHA-256 of the bytes goes in the
  user metadata (``x-amz-meta-sha256``). A ``412 PreconditionFailed`` means an object is there: it may be
  our own write whose reply was lost and that botocore retried, so it is read back
  (:func:`batch_contract.storage.objectstore.same_content`): our bytes -> success, other bytes ->
  :class:`~batch_contract.storage.AlreadyExistsError`. A failure after which our bytes may have landed
  (connection errors, retries run out, ``NoSuchUpload`` for a multipart upload that a lost reply had
  already completed) is read back the same way. A 409 ``ConditionalRequestConflict`` (a concurrent
  conditional write to the same key) is retried :data:`CONFLICT_ATTEMPTS` times, then read back. A
  failed multipart upload is aborted, so no parts stay billed (a killed process can still leave some:
  set the bucket lifecycle rule ``AbortIncompleteMultipartUpload``).
* **Retries**: botocore's ``standard`` retry mode (throttling errors and 429, 500, 502, 503, 504,
  connection resets and timeouts; exponential backoff with full jitter, base 1 s, ceiling 20 s) with
  :data:`MAX_ATTEMPTS` attempts per call. Every call is safe to repeat: a repeated conditional write is
  resolved by the read-back above.
* **Replace** (:func:`write_replace`): an unconditional ``PutObject`` (S3 has no per-object write rate
  limit, unlike GCS).
* **Credentials**: boto3's default chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/
  ``AWS_SESSION_TOKEN``, ``AWS_PROFILE`` and the shared config files, EKS IRSA's
  ``AWS_WEB_IDENTITY_TOKEN_FILE`` + ``AWS_ROLE_ARN``, EKS Pod Identity, the instance metadata service);
  pyarrow's reader uses the AWS SDK's chain, which reads the same sources. Never from Params; never
  logged: messages name URIs, S3 error codes and HTTP statuses only.
* **Endpoint**: ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` (``http://127.0.0.1:9000``) for an
  S3-compatible store; it is also handed to pyarrow. Region: ``AWS_REGION`` or ``AWS_DEFAULT_REGION``
  (default ``us-east-1``). With a custom endpoint, path-style addressing (``host/bucket/key``).
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from typing import Any

import pyarrow.fs as pafs

from batch_contract.storage import objectstore
from batch_contract.storage.base import AlreadyExistsError, StorageBackend, StorageError, is_segment_prefix

log = logging.getLogger(__name__)

SCHEME = "s3"
ENDPOINT_ENVS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
"""Env vars naming a custom endpoint, the first set wins (boto3's own names for the setting)."""
REGION_ENVS = ("AWS_REGION", "AWS_DEFAULT_REGION")
"""Env vars naming the region, the first set wins."""
DEFAULT_REGION = "us-east-1"
"""Region when none is set (S3 redirects other regions' buckets for boto3; pyarrow resolves them)."""
CONFIG_ENVS = (*ENDPOINT_ENVS, *REGION_ENVS)
"""The plain (non-secret) settings of this backend a worker pod must be given."""

MAX_ATTEMPTS = 8
"""Attempts per call, first included (botocore ``standard`` mode; its default is 3, too few for a
throttling storm on a busy prefix)."""
CONNECT_TIMEOUT_S = 10.0
"""Seconds to open a connection."""
READ_TIMEOUT_S = 120.0
"""Seconds of silence on a socket before a read is abandoned (and retried)."""
MULTIPART_THRESHOLD_BYTES = 64 * 2**20
"""Objects larger than this (bytes) go up as a multipart upload; S3 takes 5 GiB in one PUT, but a
failed 64 MiB part is cheaper to resend than a whole part file."""
PART_BYTES = 64 * 2**20
"""Bytes per part of a multipart upload (S3: at least 5 MiB except the last, at most 10,000 parts)."""
LIST_PAGE_SIZE = 1000
"""Keys per ``ListObjectsV2`` request (the S3 maximum)."""
CONFLICT_ATTEMPTS = 5
"""Uploads of one create-only write, first included, while S3 answers 409 ``ConditionalRequestConflict``
(another conditional write to the key in flight); then the object is read back."""
CONFLICT_BACKOFF_S = 0.2
"""First backoff ceiling (seconds) after a 409 conflict, doubled per attempt, full jitter: 0.2 s to
1.6 s, a few seconds in all, longer than a conditional write to S3 stays in flight."""

_CONTENT_TYPES = {".json": "application/json", ".html": "text/html", ".parquet": "application/vnd.apache.parquet"}
_MAY_HAVE_LANDED_CODES = {"NoSuchUpload", "RequestTimeout", "InternalError", "ServiceUnavailable", "SlowDown",
                          "ConditionalRequestConflict"}
"""S3 error codes after which a write (ours, or for a conflict the other writer's) may nevertheless have
landed: read back before failing."""

_lock = threading.Lock()
_clients: dict[tuple[Any, ...], Any] = {}
_arrow_filesystems: dict[tuple[Any, ...], pafs.FileSystem] = {}


def _first_env(names: tuple[str, ...]) -> str:
    return next((v.strip() for n in names if (v := os.environ.get(n, "")).strip()), "")


def endpoint_url() -> str:
    """The custom endpoint (``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``), ``""`` for AWS itself."""
    return _first_env(ENDPOINT_ENVS).rstrip("/")


def region() -> str:
    """The region (``AWS_REGION``, ``AWS_DEFAULT_REGION``, else :data:`DEFAULT_REGION`)."""
    return _first_env(REGION_ENVS) or DEFAULT_REGION


def _libs() -> tuple[Any, Any]:
    """``(boto3, botocore)``, or a :class:`StorageError` saying how to install them."""
    try:
        import boto3
        import botocore
        import botocore.config  # noqa: F401 - submodules used below
        import botocore.exceptions  # noqa: F401
    except ImportError as exc:
        raise StorageError("s3:// URIs need boto3: pip install 'boto3>=1.35.50' (part of the 'airflow' and "
                           "'worker' extras)") from exc
    return boto3, botocore


def _cache_key() -> tuple[Any, ...]:
    """What a cached client depends on: the process, the endpoint, the region, the profile, the access
    key id (an identifier, not the secret) and which credential sources are named. The secret key is
    never part of it: a client made for one key id keeps the secret it was made with."""
    named = tuple(n for n in ("AWS_ACCESS_KEY_ID", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_FULL_URI")
                  if os.environ.get(n))
    return (os.getpid(), endpoint_url(), region(), os.environ.get("AWS_PROFILE", ""),
            os.environ.get("AWS_ACCESS_KEY_ID", ""), named)


def client() -> Any:
    """The process's boto3 S3 client for the current environment (cached per process, endpoint, region
    and credential source; rebuilt after ``fork``). Sets ``botocore.credentials`` to WARNING unless a
    level was configured for it."""
    key = _cache_key()
    with _lock:
        cached = _clients.get(key)
    if cached is not None:
        return cached
    boto3, botocore = _libs()
    credentials_log = logging.getLogger("botocore.credentials")
    if credentials_log.level == logging.NOTSET:  # "Found credentials in ...": once per client, every task
        credentials_log.setLevel(logging.WARNING)
    endpoint = endpoint_url()
    config = botocore.config.Config(
        retries={"mode": "standard", "total_max_attempts": MAX_ATTEMPTS},
        connect_timeout=CONNECT_TIMEOUT_S, read_timeout=READ_TIMEOUT_S,
        s3={"addressing_style": "path"} if endpoint else None,
    )
    made = boto3.session.Session().client("s3", region_name=region(), endpoint_url=endpoint or None, config=config)
    with _lock:
        return _clients.setdefault(key, made)


def _failures() -> tuple[type[BaseException], ...]:
    """Exceptions turned into :class:`StorageError`: S3 error replies, transport errors and missing
    credentials."""
    _, botocore = _libs()
    return (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError)


def _code(exc: BaseException) -> str:
    """The S3 error code of a ``ClientError`` (``"NoSuchKey"``, ``"412"``...), ``""`` otherwise."""
    response = getattr(exc, "response", None)
    return str(response.get("Error", {}).get("Code", "")) if isinstance(response, dict) else ""


def _status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return status if isinstance(status, int) else None
    return None


def _is_missing(exc: BaseException) -> bool:
    return _code(exc) in ("NoSuchKey", "404", "NotFound") or _status(exc) == 404 and _code(exc) != "NoSuchBucket"


def _is_precondition(exc: BaseException) -> bool:
    return _code(exc) in ("PreconditionFailed", "412") or _status(exc) == 412


def _may_have_landed(exc: BaseException) -> bool:
    """Whether our bytes may be stored although the call failed: a transport error (the reply was lost),
    retries that ran out on a server error, or a multipart upload a lost reply had completed."""
    _, botocore = _libs()
    if isinstance(exc, botocore.exceptions.BotoCoreError):
        return not isinstance(exc, botocore.exceptions.NoCredentialsError | botocore.exceptions.ParamValidationError)
    status = _status(exc)
    return _code(exc) in _MAY_HAVE_LANDED_CODES or (status is not None and status >= 500)


def _api_error(uri: str, action: str, exc: BaseException) -> StorageError:
    """A :class:`StorageError` naming the URI, the action, the S3 error code and HTTP status (nothing
    else is quoted, so no header, signature or key can reach a log)."""
    code, status = _code(exc), _status(exc)
    detail = type(exc).__name__ + (f" {code}" if code and code not in (str(status), type(exc).__name__) else "") + (
        f" HTTP {status}" if status else "")
    return StorageError(f"{uri}: {action} failed ({detail})")


def _object(uri: str) -> tuple[str, str]:
    return objectstore.object_key(uri, SCHEME)


def _content_type(uri: str) -> str:
    dot = uri.rfind(".")
    return _CONTENT_TYPES.get(uri[dot:].lower(), "application/octet-stream") if dot > 0 else "application/octet-stream"


def _stat(bucket: str, key: str) -> objectstore.ObjectStat | None:
    """Size, SHA-256 metadata and entity tag of the object, ``None`` when there is none.

    Raises:
        botocore exceptions: the request failed after retries.
    """
    try:
        head = client().head_object(Bucket=bucket, Key=key)
    except _failures() as exc:
        if _is_missing(exc):
            return None
        raise
    sha = head.get("Metadata", {}).get(objectstore.SHA256_METADATA)
    return objectstore.ObjectStat(size=int(head["ContentLength"]), sha256=sha, version=head.get("ETag", ""))


def _read_range(bucket: str, key: str) -> Any:
    def read(start: int, end: int, version: str) -> bytes:
        extra = {"IfMatch": version} if version else {}
        return client().get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end}", **extra)["Body"].read()

    return read


def _put(bucket: str, key: str, data: bytes, uri: str) -> None:
    """One conditional ``PutObject`` (raises botocore exceptions)."""
    client().put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*", ContentType=_content_type(uri),
                        Metadata={objectstore.SHA256_METADATA: objectstore.sha256_hex(data)})


def _multipart(bucket: str, key: str, data: bytes, uri: str) -> None:
    """A multipart upload of :data:`PART_BYTES` parts completed with ``If-None-Match: *``; aborted when
    it fails (raises botocore exceptions)."""
    s3 = client()
    upload = s3.create_multipart_upload(Bucket=bucket, Key=key, ContentType=_content_type(uri),
                                        Metadata={objectstore.SHA256_METADATA: objectstore.sha256_hex(data)})
    upload_id = upload["UploadId"]
    try:
        view = memoryview(data)
        parts = []
        for number, start in enumerate(range(0, len(data), PART_BYTES), start=1):
            reply = s3.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number,
                                   Body=bytes(view[start:start + PART_BYTES]))
            parts.append({"PartNumber": number, "ETag": reply["ETag"]})
        s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id, IfNoneMatch="*",
                                     MultipartUpload={"Parts": parts})
    except BaseException:
        try:
            s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
        except _failures():  # already completed or gone: nothing to abort
            pass
        raise


def _is_conflict(exc: BaseException) -> bool:
    """S3's 409 ``ConditionalRequestConflict``: another conditional write to the key is in flight."""
    return _code(exc) == "ConditionalRequestConflict"


def _upload(bucket: str, key: str, data: bytes, uri: str) -> None:
    """:func:`_put` or :func:`_multipart` by size, repeated on ``ConditionalRequestConflict`` up to
    :data:`CONFLICT_ATTEMPTS` times in all, with full-jitter backoff from :data:`CONFLICT_BACKOFF_S`
    doubling (AWS: "On a 409 failure you should retry the upload"; botocore's retry modes do not
    retry it). Raises the last botocore exception."""
    upload = _put if len(data) <= MULTIPART_THRESHOLD_BYTES else _multipart
    for attempt in range(1, CONFLICT_ATTEMPTS + 1):
        try:
            upload(bucket, key, data, uri)
            return
        except _failures() as exc:
            if not _is_conflict(exc) or attempt == CONFLICT_ATTEMPTS:
                raise
            log.info("%s: conditional write conflict (409), attempt %d of %d", uri, attempt, CONFLICT_ATTEMPTS)
            time.sleep(random.uniform(0, CONFLICT_BACKOFF_S * 2 ** (attempt - 1)))


def write_create_only(uri: str, data: bytes) -> None:
    """Commit ``data`` at ``uri`` with ``If-None-Match: *``; never overwrite (see the module doc).

    Raises:
        AlreadyExistsError: an object with other bytes is there.
        StorageError: the write failed (after retries) and our bytes are not there; or a conditional
            write was refused but the object is gone by the time it is read back.
    """
    bucket, key = _object(uri)
    failure: BaseException | None = None
    try:
        _upload(bucket, key, data, uri)
        return
    except _failures() as exc:
        if not _is_precondition(exc):
            if not _may_have_landed(exc):
                raise _api_error(uri, "create-only upload", exc) from exc
            failure = exc
    try:
        same = objectstore.same_content(_stat(bucket, key), data, _read_range(bucket, key))
    except _failures() as exc:
        if failure is not None:
            raise _api_error(uri, "create-only upload", failure) from failure
        raise _api_error(uri, "read-back after 412", exc) from exc
    if same is None:
        if failure is not None:
            raise _api_error(uri, "create-only upload", failure) from failure
        raise StorageError(f"{uri}: create-only upload got 412 but no object is there (deleted meanwhile?)")
    if not same:
        raise AlreadyExistsError(f"{uri} already exists with other content")
    log.info("%s: already committed with the same content (retried commit); nothing to do", uri)


def write_replace(uri: str, data: bytes) -> None:
    """Create or replace the small object ``uri`` (progress, attempt records): an unconditional PUT.

    Raises:
        StorageError: the upload failed after retries.
    """
    bucket, key = _object(uri)
    try:
        client().put_object(Bucket=bucket, Key=key, Body=data, ContentType=_content_type(uri))
    except _failures() as exc:
        raise _api_error(uri, "upload", exc) from exc


def read_bytes(uri: str) -> bytes:
    """The whole object ``uri``.

    Raises:
        FileNotFoundError: no such object.
        StorageError: any other failure after retries (a missing bucket included).
    """
    bucket, key = _object(uri)
    try:
        return client().get_object(Bucket=bucket, Key=key)["Body"].read()
    except _failures() as exc:
        if _is_missing(exc):
            raise FileNotFoundError(uri) from None
        raise _api_error(uri, "download", exc) from exc


def exists(uri: str) -> bool:
    """Whether the object ``uri`` exists.

    Raises:
        StorageError: the request failed after retries.
    """
    bucket, key = _object(uri)
    try:
        return _stat(bucket, key) is not None
    except _failures() as exc:
        raise _api_error(uri, "exists", exc) from exc


def _pages(dir_uri: str, prefix: str, **kwargs: Any) -> Any:
    bucket, _ = objectstore.split_uri(dir_uri, SCHEME)
    paginator = client().get_paginator("list_objects_v2")
    return paginator.paginate(Bucket=bucket, Prefix=prefix, **kwargs)


def _list(dir_uri: str, page_size: int | None) -> tuple[dict[str, int], list[str]]:
    """``({object name: size in bytes}, [sub-"directory" names])`` directly under ``dir_uri``."""
    bucket, key = objectstore.split_uri(dir_uri, SCHEME)
    prefix = objectstore.dir_prefix(key)
    sizes: dict[str, int] = {}
    subdirs: list[str] = []
    try:
        for page in _pages(dir_uri, prefix, Delimiter="/", PaginationConfig={"PageSize": page_size or LIST_PAGE_SIZE}):
            sizes.update((o["Key"][len(prefix):], int(o["Size"])) for o in page.get("Contents", ()))
            subdirs.extend(p["Prefix"][len(prefix):].rstrip("/") for p in page.get("CommonPrefixes", ()))
    except _failures() as exc:
        if _code(exc) == "NoSuchBucket":
            raise StorageError(f"{dir_uri}: bucket {bucket!r} not found") from None
        raise _api_error(dir_uri, "list", exc) from exc
    sizes.pop("", None)
    return sizes, [d for d in subdirs if d]


def list_names(dir_uri: str, page_size: int | None = None) -> list[str]:
    """Names directly under the prefix ``dir_uri`` (objects and sub-"directories"), like ``ls``: a
    ``ListObjectsV2`` with ``Delimiter="/"``, every page (``page_size`` keys each, default
    :data:`LIST_PAGE_SIZE`).

    Returns:
        Unsorted names without the prefix and without a trailing ``/``; ``[]`` when nothing is there.

    Raises:
        StorageError: the bucket does not exist, or the listing failed after retries.
    """
    sizes, subdirs = _list(dir_uri, page_size)
    return list(sizes) + subdirs


def list_sizes(dir_uri: str) -> dict[str, int]:
    """``{name: size in bytes}`` of the objects directly under ``dir_uri`` (no sub-"directories").
    Raises ``StorageError`` as :func:`list_names`."""
    return _list(dir_uri, None)[0]


def list_glob(dir_uri: str, pattern: str) -> list[str]:
    """Object names below ``dir_uri`` (relative, ``/``-separated) matching the glob ``pattern`` (``*``
    does not cross ``/``): one flat listing of the prefix, filtered here (S3 has no server-side glob),
    so ``*/_SUCCESS.json`` over 1,024 shards costs a page per 1,000 objects, not a request per shard.

    Raises:
        StorageError: the bucket does not exist, or the listing failed after retries.
    """
    bucket, key = objectstore.split_uri(dir_uri, SCHEME)
    prefix = objectstore.dir_prefix(key)
    regex = objectstore.glob_regex(pattern)
    names: list[str] = []
    try:
        for page in _pages(dir_uri, prefix, PaginationConfig={"PageSize": LIST_PAGE_SIZE}):
            names.extend(o["Key"][len(prefix):] for o in page.get("Contents", ()))
    except _failures() as exc:
        if _code(exc) == "NoSuchBucket":
            raise StorageError(f"{dir_uri}: bucket {bucket!r} not found") from None
        raise _api_error(dir_uri, "list", exc) from exc
    return [n for n in names if regex.fullmatch(n)]


def delete(uri: str) -> None:
    """Delete the object ``uri`` if it exists (a missing object is not an error: S3 answers 204).

    Raises:
        StorageError: the request failed after retries.
    """
    bucket, key = _object(uri)
    try:
        client().delete_object(Bucket=bucket, Key=key)
    except _failures() as exc:
        if not _is_missing(exc):
            raise _api_error(uri, "delete", exc) from exc


def move(src: str, dst: str) -> None:
    """Server-side ``CopyObject`` of ``src`` to ``dst`` (metadata kept), then delete ``src``.

    Not atomic: a crash between the two steps leaves both; a rerun finds ``src`` again and copies it
    again (the same bytes over ``dst``).

    Raises:
        FileNotFoundError: ``src`` does not exist.
        StorageError: the copy or the delete failed after retries.
    """
    src_bucket, src_key = _object(src)
    dst_bucket, dst_key = _object(dst)
    try:
        client().copy_object(Bucket=dst_bucket, Key=dst_key, CopySource={"Bucket": src_bucket, "Key": src_key})
    except _failures() as exc:
        if _is_missing(exc):
            raise FileNotFoundError(src) from None
        raise _api_error(src, "copy", exc) from exc
    delete(src)


def content_tag(uri: str) -> str:
    """``etag=<entity tag>;size=<bytes>;modified=<ISO time>`` of the object: every write gives a new
    modification time, and other bytes a new entity tag.

    Raises:
        FileNotFoundError: ``uri`` does not exist.
        StorageError: the request failed after retries.
    """
    bucket, key = _object(uri)
    try:
        head = client().head_object(Bucket=bucket, Key=key)
    except _failures() as exc:
        if _is_missing(exc):
            raise FileNotFoundError(uri) from None
        raise _api_error(uri, "stat", exc) from exc
    return f"etag={head.get('ETag', '')};size={head['ContentLength']};modified={head['LastModified'].isoformat()}"


def arrow_filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """pyarrow ``S3FileSystem`` and ``"bucket/key"`` path for reading ``uri`` with pyarrow: the custom
    endpoint and region of :func:`endpoint_url` / :func:`region`, the AWS SDK's credential chain, its
    standard retry strategy with :data:`MAX_ATTEMPTS` attempts (cached per process and settings).

    Raises:
        StorageError: ``uri`` is not ``s3://bucket[/key]``.
    """
    bucket, key = objectstore.split_uri(uri, SCHEME)
    cache_key = _cache_key()
    with _lock:
        fs = _arrow_filesystems.get(cache_key)
    if fs is None:
        options: dict[str, Any] = {"region": region(), "connect_timeout": CONNECT_TIMEOUT_S,
                                   "request_timeout": READ_TIMEOUT_S,
                                   "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=MAX_ATTEMPTS)}
        endpoint = endpoint_url()
        if endpoint:
            scheme, _, host = endpoint.partition("://")
            options.update(endpoint_override=host or endpoint, scheme=scheme if host else "https",
                           force_virtual_addressing=False)
        fs = pafs.S3FileSystem(**options)
        with _lock:
            fs = _arrow_filesystems.setdefault(cache_key, fs)
    return fs, f"{bucket}/{key}".rstrip("/")


class S3Backend(StorageBackend):
    """``s3://bucket/key`` objects: the module functions above as a :class:`StorageBackend`.

    ``shared``: every machine with credentials sees the same objects (what Kubernetes pods need).
    ``arrow_filesystem_required``: pyiceberg's own S3 client reads only its ``s3.*`` catalog properties,
    not ``AWS_ENDPOINT_URL``; :meth:`arrow_filesystem` honours it.
    """

    scheme = SCHEME
    shared = True
    arrow_filesystem_required = True
    config_envs = CONFIG_ENVS

    def read_bytes(self, uri: str) -> bytes:
        """See :func:`read_bytes`."""
        return read_bytes(uri)

    def write_create_only(self, uri: str, data: bytes) -> None:
        """See :func:`write_create_only`."""
        write_create_only(uri, data)

    def write_replace(self, uri: str, data: bytes) -> None:
        """See :func:`write_replace`."""
        write_replace(uri, data)

    def exists(self, uri: str) -> bool:
        """See :func:`exists`."""
        return exists(uri)

    def list_names(self, dir_uri: str) -> list[str]:
        """See :func:`list_names`."""
        return list_names(dir_uri)

    def list_sizes(self, dir_uri: str) -> dict[str, int]:
        """See :func:`list_sizes`."""
        return list_sizes(dir_uri)

    def list_glob(self, dir_uri: str, pattern: str) -> list[str]:
        """See :func:`list_glob` (one flat listing, filtered here)."""
        return list_glob(dir_uri, pattern)

    def delete(self, uri: str) -> None:
        """See :func:`delete`."""
        delete(uri)

    def move(self, src: str, dst: str) -> None:
        """See :func:`move` (not atomic: copy, then delete)."""
        move(src, dst)

    def content_tag(self, uri: str) -> str:
        """See :func:`content_tag` (entity tag, size, modification time)."""
        return content_tag(uri)

    def arrow_filesystem(self, uri: str) -> tuple[pafs.FileSystem, str]:
        """See :func:`arrow_filesystem` (path ``"bucket/key"``)."""
        return arrow_filesystem(uri)

    def normalize(self, uri: str) -> str:
        """``s3://bucket/a/`` -> ``s3://bucket/a`` (see :func:`objectstore.normalize`).

        Raises:
            StorageError: not an ``s3://`` URI, no bucket name, or a ``.``, ``..`` or empty segment.
        """
        return objectstore.normalize(uri, SCHEME)

    def is_under(self, uri: str, root: str) -> bool:
        """Whether ``uri`` lies under ``root`` by bucket and whole key segments. Neither may hold a dot
        or empty segment (refused, not collapsed: an HTTP client may collapse ``..`` in a request path,
        even across the bucket name), so the name compared is the name sent.

        Raises:
            StorageError: either URI is not ``s3://bucket[/prefix]`` or holds a refused segment.
        """
        return is_segment_prefix(self.normalize(uri), self.normalize(root), "/")
