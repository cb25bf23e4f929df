"""``batch_worker.__main__.run`` (``python -m batch_worker``, the ``batch-worker`` script): the exit code is
``main``'s and every log line reaches stderr although the process leaves with ``os._exit``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "plugins"), str(REPO / "worker_image")])}


def test_entry_exits_with_mains_code_and_flushes_its_log(tmp_path: Path) -> None:
    missing = tmp_path / "runs" / "nope"
    proc = subprocess.run([sys.executable, "-m", "batch_worker", "run", "--run-dir", str(missing), "--shard", "00000"],
                          env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "bad config or input (exit 2)" in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.endswith("\n")


def test_entry_keeps_argparse_exits(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", "from batch_worker.__main__ import run; run(['--help'])"],
                          env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "usage" in proc.stdout
