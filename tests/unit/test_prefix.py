"""Prefix structure (batch_contract.prefix): block hashes, groups, placement of whole groups on shards,
the expected hit rate model and the worker's queue order; properties over random group structures."""

from __future__ import annotations

import pytest
from batch_contract import prefix
from batch_inference.prefix_plan import segments_of
from hypothesis import given, settings
from hypothesis import strategies as st

B = 4


def _prompts(groups: list[tuple[int, list[int]]], shared: int = 0) -> tuple[list[list[int]], list[int]]:
    """Prompts of ``groups`` (group id, suffix lengths): ``shared`` global tokens, a 2-block group prefix
    unique to the group, then a suffix of distinct tokens. Returns ``(prompts, group of each prompt)``."""
    prompts, owner = [], []
    serial = 10_000
    for gid, suffixes in groups:
        for n in suffixes:
            suffix = list(range(serial, serial + n))
            serial += n
            prompts.append([1] * shared + [100 + gid] * (2 * B) + suffix)
            owner.append(gid)
    return prompts, owner


def test_block_hashes_cover_full_blocks_before_the_last_token():
    assert len(prefix.block_hashes(list(range(8)), 4)) == 1  # the last token is never served from cache
    assert len(prefix.block_hashes(list(range(9)), 4)) == 2
    assert prefix.block_hashes([], 4) == []
    a = prefix.block_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9], 4)
    b = prefix.block_hashes([1, 2, 3, 4, 5, 6, 7, 0, 9], 4)
    assert a[0] == b[0] and a[1] != b[1]
    c = prefix.block_hashes([0, 2, 3, 4, 5, 6, 7, 8, 9], 4)
    assert c[1] != a[1]  # chained: an equal second block after a different first one is another hash
    with pytest.raises(ValueError, match="block_tokens"):
        prefix.block_hashes([1, 2], 0)


def test_global_prefix_and_groups():
    prompts, owner = _prompts([(0, [3, 5]), (1, [2]), (2, [4, 4, 6])], shared=2 * B)
    chains = [prefix.block_hashes(p, B) for p in prompts]
    assert prefix.global_blocks(chains) == 2
    keys = prefix.group_keys(chains)
    for i in range(len(prompts)):
        for j in range(len(prompts)):
            assert (keys[i] == keys[j]) == (owner[i] == owner[j])
    assert prefix.group_keys([prefix.block_hashes([1] * (2 * B), B)]) == [None]  # nothing past the prefix


group_lists = st.lists(st.lists(st.integers(1, 3 * B), min_size=1, max_size=6), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(group_lists, st.integers(1, 5), st.integers(0, 2))
def test_whole_groups_on_balanced_shards(sizes, shards, shared):
    prompts, owner = _prompts(list(enumerate(sizes)), shared=shared * B)
    tokens = [len(p) for p in prompts]
    keys = prefix.group_keys([prefix.block_hashes(p, B) for p in prompts])
    target = sum(tokens) / shards
    units = prefix.group_units(keys, tokens, target)
    placed = prefix.assign_units(units, shards)
    orders = [prefix.shard_order(us, tokens) for us in placed]
    flat = [i for o in orders for i in o]
    assert sorted(flat) == list(range(len(prompts)))  # every prompt exactly once
    biggest = max(u.tokens for u in units)
    assert max(sum(u.tokens for u in us) for us in placed) <= target + biggest
    for gid in range(len(sizes)):
        rows = [i for i, g in enumerate(owner) if g == gid]
        holding = [k for k, o in enumerate(orders) if set(o) & set(rows)]
        if sum(tokens[i] for i in rows) <= target:
            assert len(holding) == 1, "a group no larger than a shard is split"
        for k in holding:  # back to back inside each shard that holds it
            pos = [orders[k].index(i) for i in rows if i in orders[k]]
            assert max(pos) - min(pos) == len(pos) - 1


@settings(max_examples=60, deadline=None)
@given(group_lists, st.lists(st.integers(0, 3), min_size=1, max_size=80))
def test_one_engine_is_the_ideal(sizes, assignment):
    prompts, _ = _prompts(list(enumerate(sizes)), shared=B)
    chains = [prefix.block_hashes(p, B) for p in prompts]
    tokens = [len(p) for p in prompts]
    parts: dict[int, list[int]] = {}
    for i in range(len(prompts)):
        parts.setdefault(assignment[i % len(assignment)], []).append(i)
    ideal = prefix.hit_rate([list(range(len(prompts)))], chains, tokens, B)
    assert 0.0 <= prefix.hit_rate(list(parts.values()), chains, tokens, B) <= ideal + 1e-12
    grouped = prefix.assign_units(prefix.group_units(prefix.group_keys(chains), tokens, float("inf")), 3)
    orders = [prefix.shard_order(us, tokens) for us in grouped]
    # whole groups lose only the prefix every prompt shares, once per extra shard (the price of parallelism)
    lost = prefix.global_blocks(chains) * B * (sum(1 for o in orders if o) - 1)
    assert prefix.hit_rate(orders, chains, tokens, B) >= ideal - lost / sum(tokens) - 1e-12


@settings(max_examples=60, deadline=None)
@given(group_lists, st.randoms(use_true_random=False))
def test_chunk_order_puts_a_group_back_to_back_longest_first(sizes, rnd):
    prompts, owner = _prompts(list(enumerate(sizes)))
    perm = list(range(len(prompts)))
    rnd.shuffle(perm)
    shuffled = [prompts[i] for i in perm]
    order = prefix.chunk_order(shuffled, B)
    assert sorted(order) == list(range(len(shuffled)))
    groups = [owner[perm[i]] for i in order]
    assert len({g for g in groups}) == sum(1 for k in range(len(groups)) if k == 0 or groups[k] != groups[k - 1])
    for k in range(1, len(order)):
        if groups[k] == groups[k - 1]:
            assert len(shuffled[order[k]]) <= len(shuffled[order[k - 1]])


def test_no_groups_is_longest_first():
    prompts = [[i] * n for i, n in enumerate([3, 9, 5, 9, 1])]
    order = prefix.chunk_order(prompts, 16)
    assert [len(prompts[i]) for i in order] == [9, 9, 5, 3, 1]


@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 30)), unique=True, max_size=40))
def test_segments_cover_rows_in_order(rows):
    segments = segments_of(list(range(len(rows))), rows)
    covered = [(s.file_index, r) for s in segments for r in range(s.row_start, s.row_stop)]
    assert covered == rows
