"""The extraction pool: documents -> text in worker processes, ahead of the engine, in input order.

The producer thread (:mod:`batch_worker.pipeline`) queues each chunk's validated rows (their text column
holds document URIs) with :meth:`DocumentPool.enqueue` as soon as it has read the chunk, one chunk
ahead of the one it is finishing, and collects their results in input order with
:meth:`DocumentPool.collect`. Documents are submitted to a process pool through a bounded window (at
most ``queue_depth`` submitted and not yet collected), so the pool keeps extracting the next chunk's
documents while the producer tokenizes a chunk and waits for the engine to take it. The producer runs
one chunk ahead of the engine (a queue of one chunk); memory holds the window's documents, one chunk of
queued URIs and the chunks the producer queue already bounds, whatever the input's size.

Rows whose document gives no text become dead letters with the extractor's reason
(:mod:`batch_worker.extract`); the others continue with the extracted text as their text, so
tokenization, length-sorted batching, the token histogram of the cost report and the canary's figures
all see the extracted text. A pool process that dies (a document that crashes the parser) is replaced,
and the documents it held are extracted again one at a time, so only the document that kills a process
becomes a dead letter (``unreadable_document``).

Processes start through ``forkserver`` (never ``fork``: the worker holds threads and, after the model
load, a CUDA context).
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

import pyarrow as pa
from batch_contract.documents import POOL_WORKERS_ENV, DocumentSettings
from batch_contract.enums import DeadLetterReason

from batch_worker.engines.base import ChunkRows
from batch_worker.errors import BadInputError
from batch_worker.extract import Extracted, OcrUnavailableError, extract_document, init_pool_process
from batch_worker.validate import DeadLetter

PRELOAD = ("batch_worker.extract", "pypdf", "trafilatura", "PIL.Image", "pytesseract")
"""Modules the forkserver imports once, so every pool process starts with them (a missing one is
skipped by multiprocessing and imported, or reported, where a document needs it)."""
WAIT_SLICE_SECONDS = 0.2
"""How often a wait for a document checks the stop request (seconds)."""


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask; ``os.cpu_count()`` where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def pool_size(settings: DocumentSettings, environ: Mapping[str, str] | None = None) -> int:
    """Extraction processes: ``settings.pool_workers`` when set; else ``BATCH_PREPROCESS_WORKERS`` (the
    pod spec sets it to the CPUs it requested for the pool); else the CPUs this process may run on minus
    one for the engine, at least 1.

    Raises:
        BadInputError: ``BATCH_PREPROCESS_WORKERS`` is not a positive integer.
    """
    if settings.pool_workers:
        return settings.pool_workers
    env = os.environ if environ is None else environ
    raw = env.get(POOL_WORKERS_ENV, "").strip()
    if raw:
        if not raw.isdigit() or int(raw) < 1:
            raise BadInputError(f"{POOL_WORKERS_ENV}: {raw!r} is not a positive integer")
        return int(raw)
    return max(1, available_cpus() - 1)


@dataclass
class PreprocessStats:
    """Running totals of one worker process's extraction (the ``preprocess`` figures of the attempt
    record, ``batch_contract.marker.PREPROCESS_FIELDS``).

    Attributes:
        rows: documents extracted (dead letters included).
        cpu_seconds: CPU seconds the pool processes spent on them (tesseract included).
        extract_seconds: wall seconds the pool processes spent on them, summed over processes.
        wall_seconds: wall seconds the producer spent waiting for chunks' extraction.
        pool_workers / queue_depth: the pool's size and window.
    """

    rows: int = 0
    cpu_seconds: float = 0.0
    extract_seconds: float = 0.0
    wall_seconds: float = 0.0
    pool_workers: int = 0
    queue_depth: int = 0

    def add(self, results: list[Extracted], wall: float) -> None:
        self.rows += len(results)
        self.cpu_seconds += sum(r.cpu_seconds for r in results)
        self.extract_seconds += sum(r.wall_seconds for r in results)
        self.wall_seconds += wall


class DocumentPool:
    """A process pool extracting documents in input order through a bounded window.

    Args:
        settings: the manifest's ``input.documents``.
        roots: the manifest's input roots (each document is opened through them).
        workers: processes (``None``: :func:`pool_size`).

    Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, settings: DocumentSettings, roots: list[str] | tuple[str, ...] = (),
                 workers: int | None = None) -> None:
        self.settings = settings
        self.roots = tuple(roots)
        self.workers = workers or pool_size(settings)
        self.depth = settings.queue_depth or 4 * self.workers
        self.stats = PreprocessStats(pool_workers=self.workers, queue_depth=self.depth)
        self._executor: ProcessPoolExecutor | None = None
        self._pending: deque[str] = deque()
        """Queued documents not yet submitted."""
        self._window: deque[tuple[str, Future]] = deque()
        """Submitted documents not yet collected, in queue order (at most ``depth``)."""
        self._ready: deque[Extracted] = deque()
        """Results extracted out of band (after a process died), ahead of the window."""

    def __enter__(self) -> DocumentPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> DocumentPool:
        """Start the pool's processes now, without waiting for them (a no-op task each), so that their
        start-up (forkserver, imports) overlaps whatever the caller does next, such as the model load."""
        pool = self._pool()
        for _ in range(self.workers):
            pool.submit(os.getpid)
        return self

    def _pool(self) -> ProcessPoolExecutor:
        if self._executor is None:
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(list(PRELOAD))
            self._executor = ProcessPoolExecutor(self.workers, mp_context=ctx, initializer=init_pool_process,
                                                 initargs=(dict(os.environ),))
        return self._executor

    def _restart(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        self._executor = None

    def close(self) -> None:
        """Stop the pool processes (queued documents are dropped)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None

    def _submit(self, uri: str) -> Future:
        return self._pool().submit(extract_document, uri, self.settings, self.roots)

    def _wait(self, future: Future, should_stop: Callable[[], bool]) -> Extracted | None:
        while True:
            try:
                return future.result(timeout=WAIT_SLICE_SECONDS)
            except FutureTimeout:
                if should_stop():
                    return None
            except OcrUnavailableError as exc:
                raise BadInputError(f"input.documents: {exc}") from None

    def _check_pool(self) -> None:
        """Make sure fresh pool processes start and answer (a no-op task).

        Raises:
            RuntimeError: they do not: the host cannot run the pool (the shard fails and is retried),
                so no document is dead-lettered for it.
        """
        try:
            self._pool().submit(os.getpid).result(timeout=120)
        except (BrokenProcessPool, FutureTimeout, OSError) as exc:
            self._restart()
            raise RuntimeError(f"the document extraction pool cannot start its processes: {exc!r}") from None

    def _alone(self, uri: str, should_stop: Callable[[], bool]) -> Extracted | None:
        """One document on its own (after a process died): a second death, in a pool that otherwise
        works, makes it a dead letter."""
        self._check_pool()
        try:
            return self._wait(self._submit(uri), should_stop)
        except BrokenProcessPool:
            self._restart()
            self._check_pool()
            return Extracted(text="", reason=DeadLetterReason.UNREADABLE_DOCUMENT, method="",
                             detail="the extraction process died reading this document (crash or out of memory)")

    def enqueue(self, uris: list[str]) -> None:
        """Queue documents for extraction behind those already queued; they are submitted as the window
        frees (at most ``queue_depth`` submitted and not yet collected), so the pool keeps working on
        them while the caller does other things. Collect them in the same order with :meth:`collect`."""
        self._pending.extend(uris)
        self._fill()

    def _fill(self) -> None:
        while self._pending and len(self._window) < self.depth:
            uri = self._pending.popleft()
            self._window.append((uri, self._submit(uri)))

    def _drop(self) -> None:
        """Forget everything queued, submitted or ready (a stop request: the caller is leaving)."""
        for _, future in self._window:
            future.cancel()
        self._window.clear()
        self._pending.clear()
        self._ready.clear()

    def collect(self, n: int, should_stop: Callable[[], bool] = lambda: False) -> list[Extracted] | None:
        """The extraction of the next ``n`` queued documents, in queue order.

        Returns:
            ``n`` :class:`~batch_worker.extract.Extracted`, or ``None`` when ``should_stop`` turned true
            while waiting (everything queued is dropped).

        Raises:
            BadInputError: OCR was needed and tesseract is missing on this host.
            ValueError: fewer than ``n`` documents are queued.
        """
        if n > len(self._ready) + len(self._window) + len(self._pending):
            raise ValueError(f"{n} documents asked for, {len(self._ready) + len(self._window) + len(self._pending)} queued")
        t0 = time.perf_counter()
        out: list[Extracted] = []
        while len(out) < n:
            if self._ready:
                out.append(self._ready.popleft())
                continue
            if should_stop():
                self._drop()
                return None
            self._fill()
            try:
                got = self._wait(self._window[0][1], should_stop)
            except BrokenProcessPool:
                self._restart()
                inflight = [uri for uri, _ in self._window]
                self._window.clear()
                for uri in inflight:  # the documents in flight when a process died: one at a time, in order
                    alone = self._alone(uri, should_stop)
                    if alone is None:
                        self._drop()
                        return None
                    self._ready.append(alone)
                continue
            if got is None:
                self._drop()
                return None
            self._window.popleft()
            out.append(got)
            self._fill()
        self.stats.add(out, time.perf_counter() - t0)
        return out

    def extract(self, uris: list[str], should_stop: Callable[[], bool] = lambda: False) -> list[Extracted] | None:
        """The extraction of every document of ``uris``, in the same order (:meth:`enqueue` then
        :meth:`collect`; nothing else may be queued).

        Returns:
            One :class:`~batch_worker.extract.Extracted` per URI, or ``None`` when ``should_stop``
            turned true while waiting (the rest is dropped).

        Raises:
            BadInputError: OCR was needed and tesseract is missing on this host.
        """
        self.enqueue(uris)
        return self.collect(len(uris), should_stop)


def apply_extraction(rows: ChunkRows, results: list[Extracted], text_column: str) -> tuple[ChunkRows, list[DeadLetter]]:
    """Split a chunk by its documents' extraction: rows with text (their text, and the ``text_column``
    of their fields, replaced by the extracted text) and a dead letter for every other row (reason and
    detail from the extractor; matched by source position on resume like every dead letter).

    Args:
        rows: the chunk's validated rows (texts are document URIs).
        results: one extraction per row, same order (:meth:`DocumentPool.extract`).
        text_column: the input's text column (the URI column), as named in ``rows.fields``.

    Raises:
        ValueError: ``results`` and ``rows`` differ in length.
    """
    if len(results) != len(rows):
        raise ValueError(f"{len(results)} extractions for {len(rows)} rows")
    keep = [i for i, r in enumerate(results) if r.reason is None]
    dead = [DeadLetter(rows.ids[i], r.reason, f"{rows.texts[i]!r:.300}: {r.detail}", rows.source_uri[i],
                       rows.source_row[i]) for i, r in enumerate(results) if r.reason is not None]
    kept = rows.take(keep)
    texts = [results[i].text for i in keep]
    fields = kept.fields
    if text_column in fields.column_names:
        fields = fields.set_column(fields.column_names.index(text_column), text_column, pa.array(texts, pa.string()))
    return ChunkRows(ids=kept.ids, texts=texts, text_repaired=kept.text_repaired, source_uri=kept.source_uri,
                     source_row=kept.source_row, fields=fields), dead
