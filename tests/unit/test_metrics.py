"""The metrics table and the values the gate and the report emit, from synthetic run states.

The gate's state (3 shards of 100 rows, DAG ``dag_m``, run ``run_m``, spot L4 at $1.80/GPU-h):

| shard | state | rows done | dead letters | rate | stage seconds |
|---|---|---|---|---|---|
| 00000 | complete (marker) | 100 | 5 (3 empty_text, 2 null_text) | - | 60 + 40 = 100 |
| 00001 | running (progress, fresh) | 40 | 1 | 8.0 rows/s | - |
| 00002 | pending (manifest only) | 0 | 0 | - | - |

So the run has 140 of 300 rows done, 6 dead letters, 8 rows/s, an ETA of (300 - 140) / 8 = 20 s and has
spent 100 s x $1.80 / 3600 = $0.05 (no canary); ``projection.json`` projects $0.50.

The report's state: 2 complete shards of 5 rows (40 and 20 worker seconds, 40 of 50 tokens real, 1 row
reused each), 2 GPUs per worker; shard 00000 was preempted once (exit 75) before it completed; the
projection said 30 fan-out worker-seconds (error (30 - 60) / 60 = -0.5).
"""

from __future__ import annotations

import json
import logging
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
from airflow.sdk._shared.observability.metrics.otel_logger import SafeOtelLogger
from airflow.sdk._shared.observability.metrics.stats import normalize_name_for_stats
from airflow.sdk._shared.observability.metrics.validators import stat_name_otel_handler
from batch_contract.engine_config import EncoderConfig
from batch_contract.layout import RunLayout
from batch_contract.manifest import InputFile, InputSpec, Manifest, Segment, ShardSpec
from batch_contract.marker import AttemptRecord, ShardMarker, ShardProgress
from batch_contract.runstore import RunStore
from batch_inference import metrics
from batch_inference.completion import gate_progress
from batch_inference.metrics import (
    METRICS,
    RUN_TAGS,
    SHARD_TAGS,
    STAGES,
    Sample,
    emit,
    emit_gate_metrics,
    emit_report_metrics,
    markdown_table,
    report_samples,
)
from batch_inference.progress import collect_progress
from batch_inference.report import build_report
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "observability.md"
IDS = ["00000", "00001", "00002"]
UNITS = {"rows", "rows/s", "shards", "attempts", "USD", "seconds", "ratio"}


class Recorder:
    """A stats channel that keeps what it was given (``Stats.gauge``'s signature)."""

    def __init__(self) -> None:
        self.gauges: list[tuple[str, float, dict[str, str]]] = []

    def gauge(self, stat: str, value: float, *args: object, tags: dict | None = None, **kwargs: object) -> None:
        self.gauges.append((stat, value, dict(tags or {})))

    def value(self, name: str, **tags: str) -> float:
        found = [v for n, v, t in self.gauges if n == name and all(t.get(k) == w for k, w in tags.items())]
        assert len(found) == 1, (name, tags, found)
        return found[0]

    def by(self, name: str, key: str) -> dict[str, float]:
        return {t[key]: v for n, v, t in self.gauges if n == name}


def _write(uri: str, data: bytes) -> None:
    Path(uri).parent.mkdir(parents=True, exist_ok=True)
    Path(uri).write_bytes(data)


def _manifest(run_id: str, rows: list[int], params: dict) -> Manifest:
    spec = InputSpec(uri="in.parquet", format="parquet", id_column="id", text_column="text",
                     files=[InputFile(uri="in.parquet", rows=sum(rows))])
    starts = [sum(rows[:i]) for i in range(len(rows))]
    shards = [ShardSpec(f"{i:05d}", [Segment(0, s, s + n)]) for i, (s, n) in enumerate(zip(starts, rows, strict=True))]
    return Manifest(run_id=run_id, input=spec, shards=shards, engine=EncoderConfig().to_dict(), params=params,
                    created_at="2026-11-30T01:00:00+00:00")


@pytest.fixture()
def gate_run(tmp_path: Path) -> RunStore:
    """The gate's state of the module docstring."""
    layout = RunLayout(str(tmp_path), "run_m", "dag_m")
    params = {"dag_id": "dag_m", "accelerator": "nvidia-l4", "pricing": "spot", "gpu_hour_usd_spot": 1.8}
    _write(layout.manifest_uri, _manifest("run_m", [100, 100, 100], params).to_json_bytes())
    marker = ShardMarker(run_id="run_m", shard_id="00000", fingerprint="fp", rows_input=100, rows_ok=95,
                         rows_dead_letter=5, dead_letter_reasons={"empty_text": 3, "null_text": 2},
                         stage_seconds={"model_load": 60.0, "inference": 40.0})
    _write(layout.marker_uri("00000"), marker.to_json_bytes())
    fresh = datetime.now(UTC).isoformat()
    _write(layout.progress_uri("00001"),
           ShardProgress("00001", "running", 100, 40, 1, 8.0, 7.5, fresh).to_json_bytes())
    _write(layout.projection_uri, json.dumps({"cost_usd": 0.5, "speed_known": True}).encode())
    return RunStore(layout)


def _gate(store: RunStore) -> Recorder:
    rec = Recorder()
    n = emit_gate_metrics(store, collect_progress(store, IDS, per_shard=True), stats=rec)
    assert n == len(rec.gauges) > 0
    return rec


# -- the table ------------------------------------------------------------------------------------------
def test_the_table_is_well_formed() -> None:
    names = [m.name for m in METRICS]
    assert len(names) == len(set(names))
    for m in METRICS:
        assert re.fullmatch(r"batch_inference\.(run|shard)\.[a-z_]+", m.name), m.name
        # Airflow drops a name its OTel logger finds unsafe, and rewrites one StatsD would not take.
        assert stat_name_otel_handler("airflow", m.name) == f"airflow.{m.name}"
        assert normalize_name_for_stats(m.name, log_warning=False) == m.name
        assert m.kind == "gauge" and m.unit in UNITS and m.meaning and m.source
        assert set(m.stages) <= set(STAGES) and m.stages
        if m.name.startswith("batch_inference.run."):
            assert m.tags[:3] == RUN_TAGS and set(m.tags[3:]) <= {"reason", "state", "figure"}
        else:
            assert m.name.startswith("batch_inference.shard.") and m.tags == SHARD_TAGS  # no run_id: see the module
    assert {"dag_id", "run_id", "shard_id", "stage", "reason"} <= {t for m in METRICS for t in m.tags}


def test_markdown_table_has_one_row_per_metric() -> None:
    rows = markdown_table().splitlines()
    assert rows[0] == "| name | type | tags | unit | stage | meaning | source |"
    assert len(rows) == 2 + len(METRICS)
    for m, row in zip(METRICS, rows[2:], strict=True):
        assert row.startswith(f"| `{m.name}` | gauge | ") and row.count(" | ") == 6


def test_docs_hold_the_table_as_the_module_prints_it() -> None:
    """``docs/observability.md`` holds :func:`markdown_table`'s output verbatim; after a change to
    ``METRICS``, paste ``python -m batch_inference.metrics`` there."""
    assert DOC.is_file(), f"{DOC} is missing: it must hold the metrics table (python -m batch_inference.metrics)"
    assert markdown_table() in DOC.read_text(), (
        f"{DOC.relative_to(REPO)}: the metrics table differs from batch_inference.metrics.METRICS; replace it "
        "with the output of `PYTHONPATH=plugins .venv/bin/python -m batch_inference.metrics`")


# -- the gate ---------------------------------------------------------------------------------------------
def test_gate_values_from_markers_progress_and_projection(gate_run: RunStore) -> None:
    rec = _gate(gate_run)
    run = {"dag_id": "dag_m", "run_id": "run_m", "stage": "gate"}
    assert rec.value("batch_inference.run.rows_total", **run) == 300
    assert rec.value("batch_inference.run.rows_done", **run) == 140
    assert rec.value("batch_inference.run.rows_dead_letter", **run) == 6
    assert rec.by("batch_inference.run.dead_letters_by_reason", "reason") == {"empty_text": 3, "null_text": 2}
    assert rec.by("batch_inference.run.shards", "state") == {
        "completed": 1, "failed": 0, "running": 1, "pending": 1, "stale": 0}
    assert rec.value("batch_inference.run.rows_per_s", **run) == pytest.approx(8.0)
    assert rec.value("batch_inference.run.eta_seconds", **run) == pytest.approx(20.0)
    assert rec.value("batch_inference.run.cost_usd", **run) == pytest.approx(0.05)
    assert rec.value("batch_inference.run.cost_projected_usd", **run) == pytest.approx(0.5)
    assert rec.by("batch_inference.shard.rows_done", "shard_id") == {"00000": 100, "00001": 40, "00002": 0}
    assert rec.by("batch_inference.shard.rows_total", "shard_id") == {"00000": 100, "00001": 100, "00002": 100}
    assert rec.by("batch_inference.shard.rows_dead_letter", "shard_id") == {"00000": 5, "00001": 1, "00002": 0}
    assert rec.by("batch_inference.shard.rows_per_s", "shard_id") == {"00000": 0.0, "00001": 8.0, "00002": 0.0}
    for name, _, tags in rec.gauges:
        assert tuple(tags) == metrics.SPECS[name].tags and tags["dag_id"] == "dag_m" and tags["stage"] == "gate"
    gate_specs = {m.name for m in METRICS if "gate" in m.stages}
    assert {n for n, _, _ in rec.gauges} == gate_specs  # this state has every gate metric


def test_gate_leaves_out_an_unpriced_projection_and_a_missing_rate(gate_run: RunStore) -> None:
    _write(gate_run.layout.projection_uri, json.dumps({"cost_usd": 0.0, "speed_known": False}).encode())
    Path(gate_run.layout.progress_uri("00001")).unlink()
    rec = _gate(gate_run)
    names = {n for n, _, _ in rec.gauges}
    assert "batch_inference.run.cost_projected_usd" not in names and "batch_inference.run.eta_seconds" not in names
    assert rec.value("batch_inference.run.rows_per_s") == 0


def test_gate_progress_returns_the_line_and_emits_through_stats(gate_run: RunStore, monkeypatch) -> None:
    rec = Recorder()
    monkeypatch.setattr("airflow.sdk.observability.stats.Stats", rec)
    line = gate_progress(gate_run)
    assert line.startswith("8.0 rows/s | ETA 20s | rows 140/300") and "waiting on 00001, 00002" in line
    assert rec.value("batch_inference.run.rows_done") == 140


# -- the report -------------------------------------------------------------------------------------------
@pytest.fixture()
def report(tmp_path: Path) -> dict:
    """The report's state of the module docstring, built by the real report builder."""
    layout = RunLayout(str(tmp_path), "run_r", "dag_r")
    _write(layout.manifest_uri, _manifest("run_r", [5, 5], {"dag_id": "dag_r"}).to_json_bytes())
    for sid, dead, seconds in (("00000", 1, {"model_load": 10.0, "inference": 30.0}),
                               ("00001", 0, {"model_load": 10.0, "inference": 10.0})):
        marker = ShardMarker(run_id="run_r", shard_id=sid, fingerprint="fp", rows_input=5, rows_ok=5 - dead,
                             rows_dead_letter=dead, dead_letter_reasons={"too_long": dead} if dead else {},
                             tokens_real=40, tokens_padded=50, stage_seconds=seconds, cpu_seconds=20.0,
                             rows_reused=1)
        _write(layout.marker_uri(sid), marker.to_json_bytes())
    for aid, code in (("a1", 75), ("a2", 0)):
        rec = AttemptRecord(attempt_id=aid, shard_id="00000", started_at=f"2026-11-30T01:0{aid[1]}:00+00:00",
                            status="complete" if code == 0 else "interrupted", exit_code=code)
        _write(f"{layout.attempts_dir('00000')}/{aid}.json", rec.to_json_bytes())
    _write(layout.projection_uri, json.dumps({"decision": "go", "message": "GO", "cost_usd": 0.02, "fanout_worker_seconds": 30.0,
                                              "finish_seconds": 100.0, "elapsed_seconds": 0.0}).encode())
    publish = {"table": "t", "rows_input": 10, "rows_published": 9, "rows_dead_letter": 1, "rows_missing": 0,
               "publish_seconds": 2.0, "dead_letter_reasons": {"too_long": 1}}
    cost = {"accelerator": "nvidia-l4", "gpu_count": 2, "pricing": "spot", "spot_usd_per_gpu_hour": 1.8}
    return build_report(layout.run_dir, dag_id="dag_r", publish_summary=publish, cost_params=cost,
                        write_html=False)


def test_report_values_are_the_reports_own(report: dict) -> None:
    rec = Recorder()
    assert emit_report_metrics(report, stats=rec) == len(rec.gauges)
    run = {"dag_id": "dag_r", "run_id": "run_r", "stage": "report"}
    assert rec.value("batch_inference.run.rows_total", **run) == 10
    assert rec.value("batch_inference.run.rows_done", **run) == 10
    assert rec.value("batch_inference.run.rows_published", **run) == 9
    assert rec.by("batch_inference.run.dead_letters_by_reason", "reason") == {"too_long": 1}
    assert rec.value("batch_inference.run.preemptions", **run) == 1 == report["attempts"]["preemptions"]
    assert rec.value("batch_inference.run.retries", **run) == 1
    assert rec.by("batch_inference.shard.retries", "shard_id") == {"00000": 1, "00001": 0}
    assert rec.by("batch_inference.shard.preemptions", "shard_id") == {"00000": 1, "00001": 0}
    # 60 worker seconds x 2 GPUs; cost: the report's own figure (worker and publish), not recomputed
    assert rec.value("batch_inference.run.worker_seconds", **run) == pytest.approx(60.0)
    assert rec.value("batch_inference.run.gpu_seconds", **run) == pytest.approx(120.0)
    assert rec.value("batch_inference.run.cost_usd", **run) == pytest.approx(report["cost_usd"])
    assert rec.value("batch_inference.run.cpu_seconds", **run) == pytest.approx(40.0)
    assert rec.value("batch_inference.run.padding_efficiency", **run) == pytest.approx(0.8)
    assert rec.value("batch_inference.run.reuse_ratio", **run) == pytest.approx(2 / 9)
    assert rec.value("batch_inference.run.cost_projected_usd", **run) == pytest.approx(0.02)
    assert rec.by("batch_inference.run.projection_error", "figure") == pytest.approx(
        {k: v for k, v in report["projection"]["error"].items() if v is not None})
    assert rec.value("batch_inference.run.projection_error", figure="worker_seconds") == pytest.approx(-0.5)
    assert rec.by("batch_inference.shard.gpu_seconds", "shard_id") == pytest.approx({"00000": 80.0, "00001": 40.0})
    assert rec.by("batch_inference.shard.rows_per_s", "shard_id") == pytest.approx({"00000": 0.125, "00001": 0.25})
    assert rec.by("batch_inference.shard.cost_usd", "shard_id") == pytest.approx(
        {row["shard_id"]: row["cost_usd"] for row in report["shards"]})
    report_specs = {m.name for m in METRICS if "report" in m.stages}
    assert {n for n, _, _ in rec.gauges} == report_specs  # this report has every report metric


def test_the_airflow_otel_logger_takes_every_name_and_tag(report: dict) -> None:
    """Through Airflow's own OTel logger (an in-memory reader instead of the exporter): no name dropped,
    prefix added, tags as attributes."""
    reader = InMemoryMetricReader()
    logger = SafeOtelLogger(MeterProvider(metric_readers=[reader]), prefix="airflow")
    samples = report_samples(report)
    assert emit(samples, stats=logger) == len(samples)
    got = {}
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for dp in metric.data.data_points:
                    got[(metric.name, tuple(sorted(dp.attributes.items())))] = dp.value
    want = {(f"airflow.{s.name}", tuple(sorted(s.tags.items()))): s.value for s in samples}
    assert got == pytest.approx(want)


# -- failures ---------------------------------------------------------------------------------------------
def test_emit_refuses_what_the_table_does_not_document() -> None:
    tags = {"dag_id": "d", "run_id": "r", "stage": "gate"}
    with pytest.raises(ValueError, match="not in batch_inference.metrics.METRICS"):
        emit([Sample("batch_inference.run.undocumented", 1, tags)], stats=Recorder())
    with pytest.raises(ValueError, match="tags"):
        emit([Sample("batch_inference.run.rows_done", 1, {**tags, "shard_id": "00000"})], stats=Recorder())
    with pytest.raises(ValueError, match="stage 'gate' not in"):
        emit([Sample("batch_inference.run.preemptions", 1, tags)], stats=Recorder())


def test_a_failing_backend_or_store_never_fails_the_task(gate_run: RunStore, report: dict, caplog) -> None:
    class Broken:
        def gauge(self, *args: object, **kwargs: object) -> None:
            raise RuntimeError("collector down")

    caplog.set_level(logging.WARNING, logger="batch_inference.metrics")
    assert emit_report_metrics(report, stats=Broken()) == 0
    assert emit_gate_metrics(gate_run, collect_progress(gate_run, IDS, per_shard=True), stats=Broken()) == 0
    assert emit_report_metrics({"run_id": "x"}, stats=Recorder()) == 0  # not a report: KeyError, logged
    unplanned = RunStore(RunLayout(gate_run.layout.output_root, "never_planned", "dag_m"))
    assert emit_gate_metrics(unplanned, {"shards": {}}, stats=Recorder()) == 0
    warnings = [r.getMessage() for r in caplog.records]
    assert sum("RuntimeError: collector down" in w for w in warnings) == 2
    assert any("FileNotFoundError" in w for w in warnings) and any("KeyError" in w for w in warnings)
