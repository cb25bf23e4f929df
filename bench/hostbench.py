"""The ``host`` object every benchmark's JSON carries: host facts, memory bandwidth, load before/after.

A benchmark calls :func:`start` first thing and puts :func:`finish`'s dict under ``"host"`` in its
last JSON line. Host facts are :func:`batch_contract.hostinfo.host_facts` (CPU model, cores, caches,
bf16/AMX, memory); :func:`memory_bandwidth_gbps` adds a stream-copy bandwidth measured in the same
run, as another host of the same kind can differ there (issue #22).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "plugins") not in sys.path:
    sys.path.insert(0, str(ROOT / "plugins"))

import numpy as np  # noqa: E402
from batch_contract.hostinfo import host_facts, load_average  # noqa: E402

COPY_BYTES = 256 << 20
"""Bytes per copy in :func:`memory_bandwidth_gbps`: 8x the largest L3 seen on our hosts' CPU 0 (32 MiB)
and well above the 105 MiB of the other host's, so the copy streams through DRAM."""


def memory_bandwidth_gbps(reps: int = 3, nbytes: int = COPY_BYTES) -> float:
    """Best of ``reps`` single-threaded ``np.copyto`` of ``nbytes`` (after one untimed copy that faults
    the pages in), in GB/s counting bytes read plus bytes written (STREAM's "copy" convention). About
    100 ms on a 2-core VM. One thread: the figure is what one core pulls, the bound of a memory-bound
    stage like a cast or a scan."""
    src = np.ones(nbytes // 8, dtype=np.float64)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return round(2 * nbytes / best / 1e9, 2)


_STATE: dict[str, Any] = {}


def start() -> dict[str, Any]:
    """Record the host facts, memory bandwidth and load average before the benchmark; returns them."""
    facts = host_facts()
    facts["mem_copy_gbps"] = memory_bandwidth_gbps()
    facts["load_avg_before"] = facts.pop("load_avg")
    facts["t0"] = time.time()
    _STATE.clear()
    _STATE.update(facts)
    return dict(facts)


def finish() -> dict[str, Any]:
    """The ``host`` object: :func:`start`'s facts (measured now when it was not called) plus
    ``load_avg_after`` and ``bench_seconds`` (wall time since :func:`start`)."""
    facts = dict(_STATE) if _STATE else start()
    t0 = facts.pop("t0")
    facts["load_avg_after"] = load_average()
    facts["bench_seconds"] = round(time.time() - t0, 1)
    return facts
