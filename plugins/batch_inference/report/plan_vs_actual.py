"""The report's projection-versus-actual section: how good the canary's plan was.

Reads the run's ``projection.json`` (written by the ``canary`` task, ``batch_inference.projection``)
and sets it beside what the markers say: fan-out worker-seconds (the report's ``worker_seconds``), cost
(the same price, the canary's own worker-seconds added on both sides) and finish time (seconds from
the DAG run's start to the last shard's marker: the plan's elapsed time recorded in the projection plus
the time from the manifest's creation to the last marker).
"""

from __future__ import annotations

from typing import Any

from batch_inference.pricing import CostParams, worker_cost
from batch_inference.report.aggregate import parse_time


def _error(projected: float | None, actual: float | None) -> float | None:
    """``(projected - actual) / actual``, ``None`` when either is missing or actual is 0."""
    if projected is None or not actual:
        return None
    return round((projected - actual) / actual, 4)


TOKEN_FIGURES = ("prompt_tokens", "cached_prompt_tokens", "output_tokens", "hit_rate")
"""The LLM token figures set side by side (tokens; ``hit_rate`` a share of prompt tokens)."""


def actual_llm_tokens(markers: list[Any]) -> dict[str, Any]:
    """Prompt, prefix-cached and output tokens the shards' markers count (vLLM's own counters per
    request: ``prompt_token_ids``, ``num_cached_tokens``, generated ids) and their hit rate."""
    prompt = sum(m.tokens_prompt for m in markers)
    cached = sum(m.tokens_cached for m in markers)
    return {"prompt_tokens": prompt, "cached_prompt_tokens": cached,
            "output_tokens": sum(m.tokens_output for m in markers),
            "hit_rate": round(cached / prompt, 4) if prompt else None}


def _tokens(projection: dict[str, Any], actual: dict[str, Any] | None) -> dict[str, Any] | None:
    """``{"projected", "actual", "error"}`` of the LLM token figures, ``None`` without both sides."""
    projected = projection.get("llm_tokens")
    if not projected or not actual:
        return None
    left = {k: projected.get(k) for k in TOKEN_FIGURES}
    right = {k: actual.get(k) for k in TOKEN_FIGURES}
    return {"projected": left, "actual": right, "error": {k: _error(left[k], right[k]) for k in TOKEN_FIGURES}}


def projection_section(projection: dict[str, Any] | None, *, worker_seconds: float, canary_worker_seconds: float,
                       plan_created_at: str | None, last_shard_finished_at: str | None,
                       params: CostParams, llm_tokens: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The ``projection`` section of ``report.json``, or ``None`` for a run without a canary.

    Returns:
        ``{"decision", "message", "parallelism", "token_budget", "projected": {...}, "actual": {...},
        "error": {...}}``; each of ``projected`` / ``actual`` has ``worker_seconds`` (fan-out),
        ``cost_usd`` and ``finish_seconds`` (``None`` when unknown); ``error`` is
        ``(projected - actual) / actual`` per figure. An LLM run whose canary priced prompt and output
        tokens apart (``projection.llm_tokens``) also has ``tokens``: the same three parts over
        :data:`TOKEN_FIGURES`, the actual side ``llm_tokens`` (:func:`actual_llm_tokens`).
    """
    if not projection:
        return None
    start, end = parse_time(plan_created_at or ""), parse_time(last_shard_finished_at or "")
    finish = ((end - start).total_seconds() + float(projection.get("elapsed_seconds", 0.0))
              if start and end else None)
    actual = {"worker_seconds": worker_seconds,
              "cost_usd": worker_cost(worker_seconds + canary_worker_seconds, params),
              "finish_seconds": finish}
    projected = {"worker_seconds": projection.get("fanout_worker_seconds"),
                 "cost_usd": projection.get("cost_usd"), "finish_seconds": projection.get("finish_seconds")}
    out = {
        "decision": projection.get("decision"),
        "message": projection.get("message"),
        "parallelism": (projection.get("chosen") or {}).get("parallelism"),
        "token_budget": (projection.get("canary") or {}).get("token_budget"),
        "projected": projected,
        "actual": actual,
        "error": {k: _error(projected[k], actual[k]) for k in projected},
    }
    tokens = _tokens(projection, llm_tokens)
    if tokens is not None:
        out["tokens"] = tokens
    return out


__all__ = ["TOKEN_FIGURES", "actual_llm_tokens", "projection_section"]
