"""The Assets of the batch-inference DAGs, in a module that imports nothing but ``airflow.sdk``.

DAG files (``dags/model_upgrade_example.py``) and consumers of the published tables import from here,
so declaring a schedule on one of these Assets costs no planner, publish or Kubernetes import.

* :data:`MODEL_ASSET`: a new encoder model version; schedules ``batch_inference_on_model_upgrade``.
* :func:`table_asset`: the table a run published (``warehouse://batch-inference/<table>``).
* :func:`published_alias`: the ``publish`` task's outlet. The table is a Param, known only at run time,
  so the outlet is an :class:`~airflow.sdk.AssetAlias` and the task adds the event to the Asset of the
  table it actually wrote (``outlet_events[alias].add(table_asset(table), extra=...)``).
"""

from __future__ import annotations

from airflow.sdk import Asset, AssetAlias

MODEL_ASSET = Asset(name="batch_inference_model", uri="model://batch-inference/encoder")
"""Updated by the model-upgrade DAG; schedules ``batch_inference_on_model_upgrade``. Its event extra
carries ``model_path`` and ``model_version``."""

TABLE_URI_PREFIX = "warehouse://batch-inference/"


def table_asset(table: str) -> Asset:
    """The Asset of published table ``table``: name ``batch_inference_table_<table>``, URI
    ``warehouse://batch-inference/<table>``. Schedule a downstream DAG on it to run after each publish."""
    return Asset(name=f"batch_inference_table_{table}", uri=f"{TABLE_URI_PREFIX}{table}")


def published_alias(dag_id: str) -> AssetAlias:
    """The outlet alias of ``dag_id``'s publish task (one per DAG; a DAG scheduled on it runs after any
    table that DAG publishes)."""
    return AssetAlias(name=f"{dag_id}__published_table")
