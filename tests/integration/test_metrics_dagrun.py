"""The run's metrics arrive at a real OTLP receiver through Airflow's own metrics channel.

One real DAG run (``dag.test()`` in a subprocess with its own SQLite home, as ``tests/integration/
test_dag_runs.py`` runs them: planner, canary, the local runner with the real worker and MiniLM, the
completion gate, DuckDB publish, the report) with Airflow's OpenTelemetry backend switched on by its own
settings (``AIRFLOW__METRICS__OTEL_ON`` / ``OTEL_HOST`` / ``OTEL_PORT`` / ``OTEL_INTERVAL_MILLISECONDS``)
and pointed at :class:`otlp_receiver.OtlpReceiver`, which decodes the OTLP/HTTP protobuf requests. The
input has 60 rows in two shards, with rows that must be dead-lettered for four reasons (one of them an id
repeated across the two shards, which only publish's duplicate rule catches).

Checked: every metric of ``batch_inference.metrics.METRICS`` arrives at each stage that emits it, with
exactly its documented tags, and nothing undocumented does; rows done equal the input rows (run and
shards, at the gate and at the report); dead letters by reason equal the published dead-letter table
(report) and the markers (gate); cost, seconds and ratios equal ``report.json``'s.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import airflow_test_home
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from batch_inference.metrics import METRICS
from otlp_receiver import OtlpReceiver, Point
from run_helpers import SAMPLE_PARQUET, dag_run_dir
from test_dag_runs import RUN_DAG  # the same one-run script as the other DAG-run tests

pytestmark = [pytest.mark.integration, pytest.mark.dagrun]

REPO = Path(__file__).resolve().parents[2]
DAG_ID = "batch_inference_backfill"
PREFIX = "airflow."
"""Airflow's default ``otel_prefix`` plus its delimiter: the exported names are ``airflow.<stat name>``."""
TABLE = "emb_metrics"
ROWS = 60


NOT_IN_THIS_RUN = {("batch_inference.run.eta_seconds", "gate")}
"""(metric, stage) pairs this run cannot send: ``dag.test()`` runs the gate after every shard finished, so
no shard is running (no live rate, no ETA) when it checks."""


def _input(path: Path) -> Path:
    """60 rows (ids ``r00``..``r59``, real texts) with dead letters to be: empty text (rows 3, 40), null
    text (row 7), an id repeated in the same shard (row 12 repeats row 11's) and an id repeated in the
    other shard (row 45 repeats row 5's: a duplicate only publish sees)."""
    texts = pq.read_table(SAMPLE_PARQUET).column("text").to_pylist()[:ROWS]
    ids = [f"r{i:02d}" for i in range(ROWS)]
    texts[3] = texts[40] = ""
    texts[7] = None
    ids[12] = ids[11]
    ids[45] = ids[5]
    pq.write_table(pa.table({"id": ids, "text": pa.array(texts, pa.string())}), path)
    return path


def _env(home: Path, port: int) -> dict[str, str]:
    """The test home's environment with Airflow's OTel metrics on, aimed at the receiver; the standard
    ``OTEL_*`` variables removed (Airflow would prefer them over its own settings)."""
    env = airflow_test_home.airflow_env(home, {
        "AIRFLOW__METRICS__OTEL_ON": "True",
        "AIRFLOW__METRICS__OTEL_HOST": "127.0.0.1",
        "AIRFLOW__METRICS__OTEL_PORT": str(port),
        "AIRFLOW__METRICS__OTEL_INTERVAL_MILLISECONDS": "1000",
        "AIRFLOW__METRICS__OTEL_PREFIX": "airflow",
    })
    return {k: v for k, v in env.items() if not k.startswith("OTEL_")}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The DAG run, what the receiver got, and the run's files."""
    tmp = tmp_path_factory.mktemp("metrics_run")
    out = tmp / "out"
    conf = {"input_uri": str(_input(tmp / "input.parquet")), "output_root": str(out),
            "duckdb_path": str(out / "warehouse.duckdb"), "runner": "local", "rows_per_shard": 30,
            "shard_by": "rows", "output_table": TABLE, "canary_min_rows": 20}
    with OtlpReceiver() as rx:
        proc = subprocess.run([sys.executable, "-c", RUN_DAG, DAG_ID, json.dumps(conf), str(REPO / "dags")],
                              env=_env(tmp / "home", rx.port), capture_output=True, text=True, timeout=900)
        output = proc.stdout + proc.stderr
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        assert proc.returncode == 0 and lines, output[-6000:]
        result = json.loads(lines[-1][len("RESULT "):])
        assert result["state"].endswith("success"), output[-6000:]
        # The task processes flush at exit (Airflow's atexit hook), so the last export is in already.
        rx.wait_for(lambda r: any(p.name == PREFIX + "batch_inference.run.cost_usd"
                                  and p.attributes.get("stage") == "report" for p in r.points()), timeout=30)
    run_dir = dag_run_dir(out, result["run_id"])
    return {"rx": rx, "run_id": result["run_id"], "run_dir": run_dir, "conf": conf, "output": output,
            "report": json.loads((run_dir / "report.json").read_text())}


def _ours(rx: OtlpReceiver) -> list[Point]:
    return [p for p in rx.points() if p.name.startswith(PREFIX + "batch_inference.")]


def _value(rx: OtlpReceiver, name: str, **attributes: str) -> float:
    point = rx.latest(PREFIX + name, **attributes)
    assert point is not None, f"no {name} {attributes}; got {sorted(rx.names())}"
    return point.value


def _by(rx: OtlpReceiver, name: str, key: str, **attributes: str) -> dict[str, float]:
    """``{attribute value: latest value}`` of ``name`` over the values of attribute ``key``."""
    return {dict(k)[key]: p.value for k, p in rx.series(PREFIX + name, **attributes).items()}


def test_every_documented_metric_arrives_with_its_tags_and_nothing_else(run: dict) -> None:
    rx, run_id = run["rx"], run["run_id"]
    ours = _ours(rx)
    assert ours, f"no batch_inference metric arrived; got {sorted(rx.names())}\n{run['output'][-4000:]}"
    specs = {PREFIX + m.name: m for m in METRICS}
    shard_ids = {s["shard_id"] for s in run["report"]["shards"]}
    assert shard_ids == {"00000", "00001"}
    for p in ours:
        spec = specs.get(p.name)
        assert spec is not None, f"{p.name} is not in batch_inference.metrics.METRICS"
        assert p.kind == "gauge", p
        assert set(p.attributes) == set(spec.tags), p
        assert p.attributes["dag_id"] == DAG_ID and p.attributes["stage"] in spec.stages, p
        if "run_id" in spec.tags:
            assert p.attributes["run_id"] == run_id, p
        else:
            assert p.attributes["shard_id"] in shard_ids, p
        assert p.resource.get("service.name") == "airflow", p.resource  # Airflow's own OTel logger sent it
    arrived = {(p.name[len(PREFIX):], p.attributes["stage"]) for p in ours}
    expected = {(m.name, stage) for m in METRICS for stage in m.stages} - NOT_IN_THIS_RUN
    assert expected - arrived == set(), f"documented but not received: {sorted(expected - arrived)}"


def test_rows_done_equal_the_input_rows(run: dict) -> None:
    rx = run["rx"]
    for stage in ("gate", "report"):
        assert _value(rx, "batch_inference.run.rows_total", stage=stage) == ROWS
        assert _value(rx, "batch_inference.run.rows_done", stage=stage) == ROWS
        assert _by(rx, "batch_inference.shard.rows_done", "shard_id", stage=stage) == {"00000": 30, "00001": 30}
    assert _by(rx, "batch_inference.run.shards", "state") == {
        "completed": 2, "failed": 0, "running": 0, "pending": 0, "stale": 0}
    assert _value(rx, "batch_inference.run.rows_per_s", stage="gate") == 0  # nothing runs once the gate checks
    assert _value(rx, "batch_inference.run.rows_published") == run["report"]["rows_published"] == ROWS - 5


def test_dead_letters_by_reason_match_the_dead_letter_table_and_the_markers(run: dict) -> None:
    import duckdb

    rx = run["rx"]
    with duckdb.connect(run["conf"]["duckdb_path"], read_only=True) as con:
        table = dict(con.execute(f"SELECT reason, count(*) FROM batch_inference.{TABLE}__dead_letters "
                                 "GROUP BY reason").fetchall())
    assert table == {"empty_text": 2, "null_text": 1, "duplicate_id": 2}
    assert _by(rx, "batch_inference.run.dead_letters_by_reason", "reason", stage="report") == table
    assert _value(rx, "batch_inference.run.rows_dead_letter", stage="report") == sum(table.values())

    markers = [json.loads((run["run_dir"] / "shards" / sid / "_SUCCESS.json").read_text())
               for sid in ("00000", "00001")]
    by_markers: dict[str, int] = {}
    for m in markers:
        for reason, n in m["dead_letter_reasons"].items():
            by_markers[reason] = by_markers.get(reason, 0) + n
    # The workers see the repeat inside shard 00000 only; publish adds the one across shards.
    assert by_markers == {"empty_text": 2, "null_text": 1, "duplicate_id": 1}
    assert _by(rx, "batch_inference.run.dead_letters_by_reason", "reason", stage="gate") == by_markers
    assert _by(rx, "batch_inference.shard.rows_dead_letter", "shard_id", stage="gate") == {
        m["shard_id"]: m["rows_dead_letter"] for m in markers}


def test_cost_seconds_and_ratios_equal_the_report(run: dict) -> None:
    rx, report = run["rx"], run["report"]

    def at_report(name: str, **attributes: str) -> float:
        return _value(rx, f"batch_inference.run.{name}", stage="report", **attributes)

    assert at_report("cost_usd") == pytest.approx(report["cost_usd"], rel=1e-9) and report["cost_usd"] > 0
    assert at_report("gpu_seconds") == pytest.approx(report["gpu_seconds"], rel=1e-9)
    assert at_report("worker_seconds") == pytest.approx(report["worker_seconds"], rel=1e-9)
    assert at_report("cpu_seconds") == pytest.approx(report["utilisation"]["cpu_seconds"], rel=1e-9)
    assert at_report("padding_efficiency") == pytest.approx(report["padding_efficiency"])
    assert 0 < at_report("padding_efficiency") <= 1
    assert at_report("reuse_ratio") == 0  # a first run under a fresh output root computes every row
    assert at_report("preemptions") == 0 and at_report("retries") == 0
    projection = report["projection"]
    assert at_report("cost_projected_usd") == pytest.approx(projection["projected"]["cost_usd"])
    assert _by(rx, "batch_inference.run.projection_error", "figure") == pytest.approx(
        {k: v for k, v in projection["error"].items() if v is not None})
    # The gate prices what the shards and the canary spent; the report adds publish on top.
    gate_cost = _value(rx, "batch_inference.run.cost_usd", stage="gate")
    assert 0 < gate_cost <= report["cost_usd"]
    assert gate_cost == pytest.approx(report["cost_usd"] - report["cost"]["publish_usd"], rel=1e-6)
    for row in report["shards"]:
        sid = row["shard_id"]
        assert _value(rx, "batch_inference.shard.cost_usd", shard_id=sid) == pytest.approx(row["cost_usd"])
        assert _value(rx, "batch_inference.shard.rows_per_s", shard_id=sid, stage="report") == pytest.approx(
            row["rows_per_s"])
