"""Length-sorted token-budget batching."""

from __future__ import annotations

import numpy as np
import pytest
from batch_worker.batching import plan_batches, round_up


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
    with pytest.raises(ValueError):
        plan_batches([0, 3], 64, 4)
    with pytest.raises(ValueError):
        plan_batches([3], 0, 4)


def _efficiency(lengths, batches) -> float:
    return float(np.asarray(lengths).sum() / sum(b.padded_tokens for b in batches))


def test_short_rows_pad_to_their_own_length_when_the_bucket_is_wasteful() -> None:
    # short texts (package summaries of <= 160 characters): 4-40 tokens, most 10-20
    rng = np.random.default_rng(2)
    lengths = np.clip(rng.lognormal(2.7, 0.35, size=10_000).astype(int), 3, 60)
    bucketed = plan_batches(lengths, token_budget=8192, max_batch_rows=256, pad_to_multiple_of=8)
    exact = plan_batches(lengths, token_budget=8192, max_batch_rows=256, pad_to_multiple_of=8,
                         exact_when_cheaper=True)
    _check_cover(exact, len(lengths))
    assert _efficiency(lengths, bucketed) < 0.9 < 0.94 <= _efficiency(lengths, exact)
    assert len(exact) <= 1.5 * len(bucketed)  # full batches: not many more of them
    for b in exact:
        longest = int(lengths[b.indices].max())
        assert b.padded_tokens <= 8192 and len(b.indices) <= 256
        if b.padded_length % 8:  # exact: the batch's own longest row, rows down to 95% of it, half full
            assert b.padded_length == longest and int(lengths[b.indices].min()) >= 0.95 * longest
            assert len(b.indices) >= 0.5 * min(256, 8192 // longest)
        else:
            assert longest <= b.padded_length < longest + 8


def test_exact_padding_only_where_it_fills_the_batch() -> None:
    # sparse lengths (a small chunk): exact batches would be small, so buckets are kept
    sparse = [200, 199, 197, 12, 11, 11]
    batches = plan_batches(sparse, token_budget=4096, max_batch_rows=8, pad_to_multiple_of=8, exact_when_cheaper=True)
    assert [(b.indices.tolist(), b.padded_length) for b in batches] == [([0, 1, 2], 200), ([3, 4, 5], 16)]
    # dense lengths: a full batch of 11-token rows pads to 11, not 16, and the last 3 rows (all that
    # is left) to 9
    dense = [11] * 8 + [9] * 3
    batches = plan_batches(dense, token_budget=4096, max_batch_rows=8, pad_to_multiple_of=8, exact_when_cheaper=True)
    assert [(len(b.indices), b.padded_length) for b in batches] == [(8, 11), (3, 9)]
    assert [(len(b.indices), b.padded_length) for b in plan_batches(dense, 4096, 8, 8)] == [(8, 16), (3, 16)]
    # a batch whose bucket is already as full stays a bucket
    assert plan_batches([16] * 8, 4096, 8, 8, exact_when_cheaper=True)[0].padded_length == 16
