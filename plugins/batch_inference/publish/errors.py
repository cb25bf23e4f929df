"""Errors raised by publish. Every message names the run, shard, file or count at fault."""

from __future__ import annotations


class PublishError(RuntimeError):
    """Publish refused or failed; the live table is unchanged."""


class CoverageError(PublishError):
    """The run's results and dead letters do not cover every manifest id exactly once.

    Attributes:
        missing: number of expected ids with neither a result nor a dead letter.
        unexpected: number of result/dead-letter ids that are not in the manifest's input rows.
        sample: up to 10 offending ids (``"<source_uri>#<row>"`` for rows whose id was null).
    """

    def __init__(self, message: str, *, missing: int, unexpected: int, sample: list[str]) -> None:
        super().__init__(message)
        self.missing = missing
        self.unexpected = unexpected
        self.sample = sample


class ForeignTableError(PublishError):
    """A table publish would create, replace, rename or drop exists but publish did not create it (it
    carries no publish mark); nothing was changed. The message names the tables, never a DSN.

    Attributes:
        target: ``backend:schema.table`` of the publish target.
        tables: ``schema.table`` names of the unmarked tables.
    """

    def __init__(self, target: str, tables: list[str]) -> None:
        super().__init__(
            f"{target}: {', '.join(tables)} exist(s) but publish did not create it; refusing to replace, "
            "rename or drop a table publish did not create (pick another output_table or schema, or move "
            "that table away)")
        self.target = target
        self.tables = list(tables)


class PublishConnectionError(PublishError):
    """Publish could not use a database connection: the connection is of the wrong type, or connecting
    failed. The message names the connection id / target and the reason, never a DSN, URI or password."""
