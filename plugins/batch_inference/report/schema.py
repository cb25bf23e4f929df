"""The JSON Schema of ``report.json`` (``report.schema.json`` beside this module) and a validator."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SCHEMA_PATH = Path(__file__).with_name("report.schema.json")


def load_schema() -> dict[str, Any]:
    """The report JSON Schema (draft 2020-12) as a dict."""
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


def validate_report(report: dict[str, Any]) -> None:
    """Validate a report dict against :func:`load_schema`.

    Raises:
        jsonschema.ValidationError: the report does not match; the message names the failing path.
    """
    import jsonschema  # imported lazily: needed only by callers that validate

    jsonschema.Draft202012Validator(load_schema()).validate(report)
