"""``batch_inference_smoke``: a new deployment checked end to end with one pod, before the first real run.

Two tasks: ``check_settings`` refuses an ``output_root`` outside the DAG's output roots (the deployment
policy, ``batch_inference.policy``, as for every batch DAG) and returns it; ``smoke_pod`` is one
deferrable pod with the shard pods' spec (``pod_spec.kpo_partial_kwargs``: image, GPU spot pool
placement, tolerations, resources, service account, security context, ``/dev/shm``, model sync, quota
wait) running ``batch-worker smoke`` (``worker_image/batch_worker/smoke.py``): ``nvidia-smi`` lists a
GPU, ``torch.cuda.is_available()``, a create-only write under ``<output_root>/_smoke/`` is read back and
a second write to the same name is refused. The pod's log ends with one ``SMOKE OK`` / ``SMOKE FAILED:
...`` line naming everything missing; a failed check fails the task with no retry (it checks set-up,
which a retry does not change). Built only when the ``kubernetes`` runner is enabled.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG, Param, task

from batch_inference.locations import check_allowed_location
from batch_inference.pod_spec import K8sSettings, kpo_partial_kwargs
from batch_inference.policy import policy_for
from batch_inference.shard_pod import ShardPodOperator

DAG_ID = "batch_inference_smoke"
START_DATE = datetime(2026, 1, 1)


class SmokePodOperator(ShardPodOperator):
    """The smoke pod: a :class:`ShardPodOperator` (quota wait, preemption relaunch) named ``smoke``."""

    pod_role = "smoke"


def smoke_pod_kwargs(settings: K8sSettings) -> dict:
    """The shard pods' kwargs for one task: named ``batch-worker-smoke``, no retries, no map cap."""
    kwargs = kpo_partial_kwargs(settings)
    kwargs.pop("max_active_tis_per_dagrun")
    kwargs.update(name="batch-worker-smoke", retries=0, labels={
        "app.kubernetes.io/name": "batch-worker", "app.kubernetes.io/part-of": "batch-inference",
        "batch-inference/role": "smoke"})
    return kwargs


def check_output_root(output_root: str) -> str:
    """``output_root`` when the smoke DAG's policy allows it (``policy_for(DAG_ID).output_roots``).

    Raises:
        ConfigError: ``params.output_root: ... is outside the output roots of this DAG``.
    """
    check_allowed_location("output_root", output_root, policy_for(DAG_ID).output_roots,
                           "the output roots of this DAG")
    return output_root


def build_smoke_dag(settings: K8sSettings | None = None) -> DAG:
    """The smoke DAG (module docstring); ``settings`` default :meth:`K8sSettings.from_env` (parse time)."""
    settings = settings or K8sSettings.from_env()
    with DAG(
        dag_id=DAG_ID,
        description="Smoke test of a new deployment: one GPU pod checks the driver, torch and the output bucket.",
        schedule=None,
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        tags=["batch-inference-smoke"],  # not the batch DAGs' tag: the UI page lists runs of those only
        params={
            "output_root": Param("gs://your-bucket/batch", type="string", minLength=1,
                                 title="Output root", description="Where runs will write: the pod commits one "
                                 "probe object under <output_root>/_smoke/."),
            "gpu": Param(True, type="boolean", title="Check the GPU",
                         description="Off for a CPU-only pool: only the storage checks run."),
        },
        doc_md=__doc__,
    ) as dag:

        @task(task_id="check_settings", retries=0)
        def check_settings(params=None) -> str:
            return check_output_root(str(params["output_root"]))

        checked = check_settings()
        pod = SmokePodOperator(
            task_id="smoke_pod",
            arguments=["smoke", "--output-root", "{{ ti.xcom_pull(task_ids='check_settings') }}",
                       "--gpu", "{{ params.gpu }}"],
            **smoke_pod_kwargs(settings),
        )
        checked >> pod
    return dag
