"""OpenLineage dataset identities of a run's input and output table (namespace + name), per the OpenLineage
naming conventions (https://openlineage.io/docs/spec/naming). No OpenLineage, Airflow or storage client
import: every rule here is a pure function of its arguments (and, for ``az://``, of the storage account
settings in the environment, read as :mod:`batch_contract.storage.azure` reads them).

Input (a file, a directory / object prefix, or a glob, as ``input_uri`` allows):

=========================  ==================================================  ============================
URI                        namespace                                           name
=========================  ==================================================  ============================
``/p/x``, ``file:///p/x``  ``file``                                            ``/p/x`` (absolute)
``file://host/p/x``        ``file://host``                                     ``/p/x``
``gs://b/k``               ``gs://b``                                          ``k``
``s3://b/k``               ``s3://b``                                          ``k``
``az://c/k``               ``wasbs://c@<account>.dfs.core.windows.net``        ``k``
=========================  ==================================================  ============================

A glob names its fixed directory (the part before the first segment with ``*``, ``?`` or ``[``), as the
planner lists it; a trailing ``/`` is dropped; a bucket or container root is named ``/``.

Output table, by publish backend:

* ``postgres``: ``postgres://<host>:<port>`` / ``<database>.<schema>.<table>`` (the spec's row).
* ``duckdb``: ``duckdb://<absolute file path>`` / ``<catalog>.<schema>.<table>``, the catalog being the
  file's stem, DuckDB's name for an attached file (DuckDB has no row in the spec; this is the form of
  OpenLineage's own dbt integration, ``duckdb://{path}``).
* ``iceberg``: the table's location ``<warehouse>/<schema>/<table>`` (pyiceberg's default for a table
  created without one) named as a file or object, with a ``TABLE`` symlink ``<schema>.<table>`` in the
  warehouse's namespace and the catalog described: the form of OpenLineage's Spark integration for
  path-based Iceberg catalogs.
* any other backend: ``<backend>`` / ``<schema>.<table>``.

No name or namespace ever holds a credential: a PostgreSQL DSN contributes its host, port and database
only, an Azure connection string its account name only.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from urllib.parse import unquote, urlsplit

from batch_contract.storage.azure import ACCOUNT_NAME_ENV, BLOB_ENDPOINT_ENV, CONNECTION_STRING_ENV

GLOB_CHARS = frozenset("*?[")
"""Characters that make ``input_uri`` a glob (the planner's rule)."""
POSTGRES_DEFAULT_PORT = 5432
ICEBERG_CATALOG_NAME = "batch_inference"
"""The name publish gives its pyiceberg ``SqlCatalog`` (:mod:`batch_inference.publish.iceberg_backend`)."""

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


@dataclass(frozen=True)
class DatasetId:
    """One OpenLineage dataset identity.

    Attributes:
        namespace: the data source (``file``, ``gs://bucket``, ``postgres://host:5432``, ...).
        name: the dataset within it (a path, an object key or prefix, ``db.schema.table``).
    """

    namespace: str
    name: str


@dataclass(frozen=True)
class IcebergCatalog:
    """What the ``catalog`` dataset facet says of an Iceberg table's catalog.

    Attributes:
        name: the catalog's name in pyiceberg (:data:`ICEBERG_CATALOG_NAME`).
        type: ``sql`` (pyiceberg's ``SqlCatalog``, in SQLite or PostgreSQL).
        warehouse_uri: the warehouse location (``file:///...``, ``gs://bucket/...``).
        metadata_uri: where the catalog lives, without credentials (``sqlite:///.../catalog.db``,
            ``postgres://host:5432/db``); ``None`` when unknown.
    """

    name: str
    type: str
    warehouse_uri: str
    metadata_uri: str | None


@dataclass(frozen=True)
class TableId:
    """The OpenLineage identity of a published table.

    Attributes:
        dataset: its primary identity.
        symlinks: other names of the same table (``(namespace, name, type)``; Iceberg: the catalog
            name ``<schema>.<table>``).
        catalog: the Iceberg catalog, ``None`` for the other backends.
    """

    dataset: DatasetId
    symlinks: tuple[tuple[str, str, str], ...] = field(default_factory=tuple)
    catalog: IcebergCatalog | None = None


def _scheme(uri: str) -> str:
    match = _SCHEME.match(uri)
    return match.group(1).lower() if match else ""


def _fixed_part(uri: str) -> str:
    """``uri`` up to (without) its first path segment holding a glob character; ``uri`` itself if none."""
    while any(c in uri for c in GLOB_CHARS) and "/" in uri:
        uri = uri.rsplit("/", 1)[0]
    return uri


def _key(path: str) -> str:
    """An object key or prefix from a URI path: no leading or trailing ``/``; ``/`` for the root."""
    return path.strip("/") or "/"


def azure_account(environ: dict[str, str] | None = None) -> str:
    """The Azure storage account ``az://`` URIs live in, from the settings the storage backend reads:
    ``AZURE_STORAGE_ACCOUNT_NAME``, else ``AccountName=`` of ``AZURE_STORAGE_CONNECTION_STRING``, else
    the account of its ``BlobEndpoint=`` (``https://<account>.blob...`` or an emulator's
    ``http://host:port/<account>``). Reads no key or signature.

    Args:
        environ: the environment (default ``os.environ``).

    Raises:
        ValueError: none of them names an account (``az://`` storage cannot be used without one either).
    """
    env = os.environ if environ is None else environ
    account = env.get(ACCOUNT_NAME_ENV, "").strip()
    if account:
        return account
    parts = {}
    for item in env.get(CONNECTION_STRING_ENV, "").split(";"):
        key, sep, value = item.partition("=")
        if sep:
            parts[key.strip().lower()] = value.strip()
    if parts.get("accountname"):
        return parts["accountname"]
    endpoint = parts.get("blobendpoint") or env.get(BLOB_ENDPOINT_ENV, "").strip()
    if endpoint:
        split = urlsplit(endpoint)
        host = split.hostname or ""
        if host.endswith(".core.windows.net") or ".blob." in host:
            return host.split(".", 1)[0]
        path_account = split.path.strip("/").split("/", 1)[0]
        if path_account:
            return path_account
    raise ValueError(f"az://: no storage account to name the dataset by; set {ACCOUNT_NAME_ENV} or an "
                     f"{CONNECTION_STRING_ENV} with AccountName=")


def path_dataset(uri: str, environ: dict[str, str] | None = None) -> DatasetId:
    """The dataset of a file, directory, object, object prefix or glob (see the module docstring).

    Args:
        uri: a local path (made absolute against the working directory), ``file://``, ``gs://``,
            ``s3://`` or ``az://`` URI; a glob is named by its fixed directory.
        environ: the environment for ``az://`` (:func:`azure_account`; default ``os.environ``).

    Raises:
        ValueError: an ``az://`` URI and no storage account is configured; a URI of another scheme.
    """
    uri = _fixed_part(uri)
    scheme = _scheme(uri)
    if scheme == "":
        return DatasetId("file", os.path.abspath(uri).rstrip("/") or "/")
    split = urlsplit(uri)
    if scheme == "file":
        path = unquote(split.path).rstrip("/") or "/"
        host = split.netloc
        return DatasetId(f"file://{host}", path) if host and host != "localhost" else DatasetId("file", path)
    if scheme in ("gs", "s3"):
        return DatasetId(f"{scheme}://{split.netloc}", _key(split.path))
    if scheme == "az":
        account = azure_account(environ)
        return DatasetId(f"wasbs://{split.netloc}@{account}.dfs.core.windows.net", _key(split.path))
    raise ValueError(f"{uri}: no OpenLineage naming for scheme {scheme!r} (local paths, file://, gs://, "
                     "s3://, az://)")


def _location_namespace(uri: str, environ: dict[str, str] | None) -> str:
    """The namespace a location's symlinks live in (OpenLineage's Java ``FilesystemDatasetUtils``):
    ``file:<absolute path>`` locally, the URI itself (no trailing ``/``) for an object store."""
    dataset = path_dataset(uri, environ)
    if dataset.namespace == "file":
        return f"file:{dataset.name}"
    if dataset.name == "/":
        return dataset.namespace
    return f"{dataset.namespace}/{dataset.name}"


def postgres_server(dsn: str) -> tuple[str, int, str]:
    """``(host, port, database)`` of a libpq DSN (``postgresql://`` / ``postgres://`` URI or keyword
    string), with libpq's defaults for what it leaves out (``localhost``, 5432, the user name as the
    database). Credentials are never read into the result.

    Raises:
        ValueError: a keyword string that does not parse (an unterminated quote).
    """
    if _scheme(dsn) in ("postgres", "postgresql", "postgresql+psycopg"):
        split = urlsplit(dsn)
        host = split.hostname or "localhost"
        port = split.port or POSTGRES_DEFAULT_PORT
        database = unquote(split.path.lstrip("/")) or unquote(split.username or "")
        return host, port, database
    values = _keyword_dsn(dsn)
    host = values.get("host", "").split(",")[0] or "localhost"
    if host.startswith("/"):  # a Unix-socket directory: the server is this host
        host = "localhost"
    port = int(values.get("port", "").split(",")[0] or POSTGRES_DEFAULT_PORT)
    return host, port, values.get("dbname") or values.get("user", "")


def _keyword_dsn(dsn: str) -> dict[str, str]:
    """``key=value`` pairs of a libpq keyword string (values may be single-quoted, ``\\`` escapes)."""
    values: dict[str, str] = {}
    pattern = re.compile(r"\s*(\w+)\s*=\s*('(?:[^'\\]|\\.)*'|[^\s']*)")
    pos = 0
    while pos < len(dsn.rstrip()):
        match = pattern.match(dsn, pos)
        if not match:
            raise ValueError("dsn: not a libpq keyword string (key=value ...)")
        value = match.group(2)
        if value.startswith("'"):
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        values[match.group(1).lower()] = value
        pos = match.end()
    return values


def postgres_table(dsn: str, schema: str, table: str) -> TableId:
    """``postgres://<host>:<port>`` / ``<database>.<schema>.<table>`` (see :func:`postgres_server`)."""
    host, port, database = postgres_server(dsn)
    return TableId(DatasetId(f"postgres://{host}:{port}", f"{database}.{schema}.{table}"))


def duckdb_table(duckdb_path: str, schema: str, table: str) -> TableId:
    """``duckdb://<absolute path>`` / ``<file stem>.<schema>.<table>``."""
    path = os.path.abspath(duckdb_path)
    return TableId(DatasetId(f"duckdb://{path}", f"{PurePosixPath(path).stem}.{schema}.{table}"))


def iceberg_table(warehouse: str, schema: str, table: str, catalog_dsn: str | None = None,
                  environ: dict[str, str] | None = None) -> TableId:
    """An Iceberg table of publish's catalog: its location ``<warehouse>/<schema>/<table>`` as a path
    dataset, a ``TABLE`` symlink ``<schema>.<table>`` in the warehouse's namespace and the catalog.

    Args:
        warehouse: the warehouse location (``PublishTarget.iceberg_warehouse``: a local path, ``file://``
            or object-store URI).
        schema / table: the Iceberg namespace and table name.
        catalog_dsn: the PostgreSQL catalog's DSN, ``None`` for the SQLite ``catalog.db`` beside a local
            warehouse.
        environ: for an ``az://`` warehouse (:func:`azure_account`).

    Raises:
        ValueError: see :func:`path_dataset`, :func:`postgres_server`.
    """
    if _scheme(warehouse) == "":
        warehouse = "file://" + os.path.abspath(warehouse)
    warehouse = warehouse.rstrip("/")
    location = f"{warehouse}/{schema}/{table}"
    metadata = None
    if catalog_dsn:
        host, port, database = postgres_server(catalog_dsn)
        metadata = f"postgres://{host}:{port}/{database}"
    elif (local := path_dataset(warehouse, environ)).namespace == "file":
        metadata = "sqlite://" + str(PurePosixPath(local.name).parent / "catalog.db")
    return TableId(
        dataset=path_dataset(location, environ),
        symlinks=((_location_namespace(warehouse, environ), f"{schema}.{table}", "TABLE"),),
        catalog=IcebergCatalog(name=ICEBERG_CATALOG_NAME, type="sql", warehouse_uri=warehouse,
                               metadata_uri=metadata),
    )


def table_id(backend: str, schema: str, table: str, *, duckdb_path: str | None = None, dsn: str | None = None,
             iceberg_warehouse_uri: str | None = None, environ: dict[str, str] | None = None) -> TableId:
    """The identity of table ``<schema>.<table>`` of publish backend ``backend`` (see the module docstring).

    Args:
        backend: ``duckdb``, ``postgres``, ``iceberg`` or another registered backend.
        schema / table: where publish wrote (``PublishTarget.schema`` / ``.table``).
        duckdb_path: the DuckDB file (``duckdb``).
        dsn: the server's DSN (``postgres``), the catalog's (``iceberg``, optional); only host, port and
            database are read.
        iceberg_warehouse_uri: the warehouse (``iceberg``).
        environ: for ``az://`` locations (default ``os.environ``).

    Raises:
        ValueError: a setting the backend needs is missing (the message names it), or see
            :func:`path_dataset` / :func:`postgres_server`.
    """
    if backend == "duckdb":
        if not duckdb_path:
            raise ValueError("duckdb_path: required to name a duckdb table")
        return duckdb_table(duckdb_path, schema, table)
    if backend == "postgres":
        if not dsn:
            raise ValueError("dsn: required to name a postgres table")
        return postgres_table(dsn, schema, table)
    if backend == "iceberg":
        if not iceberg_warehouse_uri:
            raise ValueError("iceberg_warehouse: required to name an iceberg table")
        return iceberg_table(iceberg_warehouse_uri, schema, table, dsn, environ)
    return TableId(DatasetId(backend, f"{schema}.{table}"))


__all__ = ["DatasetId", "IcebergCatalog", "TableId", "azure_account", "duckdb_table", "iceberg_table",
           "path_dataset", "postgres_server", "postgres_table", "table_id"]
