"""Validation of OpenLineage events against the JSON Schemas of the spec (import it:
``from lineage_schemas import event_errors``).

The spec's schemas are vendored under ``tests/schemas/openlineage/`` (see its README for the commit);
this project's ``batchInference`` run facet schema is ``plugins/batch_inference/lineage/BatchInferenceRunFacet.json``.
An event is checked twice over: as a whole against the ``RunEvent`` of the spec version its ``schemaURL``
names, then each facet (run, job, dataset, input and output facets) against the schema its own
``_schemaURL`` names, which must be one of the vendored schemas. Formats are checked: ``date-time`` and
``uuid`` by jsonschema, ``uri`` by :func:`_is_uri` (an absolute URI: scheme and authority or path).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from jsonschema import Draft202012Validator, FormatChecker
from referencing import Registry, Resource
from run_helpers import REPO_ROOT

SCHEMA_DIR = REPO_ROOT / "tests" / "schemas" / "openlineage"
PROJECT_FACET_SCHEMA = REPO_ROOT / "plugins" / "batch_inference" / "lineage" / "BatchInferenceRunFacet.json"


def schema_files() -> list[Path]:
    """Every schema :func:`registry` holds: the vendored spec files and the project's facet schema."""
    return sorted(SCHEMA_DIR.rglob("*.json")) + [PROJECT_FACET_SCHEMA]


@cache
def schemas() -> dict[str, dict[str, Any]]:
    """``$id`` -> schema of every file of :func:`schema_files`."""
    out = {}
    for path in schema_files():
        contents = json.loads(path.read_text(encoding="utf-8"))
        out[contents["$id"]] = contents
    return out


@cache
def registry() -> Registry:
    """The schemas of :func:`schemas`, each under its ``$id``."""
    return Registry().with_resources((uri, Resource.from_contents(s)) for uri, s in schemas().items())


def _is_uri(value: object) -> bool:
    if not isinstance(value, str):
        return True
    split = urlsplit(value)
    return bool(split.scheme) and bool(split.netloc or split.path)


@cache
def _format_checker() -> FormatChecker:
    checker = FormatChecker(formats=Draft202012Validator.FORMAT_CHECKER.checkers)
    checker.checks("uri")(_is_uri)
    return checker


def _errors(instance: Any, url: str) -> list[str]:
    """Messages of every way ``instance`` fails the schema at ``url`` (a ``$id`` plus ``#`` pointer)."""
    if url.split("#", 1)[0] not in schemas():
        return [f"{url}: not a vendored schema"]
    validator = Draft202012Validator({"$ref": url}, registry=registry(), format_checker=_format_checker())
    return [f"{url} at /{'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(instance)]


def facets_of(event: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(where, facet)`` for every facet of ``event`` (``where`` like ``outputs[0].outputFacets.version``)."""
    for section in ("run", "job"):
        for key, facet in (event.get(section, {}).get("facets") or {}).items():
            yield f"{section}.facets.{key}", facet
    for side, own in (("inputs", "inputFacets"), ("outputs", "outputFacets")):
        for i, dataset in enumerate(event.get(side) or []):
            for kind in ("facets", own):
                for key, facet in (dataset.get(kind) or {}).items():
                    yield f"{side}[{i}].{kind}.{key}", facet


def event_errors(event: dict[str, Any]) -> list[str]:
    """Every schema violation of one OpenLineage event, or ``[]`` (see the module docstring)."""
    errors = _errors(event, event.get("schemaURL", ""))
    for where, facet in facets_of(event):
        errors += [f"{where}: {message}" for message in _errors(facet, facet.get("_schemaURL", ""))]
    return errors
