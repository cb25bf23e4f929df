"""The report and progress over gs:// (real fake-gcs-server): same figures as the local run."""

from __future__ import annotations

import json
from pathlib import Path

import gcs_fixture
import pytest
import test_report as synthetic
from batch_contract import storage
from batch_contract.layout import RunLayout
from batch_inference.progress import collect_progress
from batch_inference.report import build_report, validate_report

fake_gcs, gcs_bucket = gcs_fixture.fake_gcs, gcs_fixture.gcs_bucket

pytestmark = pytest.mark.integration


def _upload_tree(local_root: Path, gs_root: str) -> None:
    for path in sorted(p for p in local_root.rglob("*") if p.is_file()):
        storage.write_create_only(f"{gs_root}/{path.relative_to(local_root).as_posix()}", path.read_bytes())


def test_report_and_progress_on_gcs(tmp_path, gcs_bucket):
    synthetic.make_run(tmp_path, "gcs_run", preempted=True)
    gs_root = f"{gcs_bucket}/out"
    _upload_tree(tmp_path, gs_root)
    layout = RunLayout(gs_root, "gcs_run")
    report = build_report(layout.run_dir, dag_id=synthetic.DAG_ID, publish_summary=synthetic.PUBLISH,
                          cost_params=synthetic.COST)
    validate_report(report)
    assert report["cost_per_million_rows_usd"] == pytest.approx(0.132 / 9 * 1e6)
    assert report["counterfactuals"]["padding"]["tokens_padded"] == pytest.approx(132.8 + 64)  # n_tokens read
    assert report["attempts"]["killed"] == 1  # attempt record listed under attempts/ on GCS
    assert json.loads(storage.read_bytes(layout.report_json_uri)) == report
    assert storage.read_bytes(layout.report_html_uri).startswith(b"<!DOCTYPE html>")
    progress = collect_progress(layout.run_dir, ["00000", "00001"])
    assert (progress["completed"], progress["rows_done"], progress["rows_total"]) == (2, 10, 10)
