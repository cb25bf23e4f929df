"""``report.html``: one self-contained page (inline CSS, charts as base64 PNG data URIs, no scripts)."""

from __future__ import annotations

from html import escape
from typing import Any

import batch_inference.report.fmt as fmt
from batch_inference.report.approvals import approval_text
from batch_inference.report.charts import render_all

MAX_TABLE_ROWS = 500
"""Rows shown in the per-shard and attempts tables (``report.json`` keeps them all)."""

_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5rem;color:#222;max-width:1100px}
h1{font-size:1.4rem}h2{font-size:1.1rem;margin-top:1.6rem;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.85rem;margin:.4rem 0}
td,th{border:1px solid #ddd;padding:.2rem .5rem;text-align:right}th{background:#f4f4f4}
td:first-child,th:first-child{text-align:left}
.kpis{display:flex;flex-wrap:wrap;gap:.6rem}.kpi{border:1px solid #ddd;border-radius:6px;padding:.5rem .8rem}
.kpi b{display:block;font-size:1.2rem}.note{color:#666;font-size:.8rem}figure{margin:.6rem 0}
.warn{background:#fff3cd;padding:.4rem .6rem;border-radius:4px}
"""


def _table(headers: list[str], rows: list[list[Any]], css_id: str) -> str:
    note = ""
    if len(rows) > MAX_TABLE_ROWS:
        note = f'<p class="note">Showing {MAX_TABLE_ROWS} of {len(rows):,} rows; report.json has them all.</p>'
        rows = rows[:MAX_TABLE_ROWS]
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table id="{css_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{note}'


def _kpis(r: dict[str, Any]) -> str:
    items = [
        ("rows published", fmt.num(r["rows_published"])),
        ("cost", fmt.usd(r["cost_usd"])),
        ("$ / million rows", fmt.usd(r["cost_per_million_rows_usd"])),
        ("$ / million tokens", fmt.usd(r["cost_per_million_tokens_usd"])),
        ("padding efficiency", fmt.pct(r["padding_efficiency"])),
        ("steady rows/s per GPU", fmt.num(r["throughput"]["steady_rows_per_s_per_gpu"])),
        ("preemptions", str(r["attempts"]["preemptions"])),
        ("rows re-done", fmt.num(r["attempts"]["rows_redone"])),
    ]
    return '<div class="kpis">' + "".join(
        f'<div class="kpi">{escape(k)}<b>{escape(v)}</b></div>' for k, v in items) + "</div>"


def _chart(name: str, uri: str | None, title: str) -> str:
    if uri is None:
        return f'<p class="note" data-chart-missing="{name}">{escape(title)}: no data.</p>'
    return (f'<figure><img id="chart-{name}" data-chart="{name}" alt="{escape(title)}" src="{uri}">'
            f"<figcaption class=\"note\">{escape(title)}</figcaption></figure>")


def _rows_section(r: dict[str, Any]) -> str:
    rows = [["input", fmt.num(r["rows_input"])], ["published", fmt.num(r["rows_published"])],
            ["dead-lettered", fmt.num(r["rows_dead_letter"])], ["truncated", fmt.num(r["rows_truncated"])],
            ["missing", fmt.num(r["rows_missing"])]]
    reuse = r.get("reuse") or {}
    if reuse:
        rows += [["computed by this run", fmt.num(r.get("rows_computed"))],
                 ["reused from earlier runs (result cache)", fmt.num(r.get("rows_reused"))],
                 ["cost avoided by reuse", fmt.usd(reuse.get("cost_avoided_usd"))],
                 ["shards carried over with no worker (unchanged input)", fmt.num(reuse.get("shards_carried", 0))]]
    rows += [[f"dead letter: {k}", fmt.num(v)] for k, v in r["dead_letter_reasons"].items()]
    t = r["tokens"]
    tok_rows = [[k, fmt.num(t[k])] for k in ("input", "real", "padded", "prompt", "cached", "output", "total")]
    return (_table(["rows", "count"], rows, "rows") + _table(["tokens", "count"], tok_rows, "tokens"))


def _stage_section(r: dict[str, Any]) -> str:
    usd = r["cost"]["by_stage_usd"]
    rows = [[s, fmt.num(sec), fmt.pct(r["stage_fractions"][s]), fmt.usd(usd.get(s))]
            for s, sec in r["stage_seconds"].items()]
    return _table(["stage", "seconds", "share", "cost"], rows, "stages")


def _projection_section(r: dict[str, Any]) -> str:
    """The canary's projection beside the actuals (``report["projection"]``)."""
    p = r.get("projection")
    if not p:
        return '<p class="note">No pre-flight canary ran for this run (Param canary off, dry run or kubernetes runner).</p>'

    def seconds(v: Any) -> str:
        return "-" if v is None else f"{v:,.1f} s"

    def err(v: Any) -> str:
        return "-" if v is None else f"{v:+.1%}"

    pr, ac, er = p["projected"], p["actual"], p["error"]
    rows = [["fan-out worker-seconds", seconds(pr["worker_seconds"]), seconds(ac["worker_seconds"]), err(er["worker_seconds"])],
            ["cost", fmt.usd(pr["cost_usd"]), fmt.usd(ac["cost_usd"]), err(er["cost_usd"])],
            ["finish (from run start)", seconds(pr["finish_seconds"]), seconds(ac["finish_seconds"]), err(er["finish_seconds"])]]
    note = (f'<p class="note">{escape(str(p.get("message") or ""))}; token budget {p.get("token_budget")} '
            "chosen by the canary.</p>")
    if r.get("upgrade"):
        note += f'<p class="note">{escape(str(r["upgrade"]["message"]))}</p>'
    return _table(["figure", "projected", "actual", "error"], rows, "projection") + note


def _cost_section(r: dict[str, Any]) -> str:
    c, cf, p = r["cost"], r["counterfactuals"], r["cost"]["params"]
    rows = [
        ["pricing", f"{p['pricing']}, {p['gpu_count']} x {p['accelerator']} per shard"],
        ["price per GPU-hour paid", fmt.usd(c["usd_per_gpu_hour"])],
        ["worker cost", fmt.usd(c["worker_usd"])], ["publish cost", fmt.usd(c["publish_usd"])],
        ["total", fmt.usd(r["cost_usd"])],
        ["$ / million input tokens", fmt.usd(c["per_million_input_tokens_usd"])],
        ["$ / million output tokens", fmt.usd(c["per_million_output_tokens_usd"])],
        ["same job, spot", fmt.usd(cf["spot"]["cost_usd"])],
        ["same job, on-demand", fmt.usd(cf["on_demand"]["cost_usd"])],
    ]
    pad = cf["padding"]
    if pad:
        rows += [["padding efficiency, random order (estimate)", fmt.pct(pad["efficiency"])],
                 ["padding cost avoided by length sorting (estimate)", fmt.usd(pad["cost_avoided_usd"])]]
    note = f'<p class="note">Prices: {escape(p["price_source"])} ({escape(p["price_taken_on"] or "user-given")}).'
    if pad:
        note += f" Padding estimate: {escape(pad['method'])}"
    return _table(["cost", "value"], rows, "cost") + note + "</p>"


def _util_section(r: dict[str, Any]) -> str:
    u, t = r["utilisation"], r["throughput"]
    rows = [["device", u["device"]], ["GPU utilisation (NVML mean)", fmt.num(u["gpu_util_mean"])],
            ["GPU memory max (bytes)", fmt.num(u["gpu_mem_max_bytes"])], ["CPU seconds", fmt.num(u["cpu_seconds"])],
            ["CPU cores busy (mean)", fmt.num(u["cpu_cores_busy_mean"], 2)],
            ["steady rows/s per GPU", fmt.num(t["steady_rows_per_s_per_gpu"])],
            ["inference rows/s per GPU", fmt.num(t["inference_rows_per_s_per_gpu"])],
            ["end-to-end rows/s per GPU", fmt.num(t["end_to_end_rows_per_s_per_gpu"])]]
    return _table(["utilisation", "value"], rows, "utilisation")


def _attempts_section(r: dict[str, Any]) -> str:
    a = r["attempts"]
    head = (f"<p>{a['total']} attempts: " + ", ".join(f"{k} {v}" for k, v in a["by_outcome"].items() if v)
            + f"; preemptions (exit 75): {a['preemptions']}; killed: {a['killed']}; rows re-done: "
            f"{fmt.num(a['rows_redone'])}; seconds in attempts that did not finish their shard: "
            f"{fmt.num(a['interrupted_seconds'])} ({fmt.usd(a['interrupted_cost_usd'])}).</p>")
    rows = [[x["shard_id"], x["attempt_id"], x["outcome"], "" if x["exit_code"] is None else x["exit_code"],
             x["started_at"], x["ended_at"], fmt.num(x["rows_processed"]), fmt.num(x["rows_committed"]),
             fmt.num(x["rows_redone"])] for x in a["list"]]
    return head + _table(["shard", "attempt", "outcome", "exit", "started", "ended", "processed", "committed",
                          "re-done"], rows, "attempts")


def _hosts_note(r: dict[str, Any]) -> str:
    """One line naming the host all shards ran on, or a warning listing the kinds of host when they
    differ (per-shard throughput is then not comparable without them)."""
    groups = [g for g in r.get("hosts") or [] if g["host"]]
    if len(r.get("hosts") or []) > 1:
        items = "; ".join(f"{g['host'] or 'unknown (old marker)'}: {len(g['shards'])} shard(s)" for g in r["hosts"])
        return f'<p class="warn">Shards ran on {len(r["hosts"])} kinds of host: {escape(items)}</p>'
    return f'<p class="note">Host: {escape(groups[0]["host"])}</p>' if groups else ""


def _stealing_note(r: dict[str, Any]) -> str:
    """One line on work stealing (chunks stolen, idle time saved), empty when it was off."""
    st = r.get("stealing")
    if not st:
        return ""
    return (f'<p class="note" id="stealing">Work stealing: {fmt.num(st["chunks_stolen"])} of '
            f'{fmt.num(st["chunks"])} chunks computed by workers of other shards '
            f'({st["shards_with_stolen_chunks"]} shard(s)); idle worker time saved: '
            f'{fmt.num(st["idle_seconds_saved"])} s.</p>')


def _shards_section(r: dict[str, Any]) -> str:
    with_host = any(s.get("host") for s in r["shards"])
    stolen = bool(r.get("stealing"))
    rows = [[s["shard_id"], s["status"], fmt.num(s["rows_input"]), fmt.num(s["rows_ok"]),
             fmt.num(s["rows_dead_letter"]), fmt.num(s["seconds"]), fmt.num(s["steady_rows_per_s"]),
             fmt.pct(s["padding_efficiency"]), fmt.num(s["gpu_util_mean"]), s["attempts"], s["preemptions"],
             fmt.usd(s["cost_usd"])] + ([fmt.num(s.get("chunks_stolen"))] if stolen else [])
            + ([s.get("host") or ""] if with_host else []) for s in r["shards"]]
    return _hosts_note(r) + _stealing_note(r) + _table(
        ["shard", "status", "rows in", "ok", "dead", "seconds", "steady rows/s", "padding eff.", "GPU util",
         "attempts", "preempted", "cost"] + (["stolen chunks"] if stolen else []) + (["host"] if with_host else []),
        rows, "shards")


def render_html(report: dict[str, Any]) -> str:
    """The report as one self-contained HTML page (UTF-8 text).

    Sections: who approved the run and when (``id="approval"``; "not required" for a run that did not
    ask), headline figures, time by stage, cost and counterfactuals, rows and tokens, utilisation,
    attempts, per-shard table, and four charts (``data-chart`` = ``time_by_stage``,
    ``shard_throughput``, ``token_histogram``, ``cost_history``).
    """
    r = report
    charts = render_all(r)
    warn = ""
    if r["shards_missing"]:
        warn = (f'<p class="warn">Incomplete run: {len(r["shards_missing"])} shard(s) have no marker: '
                f'{escape(", ".join(r["shards_missing"][:50]))}</p>')
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>Batch inference report {escape(r['run_id'])}</title><style>{_CSS}</style></head><body>",
        f"<h1>Batch inference report: {escape(r['run_id'])}</h1>",
        f'<p class="note">DAG {escape(r["dag_id"])} &middot; engine {escape(r["engine_kind"])} &middot; '
        f"generated {escape(r['generated_at'])} &middot; report schema v{r['schema_version']}</p>",
        f'<p class="note" id="approval">Approval: {escape(approval_text(r.get("approval")))}</p>',
        warn, _kpis(r),
        "<h2>Time by stage</h2>", _stage_section(r),
        _chart("time_by_stage", charts["time_by_stage"], "Seconds and cost by stage"),
        "<h2>Cost</h2>", _cost_section(r),
        _chart("cost_history", charts["cost_history"], "Cost per million rows across recent runs of this DAG"),
        "<h2>Rows and tokens</h2>", _rows_section(r),
        _chart("token_histogram", charts["token_histogram"], "Token-length histogram and padding"),
        "<h2>Throughput and utilisation</h2>", _util_section(r),
        _chart("shard_throughput", charts["shard_throughput"], "Per-shard throughput"),
        "<h2>Plan versus actual</h2>", _projection_section(r),
        "<h2>Attempts</h2>", _attempts_section(r),
        "<h2>Shards</h2>", _shards_section(r),
        "</body></html>",
    ]
    return "\n".join(parts)
