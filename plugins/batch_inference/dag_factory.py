"""One factory, three DAGs: ``batch_inference_nightly``, ``batch_inference_backfill`` and
``batch_inference_on_model_upgrade``.

Task graph (the same for all three; each DAG's ``doc_md`` lists it, see :func:`dag_doc`)::

    plan -> canary -> approve -> choose_runner -+-> infer_local[shard]              -+
                                                +-> kpo_args -> infer_k8s[shard]    -+-> wait_for_shards -> publish -> summary
                                                +-> render_k8s   (dry run)

``canary`` is a plain task with the local runner only, and ``canary_pod.CanaryPodOperator`` (a pod for
``runner=kubernetes``, the local subprocess for ``runner=local``) when the kubernetes runner is enabled.

``infer_local`` and ``infer_k8s`` are two runners of one shard-task spec (the worker command
``batch-worker run --run-dir <run_dir> --shard <id>``). The gate runs when the fan-out is done (any
state), because storage, not task state, decides: it opens when the completed shards hold
``min_success_ratio`` of the rows. ``publish`` publishes atomically, writes the report and emits an
Asset event on the table it wrote (through the :func:`~batch_inference.assets.published_alias` outlet)
with the fingerprint, row counts and cost.

``plan`` and ``publish`` are ``@lineage_task`` s (:mod:`batch_inference.lineage.operator`): with the
OpenLineage provider installed and enabled, their START / COMPLETE events name the run's input, the
table written and the model and fingerprints (:mod:`batch_inference.lineage`); otherwise plain ``@task`` s.

Parse cost: this module imports only ``airflow.sdk``, light project modules and the standard provider's
``@task`` operator (which any ``@task`` loads). Task bodies import :mod:`batch_inference.tasks` (planner,
pyarrow, publish) when they run, and the Kubernetes provider (``KubernetesPodOperator``, ~1 s of CPU to
import) is imported only when the deployment enables the ``kubernetes`` runner (:func:`enabled_runners`);
``tests/dags/test_parse_time.py`` keeps each DAG file under 0.3 s of CPU.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import (
    DAG,
    Asset,
    AssetAlias,
    AsyncCallback,
    DeadlineAlert,
    DeadlineReference,
    TriggerRule,
    task,
)
from batch_contract.engine_config import ConfigError

from batch_inference.approval import ProjectionApprovalOperator
from batch_inference.assets import MODEL_ASSET, published_alias, table_asset
from batch_inference.lineage.operator import lineage_task
from batch_inference.notifiers import RunAlertNotifier
from batch_inference.params import REPO_ROOT, RUNNERS, base_params, param_default, replace_field
from batch_inference.pod_spec import K8sSettings, canary_pod_kwargs, kpo_partial_kwargs
from batch_inference.sensors import ShardMarkerSensor
from batch_inference.templating import has_jinja

__all__ = ["DAG_SPECS", "MODEL_ASSET", "DagSpec", "build_all", "build_dag", "enabled_runners", "output_asset"]

START_DATE = datetime(2026, 1, 1)
BASE_TAGS = ["batch-inference", "gpu", "offline"]
NIGHTLY_ROOT = str(REPO_ROOT / "data" / "nightly")
"""Default root of the nightly partitions ``<root>/dt=YYYY-MM-DD/``; ``BATCH_NIGHTLY_ROOT`` overrides it."""
NIGHTLY_ROOT_ENV = "BATCH_NIGHTLY_ROOT"


def nightly_root(environ: Mapping[str, str] | None = None) -> str:
    """Root of the nightly partitions, read when the DAG file is parsed: ``BATCH_NIGHTLY_ROOT`` or
    :data:`NIGHTLY_ROOT`. A deployment setting, not a Variable: the default template of ``input_uri``
    sees only the schedule's dates (:mod:`batch_inference.templating`).

    Raises:
        ConfigError: the root holds Jinja syntax (it would become part of the template).
    """
    env = os.environ if environ is None else environ
    root = env.get(NIGHTLY_ROOT_ENV, "").strip() or NIGHTLY_ROOT
    if has_jinja(root):
        raise ConfigError(f"{NIGHTLY_ROOT_ENV}: a storage root, not a template")
    return root.rstrip("/")
RUNNERS_ENV = "BATCH_INFERENCE_RUNNERS"
"""Comma-separated runners the DAGs are built with (``local``, ``kubernetes``), read at parse time."""
DEADLINE_CALLBACK_ENV = "BATCH_INFERENCE_DEADLINE_CALLBACK"
"""Dotted path of the awaitable the deadline alert calls; unset: no deadline alert (see
:func:`deadline_alert`)."""
DEFAULT_DEADLINE_CALLBACK = "batch_inference.notifiers.log_deadline_missed"
LOCAL_SHARD_LABEL = ("shard {{ task.op_kwargs['ref']['shard_id'] }} · "
                     "{{ '{:,}'.format(task.op_kwargs['ref']['rows']) }} rows")
"""``map_index_template`` of ``infer_local``: ``shard 00001 · 15,828 rows`` (the mapped shard ref)."""
K8S_SHARD_LABEL = ("shard {{ task.labels['batch-inference/shard-id'] }} · "
                   "{{ '{:,}'.format(task.labels['batch-inference/rows'] | int) }} rows")
"""``map_index_template`` of ``infer_k8s``, from the pod's identity labels (``pod_spec.kpo_expand_kwargs``)."""


def output_asset(table: str) -> Asset:
    """The Asset of published table ``table`` (:func:`batch_inference.assets.table_asset`)."""
    return table_asset(table)


def enabled_runners(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The runners the DAGs are built with: ``BATCH_INFERENCE_RUNNERS`` when set, else ``local`` plus
    ``kubernetes`` when ``BATCH_K8S_IMAGE`` is set (a Kubernetes deployment sets it: the default image is
    a placeholder). Without ``kubernetes`` the DAGs have no ``kpo_args`` / ``infer_k8s`` tasks and never
    import the Kubernetes provider; a dry run (``render_k8s``) still works.

    Raises:
        ValueError: an unknown runner name, or none at all.
    """
    env = os.environ if environ is None else environ
    raw = env.get(RUNNERS_ENV, "").strip()
    if not raw:
        return RUNNERS if env.get("BATCH_K8S_IMAGE", "").strip() else ("local",)
    names = tuple(dict.fromkeys(n.strip() for n in raw.split(",") if n.strip()))
    unknown = [n for n in names if n not in RUNNERS]
    if unknown or not names:
        raise ValueError(f"{RUNNERS_ENV}={raw!r}: runners are a comma-separated subset of {list(RUNNERS)}")
    return names


@dataclass(frozen=True)
class DagSpec:
    """What differs between the three DAGs.

    Attributes:
        dag_id / description / tags: DAG identity.
        schedule: cron string, an Asset, or ``None`` (manual).
        params: Param overrides on top of :func:`batch_inference.params.base_params`.
        model_from_asset: read the model from the triggering Asset event (falling back to params).
        output_table: default output table; default the ``output_table`` Param's. (The publish
            event goes on the Asset of the table a run actually wrote, whatever this default.)
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


def deadline_alert(spec: DagSpec, deadline_hours: float, output_root: str = "",
                   environ: Mapping[str, str] | None = None) -> DeadlineAlert | None:
    """The DAG's deadline alert, or ``None`` when ``BATCH_INFERENCE_DEADLINE_CALLBACK`` is unset.

    When set (a dotted path to an awaitable, e.g. :data:`DEFAULT_DEADLINE_CALLBACK`, which logs an error):
    a run not finished ``deadline_hours`` after it was queued makes the triggerer call it with
    ``dag_id``, ``deadline_hours`` and ``output_root`` (the DAG's default; the callback finds the run
    there unless the run's ``conf`` names another). Opt-in because Airflow 3.3.2's ``dag.test()`` (and so
    ``airflow dags test``, ``make run``) fails a *successful* run of a DAG that has a deadline alert
    (``DagRun.update_state`` looks the alerts up by id, and ``dag.test`` holds them unsynced): set it
    where the DAG processor parses, not where ``airflow dags test`` runs.

    The interval is fixed when the DAG file is parsed (the DAG's default ``deadline_hours``): Airflow
    evaluates it when the run is queued, before any Param is rendered. A run triggered with another
    ``deadline_hours`` moves its completion gate, not this alert.
    """
    env = os.environ if environ is None else environ
    path = env.get(DEADLINE_CALLBACK_ENV, "").strip()
    if not path:
        return None
    return DeadlineAlert(
        reference=DeadlineReference.DAGRUN_QUEUED_AT,
        interval=timedelta(hours=deadline_hours),
        callback=AsyncCallback(path, kwargs={"dag_id": spec.dag_id, "deadline_hours": deadline_hours,
                                             "output_root": output_root}),
        name=f"{spec.dag_id}: not finished {deadline_hours:g} h after queued",
    )


def _schedule_text(schedule: Any) -> str:
    if schedule is None:
        return "manual (trigger form)"
    if isinstance(schedule, str):
        return f"`{schedule}` (cron, no catchup)"
    names = [getattr(a, "name", str(a)) for a in (schedule if isinstance(schedule, list) else [schedule])]
    return "on an event of Asset " + ", ".join(f"`{n}`" for n in names)


def dag_doc(spec: DagSpec, runners: tuple[str, ...], alias: AssetAlias, deadline_hours: float) -> str:
    """The DAG's ``doc_md``: what it does, its schedule and output, and its tasks as a Markdown list."""
    k8s = "kubernetes" in runners
    fanout = ("`infer_local` (the `local` runner) or `kpo_args` then `infer_k8s` (the `kubernetes` runner)"
              if k8s else "`infer_local` (this deployment builds the DAGs with the `local` runner only: "
              f"set `{RUNNERS_ENV}=local,kubernetes` or `BATCH_K8S_IMAGE` for pods)")
    lines = [
        f"# {spec.dag_id}",
        "",
        spec.description,
        "",
        f"* **Schedule:** {_schedule_text(spec.schedule)}",
        f"* **Output:** table `{spec.output_table}` by default (Param `output_table`); `publish` emits an "
        f"event on the Asset `warehouse://batch-inference/<table>` of the table it wrote (outlet alias "
        f"`{alias.name}`)",
        f"* **Deadline alert:** {deadline_hours:g} h after the run is queued, when "
        f"`{DEADLINE_CALLBACK_ENV}` names a callback",
        "",
        "## Tasks",
        "",
        "1. `plan`: reads input metadata only, writes `runs/<run_id>/manifest.json`, returns one ref per "
        "shard (empty input: zero shards, a green no-op).",
        "1b. `canary`: runs a sample of the rows with the real engine (batch-size search, throughput) "
        "where the shards will run (a subprocess for `local`" + (", a pod like the shard pods for "
        "`kubernetes`" if k8s else "") + "), writes `canary.json` and `projection.json` (worker-seconds, "
        "cost, finish time per parallelism) and refuses the run (`REFUSED ...`, no shard starts) over "
        "`budget_usd` or past `deadline_hours`, or when its outputs disagree with the rows a previous "
        "model published (`upgrade_gate`).",
        "1c. `approve`: with `require_approval` on, waits for a person to approve the projection in the "
        "Airflow UI (Required Actions; Airflow's `ApprovalOperator`); Reject: no shard starts and the run "
        "fails as rejected. Off (default) or no projection: passes at once.",
        f"2. `choose_runner`: branches to {fanout}; a dry run goes to `render_k8s` instead.",
        "3. `infer_local[shard]`" + (" / `infer_k8s[shard]`" if k8s else "")
        + ": one mapped task per shard, named `shard 00001 · 15,828 rows`; runs "
        "`batch-worker run --run-dir <run_dir> --shard <id>` (exit 2 fails at once; crashes retry; exit 75 "
        "retries `infer_local`, while a preempted `infer_k8s` pod is replaced within the same try).",
        "4. `render_k8s` (dry run only): writes the pod manifests the `kubernetes` runner would create; "
        "runs nothing.",
        "5. `wait_for_shards`: the completion gate (deferrable). Runs when the fan-out is done in any "
        "state; opens when the shards with a `_SUCCESS.json` marker hold `min_success_ratio` of the "
        "rows, else fails naming the missing shards.",
        "6. `publish`: atomic table swap, report (`report.json`, `report.html`), Asset event on the "
        "table written.",
        "7. `summary`: logs the report summary and `BATCH_INFERENCE_REPORT_JSON=<uri>`.",
        "",
        "Params are grouped by section in the trigger form: Input, Engine, Execution, Output, "
        "Cost and limits. See `docs/configuration.md`.",
    ]
    return "\n".join(lines) + "\n"


def build_dag(spec: DagSpec, k8s: K8sSettings | None = None,
              runners: tuple[str, ...] | None = None) -> DAG:
    """Build one batch-inference DAG from ``spec``.

    Args:
        spec: what differs between the DAGs.
        k8s: pod settings (default :meth:`K8sSettings.from_env`, read at parse time); used only when the
            ``kubernetes`` runner is enabled.
        runners: the runners to build (default :func:`enabled_runners`); the first is the ``runner``
            Param's default (``BATCH_INFERENCE_RUNNERS=kubernetes,local``: runs, the nightly one included,
            go to the cluster unless the form says ``local``).
    """
    runners = runners or enabled_runners()
    if "kubernetes" in runners:
        k8s = k8s or K8sSettings.from_env()
    params = base_params(runner=runners[0], output_table=spec.output_table)
    params.update(spec.params)
    alias = published_alias(spec.dag_id)
    deadline_hours = float(params["deadline_hours"].value)
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
        doc_md=dag_doc(spec, runners, alias, deadline_hours),
        deadline=deadline_alert(spec, deadline_hours, str(params["output_root"].value)),
        render_template_as_native_obj=False,
    ) as dag:
        _wire(spec, k8s if "kubernetes" in runners else None, alias, runners)
    return dag


def _k8s_pods(k8s: K8sSettings, planned: Any):
    """``kpo_args`` and the mapped ``infer_k8s`` pod task (``ShardPodOperator``; the provider is imported
    here, only when the ``kubernetes`` runner is enabled). Returns ``(kpo_args task, infer_k8s task)``."""
    from batch_inference.shard_pod import ShardPodOperator  # parse time: kubernetes runner only

    @task
    def kpo_args(refs: list[dict[str, Any]], **context: Any) -> list[dict[str, Any]]:
        from batch_inference import tasks  # parse time: a task body imports its module when it runs

        return tasks.kpo_args_task(refs, context)

    args = kpo_args(planned)
    pods = ShardPodOperator.partial(
        task_id="infer_k8s", map_index_template=K8S_SHARD_LABEL, **kpo_partial_kwargs(k8s),
    ).expand_kwargs(args)
    return args, pods


def _canary_pod(k8s: K8sSettings):
    """The ``canary`` task when the ``kubernetes`` runner is enabled: ``CanaryPodOperator`` (a pod for
    ``runner=kubernetes``, the local subprocess for ``runner=local``; chosen when it runs)."""
    from batch_inference.canary_pod import CanaryPodOperator  # parse time: kubernetes runner only

    return CanaryPodOperator(task_id="canary", **canary_pod_kwargs(k8s))


def _wire(spec: DagSpec, k8s: K8sSettings | None, alias: AssetAlias, runners: tuple[str, ...]) -> None:
    @lineage_task("plan", model_from_asset=spec.model_from_asset)
    def plan(**context: Any) -> list[dict[str, Any]]:
        from batch_inference import tasks  # parse time: a task body imports its module when it runs

        return tasks.plan_task(context, model_from_asset=spec.model_from_asset)

    @task
    def canary(**context: Any) -> dict[str, Any]:
        from batch_inference import canary_task  # parse time: a task body imports its module when it runs

        return canary_task.canary_task(context)

    @task.branch
    def choose_runner(**context: Any) -> str:
        from batch_inference import tasks  # parse time: a task body imports its module when it runs

        return tasks.choose_runner_task(context, runners=runners)

    @task(max_active_tis_per_dagrun=64, retries=3, map_index_template=LOCAL_SHARD_LABEL)
    def infer_local(ref: dict[str, Any], **context: Any) -> dict[str, Any]:
        from batch_inference import tasks  # parse time: a task body imports its module when it runs

        return tasks.infer_local_task(ref, context)

    @task
    def render_k8s(refs: list[dict[str, Any]], **context: Any) -> list[str]:
        from batch_inference import tasks  # parse time: a task body imports its module when it runs

        return tasks.render_k8s_task(refs, context)

    @lineage_task("publish", model_from_asset=spec.model_from_asset, outlets=[alias])
    def publish(gate: dict[str, Any], **context: Any) -> dict[str, Any]:
        from batch_inference import tasks  # parse time: a task body imports its module when it runs

        return tasks.publish_and_report_task(context, gate, alias)

    @task
    def summary(result: dict[str, Any], **context: Any) -> str:
        from batch_inference import tasks  # parse time: a task body imports its module when it runs

        return tasks.summary_task(result, context)

    planned = plan()
    branch = choose_runner()
    canary_step = canary() if k8s is None else _canary_pod(k8s)
    planned >> canary_step >> ProjectionApprovalOperator(task_id="approve") >> branch
    local = infer_local.expand(ref=planned)
    rendered = render_k8s(planned)
    branch >> [local, rendered]
    fanout = [local]
    if k8s is not None:
        args, pods = _k8s_pods(k8s, planned)
        branch >> args
        fanout.append(pods)
    gate = ShardMarkerSensor(
        task_id="wait_for_shards",
        run_dir="{{ ti.xcom_pull(task_ids='plan', key='run_dir') }}",
        deadline_hours="{{ params.deadline_hours }}",
        min_success_ratio="{{ params.min_success_ratio }}",
        dry_run="{{ params.dry_run }}",
        wait_for_stragglers="{{ params.runner == 'kubernetes' }}",
        straggler_grace_seconds=(k8s.termination_grace_seconds + 60) if k8s is not None else 0,
        trigger_rule=TriggerRule.ALL_DONE,
        poll_seconds=10.0,
        on_failure_callback=[RunAlertNotifier()],
    )
    fanout >> gate
    summary(publish(gate.output))


DAG_SPECS = {
    "batch_inference_nightly": DagSpec(
        dag_id="batch_inference_nightly",
        description="Nightly: embed the day's partition (input templated from the logical date).",
        schedule="0 2 * * *",
        tags=["nightly"],
        params={"input_uri": replace_field(
            "input_uri",
            default=nightly_root() + "/dt={{ ds }}",
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
        params={"upgrade_gate": replace_field(
            "upgrade_gate", default="on",
            description="After the canary: compare the new model's outputs on the sample with the rows the "
                        "previous model published for the same ids, and refuse the run (no shard starts) when "
                        "they disagree beyond the thresholds below. on (this DAG's default): whenever the table "
                        "has rows for the sample; auto: only when it was published under another result "
                        "fingerprint; off: never.",
        ).param()},
        model_from_asset=True,
        output_table="descriptions_embeddings_latest_model",
    ),
}


def build_all(k8s: K8sSettings | None = None, runners: tuple[str, ...] | None = None) -> dict[str, DAG]:
    """The three batch DAGs, plus ``batch_inference_smoke`` (:mod:`batch_inference.smoke_dag`) when the
    ``kubernetes`` runner is enabled, keyed by dag id (``runners``: default :func:`enabled_runners`)."""
    runners = runners or enabled_runners()
    dags = {dag_id: build_dag(spec, k8s, runners) for dag_id, spec in DAG_SPECS.items()}
    if "kubernetes" in runners:
        from batch_inference.smoke_dag import DAG_ID, build_smoke_dag  # the provider: kubernetes only

        dags[DAG_ID] = build_smoke_dag(k8s)
    return dags
