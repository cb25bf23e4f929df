"""The independent report check (``tests/report_reference.py``) on a real report of a small real run.

The run goes through the real worker runtime (``batch_worker.runtime.run_shard``; the tiny deterministic
engine of ``test_worker_runtime`` stands in for the model, so no torch), one shard interrupted by SIGTERM
and resumed (two attempt records), dead letters (null text, blank text, a duplicate id, a rejected row),
the real DuckDB publish and the real ``build_report``. The check must pass on that report and fail on
each kind of perturbation of it.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import test_report as synthetic
from batch_contract.enums import ExitCode
from batch_inference.publish import PublishTarget, publish_run
from batch_inference.report import build_report
from batch_worker import runtime
from report_reference import ReportMismatch, check_report, documented_prices, schema_errors
from run_helpers import write_run
from test_worker_runtime import TinyEngine

COST = {"accelerator": "nvidia-l4", "gpu_count": 2, "pricing": "spot", "spot_usd_per_gpu_hour": 1.8,
        "on_demand_usd_per_gpu_hour": 3.6, "publish_usd_per_hour": 0.36}


@pytest.fixture
def real_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``report.json`` of a two-shard run: worker runtime, publish, build_report (see module docstring)."""
    monkeypatch.setattr(runtime, "engine_class", lambda kind: TinyEngine)
    monkeypatch.setattr(TinyEngine, "drop_one", False)
    monkeypatch.setattr(TinyEngine, "rows_seen", 0, raising=False)
    rng = np.random.default_rng(7)
    n = 40
    ids = [int(x) for x in rng.permutation(1000)[:n]]
    texts = ["x" * int(k) + f" row{i}" for i, k in enumerate(rng.integers(1, 20, n))]
    texts[3], texts[11], texts[25] = None, "  ", "please REJECT me"
    ids[30] = ids[22]  # duplicate id within shard 00001
    pq.write_table(pa.table({"id": ids, "text": texts}), tmp_path / "in.parquet")
    run_dir = write_run(tmp_path / "out", tmp_path / "in.parquet", shards=2,
                        worker={"chunk_rows": 6, "grace_seconds": 30})
    monkeypatch.setattr(TinyEngine, "signal_after_rows", 8)  # SIGTERM mid second chunk of shard 00000
    assert runtime.run_shard(run_dir, "00000") == ExitCode.INTERRUPTED
    for shard in ("00000", "00001"):
        assert runtime.run_shard(run_dir, shard) == ExitCode.OK
    summary = publish_run(run_dir, PublishTarget(backend="duckdb", table="emb", duckdb_path=str(tmp_path / "w.db")))
    report = build_report(run_dir, dag_id="reference_dag", publish_summary=summary, cost_params=COST,
                          write_html=False)
    assert report["attempts"]["preemptions"] == 1 and report["rows_dead_letter"] == 4
    assert report["worker_seconds"] > 0 and report["stage_seconds"]["write"] > 0  # (the tiny engine's
    # inference rounds to 0 ms)
    return Path(run_dir) / "report.json"


def test_check_passes_on_a_real_report(real_report: Path) -> None:
    ref = check_report(real_report, cost_params=COST)
    report = json.loads(real_report.read_text())
    assert ref.checked_files and ref.price_origin == "cost_params"
    assert (ref.rows_input, ref.rows_published, ref.rows_dead_letter) == (40, 36, 4)
    assert ref.cost_usd == pytest.approx(report["cost_usd"], rel=1e-9)
    # without the caller's prices the check takes the report's (user-given) ones and still recomputes
    assert check_report(real_report).price_origin == "report.cost.params"


def test_check_passes_on_the_synthetic_report_with_a_killed_attempt(tmp_path: Path) -> None:
    layout = synthetic.make_run(tmp_path, "synthetic", preempted=True)
    build_report(layout.run_dir, dag_id=synthetic.DAG_ID, publish_summary=synthetic.PUBLISH,
                 cost_params=synthetic.COST, write_html=False)
    ref = check_report(Path(layout.report_json_uri), cost_params=synthetic.COST)
    assert ref.cost_usd == pytest.approx(0.132) and ref.worker_seconds == pytest.approx(130.0)


def _scale(path: tuple[str, ...], factor: float) -> Callable[[dict], None]:
    def apply(report: dict) -> None:
        node = report
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = node[path[-1]] * factor
    return apply


def _set(path: tuple[str, ...], value: Any) -> Callable[[dict], None]:
    def apply(report: dict) -> None:
        node = report
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return apply


def _drop(key: str) -> Callable[[dict], None]:
    return lambda report: report.pop(key)


def _plus_one(key: str) -> Callable[[dict], None]:
    return lambda report: report.__setitem__(key, report[key] + 1)


PERTURBATIONS = {
    "rows_published+1": (_plus_one("rows_published"), "rows_published"),
    "rows_dead_letter+1": (_plus_one("rows_dead_letter"), "rows_dead_letter"),
    "rows_input+1": (_plus_one("rows_input"), "rows_input"),
    "worker_seconds*1.1": (_scale(("worker_seconds",), 1.1), "worker_seconds"),
    "write_seconds*1.1": (_scale(("stage_seconds", "write"), 1.1), "stage_seconds.write"),
    "cost_usd*1.1": (_scale(("cost_usd",), 1.1), "cost_usd"),
    "worker_usd*1.1": (_scale(("cost", "worker_usd"), 1.1), "cost.worker_usd"),
    "on_demand_cost*1.1": (_scale(("counterfactuals", "on_demand", "cost_usd"), 1.1),
                           "counterfactuals.on_demand.cost_usd"),
    "required_field_removed": (_drop("cost_per_million_rows_usd"), "'cost_per_million_rows_usd' is a required"),
    "nested_required_removed": (lambda r: r["cost"].pop("worker_usd"), "'worker_usd' is a required"),
    "rows_as_string": (_set(("rows_published",), "36"), "schema: /rows_published"),
    "cost_as_string": (lambda r: r.__setitem__("cost_usd", str(r["cost_usd"])), "schema: /cost_usd"),
    "price_changed": (_set(("cost", "params", "spot_usd_per_gpu_hour"), 1.9), "spot_usd_per_gpu_hour"),
}


@pytest.mark.parametrize("name", sorted(PERTURBATIONS))
def test_check_fails_on_a_perturbed_report(real_report: Path, name: str) -> None:
    perturb, expected = PERTURBATIONS[name]
    pristine = real_report.read_text()
    report = json.loads(pristine)
    perturb(report)
    real_report.write_text(json.dumps(report))
    with pytest.raises(ReportMismatch, match="problem") as err:
        check_report(real_report, cost_params=COST)
    assert expected in str(err.value)
    real_report.write_text(pristine)  # the autouse check then sees the real report again
    check_report(real_report, cost_params=COST)


def test_check_fails_when_the_files_disagree_with_the_report(real_report: Path) -> None:
    """The reference reads the files, not the report: a marker whose seconds or rows change is caught."""
    marker_path = real_report.parent / "shards" / "00001" / "_SUCCESS.json"
    pristine, stat = marker_path.read_text(), marker_path.stat()
    marker = json.loads(pristine)
    marker["stage_seconds"]["inference"] = marker["stage_seconds"].get("inference", 0.0) + 5.0
    marker["rows_ok"] += 1
    marker_path.write_text(json.dumps(marker))
    with pytest.raises(ReportMismatch, match="worker_seconds") as err:
        check_report(real_report, cost_params=COST)
    text = str(err.value)
    assert "attempt record" in text and "distinct ids in its part files" in text and "cost_usd" in text
    marker_path.write_text(pristine)
    os.utime(marker_path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # not "changed after the report"


def test_check_fails_on_other_prices_than_the_callers(real_report: Path) -> None:
    with pytest.raises(ReportMismatch, match="gpu_count"):
        check_report(real_report, cost_params={**COST, "gpu_count": 1})


def test_a_moved_report_is_not_this_runs(real_report: Path, tmp_path: Path) -> None:
    other = tmp_path / "elsewhere" / "runs" / "other_run"
    shutil.copytree(real_report.parent, other)
    with pytest.raises(ReportMismatch, match="run_id"):
        check_report(other / "report.json", cost_params=COST)
    shutil.rmtree(tmp_path / "elsewhere")


def test_schema_and_price_table_are_read() -> None:
    assert schema_errors({})[0].startswith("schema: /: ")
    assert documented_prices()["nvidia-l4"] == (0.30, 0.75)
