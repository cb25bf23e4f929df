"""Atomic table-swap publish of a run's results (DuckDB embedded default, PostgreSQL).

Never imports Airflow: the DAG task and the CLI (``python -m batch_inference.publish``) both call
:func:`publish_run` / :func:`rollback` with a :class:`PublishTarget`. See ``docs/publish.md``.
"""

from __future__ import annotations

from batch_inference.publish.api import publish_run, rollback
from batch_inference.publish.errors import CoverageError, PublishError
from batch_inference.publish.target import PublishTarget

__all__ = ["CoverageError", "PublishError", "PublishTarget", "publish_run", "rollback"]
