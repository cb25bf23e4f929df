"""One run's view model: DB record + storage reads -> status, figures, shard table.

Reads go through the contract's run store after the storage guard (:mod:`batch_inference.ui.guard`)
accepted the run directory for the DagRun's ``(dag_id, run_id)``, and a view shows figures only after
its manifest proved to be that run's (:func:`~batch_inference.ui.guard.check_manifest_identity`). Views
are cached per process (:class:`ViewCache`): a finished run's until evicted (its storage no longer
changes), an unfinished run's for a few seconds.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from batch_contract.layout import RunLayout
from batch_contract.runstore import RunStore

from batch_inference.progress import collect_progress
from batch_inference.report.approvals import read_section
from batch_inference.report.collect import load_run
from batch_inference.ui.discovery import RunRecord
from batch_inference.ui.figures import ShardRow, run_figures, shard_rows
from batch_inference.ui.guard import PathRefused, check_manifest_identity, guarded_layout
from batch_inference.ui.status import BatchStatus, RunFacts, batch_status, deadline_of

TERMINAL_DAG_RUN_STATES = frozenset({"success", "failed"})
CACHE_SIZE = 256
"""Views kept per API-server process."""
LIVE_TTL_S = 5.0
"""Seconds an unfinished run's view is reused (the pages reload every 10 s)."""
LIST_THREADS = 8
"""Runs read concurrently for the list page (each read is a few storage round trips)."""


@dataclass
class RunView:
    """What the pages show of one run.

    Attributes:
        record: the DagRun as the metadata DB knows it.
        status: batch-API status (:func:`batch_inference.ui.status.batch_status`).
        figures: :func:`batch_inference.ui.figures.run_figures` (``None`` before the manifest exists,
            when the run dir was refused, or unreadable).
        shards: the per-shard table.
        problem: why there are no figures (``None`` when there are).
        refused: the run dir failed the storage guard, or its manifest is another run's or another DAG's
            (nothing is shown; the API answers 403).
        layout: the run's URIs when its run dir passed the guard (``None`` when refused, and when an older
            run dir without a DAG segment has no readable manifest to tell its DAG).
    """

    record: RunRecord
    status: BatchStatus
    figures: dict[str, Any] | None = None
    shards: list[ShardRow] = field(default_factory=list)
    problem: str | None = None
    refused: bool = False
    layout: RunLayout | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (datetimes as ISO strings) for the JSON API."""
        rec = self.record
        return {
            "dag_id": rec.dag_id, "run_id": rec.run_id, "dag_run_state": rec.state,
            "status": self.status.value,
            "queued_at": _iso(rec.queued_at), "started_at": _iso(rec.start_date), "finished_at": _iso(rec.end_date),
            "run_dir": self.layout.run_dir if self.layout else None,
            "figures": self.figures, "problem": self.problem,
            "shards": [asdict(s) for s in self.shards],
        }


SHARD_PAGE_ROWS = 100
"""Shards per page of the run page's shard table (a run has up to 1,024 or more: issue #35)."""


@dataclass(frozen=True)
class ShardPage:
    """One page of a run's shard table, and the counts of the whole table.

    Attributes:
        rows: the shards of this page (manifest order among those of ``state``).
        page / pages: this page's number and the number of pages (both 1-based; ``pages`` >= 1).
        state: the state shown (``None``: every state).
        matching: shards of ``state`` (all shards when ``None``).
        by_state: ``{state: shards}`` over the whole table, in first-seen order.
    """

    rows: list[ShardRow]
    page: int
    pages: int
    state: str | None
    matching: int
    by_state: dict[str, int]


def shard_page(shards: list[ShardRow], page: int = 1, state: str | None = None,
               size: int = SHARD_PAGE_ROWS) -> ShardPage:
    """Page ``page`` of ``shards`` (those in ``state`` when given), ``size`` rows a page; a page past the
    end is the last one, a page below 1 the first. Costs one pass over the table (no storage reads)."""
    by_state: dict[str, int] = {}
    for s in shards:
        by_state[s.state] = by_state.get(s.state, 0) + 1
    chosen = shards if state is None else [s for s in shards if s.state == state]
    pages = max(1, -(-len(chosen) // size))
    page = min(max(1, page), pages)
    return ShardPage(chosen[(page - 1) * size:page * size], page, pages, state, len(chosen), by_state)


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def read_report(layout: RunLayout) -> dict[str, Any] | None:
    """The run's ``report.json`` or ``None`` when publish has not written it (or it is not JSON)."""
    try:
        return RunStore(layout).report()
    except ValueError:
        return None


def build_view(record: RunRecord) -> RunView:
    """Read the run's objects in storage and decide its status (never raises for a bad run: the view's
    ``problem`` says what is wrong, and the status falls back to the Airflow states alone)."""
    facts = dict(dag_run_state=record.state, task_states=record.task_states, gate_ended_at=record.gate_ended_at)
    if not record.run_dir:
        return RunView(record, batch_status(RunFacts(**facts)), problem="not planned yet (no run_dir XCom)")
    try:
        layout = guarded_layout(record.run_dir, record.dag_id, record.run_id)
    except PathRefused as exc:
        return RunView(record, batch_status(RunFacts(**facts)), problem=f"refused: {exc}", refused=True)
    store = RunStore(layout)
    try:
        manifest = store.manifest  # first: nothing else is read before it proved to be this run's
        check_manifest_identity(layout, record.dag_id, record.run_id, manifest.run_id, manifest.params)
        data = load_run(store)
    except PathRefused as exc:
        return RunView(record, batch_status(RunFacts(**facts)), problem=f"refused: {exc}", refused=True)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        # a run dir that names the DAG keeps its layout (the manifest and error-file routes check the
        # manifest again); an older run dir without a DAG segment is only known by its manifest
        return RunView(record, batch_status(RunFacts(**facts)), problem=f"unreadable: {exc}",
                       layout=layout if layout.dag_id is not None else None)
    try:
        ids = [s.shard_id for s in data.manifest.shards]
        progress = collect_progress(store, ids)
        report = read_report(layout)
        shards = shard_rows(data, progress)
        figures = run_figures(data, progress, shards, report, finished=record.state in TERMINAL_DAG_RUN_STATES,
                              approval=read_section(store))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return RunView(record, batch_status(RunFacts(**facts)), problem=f"unreadable: {exc}", layout=layout)
    deadline = deadline_of(record.start_date, data.manifest.params.get("deadline_hours"))
    status = batch_status(RunFacts(**facts, shards_total=len(ids), shards_complete=len(data.markers),
                                   deadline_at=deadline))
    return RunView(record, status, figures, shards, layout=layout)


class ViewCache:
    """Views of runs, so that page loads do not each re-read storage (LRU, thread-safe).

    * A finished DagRun's view is kept until evicted, keyed by ``(dag_id, run_id, end_date, run_dir)``:
      a run cleared and re-run gets a new end date, a rewritten ``run_dir`` XCom a new key.
    * An unfinished run's view is reused for ``live_ttl_s`` seconds while its DagRun state, task states
      and run dir are unchanged, so several open pages refreshing themselves cost one read of the run
      per ``live_ttl_s`` (a run with many shards is one storage listing per shard).

    Args:
        build: the view builder (default :func:`build_view`).
        size: entries kept.
        live_ttl_s: seconds an unfinished run's view is reused (default :data:`LIVE_TTL_S`).
        clock: monotonic clock in seconds (tests pass a fake one).
    """

    def __init__(self, build: Callable[[RunRecord], RunView] = build_view, size: int = CACHE_SIZE,
                 live_ttl_s: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._build = build
        self._size = size
        self._ttl = LIVE_TTL_S if live_ttl_s is None else live_ttl_s
        self._clock = clock
        self._items: OrderedDict[tuple[Any, ...], tuple[float, RunView]] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _key(record: RunRecord) -> tuple[Any, ...]:
        if record.state in TERMINAL_DAG_RUN_STATES:
            return (record.dag_id, record.run_id, _iso(record.end_date) or "", record.run_dir or "")
        return (record.dag_id, record.run_id, record.state, record.run_dir or "",
                tuple(sorted(record.task_states.items())))

    def get(self, record: RunRecord) -> RunView:
        """The run's view: reused as the class docstring says, else built (and kept unless it has a
        problem)."""
        key, now = self._key(record), self._clock()
        finished = record.state in TERMINAL_DAG_RUN_STATES
        with self._lock:
            hit = self._items.get(key)
            if hit is not None and (finished or now - hit[0] < self._ttl):
                self._items.move_to_end(key)
                return hit[1]
        view = self._build(record)
        if view.problem is None:
            with self._lock:
                self._items[key] = (now, view)
                self._items.move_to_end(key)
                while len(self._items) > self._size:
                    self._items.popitem(last=False)
        return view

    def get_many(self, records: list[RunRecord]) -> list[RunView]:
        """Views of ``records`` in order, built concurrently (:data:`LIST_THREADS`)."""
        if not records:
            return []
        with ThreadPoolExecutor(max_workers=min(LIST_THREADS, len(records))) as pool:
            return list(pool.map(self.get, records))
