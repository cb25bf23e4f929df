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
