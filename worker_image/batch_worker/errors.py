"""Worker errors that map to exit codes (see ``batch_contract.enums.ExitCode``)."""

from __future__ import annotations


class BadInputError(ValueError):
    """Input no retry can fix (missing column, wrong id column type, unreadable file): exit code 2.

    The message names the file and column.
    """


class InterruptedBySignal(Exception):
    """A SIGTERM/SIGINT stopped the work after what was finished had been committed: exit code 75
    (``ExitCode.INTERRUPTED``); a retry resumes from the committed files."""
