"""Content-addressed result cache: rows computed by any earlier run under the same output root are reused.

Layout (one directory per result fingerprint, so a lookup can never see another fingerprint's rows)::

    <output_root>/cache/<result_fingerprint>/<run_id>.<shard_id>.<part name>.parquet
    <output_root>/cache/<result_fingerprint>/quarantine/<name>          torn cache files set aside

Each cache file is written by the worker right after it commits a computed part file (create-only, the
same encodings as part files) and holds, per computed row, the **key** (:func:`text_key`: the first 16
bytes of SHA-256 of exactly the text the model sees, after UTF-8 repair) and the id-independent result
columns (``n_tokens``, ``truncated`` and the task columns: ``embedding`` or ``label`` + ``score``),
plus ``fingerprint`` and ``compute_seconds`` (the measured seconds of the chunk that computed the row,
shared out by ``n_tokens``; the cost report prices reused rows with it). Ids are not in the cache: an
edited text under an old id misses, an unchanged text under a new id hits.

Lookup (:func:`lookup`) is per shard: the shard's keys are held in memory (16 bytes each), and cache
files are streamed one at a time (key column first; the other columns only of files with a hit), so
memory is O(shard rows + one cache file), never O(cache). Every file is verified first
(:func:`batch_contract.partfiles.verify`: footer parses; its ``fingerprint`` statistics equal the
wanted one); a torn file is quarantined and its rows are simply misses (recomputed), a file of another
fingerprint is skipped, a file deleted meanwhile is a miss. Nothing here can fail a run: the worst case
is recomputation.

Retention: entries are kept until deleted. Deleting ``<output_root>/cache/<fingerprint>`` (or all of
``cache/``) at any time is safe: a worker that already copied a hit into its run's part files keeps it;
one that lists a file that is then deleted treats its rows as misses.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from batch_contract import storage
from batch_contract.layout import PARQUET_SUFFIX, TEMP_MARK, join_uri
from batch_contract.partfiles import QUARANTINE_DIR, TornFileError, quarantine, stats_fingerprint, verify
from batch_contract.schemas import parquet_write_options

log = logging.getLogger(__name__)

CACHE_DIR = "cache"
KEY_BYTES = 16
KEY_TYPE = pa.binary(KEY_BYTES)
ID_DEPENDENT = ("id", "fingerprint", "text_repaired")
"""Part-file columns that are not stored in the cache (they belong to the row, not to the text)."""


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


def write_entries(output_root: str, fingerprint: str, name: str, table: pa.Table) -> str:
    """Commit one cache file (create-only: visible only complete) and return its URI."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, **parquet_write_options(table.schema))
    uri = join_uri(cache_dir(output_root, fingerprint), name)
    storage.write_create_only(uri, sink.getvalue().to_pybytes())
    return uri


def entry_name(run_id: str, shard_id: str, part_name: str) -> str:
    """Cache file name for the part ``part_name`` of shard ``shard_id`` of run ``run_id``."""
    return f"{run_id}.{shard_id}.{part_name}"


@dataclass
class LookupResult:
    """Hits of one lookup.

    Attributes:
        table: one row per distinct hit key: the cache columns (``key``, ``fingerprint``, results,
            ``compute_seconds``).
        row_hit: per query row, the index into ``table`` of its hit, or null (a miss).
        files_read / files_skipped / files_quarantined: cache files scanned, skipped (another
            fingerprint, gone meanwhile, unreadable), set aside as torn.
    """

    table: pa.Table | None
    row_hit: pa.Array
    files_read: int = 0
    files_skipped: int = 0
    files_quarantined: int = 0
    skipped: list[str] = field(default_factory=list)

    @property
    def hits(self) -> int:
        return len(self.row_hit) - self.row_hit.null_count


def _read(uri: str, columns: list[str] | None) -> pa.Table:
    fs, path = storage.arrow_filesystem(uri)
    with fs.open_input_file(path) as fh:
        return pq.read_table(fh, columns=columns)


def cache_files(output_root: str, fingerprint: str) -> list[str]:
    """Committed cache file names of a fingerprint (temp files and ``quarantine/`` excluded), sorted."""
    try:
        names = storage.list_names(cache_dir(output_root, fingerprint))
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.endswith(PARQUET_SUFFIX) and TEMP_MARK not in n and n != QUARANTINE_DIR)


def lookup(output_root: str, fingerprint: str, keys: pa.Array) -> LookupResult:
    """Find cached results for ``keys`` (``binary(16)``, one per query row; repeats and nulls allowed:
    a null is always a miss).

    Streams the fingerprint's cache files one at a time (see the module docstring); stops as soon as
    every distinct key was found. Never raises for a bad cache file: it is a miss.
    """
    wanted = pc.unique(pc.drop_null(keys))  # a null key (a row the engine cannot key) is a miss
    found: list[pa.Table] = []
    result = LookupResult(table=None, row_hit=pa.nulls(len(keys), pa.int32()))
    directory = cache_dir(output_root, fingerprint)
    for name in cache_files(output_root, fingerprint):
        if len(wanted) == 0:
            break
        uri = join_uri(directory, name)
        try:
            meta = verify(uri)
            if stats_fingerprint(meta) != fingerprint:
                result.files_skipped += 1
                result.skipped.append(name)
                log.warning("result cache: %s is not of fingerprint %s: skipped", uri, fingerprint)
                continue
            file_keys = _read(uri, ["key"]).column("key")
            mask = pc.is_in(file_keys, value_set=wanted)
            if not pc.any(mask).as_py():
                result.files_read += 1
                continue
            rows = _read(uri, None).filter(mask)
            if set(rows.column("fingerprint").unique().to_pylist()) != {fingerprint}:
                raise TornFileError(f"rows of another fingerprint in {name}")
        except FileNotFoundError:
            result.files_skipped += 1
            continue
        except TornFileError as exc:
            quarantine(directory, name, f"torn result-cache file ({exc})")
            result.files_quarantined += 1
            continue
        except (pa.ArrowException, OSError, KeyError) as exc:
            log.warning("result cache: %s unreadable (%s): its rows are misses", uri, exc)
            result.files_skipped += 1
            result.skipped.append(name)
            continue
        result.files_read += 1
        rows = rows.take(pc.indices_nonzero(pc.invert(pc.is_in(rows.column("key"), value_set=_found_keys(found)))))
        found.append(rows)
        wanted = pc.filter(wanted, pc.invert(pc.is_in(wanted, value_set=rows.column("key"))))
    if found:
        table = pa.concat_tables(found, promote_options="none")
        table = table.take(_first_per_key(table.column("key")))
        result.table = table
        result.row_hit = pc.index_in(keys, value_set=table.column("key"))
    return result


def _found_keys(found: list[pa.Table]) -> pa.Array:
    if not found:
        return pa.array([], KEY_TYPE)
    return pa.concat_arrays([c for t in found for c in t.column("key").chunks])


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
