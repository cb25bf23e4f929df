"""The Airflow plugin: the **Batch inference** page (FastAPI app + nav entry) and the run-page link.

Every Airflow component imports this module when it loads plugins, so it imports only what registering
needs: the FastAPI app is a :class:`~batch_inference.ui.lazy.LazyApp` built on the API server's first
request (``tests/dags/test_parse_time.py`` measures DAG parsing with and without the plugin).
Registered from the Airflow plugins folder by ``plugins/batch_inference_ui.py``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from airflow.plugins_manager import AirflowPlugin

from batch_inference.ui.lazy import LazyApp
from batch_inference.ui.links import URL_PREFIX, BatchRunPageLink, base_path

APP_FACTORY = "batch_inference.ui.app:create_app"
NAV_ROUTE = "batch-inference"
"""The UI route of the nav entry (``/plugin/batch-inference`` shows the page in an iframe)."""


def _base_path() -> str:
    from airflow.configuration import conf

    return base_path(conf.get("api", "base_url", fallback=""))


class BatchInferencePlugin(AirflowPlugin):
    """Batch inference page (``/batch-inference/``), its nav entry under Browse, and the
    "Batch inference run" extra link of ``publish`` / ``summary``."""

    name = "batch_inference"
    fastapi_apps: ClassVar[list[dict[str, Any]]] = [
        {"app": LazyApp(APP_FACTORY), "url_prefix": URL_PREFIX, "name": "Batch inference"},
    ]
    external_views: ClassVar[list[dict[str, Any]]] = [
        {"name": "Batch inference", "href": f"{_base_path()}{URL_PREFIX}/", "destination": "nav",
         "category": "browse", "url_route": NAV_ROUTE},
    ]
    global_operator_extra_links: ClassVar[list[Any]] = [BatchRunPageLink()]
