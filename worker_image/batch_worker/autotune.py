"""Batch-size search of the canary (pure: no torch, no I/O; unit-tested with made-up trials).

Two strategies (:data:`batch_contract.canary.STRATEGIES`):

* ``candidates`` (CPU): try each of :data:`CPU_CANDIDATES` once, keep the fastest (real tokens per
  engine second). On the 2-core development machine 4k-8k-token batches ran 10-20% faster than 16k
  ones (``AUTO_TOKEN_BUDGET``'s note); the search checks that on the machine at hand.
* ``grow`` (GPU): start at :data:`GROW_START` tokens and double while each step gains at least
  :data:`MIN_GAIN`; stop at the first out-of-memory trial or the first step without that gain and back
  off one step (the largest budget that ran without running out of memory and still gained). A first
  trial that runs out of memory halves the budget until one fits.

A trial that ran out of memory is a data point: the engine split its batch and finished the rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from batch_contract.canary import AutotuneTrial
from batch_contract.engine_config import MIN_TOKEN_BUDGET

CPU_CANDIDATES = (2048, 4096, 8192, 16384)
"""Token budgets tried on CPU (tokens per batch), smallest first."""
GROW_START = 16384
"""First token budget of the GPU search (a quarter of ``AUTO_TOKEN_BUDGET['cuda']``)."""
GROW_MAX = 4_194_304
"""Largest token budget the GPU search tries (the form's ``token_budget`` maximum)."""
MIN_GAIN = 0.05
"""A doubling must raise tokens/s by at least 5% to count as a gain (below that is timing noise)."""


class BudgetSearch:
    """State of one search: ask :meth:`next_budget`, run it, :meth:`record` the trial, until ``None``.

    Args:
        strategy: ``candidates`` or ``grow``.
        candidates: budgets for ``candidates`` (default :data:`CPU_CANDIDATES`).
        start / maximum: first and largest budget for ``grow`` (tokens).
        min_gain: relative tokens/s gain a doubling must bring (default :data:`MIN_GAIN`).
    """

    def __init__(self, strategy: str, candidates: Sequence[int] = CPU_CANDIDATES, start: int = GROW_START,
                 maximum: int = GROW_MAX, min_gain: float = MIN_GAIN) -> None:
        if strategy not in ("candidates", "grow"):
            raise ValueError(f"search strategy {strategy!r} is not 'candidates' or 'grow'")
        self.strategy = strategy
        self.candidates = list(candidates)
        self.start = start
        self.maximum = maximum
        self.min_gain = min_gain
        self.trials: list[AutotuneTrial] = []
        self._done = False

    def _measured(self) -> list[AutotuneTrial]:
        return [t for t in self.trials if not t.warmup and t.rows > 0]

    def record(self, trial: AutotuneTrial) -> None:
        """Add a finished trial (its rows were computed and committed, whatever the outcome)."""
        self.trials.append(trial)

    def stop(self) -> None:
        """End the search early (time cap or sample exhausted); :meth:`chosen` uses what was measured."""
        self._done = True

    def next_budget(self) -> int | None:
        """The next token budget to try, or ``None`` when the search is over."""
        if self._done:
            return None
        measured = self._measured()
        if self.strategy == "candidates":
            tried = {t.token_budget for t in measured}
            rest = [c for c in self.candidates if c not in tried]
            return rest[0] if rest else None
        return self._next_grow(measured)

    def _next_grow(self, measured: list[AutotuneTrial]) -> int | None:
        if not measured:
            return self.start
        last = measured[-1]
        fits = [t for t in measured if not t.oom]
        if last.oom:
            if fits:  # grew into out-of-memory: done, back off to the last that fitted
                return None
            nxt = last.token_budget // 2
            return nxt if nxt >= MIN_TOKEN_BUDGET else None
        if len(fits) >= 2 and fits[-1].tokens_per_s < fits[-2].tokens_per_s * (1 + self.min_gain):
            return None  # no gain from the last doubling
        nxt = last.token_budget * 2
        return nxt if nxt <= self.maximum else None

    def chosen(self, default: int) -> int:
        """The budget to use: ``candidates``: the fastest trial that did not run out of memory; ``grow``:
        one step back from where growth stopped (the fastest fitting trial, ties to the smaller budget).
        ``default`` when nothing was measured; half the smallest budget tried when every trial ran out
        of memory (at least ``MIN_TOKEN_BUDGET``)."""
        measured = self._measured()
        fits = [t for t in measured if not t.oom]
        if not measured:
            return default
        if not fits:
            return max(MIN_TOKEN_BUDGET, min(t.token_budget for t in measured) // 2)
        if self.strategy == "grow":
            if len(fits) >= 2 and fits[-1].tokens_per_s < fits[-2].tokens_per_s * (1 + self.min_gain):
                return fits[-2].token_budget
            return fits[-1].token_budget
        best = max(fits, key=lambda t: (t.tokens_per_s, -t.token_budget))
        return best.token_budget


def stratified_order(lengths: Sequence[int] | np.ndarray) -> np.ndarray:
    """An order of rows whose every prefix spans the length distribution: rows sorted by length, then
    visited in bit-reversed (van der Corput) order, so the first k rows are spread over the length
    quantiles for every k (the canary's trials take consecutive slices of it).

    Args:
        lengths: one length per row (any unit), shape ``(n,)``.

    Returns:
        int64 permutation of ``range(n)``.
    """
    arr = np.asarray(lengths)
    n = int(arr.size)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    by_length = np.argsort(arr, kind="stable")
    bits = max(1, (n - 1).bit_length())
    positions = [int(format(i, f"0{bits}b")[::-1], 2) for i in range(1 << bits)]
    return by_length[[p for p in positions if p < n]].astype(np.int64)


__all__ = ["CPU_CANDIDATES", "GROW_MAX", "GROW_START", "MIN_GAIN", "BudgetSearch", "stratified_order"]
