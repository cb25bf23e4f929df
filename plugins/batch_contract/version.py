"""Contract version. Bump on any change to the on-disk layout or schemas; readers accept N and N-1."""

from __future__ import annotations

SCHEMA_VERSION = 1
READABLE_SCHEMA_VERSIONS = frozenset({SCHEMA_VERSION, SCHEMA_VERSION - 1})


def check_schema_version(found: int, what: str) -> None:
    """Raise ``ValueError`` unless ``found`` is a schema version this code can read.

    Args:
        found: the ``schema_version`` field read from a manifest, marker or report.
        what: a name for the object in the error message (e.g. the URI it came from).
    """
    if found not in READABLE_SCHEMA_VERSIONS:
        raise ValueError(
            f"{what}: schema_version {found} is not readable by this code "
            f"(reads {sorted(READABLE_SCHEMA_VERSIONS)}); upgrade the package that reads it"
        )
