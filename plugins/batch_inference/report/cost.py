"""Cost maths: seconds x devices x $/device-hour, split by stage, and the on-demand/spot counterfactual.

Priced time is what the workers measured (``stage_seconds`` of the shard markers, summed over
attempts, so time lost to preemptions is paid for) plus the publish task's seconds. Pod scheduling and
image pulls happen before the worker starts and are not measured, so they are not priced.
"""

from __future__ import annotations

from typing import Any

from batch_inference.report.prices import CostParams

PER_MILLION = 1_000_000


def per_million(cost_usd: float, count: int | float) -> float | None:
    """``cost_usd / count * 1e6`` (USD per million units), or ``None`` when ``count`` is 0."""
    return cost_usd / count * PER_MILLION if count else None


def worker_cost(seconds: float, params: CostParams, usd_per_gpu_hour: float | None = None) -> float:
    """USD for ``seconds`` of one worker holding ``params.gpu_count`` accelerators.

    Args:
        seconds: worker wall-clock seconds.
        params: cost parameters.
        usd_per_gpu_hour: price override (default: the price paid, ``params.usd_per_gpu_hour``).
    """
    rate = params.usd_per_gpu_hour if usd_per_gpu_hour is None else usd_per_gpu_hour
    return seconds * params.gpu_count * rate / 3600.0


def cost_by_stage(stage_seconds: dict[str, float], publish_seconds: float, params: CostParams) -> dict[str, float]:
    """USD by stage: worker stages at the accelerator price, ``publish`` at the publish machine price."""
    out = {stage: worker_cost(sec, params) for stage, sec in stage_seconds.items()}
    out["publish"] = publish_seconds * params.publish_usd_per_hour / 3600.0
    return out


def pricing_counterfactuals(
    worker_seconds: float, publish_usd: float, rows: int, params: CostParams
) -> dict[str, Any]:
    """The same measured seconds priced spot and on-demand.

    Returns:
        ``{"spot": {...}, "on_demand": {...}}``, each ``{"cost_usd", "cost_per_million_rows_usd",
        "delta_vs_actual_usd"}`` (positive delta: that mode would have cost more).
    """
    actual = worker_cost(worker_seconds, params) + publish_usd
    out: dict[str, Any] = {}
    for mode, rate in (("spot", params.spot_usd_per_gpu_hour), ("on_demand", params.on_demand_usd_per_gpu_hour)):
        cost = worker_cost(worker_seconds, params, rate) + publish_usd
        out[mode] = {
            "cost_usd": cost,
            "cost_per_million_rows_usd": per_million(cost, rows),
            "delta_vs_actual_usd": cost - actual,
        }
    return out
