"""``build_report``: aggregate a run's measured stats into ``report.json`` and ``report.html``."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import numpy as np
from batch_contract.engine_config import WorkerSettings
from batch_contract.hostinfo import describe
from batch_contract.marker import ShardMarker
from batch_contract.runstore import RunStore
from batch_contract.version import SCHEMA_VERSION

import batch_inference.report.aggregate as agg
import batch_inference.report.tokens as tok
from batch_inference.pricing import (
    CostParams,
    cost_by_stage,
    cost_params_from_dict,
    per_million,
    pricing_counterfactuals,
    worker_cost,
)
from batch_inference.projection import read_projection
from batch_inference.report.approvals import read_section
from batch_inference.report.attempts import OUTCOMES, summarize_attempts
from batch_inference.report.collect import IO_THREADS, RunData, load_run
from batch_inference.report.history import recent_runs
from batch_inference.report.plan_vs_actual import actual_llm_tokens, projection_section

REPORT_SCHEMA_VERSION = 1
"""Version of the ``report.json`` layout (``report.schema.json``); bump on any incompatible change."""

REUSE_METHOD = (
    "Rows reused from the result cache (<output_root>/cache/<fingerprint>) were not computed by this run. "
    "Cost avoided = the compute seconds the runs that computed them measured (each chunk's engine + "
    "commit seconds shared over its rows by n_tokens) x this run's accelerator count and price per hour. "
    "Worker time this run spent finding and copying them is in stage_seconds.reuse."
)

PADDING_METHOD = (
    "Random-order estimate: each shard's rows (n_tokens read from its part files) are assumed batched "
    "in random order, B rows a batch, where B = min(max_batch_rows, token_budget // longest row rounded "
    "up to pad_to_multiple_of) is the largest batch a random-order batcher can use under the same token "
    "budget. A batch pads to its longest row, so padded tokens = rows x E[max of B lengths drawn from the "
    "shard's length distribution]. Inference seconds are assumed proportional to padded tokens, so the "
    "cost avoided is inference cost x (estimated padded / measured padded - 1)."
)


def _shard_row(spec_rows: int, shard_id: str, marker: ShardMarker | None, status: str,
               att: dict[str, Any], params: CostParams, show_host: bool = False) -> dict[str, Any]:
    """One row of the per-shard table (``None`` for figures a shard without marker cannot have).
    ``show_host``: the run's shards ran on more than one kind of host, so each row names its host
    (``host``: :func:`batch_contract.hostinfo.describe` of the marker's host facts), else ``None``."""
    if marker is None:
        return {
            "shard_id": shard_id, "status": status, "rows_input": spec_rows, "rows_ok": None,
            "rows_dead_letter": None, "rows_truncated": None, "tokens_real": None, "tokens_padded": None,
            "padding_efficiency": None, "seconds": None, "stage_seconds": {}, "steady_rows_per_s": None,
            "rows_per_s": None, "gpu_util_mean": None, "cpu_seconds": None, "attempts": att["attempts"],
            "preemptions": att["preemptions"], "killed": att["killed"], "rows_redone": att["rows_redone"],
            "cost_usd": None, "started_at": None, "finished_at": None, "host": None, "chunks_stolen": None,
        }
    seconds = agg.shard_seconds(marker)
    return {
        "shard_id": shard_id,
        "status": status,
        "rows_input": marker.rows_input,
        "rows_ok": marker.rows_ok,
        "rows_dead_letter": marker.rows_dead_letter,
        "rows_truncated": marker.rows_truncated,
        "tokens_real": marker.tokens_real,
        "tokens_padded": marker.tokens_padded,
        "padding_efficiency": marker.padding_efficiency,
        "seconds": seconds,
        "stage_seconds": {k: float(v) for k, v in marker.stage_seconds.items()},
        "steady_rows_per_s": marker.steady_rows_per_s,
        "rows_per_s": agg.ratio(marker.rows_input, seconds),
        "gpu_util_mean": marker.gpu.get("util_mean"),
        "cpu_seconds": marker.cpu_seconds,
        "attempts": att["attempts"],
        "preemptions": att["preemptions"],
        "killed": att["killed"],
        "rows_redone": att["rows_redone"],
        "cost_usd": worker_cost(seconds, params),
        "started_at": marker.started_at or None,
        "finished_at": marker.finished_at or None,
        "host": describe(marker.host_facts) if show_host else None,
        "chunks_stolen": int(marker.steal["units_stolen"]) if marker.steal else None,
    }


def _padding_section(data: RunData, counts: dict[str, np.ndarray], params: CostParams) -> dict[str, Any]:
    """Measured padding and the random-order counterfactual (see :data:`PADDING_METHOD`)."""
    markers = list(data.markers.values())
    real = sum(m.tokens_real for m in markers if m.tokens_padded)
    padded = sum(m.tokens_padded for m in markers)
    section: dict[str, Any] = {
        "efficiency": agg.padding_efficiency(markers),
        "tokens_real": real,
        "tokens_padded": padded,
        "tokens_padding": padded - real,
        "random_order_estimate": None,
    }
    worker: WorkerSettings = data.manifest.worker
    pad_multiple = int(data.manifest.engine.get("pad_to_multiple_of") or 1)
    est_padded, meas_padded, est_real, avoided_usd, inference_s, batch_rows = 0.0, 0, 0, 0.0, 0.0, []
    for shard_id, marker in data.markers.items():
        c = counts.get(shard_id)
        if not marker.tokens_padded or c is None or not c.size or not int(c.sum()):
            continue
        device = str(marker.engine.get("device") or "cpu")
        budget = worker.token_budget_for(device)
        rows_per_batch = tok.random_order_batch_rows(c, budget, worker.max_batch_rows_for(device), pad_multiple)
        estimate = tok.expected_random_padded_tokens(c, rows_per_batch, pad_multiple)
        inference = marker.stage_seconds.get("inference", 0.0)
        est_padded += estimate
        meas_padded += marker.tokens_padded
        est_real += marker.tokens_real
        inference_s += inference
        avoided_usd += worker_cost(inference, params) * (estimate / marker.tokens_padded - 1.0)
        batch_rows.append(rows_per_batch)
    if meas_padded:
        section["random_order_estimate"] = {
            "method": PADDING_METHOD,
            "shards": len(batch_rows),
            "batch_rows_min": min(batch_rows),
            "batch_rows_max": max(batch_rows),
            "tokens_padded": est_padded,
            "efficiency": agg.ratio(est_real, est_padded),
            "inference_seconds": inference_s * est_padded / meas_padded,
            "tokens_avoided": est_padded - meas_padded,
            "cost_avoided_usd": avoided_usd,
        }
    return section


def _status(data: RunData, shard_id: str) -> str:
    if shard_id in data.markers:
        return "complete"
    progress = data.progress.get(shard_id)
    return progress.status if progress is not None else "pending"


def _openai_uris(publish_summary: dict[str, Any] | None) -> dict[str, str]:
    """``openai_output`` / ``openai_errors``: the OpenAI batch output and error files of a run over an
    OpenAI batch input (the publish summary's ``openai_files``); ``{}`` for any other run."""
    files = (publish_summary or {}).get("openai_files")
    return {"openai_output": files["output"], "openai_errors": files["errors"]} if files else {}


def compute_report(data: RunData, *, dag_id: str, publish_summary: dict[str, Any] | None,
                   params: CostParams, counts: dict[str, np.ndarray],
                   history: list[dict[str, Any]], generated_at: str,
                   projection: dict[str, Any] | None = None, canary_worker_seconds: float = 0.0,
                   approval: dict[str, Any] | None = None) -> dict[str, Any]:
    """The report dict from already-read inputs (pure; :func:`build_report` does the I/O).

    Args:
        data: manifest, markers, attempts and progress of the run.
        dag_id: the DAG the run belongs to (recorded; used to find sibling runs).
        publish_summary: the publish task's summary dict, or ``None`` if publish did not run.
        params: validated cost parameters.
        counts: shard id -> rows per token length (``tokens.shard_length_counts``).
        history: other runs' key figures (``history.recent_runs``), oldest first.
        generated_at: ISO-8601 UTC timestamp of this report.
        projection: the canary's ``projection.json`` (``None``: the run had no canary).
        canary_worker_seconds: the canary's own stage seconds (model load included): its rows are
            committed into the shards, whose markers count only their own work, so the report adds them
            as the stage ``canary`` (in ``worker_seconds``, ``gpu_seconds`` and every cost figure, as the
            in-run budget check ``budget.spent_usd`` prices the run).
        approval: who approved the run and when (:func:`batch_inference.report.approvals.approval_section`
            of its ``approval.json``); ``None``: the run did not ask for approval.
    """
    layout, manifest = data.layout, data.manifest
    markers = [data.markers[s.shard_id] for s in manifest.shards if s.shard_id in data.markers]
    publish = dict(publish_summary) if publish_summary else None
    publish_seconds = float(publish.get("publish_seconds", 0.0)) if publish else 0.0

    worker_stages = agg.sum_stages(markers)
    if canary_worker_seconds > 0:
        worker_stages["canary"] = float(canary_worker_seconds)
    # document extraction runs in the pool beside the engine: its wall is shown, not priced again (the
    # pod's time is priced through the engine's stages, its idle waiting on the pool included)
    preprocess_wall = worker_stages.pop("preprocess", None)
    stage_seconds = {**worker_stages, **({"preprocess": preprocess_wall} if preprocess_wall is not None else {}),
                     "publish": publish_seconds}
    worker_seconds = sum(worker_stages.values())
    by_stage_usd = cost_by_stage(worker_stages, publish_seconds, params)
    cost_usd = sum(by_stage_usd.values())

    rows_ok = sum(m.rows_ok for m in markers)
    rows_published = int(publish["rows_published"]) if publish and "rows_published" in publish else rows_ok
    rows_dead = (int(publish["rows_dead_letter"]) if publish and "rows_dead_letter" in publish
                 else sum(m.rows_dead_letter for m in markers))
    tokens = agg.token_totals(markers)

    shard_att = {s.shard_id: summarize_attempts(data.attempts.get(s.shard_id, []), s.shard_id in data.markers)
                 for s in manifest.shards}
    attempt_list = [{"shard_id": sid, **a} for sid, att in shard_att.items() for a in att["list"]]
    by_outcome = {o: sum(att["by_outcome"][o] for att in shard_att.values()) for o in OUTCOMES}
    interrupted_s = sum(a["seconds"] for a in attempt_list if a["outcome"] in {"preempted", "killed", "failed"})
    all_counts = np.zeros(0, dtype=np.int64)
    for c in counts.values():
        all_counts = tok.add_counts(all_counts, c)
    engine = dict(markers[0].engine) if markers else {}
    padding = _padding_section(data, counts, params)
    timeline_of = agg.timeline(markers, manifest.created_at, publish_seconds)
    rows_reused = sum(m.rows_reused for m in markers)
    reuse_seconds = float(sum(m.reuse_seconds_avoided for m in markers))
    host_groups = agg.hosts(markers)

    return {
        "schema_version": REPORT_SCHEMA_VERSION,
        "contract_schema_version": SCHEMA_VERSION,
        "generated_at": generated_at,
        "run_id": manifest.run_id,
        "dag_id": dag_id,
        "uris": {"run_dir": layout.run_dir, "report_json": layout.report_json_uri,
                 "report_html": layout.report_html_uri, **_openai_uris(publish_summary)},
        "engine_kind": manifest.engine_config.kind,
        "engine": engine,
        "complete": len(markers) == len(manifest.shards),
        "shards_total": len(manifest.shards),
        "shards_complete": len(markers),
        "shards_missing": [s.shard_id for s in manifest.shards if s.shard_id not in data.markers],
        "rows_input": manifest.rows,
        "rows_published": rows_published,
        "rows_dead_letter": rows_dead,
        "rows_truncated": sum(m.rows_truncated for m in markers),
        "rows_text_repaired": sum(m.rows_text_repaired for m in markers),
        "rows_missing": (int(publish["rows_missing"]) if publish and "rows_missing" in publish
                         else manifest.rows - rows_ok - sum(m.rows_dead_letter for m in markers)),
        "rows_reused": rows_reused,
        "rows_computed": rows_ok - rows_reused,
        "reuse": {
            "mode": manifest.worker.reuse,
            "rows_reused": rows_reused,
            "rows_computed": rows_ok - rows_reused,
            "seconds_avoided": reuse_seconds,
            "cost_avoided_usd": worker_cost(reuse_seconds, params),
            "method": REUSE_METHOD,
            "shards_carried": sum(1 for m in markers if m.engine.get("carried_from")),
        },
        "dead_letter_reasons": agg.dead_letter_reasons(markers, publish),
        "files_quarantined": agg.files_quarantined(markers, publish),
        "tokens": tokens,
        "padding_efficiency": padding["efficiency"],
        "padding": padding,
        "stage_seconds": stage_seconds,
        "stage_fractions": agg.fractions(stage_seconds),
        "worker_seconds": worker_seconds,
        "gpu_seconds": worker_seconds * params.gpu_count,
        "timeline": timeline_of,
        "throughput": agg.throughput(markers, params.gpu_count),
        "utilisation": agg.utilisation(markers),
        "attempts": {
            "total": len(attempt_list),
            "by_outcome": by_outcome,
            "preemptions": by_outcome["preempted"],
            "killed": by_outcome["killed"],
            "rows_redone": sum(a["rows_redone"] for a in attempt_list),
            "shards_retried": sum(1 for att in shard_att.values() if att["attempts"] > 1),
            "interrupted_seconds": interrupted_s,
            "interrupted_cost_usd": worker_cost(interrupted_s, params),
            "list": attempt_list,
        },
        "cost_usd": cost_usd,
        "cost_per_million_rows_usd": per_million(cost_usd, rows_published),
        "cost_per_million_tokens_usd": per_million(cost_usd, tokens["total"]),
        "cost": {
            "params": params.to_dict(),
            "usd_per_gpu_hour": params.usd_per_gpu_hour,
            "worker_usd": cost_usd - by_stage_usd["publish"],
            "publish_usd": by_stage_usd["publish"],
            "by_stage_usd": by_stage_usd,
            "per_million_input_tokens_usd": per_million(cost_usd, tokens["input"]),
            "per_million_output_tokens_usd": per_million(cost_usd, tokens["output"]),
        },
        "counterfactuals": {
            **pricing_counterfactuals(worker_seconds, by_stage_usd["publish"], rows_published, params),
            "padding": padding["random_order_estimate"],
        },
        "token_lengths": {"stats": tok.length_stats(all_counts), "histogram": tok.histogram(all_counts)},
        "shards": [_shard_row(s.rows, s.shard_id, data.markers.get(s.shard_id), _status(data, s.shard_id),
                              shard_att[s.shard_id], params, show_host=len(host_groups) > 1)
                   for s in manifest.shards],
        "hosts": host_groups,
        "publish": publish,
        "history": history,
        "projection": projection_section(
            projection, worker_seconds=worker_seconds - canary_worker_seconds,
            canary_worker_seconds=canary_worker_seconds,
            plan_created_at=manifest.created_at, last_shard_finished_at=timeline_of["last_shard_finished_at"],
            params=params, llm_tokens=actual_llm_tokens(markers)),
        "upgrade": (projection or {}).get("upgrade"),
        "approval": approval,
        "preprocess": agg.preprocess(markers),
        "stealing": agg.stealing(markers, manifest.worker.steal),
    }


def _projection_inputs(run_dir: str) -> tuple[dict[str, Any] | None, float]:
    """The run's ``projection.json`` (``None`` without one) and the canary's stage seconds, idle excluded
    (``canary.json``; 0.0 without a canary)."""
    projection = read_projection(run_dir)
    canary = RunStore.open(run_dir).canary()
    seconds = sum(v for k, v in canary.stage_seconds.items() if k != "idle") if canary else 0.0
    return projection, float(seconds)


def build_report(run_dir: str, *, dag_id: str, publish_summary: dict[str, Any] | None,
                 cost_params: dict[str, Any] | None, write_html: bool = True) -> dict[str, Any]:
    """Aggregate a run's markers, attempts and part-file token counts; write ``report.json`` (+ HTML).

    Args:
        run_dir: ``<output_root>/runs/<run_id>`` (local path, ``file://`` or ``gs://``).
        dag_id: the run's DAG id; runs of the same DAG under ``<output_root>/runs/`` feed the history chart.
        publish_summary: the publish task's summary (``rows_published``, ``rows_dead_letter``,
            ``rows_missing``, ``duplicates_removed``, ``publish_seconds``, ...) or ``None``.
        cost_params: see :func:`~batch_inference.pricing.cost_params_from_dict`.
        write_html: also render and write ``report.html`` (default ``True``).

    Returns:
        The report dict, as written to ``report.json`` (schema: ``report.schema.json``).

    Raises:
        ConfigError: invalid ``cost_params`` (names the key).
        FileNotFoundError: the run has no manifest.
        ValueError: an unreadable marker/record version, or a part file without ``n_tokens``.
    """
    params = cost_params_from_dict(cost_params)
    data = load_run(run_dir)
    with ThreadPoolExecutor(max_workers=max(1, min(IO_THREADS, len(data.markers)))) as pool:
        counts = dict(zip(data.markers, pool.map(lambda item: tok.shard_length_counts(data.layout, *item),
                                                 data.markers.items()), strict=True))
    history = recent_runs(data.layout.output_root, dag_id, data.layout.run_id)
    generated_at = datetime.now(UTC).isoformat(timespec="seconds")
    projection, canary_ws = _projection_inputs(run_dir)
    report = compute_report(data, dag_id=dag_id, publish_summary=publish_summary, params=params,
                            counts=counts, history=history, generated_at=generated_at,
                            projection=projection, canary_worker_seconds=canary_ws,
                            approval=read_section(RunStore(data.layout)))
    report = json.loads(json.dumps(report, default=str))  # plain JSON types only (what readers will see)
    html = None
    if write_html:
        from batch_inference.report.page import render_html  # matplotlib only when HTML is wanted

        html = render_html(report)
    RunStore(data.layout).write_report(report, html)
    return report
