"""Pure aggregation of shard markers and attempts into the report's sections (no I/O).

Units: rows, tokenizer tokens, wall-clock seconds, USD. Every figure is a sum, ratio or weighted mean
of numbers the workers measured and wrote into their markers / attempt records.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from batch_contract.enums import DeadLetterReason
from batch_contract.hostinfo import describe, host_key
from batch_contract.marker import STAGES, ShardMarker
from batch_contract.tokens import TokenCounts


def stage_names(markers: Iterable[ShardMarker]) -> list[str]:
    """:data:`STAGES` first, then any other stage name a marker reports, in first-seen order."""
    names = list(STAGES)
    for m in markers:
        names += [s for s in m.stage_seconds if s not in names]
    return names


def shard_seconds(marker: ShardMarker) -> float:
    """Worker wall-clock seconds of a shard: the sum of its ``stage_seconds`` (all attempts)."""
    return float(sum(marker.stage_seconds.values()))


def input_tokens(marker: ShardMarker) -> int:
    """Input tokens of a shard: LLM prompt tokens when reported, else the encoder's real tokens."""
    return marker.tokens_prompt or marker.tokens_real


def sum_stages(markers: list[ShardMarker]) -> dict[str, float]:
    """Seconds by stage summed over shards (every stage of :func:`stage_names`, 0.0 when absent)."""
    return {s: float(sum(m.stage_seconds.get(s, 0.0) for m in markers)) for s in stage_names(markers)}


def stealing(markers: list[ShardMarker], enabled: bool) -> dict[str, Any] | None:
    """The run's work stealing (``worker.steal``; the markers' ``steal`` figures), ``None`` when it was off.

    Returns:
        ``{"chunks": units of the complete shards, "chunks_stolen": units computed by workers of other
        shards, "shards_with_stolen_chunks": int, "stolen_seconds": those workers' stage seconds on
        them except idle (worker-seconds, charged to the shards they computed),
        "idle_seconds_saved": the same seconds, the time those workers would otherwise have waited for
        the run's slowest shard, "method": how it is counted}``.
    """
    if not enabled:
        return None
    figures = [m.steal for m in markers if m.steal]
    stolen_seconds = round(sum(float(f.get("stolen_seconds", 0.0)) for f in figures), 3)
    return {
        "chunks": sum(int(f.get("units", 0)) for f in figures),
        "chunks_stolen": sum(int(f.get("units_stolen", 0)) for f in figures),
        "shards_with_stolen_chunks": sum(1 for f in figures if f.get("units_stolen")),
        "stolen_seconds": stolen_seconds,
        "idle_seconds_saved": stolen_seconds,
        "method": STEAL_METHOD,
    }


STEAL_METHOD = (
    "A chunk is stolen when a worker of another shard computed it (attempt records with steal.role = thief). "
    "Those workers had finished their own shards, so without stealing they would have waited idle for the "
    "run's slowest shard: the idle time saved is their busy seconds on stolen chunks (stage seconds except "
    "idle), already included in worker_seconds and the cost."
)


def preprocess(markers: list[ShardMarker]) -> dict[str, Any] | None:
    """The run's document extraction (``preprocess`` figures of the markers), or ``None`` when no shard
    extracted documents.

    Returns:
        ``rows`` (documents extracted, dead letters included), ``cpu_seconds`` (the pool processes'),
        ``wall_seconds`` (the producers' waits on extraction, summed over shards), ``extract_seconds``
        (pool processes' busy wall, summed), ``rows_per_s`` (rows / wall_seconds), ``engine_idle_share``
        (the engine's wait for the next chunk over its wait plus its work), ``pool_workers`` and
        ``queue_depth`` (largest over shards), ``shards``.
    """
    figures = [m.preprocess for m in markers if m.preprocess]
    if not figures:
        return None

    def total(key: str) -> float:
        return float(sum(f.get(key, 0) for f in figures))

    wait, busy = total("engine_wait_seconds"), total("engine_busy_seconds")
    return {
        "rows": int(total("rows")),
        "cpu_seconds": total("cpu_seconds"),
        "wall_seconds": total("wall_seconds"),
        "extract_seconds": total("extract_seconds"),
        "rows_per_s": ratio(total("rows"), total("wall_seconds")),
        "engine_wait_seconds": wait,
        "engine_busy_seconds": busy,
        "engine_idle_share": ratio(wait, wait + busy),
        "pool_workers": int(max(f.get("pool_workers", 0) for f in figures)),
        "queue_depth": int(max(f.get("queue_depth", 0) for f in figures)),
        "shards": len(figures),
    }


def fractions(seconds: dict[str, float]) -> dict[str, float | None]:
    """Each value divided by the total (``None`` for all when the total is 0)."""
    total = sum(seconds.values())
    return {k: (v / total if total else None) for k, v in seconds.items()}


def ratio(num: float, den: float) -> float | None:
    """``num / den`` or ``None`` when ``den`` is 0."""
    return num / den if den else None


def dead_letter_reasons(markers: list[ShardMarker], publish: dict[str, Any] | None = None) -> dict[str, int]:
    """Dead-lettered rows by reason code (``DeadLetterReason`` values).

    After publish, the published dead-letter table's own counts (the summary's ``dead_letter_reasons``:
    publish applies the duplicate rule across shards, which no worker sees). Before publish, or for a
    summary without them: the markers' counts summed over shards, plus the summary's
    ``duplicate_ids_across_shards`` as ``duplicate_id``."""
    if publish and publish.get("dead_letter_reasons"):
        return dict(sorted((str(k), int(v)) for k, v in publish["dead_letter_reasons"].items()))
    out: dict[str, int] = {}
    for m in markers:
        for reason, n in m.dead_letter_reasons.items():
            out[reason] = out.get(reason, 0) + int(n)
    across = int((publish or {}).get("duplicate_ids_across_shards") or 0)
    if across:
        key = DeadLetterReason.DUPLICATE_ID.value
        out[key] = out.get(key, 0) + across
    return dict(sorted(out.items()))


def files_quarantined(markers: list[ShardMarker], publish: dict[str, Any] | None = None) -> int:
    """Committed files set aside in shards' ``quarantine/`` (torn, unreadable, stale fingerprint): as
    counted in the markers, plus those publish set aside."""
    return sum(m.files_quarantined for m in markers) + int((publish or {}).get("files_quarantined") or 0)


def token_totals(markers: list[ShardMarker]) -> dict[str, Any]:
    """Token sums: ``input`` (prompt tokens, or real tokens for encoders), ``real``, ``padded``,
    ``prompt``, ``cached``, ``output``, ``total`` (= input + output) and ``cached_fraction``
    (cached / prompt, ``None`` without prompts)."""
    counts = sum((m.tokens for m in markers), TokenCounts())  # the contract's one token-counts value
    tot = {"input": sum(input_tokens(m) for m in markers), **dataclasses.asdict(counts)}
    tot["total"] = tot["input"] + tot["output"]
    tot["cached_fraction"] = ratio(tot["cached"], tot["prompt"])
    return tot


def padding_efficiency(markers: list[ShardMarker]) -> float | None:
    """``sum(tokens_real) / sum(tokens_padded)`` over shards that report padded tokens, else ``None``."""
    padded = [m for m in markers if m.tokens_padded]
    return ratio(sum(m.tokens_real for m in padded), sum(m.tokens_padded for m in padded))


def utilisation(markers: list[ShardMarker]) -> dict[str, Any]:
    """GPU utilisation (NVML mean, weighted by each shard's inference seconds) or CPU time.

    Returns:
        ``{"device": "gpu"|"cpu", "gpu_util_mean": float|None (0..100 percent as NVML reports),
        "gpu_mem_max_bytes": int|None, "cpu_seconds": float, "cpu_cores_busy_mean": float|None}``;
        ``cpu_cores_busy_mean`` = process CPU seconds / worker wall seconds (1.0 = one core busy).
    """
    gpu = [m for m in markers if m.gpu.get("util_mean") is not None]
    weights = [max(m.stage_seconds.get("inference", 0.0), 1e-9) for m in gpu]
    util = ratio(sum(float(m.gpu["util_mean"]) * w for m, w in zip(gpu, weights, strict=True)), sum(weights))
    mems = [int(m.gpu["mem_max_bytes"]) for m in markers if m.gpu.get("mem_max_bytes") is not None]
    cpu = float(sum(m.cpu_seconds for m in markers))
    return {
        "device": "gpu" if gpu else "cpu",
        "gpu_util_mean": util,
        "gpu_mem_max_bytes": max(mems) if mems else None,
        "cpu_seconds": cpu,
        "cpu_cores_busy_mean": ratio(cpu, sum(shard_seconds(m) for m in markers)),
    }


def throughput(markers: list[ShardMarker], gpu_count: int) -> dict[str, Any]:
    """Rows per second per accelerator.

    Returns:
        ``steady_rows_per_s_per_gpu``: mean over shards of the worker's steady-state rows/s (after
        warm-up, last attempt) divided by ``gpu_count``; ``inference_rows_per_s_per_gpu``: rows
        through inference / inference seconds / ``gpu_count``; ``end_to_end_rows_per_s_per_gpu``:
        input rows / the shards' worker seconds (the canary's excluded) / ``gpu_count`` (includes load,
        I/O, idle and re-done work).
    """
    steady = [m.steady_rows_per_s for m in markers if m.steady_rows_per_s > 0]
    inference_s = sum(m.stage_seconds.get("inference", 0.0) for m in markers)
    rows_ok = sum(m.rows_ok for m in markers)
    return {
        "steady_rows_per_s_per_gpu": ratio(sum(steady), len(steady) * gpu_count),
        "inference_rows_per_s_per_gpu": ratio(rows_ok, inference_s * gpu_count),
        "end_to_end_rows_per_s_per_gpu": ratio(
            sum(m.rows_input for m in markers), sum(shard_seconds(m) for m in markers) * gpu_count
        ),
    }


def parse_time(text: str | None) -> datetime | None:
    """ISO-8601 timestamp (naive ones taken as UTC) or ``None`` for empty/invalid text."""
    if not text:
        return None
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def timeline(markers: list[ShardMarker], plan_created_at: str, publish_seconds: float) -> dict[str, Any]:
    """First shard start, last shard finish, their distance (seconds), plan time and publish seconds."""
    starts = [t for m in markers if (t := parse_time(m.started_at)) is not None]
    ends = [t for m in markers if (t := parse_time(m.finished_at)) is not None]
    first, last = (min(starts) if starts else None), (max(ends) if ends else None)
    wall = (last - first).total_seconds() if first and last else None
    return {
        "plan_created_at": plan_created_at or None,
        "first_shard_started_at": first.isoformat() if first else None,
        "last_shard_finished_at": last.isoformat() if last else None,
        "shards_wall_seconds": wall,
        "publish_seconds": publish_seconds,
    }


def hosts(markers: list[ShardMarker]) -> list[dict[str, Any]]:
    """The kinds of host the shards ran on, in order of first appearance: ``{"host": one-line
    description, "facts": the first such shard's host facts, "shards": [shard ids]}``. Shards whose
    markers predate host facts are grouped under ``host == ""``. Two shards share an entry when their
    machines match (:func:`batch_contract.hostinfo.host_key`: CPU, cores, caches, bf16/AMX, memory),
    whatever their load."""
    groups: dict[tuple, dict[str, Any]] = {}
    for m in markers:
        key = host_key(m.host_facts)
        if key not in groups:
            groups[key] = {"host": describe(m.host_facts), "facts": dict(m.host_facts), "shards": []}
        groups[key]["shards"].append(m.shard_id)
    return list(groups.values())
