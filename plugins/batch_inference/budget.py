"""The in-run budget stop: what a run has spent so far, and whether its next shard may start.

Checked before each shard starts, by both runners: ``tasks.infer_local_task`` (local) and
``shard_pod.ShardPodOperator.execute`` (kubernetes, before a try creates the shard's pod). Spend is
priced as the cost report prices it (:mod:`batch_inference.pricing`). Airflow side; no Airflow import:
the callers turn the message into their failure.
"""

from __future__ import annotations

from typing import Any

from batch_contract.runstore import RunStore

from batch_inference.params import RunConfig
from batch_inference.pricing import CostParams, cost_params_from_dict, worker_cost

BUDGET_TOLERANCE = 0.10
"""A run stops launching shards once its actual spend passes ``budget_usd`` by this share (10%): the
projection's error on the development machine stayed within about 25%, so a tighter line would stop
runs the canary rightly let through, a looser one would let a mis-projected run overspend further."""


def spent_usd(markers: list[Any], canary: Any, params: CostParams) -> float:
    """USD spent so far: the complete shards' stage seconds (the report's worker-seconds) plus the
    canary's own (idle excluded), priced as the report prices them.

    Args:
        markers: the complete shards' :class:`~batch_contract.marker.ShardMarker` s.
        canary: the run's :class:`~batch_contract.canary.CanaryResult`, or ``None`` (no canary).
        params: the run's cost parameters.
    """
    seconds = sum(float(v) for m in markers for v in m.stage_seconds.values())
    if canary is not None:
        seconds += sum(v for k, v in canary.stage_seconds.items() if k != "idle")
    return worker_cost(seconds, params)


def budget_exceeded(run_dir: str, cfg: RunConfig) -> str | None:
    """``"the run has spent $S (N complete shard(s)...) > budget_usd=B + 10%"`` when the run's actual spend
    (:func:`spent_usd`, read from the run's markers and canary result) has passed ``budget_usd`` by more
    than :data:`BUDGET_TOLERANCE`; ``None`` when there is no budget or it holds.

    Raises:
        ConfigError: the run's ``cost_params`` are invalid (:func:`~batch_inference.pricing.cost_params_from_dict`).
    """
    if cfg.budget_usd is None:
        return None
    store = RunStore.open(run_dir)
    markers = list(store.poll().values())
    canary = store.canary()
    spent = spent_usd(markers, canary, cost_params_from_dict(cfg.cost_params()))
    if spent <= cfg.budget_usd * (1 + BUDGET_TOLERANCE):
        return None
    what = f"{len(markers)} complete shard(s)" + (" and the canary" if canary is not None else "")
    return f"the run has spent ${spent:.6g} ({what}) > budget_usd={cfg.budget_usd:g} + {BUDGET_TOLERANCE:.0%}"


def over_budget_message(run_dir: str, cfg: RunConfig, shard_id: str) -> str | None:
    """Why shard ``shard_id`` must not start (``BUDGET EXCEEDED: ...``, from :func:`budget_exceeded`), or
    ``None`` when there is no budget or it holds. On a stop it also writes the run's ``steal_stop.json``
    (:meth:`~batch_contract.runstore.RunStore.write_steal_stop`): workers stealing units stop taking them.

    Raises:
        ConfigError: the run's ``cost_params`` are invalid.
    """
    exceeded = budget_exceeded(run_dir, cfg)
    if exceeded is None:
        return None
    # workers that steal units of other shards (worker.steal) stop taking them: the run spends no more
    RunStore.open(run_dir).write_steal_stop(f"BUDGET EXCEEDED: {exceeded}")
    return (f"BUDGET EXCEEDED: {exceeded}; shard {shard_id} is not started. {BUDGET_STOP_FIX}")


BUDGET_STOP_FIX = "Every committed row is kept: raise budget_usd and clear the failed shard tasks to finish the run."
"""What to do after a budget stop (the stop's message and the completion gate's cause)."""


__all__ = ["BUDGET_STOP_FIX", "BUDGET_TOLERANCE", "budget_exceeded", "over_budget_message", "spent_usd"]
