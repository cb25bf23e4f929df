"""``az://`` backend of :mod:`batch_contract.storage` (Azure Blob Storage: azure-storage-blob, also for
pyarrow's reads through :mod:`batch_contract.storage.azure_arrow`).

URIs are ``az://<container>/<blob name>``; the storage account comes from the environment (see
*Credentials*). :class:`AzureBlobBackend` (registered for ``az`` in
:data:`batch_contract.storage.BACKENDS`) wraps this module's functions. The registry imports this module
on the first ``az://`` URI and the Azure SDK is imported on first use, so the contract stays importable
without it; a missing install raises :class:`~batch_contract.storage.StorageError` saying what to install.

Semantics (the same guarantees as ``gs://``, see :mod:`batch_contract.gcs`):

* **Create-only commits** (:func:`write_create_only`): ``upload_blob(overwrite=False)``, which the SDK
  sends with ``If-None-Match: *``. Objects up to :data:`SINGLE_PUT_BYTES` go up in one Put Blob; larger
  ones as a block blob: Put Block requests of :data:`BLOCK_BYTES` each (uncommitted blocks are invisible),
  then one Put Block List that carries ``If-None-Match: *`` and makes the object visible, complete, in one
  step (the staged blocks themselves carry no condition). Every create-only upload stores the SHA-256 of
  the bytes in the blob's metadata (``x-ms-meta-sha256``,
  :data:`~batch_contract.storage.objectstore.SHA256_METADATA`). A refusal because the blob exists (409
  ``BlobAlreadyExists``, or 412 which the SDK reports the same way) may be our own upload whose reply was
  lost and whose retry met it, so the blob is read back
  (:func:`~batch_contract.storage.objectstore.same_content`: size, then the SHA-256 metadata, else the
  bytes compared by ranged reads pinned to the blob's ETag): same -> success, other ->
  :class:`~batch_contract.storage.AlreadyExistsError`. A failure after which our bytes may have landed
  (connection errors, a lost reply, retries run out on 408/429/5xx) is read back the same way: our bytes
  -> success, other bytes -> ``AlreadyExistsError``, no blob -> the upload's error. Blocks staged by a
  refused commit stay uncommitted, invisible, and the service discards them (at the blob's next commit,
  or after a week).
* **Retries**: every request (each Put Block and the commit included) is retried by the SDK's retry
  policy (:class:`~azure.storage.blob.ExponentialRetry`, subclassed) on connection errors, lost replies and
  HTTP 408, 429 and 5xx except 501/505 (the SDK alone does not retry 429), with truncated exponential
  backoff and full jitter: a sleep uniform in ``[0, ceiling]``, the ceiling :data:`RETRY_INITIAL_S`
  doubling up to :data:`RETRY_MAX_S`; at most :data:`RETRY_TOTAL` retries per request
  (:data:`RETRY_CONNECT`, :data:`RETRY_READ`, :data:`RETRY_STATUS` of each kind). Credential errors are
  not retried. Each request has :data:`CONNECT_TIMEOUT_S` / :data:`READ_TIMEOUT_S`. Retrying is safe:
  a create-only request is conditional, every other write re-sends the same whole object or block.
* **Replace** (:func:`write_replace`): one unconditional upload (readers see the old or the new blob;
  Azure has no per-object write-rate limit like GCS's, so none is applied here).
* **Move** (:func:`move`): read, replace at the target, delete the source. Not atomic (a crash between
  the steps leaves both; a rerun moves the same bytes again). A server-side copy was not used: with a
  token credential its source needs a SAS or ``x-ms-copy-source-authorization``, and the objects moved
  are part files of tens of MB.
* **Listing**: List Blobs with ``delimiter="/"`` (:data:`LIST_PAGE_SIZE` per page, every page fetched);
  a glob is one flat listing of the pattern's literal prefix, filtered client-side. On accounts with a
  hierarchical namespace (ADLS Gen2) directory entries are not reported as objects.
* **Credentials**: ``AZURE_STORAGE_CONNECTION_STRING`` when set (account key or SAS, also Azurite;
  ``BlobServiceClient.from_connection_string``); else ``AZURE_STORAGE_ACCOUNT_NAME`` (endpoint
  ``https://<account>.blob.core.windows.net`` unless ``AZURE_STORAGE_BLOB_ENDPOINT`` names another) with
  ``azure.identity.DefaultAzureCredential`` (AKS Workload Identity, managed identity, a service principal
  in ``AZURE_CLIENT_ID``/``AZURE_TENANT_ID``/``AZURE_CLIENT_SECRET``, the ``az`` CLI login); neither is a
  :class:`~batch_contract.storage.StorageError` naming both variables. This module never logs
  credentials nor puts them in messages: errors name the URI, the action, the exception type, the HTTP
  status and Azure's error code only, and the SDK's exception is not chained to them (its message can
  quote a URL with a SAS). The SDK's own per-request HTTP logging (redacted) is raised to WARNING
  unless its logger was configured (:func:`_quiet_request_log`).
* **pyarrow** (:func:`arrow_filesystem`): a ``PyFileSystem`` over this module's client
  (:mod:`batch_contract.storage.azure_arrow`), so pyarrow's reads have the same retries and credentials
  as every other call; pyarrow's own ``AzureFileSystem`` neither retried a 429 nor survived an error body
  it could not parse (the process aborted), measured through the tests' fault proxy.

Where the numbers come from: Azure's limits are 5,000 blobs per List Blobs page, 4,000 MiB per block,
50,000 blocks per blob (so :data:`BLOCK_BYTES` of 8 MiB allows blobs of 390 GiB) and 5,000 MiB per Put
Blob; the SDK's defaults are 64 MiB for a single put and 4 MiB blocks (blocks over 4 MiB also take the
SDK's memory-saving path that reads each block from ``data`` as a sub-stream). 8 MiB for both keeps one
retried request small and matches the ``gs://`` single-request limit. The backoff and the read timeout
are the ``gs://`` backend's; the connect timeout is the SDK's default.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import re
import threading
from typing import Any

import pyarrow.fs as pafs

from batch_contract.storage import objectstore
from batch_contract.storage.base import AlreadyExistsError, StorageBackend, StorageError, is_segment_prefix
from batch_contract.storage.objectstore import SHA256_METADATA, ObjectStat

log = logging.getLogger(__name__)

SCHEME = "az"
"""The URI scheme of this backend: ``az://<container>/<blob name>``."""
CONNECTION_STRING_ENV = "AZURE_STORAGE_CONNECTION_STRING"
"""Env var with a storage connection string (account key or SAS; Azurite's well-known one in tests).
Wins over :data:`ACCOUNT_NAME_ENV`. A secret: never logged."""
ACCOUNT_NAME_ENV = "AZURE_STORAGE_ACCOUNT_NAME"
"""Env var with the storage account name, used with ``DefaultAzureCredential`` when no connection string
is set."""
BLOB_ENDPOINT_ENV = "AZURE_STORAGE_BLOB_ENDPOINT"
"""Env var overriding the blob endpoint used with :data:`ACCOUNT_NAME_ENV` (a private endpoint, a
sovereign cloud); default ``https://<account>.blob.core.windows.net``."""

SINGLE_PUT_BYTES = 8 * 2**20
"""Objects up to this size go up in one Put Blob; larger ones as a block blob (the SDK's
``max_single_put_size``; its default is 64 MiB, the service allows 5,000 MiB)."""
BLOCK_BYTES = 8 * 2**20
"""Bytes per Put Block of a block blob upload (the SDK's ``max_block_size``; its default is 4 MiB, the
service allows 4,000 MiB and 50,000 blocks per blob). Above 4 MiB the SDK reads each block from
``data`` as a sub-stream (its memory-saving path) instead of buffering a copy."""
LIST_PAGE_SIZE = 5000
"""Blobs per List Blobs request (the service maximum)."""
RETRY_TOTAL = 6
"""Most retries of one request, whatever the cause (this and the three below: at least 1; the SDK takes
0 for "no limit of this kind")."""
RETRY_CONNECT = 6
"""Most retries of one request after a connection error (the request did not reach the server)."""
RETRY_READ = 6
"""Most retries of one request after its reply was lost (the server may have acted on it)."""
RETRY_STATUS = 6
"""Most retries of one request answered with a retryable status (408, 429, 5xx but 501/505)."""
RETRY_INITIAL_S = 1.0
"""First backoff ceiling in seconds (the sleep is uniform in ``[0, ceiling]``)."""
RETRY_MAX_S = 32.0
"""Largest backoff ceiling in seconds (the ceiling doubles per retry up to this)."""
CONNECT_TIMEOUT_S = 20.0
"""Seconds to open a connection (the SDK's default)."""
READ_TIMEOUT_S = 120.0
"""Seconds without a byte of the reply before a request counts as lost (and is retried)."""

_RETRY_STATUSES = frozenset({408, 429})
"""4xx statuses that are retried (besides 5xx other than 501 and 505)."""
_CONTENT_TYPES = {".json": "application/json", ".html": "text/html",
                  ".parquet": "application/vnd.apache.parquet"}
"""Content type of an uploaded blob by its name's extension (as ``gs://`` uploads); else octet-stream."""
_INSTALL_HINT = "az:// URIs need the Azure SDK: pip install azure-storage-blob azure-identity"

_lock = threading.Lock()
_clients: dict[tuple[Any, ...], Any] = {}
_arrow_filesystems: dict[str, pafs.FileSystem] = {}
_retry_class: list[type] = []


# ------------------------------------------------------------------------------------ SDK and client


def _blob_lib() -> Any:
    """``azure.storage.blob``, or a :class:`StorageError` saying how to install it."""
    try:
        from azure.storage import blob
    except ImportError as exc:
        raise StorageError(_INSTALL_HINT) from exc
    return blob


def _errors() -> Any:
    """``azure.core.exceptions`` (imported after :func:`_blob_lib` checked the install)."""
    _blob_lib()
    from azure.core import exceptions

    return exceptions


def _retryable_status(status: int) -> bool:
    """Whether an HTTP status is worth another try: 408, 429 and 5xx except 501 and 505."""
    return status in _RETRY_STATUSES or (status >= 500 and status not in (501, 505))


def _retry_policy() -> Any:
    """A retry policy for the clients: the SDK's ``ExponentialRetry`` with this module's limits and
    backoff (read on every request, so a change of the module constants applies at once) and 429 retried.
    """
    if not _retry_class:
        blob = _blob_lib()
        from azure.core.exceptions import AzureError, ClientAuthenticationError

        class _Retry(blob.ExponentialRetry):
            """``ExponentialRetry`` that also retries 429, never retries credential errors, and backs off
            with full jitter between 0 and :data:`RETRY_INITIAL_S` * 2^n (at most :data:`RETRY_MAX_S`)."""

            def configure_retries(self, request: Any) -> dict[str, Any]:
                settings = super().configure_retries(request)
                settings.update(total=RETRY_TOTAL, connect=RETRY_CONNECT, read=RETRY_READ,
                                status=RETRY_STATUS)
                return settings

            def get_backoff_time(self, settings: dict[str, Any]) -> float:
                ceiling = min(RETRY_MAX_S, RETRY_INITIAL_S * 2 ** max(settings["count"] - 1, 0))
                return random.uniform(0, ceiling)

            def send(self, request: Any) -> Any:
                settings = self.configure_retries(request)
                while True:
                    try:
                        response = self.next.send(request)
                    except ClientAuthenticationError:
                        raise
                    except AzureError as err:
                        if not self.increment(settings, request=request.http_request, error=err):
                            raise
                        self.sleep(settings, request.context.transport)
                        continue
                    if _retryable_status(response.http_response.status_code) and self.increment(
                            settings, request=request.http_request, response=response.http_response):
                        self.sleep(settings, request.context.transport)
                        continue
                    if settings["history"]:
                        response.context["history"] = settings["history"]
                    response.http_response.location_mode = settings["mode"]
                    return response

        _retry_class.append(_Retry)
    return _retry_class[0](retry_total=RETRY_TOTAL, initial_backoff=RETRY_INITIAL_S)


def _env_key() -> tuple[Any, ...]:
    """Cache key of the clients: the process (a forked child builds its own) and the settings, the
    connection string as a digest only."""
    secret = os.environ.get(CONNECTION_STRING_ENV, "").strip()
    digest = hashlib.sha256(secret.encode()).hexdigest() if secret else ""
    return (os.getpid(), digest, os.environ.get(ACCOUNT_NAME_ENV, "").strip(),
            os.environ.get(BLOB_ENDPOINT_ENV, "").strip())


def _account_url(account: str) -> str:
    """The blob endpoint of ``account``: :data:`BLOB_ENDPOINT_ENV`, else
    ``https://<account>.blob.core.windows.net``."""
    return os.environ.get(BLOB_ENDPOINT_ENV, "").strip() or f"https://{account}.blob.core.windows.net"


SDK_REQUEST_LOGGER = "azure.core.pipeline.policies.http_logging_policy"
"""The Azure SDK logger that writes every request and response at INFO (headers included, redacted)."""


def _quiet_request_log() -> None:
    """Raise :data:`SDK_REQUEST_LOGGER` to WARNING unless a level was configured for it: at INFO it writes
    two records per request, thousands per shard in a worker's or task's log."""
    logger = logging.getLogger(SDK_REQUEST_LOGGER)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.WARNING)


def client() -> Any:
    """The process's ``azure.storage.blob.BlobServiceClient`` for the current environment (see the module
    docstring, *Credentials*), cached per process and settings (rebuilt after ``fork``).

    Raises:
        StorageError: the Azure SDK is not installed; neither :data:`CONNECTION_STRING_ENV` nor
            :data:`ACCOUNT_NAME_ENV` is set; the connection string is malformed (not quoted); a token
            credential would be sent to a non-https :data:`BLOB_ENDPOINT_ENV`.
    """
    key = _env_key()
    with _lock:
        cached = _clients.get(key)
    if cached is not None:
        return cached
    blob = _blob_lib()
    _quiet_request_log()
    options: dict[str, Any] = {
        "max_single_put_size": SINGLE_PUT_BYTES,
        "max_block_size": BLOCK_BYTES,
        "retry_policy": _retry_policy(),
        "connection_timeout": CONNECT_TIMEOUT_S,
        "read_timeout": READ_TIMEOUT_S,
    }
    connection_string = os.environ.get(CONNECTION_STRING_ENV, "").strip()
    account = os.environ.get(ACCOUNT_NAME_ENV, "").strip()
    if connection_string:
        try:
            made = blob.BlobServiceClient.from_connection_string(connection_string, **options)
        except (ValueError, TypeError, KeyError):  # the message could quote the string: drop it
            raise StorageError(f"{CONNECTION_STRING_ENV} is set but is not a valid storage connection "
                               "string (AccountName=...;AccountKey=... or "
                               "BlobEndpoint=...;SharedAccessSignature=...)") from None
    elif account:
        try:
            from azure.identity import DefaultAzureCredential
        except ImportError as exc:
            raise StorageError(_INSTALL_HINT) from exc
        url = _account_url(account)
        if not url.lower().startswith("https://"):  # the SDK's own ValueError names neither variable
            raise StorageError(f"{BLOB_ENDPOINT_ENV}={url}: a token credential (DefaultAzureCredential, used "
                               f"with {ACCOUNT_NAME_ENV}) needs an https:// endpoint; for an http:// emulator "
                               f"set {CONNECTION_STRING_ENV} instead")
        made = blob.BlobServiceClient(account_url=url, credential=DefaultAzureCredential(), **options)
    else:
        raise StorageError(f"az:// access needs a storage account: set {CONNECTION_STRING_ENV} (a connection "
                           f"string with a key or SAS) or {ACCOUNT_NAME_ENV} (with credentials found by "
                           "DefaultAzureCredential: AKS Workload Identity, managed identity, AZURE_CLIENT_ID/"
                           f"AZURE_TENANT_ID/AZURE_CLIENT_SECRET, az login; optionally {BLOB_ENDPOINT_ENV})")
    with _lock:
        return _clients.setdefault(key, made)


def _blob(uri: str) -> Any:
    """The ``BlobClient`` of the object URI ``uri``.

    Raises:
        StorageError: ``uri`` names no container or no blob; see :func:`client`.
    """
    container, name = objectstore.object_key(uri, SCHEME, "container")
    return client().get_blob_client(container, name)


def _content_settings(uri: str) -> Any:
    """``ContentSettings`` with the content type of ``uri``'s extension (as ``gs://`` uploads)."""
    dot = uri.rfind(".")
    content_type = _CONTENT_TYPES.get(uri[dot:].lower(), "application/octet-stream") if dot > 0 else \
        "application/octet-stream"
    return _blob_lib().ContentSettings(content_type=content_type)


def _status(exc: BaseException) -> int | None:
    code = getattr(exc, "status_code", None)
    return code if isinstance(code, int) else None


def _api_error(uri: str, action: str, exc: BaseException) -> StorageError:
    """A :class:`StorageError` naming the URI, the action, the exception type, the HTTP status and Azure's
    error code (nothing else is quoted, so no header, token, key or connection string can leak). Callers
    raise it ``from None``: the SDK's exception is not chained, because its message can quote a request
    URL with a SAS signature or the request's Authorization signature."""
    errors = _errors()
    code = _status(exc)
    gave_up = isinstance(exc, errors.ServiceRequestError | errors.ServiceResponseError) or (
        code is not None and _retryable_status(code))
    prefix = "gave up retrying; last error " if gave_up else ""
    status = f" HTTP {code}" if code is not None else ""
    error_code = getattr(exc, "error_code", None)
    error_code = str(getattr(error_code, "value", error_code) or "")
    detail = f" {error_code}" if re.fullmatch(r"[A-Za-z0-9]{1,64}", error_code) else ""
    return StorageError(f"{uri}: {action} failed ({prefix}{type(exc).__name__}{status}{detail})")


def _may_have_landed(exc: BaseException) -> bool:
    """Whether a failed create-only upload may still have stored the blob: a transport error or lost
    reply (after retries), a 408/429/5xx (retries ran out). Other statuses (400, 403, ...) were refused
    before anything was committed."""
    if isinstance(exc, _errors().ClientAuthenticationError):  # no token or a bad key: nothing was sent
        return False
    code = _status(exc)
    return code is None or _retryable_status(code)


# ------------------------------------------------------------------------------------------ objects


def _stat(blob: Any) -> ObjectStat | None:
    """Size, SHA-256 metadata and ETag of the committed blob, or ``None`` when there is none.

    Raises:
        azure.core.exceptions.AzureError: the request failed after retries.
    """
    errors = _errors()
    try:
        props = blob.get_blob_properties()
    except errors.ResourceNotFoundError:
        return None
    metadata = {k.lower(): v for k, v in (props.metadata or {}).items()}
    return ObjectStat(size=int(props.size), sha256=metadata.get(SHA256_METADATA), version=props.etag)


def _read_range(blob: Any) -> Any:
    """``read_range(start, end_inclusive, etag)`` for :func:`objectstore.same_content`: a ranged download
    that fails (412) if the blob changed since its ETag was read."""
    from azure.core import MatchConditions

    def read(start: int, end: int, etag: str) -> bytes:
        return blob.download_blob(offset=start, length=end - start + 1, etag=etag,
                                  match_condition=MatchConditions.IfNotModified).readall()

    return read


def write_create_only(uri: str, data: bytes) -> None:
    """Commit ``data`` as the new blob ``uri``; never overwrite (``If-None-Match: *``).

    Blobs over :data:`SINGLE_PUT_BYTES` go up as staged blocks of :data:`BLOCK_BYTES` committed by one
    conditional Put Block List. When the service refuses because the blob exists, or the upload fails in
    a way after which our bytes may have landed (see :func:`_may_have_landed`), the blob is read back and
    compared with ``data``: our bytes are a success (a retried request whose first reply was lost).

    Args:
        uri: ``az://container/name``.
        data: the whole object.

    Raises:
        AlreadyExistsError: the blob exists with other content (another writer's).
        StorageError: any other failure after retries, including a failed upload that left no blob
            (message: URI, HTTP status and error code only); the SDK is missing; no account configured.
    """
    errors = _errors()
    blob = _blob(uri)
    try:
        blob.upload_blob(data, overwrite=False, metadata={SHA256_METADATA: objectstore.sha256_hex(data)},
                         content_settings=_content_settings(uri))
        return
    except errors.ResourceExistsError as exc:  # 409 BlobAlreadyExists, or 412 converted by the SDK
        failure: BaseException = exc
        refused = True
    except errors.AzureError as exc:
        if not _may_have_landed(exc):
            raise _api_error(uri, "create-only upload", exc) from None
        failure, refused = exc, False
    try:
        same = objectstore.same_content(_stat(blob), data, _read_range(blob))
    except errors.AzureError as exc:
        if not refused:
            raise _api_error(uri, "create-only upload", failure) from None
        raise _api_error(uri, "read-back after the blob already existed", exc) from None
    if same is None:  # refused (409) yet no blob: deleted meanwhile, or a conflict of another kind
        raise _api_error(uri, "create-only upload", failure) from None
    if not same:
        raise AlreadyExistsError(f"{uri} already exists with other content")
    log.info("%s: already committed with the same content (retried commit); nothing to do", uri)


def write_replace(uri: str, data: bytes) -> None:
    """Create or replace the blob ``uri`` (progress, attempt records): one unconditional upload, atomic
    for readers (a block blob becomes visible at its commit).

    Raises:
        StorageError: the upload failed after retries.
    """
    errors = _errors()
    blob = _blob(uri)
    try:
        blob.upload_blob(data, overwrite=True, metadata={SHA256_METADATA: objectstore.sha256_hex(data)},
                         content_settings=_content_settings(uri))
    except errors.AzureError as exc:
        raise _api_error(uri, "upload", exc) from None


def read_bytes(uri: str) -> bytes:
    """The whole blob ``uri``.

    Raises:
        FileNotFoundError: no such blob (or no such container).
        StorageError: any other failure after retries.
    """
    errors = _errors()
    try:
        return _blob(uri).download_blob().readall()
    except errors.ResourceNotFoundError:
        raise FileNotFoundError(uri) from None
    except errors.AzureError as exc:
        raise _api_error(uri, "download", exc) from None


def exists(uri: str) -> bool:
    """Whether the blob ``uri`` exists (``False`` also for a missing container).

    Raises:
        StorageError: the request failed after retries.
    """
    errors = _errors()
    try:
        return bool(_blob(uri).exists())
    except errors.AzureError as exc:
        raise _api_error(uri, "exists", exc) from None


def _list(dir_uri: str, page_size: int | None) -> tuple[dict[str, int], list[str]]:
    """``({blob name: size in bytes}, [sub-"directory" names])`` directly under ``dir_uri``."""
    errors = _errors()
    blob = _blob_lib()
    container, key = objectstore.split_uri(dir_uri, SCHEME, "container")
    prefix = objectstore.dir_prefix(key)
    sizes: dict[str, int] = {}
    subdirs: list[str] = []
    try:
        items = client().get_container_client(container).walk_blobs(
            name_starts_with=prefix or None, delimiter="/", results_per_page=page_size or LIST_PAGE_SIZE)
        for item in items:
            name = item.name[len(prefix):]
            if isinstance(item, blob.BlobPrefix):
                subdirs.append(name.rstrip("/"))
            else:
                sizes[name] = int(item.size or 0)
    except errors.ResourceNotFoundError:
        raise StorageError(f"{dir_uri}: container {container!r} not found") from None
    except errors.AzureError as exc:
        raise _api_error(dir_uri, "list", exc) from None
    sizes.pop("", None)  # a "directory marker" blob named like the prefix
    subdirs = [d for d in subdirs if d]
    for d in subdirs:  # hierarchical namespace: a directory may also be listed as a blob
        sizes.pop(d, None)
    return sizes, subdirs


def list_names(dir_uri: str, page_size: int | None = None) -> list[str]:
    """Names directly under the prefix ``dir_uri`` (blobs and sub-"directories"), like ``ls``.

    Uses ``delimiter="/"``; every page is fetched (``page_size`` blobs per request, default
    :data:`LIST_PAGE_SIZE`). Empty "directory marker" blobs (``prefix/``) are skipped.

    Returns:
        Unsorted names without the prefix and without a trailing ``/``; ``[]`` when nothing is there.

    Raises:
        StorageError: the container does not exist, or the listing failed after retries.
    """
    sizes, subdirs = _list(dir_uri, page_size)
    return list(sizes) + subdirs


def list_sizes(dir_uri: str, page_size: int | None = None) -> dict[str, int]:
    """``{name: size in bytes}`` of the blobs directly under ``dir_uri`` (one listing; no
    sub-"directories").

    Raises:
        StorageError: as :func:`list_names`.
    """
    return _list(dir_uri, page_size)[0]


def list_glob(dir_uri: str, pattern: str, page_size: int | None = None) -> list[str]:
    """Blob names below ``dir_uri`` (relative, ``/``-separated) matching the glob ``pattern`` (``*`` does
    not cross ``/``), from one flat listing of the names starting with ``dir_uri``'s prefix plus the
    pattern's literal head (paged, :data:`LIST_PAGE_SIZE`), filtered client-side.

    Raises:
        StorageError: the container does not exist, or the listing failed after retries.
    """
    errors = _errors()
    container, key = objectstore.split_uri(dir_uri, SCHEME, "container")
    prefix = objectstore.dir_prefix(key)
    literal = re.split(r"[*?\[]", pattern, maxsplit=1)[0]
    regex = objectstore.glob_regex(pattern)
    names: list[str] = []
    try:
        items = client().get_container_client(container).list_blobs(
            name_starts_with=(prefix + literal) or None, include=["metadata"],
            results_per_page=page_size or LIST_PAGE_SIZE)
        for item in items:
            if (item.metadata or {}).get("hdi_isfolder") == "true":  # a directory (hierarchical namespace)
                continue
            names.append(item.name[len(prefix):])
    except errors.ResourceNotFoundError:
        raise StorageError(f"{dir_uri}: container {container!r} not found") from None
    except errors.AzureError as exc:
        raise _api_error(dir_uri, "list", exc) from None
    return [n for n in names if regex.fullmatch(n)]


def delete(uri: str) -> None:
    """Delete the blob ``uri`` if it exists (a missing blob or container is not an error).

    Raises:
        StorageError: the request failed after retries (also a blob with snapshots, which this project
            never takes: HTTP 409 SnapshotsPresent).
    """
    errors = _errors()
    try:
        _blob(uri).delete_blob()
    except errors.ResourceNotFoundError:
        pass
    except errors.AzureError as exc:
        raise _api_error(uri, "delete", exc) from None


def move(src: str, dst: str) -> None:
    """Move the blob ``src`` to ``dst``: read it, :func:`write_replace` it at ``dst``, delete ``src``.

    Not atomic: a crash between the steps leaves both; a rerun finds ``src`` again and moves it again
    (the write replaces ``dst`` with the same bytes).

    Raises:
        FileNotFoundError: ``src`` does not exist.
        StorageError: a step failed after retries.
    """
    write_replace(dst, read_bytes(src))
    delete(src)


def copy(src: str, dst: str) -> None:
    """Copy the blob ``src`` to ``dst`` create-only: read it and :func:`write_create_only` it (an
    existing ``dst`` with the same bytes is a success: a retried copy whose reply was lost).

    Raises:
        FileNotFoundError: ``src`` does not exist.
        AlreadyExistsError: ``dst`` exists with other content.
        StorageError: a step failed after retries.
    """
    write_create_only(dst, read_bytes(src))


def content_tag(uri: str) -> str:
    """``etag=<etag>;size=<bytes>;modified=<ISO time>`` of the blob: every write gives a new ETag.

    Raises:
        FileNotFoundError: ``uri`` does not exist.
        StorageError: the request failed after retries.
    """
    errors = _errors()
    try:
        props = _blob(uri).get_blob_properties()
    except errors.ResourceNotFoundError:
        raise FileNotFoundError(uri) from None
    except errors.AzureError as exc:
        raise _api_error(uri, "stat", exc) from None
    modified = props.last_modified.isoformat() if props.last_modified else ""
    return f"etag={str(props.etag).strip(chr(34))};size={props.size};modified={modified}"


# -------------------------------------------------------------------------------------------- pyarrow


def arrow_filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem over this module's client and ``"container/name"`` path for reading ``uri``
    with pyarrow (and for pyiceberg's files): :func:`batch_contract.storage.azure_arrow.blob_filesystem`,
    so reads get this module's retries, credentials and error messages (why not pyarrow's own
    ``AzureFileSystem``: that module's docstring).

    Raises:
        StorageError: ``uri`` is not ``az://container[/name]``.
    """
    from batch_contract.storage.azure_arrow import blob_filesystem

    container, key = objectstore.split_uri(uri, SCHEME, "container")
    with _lock:
        fs = _arrow_filesystems.get("fs")
        if fs is None:
            fs = _arrow_filesystems["fs"] = blob_filesystem()
    return fs, f"{container}/{key}".rstrip("/")


# -------------------------------------------------------------------------------------------- backend


class AzureBlobBackend(StorageBackend):
    """``az://container/name`` blobs: the module functions above as a :class:`StorageBackend`.

    ``shared``: every machine with the account's credentials sees the same blobs (what Kubernetes pods
    need). ``arrow_filesystem_required``: a library's own Azure client (pyiceberg's) does not read
    :data:`CONNECTION_STRING_ENV` / :data:`ACCOUNT_NAME_ENV` the way :func:`client` does;
    :meth:`arrow_filesystem` does. ``config_envs``: the account name and endpoint override; the
    connection string is a secret (it may hold the account key), so it is not listed.
    """

    scheme = SCHEME
    shared = True
    arrow_filesystem_required = True
    config_envs = (ACCOUNT_NAME_ENV, BLOB_ENDPOINT_ENV)

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
        """See :func:`list_glob` (one flat listing)."""
        return list_glob(dir_uri, pattern)

    def delete(self, uri: str) -> None:
        """See :func:`delete`."""
        delete(uri)

    def move(self, src: str, dst: str) -> None:
        """See :func:`move` (not atomic: read, replace at ``dst``, delete ``src``)."""
        move(src, dst)

    def copy(self, src: str, dst: str) -> None:
        """See :func:`copy` (read, then create-only write)."""
        copy(src, dst)

    def content_tag(self, uri: str) -> str:
        """See :func:`content_tag` (ETag, size, last-modified)."""
        return content_tag(uri)

    def arrow_filesystem(self, uri: str) -> tuple[pafs.FileSystem, str]:
        """See :func:`arrow_filesystem` (path ``"container/name"``)."""
        return arrow_filesystem(uri)

    def normalize(self, uri: str) -> str:
        """``az://container/a/`` -> ``az://container/a`` (see :func:`objectstore.normalize`).

        Raises:
            StorageError: not an ``az://`` URI, no container name, or a ``.``, ``..`` or empty segment.
        """
        return objectstore.normalize(uri, SCHEME, "container")

    def is_under(self, uri: str, root: str) -> bool:
        """Whether ``uri`` lies under ``root`` by container and whole key segments. Neither may hold a dot
        or empty segment (refused, not collapsed: an HTTP client may collapse ``..`` in a request path,
        even across the container name), so the name compared is the name sent.

        Raises:
            StorageError: either URI is not ``az://container[/prefix]`` or holds a refused segment.
        """
        return is_segment_prefix(self.normalize(uri), self.normalize(root), "/")
