"""The batch inference worker: runs one shard of a run to completion, exactly once per row.

Entry point: ``batch-worker run --run-dir URI --shard ID`` (:mod:`batch_worker.cli`). Never imports Airflow.
"""
