"""Worker errors that map to exit codes (see ``batch_contract.enums.ExitCode``)."""

from __future__ import annotations


class BadInputError(ValueError):
    """Input no retry can fix (missing column, wrong id column type, unreadable file): exit code 2.

    The message names the file and column.
    """
