"""The ``local`` runner: the shard's worker command as a subprocess, with the pod's exit-code semantics.

``batch-worker run --run-dir <run_dir> --shard <id>`` runs in the worker environment (``BATCH_WORKER_COMMAND``,
default ``[sys.executable, "-m", "batch_worker"]``). Exit codes map exactly as in a pod
(:class:`batch_contract.enums.ExitCode`): 0 done; 75 interrupted -> retryable failure; 2 bad input ->
failure that no retry can fix; anything else -> retryable failure. A shard whose marker is already in
storage is not run again (storage is the truth).

Parallelism on one machine is bounded by ``parallelism`` slot locks (``fcntl.flock`` on files under a
per-run lock directory), so many mapped tasks can be queued while only N workers run. Each worker gets
``max(1, cores // parallelism)`` threads (:func:`worker_thread_env`: ``OMP_NUM_THREADS``,
``MKL_NUM_THREADS``, ``BATCH_WORKER_THREADS``, ``RAYON_NUM_THREADS``), so N workers do not each start
torch with every core's threads and fight over them; ``parallelism`` 0 means
:func:`auto_parallelism` (cores // threads per worker).
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from batch_contract.enums import ExitCode
from batch_contract.layout import RunLayout
from batch_contract.runstore import RunStore, is_complete

from batch_inference.pod_spec import worker_arguments

log = logging.getLogger(__name__)

KILL_GRACE_SECONDS = 30.0
"""After forwarding SIGTERM, how long the runner waits before SIGKILL (above the worker's 25 s grace)."""


THREADS_ENV = "BATCH_WORKER_THREADS"
"""Threads per worker: set by the runner for each worker (the worker applies it with
``torch.set_num_threads`` and records it); set by the operator (or ``OMP_NUM_THREADS``), it fixes the
threads per worker."""
DEFAULT_THREADS_PER_WORKER = 4
"""Threads one CPU worker uses well (intra-op scaling flattens beyond this for small encoders)."""


def machine_cores() -> int:
    """CPU cores this process may run on (its affinity mask, else ``os.cpu_count()``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def auto_parallelism(cores: int | None = None, environ: dict[str, str] | None = None) -> int:
    """Workers that fit the machine: ``cores // threads per worker``, at least 1. Threads per worker:
    what the operator fixed (:func:`_operator_threads`), else ``min(DEFAULT_THREADS_PER_WORKER,
    max(1, cores // 2))``, so a machine with 2+ cores runs at least 2 workers (one loads its model or
    reads while the other infers; measured on 2 cores, 3 x 150 rows: 1 worker x 2 threads 21.2 s,
    2 x 1 thread 15.2 s). 1 core -> 1; 2 -> 2; 8 -> 2; 16 -> 4."""
    cores = cores or machine_cores()
    per_worker = _operator_threads(environ) or min(DEFAULT_THREADS_PER_WORKER, max(1, cores // 2))
    return max(1, cores // per_worker)


def _operator_threads(environ: dict[str, str] | None = None) -> int:
    """Threads per worker the operator fixed: ``BATCH_WORKER_THREADS``, else ``OMP_NUM_THREADS``; 0: none."""
    env = os.environ if environ is None else environ
    for name in (THREADS_ENV, "OMP_NUM_THREADS"):
        raw = env.get(name, "").strip()
        if raw.isdigit() and int(raw) > 0:
            return int(raw)
    return 0


def worker_threads(parallelism: int, cores: int | None = None, environ: dict[str, str] | None = None) -> int:
    """Threads for each of ``parallelism`` workers: what the operator fixed (``BATCH_WORKER_THREADS``,
    else ``OMP_NUM_THREADS``), else ``max(1, cores // parallelism)``."""
    return _operator_threads(environ) or max(1, (cores or machine_cores()) // max(1, parallelism))


def worker_thread_env(threads: int) -> dict[str, str]:
    """Environment that caps a worker's threads: OpenMP/MKL (torch's CPU pools), the worker's own
    setting, and the tokenizers' Rayon pool (off for one thread)."""
    n = str(threads)
    return {"OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, THREADS_ENV: n, "RAYON_NUM_THREADS": n,
            "TOKENIZERS_PARALLELISM": "true" if threads > 1 else "false"}


class ShardRetryableError(RuntimeError):
    """The worker was interrupted (75) or failed unexpectedly (1, signals): retry the shard."""


class ShardNotStartedError(RuntimeError):
    """The shard's worker was not started: the caller's ``may_start`` check refused (a budget stop)."""


class ShardBadInputError(RuntimeError):
    """The worker exited 2: config or input no retry can fix (the worker log names the field/row)."""


@dataclass(frozen=True)
class ShardResult:
    """Outcome of one local shard run. ``seconds``: wall time of the subprocess (0 when skipped)."""

    shard_id: str
    exit_code: int
    seconds: float
    skipped: bool
    rows_ok: int
    rows_dead_letter: int

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def worker_command() -> list[str]:
    """The worker command prefix: ``shlex.split($BATCH_WORKER_COMMAND)`` or ``python -m batch_worker``."""
    raw = os.environ.get("BATCH_WORKER_COMMAND", "").strip()
    return shlex.split(raw) if raw else [sys.executable, "-m", "batch_worker"]


def _lock_dir(run_dir: str) -> Path:
    layout = RunLayout.from_run_dir(run_dir)  # one slot set per run of a DAG (two DAGs may share a run id)
    name = f"{layout.dag_id}.{layout.run_id}" if layout.dag_id else layout.run_id
    path = Path(tempfile.gettempdir()) / "batch-inference-slots" / name
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def parallelism_slot(run_dir: str, parallelism: int, poll_seconds: float = 0.5) -> Iterator[int]:
    """Hold one of ``parallelism`` slot locks of the run while the body runs; yields the slot number.

    The locks are advisory ``flock`` locks, released by the kernel if the holder dies.
    """
    lock_dir = _lock_dir(run_dir)
    while True:
        for slot in range(parallelism):
            fh = open(lock_dir / f"slot-{slot}.lock", "w")  # noqa: SIM115 - held for the body
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                fh.close()
                continue
            try:
                yield slot
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)
                fh.close()
            return
        time.sleep(poll_seconds)


_WORKER_TIME_RE = re.compile(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2},\d{3} ")
"""The worker's own timestamp at the start of its log lines (the task log adds its own)."""
BAD_INPUT_MARK = "bad config or input (exit 2): "
"""What the worker logs before exiting 2 (``batch_worker.cli``); the text after it is the cause."""
_FIXES = (
    ("engine.model_path", "fix the model Param (CLI --model; params.model) to a local model directory with "
                          "config.json, then trigger a new run"),
    ("engine.", "fix the engine_options Param (CLI --engine-options JSON) field it names, then trigger a new run"),
    ("column", "fix the id_column / text_column Param (CLI --id-column / --text-column) or the input, then "
               "trigger a new run"),
    ("manifest", "the run's manifest is missing or invalid: trigger a new run (it plans again)"),
)


def bad_input_fix(cause: str) -> str:
    """How to fix a worker's exit-2 ``cause`` (the field its message starts with), in words."""
    for needle, fix in _FIXES:
        if needle in cause:
            return fix
    return "fix the Param or input it names, then trigger a new run"


def _stream(proc: subprocess.Popen, prefix: str, errors: list[str] | None = None) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        log.info("%s %s", prefix, _WORKER_TIME_RE.sub("", line.rstrip()))
        if errors is not None and BAD_INPUT_MARK in line:
            errors.append(line.split(BAD_INPUT_MARK, 1)[1].strip())


def _run_subprocess(cmd: list[str], prefix: str, env: dict[str, str] | None = None,
                    errors: list[str] | None = None) -> int:
    """Run ``cmd`` streaming its output to the log (the worker's exit-2 causes appended to ``errors``);
    forward SIGTERM to it and wait for its grace."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", bufsize=1, env=env)
    previous = signal.getsignal(signal.SIGTERM)

    def forward(signum, frame):  # the task was asked to stop: let the worker commit, then stop
        log.warning("%s forwarding SIGTERM to worker pid %d", prefix, proc.pid)
        proc.send_signal(signal.SIGTERM)

    in_main = _in_main_thread()
    if in_main:
        signal.signal(signal.SIGTERM, forward)
    try:
        _stream(proc, prefix, errors)
        return proc.wait()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=KILL_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if in_main:
            signal.signal(signal.SIGTERM, previous)


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def run_shard(run_dir: str, shard_id: str, *, parallelism: int = 1,
              may_start: Callable[[], str | None] | None = None) -> ShardResult:
    """Run the worker for one shard unless its marker already exists.

    Args:
        run_dir: ``<output_root>/runs/<run_id>`` (local path or ``gs://``).
        shard_id: five-digit shard id.
        parallelism: how many local shards may run at once on this machine; 0: :func:`auto_parallelism`.
        may_start: asked once this shard holds its parallelism slot, right before its worker would start
            (so it sees what the shards that held the slot before it committed): a message refuses the
            start (the in-run budget stop: ``batch_inference.budget.over_budget_message``); ``None`` or
            no callable: start.

    Returns:
        :class:`ShardResult` with the marker's row counts.

    Raises:
        ShardNotStartedError: ``may_start`` refused (do not retry).
        ShardBadInputError: exit code 2 (do not retry).
        ShardRetryableError: exit code 75, 1, any other code, or exit 0 without a marker.
    """
    store = RunStore.open(run_dir)
    marker = store.marker(shard_id)
    if is_complete(marker):
        log.info("shard %s already complete (marker in storage): not run again", shard_id)
        return ShardResult(shard_id, 0, 0.0, True, marker.rows_ok, marker.rows_dead_letter)
    cmd = worker_command() + worker_arguments(run_dir, shard_id)
    parallelism = parallelism if parallelism > 0 else auto_parallelism()
    threads = worker_threads(parallelism)
    env = {**os.environ, **worker_thread_env(threads)}
    with parallelism_slot(run_dir, parallelism) as slot:
        refusal = may_start() if may_start is not None else None
        if refusal:
            raise ShardNotStartedError(refusal)
        log.info("shard %s: slot %d/%d, %d thread(s) of %d cores: %s", shard_id, slot + 1, parallelism,
                 threads, machine_cores(), shlex.join(cmd))
        start = time.monotonic()
        errors: list[str] = []
        code = _run_subprocess(cmd, f"[shard {shard_id}]", env, errors)
        seconds = time.monotonic() - start
    return _result(store, shard_id, code, seconds, errors[-1] if errors else "")


def _result(store: RunStore, shard_id: str, code: int, seconds: float, cause: str = "") -> ShardResult:
    if code == ExitCode.BAD_INPUT:
        cause = cause or "bad input or config (the worker log above names the field/row)"
        raise ShardBadInputError(f"shard {shard_id}: {cause}. Fix: {bad_input_fix(cause)}; a retry cannot "
                                 f"fix it (worker exit {code})")
    if code == ExitCode.INTERRUPTED:
        raise ShardRetryableError(f"shard {shard_id}: worker interrupted (exit {code}); committed chunks "
                                  "are kept and the retry resumes after them")
    if code != ExitCode.OK:
        raise ShardRetryableError(f"shard {shard_id}: worker failed with exit code {code}; retrying")
    marker = store.marker(shard_id)
    if not is_complete(marker):
        raise ShardRetryableError(f"shard {shard_id}: worker exited 0 but wrote no _SUCCESS.json marker")
    log.info("shard %s done in %.1f s: %d rows ok, %d dead letters", shard_id, seconds, marker.rows_ok,
             marker.rows_dead_letter)
    return ShardResult(shard_id, code, seconds, False, marker.rows_ok, marker.rows_dead_letter)


def run_canary(run_dir: str, *, parallelism: int, options: list[str] | None = None) -> float:
    """Run ``batch-worker canary`` for ``run_dir`` with the thread cap a fan-out worker gets at
    ``parallelism`` (so its throughput is a worker's), streaming its log; returns its wall time in seconds.

    Args:
        run_dir: ``<output_root>/runs/<run_id>``.
        parallelism: the fan-out's workers at once (0: :func:`auto_parallelism`).
        options: extra ``batch-worker canary`` arguments (``--fraction``, ``--min-rows``, ...).

    Raises:
        ShardBadInputError: exit code 2 (bad config or input; no retry).
        ShardRetryableError: any other non-zero exit code.
    """
    parallelism = parallelism if parallelism > 0 else auto_parallelism()
    threads = worker_threads(parallelism)
    cmd = worker_command() + ["canary", "--run-dir", run_dir, *(options or [])]
    env = {**os.environ, **worker_thread_env(threads)}
    log.info("canary: %d thread(s) (a worker's share at parallelism %d): %s", threads, parallelism, shlex.join(cmd))
    start = time.monotonic()
    errors: list[str] = []
    code = _run_subprocess(cmd, "[canary]", env, errors)
    seconds = time.monotonic() - start
    if code == ExitCode.BAD_INPUT:
        raise ShardBadInputError(f"canary: {errors[-1] if errors else 'bad input or config'} (worker exit {code})")
    if code != ExitCode.OK:
        raise ShardRetryableError(f"canary: worker failed with exit code {code}; retrying")
    return seconds
