"""Batch-size search of the canary (pure: no torch, no I/O; unit-tested with made-up trials).

Two strategies (:data:`batch_contract.canary.STRATEGIES`):

* ``candidates`` (CPU): try each of :data:`CPU_CANDIDATES` once. The device's default (the
  *incumbent*: ``AUTO_TOKEN_BUDGET['cpu']`` for the encoder) stays chosen unless another candidate is
  **confidently** faster: its median speed at least ``1 + MIN_GAIN`` times the incumbent's, its slowest
  trial faster than the incumbent's fastest, and :data:`CANDIDATE_REPEATS` trials each (one each when
  it is :data:`CLEAR_GAIN` faster). Then the choice steps to the smallest confidently faster candidate
  and repeats from there. A candidate that looks faster but not yet confidently is tried again with
  the current choice, up to :data:`CANDIDATE_REPEATS` trials each. One 1-2 s trial per candidate, fastest wins, let timing
  noise pick 8,192 on one run and 4,096 on the next for the same input on the same host; with the
  confidence rule a choice changes only when a candidate is faster by more than the noise. On the 2-core
  development machine 4k-8k-token batches ran 10-20% faster than 16k ones (``AUTO_TOKEN_BUDGET``'s
  note); the search checks that on the machine at hand.
* ``grow`` (GPU): start at :data:`GROW_START` tokens and double while each step gains at least
  :data:`MIN_GAIN`; stop at the first out-of-memory trial or the first step without that gain and back
  off one step (the largest budget that ran without running out of memory and still gained). A first
  trial that runs out of memory halves the budget until one fits.

A trial that ran out of memory is a data point: the engine split its batch and finished the rows.

What is searched depends on the engine (:class:`SearchSpace`, :func:`search_space`):

* encoder (:data:`ENCODER_SPACE`): the token budget (padded tokens per batch), ranked by real input
  tokens per engine second;
* llm (:data:`LLM_SPACE`): vLLM's ``max_num_seqs`` (sequences in flight), with ``max_num_batched_tokens``
  following it (:func:`llm_batched_tokens`), ranked by output tokens per engine second. "Out of memory"
  there means vLLM preempted running requests because its KV cache was full (the preempted requests
  were recomputed and finished).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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
CLEAR_GAIN = 0.20
"""A candidate 20% faster than the holder in single trials wins without repeats (noise is a few %)."""
CANDIDATE_REPEATS = 3
"""Trials per undecided candidate (and the incumbent) at most, ``candidates``: a median of three ignores one
outlier, and three trials give the range the confidence rule compares."""


LLM_CPU_CANDIDATES = (8, 16, 32, 64)
"""``max_num_seqs`` values tried on CPU, smallest first (64 is the engine's CPU cap,
``batch_worker.engines.llm.CPU_MAX_NUM_SEQS``)."""
LLM_GROW_START = 128
"""First ``max_num_seqs`` of the GPU search."""
LLM_GROW_MAX = 4096
"""Largest ``max_num_seqs`` the GPU search tries (4x vLLM's H100/H200 offline default of 1024)."""
LLM_TOKENS_PER_SEQ = 16
"""``max_num_batched_tokens`` per sequence in flight: vLLM's own default pairs (1024 sequences / 16,384
tokens on H100/H200, 256 / 4,096 on CPU) have this ratio."""
LLM_MIN_BATCHED_TOKENS = 4096
"""Floor of ``max_num_batched_tokens`` (vLLM's CPU default): prefill chunks never get smaller than that."""


def llm_batched_tokens(max_num_seqs: int) -> int:
    """``max_num_batched_tokens`` paired with ``max_num_seqs`` in the LLM search:
    ``max(LLM_MIN_BATCHED_TOKENS, LLM_TOKENS_PER_SEQ x max_num_seqs)`` (tokens per engine step)."""
    return max(LLM_MIN_BATCHED_TOKENS, LLM_TOKENS_PER_SEQ * int(max_num_seqs))


@dataclass(frozen=True)
class SearchSpace:
    """What the canary searches for one engine kind.

    Attributes:
        key: the :class:`~batch_contract.canary.AutotuneTrial` field the search varies (``token_budget``
            or ``max_batch_rows``); the search's "budgets" are values of it.
        rate: the trial property that ranks settings (``tokens_per_s`` or ``output_tokens_per_s``).
        candidates: values tried by ``candidates`` (CPU), smallest first.
        grow_start / grow_max: first and largest value of ``grow`` (GPU).
        minimum: smallest value ``grow`` halves down to when its first value runs out of memory.
    """

    key: str
    rate: str
    candidates: tuple[int, ...]
    grow_start: int
    grow_max: int
    minimum: int


ENCODER_SPACE = SearchSpace("token_budget", "tokens_per_s", CPU_CANDIDATES, GROW_START, GROW_MAX, MIN_TOKEN_BUDGET)
"""The encoder: token budget per batch, ranked by real input tokens/s."""
LLM_SPACE = SearchSpace("max_batch_rows", "output_tokens_per_s", LLM_CPU_CANDIDATES, LLM_GROW_START, LLM_GROW_MAX, 1)
"""The LLM engine: ``max_num_seqs`` (``max_batch_rows`` of the trial), ranked by output tokens/s."""


def search_space(engine_kind: str) -> SearchSpace:
    """:data:`LLM_SPACE` for ``llm``, :data:`ENCODER_SPACE` otherwise."""
    return LLM_SPACE if engine_kind == "llm" else ENCODER_SPACE


class BudgetSearch:
    """State of one search: ask :meth:`next_budget`, run it, :meth:`record` the trial, until ``None``.

    The "budget" is a value of ``space.key`` (the encoder's token budget, the LLM's ``max_num_seqs``).

    Args:
        strategy: ``candidates`` or ``grow``.
        candidates: values for ``candidates`` (default ``space.candidates``).
        start / maximum: first and largest value for ``grow`` (default ``space.grow_start`` / ``grow_max``).
        min_gain: relative gain of ``space.rate`` a doubling must bring (default :data:`MIN_GAIN`).
        space: what is searched (default :data:`ENCODER_SPACE`).
        incumbent: ``candidates``: the value kept unless another is confidently faster (the device's
            default); ``None`` or not among the candidates: the smallest candidate.
    """

    def __init__(self, strategy: str, candidates: Sequence[int] | None = None, start: int | None = None,
                 maximum: int | None = None, min_gain: float = MIN_GAIN, space: SearchSpace = ENCODER_SPACE,
                 incumbent: int | None = None) -> None:
        if strategy not in ("candidates", "grow"):
            raise ValueError(f"search strategy {strategy!r} is not 'candidates' or 'grow'")
        self.strategy = strategy
        self.space = space
        self.candidates = list(space.candidates if candidates is None else candidates)
        self.start = space.grow_start if start is None else start
        self.maximum = space.grow_max if maximum is None else maximum
        self.min_gain = min_gain
        self.incumbent = incumbent if incumbent in self.candidates else min(self.candidates, default=None)
        self.trials: list[AutotuneTrial] = []
        self._done = False

    def value(self, trial: AutotuneTrial) -> int:
        """The searched value of ``trial`` (its ``space.key`` field)."""
        return int(getattr(trial, self.space.key))

    def rate(self, trial: AutotuneTrial) -> float:
        """The speed that ranks ``trial`` (its ``space.rate`` property)."""
        return float(getattr(trial, self.space.rate))

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
            tried = {self.value(t) for t in measured}
            rest = [c for c in self.candidates if c not in tried]
            if rest:
                return rest[0]
            counts = self._trial_counts()
            undecided = self._undecided()
            if undecided:
                undecided.append(self._winner())
            again = [c for c in undecided if counts.get(c, 0) < CANDIDATE_REPEATS]
            return min(again, key=lambda c: (counts.get(c, 0), c)) if again else None
        return self._next_grow(measured)

    def _trial_counts(self) -> dict[int, int]:
        counts: dict[int, int] = {}
        for t in self._measured():
            counts[self.value(t)] = counts.get(self.value(t), 0) + 1
        return counts

    def _fitting_rates(self) -> dict[int, list[float]]:
        rates: dict[int, list[float]] = {}
        for t in self._measured():
            if not t.oom:
                rates.setdefault(self.value(t), []).append(self.rate(t))
        return dict(sorted(rates.items()))

    def median_rates(self) -> dict[int, float]:
        """Median speed (``space.rate``) per value over its trials that did not run out of memory."""
        return {v: float(np.median(r)) for v, r in self._fitting_rates().items()}

    def _holder(self) -> int | None:
        """The value that holds the choice unless beaten: the incumbent when it fitted, else the
        fitting value with the best median (ties to the smaller); ``None`` when nothing fitted."""
        medians = self.median_rates()
        if not medians:
            return None
        if self.incumbent in medians:
            return self.incumbent
        return max(medians, key=lambda v: (medians[v], -v))

    def _beats(self, value: int, holder: int, confidently: bool) -> bool:
        """Whether ``value``'s median speed is at least ``1 + min_gain`` times ``holder``'s; confidently:
        also its slowest trial is faster than ``holder``'s fastest, and both have
        :data:`CANDIDATE_REPEATS` trials (or the gain is at least :data:`CLEAR_GAIN`)."""
        rates = self._fitting_rates()
        gain = float(np.median(rates[value])) / max(float(np.median(rates[holder])), 1e-12)
        if gain < 1 + self.min_gain:
            return False
        if not confidently:
            return True
        enough = min(len(rates[value]), len(rates[holder])) >= CANDIDATE_REPEATS or gain >= 1 + CLEAR_GAIN
        return enough and min(rates[value]) > max(rates[holder])

    def _winner(self) -> int | None:
        """From the holder, step to the smallest value that confidently beats the current one, until none
        does (speeds rise at each step, so this ends); ``None`` when nothing fitted."""
        current = self._holder()
        while current is not None:
            beaters = [v for v in self._fitting_rates() if v != current and self._beats(v, current, True)]
            if not beaters:
                return current
            current = min(beaters)
        return None

    def _undecided(self) -> list[int]:
        """Values whose median beats the current winner's by ``min_gain`` but not yet confidently."""
        winner = self._winner()
        if winner is None:
            return []
        return [v for v in self._fitting_rates() if v != winner and self._beats(v, winner, False)
                and not self._beats(v, winner, True)]

    def _next_grow(self, measured: list[AutotuneTrial]) -> int | None:
        if not measured:
            return self.start
        last = measured[-1]
        fits = [t for t in measured if not t.oom]
        if last.oom:
            if fits:  # grew into out-of-memory: done, back off to the last that fitted
                return None
            nxt = self.value(last) // 2
            return nxt if nxt >= self.space.minimum else None
        if len(fits) >= 2 and self.rate(fits[-1]) < self.rate(fits[-2]) * (1 + self.min_gain):
            return None  # no gain from the last doubling
        nxt = self.value(last) * 2
        return nxt if nxt <= self.maximum else None

    def chosen(self, default: int) -> int:
        """The budget to use: ``candidates``: the incumbent (module docstring), or, stepping from it, the
        smallest value confidently faster than the current one until none is; ``grow``:
        one step back from where growth stopped (the fastest fitting trial, ties to the smaller budget).
        ``default`` when nothing was measured; half the smallest budget tried when every trial ran out
        of memory (at least ``space.minimum``)."""
        measured = self._measured()
        fits = [t for t in measured if not t.oom]
        if not measured:
            return default
        if not fits:
            return max(self.space.minimum, min(self.value(t) for t in measured) // 2)
        if self.strategy == "grow":
            if len(fits) >= 2 and self.rate(fits[-1]) < self.rate(fits[-2]) * (1 + self.min_gain):
                return self.value(fits[-2])
            return self.value(fits[-1])
        return self._winner()


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


__all__ = ["CPU_CANDIDATES", "ENCODER_SPACE", "GROW_MAX", "GROW_START", "LLM_CPU_CANDIDATES", "LLM_GROW_MAX",
           "LLM_GROW_START", "LLM_SPACE", "MIN_GAIN", "BudgetSearch", "SearchSpace", "llm_batched_tokens",
           "search_space", "stratified_order"]
