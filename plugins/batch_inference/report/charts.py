"""Report charts as self-contained ``data:image/png;base64`` URIs (matplotlib, Agg backend).

Each function takes the report dict and returns a data URI, or ``None`` when the run has nothing to
plot (for example no part files for the token histogram).
"""

from __future__ import annotations

import base64
import io
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display; must precede pyplot
import matplotlib.pyplot as plt  # noqa: E402

_FIGSIZE = (7.0, 3.2)


def _to_data_uri(fig: Any) -> str:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=96)
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def time_by_stage(report: dict[str, Any]) -> str | None:
    """Horizontal bars: seconds per stage (worker stages summed over shards, plus publish) with USD."""
    seconds = report["stage_seconds"]
    if not any(seconds.values()):
        return None
    usd = report["cost"]["by_stage_usd"]
    names = list(seconds)
    fig, ax = plt.subplots(figsize=_FIGSIZE)
    bars = ax.barh(names, [seconds[n] for n in names], color="#4c72b0")
    for bar, name in zip(bars, names, strict=True):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" ${usd.get(name, 0.0):.4g}",
                va="center", fontsize=8)
    ax.invert_yaxis()
    ax.margins(x=0.18)  # room for the cost labels
    ax.set_xlabel("seconds (summed over shards)")
    ax.set_title("Time and cost by stage")
    return _to_data_uri(fig)


def shard_throughput(report: dict[str, Any]) -> str | None:
    """Bars per shard: steady-state rows/s (worker-measured) and end-to-end rows/s (rows / seconds)."""
    shards = [s for s in report["shards"] if s["seconds"]]
    if not shards:
        return None
    ids = [s["shard_id"] for s in shards]
    x = range(len(ids))
    fig, ax = plt.subplots(figsize=_FIGSIZE)
    ax.bar([i - 0.2 for i in x], [s["steady_rows_per_s"] or 0.0 for s in shards], width=0.4,
           label="steady state (inference)", color="#55a868")
    ax.bar([i + 0.2 for i in x], [s["rows_per_s"] or 0.0 for s in shards], width=0.4,
           label="end to end (all stages)", color="#c44e52")
    if len(ids) <= 40:
        ax.set_xticks(list(x), ids, rotation=90 if len(ids) > 12 else 0, fontsize=7)
    ax.set_xlabel("shard" if len(ids) <= 40 else f"shard ({len(ids)} shards, in id order)")
    ax.set_ylabel("rows / s")
    ax.set_title("Per-shard throughput")
    ax.legend(fontsize=8)
    return _to_data_uri(fig)


def token_histogram(report: dict[str, Any]) -> str | None:
    """Row-length histogram (real tokens per row) and a bar of real vs padding tokens.

    Padding bars: measured with length-sorted batching, and the random-order estimate.
    """
    hist = report["token_lengths"]["histogram"]
    if not hist["rows"]:
        return None
    edges = hist["bin_edges"]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(8.5, 3.2), gridspec_kw={"width_ratios": [3, 1.3]})
    ax.bar(edges[:-1], hist["rows"], width=[b - a for a, b in zip(edges[:-1], edges[1:], strict=True)],
           align="edge", color="#8172b3", edgecolor="white")
    ax.set_xlabel("tokens per row (n_tokens)")
    ax.set_ylabel("rows")
    ax.set_title("Token lengths")
    pad = report["padding"]
    est = pad["random_order_estimate"]
    labels, real, padding = [], [], []
    if pad["tokens_padded"]:
        labels.append("sorted\n(measured)")
        real.append(pad["tokens_real"])
        padding.append(pad["tokens_padding"])
    if est:
        labels.append("random\n(estimate)")
        real.append(pad["tokens_real"])
        padding.append(max(0.0, est["tokens_padded"] - pad["tokens_real"]))
    if labels:
        ax2.bar(labels, real, color="#4c72b0", label="real")
        ax2.bar(labels, padding, bottom=real, color="#dd8452", label="padding")
        ax2.set_ylabel("tokens processed")
        ax2.set_title("Padding")
        ax2.legend(fontsize=7, loc="lower right")
    else:
        ax2.axis("off")
        ax2.text(0.5, 0.5, "no padded batches\n(continuous batching)", ha="center", va="center", fontsize=8)
    return _to_data_uri(fig)


def cost_history(report: dict[str, Any]) -> str | None:
    """Cost per million rows across recent runs of the same DAG, this run last and highlighted."""
    runs = [r for r in report["history"] if r.get("cost_per_million_rows_usd") is not None]
    points = [(r["run_id"], r["cost_per_million_rows_usd"]) for r in runs]
    if report["cost_per_million_rows_usd"] is not None:
        points.append((report["run_id"], report["cost_per_million_rows_usd"]))
    if not points:
        return None
    fig, ax = plt.subplots(figsize=_FIGSIZE)
    colors = ["#937860"] * (len(points) - 1) + ["#c44e52"]
    ax.bar(range(len(points)), [p[1] for p in points], color=colors)
    ax.set_xticks(range(len(points)), [p[0][-24:] for p in points], rotation=60, ha="right", fontsize=6)
    ax.set_ylabel("USD per million rows")
    ax.set_title(f"Cost per million rows, recent runs of {report['dag_id']}")
    return _to_data_uri(fig)


CHARTS = {
    "time_by_stage": time_by_stage,
    "shard_throughput": shard_throughput,
    "token_histogram": token_histogram,
    "cost_history": cost_history,
}
"""Chart id -> renderer, in page order."""


def render_all(report: dict[str, Any]) -> dict[str, str | None]:
    """Every chart of :data:`CHARTS` rendered (``None`` where there is no data)."""
    return {name: fn(report) for name, fn in CHARTS.items()}
