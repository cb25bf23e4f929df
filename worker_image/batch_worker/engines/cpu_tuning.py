"""Pick the fastest of interchangeable CPU kernels on this host by timing the first real calls.

The encoder's CPU fast path has kernels that compute the same thing (SDPA or batch-chunked attention,
packed oneDNN or plain linears) whose relative speed depends on the host: on the 2-core AMD EPYC
development VM (1 MiB L2 per core, AVX512-BF16, no AMX) chunked attention ran 1.1-1.4x SDPA's speed at
32-64 tokens but 0.6x at 128-512 (``make bench-attention``, 2026-12-01), and the packed 384->384 linear
0.83x ``F.linear`` while the feed-forward ones ran 1.2x; on an AMX host the same code lost most of its
margin over sentence-transformers (issue #22). Constants tuned on one machine do not carry over, so
:class:`OnlineChoice` measures instead: the first calls of each key (a sequence-length class, a layer
shape) rotate through the candidates, every result is used (all candidates are exact alternatives, within
bf16 rounding), and once each candidate has ``warmup + samples`` timings the fastest per unit of work is
kept for the rest of the process. The cost is the losing candidates' few calls, not an extra probe.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Any

WARMUP_CALLS = 1
"""Timed calls of each candidate per key that are discarded: the first call at a new shape pays for
oneDNN primitive creation / kernel generation, which a long run amortises."""

SAMPLE_CALLS = 2
"""Timed calls per candidate and key after the warm-up; the best (least time per unit of work) counts,
as on a shared host extra time is noise from other processes, never a faster kernel."""


class OnlineChoice:
    """Per-key choice among ``candidates`` (names), decided by timing the first calls.

    Args:
        candidates: names of interchangeable implementations, in the order they are tried.
        warmup: timings per candidate and key discarded (:data:`WARMUP_CALLS`).
        samples: timings per candidate and key that decide (:data:`SAMPLE_CALLS`).

    ``chosen`` maps ``str(key)`` to the winning name once decided: a live dict the engine puts in the
    marker's engine info, so the marker shows what this host picked. Not thread-safe (one inference
    thread calls it).
    """

    def __init__(self, candidates: tuple[str, ...], warmup: int = WARMUP_CALLS, samples: int = SAMPLE_CALLS) -> None:
        if not candidates:
            raise ValueError("OnlineChoice needs at least one candidate")
        self.candidates = candidates
        self.warmup, self.samples = warmup, samples
        self.chosen: dict[str, str] = {}
        self._costs: dict[Hashable, dict[str, list[float]]] = {}
        self._calls: dict[Hashable, int] = {}

    def next(self, key: Hashable) -> tuple[str, bool]:
        """``(name, timed)``: the decided winner for ``key`` (``timed`` False), else the candidate whose
        turn it is (``timed`` True: report its time with :meth:`record`)."""
        winner = self.chosen.get(str(key))
        if winner is not None:
            return winner, False
        calls = self._calls.get(key, 0)
        return self.candidates[calls % len(self.candidates)], True

    def record(self, key: Hashable, name: str, seconds: float, work: float) -> None:
        """Record one timed call of ``name`` for ``key``: ``seconds`` wall time for ``work`` units (any
        unit proportional to the call's FLOPs, so calls of different sizes compare)."""
        self._calls[key] = self._calls.get(key, 0) + 1
        costs = self._costs.setdefault(key, {c: [] for c in self.candidates})
        costs[name].append(seconds / max(work, 1e-12))
        need = self.warmup + self.samples
        if all(len(v) >= need for v in costs.values()):
            self.chosen[str(key)] = min(self.candidates, key=lambda c: min(costs[c][self.warmup:]))

    def run(self, key: Hashable, work: float, impls: dict[str, Callable[[], Any]]) -> Any:
        """Run the implementation :meth:`next` names for ``key`` (``impls``: name -> no-argument
        callable), timing it while undecided; returns its result."""
        name, timed = self.next(key)
        if not timed:
            return impls[name]()
        t0 = time.perf_counter()
        out = impls[name]()
        self.record(key, name, time.perf_counter() - t0, work)
        return out
