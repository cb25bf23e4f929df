"""One result per key: identical inputs are computed once and publish the same bytes.

A key is what the engine hashes (``Engine.reuse_keys``: the encoder's repaired text, the LLM's rendered
prompt). Two steps, both only for engines whose result depends on the key alone
(``Engine.reuses_results``):

* :meth:`Deduper.split` (the reading thread, before ``engine.prepare``): of a chunk's rows, only the first
  row of each key goes to the engine. A row is a **copy** when another row of the chunk has its key,
  when an earlier chunk of this attempt sent its key to the engine, or when the result cache's log
  (:class:`~batch_contract.resultcache.ResultLog`) already holds its key (another shard or run computed
  it since this shard's reuse pass).
* :meth:`Deduper.settle` (the engine thread, after ``engine.process``): appends the computed rows to the
  log (:func:`~batch_contract.resultcache.append_entries`), reads the log up to that file, and gives every
  computed row and every copy its key's **winner** (the first result committed for it; see
  :mod:`batch_contract.resultcache`). A computed row whose key another worker committed first publishes
  that worker's bytes, not its own; a copy of a row the engine dead-lettered is dead-lettered with the
  same reason. Copies the chunk cannot settle (their row was dead-lettered in an earlier chunk, or the
  cache could not be written) are computed then and there.

Without the result cache (``reuse: off``) only the first step's in-chunk part runs: identical texts of
one chunk are computed once and share one result; the same text in two chunks or shards is computed
twice and may differ in the last bits (bf16 kernels depend on the batch).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import pyarrow as pa
import pyarrow.compute as pc
from batch_contract import resultcache
from batch_contract.resultcache import ResultLog

from batch_worker.engines.base import ChunkOutput, ChunkRows, Engine, Reject
from batch_worker.validate import concat_rows
from batch_worker.writer import assemble_part

log = logging.getLogger("batch_worker")


@dataclass
class Split:
    """A chunk's rows split by :meth:`Deduper.split`.

    Attributes:
        compute: rows for the engine (one per key; rows without a key are always computed).
        compute_keys: their keys, same order (``None``: the row cannot be keyed).
        copies: rows that take the result of another row with the same key.
        copy_keys: their keys, same order.
    """

    compute: ChunkRows
    compute_keys: list[bytes | None]
    copies: ChunkRows
    copy_keys: list[bytes] = field(default_factory=list)


@dataclass
class Settled:
    """A chunk's outcome after :meth:`Deduper.settle`.

    Attributes:
        rows: every row that has a result or a reject (computed rows, then settled copies).
        output: ``table`` (``id`` + result columns: winner bytes) and ``rejects`` over ``rows``; its
            tokens, seconds and batch count are the engine's (copies cost nothing).
        processed: rows the engine itself returned (results + rejects), for the progress counters.
        copies_settled: copies given a result or a reject.
        cache_file: the log file this chunk appended, or ``None``.
    """

    rows: ChunkRows
    output: ChunkOutput
    processed: int
    copies_settled: int = 0
    cache_file: str | None = None


class Deduper:
    """Per-attempt state of the one-result-per-key rule (see the module docstring).

    Args:
        engine: the shard's engine (its ``reuse_keys``).
        result_log: the shard's :class:`ResultLog` (from the reuse pass), or ``None`` without the cache.
        fingerprint: the shard's result fingerprint (the cache directory and part files' column).
    """

    def __init__(self, engine: Engine, result_log: ResultLog | None, fingerprint: str) -> None:
        self.engine = engine
        self.log = result_log
        self.fingerprint = fingerprint
        self.emitted: set[bytes] = set()
        """Keys this attempt sent to the engine (only tracked with the log, which settles their copies)."""

    # -- reading thread ---------------------------------------------------------------------------------
    def split(self, rows: ChunkRows) -> Split:
        """Split ``rows`` into the rows to compute and the copies (module docstring)."""
        keys = self.engine.reuse_keys(rows) if len(rows) else []
        if self.log is not None and keys:
            self.log.track(keys)
            self.log.advance()
        compute: list[int] = []
        copies: list[int] = []
        seen: set[bytes] = set()
        for i, key in enumerate(keys):
            if key is None:
                compute.append(i)
            elif key in seen or key in self.emitted or (self.log is not None and self.log.winner(key) is not None):
                copies.append(i)
            else:
                seen.add(key)
                compute.append(i)
        if self.log is not None:
            self.emitted |= seen
        return Split(compute=rows.take(compute), compute_keys=[keys[i] for i in compute],
                     copies=rows.take(copies), copy_keys=[keys[i] for i in copies])

    # -- engine thread ----------------------------------------------------------------------------------
    def settle(self, split: Split, out: ChunkOutput, part_schema: pa.Schema, *,
               compute_more: Callable[[ChunkRows], ChunkOutput], seconds: Callable[[], float],
               origin: str) -> Settled:
        """Give the computed rows and the copies of one chunk their winners' results.

        Args:
            split: the chunk as :meth:`split` made it.
            out: the engine's output for ``split.compute``.
            part_schema: the part-file schema (``LoadedModel.part_schema``).
            compute_more: runs the engine on rows (prepare + process) for copies nothing can settle.
            seconds: the chunk's measured seconds so far (the cache's ``compute_seconds``).
            origin: the cache file's origin (:func:`~batch_contract.resultcache.origin_of`).
        """
        rows, keys = split.compute, list(split.compute_keys)
        processed = out.table.num_rows + len(out.rejects)
        copies, copy_keys = split.copies, list(split.copy_keys)
        if len(copies) and not out.interrupted:
            rows, keys, out, copies, copy_keys, more = self._compute_unsettled(rows, keys, out, copies, copy_keys,
                                                                                compute_more)
            processed += more
        key_of = dict(zip(rows.ids, keys, strict=True))
        cache_file = self._append(rows, key_of, out, part_schema, seconds(), origin)
        own_row: dict[bytes, int] = {}
        for i, rid in enumerate(out.table.column("id").to_pylist()):
            key = key_of[rid]
            if key is not None:
                own_row.setdefault(key, i)
        rejected = {key_of[r.id]: r for r in out.rejects if key_of[r.id] is not None}
        wanted = [k for k in [*own_row, *copy_keys] if self._winner_elsewhere(k, cache_file)]
        fetched = self.log.fetch(wanted) if (self.log is not None and wanted) else None
        fetched_row = {k: i for i, k in enumerate(fetched.column("key").to_pylist())} if fetched is not None else {}
        own_ids = out.table.column("id").to_pylist()
        n_own = len(own_ids)
        source = [n_own + fetched_row[key_of[rid]] if key_of[rid] in fetched_row else i
                  for i, rid in enumerate(own_ids)]
        ids = list(own_ids)
        settled: list[int] = []
        rejects = list(out.rejects)
        for j, key in enumerate(copy_keys):
            if key in fetched_row:
                source.append(n_own + fetched_row[key])
            elif key in own_row:
                source.append(own_row[key])
            elif key in rejected:
                rejects.append(Reject(copies.ids[j], rejected[key].reason, rejected[key].detail))
                settled.append(j)
                continue
            else:
                continue  # interrupted before its row was computed: left for the next attempt
            ids.append(copies.ids[j])
            settled.append(j)
        table = _take_results(out.table, fetched, source, ids, part_schema)
        all_rows = concat_rows([rows, copies.take(settled)]) if settled else rows
        if settled or fetched is not None:
            log.debug("chunk: %d copies settled, %d results taken from earlier cache files",
                      len(settled), len(fetched_row))
        return Settled(rows=all_rows, output=replace(out, table=table, rejects=rejects), processed=processed,
                       copies_settled=len(settled), cache_file=cache_file)

    def _winner_elsewhere(self, key: bytes, own_file: str | None) -> bool:
        if self.log is None:
            return False
        winner = self.log.winner(key)
        return winner is not None and winner != own_file

    def _compute_unsettled(self, rows: ChunkRows, keys: list[bytes | None], out: ChunkOutput, copies: ChunkRows,
                           copy_keys: list[bytes], compute_more: Callable[[ChunkRows], ChunkOutput]) -> tuple:
        """Compute (one per key) the copies whose key has no result in this chunk and no winner in the log."""
        own = set(keys)
        if self.log is not None:
            self.log.advance()
        first: dict[bytes, int] = {}
        for j, key in enumerate(copy_keys):
            if key not in own and key not in first and (self.log is None or self.log.winner(key) is None):
                first[key] = j
        if not first:
            return rows, keys, out, copies, copy_keys, 0
        idx = sorted(first.values())
        more = compute_more(copies.take(idx))
        rest = [j for j in range(len(copies)) if j not in set(idx)]
        merged = ChunkOutput(
            table=pa.concat_tables([out.table, more.table.select(out.table.column_names)], promote_options="default"),
            rejects=[*out.rejects, *more.rejects], interrupted=out.interrupted or more.interrupted,
            tokens=out.tokens + more.tokens,
            stage_seconds={k: out.stage_seconds.get(k, 0.0) + more.stage_seconds.get(k, 0.0)
                           for k in {*out.stage_seconds, *more.stage_seconds}},
            batches=out.batches + more.batches)
        return (concat_rows([rows, copies.take(idx)]), [*keys, *(copy_keys[j] for j in idx)], merged,
                copies.take(rest), [copy_keys[j] for j in rest], more.table.num_rows + len(more.rejects))

    def _append(self, rows: ChunkRows, key_of: dict[str, bytes | None], out: ChunkOutput, part_schema: pa.Schema,
                seconds: float, origin: str) -> str | None:
        """Append the computed, keyed rows to the log and read the log up to that file; the file's name,
        or ``None`` (no log, nothing keyed, or the write failed: logged, the rows keep their own bytes)."""
        if self.log is None or out.table.num_rows == 0:
            return None
        try:
            part = assemble_part(rows, out, self.fingerprint, part_schema)
        except Exception:  # noqa: BLE001 - the cache must never fail a shard
            log.exception("could not add %s to the result cache (its rows keep their own results)", origin)
            return None
        return append_part(self.log, self.fingerprint, part, key_of, seconds, origin)


def append_part(result_log: ResultLog, fingerprint: str, part: pa.Table, key_of: dict[str, bytes | None],
                seconds: float, origin: str) -> str | None:
    """Append the keyed rows of ``part`` (a part-file table) to the log and read the log up to that file.

    Args:
        key_of: id -> key (``None``: the row cannot be keyed and is left out).
        seconds: what computing ``part`` cost, shared out over its rows by ``n_tokens``.

    Returns:
        The appended file's name, or ``None`` when nothing was keyed or the write failed (logged: the
        cache must never fail a shard; the rows keep their own results).
    """
    try:
        ids = part.column("id").to_pylist()
        keyed = [i for i, rid in enumerate(ids) if key_of.get(rid) is not None]
        if not keyed:
            return None
        part = part.take(pa.array(keyed, pa.int64()))
        keys = pa.array([key_of[ids[i]] for i in keyed], resultcache.KEY_TYPE)
        table = resultcache.cache_table(part, keys, _shares(part.column("n_tokens"), seconds))
        name = resultcache.append_entries(result_log.output_root, fingerprint, table, origin)
    except Exception:  # noqa: BLE001 - the cache must never fail a shard
        log.exception("could not add %s to the result cache (its rows keep their own results)", origin)
        result_log.advance()
        return None
    result_log.advance(until=name)
    return name


def with_winners(result_log: ResultLog, part: pa.Table, key_of: dict[str, bytes | None],
                 own_file: str | None) -> pa.Table:
    """``part`` (a part-file table) with each row's results replaced by its key's winner when the
    winner is in another log file than ``own_file``; rows without a winner keep their own results."""
    ids = part.column("id").to_pylist()
    wanted = {key_of.get(rid) for rid in ids} - {None}
    wanted = [k for k in wanted if result_log.winner(k) not in (None, own_file)]
    fetched = result_log.fetch(wanted) if wanted else None
    if fetched is None:
        return part
    fetched_row = {k: i for i, k in enumerate(fetched.column("key").to_pylist())}
    source = [len(ids) + fetched_row[key_of.get(rid)] if key_of.get(rid) in fetched_row else i
              for i, rid in enumerate(ids)]
    results = _take_results(part, fetched, source, ids, part.schema)
    return pa.table({f.name: part.column(f.name) if f.name in ("fingerprint", "text_repaired") else results.column(f.name)
                     for f in part.schema}, schema=part.schema)


def _shares(n_tokens: pa.ChunkedArray, seconds: float) -> pa.Array:
    """``seconds`` shared out over rows by their ``n_tokens`` (equally when all are 0)."""
    counts = n_tokens.cast(pa.float64())
    total = float(pc.sum(counts).as_py() or 0.0)
    if total:
        return pc.multiply(pc.divide(counts, total), seconds)
    n = len(counts)
    return pa.array([seconds / n] * n, pa.float64())


def _take_results(own: pa.Table, fetched: pa.Table | None, source: list[int], ids: list[str],
                  part_schema: pa.Schema) -> pa.Table:
    """Result table: row ``r`` has id ``ids[r]`` and the result columns (the part schema's, less
    ``id``, ``fingerprint`` and ``text_repaired``) of row ``source[r]`` of ``own`` followed by
    ``fetched`` (cache rows), both cast to the part schema's types."""
    fields = [f for f in part_schema if f.name not in ("id", "fingerprint", "text_repaired")]
    schema = pa.schema(fields)
    pool = own.select([f.name for f in fields]).cast(schema) if own.num_rows else schema.empty_table()
    if fetched is not None:
        pool = pa.concat_tables([pool, fetched.select([f.name for f in fields]).cast(schema)])
    table = pool.combine_chunks().take(pa.array(source, pa.int64()))  # take over one chunk: 30-50x faster
    id_type = part_schema.field("id").type
    return table.add_column(0, pa.field("id", id_type), pa.array(ids, id_type))
