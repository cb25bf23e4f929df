"""The operator extra link from a batch-inference run's ``publish`` / ``summary`` task to its page.

Those tasks are ``@task``-decorated (one operator class shared with every other ``@task`` of the
deployment), so the link is registered as a *global* operator extra link and answers only for the
tasks named in :data:`LINK_TASKS` of a DAG tagged ``batch-inference``; for any other task it returns
``""``, which the API turns into ``null`` and the UI does not show. The API server evaluates it when the
task's Details view asks for its links; nothing is pushed to XCom.
"""

from __future__ import annotations

from typing import Any, ClassVar
from urllib.parse import quote, urlsplit

import attrs
from airflow.sdk.bases.operatorlink import BaseOperatorLink

URL_PREFIX = "/batch-inference"
"""Where the plugin's FastAPI app is mounted on the API server."""
LINK_TASKS = ("publish", "summary")
"""Task ids that carry the link."""
DAG_TAG = "batch-inference"
"""The tag every DAG of :mod:`batch_inference.dag_factory` carries (``BASE_TAGS[0]``)."""


def base_path(base_url: str | None) -> str:
    """The path part of ``[api] base_url`` without a trailing slash (``""`` when served at the root)."""
    return urlsplit(base_url or "").path.rstrip("/")


def run_page_path(dag_id: str, run_id: str, base_url: str | None = None) -> str:
    """``<base path>/batch-inference/runs/<dag_id>/<run_id>``, each id percent-encoded as one segment."""
    return f"{base_path(base_url)}{URL_PREFIX}/runs/{quote(dag_id, safe='')}/{quote(run_id, safe='')}"


def _dag_tags(operator: Any) -> set[str]:
    dag = getattr(operator, "dag", None)
    return set(getattr(dag, "tags", None) or [])


@attrs.define()
class BatchRunPageLink(BaseOperatorLink):
    """"Batch inference run" on the ``publish`` and ``summary`` tasks: the run's page (same origin, so
    the UI opens it in the same tab)."""

    name: ClassVar[str] = "Batch inference run"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        """The run's page path, or ``""`` for any other task (see the module docstring)."""
        if operator.task_id not in LINK_TASKS or DAG_TAG not in _dag_tags(operator):
            return ""
        from airflow.configuration import conf

        return run_page_path(ti_key.dag_id, ti_key.run_id, conf.get("api", "base_url", fallback=""))
