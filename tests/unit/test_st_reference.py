"""The sentence-transformers reference helper (tests/st_reference.py) must catch a wrong vector: it passes
the reference itself and fails on one vector turned to cosine 0.99, on two rows' vectors swapped, and
on a vector of the wrong size or with a NaN."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
from run_helpers import SAMPLE_PARQUET
from st_reference import assert_vectors_match_reference, check_published, reference_vectors, texts_by_id

N = 12


@pytest.fixture(scope="module")
def rows() -> tuple[list[str], list[str], np.ndarray]:
    table = pq.read_table(SAMPLE_PARQUET).slice(0, 40)
    texts = texts_by_id(table)
    ids = [i for i, t in texts.items() if t][:N]
    return ids, [texts[i] for i in ids], reference_vectors([texts[i] for i in ids])


def _turn(vector: np.ndarray, cosine: float, seed: int = 0) -> np.ndarray:
    """A unit vector at exactly ``cosine`` to the unit vector ``vector``."""
    noise = np.random.default_rng(seed).standard_normal(vector.shape)
    ortho = noise - (noise @ vector) * vector
    ortho /= np.linalg.norm(ortho)
    return (cosine * vector + np.sqrt(1 - cosine**2) * ortho).astype(np.float32)


def test_the_reference_itself_and_small_noise_pass(rows) -> None:
    ids, texts, ref = rows
    assert assert_vectors_match_reference(ids, texts, ref).min() > 0.99999
    near = ref.copy()
    near[3] = _turn(ref[3], 0.9995) * 2.5  # scale does not matter, direction does
    cos = assert_vectors_match_reference(ids, texts, near)
    assert cos[3] == pytest.approx(0.9995, abs=1e-5)


def test_one_vector_at_cosine_099_fails(rows) -> None:
    ids, texts, ref = rows
    bad = ref.copy()
    bad[5] = _turn(ref[5], 0.99)
    with pytest.raises(AssertionError, match=rf"1 of {N} published vectors .*{ids[5]!r}: 0\.99000"):
        assert_vectors_match_reference(ids, texts, bad)


def test_two_rows_swapped_fail(rows) -> None:
    ids, texts, ref = rows
    swapped = ref.copy()
    swapped[[2, 7]] = swapped[[7, 2]]
    with pytest.raises(AssertionError, match=rf"2 of {N} published vectors"):
        assert_vectors_match_reference(ids, texts, swapped)
    # the same through check_published: the ids joined to the wrong texts
    with pytest.raises(AssertionError, match=rf"2 of {N} published vectors"):
        check_published(zip(ids, swapped, strict=True), dict(zip(ids, texts, strict=True)))


def test_wrong_shape_nan_and_unknown_ids_fail(rows) -> None:
    ids, texts, ref = rows
    with pytest.raises(AssertionError, match="published vectors"):
        assert_vectors_match_reference(ids, texts, ref[:, :128])
    nan = ref.copy()
    nan[0, 0] = np.nan
    with pytest.raises(AssertionError, match="NaN"):
        assert_vectors_match_reference(ids, texts, nan)
    with pytest.raises(AssertionError, match="not in the input"):
        check_published([("no-such-id", ref[0])], dict(zip(ids, texts, strict=True)))
    with pytest.raises(AssertionError, match="duplicate ids"):
        assert_vectors_match_reference([ids[0], ids[0]], texts[:2], ref[:2])
