"""Example upstream DAG: registers a new model version and emits the model Asset event.

Its event extra (``model_path``, ``model_version``) is what ``batch_inference_on_model_upgrade`` reads. That
DAG's canary then compares the new model's outputs on a sample with the rows the previous model published
(``upgrade_gate``, ``docs/canary.md``) and refuses the run before the fan-out when they disagree.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG, Param, task
from batch_inference.assets import MODEL_ASSET
from batch_inference.params import default_model_path

with DAG(
    dag_id="model_upgrade_example",
    description="Publish a new encoder model version (emits the batch_inference_model Asset event).",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["batch-inference", "model-upgrade", "example"],
    default_args={"retries": 2},
    params={
        "model_path": Param(default_model_path(), title="Model directory",
                            description="Directory of the new model (transformers layout), readable by "
                                        "the workers.", type="string", minLength=1),
        "model_version": Param("v1", title="Model version", description="Free-form version label.",
                               type="string", minLength=1, maxLength=100),
    },
):

    @task(outlets=[MODEL_ASSET])
    def register_model(**context) -> dict:
        """Emit the Asset event whose extra carries the model location and version."""
        extra = {"model_path": context["params"]["model_path"],
                 "model_version": context["params"]["model_version"]}
        context["outlet_events"][MODEL_ASSET].extra = extra
        return extra

    register_model()
