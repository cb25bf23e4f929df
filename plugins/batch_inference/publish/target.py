"""Where a run is published: :class:`PublishTarget`, identifier validation and quoting.

Schema and table names arrive from a trigger form, so they are validated against a strict pattern when
the target is built and always double-quoted when they reach SQL text. Every derived name (staging,
previous, dead letters, publish log) is built here so both backends agree on it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

BACKEND_CLASSES: dict[str, str] = {
    "duckdb": "batch_inference.publish.duckdb_backend:DuckDBBackend",
    "postgres": "batch_inference.publish.postgres_backend:PostgresBackend",
    "iceberg": "batch_inference.publish.iceberg_backend:IcebergBackend",
}
"""The publish backend registry, in one place: name -> ``module:class`` of its
:class:`~batch_inference.publish.backend.PublishBackend` (imported on first use, so a driver such as
psycopg or pyiceberg loads only when its backend is used)."""
BACKENDS = tuple(BACKEND_CLASSES)
"""Publish backend names: :class:`PublishTarget` validation, the DAG Param's enum, the CLIs and
:func:`~batch_inference.publish.backend.backend_for` all use this tuple."""

IDENTIFIER_PATTERN = re.compile(r"^[a-z_][a-z0-9_]*$")
"""Lower-case letters, digits and underscores, not starting with a digit: no quoting surprises and no
case folding differences between DuckDB and PostgreSQL."""

MAX_TABLE_LEN = 39
"""PostgreSQL truncates identifiers at 63 bytes; the longest derived name adds 24 characters
(``__dead_letters__previous``), so table names are limited to 63 - 24 = 39 characters."""

MAX_SCHEMA_LEN = 63

TABLE_NAME_PATTERN = r"^[a-z_][a-z0-9_]{0,38}$"
"""The table-name rule as one regular expression (for a DAG ``Param(pattern=...)`` or JSON schema), so a
bad name fails on the trigger form instead of at publish time. The reserved suffixes are checked only
by :class:`PublishTarget`."""
SCHEMA_NAME_PATTERN = r"^[a-z_][a-z0-9_]{0,62}$"

SUFFIX_STAGING = "__staging"
SUFFIX_PREVIOUS = "__previous"
SUFFIX_DEAD_LETTERS = "__dead_letters"
SUFFIX_PUBLISH_LOG = "__publish_log"
RESERVED_SUFFIXES = (SUFFIX_STAGING, SUFFIX_PREVIOUS, SUFFIX_DEAD_LETTERS, SUFFIX_PUBLISH_LOG)


DUCKDB_ALIAS = "batch_inference_publish"
"""Catalog name the DuckDB backend attaches the target file under."""

DUCKDB_RESERVED_SCHEMAS = ("temp", "system", DUCKDB_ALIAS)
"""Schema names DuckDB publish refuses: DuckDB's built-in ``temp`` and ``system`` catalogs and the
attach alias share the namespace of schema names, so ``"temp"."t"`` would be ambiguous."""


def validate_identifier(value: object, field_name: str, max_len: int) -> str:
    """Return ``value`` if it is a safe SQL identifier, else raise ``ValueError`` naming the field.

    Args:
        value: the candidate name.
        field_name: the field it came from (``"table"``, ``"schema"``), used in the message.
        max_len: maximum length in characters.

    Raises:
        ValueError: not a string, empty, too long, or outside ``[a-z_][a-z0-9_]*``.
    """
    if not isinstance(value, str):
        raise ValueError(f"{field_name}: expected a string, got {type(value).__name__}")
    if not IDENTIFIER_PATTERN.fullmatch(value) or len(value) > max_len:
        raise ValueError(
            f"{field_name}: {value!r} is not a valid identifier; use 1..{max_len} characters from "
            "a-z, 0-9 and _, not starting with a digit"
        )
    return value


def quote_ident(name: str) -> str:
    """Double-quote an identifier that already passed :func:`validate_identifier`.

    Raises:
        ValueError: ``name`` does not match the identifier pattern (defence in depth).
    """
    if not IDENTIFIER_PATTERN.fullmatch(name):
        raise ValueError(f"refusing to quote unvalidated identifier {name!r}")
    return f'"{name}"'


@dataclass(frozen=True)
class PublishTarget:
    """A table to publish a run into.

    Attributes:
        backend: one of :data:`BACKENDS`: ``"duckdb"`` (a database file; the embedded default),
            ``"postgres"`` or ``"iceberg"`` (Apache Iceberg tables, pyiceberg SQL catalog).
        table: table name, ``[a-z_][a-z0-9_]*``, at most 39 characters. Derived tables:
            ``<table>__previous``, ``<table>__dead_letters`` (+ ``__previous``), ``<table>__publish_log``,
            and transient ``<table>__staging`` / ``<table>__dead_letters__staging``.
        schema: optional schema (``main`` in DuckDB, ``public`` in PostgreSQL when ``None``); created if
            missing.
        duckdb_path: DuckDB database file (required for ``duckdb``; created if missing).
        dsn: libpq connection string or URI (required for ``postgres``). The Airflow side resolves an
            Airflow connection id to this (``BaseHook.get_connection(conn_id).get_uri()``). For
            ``iceberg``: optional ``postgresql://`` URI of the catalog database (default: a SQLite
            ``catalog.db`` beside the warehouse directory).
        iceberg_warehouse: warehouse directory (local path, ``file://`` or ``gs://``) of the Iceberg
            data and metadata files (required for ``iceberg``; a ``gs://`` one needs ``dsn``).

    Raises:
        ValueError: at construction, naming the bad field.
    """

    backend: str = "duckdb"
    table: str = ""
    schema: str | None = None
    duckdb_path: str | None = None
    dsn: str | None = None
    iceberg_warehouse: str | None = None

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend: {self.backend!r} is not one of {', '.join(BACKENDS)}")
        validate_identifier(self.table, "table", MAX_TABLE_LEN)
        if self.table.endswith(RESERVED_SUFFIXES):
            raise ValueError(f"table: {self.table!r} ends with a reserved suffix {RESERVED_SUFFIXES}")
        if self.schema is not None:
            validate_identifier(self.schema, "schema", MAX_SCHEMA_LEN)
        if self.backend == "duckdb" and not self.duckdb_path:
            raise ValueError("duckdb_path: required when backend is 'duckdb'")
        if self.backend == "duckdb" and self.schema in DUCKDB_RESERVED_SCHEMAS:
            raise ValueError(f"schema: {self.schema!r} names a DuckDB catalog, which makes table references "
                             f"ambiguous; not one of {', '.join(DUCKDB_RESERVED_SCHEMAS)}")
        if self.backend == "postgres" and not self.dsn:
            raise ValueError("dsn: required when backend is 'postgres'")
        if self.backend == "iceberg" and not self.iceberg_warehouse:
            raise ValueError("iceberg_warehouse: required when backend is 'iceberg'")

    def name(self, suffix: str = "") -> str:
        """Unquoted table name with ``suffix`` (e.g. :data:`SUFFIX_PREVIOUS`)."""
        return f"{self.table}{suffix}"

    def qualified(self, suffix: str = "") -> str:
        """Quoted, schema-qualified name of ``<table><suffix>``, ready for SQL text."""
        rel = quote_ident(self.name(suffix))
        return f"{quote_ident(self.schema)}.{rel}" if self.schema else rel

    def describe(self) -> str:
        """Human-readable ``backend:schema.table`` (no credentials)."""
        where = f"{self.schema}.{self.table}" if self.schema else self.table
        return f"{self.backend}:{where}"
