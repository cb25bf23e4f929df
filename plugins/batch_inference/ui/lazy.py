"""An ASGI app built on its first request, so that registering the plugin imports nothing heavy.

Every Airflow component imports the plugin module (scheduler, DAG processor, triggerer, workers), but
only the API server serves HTTP. :class:`LazyApp` stands in for the FastAPI app in the plugin's
``fastapi_apps`` entry; the API server mounts it like any ASGI app (``app.mount(url_prefix, app)``) and
the real app (FastAPI, Jinja2, the Airflow ORM models, pyarrow) is imported on the first request.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any


class LazyApp:
    """An ASGI callable that imports ``"module:factory"`` and calls the factory once, on first use.

    Args:
        target: ``"package.module:function"``; the function takes no arguments and returns an ASGI app.
    """

    def __init__(self, target: str) -> None:
        module, _, func = target.partition(":")
        if not module or not func:
            raise ValueError(f"LazyApp target {target!r} is not 'module:function'")
        self.target = target
        self._app: Any = None
        self._lock = threading.Lock()

    def get(self) -> Any:
        """The real app (built on the first call; thread-safe)."""
        if self._app is None:
            with self._lock:
                if self._app is None:
                    module, _, func = self.target.partition(":")
                    self._app = getattr(importlib.import_module(module), func)()
        return self._app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """ASGI entry point: delegate to the real app."""
        await self.get()(scope, receive, send)
