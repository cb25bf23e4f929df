"""Task bodies of the batch-inference DAGs, as plain functions of ``(RunConfig, context)``.

The DAG factory wraps them in ``@task``; keeping them here keeps the DAG files to wiring and makes each
step testable without a scheduler. Airflow-side only: no torch, no vLLM.

The plan task is the only one that resolves the Params (:func:`run_config`: render, validate, apply the
Asset event's model); it records the resolved :class:`RunConfig` in the manifest's ``params``. Every later
task reads that record (:func:`batch_inference.planned.planned_run`) instead of resolving the raw Params
again, so all tasks of a run see one config.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from typing import Any

from batch_contract.engine_config import ConfigError
from batch_contract.layout import RunLayout
from batch_contract.manifest import Manifest
from batch_contract.runstore import RunStore

from batch_inference.assets import table_asset
from batch_inference.budget import over_budget_message
from batch_inference.carryover import carry_over, index_published
from batch_inference.local_runner import (
    ShardBadInputError,
    ShardNotStartedError,
    ShardRetryableError,
    run_shard,
)
from batch_inference.params import (
    REPO_ROOT,
    RunConfig,
    check_known_params,
    default_model_path,
    resolve_run_config,
)
from batch_inference.planned import manifest_for, planned_run, run_config_of, run_dir_of
from batch_inference.planner import PlanRequest, plan
from batch_inference.pod_spec import K8sSettings, kpo_expand_kwargs
from batch_inference.policy import policy_for
from batch_inference.publish.target import DEFAULT_SCHEMA
from batch_inference.run_target import check_publish_target, publish_target
from batch_inference.templating import dag_defaults, resolve_templates

log = logging.getLogger(__name__)

REPORT_LINE_PREFIX = "BATCH_INFERENCE_REPORT_JSON="
"""The summary task logs this prefix + the report URI; ``batch_inference.cli`` finds it in the output."""
RENDER_DIR = os.environ.get("BATCH_RENDER_DIR", str(REPO_ROOT / "build" / "k8s"))


def run_config(context: Mapping[str, Any], overrides: Mapping[str, Any] | None = None) -> RunConfig:
    """The run's validated config: the run's conf keys checked against the Params the DAG declares
    (:func:`batch_inference.params.check_known_params`: a key the DAG does not declare is refused, so a
    misspelt guardrail in the trigger form's JSON, a REST ``conf`` or ``airflow dags trigger -c`` fails
    the run instead of being ignored), params updated with ``overrides``, the DAG's own default templates
    rendered with the schedule's dates only (:mod:`batch_inference.templating`; a run's own value is never
    rendered), checked against the DAG's deployment settings (:func:`batch_inference.policy.policy_for`).

    Raises:
        ConfigError: naming ``params.<field>`` (or ``BATCH_INFERENCE_POLICY`` for a broken policy file).
    """
    conf = getattr(context.get("dag_run"), "conf", None) or {}
    check_known_params(conf, context["dag"].params.keys())
    params = dict(context["params"])
    params.update(overrides or {})
    params = resolve_templates(params, dag_defaults(context["dag"]), context)
    return resolve_run_config(params, policy_for(context["dag"].dag_id))


def _extra_of(event: Any) -> dict[str, Any]:
    extra = event.get("extra") if isinstance(event, Mapping) else getattr(event, "extra", None)
    return dict(extra or {})


def model_event_extra(triggering_events: Mapping[Any, Iterable[Any]] | None) -> dict[str, Any] | None:
    """The ``extra`` of the newest triggering Asset event that names a model (``model_path`` or
    ``model``; with ``model_version`` when the producer gave one), or ``None``.

    Args:
        triggering_events: ``context['triggering_asset_events']`` (asset -> events, oldest first).
    """
    for events in (triggering_events or {}).values():
        for event in reversed(list(events)):
            extra = _extra_of(event)
            if extra.get("model_path") or extra.get("model"):
                return extra
    return None


def model_from_events(triggering_events: Mapping[Any, Iterable[Any]] | None,
                      fallback: str | None) -> tuple[str, str]:
    """Model location for an Asset-triggered run: the newest triggering event's ``extra['model_path']``,
    else the ``model`` param.

    Args:
        triggering_events: ``context['triggering_asset_events']`` (asset -> events, oldest first).
        fallback: ``params.model``.

    Returns:
        ``(model_path, source)`` where ``source`` says where it came from (for the log and manifest).

    Raises:
        ConfigError: neither the events nor the params give a model.
    """
    extra = model_event_extra(triggering_events)
    if extra is not None:
        path = extra.get("model_path") or extra.get("model")
        version = extra.get("model_version", "")
        return str(path), f"asset event extra (model_version={version!r})"
    if fallback:
        return fallback, "params.model"
    raise ConfigError(
        "model: this run was not given a model. The triggering Asset event's extra has no 'model_path' "
        "(emit it as outlet_events[asset].extra = {'model_path': ..., 'model_version': ...}) and "
        "params.model is empty; set one of them."
    )


def plan_task(context: Mapping[str, Any], *, model_from_asset: bool = False) -> list[dict[str, Any]]:
    """Plan the run and write its manifest; also pushes the run dir as XCom key ``run_dir``.

    Returns:
        The shard refs (:func:`batch_inference.planner.shard_refs`; one small dict per shard, at most
        ``max_shards``; ``[]`` for an empty input, which maps to zero worker tasks).

    Raises:
        AirflowFailException: a ``ConfigError`` / ``PlanError`` (bad params, missing column, ...): a retry
            cannot fix it, so the task fails at once with the message naming the field.
    """
    from airflow.sdk.exceptions import AirflowFailException

    try:
        return _plan(context, model_from_asset=model_from_asset)
    except ConfigError as exc:
        raise AirflowFailException(f"{type(exc).__name__}: {exc}") from None


def _plan(context: Mapping[str, Any], *, model_from_asset: bool) -> list[dict[str, Any]]:
    overrides: dict[str, Any] = {}
    if model_from_asset:
        model, source = model_from_events(context.get("triggering_asset_events"), context["params"].get("model"))
        log.info("model %s (from %s)", model, source)
        overrides["model"] = model
    cfg = run_config(context, overrides)
    if not cfg.dry_run:
        check_publish_target(cfg)
    run_id = context["run_id"]
    dag_id = context["dag"].dag_id
    policy = policy_for(dag_id)
    request = PlanRequest(
        input_uri=cfg.input_uri, id_column=cfg.id_column, text_column=cfg.text_column,
        output_root=cfg.output_root, run_id=run_id, engine=cfg.engine_dict(),
        worker={"token_budget": cfg.token_budget, "reuse": cfg.reuse, "steal": cfg.steal,
                **policy.worker_limits()},
        input_roots=list(policy.input_roots), rows_per_shard=cfg.rows_per_shard,
        shard_by=cfg.shard_by, max_map_length=cfg.max_shards, row_limit=cfg.row_limit or None,
        params={**cfg.to_dict(), "dag_id": dag_id}, dag_id=dag_id, preprocess=cfg.preprocess,
        prefix_plan=cfg.prefix_plan, prefix_block_tokens=cfg.prefix_block_tokens,
        input_format=cfg.input_format,
    )
    manifest, refs = plan(request)
    log.info("run %s: %d rows in %d shards -> %s", run_id, manifest.rows, len(refs),
             RunLayout(cfg.output_root, run_id, dag_id).manifest_uri)
    refs = carry_over_task(cfg, manifest, run_dir_of(cfg, run_id, dag_id), refs)
    context["ti"].xcom_push(key="run_dir", value=run_dir_of(cfg, run_id, dag_id))
    return refs


def carry_over_task(cfg: RunConfig, manifest: Manifest, run_dir: str, refs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Complete the shards an earlier run already computed from unchanged input
    (:mod:`batch_inference.carryover`) and return the refs of the others: carried shards get no mapped
    task (no pod, no subprocess). Off for ``reuse: off``, dry runs and empty plans."""
    if cfg.reuse != "same_root" or cfg.dry_run or not manifest.shards:
        return refs
    image = K8sSettings.from_env().image if cfg.runner == "kubernetes" else None
    plan = carry_over(manifest, run_dir, runner=cfg.runner, image=image, default_model=default_model_path())
    if plan.disabled:
        log.info("shard carry-over off: %s", plan.disabled)
    carried = set(plan.carried)
    if carried:
        rows = sum(s.rows for s in manifest.shards if s.shard_id in carried)
        log.info("carried over %d of %d shards (%d rows) from earlier runs: no worker for them; "
                 "fingerprint %s", len(carried), len(manifest.shards), rows, plan.pinned.get("fingerprint"))
    return [r for r in refs if r["shard_id"] not in carried]


def choose_runner_task(context: Mapping[str, Any], runners: Iterable[str] = ("local", "kubernetes")) -> str:
    """Branch: ``render_k8s`` for a dry run, else ``infer_local`` or ``kpo_args`` (kubernetes).

    Args:
        runners: the runners this DAG was built with (``dag_factory.enabled_runners``).

    Raises:
        AirflowFailException: the run asks for a runner the DAG was built without.
    """
    cfg, _, _ = planned_run(context)
    if cfg.dry_run:
        return "render_k8s"
    if cfg.runner not in tuple(runners):
        from airflow.sdk.exceptions import AirflowFailException

        raise AirflowFailException(
            f"params.runner: {cfg.runner!r} is not enabled in this deployment (runners: {list(runners)}); "
            "set BATCH_INFERENCE_RUNNERS=local,kubernetes (or BATCH_K8S_IMAGE) where the DAG files are "
            "parsed, or pick another runner")
    return "infer_local" if cfg.runner == "local" else "kpo_args"


def infer_local_task(ref: dict[str, Any], context: Mapping[str, Any]) -> dict[str, Any]:
    """Run one shard with the local runner; map its exit code to Airflow's retry semantics.

    Raises:
        AirflowFailException: worker exit 2 (bad input), or the run's actual spend has passed ``budget_usd``
            when the shard's parallelism slot came free (``budget.over_budget_message``; the shard is not
            started): no retry.
        AirflowException: worker exit 75 / 1 / other: retried with backoff.
    """
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    planned = run_config_of(manifest_for(ref["run_dir"]))  # the run as planned, not the raw Params
    try:  # the budget is checked once the shard holds its slot: what earlier shards spent is committed
        return run_shard(ref["run_dir"], ref["shard_id"], parallelism=planned.parallelism,
                         may_start=lambda: over_budget_message(ref["run_dir"], planned, ref["shard_id"])).to_dict()
    except (ShardBadInputError, ShardNotStartedError) as exc:
        raise AirflowFailException(str(exc)) from None
    except ShardRetryableError as exc:
        raise AirflowException(str(exc)) from None


def kpo_args_task(refs: list[dict[str, Any]], context: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per-shard ``expand_kwargs`` for the mapped pod task (see :func:`pod_spec.kpo_expand_kwargs`)."""
    return [kpo_expand_kwargs(ref, context["run_id"]) for ref in refs]


def render_k8s_task(refs: list[dict[str, Any]], context: Mapping[str, Any], out_dir: str = RENDER_DIR) -> list[str]:
    """Dry run: write the pod manifests the kubernetes runner would create to ``out_dir``."""
    from batch_inference.shard_pod import render_pod_manifests  # the kubernetes provider: dry runs only

    if not refs:
        log.info("dry run: the plan has no shards, so no pod manifests")
        return []
    manifest = manifest_for(refs[0]["run_dir"])
    paths = render_pod_manifests(refs, context["run_id"], K8sSettings.from_env(), out_dir,
                                 worker=manifest.worker)
    log.info("dry run: wrote %d pod manifest(s) to %s", len(paths), out_dir)
    return paths


def empty_publish_summary(cfg: RunConfig, fingerprint: str) -> dict[str, Any]:
    """The publish summary of a run with no input rows: a no-op that leaves the table untouched."""
    return {"table": cfg.output_table, "schema": DEFAULT_SCHEMA, "backend": cfg.publish_backend,
            "fingerprint": fingerprint,
            "rows_input": 0, "rows_published": 0, "rows_dead_letter": 0, "rows_missing": 0,
            "duplicates_removed": 0, "publish_seconds": 0.0, "noop": True, "success_ratio": 1.0}


def publish_and_report_task(context: Mapping[str, Any], gate: dict[str, Any] | None, alias: Any) -> dict:
    """Publish the run atomically, write its report, and emit the Asset event of the table written.

    Args:
        alias: the task's outlet :class:`~airflow.sdk.AssetAlias`; the event goes on
            :func:`batch_inference.assets.table_asset` of the table this run published (its
            ``output_table``, not the DAG's default), with key figures as its extra.

    A run over an OpenAI batch input (``input_format: openai_batch``) also gets OpenAI's output and error
    files (:func:`batch_inference.openai_files.write_run_files`), named in the summary's ``openai_files``
    and the report's ``uris``.

    Returns:
        ``{"publish": <publish summary>, "report_json": <uri>, "asset_extra": {...}}``.
    """
    # duckdb, pyarrow, numpy: loaded by this task only, not by every task of the run
    from batch_inference.openai_files import write_run_files
    from batch_inference.publish import publish_run
    from batch_inference.report import asset_extra, build_report

    cfg, manifest, run_dir = planned_run(context)
    if not manifest.shards:
        summary = empty_publish_summary(cfg, manifest.config_fingerprint)
        log.info("empty input: nothing to publish; table %s left as it was", cfg.output_table)
    else:
        summary = publish_run(run_dir, publish_target(cfg), min_success_ratio=cfg.min_success_ratio)
        log.info("published: %s", summary)
        if cfg.reuse == "same_root":
            log.info("indexed %d shard(s) for carry-over by later runs", index_published(run_dir))
    openai_files = write_run_files(run_dir)
    if openai_files is not None:
        summary = {**summary, "openai_files": openai_files.to_dict()}
        log.info("OpenAI batch output: %d line(s) -> %s; errors: %d line(s) -> %s", openai_files.output_lines,
                 openai_files.output_uri, openai_files.error_lines, openai_files.errors_uri)
    report = build_report(run_dir, dag_id=context["dag"].dag_id, publish_summary=summary,
                          cost_params=cfg.cost_params())
    extra = {**asset_extra(report), "run_id": context["run_id"], "table": summary.get("table"),
             "fingerprint": summary.get("fingerprint"), "rows_published": summary.get("rows_published"),
             "rows_dead_letter": summary.get("rows_dead_letter")}
    context["outlet_events"][alias].add(table_asset(summary.get("table") or cfg.output_table), extra=extra)
    return {"publish": summary, "report_json": RunLayout.from_run_dir(run_dir).report_json_uri,
            "asset_extra": extra}


def summary_task(result: dict[str, Any], context: Mapping[str, Any]) -> str:
    """Log the report's human summary and the report path (the line ``batch_inference.cli`` parses), and
    emit the report's metrics through Airflow's ``Stats`` (:func:`batch_inference.metrics.emit_report_metrics`;
    a metrics failure is logged, never raised)."""
    from batch_inference.metrics import emit_report_metrics  # numpy, pyarrow: loaded by this task only
    from batch_inference.report import text_summary

    report = RunStore.open(result["report_json"].rsplit("/", 1)[0]).report()
    if report is None:
        raise FileNotFoundError(f"{result['report_json']}: no report")
    for line in text_summary(report).splitlines():
        log.info("%s", line)
    log.info("%s%s", REPORT_LINE_PREFIX, result["report_json"])
    emit_report_metrics(report)
    return result["report_json"]
