"""One factory, three DAGs: ``batch_inference_nightly``, ``batch_inference_backfill`` and
``batch_inference_on_model_upgrade``.

Task graph (the same for all three)::

    plan -> choose_runner -+-> infer_local[shard]              -+
                           +-> kpo_args -> infer_k8s[shard]    -+-> wait_for_shards -> publish -> summary
                           +-> render_k8s   (dry run)

``infer_local`` and ``infer_k8s`` are two runners of one shard-task spec (the worker command
``batch-worker run --run-dir <run_dir> --shard <id>``). The gate runs when the fan-out is done (any
state), because storage, not task state, decides: it opens when the completed shards hold
``min_success_ratio`` of the rows. ``publish`` publishes atomically, writes the report and emits the
outlet Asset event with the fingerprint, row counts and cost.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from airflow.sdk import DAG, Asset, TriggerRule, task

from batch_inference import tasks
from batch_inference.params import REPO_ROOT, base_params, param_default, replace_field
from batch_inference.pod_spec import K8sSettings, kpo_partial_kwargs
from batch_inference.sensors import ShardMarkerSensor

MODEL_ASSET = Asset(name="batch_inference_model", uri="model://batch-inference/encoder")
"""Updated by the model-upgrade DAG; schedules ``batch_inference_on_model_upgrade``."""
START_DATE = datetime(2026, 1, 1)
BASE_TAGS = ["batch-inference", "gpu", "offline"]
NIGHTLY_ROOT = str(REPO_ROOT / "data" / "nightly")
"""Default root of the nightly partitions ``<root>/dt=YYYY-MM-DD/``; Airflow Variable
``batch_inference_nightly_root`` overrides it."""


def output_asset(table: str) -> Asset:
    """The outlet Asset of the publish task for ``table``."""
    return Asset(name=f"batch_inference_table_{table}", uri=f"warehouse://batch-inference/{table}")


@dataclass(frozen=True)
class DagSpec:
    """What differs between the three DAGs.

    Attributes:
        dag_id / description / tags: DAG identity.
        schedule: cron string, an Asset, or ``None`` (manual).
        params: Param overrides on top of :func:`batch_inference.params.base_params`.
        model_from_asset: read the model from the triggering Asset event (falling back to params).
        output_table: default output table (also names the outlet Asset); default the
            ``output_table`` Param's.
    """

    dag_id: str
    description: str
    schedule: Any
    tags: list[str] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    model_from_asset: bool = False
    output_table: str = param_default("output_table")


def default_args() -> dict[str, Any]:
    """Retries >= 2 with exponential backoff on every task (spot deaths and transient storage errors)."""
    return {"owner": "batch-inference", "retries": 2, "retry_delay": timedelta(seconds=5),
            "retry_exponential_backoff": 2.0, "max_retry_delay": timedelta(minutes=10)}


def build_dag(spec: DagSpec, k8s: K8sSettings | None = None) -> DAG:
    """Build one batch-inference DAG from ``spec``.

    Args:
        spec: what differs between the DAGs.
        k8s: pod settings (default :meth:`K8sSettings.from_env`, read at parse time).
    """
    k8s = k8s or K8sSettings.from_env()
    params = base_params(output_table=spec.output_table)
    params.update(spec.params)
    asset = output_asset(spec.output_table)
    with DAG(
        dag_id=spec.dag_id,
        description=spec.description,
        schedule=spec.schedule,
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        tags=BASE_TAGS + spec.tags,
        params=params,
        default_args=default_args(),
        doc_md=__doc__,
        render_template_as_native_obj=False,
    ) as dag:
        _wire(spec, k8s, asset)
    return dag


def _wire(spec: DagSpec, k8s: K8sSettings, asset: Asset) -> None:
    @task
    def plan(**context: Any) -> list[dict[str, Any]]:
        return tasks.plan_task(context, model_from_asset=spec.model_from_asset)

    @task.branch
    def choose_runner(**context: Any) -> str:
        return tasks.choose_runner_task(context)

    @task(max_active_tis_per_dagrun=64, retries=3)
    def infer_local(ref: dict[str, Any], **context: Any) -> dict[str, Any]:
        return tasks.infer_local_task(ref, context)

    @task
    def kpo_args(refs: list[dict[str, Any]], **context: Any) -> list[dict[str, Any]]:
        return tasks.kpo_args_task(refs, context)

    @task
    def render_k8s(refs: list[dict[str, Any]], **context: Any) -> list[str]:
        return tasks.render_k8s_task(refs, context)

    @task(outlets=[asset])
    def publish(gate: dict[str, Any], **context: Any) -> dict[str, Any]:
        return tasks.publish_and_report_task(context, gate, asset)

    @task
    def summary(result: dict[str, Any], **context: Any) -> str:
        return tasks.summary_task(result, context)

    planned = plan()
    branch = choose_runner()
    planned >> branch
    local = infer_local.expand(ref=planned)
    args = kpo_args(planned)
    pods = KubernetesPodOperator.partial(task_id="infer_k8s", **kpo_partial_kwargs(k8s)).expand_kwargs(args)
    rendered = render_k8s(planned)
    branch >> [local, args, rendered]
    gate = ShardMarkerSensor(
        task_id="wait_for_shards",
        run_dir="{{ ti.xcom_pull(task_ids='plan', key='run_dir') }}",
        deadline_hours="{{ params.deadline_hours }}",
        min_success_ratio="{{ params.min_success_ratio }}",
        dry_run="{{ params.dry_run }}",
        wait_for_stragglers="{{ params.runner == 'kubernetes' }}",
        trigger_rule=TriggerRule.ALL_DONE,
        poll_seconds=10.0,
    )
    [local, pods] >> gate
    summary(publish(gate.output))


DAG_SPECS = {
    "batch_inference_nightly": DagSpec(
        dag_id="batch_inference_nightly",
        description="Nightly: embed the day's partition (input templated from the logical date).",
        schedule="0 2 * * *",
        tags=["nightly"],
        params={"input_uri": replace_field(
            "input_uri",
            default="{{ var.value.get('batch_inference_nightly_root', '" + NIGHTLY_ROOT + "') }}/dt={{ ds }}",
            title="Input URI (templated)",
            description="The day's partition: rendered with the run's logical date ({{ ds }}).",
        ).param()},
        output_table="descriptions_embeddings_nightly",
    ),
    "batch_inference_backfill": DagSpec(
        dag_id="batch_inference_backfill",
        description="Manual backfill over any dataset: fill in the trigger form.",
        schedule=None,
        tags=["backfill"],
    ),
    "batch_inference_on_model_upgrade": DagSpec(
        dag_id="batch_inference_on_model_upgrade",
        description="Re-embed the corpus when the model Asset is updated (model from the event's extra).",
        schedule=[MODEL_ASSET],
        tags=["model-upgrade"],
        model_from_asset=True,
        output_table="descriptions_embeddings_latest_model",
    ),
}


def build_all(k8s: K8sSettings | None = None) -> dict[str, DAG]:
    """All three DAGs, keyed by dag id."""
    return {dag_id: build_dag(spec, k8s) for dag_id, spec in DAG_SPECS.items()}
