"""Live progress: ``_PROGRESS.json`` (``ShardProgress``) and a log line, at most every N seconds."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from batch_contract import storage
from batch_contract.enums import ShardStatus
from batch_contract.marker import ShardProgress

log = logging.getLogger("batch_worker.progress")


def utc_now() -> str:
    """Current UTC time, ISO 8601 with seconds (``2026-11-30T02:43:00Z``)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Counters:
    """Row counters shared by the runtime, the engine callback and the progress thread (thread-safe).

    Attributes:
        rows_total: rows of the shard (manifest).
        rows_before: rows already committed when this attempt started (results + dead letters).
        rows_committed: rows (results + dead letters) committed by this attempt.
        rows_dead: dead letters committed by this attempt.
        rows_processed: rows that went through the engine in this attempt (committed or not).
        rows_processed_committed: of those, rows already committed.
    """

    def __init__(self, rows_total: int, rows_before: int) -> None:
        self.rows_total = rows_total
        self.rows_before = rows_before
        self.rows_committed = 0
        self.rows_dead = 0
        self.rows_processed = 0
        self.rows_processed_committed = 0
        self.started = time.monotonic()
        self.first_processed_at: float | None = None
        self._lock = threading.Lock()

    def add_processed(self, n: int) -> None:
        with self._lock:
            if self.first_processed_at is None:
                self.first_processed_at = time.monotonic()
            self.rows_processed += n

    def add_committed(self, rows: int, dead: int, processed: int) -> None:
        with self._lock:
            self.rows_committed += rows
            self.rows_dead += dead
            self.rows_processed_committed += processed

    def snapshot(self) -> tuple[int, float, float | None]:
        """``(rows_done, rows_per_s, eta_s)``: done = committed + processed in flight; rate over this
        attempt's inference time; ETA in seconds (``None`` until a rate exists)."""
        with self._lock:
            inflight = self.rows_processed - self.rows_processed_committed
            done = min(self.rows_before + self.rows_committed + inflight, self.rows_total)
            since = self.first_processed_at
            elapsed = time.monotonic() - since if since is not None else 0.0
            rate = self.rows_processed / elapsed if elapsed > 0 else 0.0
        eta = (self.rows_total - done) / rate if rate > 0 else None
        return done, rate, eta


class ProgressReporter:
    """Writes ``_PROGRESS.json`` and logs a progress line every ``interval`` seconds on a daemon thread.

    Args:
        uri: the shard's progress object URI.
        shard_id / attempt_id: identity written into the object.
        counters: the shared :class:`Counters`.
        interval: seconds between writes (``WorkerSettings.progress_interval_seconds``).
        status: callable giving the current ``ShardStatus`` value.
        on_tick: called after each periodic write (the runtime refreshes the attempt record with it).
    """

    def __init__(
        self, uri: str, shard_id: str, attempt_id: str, counters: Counters, interval: float,
        status: Callable[[], str] = lambda: ShardStatus.RUNNING.value,
        on_tick: Callable[[], None] | None = None,
    ) -> None:
        self.on_tick = on_tick
        self.uri = uri
        self.shard_id = shard_id
        self.attempt_id = attempt_id
        self.counters = counters
        self.interval = interval
        self.status = status
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="progress", daemon=True)

    def start(self) -> ProgressReporter:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.write(self.status())
                if self.on_tick is not None:
                    self.on_tick()
            except OSError as exc:  # progress is advisory: a failed write never stops the shard
                log.warning("progress write failed: %s", exc)

    def write(self, status: str) -> ShardProgress:
        """Write the progress object now and log the progress line; returns what was written."""
        done, rate, eta = self.counters.snapshot()
        total = self.counters.rows_total
        progress = ShardProgress(
            shard_id=self.shard_id,
            status=status,
            rows_total=total,
            rows_done=done,
            rows_dead_letter=self.counters.rows_dead,
            rows_per_s=round(rate, 2),
            eta_s=round(eta, 1) if eta is not None else None,
            updated_at=utc_now(),
            attempt_id=self.attempt_id,
        )
        storage.write_replace(self.uri, progress.to_json_bytes())
        pct = 100.0 * done / total if total else 100.0
        eta_text = f"{eta:.0f} s" if eta is not None else "?"
        log.info("%.1f rows/s, ETA %s | shard %s: %d/%d rows (%.1f%%) [%s]",
                 rate, eta_text, self.shard_id, done, total, pct, status)
        return progress

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval + 1)
