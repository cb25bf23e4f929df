"""The sample Grafana dashboard (docs/grafana/batch-inference.json) queries only documented metrics
(batch_inference.metrics.METRICS, as an OTel collector's Prometheus exporter names them: dots become
underscores under the ``airflow`` prefix) and filters only by tags those metrics carry."""

from __future__ import annotations

import json
import re
from pathlib import Path

from batch_inference.metrics import METRICS

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "batch-inference.json"
PROMETHEUS_NAME = re.compile(r"airflow_batch_inference_(run|shard)_([a-z_]+?)(?=[{\s),]|$)")
LABELS = re.compile(r"(\w+)=\"")


def _queries() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    return exprs + [v["query"] for v in board["templating"]["list"] if v["type"] == "query"]


def test_every_queried_metric_is_documented_and_every_label_is_one_of_its_tags() -> None:
    specs = {spec.name: spec for spec in METRICS}
    seen = set()
    for expr in _queries():
        for match in PROMETHEUS_NAME.finditer(expr):
            name = f"batch_inference.{match.group(1)}.{match.group(2)}"
            assert name in specs, f"{expr}: {name} is not in batch_inference.metrics.METRICS"
            seen.add(name)
            selector = expr[match.end():].split("}", 1)[0] if expr[match.end():].startswith("{") else ""
            assert set(LABELS.findall(selector)) <= set(specs[name].tags), (expr, specs[name].tags)
    assert {"batch_inference.run.rows_done", "batch_inference.run.cost_usd",
            "batch_inference.run.dead_letters_by_reason", "batch_inference.shard.rows_per_s"} <= seen


def test_the_dashboard_is_importable_json_with_unique_panel_ids() -> None:
    board = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in board["panels"]]
    assert board["uid"] and len(ids) == len(set(ids)) and all(p["targets"] for p in board["panels"])
