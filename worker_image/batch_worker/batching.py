"""Length-sorted token-budget batching: plan which rows go together so padding stays small.

Rows are sorted by token length (longest first, so an out-of-memory error shows up on the first batch),
then packed greedily: a batch takes rows while ``rows x padded_length <= token_budget``,
``rows <= max_batch_rows`` and the row pads to the same length (one padding bucket), where
``padded_length`` is the batch's longest row rounded up to a multiple of ``pad_to_multiple_of``. Results are restored by row id, never by position.

Short rows: rounding 11 tokens up to 16 leaves 31% of the batch as padding, and on a corpus of short
texts (package summaries of <= 160 characters, 10-20 tokens) padding to multiples of 8 gave a padding
efficiency of 0.816 (issue #22). With ``exact_when_cheaper`` (the eager CPU engine, which has no
compiled shapes to keep few), every batch pads to its own longest row and the split is the cheapest one
under a cost of padded tokens plus a fixed cost per batch (:func:`plan_exact`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Batch:
    """One planned batch.

    Attributes:
        indices: row indices into the chunk (int64 array, longest row first).
        padded_length: sequence length every row is padded to (tokens).
    """

    indices: np.ndarray
    padded_length: int

    @property
    def padded_tokens(self) -> int:
        """Tokens processed including padding: ``len(indices) * padded_length``."""
        return int(len(self.indices)) * self.padded_length


def round_up(n: int, multiple: int) -> int:
    """``n`` rounded up to a multiple of ``multiple`` (``multiple >= 1``)."""
    return -(-n // multiple) * multiple


MIN_FILL = 0.95
"""With ``pad_to_multiple_of == 1``, a row joins a batch only if its length is at least this fraction of
the batch's longest row, so a sparse length range (small chunks, long tails) gives more, smaller batches
instead of padding waste. With a multiple > 1, each batch holds one padding bucket instead."""


BATCH_OVERHEAD_TOKENS = 200
"""What one more batch costs, in padded tokens, for the exact planner (:func:`plan_exact`): the fixed
per-forward cost (Python dispatch of a dozen ops per layer, oneDNN primitive lookups, staging) over the
cost of one padded token. Measured by ``make bench-encoder`` (``batch_overhead``: MiniLM bf16 forward
passes over a grid of shapes, least squares of ``seconds = a x padded tokens + b``) on the 2-core EPYC
development machine, quiet, 2026-12-01: 57.6 µs per padded token and 12.3 ms per batch (214 tokens),
then 58.0 µs and 6.2 ms (108 tokens); 200 is near the upper of the two, as a new batch shape also pays
for oneDNN primitive creation, which the benchmark's repeated shapes do not. The plans change little in
that range: the 10,000-row short corpus planned as one chunk takes 44 batches at 0.998 real/padded
tokens at 64, 40 batches at 0.992 at 200."""


def _take(arr: np.ndarray, order: np.ndarray, start: int, token_budget: int, max_batch_rows: int,
          multiple: int, min_fill: float) -> tuple[int, int]:
    """``(padded_length, rows)`` of the batch starting at sorted position ``start`` under one rule:
    multiple > 1, one padding bucket ``(padded - multiple, padded]``; multiple 1, rows down to
    ``min_fill`` x the longest row."""
    longest = int(arr[order[start]])
    padded = round_up(longest, multiple)
    rows = max(1, min(max_batch_rows, token_budget // padded, int(arr.size) - start))
    floor = padded - multiple + 1 if multiple > 1 else min_fill * longest
    if floor > 0:
        window = arr[order[start : start + rows]]
        rows = max(1, int(np.count_nonzero(window >= floor)))  # window is sorted descending
    return padded, rows


def plan_exact(lengths: np.ndarray, token_budget: int, max_batch_rows: int,
               batch_overhead_tokens: float = BATCH_OVERHEAD_TOKENS) -> list[Batch]:
    """The cheapest split of the length-sorted rows into exact-length batches (each padded to its own
    longest row), by dynamic programming over the sorted order.

    Cost of a plan: ``sum(rows x padded_length) + batch_overhead_tokens x batches``; among the
    contiguous splits of the rows sorted longest first (a batch of sorted rows wastes the least), under
    ``rows <= max_batch_rows`` and ``rows x padded_length <= token_budget`` (a row longer than the budget
    alone), it returns one of least cost. Unlike a fill threshold it does not depend on how many rows of
    each length a chunk happens to hold: a small chunk of sparse lengths gets fewer, slightly padded
    batches; a large one gets nearly unpadded full batches. ``O(n x max_batch_rows)`` numpy work
    (10-20 µs per row on the 2-core development machine: 0.5-1.2 s for 57,000 rows).

    Args:
        lengths: int64 ``(n,)`` token counts, each >= 1.
        token_budget / max_batch_rows: as :func:`plan_batches`.
        batch_overhead_tokens: :data:`BATCH_OVERHEAD_TOKENS` (>= 0).

    Returns:
        Batches covering every index exactly once, longest first.
    """
    n = int(lengths.size)
    order = np.argsort(-lengths, kind="stable")
    sorted_len = lengths[order].astype(np.float64)
    cap = np.minimum(max_batch_rows, np.maximum(1, token_budget // lengths[order]))
    reach = np.minimum(cap, n - np.arange(n)).tolist()
    steps = np.arange(1, int(cap.max()) + 1, dtype=np.float64)
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    start_of = np.zeros(n + 1, dtype=np.int64)
    cost = np.empty_like(steps)
    for i in range(n):  # relax every batch that starts at sorted row i
        k = reach[i]
        c = cost[:k]
        np.multiply(steps[:k], sorted_len[i], out=c)
        c += best[i] + batch_overhead_tokens
        window = best[i + 1 : i + k + 1]
        better = c < window
        np.copyto(window, c, where=better)
        np.copyto(start_of[i + 1 : i + k + 1], i, where=better)
    batches: list[Batch] = []
    end = n
    while end > 0:
        start = int(start_of[end])
        batches.append(Batch(indices=order[start:end], padded_length=int(lengths[order[start]])))
        end = start
    return batches[::-1]


def plan_batches(
    lengths: np.ndarray | list[int],
    token_budget: int,
    max_batch_rows: int,
    pad_to_multiple_of: int = 8,
    min_fill: float = MIN_FILL,
    exact_when_cheaper: bool = False,
    batch_overhead_tokens: float = BATCH_OVERHEAD_TOKENS,
) -> list[Batch]:
    """Sort rows by length (descending, stable) and pack them into token-budget batches.

    Args:
        lengths: token count of each row (int, >= 1), shape ``(n,)``.
        token_budget: max padded tokens per batch. A single row longer than the budget still gets a
            batch of its own (the budget bounds batching, it never drops a row).
        max_batch_rows: max rows per batch.
        pad_to_multiple_of: padded length is a multiple of this (1 = pad to the longest row).
        min_fill: with multiple 1, rows shorter than ``min_fill x`` the batch's longest row start a new
            batch (0 disables). With a multiple > 1 a batch never mixes padding buckets.
        exact_when_cheaper: ignore the multiple and ``min_fill``: each batch pads to its own longest row,
            split by :func:`plan_exact` (least padded tokens plus ``batch_overhead_tokens`` per batch).
            For engines without compiled shapes to keep few (the eager CPU encoder).
        batch_overhead_tokens: see :func:`plan_exact`.

    Returns:
        Batches covering every index exactly once, longest batch first.

    Raises:
        ValueError: a length below 1, or a non-positive budget/row limit/multiple.
    """
    arr = np.asarray(lengths, dtype=np.int64)
    if token_budget < 1 or max_batch_rows < 1 or pad_to_multiple_of < 1:
        raise ValueError("token_budget, max_batch_rows and pad_to_multiple_of must be >= 1")
    if arr.size and int(arr.min()) < 1:
        raise ValueError(f"row lengths must be >= 1 token, got {int(arr.min())}")
    if exact_when_cheaper and arr.size:
        return plan_exact(arr, token_budget, max_batch_rows, batch_overhead_tokens)
    order = np.argsort(-arr, kind="stable")
    batches: list[Batch] = []
    start = 0
    n = int(arr.size)
    while start < n:
        padded, rows = _take(arr, order, start, token_budget, max_batch_rows, pad_to_multiple_of, min_fill)
        batches.append(Batch(indices=order[start : start + rows], padded_length=padded))
        start += rows
    return batches
