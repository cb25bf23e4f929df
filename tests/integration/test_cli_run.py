"""The real ``python -m batch_inference.cli run`` (``make run``): a plan error reaches the terminal with
its own message and a non-zero exit; the Param flags fix it; progress lines show while it runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.dagrun]

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "data" / "sample" / "debian_descriptions_sample.parquet"


def _cli(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "BATCH_CLI_AIRFLOW_HOME": str(tmp_path / "airflow_home"),
           "PYTHONPATH": os.pathsep.join([str(REPO / "plugins"), str(REPO / "worker_image")])}
    return subprocess.run([sys.executable, "-m", "batch_inference.cli", "run", *argv, "--progress-interval", "1"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def test_renamed_columns_fail_with_the_planner_message_then_run_with_the_flags(tmp_path: Path) -> None:
    table = pq.read_table(SAMPLE).slice(0, 20)
    renamed = pa.table({"key": table["id"], "body": table["text"]})
    pq.write_table(renamed, tmp_path / "renamed.parquet")
    common = ("--input", str(tmp_path / "renamed.parquet"), "--output", str(tmp_path / "out"),
              "--rows-per-shard", "10")

    failed = _cli(tmp_path, *common)
    assert failed.returncode != 0
    assert "run failed: task plan: PlanError: id_column: column 'id' is missing" in failed.stderr, failed.stderr
    assert "its columns are: key, body" in failed.stderr
    assert "task plan: FAILED" in failed.stdout

    done = _cli(tmp_path, *common, "--id-column", "key", "--text-column", "body")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "task infer_local[0]: started" in done.stdout
    assert "shard 00000: complete, 10 rows ok" in done.stdout and "  run: shards 2/2 complete" in done.stdout
    assert done.stdout.strip().splitlines()[-1].endswith("/report.json")
