"""Where a run publishes: the :class:`~batch_inference.publish.PublishTarget` of its config, and the
pre-run check of that target.

Airflow side: a connection id in the run's Params (``postgres_conn_id``, ``iceberg_catalog_conn_id``) is
resolved to a DSN through Airflow (:mod:`batch_inference.publish.connections`). Used by the plan task
(:func:`check_publish_target`), the publish task and the upgrade gate (:func:`publish_target`).
"""

from __future__ import annotations

from batch_contract.engine_config import ConfigError

from batch_inference.params import RunConfig
from batch_inference.publish.connections import airflow_postgres_dsn
from batch_inference.publish.errors import ForeignTableError, PublishConnectionError
from batch_inference.publish.registry import backend_class
from batch_inference.publish.target import PublishTarget


def publish_target(cfg: RunConfig) -> PublishTarget:
    """The :class:`PublishTarget` for the run, built by its backend (``target_from_config`` of the class
    :mod:`batch_inference.publish.registry` names for ``cfg.publish_backend``): a connection id the
    backend reads (``postgres_conn_id``; ``iceberg_catalog_conn_id`` when set) is resolved to a DSN via
    Airflow; the DuckDB file's directory is created; the Iceberg warehouse is
    ``<output_root>/iceberg/warehouse``.

    Raises:
        ConfigError: the connection id does not exist or is not a PostgreSQL connection.
        ImportError: the backend's driver is not installed.
    """
    return backend_class(cfg.publish_backend).target_from_config(cfg, _conn_dsn)


def check_publish_target(cfg: RunConfig) -> None:
    """Fail the run before any shard when its output table exists but publish did not create it, or its
    connection cannot be used (:func:`batch_inference.publish.check_target`; reads only).

    Raises:
        ConfigError: ``params.output_table: ...`` naming the foreign tables, or ``params.<conn field>:
            ...`` for a missing, wrong-type or unreachable connection (never its URI).
    """
    from batch_inference.publish import check_target  # duckdb, pyarrow: only where a target is checked

    try:
        check_target(publish_target(cfg))
    except ForeignTableError as exc:
        raise ConfigError(f"params.output_table: {exc}") from None
    except PublishConnectionError as exc:
        raise ConfigError(str(exc) if str(exc).startswith("params.") else f"params.publish_backend: {exc}") from None


def _conn_dsn(field: str, conn_id: str) -> str:
    """``postgresql://`` URI of an Airflow connection of a PostgreSQL type (a secret: it goes only into a
    ``PublishTarget``, whose ``repr`` leaves it out).

    Raises:
        ConfigError: the connection does not exist or is of another type (the message names
            ``params.<field>``, the id and the type, never the URI).
    """
    try:
        return airflow_postgres_dsn(conn_id, field=field)
    except PublishConnectionError as exc:
        raise ConfigError(str(exc)) from None


__all__ = ["check_publish_target", "publish_target"]
