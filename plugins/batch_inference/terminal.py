"""What ``make run`` shows in the terminal while ``airflow dags test`` runs.

Two sources, both read-only:

* :class:`DagTestOutput` reads Airflow 3.3's ``dags test`` output line by line (the CLI tees it to a log
  file): it finds the run id (``Created dag run. ... : <run_id>, state:``), each task's start
  (``[DAG TEST] starting task_id=X map_index=N``), end state (``Task instance state updated ...
  new_state=S``) and, for a failed task, the exception line after ``Task failed with exception``, so
  the terminal shows the *first* failing task's real error, not the error of a task downstream of it.
* :class:`ProgressWatcher` polls the run's progress objects and markers through a
  :class:`~batch_contract.runstore.RunStore` (:func:`batch_inference.progress.collect_progress`) every
  few seconds on a thread and prints a line per running shard (rows, rows/s, ETA) and one for the run.

Never imports Airflow.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from batch_contract.layout import RunLayout
from batch_contract.runstore import RunStore

from batch_inference.progress import _eta, collect_progress

ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
RUN_CREATED_RE = re.compile(r"Created dag run\..*?: (\S+), state:")
TASK_START_RE = re.compile(r"\[DAG TEST\] starting task_id=(\S+) map_index=(-?\d+)")
TASK_STATE_RE = re.compile(r"Task instance state updated .*new_state=(\w+)")
TASK_FAILED_RE = re.compile(r"Task failed with exception")
TIMESTAMPED_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}")
EXCEPTION_RE = re.compile(r"^(?:[A-Za-z_][\w]*\.)*([A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)): ?(.*)$")
REPORT_RE = re.compile(r"BATCH_INFERENCE_REPORT_JSON=(\S+)")
_QUIET_EXCEPTIONS = {"AirflowFailException", "AirflowException"}
"""Exception types left out of the message shown (the message itself says what failed)."""


class Printer:
    """``print`` to a stream under a lock (the progress thread and the output reader share it)."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream
        self._lock = threading.Lock()

    def __call__(self, line: str) -> None:
        with self._lock:
            print(line, file=self.stream or sys.stdout, flush=True)


@dataclass
class TaskFailure:
    """The first failed task of a run: ``task`` (``plan``, ``infer_local[2]``) and its error message."""

    task: str
    message: str


@dataclass
class DagTestOutput:
    """Parses ``airflow dags test`` output (see the module docstring); :meth:`feed` one line at a time.

    Attributes:
        run_id: the DAG run's id once seen.
        report_uri: the summary task's ``BATCH_INFERENCE_REPORT_JSON=`` value once seen.
        failures: failed tasks in the order they failed, each with its exception message.
    """

    run_id: str = ""
    report_uri: str = ""
    failures: list[TaskFailure] = field(default_factory=list)
    _task: str = ""
    _started: float = 0.0
    _in_traceback: bool = False
    _error: str = ""

    def feed(self, raw: str, now: float | None = None) -> list[str]:
        """Read one output line; returns the terminal lines it produces (often none)."""
        line = ANSI_RE.sub("", raw.rstrip("\n"))
        now = time.monotonic() if now is None else now
        if self._in_traceback and not TIMESTAMPED_RE.match(line):
            self._read_traceback(line)
            return []
        self._in_traceback = False
        if match := REPORT_RE.search(line):
            self.report_uri = match.group(1)
        if not self.run_id and (match := RUN_CREATED_RE.search(line)):
            self.run_id = match.group(1)
            return [f"run {self.run_id}"]
        if match := TASK_START_RE.search(line):
            index = int(match.group(2))
            self._task = match.group(1) + (f"[{index}]" if index >= 0 else "")
            self._started, self._error = now, ""
            return [f"task {self._task}: started"]
        if TASK_FAILED_RE.search(line):
            self._in_traceback, self._error = True, ""
            return []
        if (match := TASK_STATE_RE.search(line)) and self._task:
            return self._task_state(match.group(1), now)
        return []

    def _read_traceback(self, line: str) -> None:
        match = EXCEPTION_RE.match(line)
        if match:
            kind, text = match.groups()
            self._error = text if kind in _QUIET_EXCEPTIONS and text else f"{kind}: {text}"
        elif self._error and line and not line.startswith((" ", "Traceback", "During handling", "The above")):
            self._error += "\n" + line  # a multi-line exception message

    def _task_state(self, state: str, now: float) -> list[str]:
        seconds = now - self._started if self._started else 0.0
        if state in ("success", "skipped"):
            return [f"task {self._task}: {state} ({seconds:.1f} s)"]
        if state in ("failed", "up_for_retry"):
            message = self._error or "(no exception in the output; see the Airflow log)"
            if state == "failed":
                self.failures.append(TaskFailure(self._task, message))
            first = message.splitlines()[0] if message else ""
            return [f"task {self._task}: {state.upper().replace('_', ' ')} ({seconds:.1f} s): {first}"]
        if state in ("running", "queued", "scheduled", "deferred"):
            return []
        return [f"task {self._task}: {state}"]

    @property
    def first_failure(self) -> TaskFailure | None:
        return self.failures[0] if self.failures else None


def shard_line(sid: str, prog: Any) -> str:
    """``shard 00001: 300/500 rows (60.0%) | 85.0 rows/s | ETA 3s``."""
    pct = 100.0 * prog.rows_done / prog.rows_total if prog.rows_total else 100.0
    return (f"  shard {sid}: {prog.rows_done:,}/{prog.rows_total:,} rows ({pct:.1f}%) | "
            f"{prog.rows_per_s:,.1f} rows/s | ETA {_eta(prog.eta_s)}")


def run_line(summary: dict[str, Any]) -> str:
    """``run: shards 1/3 complete, 1 running, 1 pending | rows 800/1,500 (53.3%) | 85.0 rows/s | ETA 8s``."""
    s = summary
    total = "?" if s["rows_total"] is None else f"{s['rows_total']:,}"
    frac = "" if s["fraction_done"] is None else f" ({100 * s['fraction_done']:.1f}%)"
    shards = f"shards {s['completed']}/{s['total']} complete, {s['running']} running, {s['pending']} pending"
    if s["failed"] or s["stale"]:
        shards += f", {s['failed']} failed, {s['stale']} stale"
    dead = f", {s['rows_dead_letter']:,} dead letters" if s["rows_dead_letter"] else ""
    return (f"  run: {shards} | rows {s['rows_done']:,}/{total}{frac}{dead} | {s['rows_per_s']:,.1f} rows/s | "
            f"ETA {_eta(s['eta_s'])}")


class ProgressWatcher:
    """Polls a run's progress every ``interval`` seconds on a daemon thread and prints what changed.

    Args:
        output_root: the run's output root (``<output_root>/runs/<dag_id>/<run_id>``).
        run_id: callable returning the run id ("" until known).
        dag_id: the DAG being run.
        emit: prints one line.
        interval: seconds between polls.
    """

    def __init__(self, output_root: str, run_id: Callable[[], str], emit: Callable[[str], None],
                 interval: float = 5.0, *, dag_id: str | None = None) -> None:
        self.output_root = output_root
        self.dag_id = dag_id
        self.run_id = run_id
        self.emit = emit
        self.interval = interval
        self._store: RunStore | None = None
        self._shards: list[str] = []
        self._last: dict[str, str] = {}
        self._done: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="progress-watcher", daemon=True)

    def start(self) -> ProgressWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval + 5)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.poll()
            except Exception as exc:  # noqa: BLE001 - progress is advisory: never stop the run for it
                self.emit(f"  (progress unavailable: {type(exc).__name__}: {exc})")
                self._stop.wait(self.interval * 5)

    def _open(self) -> RunStore | None:
        if self._store is None:
            run_id = self.run_id()
            if not run_id:
                return None
            store = RunStore(RunLayout(self.output_root, run_id, self.dag_id))
            try:
                self._shards = [s.shard_id for s in store.manifest.shards]
            except FileNotFoundError:
                return None  # not planned yet
            self._store = store
        return self._store

    def poll(self) -> list[str]:
        """One poll: prints (and returns) a line per shard whose progress changed or that completed, and
        the run line when anything changed."""
        store = self._open()
        if store is None or not self._shards:
            return []
        summary = collect_progress(store, self._shards)
        lines = []
        markers = store.poll()
        for sid in self._shards:
            if sid in markers and sid not in self._done:
                self._done.add(sid)
                m = markers[sid]
                lines.append(f"  shard {sid}: complete, {m.rows_ok:,} rows ok, {m.rows_dead_letter:,} dead letters")
        running = [sid for sid in summary["missing"]]
        for sid, prog in store.progress_of(running).items():
            text = shard_line(sid, prog)
            if self._last.get(sid) != text:
                self._last[sid] = text
                lines.append(text)
        if lines:
            lines.append(run_line(summary))
        for line in lines:
            self.emit(line)
        return lines
