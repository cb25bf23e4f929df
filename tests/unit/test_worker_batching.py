"""Length-sorted token-budget batching."""

from __future__ import annotations

import numpy as np
import pytest
from batch_worker.batching import BATCH_OVERHEAD_TOKENS, plan_batches, plan_exact, round_up
from hypothesis import given, settings
from hypothesis import strategies as st


def _check_cover(batches, n):
    seen = np.concatenate([b.indices for b in batches])
    assert sorted(seen.tolist()) == list(range(n))


def test_batches_cover_every_row_once_longest_first_within_budget() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 257, size=1000)
    batches = plan_batches(lengths, token_budget=4096, max_batch_rows=64, pad_to_multiple_of=8)
    _check_cover(batches, 1000)
    assert batches[0].padded_length == round_up(int(lengths.max()), 8)
    assert [b.padded_length for b in batches] == sorted((b.padded_length for b in batches), reverse=True)
    for b in batches:
        assert b.padded_length % 8 == 0
        assert int(lengths[b.indices].max()) <= b.padded_length < int(lengths[b.indices].max()) + 8
        assert len(b.indices) <= 64
        assert b.padded_tokens <= 4096


def test_sorted_batching_wastes_little_padding_on_a_realistic_mix() -> None:
    rng = np.random.default_rng(1)
    lengths = np.clip(rng.lognormal(4.3, 0.6, size=3000).astype(int), 3, 256)
    batches = plan_batches(lengths, token_budget=16384, max_batch_rows=256, pad_to_multiple_of=8)
    efficiency = lengths.sum() / sum(b.padded_tokens for b in batches)
    assert efficiency > 0.95


def test_row_longer_than_budget_gets_its_own_batch_and_pad_multiple_is_configurable() -> None:
    batches = plan_batches([500, 3, 3], token_budget=128, max_batch_rows=8, pad_to_multiple_of=64)
    assert [b.indices.tolist() for b in batches] == [[0], [1, 2]]
    assert [b.padded_length for b in batches] == [512, 64]


def test_min_fill_splits_sparse_length_ranges() -> None:
    batches = plan_batches([100, 10, 10], token_budget=10_000, max_batch_rows=10, pad_to_multiple_of=1)
    assert [len(b.indices) for b in batches] == [1, 2]
    together = plan_batches([100, 10, 10], token_budget=10_000, max_batch_rows=10, pad_to_multiple_of=1, min_fill=0)
    assert len(together) == 1


def test_bad_arguments_raise() -> None:
    assert plan_batches([], 64, 4) == []
    with pytest.raises(ValueError, match="^row lengths must be >= 1 token, got 0"):
        plan_batches([0, 3], 64, 4)
    with pytest.raises(ValueError, match="^token_budget, max_batch_rows and pad_to_multiple_of must be >= 1"):
        plan_batches([3], 0, 4)


def _efficiency(lengths, batches) -> float:
    return float(np.asarray(lengths).sum() / sum(b.padded_tokens for b in batches))


def _cost(lengths, batches, overhead: float) -> float:
    return float(sum(b.padded_tokens for b in batches) + overhead * len(batches))


def _brute_force_least_cost(lengths: list[int], budget: int, cap: int, overhead: float) -> float:
    """Least cost over every contiguous split of the rows sorted longest first (2^(n-1) splits)."""
    srt = sorted(lengths, reverse=True)
    n = len(srt)
    best = float("inf")
    for mask in range(1 << (n - 1)):
        cuts = [0] + [k + 1 for k in range(n - 1) if mask >> k & 1] + [n]
        cost = 0.0
        for a, b in zip(cuts, cuts[1:], strict=False):
            rows, width = b - a, srt[a]
            if rows > cap or (rows > 1 and rows * width > budget):
                break
            cost += rows * width + overhead
        else:
            best = min(best, cost)
    return best


@settings(max_examples=150, deadline=None)
@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=9), budget=st.integers(8, 200),
       cap=st.integers(1, 6), overhead=st.sampled_from([0.0, 3.0, 64.0]))
def test_exact_plan_is_the_least_cost_split(lengths, budget, cap, overhead) -> None:
    batches = plan_exact(np.asarray(lengths, dtype=np.int64), budget, cap, overhead)
    _check_cover(batches, len(lengths))
    arr = np.asarray(lengths)
    for b in batches:
        assert b.padded_length == int(arr[b.indices].max())  # exact: its own longest row
        assert len(b.indices) <= cap and (len(b.indices) == 1 or b.padded_tokens <= budget)
    assert _cost(arr, batches, overhead) == pytest.approx(_brute_force_least_cost(lengths, budget, cap, overhead))


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 300), min_size=1, max_size=400), budget=st.sampled_from([512, 2048, 8192]),
       cap=st.sampled_from([4, 64, 256]), multiple=st.sampled_from([1, 8, 64]))
def test_exact_plan_never_costs_more_than_the_bucket_plan(lengths, budget, cap, multiple) -> None:
    arr = np.asarray(lengths, dtype=np.int64)
    exact = plan_batches(arr, budget, cap, multiple, exact_when_cheaper=True)
    bucket = plan_batches(arr, budget, cap, multiple)
    _check_cover(exact, len(lengths))
    assert exact[0].padded_length == int(arr.max())
    assert _cost(arr, exact, BATCH_OVERHEAD_TOKENS) <= _cost(arr, bucket, BATCH_OVERHEAD_TOKENS) + 1e-9


@pytest.mark.parametrize("chunk_rows", [2500, 10_000])
def test_short_rows_pad_to_their_own_length_in_fewer_batches(chunk_rows) -> None:
    # short texts (package summaries of <= 160 characters): 4-40 tokens, most 10-20; the worker plans each
    # chunk on its own (chunks grow to 60 s of throughput: thousands of short rows)
    rng = np.random.default_rng(2)
    lengths = np.clip(rng.lognormal(2.5, 0.35, size=10_000).astype(int), 3, 60)
    exact, bucket = [], []
    for start in range(0, lengths.size, chunk_rows):
        chunk = lengths[start : start + chunk_rows]
        exact += [(chunk, b) for b in plan_batches(chunk, 8192, 256, 8, exact_when_cheaper=True)]
        bucket += [(chunk, b) for b in plan_batches(chunk, 8192, 256, 8)]

    def efficiency(plan) -> float:
        return sum(int(c[b.indices].sum()) for c, b in plan) / sum(b.padded_tokens for _, b in plan)

    assert efficiency(bucket) < 0.85 and efficiency(exact) >= 0.95
    assert len(exact) <= 1.1 * len(bucket)  # and not by many more, smaller batches
