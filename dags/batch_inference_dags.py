"""The batch-inference DAGs: backfill, nightly, on-model-upgrade, and the deployment smoke test when the
kubernetes runner is enabled (airflow DAG files only wire: see batch_inference.dag_factory)."""

from __future__ import annotations

from batch_inference.dag_factory import build_all

for _dag_id, _dag in build_all().items():
    globals()[_dag_id] = _dag
