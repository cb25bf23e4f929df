"""Where a run is published: :class:`PublishTarget`, identifier validation and quoting.

Schema and table names arrive from a trigger form, so they are validated against a strict pattern when
the target is built and always double-quoted when they reach SQL text. Every derived name (staging,
previous, dead letters, publish log) is built here so both backends agree on it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from batch_inference.publish import registry

BACKEND_CLASSES = registry.BACKEND_CLASSES
"""Re-exported from :mod:`batch_inference.publish.registry`, the one place backends are listed."""
BACKENDS = registry.BACKENDS
"""Publish backend names (:data:`batch_inference.publish.registry.BACKENDS`)."""

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
TABLE_FAMILY = ("", SUFFIX_PREVIOUS, SUFFIX_STAGING, SUFFIX_DEAD_LETTERS, SUFFIX_DEAD_LETTERS + SUFFIX_PREVIOUS,
                SUFFIX_DEAD_LETTERS + SUFFIX_STAGING, SUFFIX_PUBLISH_LOG)
"""Suffixes of every table a SQL publish of ``<table>`` creates, swaps, renames or drops (``""``: the live
table). Each must carry publish's mark before publish touches it."""

DEFAULT_SCHEMA = "batch_inference"
"""Schema (PostgreSQL, DuckDB) / namespace (Iceberg) publish works in unless the target names another:
a schema of its own, so a table name from a trigger form never lands beside an application's tables."""

REGISTRY_TABLE = "batch_inference_publish_registry_of_owned_tables"
"""The table, in the target's schema, in which publish marks the tables it created (PostgreSQL: by
table OID; DuckDB: by name, kept in step with every rename). 48 characters: longer than any table name
(:data:`MAX_TABLE_LEN`) and ending in no reserved suffix, so no target's table can be named like it."""

DSN_SCHEMES = ("postgres", "postgresql")
"""URI schemes a PostgreSQL ``dsn`` may have (a ``dsn`` without ``://`` is a libpq keyword string)."""


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


def validate_table_name(table: object) -> str:
    """Return ``table`` if publish accepts it as a table name on every backend (the rule of
    :class:`PublishTarget`'s ``table``), else raise.

    Raises:
        ValueError: not an identifier of at most :data:`MAX_TABLE_LEN` characters, or ending in one of
            :data:`RESERVED_SUFFIXES` (the message starts with ``table:``).
    """
    name = validate_identifier(table, "table", MAX_TABLE_LEN)
    if name.endswith(RESERVED_SUFFIXES):
        raise ValueError(f"table: {name!r} ends with a reserved suffix {RESERVED_SUFFIXES}")
    return name


@dataclass(frozen=True)
class PublishTarget:
    """A table to publish a run into.

    Attributes:
        backend: one of :data:`BACKENDS` (default :data:`~batch_inference.publish.registry.DEFAULT_BACKEND`):
            a DuckDB database file (the embedded default), PostgreSQL, or Apache Iceberg tables (pyiceberg
            SQL catalog).
        table: table name, ``[a-z_][a-z0-9_]*``, at most 39 characters. Derived tables:
            ``<table>__previous``, ``<table>__dead_letters`` (+ ``__previous``), ``<table>__publish_log``,
            and transient ``<table>__staging`` / ``<table>__dead_letters__staging``.
        schema: schema (PostgreSQL, DuckDB) or namespace (Iceberg) of every table publish writes, same
            rule as ``table`` (at most 63 characters); default (also when ``None`` is passed)
            :data:`DEFAULT_SCHEMA`; created if missing. Publish refuses to replace, rename or drop a
            table there that it did not create (:class:`~batch_inference.publish.errors.ForeignTableError`).
        duckdb_path: DuckDB database file (required for ``duckdb``; created if missing).
        dsn: libpq connection string or ``postgres://`` / ``postgresql://`` URI (required for
            ``postgres``); a secret: left out of ``repr`` and of every message publish raises.
            :func:`batch_inference.publish.connections.airflow_postgres_dsn` gives it for an Airflow
            connection id after checking the connection's type. For ``iceberg``: optional
            ``postgresql://`` URI of the catalog database (default: a SQLite ``catalog.db`` beside the
            warehouse directory).
        iceberg_warehouse: warehouse directory (local path, ``file://`` or ``gs://``) of the Iceberg
            data and metadata files (required for ``iceberg``; a ``gs://`` one needs ``dsn``).

    Construction checks the fields every backend shares (``backend``, ``table``, ``schema``), then
    the backend's own rules: ``validate_target`` of its class in :mod:`batch_inference.publish.registry`
    (which imports the backend's module).

    Raises:
        ValueError: at construction, naming the bad field (a message about ``dsn`` never quotes it).
        ImportError: the backend's driver (psycopg, pyiceberg) is not installed.
    """

    backend: str = registry.DEFAULT_BACKEND
    table: str = ""
    schema: str = DEFAULT_SCHEMA
    duckdb_path: str | None = None
    dsn: str | None = field(default=None, repr=False)
    iceberg_warehouse: str | None = None

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend: {self.backend!r} is not one of {', '.join(BACKENDS)}")
        validate_table_name(self.table)
        if self.schema is None:
            object.__setattr__(self, "schema", DEFAULT_SCHEMA)
        validate_identifier(self.schema, "schema", MAX_SCHEMA_LEN)
        registry.backend_class(self.backend).validate_target(self)

    def name(self, suffix: str = "") -> str:
        """Unquoted table name with ``suffix`` (e.g. :data:`SUFFIX_PREVIOUS`)."""
        return f"{self.table}{suffix}"

    def qualified(self, suffix: str = "") -> str:
        """Quoted, schema-qualified name of ``<table><suffix>``, ready for SQL text
        (``"batch_inference"."emb__previous"``)."""
        return f"{quote_ident(self.schema)}.{quote_ident(self.name(suffix))}"

    def display_name(self, suffix: str = "") -> str:
        """Unquoted ``schema.table<suffix>`` for messages."""
        return f"{self.schema}.{self.name(suffix)}"

    def describe(self) -> str:
        """Human-readable ``backend:schema.table`` (no credentials)."""
        return f"{self.backend}:{self.display_name()}"


_URI_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]{0,31})://")


def check_dsn_scheme(dsn: str, allowed: tuple[str, ...]) -> None:
    """Refuse a ``dsn`` URI whose scheme is not in ``allowed`` (psycopg would echo the whole of an
    ``http://user:secret@...`` string in its error). A ``dsn`` not starting with ``scheme://`` is a libpq
    keyword string and passes. The message names the scheme only.

    Raises:
        ValueError: ``dsn`` is not a string, or is a URI with a scheme outside ``allowed``.
    """
    if not isinstance(dsn, str):
        raise ValueError(f"dsn: expected a string, got {type(dsn).__name__}")
    match = _URI_SCHEME.match(dsn)
    if match and match.group(1).lower() not in allowed:
        raise ValueError(f"dsn: URI scheme {match.group(1)!r} is not a PostgreSQL one ({', '.join(allowed)})")
