"""How far two result sets of the same rows agree: the LLM quality gate's comparison and the upgrade canary's
figures for embeddings and labels.

Pure functions, shared by the worker (``batch_worker.quality_gate``: two LLM configs on one sample) and the
Airflow side (``batch_inference.upgrade_gate``: the canary's outputs against the rows a previous model
published). Stdlib, NumPy and the contract only: no torch, no vLLM, no Airflow.

Embeddings (:func:`embedding_figures`):

* **cosine(new, old) per row**: meaningful only when both vectors live in the same space, i.e. the new
  model is a fine-tune or a re-run of the old one (same dimension); two different models, even of the
  same size, put their vectors in unrelated spaces, so their cosine says nothing about quality.
* **neighbour overlap@k**: for each row of the sample, its ``k`` nearest other rows (cosine) under the old
  vectors and under the new ones; the mean share of neighbours in common (and the mean Jaccard index of
  the two sets). It compares neighbourhoods, not coordinates, so it is independent of the space: a
  rotation of every vector keeps it at 1. Independent random neighbourhoods give ``k / (n - 1)``
  (``chance``).
"""

from __future__ import annotations

import difflib
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

DEFAULT_MAX_VALIDITY_DROP = 0.02
"""The candidate may turn at most this fraction of rows more into dead letters than the baseline."""
NEIGHBOUR_K = 10
"""Neighbours per row of the overlap figure (fewer on a small sample: :func:`neighbour_k`)."""
MIN_NEIGHBOUR_ROWS = 20
"""Fewer rows than this: no neighbour overlap (a handful of rows has no neighbourhood worth comparing)."""
SIMILARITY_DECIMALS = 4
"""Cosine similarities are rounded to this many decimals before ranking neighbours (ties broken by row
order), so that rows with identical texts (similarity 1 to each other up to float noise) rank the same
way under two runs whose floats differ in the last bits."""


@dataclass(frozen=True)
class RowResult:
    """One row's outcome under one config.

    Attributes:
        valid: the row produced a result (not dead-lettered).
        output_text: generated text (``""`` when not valid).
        output_json: canonical JSON text when a schema is set and the output was valid, else ``None``.
        output_tokens: generated tokens (0 when rejected before generation).
        reason: dead-letter reason when not valid.
    """

    valid: bool
    output_text: str = ""
    output_json: str | None = None
    output_tokens: int = 0
    reason: str | None = None


def text_similarity(a: str, b: str) -> float:
    """``difflib.SequenceMatcher`` ratio of two texts, in [0, 1] (1.0 for two empty texts)."""
    if a == b:
        return 1.0
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def _fields(text: str | None) -> dict[str, Any]:
    value = json.loads(text) if text is not None else None
    return value if isinstance(value, dict) else {"(value)": value}


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def compare(baseline: Mapping[str, RowResult], candidate: Mapping[str, RowResult]) -> dict[str, Any]:
    """Agreement figures of two configs' results on the same row ids.

    Args:
        baseline / candidate: row id -> :class:`RowResult`; ids missing on one side count as not valid.

    Returns:
        A JSON-able dict: ``rows``, ``rows_both_valid``, ``baseline_valid_rate``,
        ``candidate_valid_rate``, ``exact_match_rate``, ``field_agreement`` ({field: rate}),
        ``text_similarity_mean/p10/min``, ``agreement``, ``output_tokens_mean`` per side and up to five
        ``examples`` of disagreeing rows. Rates are ``None`` when nothing could be compared.
    """
    ids = sorted(set(baseline) | set(candidate))
    missing = RowResult(valid=False, reason="missing")
    both = [i for i in ids if baseline.get(i, missing).valid and candidate.get(i, missing).valid]
    json_mode = bool(both) and all(baseline[i].output_json is not None for i in both)
    sims: list[float] = []
    exact = 0
    field_hits: dict[str, list[int]] = {}
    examples: list[dict[str, Any]] = []
    for rid in both:
        b, c = baseline[rid], candidate[rid]
        sims.append(text_similarity(b.output_text, c.output_text))
        same = (b.output_json == c.output_json) if json_mode else (b.output_text == c.output_text)
        exact += same
        if json_mode:
            fb, fc = _fields(b.output_json), _fields(c.output_json)
            for name in set(fb) | set(fc):
                field_hits.setdefault(name, []).append(int(name in fb and name in fc and fb[name] == fc[name]))
        if not same and len(examples) < 5:
            examples.append({"id": rid, "baseline": b.output_text[:300], "candidate": c.output_text[:300]})
    field_agreement = {k: sum(v) / len(v) for k, v in sorted(field_hits.items())}
    sim_mean = statistics.fmean(sims) if sims else None
    if json_mode:
        agreement = statistics.fmean(field_agreement.values()) if field_agreement else None
    else:
        agreement = sim_mean

    def valid_rate(side: Mapping[str, RowResult]) -> float | None:
        return sum(side.get(i, missing).valid for i in ids) / len(ids) if ids else None

    def tokens_mean(side: Mapping[str, RowResult]) -> float | None:
        values = [side[i].output_tokens for i in ids if i in side]
        return statistics.fmean(values) if values else None

    return {
        "rows": len(ids),
        "rows_both_valid": len(both),
        "output_kind": "json" if json_mode else "text",
        "baseline_valid_rate": valid_rate(baseline),
        "candidate_valid_rate": valid_rate(candidate),
        "exact_match_rate": exact / len(both) if both else None,
        "field_agreement": field_agreement,
        "text_similarity_mean": sim_mean,
        "text_similarity_p10": _quantile(sims, 0.10),
        "text_similarity_min": min(sims) if sims else None,
        "agreement": agreement,
        "baseline_output_tokens_mean": tokens_mean(baseline),
        "candidate_output_tokens_mean": tokens_mean(candidate),
        "examples": examples,
    }


def gate_passed(figures: Mapping[str, Any], min_agreement: float,
                max_validity_drop: float = DEFAULT_MAX_VALIDITY_DROP) -> bool:
    """True when ``agreement >= min_agreement`` and the candidate's valid-row rate is at most
    ``max_validity_drop`` (a fraction of rows) below the baseline's."""
    agreement = figures.get("agreement")
    if agreement is None:
        return False
    base_valid = figures.get("baseline_valid_rate") or 0.0
    cand_valid = figures.get("candidate_valid_rate") or 0.0
    return agreement >= min_agreement and cand_valid >= base_valid - max_validity_drop - 1e-12


def unit_rows(x: Any) -> np.ndarray:
    """``x`` (``(n, d)``, any float dtype) as float64 rows of norm 1; an all-zero row stays zero.

    Raises:
        ValueError: ``x`` is not two-dimensional.
    """
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 2:
        raise ValueError(f"expected an (n, d) matrix of vectors, got shape {a.shape}")
    norms = np.linalg.norm(a, axis=1, keepdims=True)
    return np.divide(a, norms, out=np.zeros_like(a), where=norms > 0)


def cosine_per_row(new: Any, old: Any) -> np.ndarray:
    """Cosine similarity of row ``i`` of ``new`` with row ``i`` of ``old``: shape ``(n,)``, float64 in
    [-1, 1] (0.0 where either row is all zeros).

    Raises:
        ValueError: the shapes differ (another number of rows or another dimension).
    """
    a, b = unit_rows(new), unit_rows(old)
    if a.shape != b.shape:
        raise ValueError(f"cosine per row needs equal shapes, got {a.shape} and {b.shape}")
    return np.clip(np.einsum("ij,ij->i", a, b), -1.0, 1.0)


def neighbour_k(n: int) -> int:
    """Neighbours per row for a sample of ``n`` rows: ``min(10, (n - 1) // 10)``, at least 1, so that the
    neighbours stay about a tenth of the sample or less (chance overlap <= 0.1); 0 below
    :data:`MIN_NEIGHBOUR_ROWS` rows."""
    if n < MIN_NEIGHBOUR_ROWS:
        return 0
    return max(1, min(NEIGHBOUR_K, (n - 1) // 10))


def nearest_neighbours(x: Any, k: int) -> np.ndarray:
    """Indices of the ``k`` nearest other rows of each row of ``x`` by cosine similarity, nearest first:
    shape ``(n, k)``, int64. Similarities are rounded to :data:`SIMILARITY_DECIMALS` decimals and ties go
    to the lower row index. Memory: an ``(n, n)`` float64 matrix (32 MB at n = 2,000).

    Raises:
        ValueError: ``k`` is not in ``1..n-1``.
    """
    u = unit_rows(x)
    n = u.shape[0]
    if not 1 <= k <= n - 1:
        raise ValueError(f"k={k} neighbours need 1 <= k <= n - 1 (n={n})")
    sims = np.round(u @ u.T, SIMILARITY_DECIMALS)
    np.fill_diagonal(sims, -np.inf)
    return np.argsort(-sims, axis=1, kind="stable")[:, :k]


def neighbour_overlap(new: Any, old: Any, k: int | None = None) -> dict[str, Any] | None:
    """How many of each row's nearest neighbours the two sets of vectors share.

    Args:
        new / old: ``(n, d_new)`` and ``(n, d_old)`` vectors of the same ``n`` rows in the same order (the
            dimensions may differ).
        k: neighbours per row; default :func:`neighbour_k` of ``n``.

    Returns:
        ``{"k", "rows", "overlap", "jaccard", "chance", "overlap_p10"}``: ``overlap`` is the mean over rows of
        ``|N_old ∩ N_new| / k`` (``overlap_p10`` its 10th percentile), ``jaccard`` the mean of
        ``|N_old ∩ N_new| / |N_old ∪ N_new|``, ``chance`` = ``k / (n - 1)``, the overlap of independent random
        neighbourhoods. ``None`` when ``k`` would be 0 (fewer than :data:`MIN_NEIGHBOUR_ROWS` rows).

    Raises:
        ValueError: the row counts differ, or ``k`` is outside ``1..n-1``.
    """
    a, b = np.asarray(new), np.asarray(old)
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"neighbour overlap needs the same rows on both sides, got {a.shape[0]} and {b.shape[0]}")
    n = a.shape[0]
    k = neighbour_k(n) if k is None else k
    if k == 0:
        return None
    na, nb = nearest_neighbours(a, k), nearest_neighbours(b, k)
    common = np.asarray([np.intersect1d(x, y, assume_unique=True).size for x, y in zip(na, nb, strict=True)])
    share = common / k
    return {"k": int(k), "rows": int(n), "overlap": round(float(share.mean()), 6),
            "jaccard": round(float(np.mean(common / (2 * k - common))), 6), "chance": round(k / (n - 1), 6),
            "overlap_p10": round(float(np.percentile(share, 10)), 6)}


def embedding_figures(new: Any, old: Any) -> dict[str, Any]:
    """The upgrade canary's embedding figures for the same ``n`` rows under two models.

    Args:
        new / old: ``(n, d_new)`` / ``(n, d_old)`` vectors, row ``i`` of both for the same id.

    Returns:
        ``{"rows", "dim_new", "dim_old", "cosine", "neighbours"}``: ``cosine`` is ``{"p5", "p50", "mean"}`` of
        :func:`cosine_per_row`, ``None`` when the dimensions differ (no common space) or there are no rows;
        ``neighbours`` is :func:`neighbour_overlap` (``None`` on fewer than :data:`MIN_NEIGHBOUR_ROWS` rows).

    Raises:
        ValueError: the row counts differ or an input is not two-dimensional.
    """
    a, b = unit_rows(new), unit_rows(old)
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"embedding figures need the same rows on both sides, got {a.shape[0]} and {b.shape[0]}")
    cosine = None
    if a.shape[1] == b.shape[1] and a.shape[0]:
        c = cosine_per_row(a, b)
        cosine = {"p5": round(float(np.percentile(c, 5)), 6), "p50": round(float(np.percentile(c, 50)), 6),
                  "mean": round(float(c.mean()), 6)}
    return {"rows": int(a.shape[0]), "dim_new": int(a.shape[1]), "dim_old": int(b.shape[1]), "cosine": cosine,
            "neighbours": neighbour_overlap(a, b)}


def label_agreement(new: Sequence[Any], old: Sequence[Any]) -> float | None:
    """Share of rows whose label is the same under both models (``new[i] == old[i]``); ``None`` for no rows.

    Raises:
        ValueError: the lengths differ.
    """
    if len(new) != len(old):
        raise ValueError(f"label agreement needs the same rows on both sides, got {len(new)} and {len(old)}")
    if not new:
        return None
    return sum(a == b for a, b in zip(new, old, strict=True)) / len(new)


__all__ = ["DEFAULT_MAX_VALIDITY_DROP", "MIN_NEIGHBOUR_ROWS", "NEIGHBOUR_K", "RowResult", "compare",
           "cosine_per_row", "embedding_figures", "gate_passed", "label_agreement", "nearest_neighbours",
           "neighbour_k", "neighbour_overlap", "text_similarity", "unit_rows"]
