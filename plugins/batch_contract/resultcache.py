"""Content-addressed result cache: rows computed by any earlier run under the same output root are reused.

Layout (one directory per result fingerprint, so a lookup can never see another fingerprint's rows)::

    <output_root>/cache/<result_fingerprint>/<12-digit sequence number>.parquet   the log, in order
    <output_root>/cache/<result_fingerprint>/quarantine/<name>                       torn files set aside

Each cache file is written by the worker right after it computes a chunk and *before* it commits the
chunk's part file, and holds, per computed row, the **key** (:func:`text_key`: the first 16 bytes of
SHA-256 of exactly the text the model sees, after UTF-8 repair) and the id-independent result columns
(``n_tokens``, ``truncated`` and the task columns: ``embedding`` or ``label`` + ``score``), plus
``fingerprint`` and ``compute_seconds`` (the measured seconds of the chunk that computed the row, shared
out by ``n_tokens``; the cost report prices reused rows with it). Ids are not in the cache: an edited
text under an old id misses, an unchanged text under a new id hits. The file's origin (run, shard, part)
is in its Parquet metadata (``batch_inference.origin``).

**One result per key.** The files form an append-only log: :func:`append_entries` takes the next free
sequence number with a create-only write, and tries ``n + 1`` only after ``n`` was found taken, so
file ``n`` exists before file ``n + 1`` is created (the log has no gaps, and its order is the order of
creation). The **winner** of a key is its row in the lowest-numbered file that holds it (the first
committed result). A worker that appended file ``k`` and then lists the log sees every file below ``k``,
so it finds the same winner as every other worker, and publishes the winner's bytes instead of its own
(:class:`ResultLog`). Identical texts computed at the same time by two shards, or by two runs, therefore
publish identical bytes, and a rerun copies exactly the bytes the earlier run published. Files of the
old layout (``<run>.<shard>.<part>.parquet``, no sequence number) are read before the log, by name.

Lookup (:func:`lookup`, :class:`ResultLog`) is per shard: the shard's keys are held in memory (16 bytes
each), and cache files are streamed one at a time (key column first; the other columns only of files
holding a winner), so memory is O(shard rows + one cache file), never O(cache). Every file is verified
first (:func:`batch_contract.partfiles.verify`: footer parses; its ``fingerprint`` statistics equal the
wanted one); a torn file is quarantined and its rows are simply misses (recomputed), a file of another
fingerprint is skipped, a file deleted meanwhile is a miss. Nothing here can fail a run: the worst case
is recomputation.

Retention: entries are kept until deleted. Deleting ``<output_root>/cache/<fingerprint>`` (or all of
``cache/``) when no run of that fingerprint is computing is safe. Deleting it while one computes never
loses or duplicates a row, but identical texts in that run may then publish two results (the winners it
had agreed on are gone).
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from batch_contract import storage
from batch_contract.layout import PARQUET_SUFFIX, TEMP_MARK, join_uri
from batch_contract.partfiles import QUARANTINE_DIR, TornFileError, quarantine, stats_fingerprint, verify
from batch_contract.schemas import parquet_write_options
from batch_contract.storage.base import AlreadyExistsError

log = logging.getLogger(__name__)

CACHE_DIR = "cache"
KEY_BYTES = 16
KEY_TYPE = pa.binary(KEY_BYTES)
ID_DEPENDENT = ("id", "fingerprint", "text_repaired")
"""Part-file columns that are not stored in the cache (they belong to the row, not to the text)."""
SEQ_DIGITS = 12
"""Digits of a log file's sequence number (zero-padded, so name order is log order)."""
ORIGIN_KEY = b"batch_inference.origin"
"""Parquet metadata key of a cache file's origin (``<run_id>/<shard_id>/<part name>``)."""
RELIST_AFTER = 16
"""Taken sequence numbers tried one by one before the log is listed again to jump to its end."""
MAX_APPEND_TRIES = 1000
"""Sequence numbers tried before :func:`append_entries` gives up (an error the caller logs)."""
_SEQ_NAME = re.compile(rf"\d{{{SEQ_DIGITS}}}{re.escape(PARQUET_SUFFIX)}")


def cache_dir(output_root: str, fingerprint: str) -> str:
    """``<output_root>/cache/<fingerprint>``: the cache of one result fingerprint."""
    if not fingerprint or "/" in fingerprint or fingerprint in {".", ".."}:
        raise ValueError(f"fingerprint {fingerprint!r} is not a safe path segment")
    return join_uri(output_root, CACHE_DIR, fingerprint)


def text_key(text: str) -> bytes:
    """Cache key of one input text: SHA-256 (first 16 bytes) of its UTF-8 bytes (the repaired text the
    model sees; the fingerprint is the cache directory, so it is not hashed in again)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()[:KEY_BYTES]


def text_keys(texts: list[str]) -> pa.Array:
    """:func:`text_key` of every text as a ``binary(16)`` array."""
    return pa.array([text_key(t) for t in texts], KEY_TYPE)


def cache_schema(part_schema: pa.Schema) -> pa.Schema:
    """Cache-file schema for a part schema: ``key``, ``fingerprint``, the id-independent part columns,
    ``compute_seconds``."""
    kept = [f for f in part_schema if f.name not in ID_DEPENDENT]
    return pa.schema([pa.field("key", KEY_TYPE, nullable=False),
                      pa.field("fingerprint", pa.string(), nullable=False),
                      *kept, pa.field("compute_seconds", pa.float32(), nullable=False)])


def cache_table(part: pa.Table, keys: pa.Array, compute_seconds: pa.Array) -> pa.Table:
    """The cache rows of a committed part table (``keys`` and ``compute_seconds`` in its row order)."""
    schema = cache_schema(part.schema)
    cols = {"key": keys, "fingerprint": part.column("fingerprint")}
    for f in schema:
        if f.name not in cols and f.name != "compute_seconds":
            cols[f.name] = part.column(f.name)
    cols["compute_seconds"] = compute_seconds.cast(pa.float32())
    return pa.table(cols, schema=schema)


def entry_name(seq: int) -> str:
    """Log file name of sequence number ``seq`` (``000000000042.parquet``)."""
    if seq < 0:
        raise ValueError(f"sequence number {seq} is negative")
    return f"{seq:0{SEQ_DIGITS}d}{PARQUET_SUFFIX}"


def log_order(name: str) -> tuple[int, str]:
    """Sort key of a cache file name in log order: old-layout names first (by name), then the log's
    sequence-numbered files (zero-padded, so by name)."""
    return (1 if _SEQ_NAME.fullmatch(name) else 0, name)


def origin_of(run_id: str, shard_id: str, part_name: str) -> str:
    """Origin recorded in a cache file's metadata: ``<run_id>/<shard_id>/<part name>``."""
    return f"{run_id}/{shard_id}/{part_name}"


def _next_seq(names: Iterable[str]) -> int:
    seqs = [int(n[:SEQ_DIGITS]) for n in names if _SEQ_NAME.fullmatch(n)]
    return max(seqs) + 1 if seqs else 0


def append_entries(output_root: str, fingerprint: str, table: pa.Table, origin: str) -> str:
    """Append one cache file to the fingerprint's log and return its name.

    The file takes the lowest free sequence number above the last one listed: a create-only write of
    ``n``; when ``n`` is taken, ``n + 1`` (so ``n + 1`` is only ever created after ``n`` exists: the log
    has no gaps and its order is creation order, which :class:`ResultLog`'s winner rule needs). After
    :data:`RELIST_AFTER` taken numbers in a row it lists the log again and jumps to its end.

    Raises:
        StorageError / OSError: the backend failed.
        RuntimeError: :data:`MAX_APPEND_TRIES` numbers were all taken (a log growing faster than this
            worker can write).
    """
    sink = pa.BufferOutputStream()
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), ORIGIN_KEY: origin.encode()})
    pq.write_table(table, sink, **parquet_write_options(table.schema))
    data = sink.getvalue().to_pybytes()
    directory = cache_dir(output_root, fingerprint)
    seq = _next_seq(storage.list_names(directory))
    for attempt in range(1, MAX_APPEND_TRIES + 1):
        name = entry_name(seq)
        try:
            storage.write_create_only(join_uri(directory, name), data)
            return name
        except AlreadyExistsError:
            seq += 1  # ``seq`` exists, so ``seq + 1`` may be created without leaving a gap
        if attempt % RELIST_AFTER == 0:
            seq = max(seq, _next_seq(storage.list_names(directory)))
    raise RuntimeError(f"result cache {directory}: no free sequence number after {MAX_APPEND_TRIES} tries")


@dataclass
class LookupResult:
    """Hits of one lookup.

    Attributes:
        table: one row per distinct hit key: the cache columns (``key``, ``fingerprint``, results,
            ``compute_seconds``).
        row_hit: per query row, the index into ``table`` of its hit, or null (a miss).
        files_read / files_skipped / files_quarantined: cache files scanned, skipped (another
            fingerprint, gone meanwhile, unreadable), set aside as torn.
        log: the :class:`ResultLog` the lookup scanned with (it keeps tracking the same keys).
    """

    table: pa.Table | None
    row_hit: pa.Array
    files_read: int = 0
    files_skipped: int = 0
    files_quarantined: int = 0
    skipped: list[str] = field(default_factory=list)
    log: ResultLog | None = None

    @property
    def hits(self) -> int:
        return len(self.row_hit) - self.row_hit.null_count


def _read(uri: str, columns: list[str] | None) -> pa.Table:
    fs, path = storage.arrow_filesystem(uri)
    with fs.open_input_file(path) as fh:
        return pq.read_table(fh, columns=columns)


def cache_files(output_root: str, fingerprint: str) -> list[str]:
    """Committed cache file names of a fingerprint (temp files and ``quarantine/`` excluded), in log
    order (:func:`log_order`)."""
    try:
        names = storage.list_names(cache_dir(output_root, fingerprint))
    except FileNotFoundError:
        return []
    kept = (n for n in names if n.endswith(PARQUET_SUFFIX) and TEMP_MARK not in n and n != QUARANTINE_DIR)
    return sorted(kept, key=log_order)


class ResultLog:
    """The winners of a fixed set of keys in one fingerprint's log, kept current as the log grows.

    The winner of a key is its row in the first log file (:func:`log_order`) that holds it (module
    docstring). The log remembers the last file it scanned (its horizon) and, on :meth:`advance`, reads
    only the files after it, and only their ``key`` column; :meth:`fetch` reads the result rows of
    winners. Thread-safe: the worker's reading thread and its engine thread share one.

    Args:
        output_root / fingerprint: whose cache.
        keys: the keys to track (``bytes`` of :data:`KEY_BYTES`; ``None`` entries, rows that cannot be
            keyed, are ignored). More can be added with :meth:`track`.

    Memory: one set or dict entry per tracked key (16 bytes plus a file-name reference).
    """

    def __init__(self, output_root: str, fingerprint: str, keys: Iterable[bytes | None]) -> None:
        self.output_root = output_root
        self.fingerprint = fingerprint
        self.directory = cache_dir(output_root, fingerprint)
        self.files_read = 0
        self.files_skipped = 0
        self.files_quarantined = 0
        self.skipped: list[str] = []
        self._pending: set[bytes] = {k for k in keys if k is not None}
        self._pending_array: pa.Array | None = None
        self._winner: dict[bytes, str] = {}
        self._horizon: tuple[int, str] | None = None
        self._lock = threading.RLock()

    def winner(self, key: bytes | None) -> str | None:
        """Name of the log file holding ``key``'s winner, or ``None`` (no winner among the files scanned)."""
        with self._lock:
            return self._winner.get(key) if key is not None else None

    def winners(self) -> list[bytes]:
        """Every tracked key that has a winner."""
        with self._lock:
            return list(self._winner)

    def track(self, keys: Iterable[bytes | None]) -> None:
        """Track more keys: the files already scanned are read again for them (from the first)."""
        with self._lock:
            new = {k for k in keys if k is not None and k not in self._pending and k not in self._winner}
            if not new:
                return
            if self._horizon is not None:
                for name in self._listed():
                    if log_order(name) > self._horizon:
                        break
                    new -= set(self._scan(name, pa.array(list(new), KEY_TYPE), new))
                    if not new:
                        break
            self._pending |= new
            self._pending_array = None

    def advance(self, until: str | None = None) -> None:
        """Read the log files after the horizon, up to ``until`` (a file name, inclusive; ``None``: the
        end of the log as listed now), for tracked keys still without a winner, and move the horizon.
        Never raises for a bad or vanished cache file (its rows are misses)."""
        with self._lock:
            stop = log_order(until) if until is not None else None
            for name in self._listed():
                order = log_order(name)
                if self._horizon is not None and order <= self._horizon:
                    continue
                if stop is not None and order > stop:
                    break
                if self._pending:
                    # the array may still hold keys found since it was built (rebuilt once half are gone):
                    # _scan only records keys that are still pending
                    if self._pending_array is None or 2 * len(self._pending) < len(self._pending_array):
                        self._pending_array = pa.array(list(self._pending), KEY_TYPE)
                    found = self._scan(name, self._pending_array, self._pending)
                    self._pending.difference_update(found)
                self._horizon = order

    def fetch(self, keys: Iterable[bytes]) -> pa.Table | None:
        """The winner rows (cache columns, one row per key) of those ``keys`` that have a winner, or
        ``None`` when none has. A winner whose file vanished or became unreadable since it was scanned
        is left out (logged): the caller computes or keeps its own result."""
        with self._lock:
            by_file: dict[str, list[bytes]] = {}
            for k in set(keys):
                name = self._winner.get(k)
                if name is not None:
                    by_file.setdefault(name, []).append(k)
        found: list[pa.Table] = []
        for name, file_keys in sorted(by_file.items(), key=lambda item: log_order(item[0])):
            uri = join_uri(self.directory, name)
            try:
                rows = _read(uri, None)
                rows = rows.filter(pc.is_in(rows.column("key"), value_set=pa.array(file_keys, KEY_TYPE)))
                rows = rows.take(_first_per_key(rows.column("key")))
            except (FileNotFoundError, pa.ArrowException, OSError, KeyError) as exc:
                log.warning("result cache: %s unreadable since it was scanned (%s): its winners are left out", uri, exc)
                continue
            found.append(rows.replace_schema_metadata(None))
        if not found:
            return None
        # one chunk per column: Arrow's take over many chunks is 30-50x slower (callers take from it)
        return pa.concat_tables(found, promote_options="none").combine_chunks()

    def _listed(self) -> list[str]:
        return cache_files(self.output_root, self.fingerprint)

    def _scan(self, name: str, wanted: pa.Array, pending: set[bytes]) -> list[bytes]:
        """Record ``name`` as the winner of the keys it holds that are in ``wanted`` and still in
        ``pending``; returns them."""
        uri = join_uri(self.directory, name)
        try:
            meta = verify(uri)
            if stats_fingerprint(meta) != self.fingerprint:
                self.files_skipped += 1
                self.skipped.append(name)
                log.warning("result cache: %s is not of fingerprint %s: skipped", uri, self.fingerprint)
                return []
            file_keys = _read(uri, ["key"]).column("key")
            hits = [k for k in pc.unique(pc.filter(file_keys, pc.is_in(file_keys, value_set=wanted))).to_pylist()
                    if k in pending]
        except FileNotFoundError:
            self.files_skipped += 1
            return []
        except TornFileError as exc:
            quarantine(self.directory, name, f"torn result-cache file ({exc})")
            self.files_quarantined += 1
            return []
        except (pa.ArrowException, OSError, KeyError) as exc:
            log.warning("result cache: %s unreadable (%s): its rows are misses", uri, exc)
            self.files_skipped += 1
            self.skipped.append(name)
            return []
        self.files_read += 1
        for k in hits:
            self._winner[k] = name
        return hits


def lookup(output_root: str, fingerprint: str, keys: pa.Array) -> LookupResult:
    """Find the cached winners for ``keys`` (``binary(16)``, one per query row; repeats and nulls
    allowed: a null is always a miss) in the whole log.

    Streams the fingerprint's cache files one at a time in log order (see the module docstring); once
    every distinct key has a winner the remaining files are not read. Never raises for a bad cache file:
    it is a miss. The returned :attr:`LookupResult.log` keeps tracking the same keys.
    """
    result_log = ResultLog(output_root, fingerprint, keys.to_pylist())
    result_log.advance()
    result = LookupResult(table=None, row_hit=pa.nulls(len(keys), pa.int32()), log=result_log)
    table = result_log.fetch(result_log.winners())
    if table is not None:
        result.table = table
        result.row_hit = pc.index_in(keys, value_set=table.column("key"))
    result.files_read, result.files_skipped = result_log.files_read, result_log.files_skipped
    result.files_quarantined, result.skipped = result_log.files_quarantined, list(result_log.skipped)
    return result


def _first_per_key(keys: pa.ChunkedArray) -> pa.Array:
    """Indices of the first row of each distinct key (a key repeated inside one cache file: same text
    computed twice in one chunk under two ids)."""
    seen: set[bytes] = set()
    out = []
    for i, k in enumerate(keys.to_pylist()):
        if k not in seen:
            seen.add(k)
            out.append(i)
    return pa.array(out, pa.int64())
