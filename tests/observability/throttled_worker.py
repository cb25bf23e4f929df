"""``BATCH_WORKER_COMMAND`` of the observability suite: the real worker, slowed or failed per run.

Called as ``throttled_worker.py run --run-dir <run_dir> --shard <id> ...`` (the local runner appends the
worker's arguments). By the run dir's DAG id:

- ``*_slow``: start ``python -m batch_worker`` at full speed; once the shard's ``_PROGRESS.json`` shows
  rows done (a real rate exists), run it 5% of the time (SIGSTOP/SIGCONT, a GPU many times slower) until
  the file named by ``OBS_ALERT_FILE`` holds a ``deadline_missed`` alert for this run, then at full
  speed to the end. The run so misses its deadline while its shard is running.
- ``*_fail``: shard ``00001`` exits 2 (bad input, never retried): the run ends below
  ``min_success_ratio``.
- anything else: the worker as is.

Exits with the worker's exit code.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

DUTY_RUN_S = 0.05
DUTY_PERIOD_S = 1.0
MAX_THROTTLE_S = 600.0


def _arg(args: list[str], name: str) -> str:
    return args[args.index(name) + 1] if name in args else ""


def _has_rows(progress: Path) -> bool:
    try:
        return json.loads(progress.read_text()).get("rows_done", 0) > 0
    except (OSError, ValueError):
        return False


def _alerted(run_id: str) -> bool:
    path = Path(os.environ.get("OBS_ALERT_FILE", "/nonexistent"))
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return False
    return any(json.loads(line).get("kind") == "deadline_missed" and json.loads(line).get("run_id") == run_id
               for line in lines if line.strip())


def _throttle(proc: subprocess.Popen, progress: Path, run_id: str) -> None:
    while proc.poll() is None and not _has_rows(progress):
        time.sleep(0.1)
    end = time.monotonic() + MAX_THROTTLE_S
    while proc.poll() is None and time.monotonic() < end and not _alerted(run_id):
        time.sleep(DUTY_RUN_S)
        proc.send_signal(signal.SIGSTOP)
        time.sleep(DUTY_PERIOD_S - DUTY_RUN_S)
        proc.send_signal(signal.SIGCONT)


def main(args: list[str]) -> int:
    run_dir, shard = _arg(args, "--run-dir"), _arg(args, "--shard")
    dag_id, run_id = Path(run_dir).parent.name, Path(run_dir).name
    if dag_id.endswith("_fail") and shard == "00001":
        print(f"throttled_worker: shard {shard} of {run_id} fails as planned (exit 2)", file=sys.stderr)
        return 2
    proc = subprocess.Popen([sys.executable, "-m", "batch_worker", *args])
    if dag_id.endswith("_slow"):
        try:
            _throttle(proc, Path(run_dir) / "shards" / shard / "_PROGRESS.json", run_id)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
    return proc.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
