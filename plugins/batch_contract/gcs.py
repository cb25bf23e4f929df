"""``gs://`` backend of :mod:`batch_contract.storage` (google-cloud-storage + pyarrow ``GcsFileSystem``).

:class:`GcsBackend` (registered for ``gs`` in :data:`batch_contract.storage.BACKENDS`) wraps this
module's functions. Only :mod:`batch_contract.storage` calls it, and only for ``gs://bucket/key`` URIs, so
the contract stays importable without google-cloud-storage: the registry imports this module on the first
``gs://`` URI, the library is imported on first use and a missing install raises
:class:`~batch_contract.storage.StorageError` saying what to install.

Semantics (same as the local backend, see ``docs/gcs.md``):

* **Create-only commits** (:func:`write_create_only`): one upload with ``if_generation_match=0``.
  Objects up to 8 MiB go up in one non-resumable (multipart) request, so the precondition is checked
  by every GCS-compatible server; larger ones use a resumable session (a POST that opens it, then PUTs
  of :data:`UPLOAD_CHUNK_BYTES` each; real GCS checks the precondition there too; fake-gcs-server does
  not). Because the precondition makes the upload idempotent, each request is retried on
  429/5xx/connection errors. A 412 means the object exists: it may be our own upload whose reply was
  lost, so the object is compared with ``data`` (:func:`_same_content`): same -> success, different ->
  :class:`~batch_contract.storage.AlreadyExistsError`. A failure after which our bytes may have landed
  (connection errors, retries run out, 404/410 for a resumable session that the server already
  finalized or dropped) is read back the same way: our bytes -> success, other bytes ->
  ``AlreadyExistsError``, no object -> the upload's error.
* **Retries**: google-cloud-storage's ``DEFAULT_RETRY`` predicate (429, 408, 5xx, connection resets)
  with truncated exponential backoff and full jitter (``random.uniform(0, delay)``, delay from
  :data:`RETRY_INITIAL_S` doubling up to :data:`RETRY_MAX_S`), giving up after :data:`RETRY_TIMEOUT_S`.
* **Replace** (:func:`write_replace`): unconditional upload (retried: re-sending the same whole object
  is harmless). GCS allows about one write per second to one object name, so this process never
  rewrites the same URI more often than every :data:`MIN_REWRITE_INTERVAL_S` seconds: a write that comes
  sooner *waits* for the rest of the interval and then writes (no write is ever dropped, so the last
  progress record always lands). The limit is per process.
* **Credentials**: with ``STORAGE_EMULATOR_HOST`` set (``http://host:port``) anonymous credentials
  against the emulator; else the JSON key in ``BATCH_GCS_CREDENTIALS_JSON`` if set (how an Airflow
  Google connection's ``keyfile_dict`` is handed over, see :func:`credentials_env_from_connection_extra`);
  else Application Default Credentials (``GOOGLE_APPLICATION_CREDENTIALS`` key path, gcloud user
  credentials, or the GKE metadata server / Workload Identity). Credentials are never logged: messages
  name URIs and HTTP status codes only.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import json
import logging
import os
import posixpath
import re
import threading
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import pyarrow.fs as pafs

from batch_contract.storage.base import AlreadyExistsError, StorageBackend, StorageError, is_segment_prefix

log = logging.getLogger(__name__)

EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
"""Env var naming a GCS emulator (``http://127.0.0.1:4443``); when set, anonymous credentials are used."""
CREDENTIALS_JSON_ENV = "BATCH_GCS_CREDENTIALS_JSON"
"""Env var holding a service-account (or any google-auth) JSON key as text; overrides ADC."""
PROJECT_ENV = "GOOGLE_CLOUD_PROJECT"
"""Env var with the billing project (optional: object reads/writes need none)."""

MIN_REWRITE_INTERVAL_S = 1.0
"""Minimum seconds between two :func:`write_replace` calls on the same URI in one process."""
LIST_PAGE_SIZE = 1000
"""Objects per list request (the JSON API maximum is 1,000)."""
RETRY_INITIAL_S = 1.0
"""First backoff ceiling in seconds (the sleep is uniform in ``[0, ceiling]``)."""
RETRY_MAX_S = 32.0
"""Largest backoff ceiling in seconds."""
RETRY_MULTIPLIER = 2.0
"""Growth of the backoff ceiling per attempt."""
RETRY_TIMEOUT_S = 120.0
"""Give up retrying one call after this many seconds."""
REQUEST_TIMEOUT_S = (10.0, 120.0)
"""(connect, read) timeout in seconds of one HTTP request."""
UPLOAD_CHUNK_BYTES = 100 * 2**20
"""Bytes per PUT of a resumable upload (objects over 8 MiB); a multiple of 256 KiB (GCS requires it).
100 MiB is google-cloud-storage's default; each PUT holds one chunk in memory besides ``data``."""
COMPARE_PIECE_BYTES = 8 * 2**20
"""Bytes per ranged download when a read-back must compare bytes (no MD5 or CRC32C in the metadata)."""

_GCS_SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
_CONTENT_TYPES = {".json": "application/json", ".html": "text/html", ".parquet": "application/vnd.apache.parquet"}

_lock = threading.Lock()
_clients: dict[tuple[Any, ...], Any] = {}
_arrow_filesystems: dict[tuple[Any, ...], tuple[pafs.FileSystem, float]] = {}
_last_replace: dict[str, float] = {}


def split_uri(uri: str) -> tuple[str, str]:
    """Split ``gs://bucket/key`` into ``(bucket, key)``; ``key`` may be ``""`` (the bucket root).

    The scheme matches in any case (``GS://`` is ``gs://``, as :func:`batch_contract.storage.scheme_of`
    dispatches it).

    Raises:
        StorageError: ``uri`` is not a ``gs://`` URI or names no bucket.
    """
    if uri[:5].lower() != "gs://":
        raise StorageError(f"{uri}: not a gs:// URI")
    bucket, _, key = uri[len("gs://") :].partition("/")
    if not bucket:
        raise StorageError(f"{uri}: no bucket name (expected gs://bucket/prefix)")
    return bucket, key


def emulator_endpoint() -> tuple[str, str] | None:
    """``(scheme, "host:port")`` of ``STORAGE_EMULATOR_HOST``, or ``None`` when it is unset."""
    value = os.environ.get(EMULATOR_ENV, "").strip().rstrip("/")
    if not value:
        return None
    scheme, sep, host_port = value.partition("://")
    return (scheme, host_port) if sep else ("http", value)


def credentials_env_from_connection_extra(extra: Mapping[str, Any]) -> dict[str, str]:
    """Environment for the storage layer from an Airflow Google connection's ``extra`` (Airflow side).

    Call with ``BaseHook.get_connection(conn_id).extra_dejson`` and pass the result to the worker
    subprocess environment (or ``os.environ.update`` in the Airflow task). Both the current
    (``key_path``) and legacy (``extra__google_cloud_platform__key_path``) key names are accepted.

    Args:
        extra: the connection's extras: ``key_path`` (path of a JSON key file), ``keyfile_dict`` (the
            key itself, JSON text or a dict) and ``project``; all optional.

    Returns:
        ``{"GOOGLE_APPLICATION_CREDENTIALS": path}`` or ``{"BATCH_GCS_CREDENTIALS_JSON": json_text}``,
        plus ``GOOGLE_CLOUD_PROJECT`` when a project is given; ``{}`` means "use ADC". Treat the result as
        a secret (never log it; in Kubernetes mount it from a Secret rather than a plain env value).
    """

    def get(name: str) -> Any:
        return extra.get(name) or extra.get(f"extra__google_cloud_platform__{name}")

    env: dict[str, str] = {}
    keyfile = get("keyfile_dict")
    if keyfile:
        env[CREDENTIALS_JSON_ENV] = keyfile if isinstance(keyfile, str) else json.dumps(dict(keyfile))
    elif get("key_path"):
        env["GOOGLE_APPLICATION_CREDENTIALS"] = str(get("key_path"))
    if get("project"):
        env[PROJECT_ENV] = str(get("project"))
    return env


def _storage_lib() -> Any:
    """``google.cloud.storage``, or a :class:`StorageError` saying how to install it."""
    try:
        from google.cloud import storage
    except ImportError as exc:
        raise StorageError(
            "gs:// URIs need google-cloud-storage: pip install 'google-cloud-storage>=2.18' "
            "(part of the 'airflow' and 'worker' extras)"
        ) from exc
    return storage


def _errors() -> Any:
    """``google.api_core.exceptions`` (imported after :func:`_storage_lib` checked the install)."""
    _storage_lib()
    from google.api_core import exceptions

    return exceptions


def _failures() -> tuple[type[BaseException], ...]:
    """Exceptions turned into :class:`StorageError`: HTTP errors that are not retried, retries that ran
    out of time (``RetryError``), transport errors and credential errors."""
    import requests
    from google.api_core import exceptions
    from google.auth import exceptions as auth_exceptions

    return (exceptions.GoogleAPICallError, exceptions.RetryError, requests.RequestException,
            auth_exceptions.GoogleAuthError)


def _json_key_credentials() -> tuple[Any, str | None] | None:
    """Credentials and project from ``BATCH_GCS_CREDENTIALS_JSON``, or ``None`` when unset."""
    text = os.environ.get(CREDENTIALS_JSON_ENV, "").strip()
    if not text:
        return None
    from google.oauth2 import credentials as user_credentials
    from google.oauth2 import service_account

    try:
        info = json.loads(text)
    except json.JSONDecodeError:
        raise StorageError(f"{CREDENTIALS_JSON_ENV} is set but is not valid JSON") from None
    kind = info.get("type") if isinstance(info, dict) else None
    try:
        if kind == "service_account":
            made = service_account.Credentials.from_service_account_info(info, scopes=[_GCS_SCOPE])
        elif kind == "authorized_user":
            made = user_credentials.Credentials.from_authorized_user_info(info, scopes=[_GCS_SCOPE])
        else:
            raise StorageError(
                f"{CREDENTIALS_JSON_ENV}: unsupported key type {kind!r} "
                "(use a 'service_account' or 'authorized_user' JSON key, or ADC)"
            )
    except (ValueError, KeyError) as exc:  # malformed key; the message could quote it, so drop it
        raise StorageError(f"{CREDENTIALS_JSON_ENV} is not a usable {kind} key ({type(exc).__name__})") from None
    return made, info.get("project_id")


def _credentials_key() -> tuple[Any, ...]:
    secret = os.environ.get(CREDENTIALS_JSON_ENV, "")
    digest = hashlib.sha256(secret.encode()).hexdigest() if secret else ""
    return (os.getpid(), os.environ.get(EMULATOR_ENV, ""), digest, os.environ.get(PROJECT_ENV, ""))


def client() -> Any:
    """The process's ``google.cloud.storage.Client`` for the current environment (cached per process,
    emulator and credentials; rebuilt after ``fork``)."""
    key = _credentials_key()
    with _lock:
        cached = _clients.get(key)
    if cached is not None:
        return cached
    storage = _storage_lib()
    project = os.environ.get(PROJECT_ENV) or None
    if emulator_endpoint() is not None:
        from google.auth.credentials import AnonymousCredentials

        made = storage.Client(project=project or "test", credentials=AnonymousCredentials())
    elif (loaded := _json_key_credentials()) is not None:
        credentials, key_project = loaded
        made = storage.Client(project=project or key_project, credentials=credentials)
    else:
        from google.auth.exceptions import DefaultCredentialsError

        try:
            made = storage.Client(project=project)  # Application Default Credentials
        except DefaultCredentialsError:
            raise StorageError(
                "gs:// access needs credentials: none found by Application Default Credentials; set "
                f"GOOGLE_APPLICATION_CREDENTIALS or {CREDENTIALS_JSON_ENV}, run on GKE with Workload Identity, "
                f"or set {EMULATOR_ENV} for an emulator"
            ) from None
    with _lock:
        return _clients.setdefault(key, made)


def _retry() -> Any:
    from google.cloud.storage.retry import DEFAULT_RETRY

    return DEFAULT_RETRY.with_delay(
        initial=RETRY_INITIAL_S, maximum=RETRY_MAX_S, multiplier=RETRY_MULTIPLIER
    ).with_timeout(RETRY_TIMEOUT_S)


def _blob(uri: str) -> Any:
    bucket, key = split_uri(uri)
    if not key or key.endswith("/"):
        raise StorageError(f"{uri}: an object URI needs a name after the bucket (gs://bucket/name)")
    return client().bucket(bucket).blob(key)


def _content_type(uri: str) -> str:
    dot = uri.rfind(".")
    return _CONTENT_TYPES.get(uri[dot:].lower(), "application/octet-stream") if dot > 0 else "application/octet-stream"


def _api_error(uri: str, action: str, exc: BaseException) -> StorageError:
    """A :class:`StorageError` naming the URI, the action and the HTTP status (nothing else is quoted,
    so no header, token or key can leak into logs)."""
    prefix = ""
    cause = getattr(exc, "cause", None)  # RetryError: the last error before the retry deadline
    if isinstance(cause, BaseException):
        prefix = f"gave up retrying after {RETRY_TIMEOUT_S:g} s; last error "
        exc = cause
    code = getattr(exc, "code", None)
    if not isinstance(code, int):  # google-resumable-media's InvalidResponse carries the response
        code = getattr(getattr(exc, "response", None), "status_code", None)
    status = f" HTTP {code}" if isinstance(code, int) else ""
    return StorageError(f"{uri}: {action} failed ({prefix}{type(exc).__name__}{status})")


def _crc32c_b64(data: bytes) -> str:
    """Base64 of the big-endian CRC32C of ``data`` (the form of the object resource's ``crc32c``)."""
    import google_crc32c

    return base64.b64encode(google_crc32c.value(data).to_bytes(4, "big")).decode()


def _same_content(blob: Any, data: bytes) -> bool | None:
    """Whether the committed object ``blob`` holds exactly ``data``; ``None`` when there is no object.

    Compares, in this order of preference, the MD5 of the object's metadata (absent for composite
    objects), its CRC32C, or the bytes themselves, downloaded :data:`COMPARE_PIECE_BYTES` at a time and
    compared piece by piece (so a big object is never held in memory twice). A size that differs from
    ``len(data)`` is a mismatch without any hashing.

    Raises:
        google.api_core.exceptions.GoogleAPICallError, requests.RequestException: the read-back failed
            (after retries).
    """
    gexc = _errors()
    try:
        blob.reload(retry=_retry(), timeout=REQUEST_TIMEOUT_S)
    except gexc.NotFound:
        return None
    if blob.size is not None and blob.size != len(data):
        return False
    if blob.md5_hash:
        return blob.md5_hash == base64.b64encode(hashlib.md5(data).digest()).decode()
    if blob.crc32c:
        return blob.crc32c == _crc32c_b64(data)
    view = memoryview(data)
    for start in range(0, len(data), COMPARE_PIECE_BYTES):
        end = min(start + COMPARE_PIECE_BYTES, len(data)) - 1  # inclusive, as in an HTTP Range
        piece = blob.download_as_bytes(start=start, end=end, generation=blob.generation,
                                       retry=_retry(), timeout=REQUEST_TIMEOUT_S)
        if piece != view[start : end + 1]:
            return False
    return True


def _may_have_landed(exc: BaseException) -> bool:
    """Whether a failed create-only upload may still have stored the object: a transport error or
    timeout, retries that ran out, a 5xx, or 404/410 (a resumable session already finalized, or
    expired, by the server). Other statuses (400, 401, 403, ...) were refused before anything was
    stored."""
    cause = getattr(exc, "cause", None)  # RetryError: judge the last error before the deadline
    if isinstance(cause, BaseException):
        exc = cause
    code = getattr(exc, "code", None)
    if not isinstance(code, int):
        code = getattr(getattr(exc, "response", None), "status_code", None)
    return not isinstance(code, int) or code >= 500 or code in (404, 408, 410, 429)


def write_create_only(uri: str, data: bytes) -> None:
    """Commit ``data`` as the new object ``uri`` (``if_generation_match=0``); never overwrite.

    Objects over 8 MiB go up as a resumable upload in :data:`UPLOAD_CHUNK_BYTES` pieces. When the server
    answers 412 (the object exists), or the upload fails in a way after which our bytes may have landed
    (see :func:`_may_have_landed`), the object is read back and compared with ``data``: our bytes are a
    success (a retried request whose first reply was lost).

    Args:
        uri: ``gs://bucket/name``.
        data: the whole object.

    Raises:
        AlreadyExistsError: the object exists with other content (another writer's).
        StorageError: any other failure after retries, including a failed upload that left no object
            (message: URI and HTTP status only).
    """
    gexc = _errors()
    from google.cloud.storage.exceptions import DataCorruption

    blob = _blob(uri)
    blob.chunk_size = UPLOAD_CHUNK_BYTES
    try:
        blob.upload_from_string(
            data,
            content_type=_content_type(uri),
            if_generation_match=0,
            retry=_retry(),
            timeout=REQUEST_TIMEOUT_S,
        )
        return
    except gexc.PreconditionFailed:
        failure: BaseException | None = None
    except DataCorruption as exc:  # the server's checksum differs; the library deleted the object
        raise _api_error(uri, "create-only upload (checksum mismatch)", exc) from exc
    except _failures() as exc:
        if not _may_have_landed(exc):
            raise _api_error(uri, "create-only upload", exc) from exc
        failure = exc
    try:
        same = _same_content(blob, data)
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


def _wait_rewrite_slot(uri: str) -> None:
    with _lock:
        last = _last_replace.get(uri)
    if last is not None:
        wait = last + MIN_REWRITE_INTERVAL_S - time.monotonic()
        if wait > 0:
            time.sleep(wait)


def write_replace(uri: str, data: bytes) -> None:
    """Create or replace the small object ``uri`` (progress, attempt records), at most once a second.

    A call within :data:`MIN_REWRITE_INTERVAL_S` of this process's previous write to ``uri`` sleeps for
    the rest of the interval first (at most that many seconds), then writes.

    Raises:
        StorageError: the upload failed after retries.
    """
    _errors()  # install check first: the except clause below imports google libraries
    blob = _blob(uri)
    _wait_rewrite_slot(uri)
    try:
        blob.upload_from_string(data, content_type=_content_type(uri), retry=_retry(), timeout=REQUEST_TIMEOUT_S)
    except _failures() as exc:
        raise _api_error(uri, "upload", exc) from exc
    finally:
        with _lock:
            _last_replace[uri] = time.monotonic()


def read_bytes(uri: str) -> bytes:
    """The whole object ``uri``.

    Raises:
        FileNotFoundError: no such object (or no such bucket).
        StorageError: any other failure after retries.
    """
    gexc = _errors()
    try:
        return _blob(uri).download_as_bytes(retry=_retry(), timeout=REQUEST_TIMEOUT_S)
    except gexc.NotFound:
        raise FileNotFoundError(uri) from None
    except _failures() as exc:
        raise _api_error(uri, "download", exc) from exc


def exists(uri: str) -> bool:
    """Whether the object ``uri`` exists (``False`` also for a missing bucket)."""
    _errors()  # install check first: the except clause below imports google libraries
    try:
        return bool(_blob(uri).exists(retry=_retry(), timeout=REQUEST_TIMEOUT_S))
    except _failures() as exc:
        raise _api_error(uri, "exists", exc) from exc


def _list(dir_uri: str, page_size: int | None) -> tuple[dict[str, int], list[str]]:
    """``({object name: size in bytes}, [sub-"directory" names])`` directly under ``dir_uri``."""
    gexc = _errors()
    bucket, key = split_uri(dir_uri)
    prefix = f"{key.rstrip('/')}/" if key.strip("/") else ""
    sizes: dict[str, int] = {}
    subdirs: list[str] = []
    try:
        pages = client().list_blobs(
            bucket,
            prefix=prefix,
            delimiter="/",
            page_size=page_size or LIST_PAGE_SIZE,
            retry=_retry(),
            timeout=REQUEST_TIMEOUT_S,
        )
        for page in pages.pages:
            sizes.update((blob.name[len(prefix) :], int(blob.size or 0)) for blob in page)
        subdirs.extend(sub[len(prefix) :].rstrip("/") for sub in pages.prefixes)
    except gexc.NotFound:
        raise StorageError(f"{dir_uri}: bucket {bucket!r} not found") from None
    except _failures() as exc:
        raise _api_error(dir_uri, "list", exc) from exc
    sizes.pop("", None)
    return sizes, [d for d in subdirs if d]


def list_names(dir_uri: str, page_size: int | None = None) -> list[str]:
    """Names directly under the prefix ``dir_uri`` (objects and sub-"directories"), like ``ls``.

    Uses ``delimiter="/"``; every page is fetched (``page_size`` objects per request, default
    :data:`LIST_PAGE_SIZE`). Empty "directory marker" objects (``prefix/``) are skipped.

    Returns:
        Unsorted names without the prefix and without a trailing ``/``; ``[]`` when nothing is there.

    Raises:
        StorageError: the bucket does not exist, or the listing failed after retries.
    """
    sizes, subdirs = _list(dir_uri, page_size)
    return list(sizes) + subdirs


def list_sizes(dir_uri: str) -> dict[str, int]:
    """``{name: size in bytes}`` of the objects directly under ``dir_uri`` (one listing; no
    sub-"directories"). Raises ``StorageError`` as :func:`list_names`."""
    return _list(dir_uri, None)[0]


def list_glob(dir_uri: str, pattern: str) -> list[str]:
    """Object names below ``dir_uri`` (relative, ``/``-separated) matching the glob ``pattern``, from
    one listing with GCS's ``match_glob`` (``*`` does not cross ``/``; paged, :data:`LIST_PAGE_SIZE`).
    The result is filtered again client-side, so a server that ignores ``match_glob`` (an emulator)
    gives the same answer, only slower.

    Raises:
        StorageError: the bucket does not exist, or the listing failed after retries.
    """
    gexc = _errors()
    bucket, key = split_uri(dir_uri)
    prefix = f"{key.rstrip('/')}/" if key.strip("/") else ""
    regex = re.compile(fnmatch.translate(pattern).replace(".*", "[^/]*"))
    try:
        blobs = client().list_blobs(bucket, prefix=prefix, match_glob=prefix + pattern, page_size=LIST_PAGE_SIZE,
                                    retry=_retry(), timeout=REQUEST_TIMEOUT_S)
        names = [blob.name[len(prefix):] for blob in blobs]
    except gexc.NotFound:
        raise StorageError(f"{dir_uri}: bucket {bucket!r} not found") from None
    except _failures() as exc:
        raise _api_error(dir_uri, "list", exc) from exc
    return [n for n in names if regex.fullmatch(n)]


def move(src: str, dst: str) -> None:
    """Copy the object ``src`` to ``dst`` (server-side, same bucket or another) and delete ``src``.

    Not atomic: a crash between the two steps leaves both; a rerun finds ``src`` again and copies it
    again (the copy overwrites ``dst`` with the same bytes).

    Raises:
        FileNotFoundError: ``src`` does not exist.
        StorageError: the copy or the delete failed after retries.
    """
    gexc = _errors()
    src_blob, dst_blob = _blob(src), _blob(dst)
    try:
        src_blob.bucket.copy_blob(src_blob, dst_blob.bucket, dst_blob.name, retry=_retry(),
                                  timeout=REQUEST_TIMEOUT_S)
    except gexc.NotFound:
        raise FileNotFoundError(src) from None
    except _failures() as exc:
        raise _api_error(src, "copy", exc) from exc
    delete(src)


def copy(src: str, dst: str) -> None:
    """Server-side copy of ``src`` to ``dst`` that never overwrites (``if_generation_match=0``); an
    existing ``dst`` with the same CRC32C is a no-op success (a retried copy whose reply was lost).

    Raises:
        FileNotFoundError: ``src`` does not exist.
        AlreadyExistsError: ``dst`` exists with other content.
        StorageError: the copy failed after retries.
    """
    gexc = _errors()
    src_blob, dst_blob = _blob(src), _blob(dst)
    if exists(dst):  # checked first too: emulators ignore the precondition of a copy
        _check_same_copy(src, dst)
        return
    try:
        src_blob.bucket.copy_blob(src_blob, dst_blob.bucket, dst_blob.name, if_generation_match=0,
                                  retry=_retry(), timeout=REQUEST_TIMEOUT_S)
    except gexc.NotFound:
        raise FileNotFoundError(src) from None
    except gexc.PreconditionFailed:
        _check_same_copy(src, dst)
    except _failures() as exc:
        raise _api_error(src, "copy", exc) from exc


def _check_same_copy(src: str, dst: str) -> None:
    """Raise :class:`AlreadyExistsError` unless ``dst`` holds the bytes of ``src`` (same CRC32C and size)."""
    def crc_and_size(uri: str) -> list[str]:
        return content_tag(uri).split(";")[1:]

    if crc_and_size(dst) != crc_and_size(src):
        raise AlreadyExistsError(f"{dst} already exists with other content")


def content_tag(uri: str) -> str:
    """``generation=<n>;crc32c=<b64>;size=<bytes>`` of the object: every upload makes a new generation.

    Raises:
        FileNotFoundError: ``uri`` does not exist.
        StorageError: the metadata request failed after retries.
    """
    gexc = _errors()
    blob = _blob(uri)
    try:
        blob.reload(retry=_retry(), timeout=REQUEST_TIMEOUT_S)
    except gexc.NotFound:
        raise FileNotFoundError(uri) from None
    except _failures() as exc:
        raise _api_error(uri, "stat", exc) from exc
    return f"generation={blob.generation};crc32c={blob.crc32c};size={blob.size}"


def delete(uri: str) -> None:
    """Delete the object ``uri`` if it exists (a missing object is not an error)."""
    gexc = _errors()
    try:
        _blob(uri).delete(retry=_retry(), timeout=REQUEST_TIMEOUT_S)
    except gexc.NotFound:
        pass
    except _failures() as exc:
        raise _api_error(uri, "delete", exc) from exc


def _token_credentials() -> tuple[str, Any] | None:
    """``(access_token, expiry)`` from ``BATCH_GCS_CREDENTIALS_JSON`` for pyarrow, or ``None``."""
    loaded = _json_key_credentials()
    if loaded is None:
        return None
    import google.auth.transport.requests

    credentials = loaded[0]
    credentials.refresh(google.auth.transport.requests.Request())
    return credentials.token, credentials.expiry


def _make_arrow_filesystem() -> tuple[pafs.FileSystem, float]:
    """A new ``GcsFileSystem`` and the monotonic time after which it must be rebuilt."""
    retry_limit = timedelta(seconds=RETRY_TIMEOUT_S)
    endpoint = emulator_endpoint()
    if endpoint is not None:
        scheme, host_port = endpoint
        fs = pafs.GcsFileSystem(
            anonymous=True, endpoint_override=host_port, scheme=scheme, retry_time_limit=retry_limit
        )
        return fs, float("inf")
    token = _token_credentials()
    if token is None:
        return pafs.GcsFileSystem(retry_time_limit=retry_limit), float("inf")  # ADC via google-cloud-cpp
    access_token, expiry = token
    fs = pafs.GcsFileSystem(
        access_token=access_token, credential_token_expiration=expiry, retry_time_limit=retry_limit
    )
    return fs, time.monotonic() + 45 * 60  # tokens live 60 min; rebuild well before


def arrow_filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """pyarrow ``GcsFileSystem`` and ``"bucket/key"`` path for reading ``uri`` with pyarrow.

    With ``STORAGE_EMULATOR_HOST`` set: ``endpoint_override=host:port``, its scheme, anonymous.
    """
    bucket, key = split_uri(uri)
    cache_key = _credentials_key()
    with _lock:
        cached = _arrow_filesystems.get(cache_key)
    if cached is None or cached[1] <= time.monotonic():
        cached = _make_arrow_filesystem()
        with _lock:
            _arrow_filesystems[cache_key] = cached
    return cached[0], f"{bucket}/{key}".rstrip("/")


class GcsBackend(StorageBackend):
    """``gs://bucket/key`` objects: the module functions above as a :class:`StorageBackend`.

    ``shared``: every machine with credentials sees the same objects (what Kubernetes pods need).
    ``arrow_filesystem_required``: a library's own GCS client (pyiceberg's) ignores
    ``STORAGE_EMULATOR_HOST`` and ``BATCH_GCS_CREDENTIALS_JSON``; :meth:`arrow_filesystem` honours them.
    """

    scheme = "gs"
    shared = True
    arrow_filesystem_required = True
    config_envs = (EMULATOR_ENV, PROJECT_ENV)

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

    def delete(self, uri: str) -> None:
        """See :func:`delete`."""
        delete(uri)

    def move(self, src: str, dst: str) -> None:
        """See :func:`move` (not atomic: copy, then delete)."""
        move(src, dst)

    def list_glob(self, dir_uri: str, pattern: str) -> list[str]:
        """See :func:`list_glob` (one listing with ``match_glob``)."""
        return list_glob(dir_uri, pattern)

    def copy(self, src: str, dst: str) -> None:
        """See :func:`copy` (server-side, create-only)."""
        copy(src, dst)

    def content_tag(self, uri: str) -> str:
        """See :func:`content_tag` (generation + CRC32C)."""
        return content_tag(uri)

    def arrow_filesystem(self, uri: str) -> tuple[pafs.FileSystem, str]:
        """See :func:`arrow_filesystem` (path ``"bucket/key"``)."""
        return arrow_filesystem(uri)

    def normalize(self, uri: str) -> str:
        """``gs://bucket/a/../b`` -> ``gs://bucket/b`` (no trailing ``/``).

        Raises:
            StorageError: not a ``gs://`` URI, or no bucket name.
        """
        bucket, key = split_uri(uri)
        key = posixpath.normpath("/" + key).lstrip("/")
        return f"gs://{bucket}/{key}".rstrip("/")

    def is_under(self, uri: str, root: str) -> bool:
        """Whether ``uri`` lies under ``root`` by bucket and object prefix, both as written (no trailing
        ``/``) and with ``.``/``..`` segments collapsed: object names are not normalized by GCS, so
        whichever way a reader takes the name, the object stays under the root.

        Raises:
            StorageError: either URI is not ``gs://bucket[/prefix]``.
        """
        top = self.normalize(root)
        forms = (self.normalize(uri), uri.rstrip("/"))
        return all(is_segment_prefix(form, top, "/") for form in forms)
