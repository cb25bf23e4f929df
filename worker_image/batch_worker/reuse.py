"""Reuse pass: carry rows an earlier run already computed over from the result cache, before the model loads.

Runs once per attempt, after the resume ledger and before ``engine.load()``
(:mod:`batch_contract.resultcache` has the cache format and the lookup):

1. read the shard's rows (id and text columns only) and validate them exactly as the main pass will
   (a copy of the resume ledger, so rows committed earlier are skipped the same way);
2. key every valid row (:func:`~batch_contract.resultcache.text_key` of its repaired text) and look the
   shard's keys up in ``<output_root>/cache/<result fingerprint>/`` (memory: the shard's keys only);
3. commit the hits as ordinary part files named ``part-<chunk>-reuse-<uuid>.parquet`` (id, the current
   fingerprint and ``text_repaired`` from the row; ``n_tokens``, ``truncated`` and the outputs from the
   cache, bit for bit); when nothing is left to compute, also commit the shard's dead letters, so the
   shard completes **without loading the model**.

The main pass then skips the reused ids like any committed row (resume), so only misses reach the
engine. The key is the engine's (``Engine.reuse_keys``): the encoder hashes the repaired text, the LLM
its whole rendered prompt (tokenizer only, no vLLM start); sampling and templates are in the
fingerprint, which is the cache directory.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from batch_contract import resultcache
from batch_contract.engine_config import WorkerSettings
from batch_contract.layout import DEAD_LETTER_PREFIX, PART_PREFIX
from batch_contract.manifest import InputSpec, Segment
from batch_contract.schemas import COMMON_FIELDS

from batch_worker.engines.base import Engine
from batch_worker.ledger import Ledger
from batch_worker.reader import iter_shard_blocks
from batch_worker.validate import DeadLetter, Validator
from batch_worker.writer import commit_table, dead_letter_table

log = logging.getLogger("batch_worker")

REUSE_MODES = ("off", "same_root")
REUSE_PART_ROWS = 50_000
"""Rows per reused part file (each row is a few hundred floats: about 80 MB per file at 384 dims)."""


def reuse_enabled(engine: Engine, settings: WorkerSettings, spec: InputSpec | None = None) -> bool:
    """Whether this shard reads and writes the result cache: ``worker.reuse == "same_root"``, an
    engine whose result depends only on what it keys (``Engine.reuses_results``) and an input whose
    text column is text (``spec.documents`` unset: the reuse pass would key document URIs, not their
    text, and it runs before any extraction)."""
    if spec is not None and spec.documents is not None:
        return False
    return settings.reuse == "same_root" and engine.reuses_results


@dataclass
class ReuseOutcome:
    """What the reuse pass did.

    Attributes:
        rows_reused: rows committed from the cache.
        seconds_avoided: sum of the reused rows' ``compute_seconds`` (what computing them cost the runs
            that did).
        rows_to_compute: valid rows still without a result (misses): 0 means the model is not needed.
        dead_committed: dead letters committed here (only when ``rows_to_compute`` is 0).
        files: committed file name -> commit record (size, SHA-256).
        part_schema: schema of the reused parts (``None`` without hits).
        hash_seconds / lookup_seconds / read_seconds: measured cost of the pass's steps.
        cache_files_read / cache_files_skipped / cache_files_quarantined: see ``LookupResult``.
        log: the lookup's :class:`~batch_contract.resultcache.ResultLog`, which keeps tracking the
            shard's keys for the main pass (``batch_worker.dedupe``).
    """

    rows_reused: int = 0
    seconds_avoided: float = 0.0
    rows_to_compute: int = 0
    dead_committed: int = 0
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    part_schema: pa.Schema | None = None
    hash_seconds: float = 0.0
    lookup_seconds: float = 0.0
    read_seconds: float = 0.0
    cache_files_read: int = 0
    cache_files_skipped: int = 0
    cache_files_quarantined: int = 0
    log: resultcache.ResultLog | None = None


@dataclass
class _ShardRows:
    ids: list[str] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)
    repaired: list[bool] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)


def part_schema_from_cache(cache: pa.Schema) -> pa.Schema:
    """The part schema whose cache schema is ``cache`` (inverse of ``resultcache.cache_schema``)."""
    skip = {"key", "fingerprint", "compute_seconds"} | {f.name for f in COMMON_FIELDS}
    return pa.schema(COMMON_FIELDS + [f for f in cache if f.name not in skip])


def _read_shard(engine: Engine, spec: InputSpec, segments: list[Segment], settings: WorkerSettings, ledger: Ledger,
                should_stop: Callable[[], bool], out: ReuseOutcome) -> _ShardRows | None:
    """Validated, keyed rows of the shard not yet committed (``None`` when stopped by a signal); a row
    the engine cannot key has the key ``None`` (a miss)."""
    validator = Validator(spec.id_column, set(ledger.done_ids), set(ledger.done_dead), text_column=spec.text_column)
    rows = _ShardRows()
    blocks = iter_shard_blocks(spec, segments, settings.read_batch_rows, engine.extra_columns(), settings)
    while True:
        t0 = time.perf_counter()
        block = next(blocks, None)
        out.read_seconds += time.perf_counter() - t0
        if block is None:
            return rows
        vb = validator.validate(block)
        t0 = time.perf_counter()
        rows.keys.extend(engine.reuse_keys(vb.rows))
        out.hash_seconds += time.perf_counter() - t0
        rows.ids.extend(vb.rows.ids)
        rows.repaired.extend(vb.rows.text_repaired)
        rows.dead.extend(vb.dead)
        if should_stop():
            return None


def reuse_pass(*, engine: Engine, output_root: str, run_id: str, shard_id: str, shard_dir: str, fingerprint: str,
               spec: InputSpec, segments: list[Segment], settings: WorkerSettings, ledger: Ledger,
               should_stop: Callable[[], bool]) -> ReuseOutcome | None:
    """Run the reuse pass of one shard (see the module docstring).

    Returns:
        What was done, or ``None`` when a signal stopped it before anything was committed.

    Raises:
        BadInputError: the input cannot be read (the main pass would fail the same way).
        OSError: committing a part file failed (the attempt fails and is retried).
    """
    out = ReuseOutcome()
    rows = _read_shard(engine, spec, segments, settings, ledger, should_stop, out)
    if rows is None:
        return None
    t0 = time.perf_counter()
    found = resultcache.lookup(output_root, fingerprint, pa.array(rows.keys, resultcache.KEY_TYPE))
    out.lookup_seconds = time.perf_counter() - t0
    out.cache_files_read, out.cache_files_skipped = found.files_read, found.files_skipped
    out.cache_files_quarantined = found.files_quarantined
    out.log = found.log
    out.rows_to_compute = len(rows.ids) - found.hits
    chunk = ledger.next_chunk
    if found.hits:
        hit_rows = pc.indices_nonzero(pc.is_valid(found.row_hit)).to_pylist()
        cache = found.table
        out.part_schema = part_schema_from_cache(cache.schema)
        for start in range(0, len(hit_rows), REUSE_PART_ROWS):
            take = hit_rows[start:start + REUSE_PART_ROWS]
            cached = cache.take(pc.take(found.row_hit, pa.array(take, pa.int64())))
            part = _part_table([rows.ids[i] for i in take], [rows.repaired[i] for i in take], cached,
                               fingerprint, out.part_schema)
            name, digest = commit_table(shard_dir, PART_PREFIX, chunk, part, reused=True)
            out.files[name] = digest
            out.rows_reused += part.num_rows
            out.seconds_avoided += float(pc.sum(cached.column("compute_seconds")).as_py() or 0.0)
            chunk += 1
    if out.rows_to_compute == 0 and rows.dead:
        name, digest = commit_table(shard_dir, DEAD_LETTER_PREFIX, chunk, dead_letter_table(rows.dead, fingerprint))
        out.files[name] = digest
        out.dead_committed = len(rows.dead)
    log.info("shard %s: reused %d rows from the result cache (%d cache files read, %d skipped, %d torn), "
             "%d rows to compute; hashing %.3f s, lookup %.3f s", shard_id, out.rows_reused,
             out.cache_files_read, out.cache_files_skipped, out.cache_files_quarantined, out.rows_to_compute,
             out.hash_seconds, out.lookup_seconds)
    return out


def _part_table(ids: list[str], repaired: list[bool], cached: pa.Table, fingerprint: str,
                schema: pa.Schema) -> pa.Table:
    cols: dict[str, Any] = {}
    for f in schema:
        if f.name == "id":
            cols[f.name] = pa.array(ids, f.type)
        elif f.name == "fingerprint":
            cols[f.name] = pa.array([fingerprint] * len(ids), f.type)
        elif f.name == "text_repaired":
            cols[f.name] = pa.array(repaired, f.type)
        else:
            cols[f.name] = cached.column(f.name)
    return pa.table(cols, schema=schema)
