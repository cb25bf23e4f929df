"""Atomic table-swap publish of a run's results (DuckDB embedded default, PostgreSQL).

Never imports Airflow (except :mod:`.connections`, which the Airflow side imports to resolve a
connection id): the DAG task and the CLI (``python -m batch_inference.publish``) both call
:func:`publish_run` / :func:`rollback` with a :class:`PublishTarget`; :func:`check_target` is the
read-only preflight for the plan task. See ``docs/publish.md``.

The names below are imported on first use (PEP 562): ``batch_inference.params`` reads the table-name
rule from ``publish.target`` when a DAG file parses, and that must not import DuckDB and pyarrow with
the package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from batch_inference.publish.api import check_target, publish_run, rollback
    from batch_inference.publish.errors import (
        CoverageError,
        ForeignTableError,
        PublishConnectionError,
        PublishError,
    )
    from batch_inference.publish.target import PublishTarget

_EXPORTS = {"publish_run": "api", "rollback": "api", "check_target": "api", "CoverageError": "errors",
            "ForeignTableError": "errors", "PublishConnectionError": "errors", "PublishError": "errors",
            "PublishTarget": "target"}
__all__ = ["CoverageError", "ForeignTableError", "PublishConnectionError", "PublishError", "PublishTarget",
           "check_target", "publish_run", "rollback"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
