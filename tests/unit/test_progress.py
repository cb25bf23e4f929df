"""Live progress from synthetic markers and progress objects (batch-API style counts, rows/s, ETA)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from batch_contract.engine_config import EncoderConfig
from batch_contract.layout import RunLayout
from batch_contract.manifest import InputFile, InputSpec, Manifest, Segment, ShardSpec
from batch_contract.marker import ShardMarker, ShardProgress
from batch_inference.progress import STALE_AFTER_SECONDS, collect_progress, format_progress

NOW = datetime(2026, 11, 30, 2, 0, 0, tzinfo=UTC)
IDS = ["00000", "00001", "00002", "00003", "00004", "00005"]


def _write(uri: str, data: bytes) -> None:
    Path(uri).parent.mkdir(parents=True, exist_ok=True)
    Path(uri).write_bytes(data)


@pytest.fixture()
def run(tmp_path) -> RunLayout:
    """6 shards of 100 rows: 2 complete, 1 running, 1 failed, 1 stale, 1 pending (manifest only)."""
    layout = RunLayout(str(tmp_path), "progress_run", "dag_a")
    spec = InputSpec(uri="in.parquet", format="parquet", id_column="id", text_column="text",
                     files=[InputFile(uri="in.parquet", rows=600)])
    shards = [ShardSpec(sid, [Segment(0, 100 * i, 100 * (i + 1))]) for i, sid in enumerate(IDS)]
    _write(layout.manifest_uri, Manifest(run_id="progress_run", input=spec, shards=shards,
                                         engine=EncoderConfig().to_dict()).to_json_bytes())
    for sid, dead in (("00000", 0), ("00001", 3)):
        marker = ShardMarker(run_id="progress_run", shard_id=sid, fingerprint="fp", rows_input=100,
                             rows_ok=100 - dead, rows_dead_letter=dead)
        _write(layout.marker_uri(sid), marker.to_json_bytes())
    fresh = "2026-11-30T01:59:55+00:00"
    old = "2026-11-30T01:50:00+00:00"  # 600 s before NOW > STALE_AFTER_SECONDS
    for sid, status, done, rate, updated in (("00002", "running", 40, 20.0, fresh),
                                             ("00003", "failed", 10, 0.0, fresh),
                                             ("00004", "running", 50, 30.0, old)):
        prog = ShardProgress(sid, status, 100, done, 1, rate, None, updated)
        _write(layout.progress_uri(sid), prog.to_json_bytes())
    return layout


def test_counts_rows_rate_and_eta(run):
    s = collect_progress(run.run_dir, IDS, now=NOW)
    assert (s["total"], s["completed"], s["failed"], s["running"], s["pending"], s["stale"]) == (6, 2, 1, 1, 1, 1)
    assert s["rows_total"] == 600
    assert s["rows_done"] == 200 + 40 + 10 + 50
    assert s["rows_dead_letter"] == 3 + 1 + 1 + 1
    assert s["rows_per_s"] == pytest.approx(20.0)  # the stale shard's rate is not counted
    assert s["eta_s"] == pytest.approx((600 - 300) / 20.0)
    assert s["fraction_done"] == pytest.approx(0.5)
    assert s["missing"] == IDS[2:] and s["failed_ids"] == ["00003"] and s["stale_ids"] == ["00004"]
    assert STALE_AFTER_SECONDS < 600


def test_format_progress_one_line(run):
    line = format_progress(collect_progress(run.run_dir, IDS, now=NOW))
    assert "\n" not in line
    assert line.startswith("20.0 rows/s | ETA 15s | rows 300/600 (50.0%)")
    assert "shards 2/6 completed, 1 failed, 1 running, 1 pending, 1 stale" in line
    assert "waiting on 00002, 00003, 00004, 00005" in line


def test_all_done_and_nothing_started(run, tmp_path):
    done = collect_progress(run.run_dir, IDS[:2], now=NOW)
    assert (done["completed"], done["missing"], done["eta_s"]) == (2, [], None)
    assert "waiting" not in format_progress(done)
    empty = RunLayout(str(tmp_path / "other"), "no_manifest")
    s = collect_progress(empty.run_dir, ["00000", "00001"], now=NOW)
    assert (s["pending"], s["rows_total"], s["fraction_done"]) == (2, None, None)
    assert "rows 0/?" in format_progress(s)
