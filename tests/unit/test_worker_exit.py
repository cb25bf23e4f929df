"""How the worker process ends (``batch_worker.signals.leave``): its decided exit code, whatever signal
arrives while it exits, and no interpreter finalization. Small real processes, no model."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from batch_contract.engine_config import WorkerSettings
from batch_contract.enums import ExitCode
from batch_worker import signals

REPO = Path(__file__).resolve().parents[2]

# installs the handler as the entry does; "exiting" is printed once the exit code is decided and a slow
# atexit callback (the place where interpreter clean-up takes seconds) runs; a __del__ at finalization
# would print "finalized"
CHILD = """
import atexit, sys, time
from batch_worker.signals import StopSignal, leave
stop = StopSignal(float(sys.argv[2])).install()
class Finalized:
    def __del__(self):
        print("finalized", flush=True)
keep = Finalized()
atexit.register(time.sleep, 3.0)
atexit.register(print, "exiting", flush=True)
if sys.argv[1] == "signal-first":
    print("ready", flush=True)
    while not stop.requested:
        time.sleep(0.01)
leave(int(sys.argv[3]), stop)
"""


def _child(mode: str, code: int, grace: float = 20.0) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "plugins"), str(REPO / "worker_image")])}
    return subprocess.Popen([sys.executable, "-c", CHILD, mode, str(grace), str(code)], env=env,
                            stdout=subprocess.PIPE, text=True)


def _wait_for(proc: subprocess.Popen, line: str) -> None:
    got = proc.stdout.readline().strip()
    assert got == line, got


def test_the_literal_exit_code_and_grace_match_the_contract() -> None:
    assert signals.EXIT_INTERRUPTED == int(ExitCode.INTERRUPTED)
    assert signals.DEFAULT_GRACE_SECONDS == WorkerSettings().grace_seconds


@pytest.mark.parametrize("code", [0, 75])
def test_a_signal_while_exiting_keeps_the_decided_code(code: int) -> None:
    """Python's own exit restores the default SIGTERM action before it tears modules down: a SIGTERM then
    ended the process with -15. ``leave`` keeps the handler, which exits with the decided code."""
    proc = _child("exit", code)
    _wait_for(proc, "exiting")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == code
    assert "finalized" not in proc.stdout.read(), "no interpreter finalization after leave"


def test_after_a_signal_the_exit_is_75_without_finalization() -> None:
    proc = _child("signal-first", 75)
    _wait_for(proc, "ready")
    proc.send_signal(signal.SIGTERM)
    _wait_for(proc, "exiting")
    assert proc.wait(timeout=60) == 75
    assert "finalized" not in proc.stdout.read()


def test_the_grace_watchdog_exits_75_when_the_work_does_not_stop() -> None:
    """A stop that is never honoured (here: the child waits for nothing but its exit) still ends in 75."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "plugins"), str(REPO / "worker_image")])}
    code = ("import time\nfrom batch_worker.signals import StopSignal\nstop = StopSignal(30.0).install()\n"
            "stop.configure(1.0)\nprint('ready', flush=True)\ntime.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    _wait_for(proc, "ready")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 75
