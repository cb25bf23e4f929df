"""The producer side of the worker: read -> validate -> form chunks -> prepare (tokenize), on a thread.

The producer runs one chunk ahead of the engine (a queue of size 1), so reading and tokenizing chunk
N+1 overlaps with inference on chunk N, and memory holds at most about three chunks.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from batch_contract.engine_config import WorkerSettings
from batch_contract.manifest import InputSpec, Segment

from batch_worker.dedupe import Deduper, Split
from batch_worker.engines.base import ChunkRows, Engine
from batch_worker.preprocess import DocumentPool, apply_extraction
from batch_worker.reader import iter_shard_blocks
from batch_worker.stats import StageClock
from batch_worker.validate import DeadLetter, Validator, concat_rows


@dataclass
class ChunkWork:
    """One chunk ready for the engine: rows to process, dead letters found while reading them, the
    engine's prepared form of the rows, and (with :class:`~batch_worker.dedupe.Deduper`) the split of
    the chunk's rows into those computed (``rows``) and the copies that take their key's result."""

    rows: ChunkRows
    dead: list[DeadLetter] = field(default_factory=list)
    prepared: Any = None
    split: Split | None = None


class ChunkSizer:
    """Rows per chunk: fixed (``chunk_rows``) or sized from measured throughput.

    Before any measurement the target is ``min_chunk_rows``; after each chunk it becomes
    ``rows_per_s x chunk_target_seconds`` clamped to ``min_chunk_rows..max_chunk_rows``.
    """

    def __init__(self, settings: WorkerSettings) -> None:
        self.settings = settings
        self._target = settings.chunk_rows or settings.min_chunk_rows

    def target(self) -> int:
        return self._target

    def update(self, rows: int, seconds: float) -> None:
        """Record that ``rows`` took ``seconds`` end to end (engine + commit)."""
        s = self.settings
        if s.chunk_rows or rows <= 0 or seconds <= 0:
            return
        self._target = int(min(max(rows / seconds * s.chunk_target_seconds, s.min_chunk_rows), s.max_chunk_rows))


_DONE = object()

PRODUCER_JOIN_SECONDS = 30.0
"""Longest wait (seconds) for the producer thread to end in :meth:`Producer.close`; a signal's own
deadline is the grace watchdog's (``batch_worker.signals``)."""


class Producer:
    """Background thread producing :class:`ChunkWork` items.

    Args:
        engine: the loaded engine (its ``prepare`` runs on this thread).
        spec / segments: what to read.
        settings: worker settings (``read_batch_rows``).
        validator: the shard-wide validator (holds the resume ledger).
        sizer: chunk sizing.
        clock: stage clock (``input_read``, ``preprocess`` and ``tokenize`` are timed here).
        should_stop: stop request (SIGTERM).
        deduper: splits each chunk into rows to compute and copies (``None``: every row is computed).
        documents: for an input with ``input.documents``: the extraction pool (:mod:`batch_worker.preprocess`)
            that turns each chunk's document URIs into text before ``prepare``; rows whose document
            gives no text join the chunk's dead letters. ``None``: the text column is text.
    """

    def __init__(
        self, engine: Engine, spec: InputSpec, segments: list[Segment], settings: WorkerSettings,
        validator: Validator, sizer: ChunkSizer, clock: StageClock, should_stop: Callable[[], bool],
        deduper: Deduper | None = None,
        documents: DocumentPool | None = None,
    ) -> None:
        self.engine = engine
        self.deduper = deduper
        self.spec = spec
        self.segments = segments
        self.settings = settings
        self.validator = validator
        self.sizer = sizer
        self.clock = clock
        self._closed = threading.Event()
        self.should_stop: Callable[[], bool] = lambda: self._closed.is_set() or should_stop()
        self.documents = documents
        self.rows_skipped = 0
        self.exhausted = False
        """True once every row of the shard was read and handed over."""
        self.stopped_reading = False
        """True when a stop request ended the reading early (rows of the shard were left unread)."""
        self._queue: queue.Queue = queue.Queue(maxsize=1)
        self._thread = threading.Thread(target=self._run, name="producer", daemon=True)

    def start(self) -> Producer:
        self._thread.start()
        return self

    def close(self, timeout: float = PRODUCER_JOIN_SECONDS) -> bool:
        """Stop the thread and wait for it: it stops at its next check (between blocks, before a hand-over,
        while waiting for documents), so at most the chunk it is reading or tokenizing is finished first.
        Called by the consumer whenever it stops taking chunks (end of shard, a signal, a lost lease, an
        error), so no producer thread is left inside the reader or the tokenizer when the process exits.

        Args:
            timeout: seconds to wait for the thread.

        Returns:
            True when the thread has ended (False: still running after ``timeout``; it is a daemon thread).
        """
        self._closed.set()
        with self._queue.mutex:  # a hand-over waiting for room sees the close at its next try
            self._queue.queue.clear()
            self._queue.not_full.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def get(self) -> ChunkWork | None:
        """Next chunk, or ``None`` when the shard is exhausted (or the producer stopped on a signal).

        Raises:
            Exception: whatever the producer raised (bad input, reader errors).
        """
        while True:
            try:
                item = self._queue.get(timeout=0.2)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    return None  # stopped by a signal between chunks
        if item is _DONE:
            return None
        if isinstance(item, BaseException):
            raise item
        return item

    def only_done_left(self) -> bool:
        """True when every chunk was handed over and consumed (only the end-of-shard item is queued)."""
        with self._queue.mutex:
            return self.exhausted and list(self._queue.queue) == [_DONE]

    def _put(self, item: object) -> bool:
        while True:
            try:
                self._queue.put(item, timeout=0.2)
                return True
            except queue.Full:
                if self.should_stop():
                    return False

    def _blocks(self) -> Iterator:
        it = iter_shard_blocks(self.spec, self.segments, self.settings.read_batch_rows, self.engine.extra_columns(),
                               self.settings)
        while True:
            t0 = time.perf_counter()
            try:
                block = next(it)
            except StopIteration:
                return
            finally:
                self.clock.add("input_read", time.perf_counter() - t0)
            yield block

    def _emit(self, rows: ChunkRows, dead: list[DeadLetter]) -> bool:
        if self.documents is not None and len(rows):
            with self.clock.stage("preprocess"):  # queued by _run when the chunk was read
                results = self.documents.collect(len(rows), self.should_stop)
            if results is None:  # a stop request while the chunk's documents were extracted
                self.stopped_reading = True
                return False
            rows, more = apply_extraction(rows, results, self.spec.text_column)
            dead = [*dead, *more]
        split = None
        with self.clock.stage("tokenize"):
            if self.deduper is not None:
                split = self.deduper.split(rows)
                rows = split.compute
            prepared = self.engine.prepare(rows)
        return self._put(ChunkWork(rows=rows, dead=dead, prepared=prepared, split=split))

    def _chunks(self) -> Iterator[tuple[ChunkRows, list[DeadLetter]]]:
        pending: list[ChunkRows] = []
        n_pending = 0
        dead: list[DeadLetter] = []
        for block in self._blocks():
            vb = self.validator.validate(block)
            self.rows_skipped += vb.skipped
            dead.extend(vb.dead)
            if len(vb.rows):
                pending.append(vb.rows)
                n_pending += len(vb.rows)
            # the target is read once per cut: the main thread resizes it (ChunkSizer.update) while this
            # thread reads, and a target that grew between the check and the cut cut past the rows held
            k = self.sizer.target()
            while n_pending >= k:
                rows = concat_rows(pending)
                yield rows.take(list(range(k))), dead
                rest = rows.take(list(range(k, len(rows))))
                pending, n_pending, dead = ([rest] if len(rest) else []), len(rest), []
                k = self.sizer.target()
            if self.should_stop():
                self.stopped_reading = True
                return
        if n_pending or dead:
            yield (concat_rows(pending) if pending else _empty_rows()), dead

    def _run(self) -> None:
        try:
            if self.documents is None:
                for rows, dead in self._chunks():
                    if self.should_stop() or not self._emit(rows, dead):
                        return
            elif not self._run_documents(self.documents):
                return
            if self.stopped_reading:  # a signal while reading: not exhausted, the shard is interrupted
                return
            self.exhausted = True
            self._put(_DONE)
        except BaseException as exc:  # handed to the main thread, which maps it to an exit code
            self._put(exc)


    def _run_documents(self, documents: DocumentPool) -> bool:
        """The chunk loop of a documents input: each chunk is read one chunk ahead and its documents are
        queued on the pool at once, so the pool extracts chunk N+1 while chunk N is tokenized and handed
        over. False when a stop request ended it."""
        chunks = self._chunks()
        current = next(chunks, None)
        if current is not None:
            documents.enqueue(current[0].texts)
        while current is not None:
            if self.should_stop():
                return False
            ahead = next(chunks, None)
            if ahead is not None:
                documents.enqueue(ahead[0].texts)
            if not self._emit(*current):
                return False
            current = ahead
        return True


def _empty_rows() -> ChunkRows:
    import pyarrow as pa

    return ChunkRows(ids=[], texts=[], text_repaired=[], source_uri=[], source_row=[], fields=pa.table({}))
