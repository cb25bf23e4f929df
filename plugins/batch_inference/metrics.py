"""Run and shard metrics through the channel Airflow itself uses: the task SDK's ``Stats``.

What a platform team plugs in: Airflow's own OpenTelemetry metrics backend (``[metrics] otel_on = True``
with ``otel_host`` / ``otel_port`` / ``otel_interval_milliseconds`` / ``otel_prefix``, or the standard
``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT``, which Airflow prefers) gets these figures beside Airflow's
``ti.*`` and ``dagrun.*`` metrics, from the processes that already read the run store: nothing runs in
the worker pod for it (the worker keeps writing storage only). Through Datadog's StatsD the tags become
Datadog tags; plain StatsD has no tags, so the series of one name (every shard, every run) overwrite one
another there, and with ``statsd_influxdb_enabled`` Airflow refuses a name that carries a ``run_id``
(``:`` and ``+`` are not allowed in it): use OTel (or Datadog) for these.

* **Where they come from.** Two points of the run emit them, each tagged ``stage``:

  - ``gate``: the completion gate (``wait_for_shards``), at its first check and every poke, and its
    trigger at every poll while it waits (:func:`emit_gate_metrics`, called by
    :func:`batch_inference.completion.gate_progress`): live figures from the same reads as its progress
    line (:func:`batch_inference.progress.collect_progress`), the spend so far as the in-run budget stop
    prices it (:func:`batch_inference.budget.spent_usd`) and the canary's projection (``projection.json``).
  - ``report``: the ``summary`` task, from the ``report.json`` the ``publish`` task built
    (:func:`emit_report_metrics`): final figures, as ``docs/cost-report.md`` defines them.

  Nothing here computes a figure a module already computes; each spec's ``source`` names where it is
  read.
* **Names and tags** are :data:`METRICS`, the one table (``docs/observability.md`` holds it as
  :func:`markdown_table` prints it: ``python -m batch_inference.metrics``). A stat name here is what is
  passed to ``Stats``; the backend prepends its prefix (``otel_prefix``, default ``airflow``:
  ``airflow.batch_inference.run.rows_done``). Names use ``[a-z_.]`` only and stay far below OTel's 255
  characters (Airflow drops a name that breaks either rule).
* **Every metric is a gauge** holding an absolute value read from storage, never a counter incremented
  by a task: a retried task, a second poll or a re-run of ``summary`` sets the same value again instead
  of counting it twice, and several processes (the gate's task, its trigger, the summary task) may set
  the same series without summing wrong.
* **Tags (cardinality).** Run metrics carry ``dag_id``, ``run_id`` and ``stage`` (plus ``reason``,
  ``state`` or ``figure`` where the table says): one series per run and metric, created only by that
  run's tasks, a few runs a day per DAG; ``run_id`` lets a dashboard join a figure to the run in the
  Airflow UI and its report, which an OTel attribute carries at no cost per point. Shard metrics carry
  ``dag_id``, ``shard_id`` and ``stage`` but no ``run_id``: shards x runs would grow without bound,
  whereas ``shard_id`` is bounded by ``max_shards`` (at most 1,024 per DAG) and each DAG runs one run
  at a time (``max_active_runs=1``), so ``(dag_id, shard_id)`` names one shard of the current run; the
  run's ``run_id`` series say which run that is. ``reason`` is a ``DeadLetterReason`` value (13),
  ``state`` one of five shard states, ``figure`` one of three projection figures.
* **Never fails the run.** Emission errors (a storage read, a backend error) are logged as warnings
  and dropped: a metric never fails the gate (whose trigger must never raise) or the summary.

Delivery is Airflow's: its OTel backend exports every ``otel_interval_milliseconds`` and flushes at the
end of a task process (an ``atexit`` hook); the triggerer exports on the interval. A caveat of Airflow's
Stats in the long-lived triggerer: a gauge series, once set, is exported until the process ends (there
is no call to retire one), so the gate's series of finished runs stay in the triggerer's exports, at
their last value, until it restarts.

Airflow side; no torch or vLLM. Imports nothing from Airflow at module level (``Stats`` is imported when
a metric is emitted), so the table can be read without it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from batch_contract.runstore import RunStore

from batch_inference.budget import spent_usd
from batch_inference.planned import run_config_of
from batch_inference.pricing import cost_params_from_dict

log = logging.getLogger(__name__)

GAUGE = "gauge"
STAGES = ("gate", "report")
"""Values of the ``stage`` tag: the completion gate (live) and the report (final)."""
RUN_TAGS = ("dag_id", "run_id", "stage")
SHARD_TAGS = ("dag_id", "shard_id", "stage")
SHARD_STATES = ("completed", "failed", "running", "pending", "stale")
"""Values of the ``state`` tag (:func:`batch_inference.progress.collect_progress`'s shard counts)."""
PROJECTION_FIGURES = ("worker_seconds", "cost_usd", "finish_seconds")
"""Values of the ``figure`` tag: the keys of ``report.json``'s ``projection.error``."""


@dataclass(frozen=True)
class MetricSpec:
    """One metric of :data:`METRICS`.

    Attributes:
        name: the stat name passed to ``Stats`` (the backend adds its prefix).
        kind: ``gauge`` (every metric here is one: see the module docstring).
        unit: ``rows``, ``rows/s``, ``shards``, ``attempts``, ``USD``, ``seconds`` or ``ratio`` (0..1,
            or a signed relative error for ``projection_error``).
        tags: the attribute names every point carries, in this order.
        stages: the ``stage`` values that emit it (``gate``, ``report``).
        meaning: what the value is.
        source: where each stage reads it (module function or ``report.json`` field).
        only_when: the condition under which points are sent, when there is one (read after "only":
            ``"while a running shard reports a rate"``); empty: always, for a run with shards, at each
            of ``stages``.
    """

    name: str
    kind: str
    unit: str
    tags: tuple[str, ...]
    stages: tuple[str, ...]
    meaning: str
    source: str
    only_when: str = ""


def _run(name: str, unit: str, stages: tuple[str, ...], meaning: str, source: str, only_when: str = "",
         extra: tuple[str, ...] = ()) -> MetricSpec:
    return MetricSpec(f"batch_inference.run.{name}", GAUGE, unit, RUN_TAGS + extra, stages, meaning, source,
                      only_when)


def _shard(name: str, unit: str, stages: tuple[str, ...], meaning: str, source: str,
           only_when: str = "") -> MetricSpec:
    return MetricSpec(f"batch_inference.shard.{name}", GAUGE, unit, SHARD_TAGS, stages, meaning, source,
                      only_when)


BOTH = ("gate", "report")
GATE = ("gate",)
REPORT = ("report",)

METRICS: tuple[MetricSpec, ...] = (
    _run("rows_total", "rows", BOTH, "Input rows of the run.",
         "gate: `progress.collect_progress` `rows_total`; report: `rows_input`"),
    _run("rows_done", "rows", BOTH, "Rows with an outcome: results plus dead letters (equals `rows_total` "
         "when the run is complete).",
         "gate: `collect_progress` `rows_done` (markers + running shards' progress); report: "
         "`rows_published + rows_dead_letter`"),
    _run("rows_published", "rows", REPORT, "Rows in the published table.", "report: `rows_published`"),
    _run("rows_dead_letter", "rows", BOTH, "Rows dead-lettered (all reasons).",
         "gate: `collect_progress` `rows_dead_letter`; report: `rows_dead_letter`"),
    _run("dead_letters_by_reason", "rows", BOTH, "Dead-lettered rows by reason code (`DeadLetterReason`); "
         "report: the published dead-letter table's counts (the cross-shard duplicate rule applied).",
         "gate: `report.aggregate.dead_letter_reasons` of the complete shards' markers; report: "
         "`dead_letter_reasons`", "for the reasons that occurred (one series each)", extra=("reason",)),
    _run("shards", "shards", GATE, "Shards by state: `completed`, `failed`, `running`, `pending`, `stale` "
         "(a running shard whose progress is older than 300 s).",
         "gate: `collect_progress` shard counts", extra=("state",)),
    _run("rows_per_s", "rows/s", GATE, "Live rate: the sum of the running shards' current rates (0 when "
         "none runs).", "gate: `collect_progress` `rows_per_s`"),
    _run("eta_seconds", "seconds", GATE, "Seconds until the rows left are done at the live rate.",
         "gate: `collect_progress` `eta_s`", "while a running shard reports a rate"),
    _run("rows_per_s_per_gpu", "rows/s", REPORT, "End-to-end throughput per accelerator: input rows / the shards' "
         "worker seconds (the canary's excluded) / GPUs per worker (load, I/O, idle and re-done work "
         "included).",
         "report: `throughput.end_to_end_rows_per_s_per_gpu`", "when the run has worker seconds"),
    _run("preemptions", "attempts", REPORT, "Worker attempts that ended preempted (exit 75).",
         "report: `attempts.preemptions`"),
    _run("retries", "attempts", REPORT, "Worker attempts beyond each shard's first (after a crash, kill or "
         "preemption).", "report: sum over `shards[]` of `attempts - 1`"),
    _run("cost_usd", "USD", BOTH, "Cost so far: gate: the complete shards' and the canary's worker time "
         "priced as the in-run budget stop prices it; report: the run's cost, publish included.",
         "gate: `budget.spent_usd`; report: `cost_usd`"),
    _run("cost_projected_usd", "USD", BOTH, "The canary's projected cost of the run (chosen parallelism).",
         "gate: `projection.json` `cost_usd`; report: `projection.projected.cost_usd`",
         "for a run whose canary measured a speed"),
    _run("worker_seconds", "seconds", REPORT, "Worker wall seconds, every stage and attempt (canary "
         "included).", "report: `worker_seconds`"),
    _run("gpu_seconds", "seconds", REPORT, "Accelerator seconds: worker seconds x GPUs per worker (with "
         "`accelerator` `cpu`, one CPU worker counts as one accelerator, as the cost report prices it).",
         "report: `gpu_seconds`"),
    _run("cpu_seconds", "seconds", REPORT, "Worker process CPU seconds.", "report: `utilisation.cpu_seconds`"),
    _run("padding_efficiency", "ratio", REPORT, "Real tokens / padded tokens (1.0: no padding).",
         "report: `padding_efficiency`", "when a shard reports padded tokens (encoder runs)"),
    _run("projection_error", "ratio", REPORT, "The canary's projection error, `(projected - actual) / "
         "actual`, by `figure`: `worker_seconds`, `cost_usd`, `finish_seconds`.",
         "report: `projection.error`", "for a run with a canary; each figure when known", extra=("figure",)),
    _run("reuse_ratio", "ratio", REPORT, "Share of the results copied from the result cache: rows_reused / "
         "(rows_reused + rows_computed).", "report: `rows_reused`, `rows_computed`",
         "when the run has results"),
    _shard("rows_total", "rows", BOTH, "Rows of the shard.",
           "gate: marker `rows_input`, progress `rows_total` or the manifest; report: `shards[].rows_input`"),
    _shard("rows_done", "rows", BOTH, "Rows of the shard with an outcome (results plus dead letters).",
           "gate: marker `rows_ok + rows_dead_letter` or progress `rows_done`; report: "
           "`shards[].rows_ok + rows_dead_letter`", "at the report: for complete shards"),
    _shard("rows_dead_letter", "rows", BOTH, "Rows of the shard dead-lettered.",
           "gate: marker or progress `rows_dead_letter`; report: `shards[].rows_dead_letter`",
           "at the report: for complete shards"),
    _shard("rows_per_s", "rows/s", BOTH, "gate: the shard's live rate (0 unless running); report: its "
           "input rows / worker seconds.", "gate: progress `rows_per_s`; report: `shards[].rows_per_s`",
           "at the report: for complete shards with worker seconds"),
    _shard("preemptions", "attempts", REPORT, "The shard's attempts that ended preempted (exit 75).",
           "report: `shards[].preemptions`"),
    _shard("retries", "attempts", REPORT, "The shard's attempts beyond its first.",
           "report: `shards[].attempts - 1`"),
    _shard("cost_usd", "USD", REPORT, "The shard's worker time priced.", "report: `shards[].cost_usd`",
           "for complete shards"),
    _shard("worker_seconds", "seconds", REPORT, "The shard's worker wall seconds (every stage and attempt).",
           "report: `shards[].seconds`", "for complete shards"),
    _shard("gpu_seconds", "seconds", REPORT, "The shard's accelerator seconds: worker seconds x GPUs per "
           "worker (the report's `gpu_seconds` rule).", "report: `shards[].seconds x cost.params.gpu_count`",
           "for complete shards"),
    _shard("cpu_seconds", "seconds", REPORT, "The shard's worker CPU seconds.", "report: `shards[].cpu_seconds`",
           "for complete shards"),
    _shard("padding_efficiency", "ratio", REPORT, "The shard's real tokens / padded tokens.",
           "report: `shards[].padding_efficiency`", "for complete shards that report padded tokens"),
)
"""Every metric this package emits: the one table (``docs/observability.md`` is checked against it)."""

SPECS: dict[str, MetricSpec] = {m.name: m for m in METRICS}


class Sample(NamedTuple):
    """One value to emit: a :data:`METRICS` name, its value and its tags (``{tag: str}``)."""

    name: str
    value: float
    tags: dict[str, str]


class StatsLike(Protocol):
    """What :func:`emit` needs of a stats channel: Airflow's ``Stats`` (or its backend's logger)."""

    def gauge(self, stat: str, value: float, *args: Any, tags: dict[str, Any] | None = None,
              **kwargs: Any) -> Any: ...


def _number(value: Any) -> float | int | None:
    """``value`` as a plain finite int/float, or ``None`` (missing, not a number, NaN or infinite)."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


class _Samples:
    """Collects the samples of one stage, skipping values that are missing."""

    def __init__(self, stage: str, dag_id: str, run_id: str) -> None:
        self.out: list[Sample] = []
        self.stage, self.dag_id, self.run_id = stage, str(dag_id), str(run_id)

    def run(self, name: str, value: Any, **extra: str) -> None:
        number = _number(value)
        if number is not None:
            tags = {"dag_id": self.dag_id, "run_id": self.run_id, "stage": self.stage, **extra}
            self.out.append(Sample(f"batch_inference.run.{name}", number, tags))

    def shard(self, shard_id: str, name: str, value: Any) -> None:
        number = _number(value)
        if number is not None:
            tags = {"dag_id": self.dag_id, "shard_id": str(shard_id), "stage": self.stage}
            self.out.append(Sample(f"batch_inference.shard.{name}", number, tags))


def _projected_cost(projection: Mapping[str, Any] | None) -> Any:
    """``projection.json``'s ``cost_usd``, or ``None`` without a projection or when the canary measured
    no speed (``speed_known`` false: the run was not priced)."""
    if not projection or projection.get("speed_known") is False:
        return None
    return projection.get("cost_usd")


def gate_samples(summary: Mapping[str, Any], dead_letter_reasons: Mapping[str, int], *, dag_id: str,
                 run_id: str, spent_usd: float | None, projection: Mapping[str, Any] | None) -> list[Sample]:
    """The gate's samples (pure).

    Args:
        summary: :func:`batch_inference.progress.collect_progress` with ``per_shard=True``.
        dead_letter_reasons: dead-lettered rows by reason of the complete shards
            (:func:`batch_inference.report.aggregate.dead_letter_reasons` of their markers).
        dag_id / run_id: the run's ids (tags).
        spent_usd: USD spent so far (:func:`batch_inference.budget.spent_usd`); ``None``: unknown.
        projection: the run's ``projection.json`` (``None``: no canary).

    Returns:
        Samples in :data:`METRICS` order of kind (run, then shards in ``summary`` order).

    Raises:
        KeyError: ``summary`` lacks a key of ``collect_progress`` (``shards`` included).
    """
    s = _Samples("gate", dag_id, run_id)
    s.run("rows_total", summary["rows_total"])
    s.run("rows_done", summary["rows_done"])
    s.run("rows_dead_letter", summary["rows_dead_letter"])
    for reason, rows in sorted(dead_letter_reasons.items()):
        s.run("dead_letters_by_reason", rows, reason=str(reason))
    for state in SHARD_STATES:
        s.run("shards", summary[state], state=state)
    s.run("rows_per_s", summary["rows_per_s"])
    s.run("eta_seconds", summary["eta_s"])
    s.run("cost_usd", spent_usd)
    s.run("cost_projected_usd", _projected_cost(projection))
    for shard_id, shard in summary["shards"].items():
        s.shard(shard_id, "rows_total", shard["rows_total"])
        s.shard(shard_id, "rows_done", shard["rows_done"])
        s.shard(shard_id, "rows_dead_letter", shard["rows_dead_letter"])
        s.shard(shard_id, "rows_per_s", shard["rows_per_s"])
    return s.out


def read_gate_samples(store: RunStore, summary: Mapping[str, Any], *, dag_id: str | None = None) -> list[Sample]:
    """The gate's samples for the run of ``store``: ``summary`` plus the spend so far, the dead-letter
    reasons of the complete shards and the projection. Costs two small reads (``canary.json``,
    ``projection.json``): the complete shards' markers are those ``collect_progress`` just polled
    (cached by the store, not read again).

    Args:
        store: the run's store (the one ``summary`` was collected from).
        summary: :func:`batch_inference.progress.collect_progress` of every manifest shard with
            ``per_shard=True``.
        dag_id: the DAG (default: the manifest's ``params.dag_id``, else the run dir's).

    Raises:
        FileNotFoundError: no manifest; ValueError / OSError: an unreadable record or a failed read;
        ConfigError: invalid cost params in the manifest.
    """
    from batch_inference.report.aggregate import dead_letter_reasons  # numpy (report package): gate only

    manifest = store.manifest
    dag = dag_id or str(manifest.params.get("dag_id") or store.layout.dag_id or "")
    done = [sid for sid, shard in summary["shards"].items() if shard["state"] == "completed"]
    markers = list(store.markers(done).values())
    spent = spent_usd(markers, store.canary(), cost_params_from_dict(run_config_of(manifest).cost_params()))
    return gate_samples(summary, dead_letter_reasons(markers), dag_id=dag, run_id=manifest.run_id,
                        spent_usd=spent, projection=store.projection())


def report_samples(report: Mapping[str, Any]) -> list[Sample]:
    """The report's samples (pure), from a ``report.json`` dict (``report.schema.json``).

    Raises:
        KeyError: a field the schema requires is missing.
    """
    s = _Samples("report", report["dag_id"], report["run_id"])
    s.run("rows_total", report["rows_input"])
    s.run("rows_done", report["rows_published"] + report["rows_dead_letter"])
    s.run("rows_published", report["rows_published"])
    s.run("rows_dead_letter", report["rows_dead_letter"])
    for reason, rows in sorted(report["dead_letter_reasons"].items()):
        s.run("dead_letters_by_reason", rows, reason=str(reason))
    s.run("rows_per_s_per_gpu", report["throughput"]["end_to_end_rows_per_s_per_gpu"])
    s.run("preemptions", report["attempts"]["preemptions"])
    shards = report["shards"]
    s.run("retries", sum(max(0, int(row["attempts"]) - 1) for row in shards))
    s.run("cost_usd", report["cost_usd"])
    projection = report.get("projection") or {}
    s.run("cost_projected_usd", (projection.get("projected") or {}).get("cost_usd"))
    s.run("worker_seconds", report["worker_seconds"])
    s.run("gpu_seconds", report["gpu_seconds"])
    s.run("cpu_seconds", report["utilisation"]["cpu_seconds"])
    s.run("padding_efficiency", report["padding_efficiency"])
    for figure in PROJECTION_FIGURES:
        s.run("projection_error", (projection.get("error") or {}).get(figure), figure=figure)
    reused, computed = report["rows_reused"], report["rows_computed"]
    s.run("reuse_ratio", reused / (reused + computed) if reused + computed else None)
    gpu_count = report["cost"]["params"].get("gpu_count", 1)
    for row in shards:
        sid = row["shard_id"]
        done = (None if row["rows_ok"] is None or row["rows_dead_letter"] is None
                else row["rows_ok"] + row["rows_dead_letter"])
        s.shard(sid, "rows_total", row["rows_input"])
        s.shard(sid, "rows_done", done)
        s.shard(sid, "rows_dead_letter", row["rows_dead_letter"])
        s.shard(sid, "rows_per_s", row["rows_per_s"])
        s.shard(sid, "preemptions", row["preemptions"])
        s.shard(sid, "retries", max(0, int(row["attempts"]) - 1))
        s.shard(sid, "cost_usd", row["cost_usd"])
        s.shard(sid, "worker_seconds", row["seconds"])
        s.shard(sid, "gpu_seconds", None if row["seconds"] is None else row["seconds"] * gpu_count)
        s.shard(sid, "cpu_seconds", row["cpu_seconds"])
        s.shard(sid, "padding_efficiency", row["padding_efficiency"])
    return s.out


def check_sample(sample: Sample) -> MetricSpec:
    """The spec of ``sample``, after checking the sample against it.

    Raises:
        ValueError: the name is not in :data:`METRICS`, its tags are not exactly the spec's, or its
            ``stage`` is not one the spec emits at.
    """
    spec = SPECS.get(sample.name)
    if spec is None:
        raise ValueError(f"metric {sample.name!r} is not in batch_inference.metrics.METRICS; add it there "
                         "(and to docs/observability.md) first")
    if tuple(sample.tags) != spec.tags:
        raise ValueError(f"metric {sample.name}: tags {tuple(sample.tags)} differ from the table's {spec.tags}")
    if sample.tags["stage"] not in spec.stages:
        raise ValueError(f"metric {sample.name}: stage {sample.tags['stage']!r} not in {spec.stages}")
    return spec


def emit(samples: Iterable[Sample], stats: StatsLike | None = None) -> int:
    """Set each sample's gauge through ``stats`` (default: Airflow's task-SDK ``Stats``, i.e. the
    backend of ``[metrics]``; a no-op when no backend is configured). Returns how many were set.

    Raises:
        ValueError: a sample breaks the table (:func:`check_sample`); nothing after it is emitted.
    """
    if stats is None:
        from airflow.sdk.observability.stats import Stats as stats  # Airflow's channel; only when emitting
    n = 0
    for sample in samples:
        check_sample(sample)
        stats.gauge(sample.name, sample.value, tags=dict(sample.tags))
        n += 1
    return n


def emit_gate_metrics(store: RunStore, summary: Mapping[str, Any], *, dag_id: str | None = None,
                      stats: StatsLike | None = None) -> int:
    """Emit the gate's metrics (:func:`read_gate_samples`); never raises: a failure is logged as a
    warning and 0 returned (the gate's trigger must never raise, and a metric never fails a run).

    Returns:
        The number of gauges set.
    """
    try:
        return emit(read_gate_samples(store, summary, dag_id=dag_id), stats)
    except Exception as exc:  # observability must not fail the gate: see the docstring
        log.warning("gate metrics for %s not emitted: %s: %s", store.run_dir, type(exc).__name__, exc)
        return 0


def emit_report_metrics(report: Mapping[str, Any], stats: StatsLike | None = None) -> int:
    """Emit the report's metrics (:func:`report_samples`); never raises: a failure is logged as a
    warning and 0 returned.

    Returns:
        The number of gauges set.
    """
    try:
        return emit(report_samples(report), stats)
    except Exception as exc:  # observability must not fail the summary task: see the docstring
        log.warning("report metrics for run %s not emitted: %s: %s", report.get("run_id"),
                    type(exc).__name__, exc)
        return 0


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_table(metrics: Iterable[MetricSpec] = METRICS) -> str:
    """The metrics table in Markdown (what ``docs/observability.md`` holds), one row per metric.

    Columns: name (as passed to ``Stats``; exported as ``<otel_prefix>.<name>``), type, tags, unit,
    stage, meaning (with the condition, if any, under which it is sent), source.
    """
    lines = ["| name | type | tags | unit | stage | meaning | source |", "|---|---|---|---|---|---|---|"]
    for m in metrics:
        meaning = m.meaning + (f" Only {m.only_when}." if m.only_when else "")
        tags = ", ".join(f"`{t}`" for t in m.tags)
        lines.append(f"| `{m.name}` | {m.kind} | {tags} | {m.unit} | {', '.join(m.stages)} | {_cell(meaning)} "
                     f"| {_cell(m.source)} |")
    return "\n".join(lines) + "\n"


__all__ = ["METRICS", "PROJECTION_FIGURES", "RUN_TAGS", "SHARD_STATES", "SHARD_TAGS", "SPECS", "STAGES",
           "MetricSpec", "Sample", "check_sample", "emit", "emit_gate_metrics", "emit_report_metrics",
           "gate_samples", "markdown_table", "read_gate_samples", "report_samples"]


if __name__ == "__main__":
    print(markdown_table(), end="")
