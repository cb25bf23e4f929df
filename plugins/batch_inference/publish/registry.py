"""The publish backend registry: backend name -> the class that implements it, in one place.

Everything that depends on which backends exist reads this module: :class:`~batch_inference.publish.target.
PublishTarget` validation, the ``publish_backend`` Param's enum (:mod:`batch_inference.params`), the publish
CLI's ``--backend`` choices, :func:`batch_inference.run_target.publish_target` and the backend factory
:func:`batch_inference.publish.backend.backend_for`. Everything a backend knows about its own target (how
it is built from a run's config, what makes it valid, the run-config and deployment-policy checks of its
settings) lives in the backend's module, as class methods of its class:

* ``target_from_config(cfg, resolve_conn) -> PublishTarget``
* ``validate_target(target) -> None`` (raises ``ValueError``)
* ``check_run_config(cfg) -> None`` and ``check_policy(cfg, policy) -> None`` (raise ``ConfigError``)
* ``nothing_stored(target) -> bool``
* ``dsn_required: bool`` (class attribute)

Adding a backend is its module plus one line in :data:`BACKEND_CLASSES` (``docs/extending.md``). This
module imports no backend: a class is imported on first use (:func:`backend_class`), so a driver such as
psycopg or pyiceberg loads only when its backend is used, and a DAG file that reads :data:`BACKENDS`
imports no driver.
"""

from __future__ import annotations

import importlib
from typing import Any

DEFAULT_BACKEND = "duckdb"
"""The backend a run and the publish CLI use unless told otherwise (an embedded file, no server)."""

BACKEND_CLASSES: dict[str, str] = {
    "duckdb": "batch_inference.publish.duckdb_backend:DuckDBBackend",
    "postgres": "batch_inference.publish.postgres_backend:PostgresBackend",
    "iceberg": "batch_inference.publish.iceberg_backend:IcebergBackend",
}
"""Backend name -> ``"module:Class"`` of its :class:`~batch_inference.publish.backend.PublishBackend`."""

BACKENDS = tuple(BACKEND_CLASSES)
"""Publish backend names, in registry order."""


def backend_class(name: str) -> Any:
    """The class registered as ``name`` (its module is imported on the first call).

    Raises:
        ValueError: ``name`` is not one of :data:`BACKENDS`.
        ImportError: the backend's driver (psycopg, pyiceberg) is not installed.
    """
    spec = BACKEND_CLASSES.get(name)
    if spec is None:
        raise ValueError(f"backend: {name!r} is not one of {', '.join(BACKENDS)}")
    module, _, cls = spec.partition(":")
    return getattr(importlib.import_module(module), cls)


__all__ = ["BACKENDS", "BACKEND_CLASSES", "DEFAULT_BACKEND", "backend_class"]
