"""Attempt accounting: a killed attempt counts the seconds and rows of its last progress tick."""

from __future__ import annotations

import time

from batch_inference.report.attempts import attempt_seconds, summarize_attempts
from batch_worker.stats import StageClock


def test_killed_attempt_is_accounted_from_its_last_tick() -> None:
    killed = {"attempt_id": "a1", "status": "running", "exit_code": None, "started_at": "2026-12-01T00:00:00+00:00",
              "updated_at": "2026-12-01T00:00:12.5+00:00", "stage_seconds": {}, "rows_processed": 40,
              "rows_committed": 16}
    ok = {"attempt_id": "a2", "status": "complete", "exit_code": 0, "stage_seconds": {"inference": 3.0},
          "rows_processed": 84, "rows_committed": 84}
    summary = summarize_attempts([killed, ok], shard_complete=True)
    first = summary["list"][0]
    assert (first["outcome"], first["seconds"], first["rows_redone"]) == ("killed", 12.5, 24)
    assert summary["list"][1]["seconds"] == 3.0
    old = {"status": "running", "exit_code": None, "stage_seconds": {"model_load": 2.0}}  # before updated_at
    assert attempt_seconds(old, "killed") == 2.0


def test_stage_clock_snapshot_includes_the_open_stage() -> None:
    clock = StageClock()
    with clock.stage("inference"):
        time.sleep(0.02)
        assert clock.rounded()["inference"] == 0.0
        assert clock.rounded(include_open=True)["inference"] >= 0.02
    assert clock.rounded()["inference"] >= 0.02
