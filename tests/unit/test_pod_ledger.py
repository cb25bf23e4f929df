"""The live suite's pod ledger records a deletion it never saw as an event (a pod gone between two lists)."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import k8s_live
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from k8s_live import PodLedger, PodRecord, max_concurrent


def _pod(name: str) -> SimpleNamespace:
    meta = SimpleNamespace(name=name, labels={"batch-inference/shard-id": name}, annotations={},
                           creation_timestamp=None)
    status = SimpleNamespace(phase="Running", reason=None, container_statuses=[], conditions=[])
    return SimpleNamespace(metadata=meta, spec=SimpleNamespace(containers=[]), status=status)


class _ListOnlyApi:
    """Serves one list per call from ``lists`` (then repeats the last); watching is refused, so the ledger
    sees every change only through a fresh list, as after a dropped watch."""

    def __init__(self, lists: list[list[str]]) -> None:
        self.lists = lists
        self.calls = 0
        self.done = threading.Event()

    def list_namespaced_pod(self, namespace: str, **kwargs) -> SimpleNamespace:
        if kwargs.get("watch"):
            raise ConnectionError("watch refused")
        names = self.lists[min(self.calls, len(self.lists) - 1)]
        self.calls += 1
        if self.calls >= len(self.lists):
            self.done.set()
        return SimpleNamespace(items=[_pod(n) for n in names], metadata=SimpleNamespace(resource_version="1"))


_LIFETIMES = st.dictionaries(st.sampled_from("abcdef"), st.tuples(st.integers(1, 4), st.integers(1, 5)))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lifetimes=_LIFETIMES)
def test_a_pod_missing_from_a_later_list_is_deleted(lifetimes: dict[str, tuple[int, int]], monkeypatch) -> None:
    """Each pod is listed from its first list for ``span`` lists (a pod name never comes back, as
    generated names do not); the last list is index 5."""
    lists = [[n for n, (first, span) in sorted(lifetimes.items()) if first <= i < first + span] for i in range(6)]
    api = _ListOnlyApi(lists)
    monkeypatch.setattr(k8s_live, "time", SimpleNamespace(sleep=lambda s: None, monotonic=time.monotonic))
    ledger = PodLedger(api, namespace="ns").start()
    assert api.done.wait(10)
    time.sleep(0.05)
    ledger.stop()
    final = set(lists[-1])
    seen = {n for names in lists for n in names}
    assert set(ledger.pods) == seen
    for name, rec in ledger.pods.items():
        assert rec.deleted == (name not in final), (name, lists)


_INTERVALS = st.lists(st.tuples(st.integers(0, 50), st.integers(1, 20)), max_size=12)


@settings(max_examples=200, deadline=None)
@given(intervals=_INTERVALS)
def test_max_concurrent_equals_the_densest_second(intervals: list[tuple[int, int]]) -> None:
    """The sweep agrees with counting, for every whole second, the pods running in it ([start, end))."""
    base = datetime(2026, 1, 1, tzinfo=UTC)
    records = [PodRecord(f"p{i}", {}, {}, started_at=base + timedelta(seconds=s),
                         finished_at=base + timedelta(seconds=s + d)) for i, (s, d) in enumerate(intervals)]
    by_second = [sum(1 for s, d in intervals if s <= t < s + d) for t in range(0, 71)]
    assert max_concurrent(records) == max(by_second, default=0)
