"""The worker's SIGTERM contract, at every point of its life: exit 75 after committing what it finished,
nothing lost or duplicated on resume (``batch_worker.signals``, docs/reliability.md).

Real worker processes (``python -m batch_worker``, the real MiniLM) are sent SIGTERM at points of a seeded
loop: during the imports (once the handler is installed: ``SigCgt`` in ``/proc/<pid>/status``), during
the model load (its attempt record just written), right after a commit and inside a batch; the shard is
resumed after each until an unsignalled attempt completes it. Where ``unshare`` can make a PID namespace,
each process runs as its PID 1, as in a container: the kernel drops a SIGTERM that PID 1 has no handler
for, so a missing handler would show as an attempt that runs on instead of exiting 75. The canary
(``batch-worker canary``) is checked the same way: 75 with the finished slices committed, no
``canary.json``, and a rerun that completes with every id committed once.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from batch_contract import storage
from batch_contract.enums import ExitCode
from batch_contract.layout import chunk_of, join_uri
from batch_contract.marker import AttemptRecord

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import chaos_lib  # noqa: E402

pytestmark = pytest.mark.integration

ROWS = 40
CHUNK_ROWS = 5
TIMEOUT = 240.0
"""Seconds any one process may take (a hang fails the test; the grace watchdog is 20 s)."""
HANDLER_TIMEOUT = 60.0
"""Seconds a process may take to install its SIGTERM handler (the entry does it before heavy imports)."""


def _can_unshare() -> bool:
    if shutil.which("unshare") is None:
        return False
    try:
        return subprocess.run(["unshare", "--pid", "--fork", "--kill-child", "true"], capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


PID1 = _can_unshare()


class Worker:
    """One ``python -m batch_worker ARGS`` process (as PID 1 of its own PID namespace when :data:`PID1`)."""

    def __init__(self, args: list[str], log: Path) -> None:
        prefix = ["unshare", "--pid", "--fork", "--kill-child"] if PID1 else []
        self.log = log
        with open(log, "wb") as fh:
            self.proc = subprocess.Popen([*prefix, sys.executable, "-m", "batch_worker", *args],
                                         env=chaos_lib.worker_env(), stdout=fh, stderr=subprocess.STDOUT, cwd=REPO)
        self.pid = self._python_pid() if PID1 else self.proc.pid

    def _python_pid(self) -> int:
        """The Python process's pid as seen here (``unshare``'s only child)."""
        deadline = time.monotonic() + 30
        path = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        while time.monotonic() < deadline:
            children = path.read_text().split() if path.exists() else []
            if children:
                return int(children[0])
            time.sleep(0.005)
        raise AssertionError("unshare started no child")

    def handles_sigterm(self) -> bool:
        """Whether the process has a SIGTERM handler installed (``SigCgt`` bit)."""
        return chaos_lib.handles_sigterm(self.pid) is True

    def wait_until(self, predicate, what: str, timeout: float = TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert self.proc.poll() is None, f"exited {self.proc.returncode} before {what}; log {self.log}"
            assert time.monotonic() < deadline, f"no {what} in {timeout} s; log {self.log}"
            time.sleep(0.002)

    def term(self) -> None:
        os.kill(self.pid, signal.SIGTERM)

    def wait(self) -> int:
        code = self.proc.wait(timeout=TIMEOUT)
        text = self.log.read_text(errors="replace")
        assert "terminate called" not in text and "Traceback" not in text, text[-3000:]
        return code


def _chunk_files(shard_dir: str) -> set[str]:
    return {n for n in storage.list_names(shard_dir) if chunk_of(n) is not None} if storage.exists(shard_dir) else set()


def _attempt_names(layout) -> set[str]:
    adir = layout.attempts_dir(chaos_lib.SHARD)
    return {n for n in storage.list_names(adir) if n.endswith(".json")} if storage.exists(adir) else set()


@pytest.fixture(scope="module")
def chaos_input(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, set[str]]:
    src = tmp_path_factory.mktemp("sigterm") / "input.parquet"
    table = chaos_lib.make_chaos_input(src, ROWS, seed=11)
    bad = {r[0] for r in chaos_lib.BAD_ROWS}
    return src, {i for i in table.column("id").to_pylist() if i not in bad}


def test_sigterm_at_any_point_exits_75_and_resumes_exactly_once(chaos_input, tmp_path: Path) -> None:
    src, good_ids = chaos_input
    layout = chaos_lib.write_manifest(tmp_path, "sigterm", src, chunk_rows=CHUNK_ROWS)
    shard_dir = layout.shard_dir(chaos_lib.SHARD)
    rng = random.Random(27)
    args = ["run", "--run-dir", layout.run_dir, "--shard", chaos_lib.SHARD]
    phases = ["imports", "model_load", "after_commit", "mid_batch"]
    signalled: dict[str, str] = {}
    for n, phase in enumerate(phases):
        files, attempts = _chunk_files(shard_dir), _attempt_names(layout)
        w = Worker(args, tmp_path / f"attempt-{n}-{phase}.log")
        if phase == "imports":  # the handler is in, torch and pyarrow are still loading
            w.wait_until(w.handles_sigterm, "SIGTERM handler", HANDLER_TIMEOUT)
            time.sleep(rng.uniform(0.0, 0.3))
        elif phase == "model_load":
            w.wait_until(lambda: _attempt_names(layout) - attempts, "attempt record")  # noqa: B023 - before the load
        else:
            w.wait_until(lambda: _chunk_files(shard_dir) - files, "commit")  # noqa: B023
            if phase == "mid_batch":
                time.sleep(rng.uniform(0.0, 0.5))
        w.term()
        code = w.wait()
        assert code == int(ExitCode.INTERRUPTED), f"{phase}: exit {code}; log {w.log}"
        assert not storage.exists(join_uri(shard_dir, "_SUCCESS.json")), f"{phase}: the shard is not complete yet"
        new = _attempt_names(layout) - attempts
        if new:  # the attempt record says what happened (none yet when the signal beat it)
            (name,) = new
            rec = AttemptRecord.from_json_bytes(storage.read_bytes(join_uri(layout.attempts_dir(chaos_lib.SHARD), name)))
            assert (rec.status, rec.exit_code) == ("interrupted", 75), (phase, rec)
            signalled[phase] = name
        else:
            assert phase == "imports", f"{phase}: no attempt record"
    assert set(signalled) == {"model_load", "after_commit", "mid_batch"}, "the handler came before the imports"

    last = Worker(args, tmp_path / "attempt-final.log")
    assert last.wait() == 0
    out = chaos_lib.read_shard(shard_dir)
    assert set(out.id_counts) == good_ids and set(out.id_counts.values()) == {1}, "every id exactly once"
    assert len(out.dead_counts) == len(chaos_lib.BAD_ROWS) and set(out.dead_counts.values()) == {1}
    assert out.marker is not None and (out.marker.rows_ok, out.marker.rows_dead_letter) == (ROWS, len(chaos_lib.BAD_ROWS))
    assert len(out.part_chunks) == len(set(out.part_chunks)), "no chunk committed twice"


CANARY_ROWS = 150
"""Rows of the canary test's shard, all sampled: after the first small slice, seconds of work are left,
so the mid-sample signal lands inside the sample even when this process is descheduled for a while."""


def test_canary_sigterm_exits_75_keeps_committed_slices_and_a_rerun_completes(tmp_path: Path) -> None:
    src = tmp_path / "canary-input.parquet"
    table = chaos_lib.make_chaos_input(src, CANARY_ROWS, seed=12)
    good_ids = set(table.column("id").to_pylist()) - {r[0] for r in chaos_lib.BAD_ROWS}
    layout = chaos_lib.write_manifest(tmp_path, "canary", src, chunk_rows=CHUNK_ROWS)
    shard_dir = layout.shard_dir(chaos_lib.SHARD)
    # small candidates: a warm-up slice and several trial slices, each committed into the shard
    args = ["canary", "--run-dir", layout.run_dir, "--min-rows", str(CANARY_ROWS), "--search", "candidates",
            "--candidates", "256,512,1024", "--no-profile"]
    canary_json = Path(layout.canary_uri)

    early = Worker(args, tmp_path / "canary-early.log")  # while it imports and loads
    early.wait_until(early.handles_sigterm, "SIGTERM handler", HANDLER_TIMEOUT)
    time.sleep(0.2)
    early.term()
    assert early.wait() == int(ExitCode.INTERRUPTED)
    assert not canary_json.exists() and not _chunk_files(shard_dir)

    mid = Worker(args, tmp_path / "canary-mid.log")  # once its first slice is committed
    mid.wait_until(lambda: _chunk_files(shard_dir), "a committed slice")
    mid.term()
    assert mid.wait() == int(ExitCode.INTERRUPTED)
    assert not canary_json.exists(), "an interrupted canary writes no canary.json"
    kept = chaos_lib.read_shard(shard_dir)
    assert kept.id_counts and set(kept.id_counts.values()) == {1}

    rerun = Worker(args, tmp_path / "canary-rerun.log")
    assert rerun.wait() == 0 and canary_json.exists()
    after = chaos_lib.read_shard(shard_dir)
    assert set(after.id_counts.values()) == {1}, "the rerun left the committed rows out of its sample"
    assert set(kept.id_counts) < set(after.id_counts) <= good_ids
