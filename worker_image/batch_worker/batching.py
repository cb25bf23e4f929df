"""Length-sorted token-budget batching: plan which rows go together so padding stays small.

Rows are sorted by token length (longest first, so an out-of-memory error shows up on the first batch),
then packed greedily: a batch takes rows while ``rows x padded_length <= token_budget``,
``rows <= max_batch_rows`` and the row pads to the same length (one padding bucket), where
``padded_length`` is the batch's longest row rounded up to a multiple of ``pad_to_multiple_of``. Results are restored by row id, never by position.

Short rows: rounding 11 tokens up to 16 leaves 31% of the batch as padding, and on a corpus of short
texts (package summaries of <= 160 characters, 10-20 tokens) padding to multiples of 8 gave a padding
efficiency of 0.816 (issue #22). With ``exact_when_cheaper`` (the eager CPU engine, which has no
compiled shapes to keep few), a batch pads to its own longest row and takes rows down to ``min_fill``
x that length instead, where that still fills the batch and wastes less than the bucket.
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


EXACT_MIN_SHARE = 0.5
"""With ``exact_when_cheaper``, an exact-length batch must hold at least this share of the rows a batch
may hold (budget and row cap), else the padding bucket is kept (see :func:`plan_batches`)."""


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


def _fill(arr: np.ndarray, order: np.ndarray, start: int, rows: int, padded: int) -> float:
    """Real / padded tokens of the batch of ``rows`` rows from sorted position ``start``."""
    return float(arr[order[start : start + rows]].sum()) / (rows * padded)


def plan_batches(
    lengths: np.ndarray | list[int],
    token_budget: int,
    max_batch_rows: int,
    pad_to_multiple_of: int = 8,
    min_fill: float = MIN_FILL,
    exact_when_cheaper: bool = False,
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
        exact_when_cheaper: with a multiple > 1, each batch is planned both ways, as a padding bucket
            and by the multiple-1 rule (its own longest row, rows down to ``min_fill`` x it), and the
            exact one is taken when it is at least :data:`EXACT_MIN_SHARE` full (of the rows the budget
            and row cap allow) and has the higher real/padded ratio. Only well filled: on sparse
            lengths (small chunks) the multiple-1 rule makes many small batches, which cost more
            than the padding they save (measured: 53 batches instead of 30 and 0.85x rows/s on 600
            rows of the sample).

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
    order = np.argsort(-arr, kind="stable")
    batches: list[Batch] = []
    start = 0
    n = int(arr.size)
    while start < n:
        padded, rows = _take(arr, order, start, token_budget, max_batch_rows, pad_to_multiple_of, min_fill)
        if exact_when_cheaper and pad_to_multiple_of > 1:
            exact, exact_rows = _take(arr, order, start, token_budget, max_batch_rows, 1, min_fill)
            cap = max(1, min(max_batch_rows, token_budget // exact, n - start))
            if exact_rows >= EXACT_MIN_SHARE * cap and _fill(arr, order, start, exact_rows, exact) > _fill(arr, order, start, rows, padded):
                padded, rows = exact, exact_rows
        batches.append(Batch(indices=order[start : start + rows], padded_length=padded))
        start += rows
    return batches
