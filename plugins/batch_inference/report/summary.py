"""Short forms of the report: the Asset event extra and the Markdown summary for the task log."""

from __future__ import annotations

from typing import Any

import batch_inference.report.fmt as fmt
from batch_inference.report.approvals import approval_text

EXTRA_KEYS = (
    "schema_version",
    "run_id",
    "rows_input",
    "rows_published",
    "rows_dead_letter",
    "cost_usd",
    "cost_per_million_rows_usd",
    "cost_per_million_tokens_usd",
    "padding_efficiency",
)


def _round(value: Any) -> Any:
    return round(value, 6) if isinstance(value, float) else value


def asset_extra(report: dict[str, Any]) -> dict[str, Any]:
    """Key figures for the published Asset event's ``extra`` (small, JSON-safe, flat).

    Returns:
        The :data:`EXTRA_KEYS` of the report plus ``report_uri`` (``report.json``), ``report_html_uri``,
        ``pricing``, ``accelerator``, ``worker_seconds``, ``preemptions``, ``rows_redone`` and
        ``steady_rows_per_s_per_gpu``; floats rounded to 6 decimals.
    """
    extra = {k: _round(report.get(k)) for k in EXTRA_KEYS}
    extra.update(
        report_uri=report["uris"]["report_json"],
        report_html_uri=report["uris"]["report_html"],
        pricing=report["cost"]["params"]["pricing"],
        accelerator=report["cost"]["params"]["accelerator"],
        worker_seconds=_round(report["worker_seconds"]),
        preemptions=report["attempts"]["preemptions"],
        rows_redone=report["attempts"]["rows_redone"],
        steady_rows_per_s_per_gpu=_round(report["throughput"]["steady_rows_per_s_per_gpu"]),
    )
    return extra


def markdown_summary(report: dict[str, Any]) -> str:
    """A Markdown block for the task log: headline figures, who approved the run and when (for a run
    that asked), time and cost by stage, attempts.

    Returns:
        Multi-line Markdown text (tables), ending with the report URIs.
    """
    params = report["cost"]["params"]
    lines = [
        f"## Batch inference report: `{report['run_id']}` ({report['dag_id']})",
        "",
        "| figure | value |",
        "|---|---|",
        f"| rows in / published / dead-lettered | {fmt.num(report['rows_input'])} / "
        f"{fmt.num(report['rows_published'])} / {fmt.num(report['rows_dead_letter'])} |",
        f"| cost ({params['pricing']}, {params['gpu_count']} x {params['accelerator']}) | {fmt.usd(report['cost_usd'])} |",
        f"| $ per million rows | {fmt.usd(report['cost_per_million_rows_usd'])} |",
        f"| $ per million tokens | {fmt.usd(report['cost_per_million_tokens_usd'])} |",
        f"| padding efficiency | {fmt.pct(report['padding_efficiency'])} |",
        f"| steady rows/s per {device_label(report)} | {fmt.num(report['throughput']['steady_rows_per_s_per_gpu'])} |",
        f"| attempts / preemptions / rows re-done | {report['attempts']['total']} / "
        f"{report['attempts']['preemptions']} / {fmt.num(report['attempts']['rows_redone'])} |",
    ]
    if report.get("approval"):
        lines.append(f"| approval | {approval_text(report['approval'])} |")
    if report["attempts"]["interrupted_seconds"]:
        lines.append(f"| time in interrupted/failed attempts | {fmt.num(report['attempts']['interrupted_seconds'])} s "
                     f"({fmt.usd(report['attempts']['interrupted_cost_usd'])}) |")
    on_demand = report["counterfactuals"]["on_demand"]
    lines.append(f"| same job on on-demand | {fmt.usd(on_demand['cost_usd'])} |")
    padding = report["counterfactuals"]["padding"]
    if padding:
        lines.append(f"| padding cost avoided by length sorting (estimate) | {fmt.usd(padding['cost_avoided_usd'])} |")
    lines += ["", "| stage | seconds | share | cost |", "|---|---|---|---|"]
    for stage, sec in report["stage_seconds"].items():
        lines.append(f"| {stage} | {fmt.num(sec)} | {fmt.pct(report['stage_fractions'][stage])} | "
                     f"{fmt.usd(report['cost']['by_stage_usd'].get(stage))} |")
    if report["shards_missing"]:
        lines += ["", f"**Incomplete:** {len(report['shards_missing'])} shard(s) without marker: "
                  + ", ".join(report["shards_missing"][:20])]
    lines += ["", f"Report: {report['uris']['report_json']} and {report['uris']['report_html']}"]
    return "\n".join(lines)


def device_label(report: dict[str, Any]) -> str:
    """``"GPU"`` when the run priced accelerators, ``"CPU worker"`` for ``accelerator == "cpu"`` (a
    CPU run's "per GPU" figures are per worker process)."""
    accelerator = str(report["cost"]["params"].get("accelerator", "")).lower()
    return "CPU worker" if accelerator in ("", "cpu") else "GPU"


def text_summary(report: dict[str, Any]) -> str:
    """The report's headline figures as a plain aligned block for a terminal or a task log (no
    Markdown pipes): rows, cost, throughput per GPU (per CPU worker on a CPU run), attempts, rows
    reused from the result cache (when any) and the cost that avoided, who approved the run and when
    (for a run that asked), time and cost by stage, the report URIs.

    Returns:
        Multi-line text; every line is at most about 100 characters except the URIs.
    """
    params = report["cost"]["params"]
    unit = device_label(report)
    count = params.get("gpu_count", 1)
    devices = f"{count} x {params['accelerator']}" + ("" if unit == "GPU" else " worker(s)")
    att = report["attempts"]
    figures = [
        ("rows in / published / dead-lettered", f"{fmt.num(report['rows_input'])} / "
         f"{fmt.num(report['rows_published'])} / {fmt.num(report['rows_dead_letter'])}"),
        (f"cost ({params['pricing']}, {devices})", fmt.usd(report["cost_usd"])),
        ("$ per million rows / tokens", f"{fmt.usd(report['cost_per_million_rows_usd'])} / "
         f"{fmt.usd(report['cost_per_million_tokens_usd'])}"),
        ("padding efficiency", fmt.pct(report["padding_efficiency"])),
        (f"steady rows/s per {unit}", fmt.num(report["throughput"]["steady_rows_per_s_per_gpu"])),
        ("attempts / preemptions / rows re-done",
         f"{att['total']} / {att['preemptions']} / {fmt.num(att['rows_redone'])}"),
    ]
    reuse = report.get("reuse") or {}
    if report.get("rows_reused"):
        figures.append(("rows reused / computed (result cache)",
                        f"{fmt.num(report['rows_reused'])} / {fmt.num(report.get('rows_computed', 0))}, "
                        f"cost avoided {fmt.usd(reuse.get('cost_avoided_usd'))}"
                        + (f"; {reuse['shards_carried']} shard(s) carried over, no worker started"
                           if reuse.get("shards_carried") else "")))
    if report.get("approval"):
        figures.append(("approval", approval_text(report["approval"])))
    if att["interrupted_seconds"]:
        figures.append(("time in interrupted/failed attempts",
                        f"{fmt.num(att['interrupted_seconds'])} s ({fmt.usd(att['interrupted_cost_usd'])})"))
    pre = report.get("preprocess")
    if pre:
        figures.append(("documents extracted: CPU s / wall s / rows/s",
                        f"{fmt.num(pre['cpu_seconds'])} / {fmt.num(pre['wall_seconds'])} / {fmt.num(pre['rows_per_s'])}"
                        f" ({pre.get('pool_workers', 0)} process(es))"))
        figures.append(("engine idle waiting on documents", fmt.pct(pre["engine_idle_share"])))
    figures.append(("same job on on-demand", fmt.usd(report["counterfactuals"]["on_demand"]["cost_usd"])))
    padding = report["counterfactuals"]["padding"]
    if padding:
        figures.append(("padding cost avoided by length sorting", f"{fmt.usd(padding['cost_avoided_usd'])} (estimate)"))
    width = max(len(k) for k, _ in figures)
    lines = [f"Batch inference report: {report['run_id']} ({report['dag_id']})"]
    lines += [f"  {k:<{width}}  {v}" for k, v in figures]
    lines.append("  time by stage:")
    stages = report["stage_seconds"]
    sw = max((len(s) for s in stages), default=5)
    for stage, sec in stages.items():
        lines.append(f"    {stage:<{sw}}  {fmt.num(sec):>9} s  {fmt.pct(report['stage_fractions'][stage]):>6}  "
                     f"{fmt.usd(report['cost']['by_stage_usd'].get(stage))}")
    if report["shards_missing"]:
        lines.append(f"  INCOMPLETE: {len(report['shards_missing'])} shard(s) without marker: "
                     + ", ".join(report["shards_missing"][:20]))
    lines += [f"  report: {report['uris']['report_json']}", f"          {report['uris']['report_html']}"]
    if report["uris"].get("openai_output"):
        lines += [f"  OpenAI batch output: {report['uris']['openai_output']}",
                  f"  OpenAI batch errors: {report['uris']['openai_errors']}"]
    return "\n".join(lines)
