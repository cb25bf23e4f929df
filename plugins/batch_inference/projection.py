"""From the canary's measurements to a plan a person reads at a glance: worker-seconds, GPU-hours, cost
and finish time per parallelism; the cheapest parallelism that meets the deadline; go or refuse.

Pure functions (no Airflow, no torch), plus :func:`read_projection`, which reads a run's
``projection.json`` back; ``batch_inference.canary_task`` runs the canary and writes it.

The model (every figure in seconds, tokens or USD):

* **tokens per shard**: the planner's ``est_tokens`` (text bytes / 4) times a calibration factor, the
  canary's real tokens over the planner's estimate for the same rows (``est_tokens x canary rows /
  shard rows`` of the sampled shards), minus the tokens the canary already committed in that shard,
  times the share of the shard's sampled rows the result cache did not hold (``reuse``: cached rows
  are copied, not computed; the sample is the shard's first rows, so the share holds for the rest of
  the shard when its changes are spread over it);
* **worker-seconds per shard**: the canary's ``model_load_seconds`` plus the remaining tokens times its
  ``worker_seconds_per_token`` (the LLM engine, when its canary measured prefill and decode apart:
  prompt tokens the prefix cache will not serve times the prefill rate, plus rows times output tokens per
  row times the decode rate, plus the vLLM scheduler steps those take times the canary's seconds per
  step, plus the other stages per token: :func:`llm_rates`, :func:`shard_hit_rate`, :func:`engine_steps`) (input read + tokenize + inference + write per real token at the chosen
  batch settings): the same stages a shard's marker adds up, which is what the report calls
  worker-seconds. The local runner gives each of ``p`` workers ``cores // p`` threads on ``cores``
  cores, so a token costs ``canary threads / min(cores // p, cores / p)`` times the canary's time
  (throughput taken as linear in threads); a pod of the kubernetes runner has its own device, so its
  speed does not depend on ``p``;
* **finish time** at parallelism ``p``: the canary's wall time plus the makespan of the shards
  (worker-seconds + process start-up, measured as the canary's wall minus its own elapsed time)
  scheduled longest first on ``p`` workers (the order the fan-out roughly follows);
* **cost**: worker-seconds priced as the report prices them (``batch_inference.pricing.worker_cost``, spot and
  on-demand), plus the canary's own worker-seconds; **GPU-hours**: worker-seconds x GPUs per worker.

Decision: the parallelisms considered are ``1..max_gpus`` for the kubernetes runner and the local
runner's own parallelism (it is fixed by the machine). The chosen one is the cheapest that finishes
within ``deadline_hours`` (ties: fewer workers); none: refused for the deadline. With ``budget_usd``
set, a chosen cost above it is refused for the budget. A refusal message gives the projection, the
limit and what would fit (a row limit, spot pricing, more GPUs).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Any

from batch_contract.canary import CanaryResult
from batch_contract.manifest import Manifest
from batch_contract.runstore import RunStore

from batch_inference.pricing import CostParams, worker_cost

PROJECTION_SCHEMA_VERSION = 1
DECISIONS = ("go", "refused_budget", "refused_deadline", "refused_upgrade")
"""``refused_upgrade`` is set by the upgrade check (``batch_inference.upgrade_gate``), not by :func:`project`."""


class RunRefused(RuntimeError):
    """The projection is over the budget or past the deadline: the run stops before the fan-out.

    Attributes:
        projection: the projection dict (:func:`project`), with ``decision`` and ``message``.
    """

    def __init__(self, projection: dict[str, Any]) -> None:
        super().__init__(projection["message"])
        self.projection = projection


@dataclass(frozen=True)
class Limits:
    """What the run must fit in.

    Attributes:
        runner: ``local`` or ``kubernetes``.
        cores: CPU cores of the machine (local runner).
        parallelism: the local runner's workers at once (resolved, >= 1).
        max_gpus: most GPUs (pods at once) the kubernetes runner may use.
        deadline_hours: the run must finish the fan-out within this many hours of its start.
        budget_usd: most USD the run may cost (``None``: no budget).
        elapsed_seconds: seconds of the run already spent before the canary (plan).
    """

    runner: str
    cores: int
    parallelism: int
    max_gpus: int
    deadline_hours: float
    budget_usd: float | None = None
    elapsed_seconds: float = 0.0


@dataclass
class ShardLoad:
    """One shard's projected work: real tokens still to run and worker-seconds at speed factor 1; for the
    LLM engine also the prompt tokens the prefix cache is expected to serve (``cached_tokens``, from the
    expected hit rate ``hit_rate``), the output tokens to generate (``output_tokens``) and the vLLM
    scheduler steps they take (``steps``, :func:`engine_steps`)."""

    shard_id: str
    rows: int
    tokens: float
    seconds: float = 0.0
    cached_tokens: float = 0.0
    output_tokens: float = 0.0
    hit_rate: float | None = None
    steps: int = 0


@dataclass
class Inputs:
    """Projection inputs derived from the canary and the manifest."""

    calibration: float
    loads: list[ShardLoad] = field(default_factory=list)


def calibration(canary: CanaryResult, manifest: Manifest) -> float:
    """Real tokens per planner-estimated token on the sampled rows (1.0 when nothing was sampled)."""
    est = real = 0.0
    for shard in manifest.shards:
        rows = canary.shard_rows.get(shard.shard_id, 0)
        if rows and shard.rows:
            est += shard.est_tokens * rows / shard.rows
            real += canary.shard_tokens.get(shard.shard_id, 0)
    return real / est if est > 0 and real > 0 else 1.0


def uncached_share(canary: CanaryResult, shard_id: str) -> float:
    """Share (0..1) of ``shard_id``'s sampled rows the result cache did not hold: 1.0 when the canary
    found none of them cached or sampled nothing there."""
    cached = canary.shard_rows_cached.get(shard_id, 0)
    sampled = cached + canary.shard_rows.get(shard_id, 0)
    return 1.0 - cached / sampled if sampled else 1.0


def shard_loads(canary: CanaryResult, manifest: Manifest) -> Inputs:
    """Per shard: rows and real tokens left to compute after the canary (cached rows left out, see
    :func:`uncached_share`), and worker-seconds at the canary's speed."""
    cal = calibration(canary, manifest)
    loads = []
    for shard in manifest.shards:
        done_tokens = canary.shard_tokens.get(shard.shard_id, 0)
        share = uncached_share(canary, shard.shard_id)
        tokens = max(0.0, shard.est_tokens * cal - done_tokens) * share
        rows = round(max(0, shard.rows - canary.shard_rows.get(shard.shard_id, 0)) * share)
        rates = llm_rates(canary)
        if rates is None:
            seconds = canary.model_load_seconds + tokens * canary.worker_seconds_per_token
            loads.append(ShardLoad(shard.shard_id, rows, tokens, seconds))
            continue
        loads.append(_llm_load(canary, manifest, shard.shard_id, rows, tokens, rates))
    return Inputs(calibration=cal, loads=loads)


def llm_rates(canary: CanaryResult) -> tuple[float, float, float] | None:
    """``(prefill seconds per uncached prompt token, decode seconds per output token, output tokens per
    row)`` measured by an LLM canary (``canary.llm``, :class:`batch_worker.canary.LLMSpeed`); ``None``
    for other engines and for canaries without them (older records, no decode probe)."""
    llm = canary.llm or {}
    keys = ("seconds_per_uncached_prompt_token", "seconds_per_output_token", "output_tokens_per_row")
    if not all(isinstance(llm.get(k), int | float) for k in keys):
        return None
    return float(llm[keys[0]]), float(llm[keys[1]]), float(llm[keys[2]])


def shard_hit_rate(canary: CanaryResult, manifest: Manifest, shard_id: str) -> float:
    """The share (0..1) of a shard's prompt tokens the prefix cache is expected to serve: the prefix-aware
    plan's own estimate for the shard (``manifest.prefix_plan.shard_hit_rates``) when the plan was made;
    else the hit rate of the canary's sample of that shard on an engine of its own
    (``canary.llm.shard_own_hit_rates``: block hashes of the sampled prompts, the cache model the plan
    uses), which is the expectation for the rest of the shard when as many rows are left as were sampled
    and a lower bound when more are (more of their groups repeat); for older records, the hit rate vLLM
    measured on the canary's engine for the shard's sample (of the whole sample when the shard had none),
    which also counts blocks other shards' sampled rows computed."""
    planned = (manifest.prefix_plan or {}).get("shard_hit_rates") or {}
    if shard_id in planned:
        return float(planned[shard_id])
    llm = canary.llm or {}
    own = llm.get("shard_own_hit_rates") or {}
    if shard_id in own:
        return float(own[shard_id])
    prompt = (llm.get("shard_prompt_tokens") or {}).get(shard_id) or 0
    cached = (llm.get("shard_cached_tokens") or {}).get(shard_id) or 0
    if not prompt:
        prompt, cached = llm.get("prompt_tokens") or 0, llm.get("cached_tokens") or 0
    return min(1.0, cached / prompt) if prompt else 0.0


def engine_steps(rows: int, uncached_tokens: float, output_per_row: float, *, chunk_rows: int, max_num_seqs: int,
                 max_num_batched_tokens: int) -> int:
    """vLLM scheduler steps a shard's ``rows`` take, in chunks of ``chunk_rows`` rows, each chunk queued
    whole: per chunk, the steps its prompt tokens not served by the cache need at
    ``max_num_batched_tokens`` per step, then per wave of ``max_num_seqs`` rows one step per output token
    after the first (the last prefill step of a row emits its first token). Rows are taken to generate
    ``output_per_row`` tokens each (a wave lasts as long as its longest row, so give a high quantile).

    Args:
        rows: rows left to compute (>= 0).
        uncached_tokens: their prompt tokens the prefix cache will not serve (tokens).
        output_per_row: output tokens per row (tokens).
        chunk_rows: rows per chunk (>= 1); max_num_seqs: sequences per step (>= 1);
        max_num_batched_tokens: tokens per step (>= 1).

    Returns:
        Steps (0 when no rows are left).
    """
    if rows <= 0:
        return 0
    chunks = math.ceil(rows / max(1, chunk_rows))
    per_chunk_rows = math.ceil(rows / chunks)
    waves = math.ceil(per_chunk_rows / max(1, max_num_seqs))
    prefill = max(1, math.ceil(max(0.0, uncached_tokens) / chunks / max(1, max_num_batched_tokens)))
    return chunks * (prefill + waves * max(0, math.ceil(output_per_row) - 1))


def llm_step_seconds(canary: CanaryResult) -> float:
    """Seconds per vLLM scheduler step the canary measured (``canary.llm.seconds_per_engine_step``;
    0.0 for records without it, whose per-token rates carry the step cost)."""
    value = (canary.llm or {}).get("seconds_per_engine_step")
    return float(value) if isinstance(value, int | float) else 0.0


def _llm_steps(canary: CanaryResult, rows: int, uncached: float, per_row: float) -> int:
    """:func:`engine_steps` at the canary's chosen batch settings, its estimate of a shard's chunk rows
    (``engine_fit.chunk_rows``) and the output-token p90 (the mean when absent)."""
    llm, chosen = canary.llm or {}, canary.chosen or {}
    out = max(per_row, float(llm.get("output_tokens_p90") or 0.0))
    seqs = int(chosen.get("max_num_seqs") or chosen.get("max_batch_rows") or 1)
    batched = int(chosen.get("max_num_batched_tokens") or chosen.get("token_budget") or 1)
    chunk = int((canary.engine_fit or {}).get("chunk_rows") or rows or 1)
    return engine_steps(rows, uncached, out, chunk_rows=chunk, max_num_seqs=seqs, max_num_batched_tokens=batched)


def _llm_load(canary: CanaryResult, manifest: Manifest, shard_id: str, rows: int, tokens: float,
              rates: tuple[float, float, float]) -> ShardLoad:
    """An LLM shard's worker-seconds by steps, prompt and output tokens: model load + seconds per step x
    the steps the rows take (:func:`engine_steps`) + prefill seconds x prompt tokens not served by the
    prefix cache + decode seconds x rows x output tokens per row + the canary's other stages (read,
    tokenize, write) per prompt token. The canary's ``first_call_seconds`` is not charged: vLLM's load
    already runs the model once (its profile run), the shards' first chunks ran at the steady rates
    (``make bench-llm-prefix``, docs/canary.md), and the warm-up's excess over the rates is one call's
    noise on a busy machine, which a per-shard charge would multiply by the shard count."""
    prefill, decode, per_row = rates
    hit = shard_hit_rate(canary, manifest, shard_id)
    other = sum(canary.stage_seconds.get(s, 0.0) for s in ("input_read", "tokenize", "write"))
    other_per_token = other / canary.sample_tokens_real if canary.sample_tokens_real else 0.0
    output = rows * per_row
    uncached = tokens * (1.0 - hit)
    steps = _llm_steps(canary, rows, uncached, per_row)
    seconds = (canary.model_load_seconds + llm_step_seconds(canary) * steps + prefill * uncached + decode * output
               + other_per_token * tokens)
    return ShardLoad(shard_id, rows, tokens, seconds, cached_tokens=tokens * hit, output_tokens=output, hit_rate=hit,
                     steps=steps)


def speed_factor(limits: Limits, p: int, canary_threads: int) -> float:
    """How much longer a token takes at parallelism ``p`` than in the canary (see module docstring)."""
    if limits.runner != "local":
        return 1.0
    share = min(max(1, limits.cores // p), limits.cores / p)
    return max(canary_threads, 1) / share


def makespan(durations: list[float], workers: int) -> float:
    """Seconds until the last of ``durations`` ends on ``workers`` workers, longest first (LPT)."""
    if not durations:
        return 0.0
    heap = [0.0] * max(1, workers)
    for d in sorted(durations, reverse=True):
        heapq.heappush(heap, heapq.heappop(heap) + d)
    return max(heap)


def _option(p: int, inputs: Inputs, canary: CanaryResult, limits: Limits, params: CostParams,
            canary_wall: float, startup: float) -> dict[str, Any]:
    factor = speed_factor(limits, p, canary.threads)
    per_shard = [canary.model_load_seconds + (s.seconds - canary.model_load_seconds) * factor for s in inputs.loads]
    ws = sum(per_shard)
    canary_ws = sum(v for k, v in canary.stage_seconds.items() if k != "idle")
    finish = limits.elapsed_seconds + canary_wall + makespan([d + startup for d in per_shard], p)
    spot = worker_cost(ws + canary_ws, params, params.spot_usd_per_gpu_hour)
    on_demand = worker_cost(ws + canary_ws, params, params.on_demand_usd_per_gpu_hour)
    return {
        "parallelism": p,
        "worker_seconds": round(ws, 3),
        "gpu_hours": round((ws + canary_ws) * params.gpu_count / 3600.0, 6),
        "cost_spot_usd": round(spot, 6),
        "cost_on_demand_usd": round(on_demand, 6),
        "cost_usd": round(spot if params.pricing == "spot" else on_demand, 6),
        "finish_seconds": round(finish, 1),
        "meets_deadline": finish <= limits.deadline_hours * 3600.0,
    }


def project(canary: CanaryResult, manifest: Manifest, limits: Limits, params: CostParams, *,
            canary_wall_seconds: float) -> dict[str, Any]:
    """The projection and decision (see the module docstring).

    Args:
        canary: the run's canary record.
        manifest: the run's manifest (shards with ``rows`` and ``est_tokens``).
        limits: runner, parallelism, deadline and budget.
        params: cost parameters (prices).
        canary_wall_seconds: the canary task's wall time (its process start-up included).

    Returns:
        A JSON-able dict: ``decision`` (one of :data:`DECISIONS`), ``message``, ``chosen`` (the option
        dict of the chosen parallelism), ``options`` (one per parallelism considered),
        ``fanout_worker_seconds`` / ``cost_usd`` / ``finish_seconds`` of the chosen option, the
        calibration, per-shard seconds and the canary's key figures.
    """
    inputs = shard_loads(canary, manifest)
    startup = max(0.0, canary_wall_seconds - canary.elapsed_seconds)
    considered = range(1, limits.max_gpus + 1) if limits.runner == "kubernetes" else [limits.parallelism]
    options = [_option(p, inputs, canary, limits, params, canary_wall_seconds, startup) for p in considered]
    feasible = [o for o in options if o["meets_deadline"]]
    chosen = (min(feasible, key=lambda o: (o["cost_usd"], o["parallelism"])) if feasible
              else min(options, key=lambda o: (o["finish_seconds"], o["parallelism"])))
    out = {
        "schema_version": PROJECTION_SCHEMA_VERSION,
        "run_id": manifest.run_id,
        "runner": limits.runner,
        "pricing": params.pricing,
        "accelerator": params.accelerator,
        "deadline_hours": limits.deadline_hours,
        "budget_usd": limits.budget_usd,
        "rows": manifest.rows,
        "token_calibration": round(inputs.calibration, 4),
        "projected_tokens": int(sum(s.tokens for s in inputs.loads) + canary.sample_tokens_real),
        "startup_seconds": round(startup, 3),
        "elapsed_seconds": round(limits.elapsed_seconds, 3),
        "canary": {"wall_seconds": round(canary_wall_seconds, 3), "rows": canary.sample_rows,
                   "tokens_per_s": canary.steady_tokens_per_s, "token_budget": canary.chosen["token_budget"],
                   "strategy": canary.strategy, "autotune_seconds": canary.autotune_seconds,
                   "model_load_seconds": canary.model_load_seconds, "threads": canary.threads,
                   "chosen": dict(canary.chosen), "llm": canary.llm},
        "options": options,
        "chosen": chosen,
        "fanout_worker_seconds": chosen["worker_seconds"],
        "cost_usd": chosen["cost_usd"],
        "finish_seconds": chosen["finish_seconds"],
        "per_shard_seconds": {s.shard_id: round(s.seconds * speed_factor(limits, chosen["parallelism"], canary.threads), 3)
                              for s in inputs.loads},
    }
    if llm_rates(canary) is not None:
        out["llm_tokens"] = llm_token_projection(inputs, canary)
    out["speed_known"] = speed_known(canary, inputs)
    out["decision"], out["message"] = (_decide(out, inputs, canary, limits, params, feasible) if out["speed_known"]
                                       else ("go", _unknown_message(canary)))
    return out


def llm_token_projection(inputs: Inputs, canary: CanaryResult) -> dict[str, Any]:
    """The LLM run's projected tokens (the canary's sample included): ``prompt_tokens``,
    ``cached_prompt_tokens`` (expected from the prefix cache), ``output_tokens``, ``hit_rate``,
    ``engine_steps`` (the rows left after the canary), and the rates they are priced at (seconds per
    uncached prompt token / per output token / per engine step)."""
    llm = canary.llm or {}
    prompt = sum(s.tokens for s in inputs.loads) + float(llm.get("prompt_tokens") or 0)
    cached = sum(s.cached_tokens for s in inputs.loads) + float(llm.get("cached_tokens") or 0)
    output_sample = float(llm.get("output_tokens_per_row") or 0.0) * canary.sample_rows
    prefill, decode, _ = llm_rates(canary) or (0.0, 0.0, 0.0)
    return {"prompt_tokens": int(prompt), "cached_prompt_tokens": int(cached),
            "output_tokens": int(sum(s.output_tokens for s in inputs.loads) + output_sample),
            "hit_rate": round(cached / prompt, 4) if prompt else None,
            "engine_steps": int(sum(s.steps for s in inputs.loads)),
            "seconds_per_uncached_prompt_token": prefill, "seconds_per_output_token": decode,
            "seconds_per_engine_step": llm_step_seconds(canary)}


def speed_known(canary: CanaryResult, inputs: Inputs) -> bool:
    """Whether the canary measured a speed the projection can price the remaining tokens with: a finite,
    positive ``worker_seconds_per_token`` (``speed_source`` not ``none``), or no tokens left to compute."""
    if not any(s.tokens > 0 for s in inputs.loads):
        return True
    per_token = canary.worker_seconds_per_token
    return canary.speed_source != "none" and math.isfinite(per_token) and per_token > 0


def _unknown_message(canary: CanaryResult) -> str:
    return (f"GO (projection unknown): the canary computed {canary.sample_rows} row(s) and measured no speed "
            "(none in measurable time), so the run is neither priced nor checked against budget_usd or "
            "deadline_hours before the fan-out; the in-run budget stop still applies. A larger "
            "canary_min_rows measures one.")


def _decide(out: dict[str, Any], inputs: Inputs, canary: CanaryResult, limits: Limits, params: CostParams,
            feasible: list[dict[str, Any]]) -> tuple[str, str]:
    chosen = out["chosen"]
    rows = out["rows"]
    if not feasible:
        hours = chosen["finish_seconds"] / 3600.0
        fixed = limits.elapsed_seconds + out["canary"]["wall_seconds"]
        share = max(0.0, (limits.deadline_hours * 3600.0 - fixed) / max(chosen["finish_seconds"] - fixed, 1e-9))
        fits = _row_limit(rows, share)
        if limits.runner == "kubernetes" and fixed < limits.deadline_hours * 3600.0:
            more = _gpus_needed(inputs, canary, limits, params, out)
            if more:
                fits.append(f"max_gpus >= {more}")
        fits.append(f"deadline_hours >= {_round_up(hours * 1.1):g}")
        spent = (f" The run had already spent {fixed / 3600.0:.3f} h (before the canary and in it) when the "
                 "projection was made, so no row limit fits." if not share else "")
        return "refused_deadline", (
            f"REFUSED (deadline): projected to finish in {hours:.3f} h at parallelism {chosen['parallelism']} "
            f"(fastest considered), past deadline_hours={limits.deadline_hours:g}.{spent} What would fit: "
            f"{' or '.join(fits)}.")
    if limits.budget_usd is not None and chosen["cost_usd"] > limits.budget_usd:
        head = (f"REFUSED (budget): projected cost ${chosen['cost_usd']:.6g} ({params.pricing}, "
                f"{chosen['gpu_hours']:.4g} GPU-hours at parallelism {chosen['parallelism']}) exceeds "
                f"budget_usd={limits.budget_usd:g}.")
        fixed = fixed_cost_usd(chosen, canary, params)
        if limits.budget_usd <= fixed:
            return "refused_budget", (
                f"{head} Nothing smaller fits: the canary and one model load alone cost ${fixed:.6g}, whatever "
                f"the row limit; a budget of at least ${fixed * 1.1:.6g} is needed for any rows.")
        share = (limits.budget_usd - fixed) / max(chosen["cost_usd"] - fixed, 1e-12)
        fits = _row_limit(rows, share)
        if params.pricing == "on_demand" and chosen["cost_spot_usd"] <= limits.budget_usd:
            fits.append(f"pricing=spot (${chosen['cost_spot_usd']:.6g})")
        fits.append(f"budget_usd >= {_round_up(chosen['cost_usd'] * 1.1):g}")
        return "refused_budget", f"{head} What would fit: {' or '.join(fits)}."
    return "go", (f"GO: projected ${chosen['cost_usd']:.6g} ({params.pricing}), "
                  f"{chosen['worker_seconds']:.1f} worker-s, finish in {chosen['finish_seconds'] / 3600.0:.3f} h "
                  f"at parallelism {chosen['parallelism']}")


ROW_LIMIT_MARGIN = 0.9
"""A suggested ``row_limit`` is 90% of the rows that would just fit: the projection's error on the bundled
and a synopsis corpus was -11% to +11% (``bench-canary``, docs/canary.md)."""


def _row_limit(rows: int, share: float) -> list[str]:
    """``["row_limit <= N"]`` for the rows that fit in ``share`` (0..1) of the run, with
    :data:`ROW_LIMIT_MARGIN`; ``[]`` when fewer than one row would fit (a limit of zero rows is no run)."""
    n = math.floor(rows * share * ROW_LIMIT_MARGIN) if math.isfinite(share) else 0
    return [f"row_limit <= {min(n, rows - 1):,}"] if 1 <= n and rows > 1 else []


def _round_up(value: float) -> float:
    """``value`` rounded up to 3 significant digits (a suggested limit must not round below what fits)."""
    if value <= 0 or not math.isfinite(value):
        return value
    scale = 10.0 ** (math.floor(math.log10(value)) - 2)
    return math.ceil(value / scale) * scale


def fixed_cost_usd(option: dict[str, Any], canary: CanaryResult, params: CostParams) -> float:
    """USD of the part of ``option``'s cost no row limit removes: the canary's worker-seconds (already
    spent) and one model load (any run with rows loads the model at least once), at the option's price
    per worker-second."""
    total_s = option["gpu_hours"] * 3600.0 / max(params.gpu_count, 1)
    usd_per_s = option["cost_usd"] / total_s if total_s > 0 else 0.0
    canary_s = sum(v for k, v in canary.stage_seconds.items() if k != "idle")
    return usd_per_s * (canary_s + canary.model_load_seconds)


def _gpus_needed(inputs: Inputs, canary: CanaryResult, limits: Limits, params: CostParams,
                 out: dict[str, Any]) -> int | None:
    """Fewest workers (up to one per shard) that would meet the deadline, or ``None``."""
    for p in range(limits.max_gpus + 1, len(inputs.loads) + 1):
        option = _option(p, inputs, canary, limits, params, out["canary"]["wall_seconds"], out["startup_seconds"])
        if option["meets_deadline"]:
            return p
    return None


def format_table(projection: dict[str, Any]) -> str:
    """The projection as a few lines of text (the canary task logs it): one row per parallelism, the
    chosen one marked ``*``, then the decision."""
    c = projection["canary"]
    lines = [
        f"canary: {c['rows']} rows, {c['tokens_per_s']:.0f} tokens/s, token budget {c['token_budget']} "
        f"({c['strategy']}, autotune {c['autotune_seconds']:.1f} s), load {c['model_load_seconds']:.1f} s, "
        f"wall {c['wall_seconds']:.1f} s; {projection['projected_tokens']:,} tokens projected "
        f"(calibration x{projection['token_calibration']:.3f})",
        *_llm_line(c),
        f"{'':1} {'workers':>7} {'worker-s':>10} {'GPU-h':>9} {'spot $':>10} {'on-demand $':>12} {'finish h':>9} deadline",
    ]
    for o in projection["options"]:
        mark = "*" if o["parallelism"] == projection["chosen"]["parallelism"] else " "
        lines.append(f"{mark} {o['parallelism']:>7} {o['worker_seconds']:>10.1f} {o['gpu_hours']:>9.4f} "
                     f"{o['cost_spot_usd']:>10.4g} {o['cost_on_demand_usd']:>12.4g} "
                     f"{o['finish_seconds'] / 3600.0:>9.3f} {'ok' if o['meets_deadline'] else 'MISSED'}")
    lines.append(projection["message"])
    return "\n".join(lines)


def _llm_line(c: dict[str, Any]) -> list[str]:
    """The LLM engine's canary figures as one line (none for other engines): chosen vLLM batch settings,
    output-token quantiles and the JSON-valid rate."""
    llm = c.get("llm")
    if not llm:
        return []
    chosen = c.get("chosen") or {}
    parts = [f"llm: max_num_seqs {chosen.get('max_num_seqs', '-')}, "
             f"max_num_batched_tokens {chosen.get('max_num_batched_tokens', '-')}"]
    if "output_tokens_p50" in llm:
        parts.append(f"output tokens p50/p90/max {llm['output_tokens_p50']:.0f}/{llm['output_tokens_p90']:.0f}/"
                     f"{llm['output_tokens_max']}")
    rate = llm.get("json_valid_rate")
    if rate is not None:
        parts.append(f"JSON-valid {rate:.1%} ({llm['json_valid_rows']}/{llm['json_valid_rows'] + llm['json_invalid_rows']})")
    if llm.get("preemptions"):
        parts.append(f"{llm['preemptions']} preemptions")
    return ["; ".join(parts)]


def read_projection(run_dir: str) -> dict[str, Any] | None:
    """The run's ``projection.json`` (``runs/<run_id>/projection.json``), or ``None`` when the run had no
    canary (or it has not run).

    Raises:
        OSError: the file could not be read (other than not found).
        ValueError: the file is not JSON, or ``run_dir`` is not a run directory.
    """
    return RunStore.open(run_dir).projection()


__all__ = ["DECISIONS", "Limits", "RunRefused", "calibration", "engine_steps", "format_table", "llm_step_seconds",
           "makespan", "project", "read_projection", "shard_loads", "speed_factor"]
