"""The upgrade canary's metric functions (``batch_contract.agreement``): cosine per row, neighbour overlap,
label agreement; properties over random inputs (hypothesis) and a few exact cases."""

from __future__ import annotations

import re

import numpy as np
import pytest
from batch_contract.agreement import (
    MIN_NEIGHBOUR_ROWS,
    cosine_per_row,
    embedding_figures,
    label_agreement,
    nearest_neighbours,
    neighbour_k,
    neighbour_overlap,
)
from hypothesis import given, settings
from hypothesis import strategies as st

SEEDS = st.integers(min_value=0, max_value=2**32 - 1)
ROWS = st.integers(min_value=MIN_NEIGHBOUR_ROWS, max_value=150)
DIMS = st.integers(min_value=8, max_value=48)


def _clustered(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    """``n`` vectors in a few clusters with distinct distances (so neighbourhoods are well defined)."""
    centres = rng.standard_normal((max(2, n // 10), d)) * 3
    return centres[rng.integers(0, len(centres), n)] + rng.standard_normal((n, d))


def _rotation(rng: np.random.Generator, d: int) -> np.ndarray:
    q, r = np.linalg.qr(rng.standard_normal((d, d)))
    return q * np.sign(np.diag(r))


@settings(max_examples=25, deadline=None)
@given(seed=SEEDS, n=ROWS, d=DIMS)
def test_identical_vectors_give_cosine_one_and_overlap_one(seed: int, n: int, d: int) -> None:
    x = _clustered(np.random.default_rng(seed), n, d).astype(np.float32)
    figures = embedding_figures(x, x.copy())
    assert figures["cosine"]["p5"] == pytest.approx(1.0, abs=1e-6)
    assert figures["cosine"]["mean"] == pytest.approx(1.0, abs=1e-6)
    assert figures["neighbours"]["overlap"] == 1.0 and figures["neighbours"]["jaccard"] == 1.0
    assert figures["neighbours"]["k"] == neighbour_k(n)


@settings(max_examples=25, deadline=None)
@given(seed=SEEDS, n=ROWS, d=DIMS)
def test_a_rotation_keeps_the_neighbours_whatever_the_cosine(seed: int, n: int, d: int) -> None:
    rng = np.random.default_rng(seed)
    x = _clustered(rng, n, d)
    rotated = x @ _rotation(rng, d)
    nb = neighbour_overlap(rotated, x)
    assert nb is not None and nb["overlap"] >= 0.98, nb  # ties within 1e-4 may swap at the k-th place
    cos = cosine_per_row(rotated, x)
    assert cos.min() >= -1.0 and cos.max() <= 1.0
    assert np.linalg.norm(rotated, axis=1) == pytest.approx(np.linalg.norm(x, axis=1))


def test_a_random_rotation_leaves_cosine_far_from_one() -> None:
    rng = np.random.default_rng(7)
    x = _clustered(rng, 120, 32)
    figures = embedding_figures(x @ _rotation(rng, 32), x)
    assert figures["neighbours"]["overlap"] >= 0.98
    assert figures["cosine"]["mean"] < 0.5, figures["cosine"]  # same neighbours, unrelated coordinates


@settings(max_examples=25, deadline=None)
@given(seed=SEEDS, n=st.integers(min_value=100, max_value=200), d=DIMS)
def test_unrelated_vectors_overlap_about_at_chance(seed: int, n: int, d: int) -> None:
    rng = np.random.default_rng(seed)
    nb = neighbour_overlap(rng.standard_normal((n, d)), rng.standard_normal((n, d)))
    assert nb is not None and nb["chance"] == pytest.approx(nb["k"] / (n - 1), abs=1e-6)
    assert nb["overlap"] < 0.25, nb  # chance is k / (n - 1) <= 0.1


@settings(max_examples=25, deadline=None)
@given(seed=SEEDS, n=ROWS, d=DIMS, d_old=DIMS)
def test_figures_stay_in_range_and_cosine_needs_one_space(seed: int, n: int, d: int, d_old: int) -> None:
    rng = np.random.default_rng(seed)
    figures = embedding_figures(rng.standard_normal((n, d)), rng.standard_normal((n, d_old)))
    nb = figures["neighbours"]
    assert 0.0 <= nb["jaccard"] <= nb["overlap"] <= 1.0 and 0.0 <= nb["overlap_p10"] <= 1.0
    if d != d_old:
        assert figures["cosine"] is None
    else:
        assert -1.0 <= figures["cosine"]["p5"] <= figures["cosine"]["p50"] <= 1.0


def test_neighbours_are_nearest_first_and_exclude_the_row_itself() -> None:
    x = np.asarray([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.6, 0.4]])
    nn = nearest_neighbours(x, 2)
    assert nn[0].tolist() == [1, 3] and all(i not in row for i, row in enumerate(nn))
    with pytest.raises(ValueError, match=re.escape("k=4 neighbours need 1 <= k <= n - 1 (n=4)")):
        nearest_neighbours(x, 4)


def test_neighbour_k_shrinks_on_small_samples() -> None:
    assert neighbour_k(MIN_NEIGHBOUR_ROWS - 1) == 0
    assert neighbour_k(20) == 1 and neighbour_k(41) == 4 and neighbour_k(101) == 10 and neighbour_k(5000) == 10
    assert neighbour_overlap(np.ones((5, 3)), np.ones((5, 3))) is None


def test_mismatched_rows_are_an_error() -> None:
    with pytest.raises(ValueError, match="^embedding figures need the same rows on both sides, got 30 and 31"):
        embedding_figures(np.ones((30, 4)), np.ones((31, 4)))
    with pytest.raises(ValueError, match=re.escape("cosine per row needs equal shapes, got (3, 4) and (3, 5)")):
        cosine_per_row(np.ones((3, 4)), np.ones((3, 5)))
    with pytest.raises(ValueError, match="^label agreement needs the same rows on both sides, got 1 and 0"):
        label_agreement(["a"], [])


def test_label_agreement_is_the_share_of_equal_labels() -> None:
    assert label_agreement(["a", "b", "c", "d"], ["a", "b", "x", "d"]) == 0.75
    assert label_agreement([], []) is None


def test_a_zero_vector_has_cosine_zero_not_nan() -> None:
    cos = cosine_per_row(np.asarray([[0.0, 0.0], [1.0, 0.0]]), np.asarray([[1.0, 0.0], [1.0, 0.0]]))
    assert cos.tolist() == [0.0, 1.0]
