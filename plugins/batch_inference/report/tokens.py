"""Per-row token counts from part files, the length histogram, and the random-order padding estimate.

Only the ``n_tokens`` column of each committed part file is read (column projection), so a
million-row shard costs a few MB of I/O. ``n_tokens`` is the row's real (non-pad) input token count
after truncation (see :data:`batch_contract.schemas.COMMON_FIELDS`).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from batch_contract import storage
from batch_contract.layout import PART_PREFIX, RunLayout, chunk_of, join_uri
from batch_contract.marker import ShardMarker

log = logging.getLogger(__name__)


def part_names(layout: RunLayout, shard_id: str, marker: ShardMarker | None) -> list[str]:
    """Committed part-file names of a shard: the marker's list, else a listing of the shard dir."""
    if marker is not None and marker.parts:
        return list(marker.parts)
    names = storage.list_names(layout.shard_dir(shard_id))
    return [n for n in names if n.startswith(PART_PREFIX) and chunk_of(n) is not None]


def shard_length_counts(layout: RunLayout, shard_id: str, marker: ShardMarker | None) -> np.ndarray:
    """Rows per token length of one shard: ``counts[L]`` = rows with ``n_tokens == L``.

    Returns:
        int64 array of shape ``(max_len + 1,)``; empty (shape ``(0,)``) when the shard has no parts.

    Raises:
        ValueError: a part file lacks the ``n_tokens`` column or has a negative count (names the file).
            A file that is gone or unreadable (quarantined after the marker) is skipped with a warning.
    """
    counts = np.zeros(0, dtype=np.int64)
    shard_dir = layout.shard_dir(shard_id)
    for name in part_names(layout, shard_id, marker):
        uri = join_uri(shard_dir, name)
        fs, path = storage.arrow_filesystem(uri)
        try:
            col = pq.read_table(path, columns=["n_tokens"], filesystem=fs).column("n_tokens")
        except KeyError:
            raise ValueError(f"{uri}: part file has no n_tokens column") from None
        except (pa.ArrowInvalid, OSError) as exc:  # quarantined or torn since the marker was written
            log.warning("length histogram: skipping %s (%s)", uri, exc)
            continue
        values = col.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        if values.size == 0:
            continue
        if values.min() < 0:
            raise ValueError(f"{uri}: negative n_tokens value {int(values.min())}")
        part = np.bincount(values)
        if part.size > counts.size:
            part[: counts.size] += counts
            counts = part
        else:
            counts[: part.size] += part
    return counts


def add_counts(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Element-wise sum of two length-count arrays of possibly different sizes."""
    if a.size < b.size:
        a, b = b, a
    out = a.copy()
    out[: b.size] += b
    return out


def round_up(length: int, multiple: int) -> int:
    """``length`` rounded up to a multiple of ``multiple`` (the engine's ``pad_to_multiple_of``)."""
    return int(math.ceil(length / multiple) * multiple) if multiple > 1 else int(length)


def random_order_batch_rows(counts: np.ndarray, token_budget: int, max_batch_rows: int, pad_multiple: int) -> int:
    """Rows per batch a random-order batcher with the same token budget could use.

    Without sorting any batch may hold the shard's longest row, so a static batcher must size batches
    for it: ``min(max_batch_rows, token_budget // round_up(max_len))``, at least 1.
    """
    nonzero = np.nonzero(counts)[0]
    if nonzero.size == 0:
        return 1
    longest = max(1, round_up(int(nonzero[-1]), pad_multiple))
    return max(1, min(max_batch_rows, token_budget // longest))


def expected_random_padded_tokens(counts: np.ndarray, batch_rows: int, pad_multiple: int) -> float:
    """Expected padded tokens if the shard's rows were batched in random order, ``batch_rows`` a batch.

    A batch is padded to its longest member, so each row costs the expected maximum of ``batch_rows``
    lengths drawn from the shard's own length distribution ``F``:
    ``E[max] = sum_k r(L_k) * (F(L_k)^B - F(L_{k-1})^B)`` with ``r`` the rounding to ``pad_multiple``.
    Total = rows x E[max] (tokens). Draws are with replacement (exact for large shards).
    """
    n = int(counts.sum())
    if n == 0:
        return 0.0
    lengths = np.nonzero(counts)[0]
    cdf = np.cumsum(counts[lengths]) / n
    prev = np.concatenate(([0.0], cdf[:-1]))
    rounded = np.array([round_up(int(x), pad_multiple) for x in lengths], dtype=np.float64)
    e_max = float(np.sum(rounded * (cdf**batch_rows - prev**batch_rows)))
    return n * e_max


def real_tokens(counts: np.ndarray) -> int:
    """Sum of real tokens: ``sum_L L * counts[L]``."""
    return int(np.dot(np.arange(counts.size, dtype=np.int64), counts)) if counts.size else 0


def length_stats(counts: np.ndarray) -> dict[str, Any]:
    """Row count, mean, p50, p95 and max of the token lengths (tokens); ``None`` values when empty."""
    n = int(counts.sum()) if counts.size else 0
    if n == 0:
        return {"rows": 0, "mean": None, "p50": None, "p95": None, "max": None}
    cum = np.cumsum(counts)

    def pct(q: float) -> int:
        return int(np.searchsorted(cum, math.ceil(q * n)))

    return {
        "rows": n,
        "mean": real_tokens(counts) / n,
        "p50": pct(0.50),
        "p95": pct(0.95),
        "max": int(np.nonzero(counts)[0][-1]),
    }


def histogram(counts: np.ndarray, bins: int = 32) -> dict[str, list[int]]:
    """Length histogram in at most ``bins`` equal-width integer bins.

    Returns:
        ``{"bin_edges": [e0, ..., ek], "rows": [r0, ..., r(k-1)]}``: bin ``i`` holds rows with
        ``e_i <= n_tokens < e_(i+1)``; empty lists when there are no rows.
    """
    if counts.size == 0 or int(counts.sum()) == 0:
        return {"bin_edges": [], "rows": []}
    top = int(np.nonzero(counts)[0][-1]) + 1
    width = max(1, math.ceil(top / bins))
    edges = list(range(0, top + width, width))
    rows = [int(counts[lo:hi].sum()) for lo, hi in zip(edges[:-1], edges[1:], strict=True)]
    return {"bin_edges": edges, "rows": rows}
