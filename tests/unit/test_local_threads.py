"""Thread cap of local shards: cores // parallelism threads per worker, parallelism 0 fits the machine."""

from __future__ import annotations

import sys
import types

from batch_inference.local_runner import auto_parallelism, worker_thread_env, worker_threads
from batch_worker.stats import apply_thread_cap


def test_auto_parallelism_fits_the_machine() -> None:
    assert auto_parallelism(2, {}) == 2
    assert auto_parallelism(1, {}) == 1
    assert auto_parallelism(8, {}) == 2
    assert auto_parallelism(16, {}) == 4
    assert auto_parallelism(16, {"BATCH_WORKER_THREADS": "2"}) == 8


def test_each_worker_gets_its_share_of_the_cores() -> None:
    assert [worker_threads(p, 2, {}) for p in (1, 2, 3)] == [2, 1, 1]
    assert worker_threads(4, 16, {}) == 4
    assert worker_threads(4, 16, {"BATCH_WORKER_THREADS": "3"}) == 3
    assert worker_threads(1, 16, {"OMP_NUM_THREADS": "1"}) == 1  # the operator's own cap is kept
    assert auto_parallelism(4, {"OMP_NUM_THREADS": "1"}) == 4
    env = worker_thread_env(1)
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == env["BATCH_WORKER_THREADS"] == "1"
    assert env["TOKENIZERS_PARALLELISM"] == "false" and worker_thread_env(2)["TOKENIZERS_PARALLELISM"] == "true"


def test_worker_applies_the_cap_to_a_loaded_torch(monkeypatch) -> None:
    calls = []
    fake = types.SimpleNamespace(set_num_threads=calls.append, get_num_threads=lambda: calls[-1] if calls else 8)
    monkeypatch.setitem(sys.modules, "torch", fake)
    assert apply_thread_cap({"BATCH_WORKER_THREADS": "2"}) == 2 and calls == [2]
    assert apply_thread_cap({}) == 2  # no cap: torch's own count is recorded
    monkeypatch.delitem(sys.modules, "torch")
    assert apply_thread_cap({"BATCH_WORKER_THREADS": "3"}) == 3 and apply_thread_cap({}) == 0
