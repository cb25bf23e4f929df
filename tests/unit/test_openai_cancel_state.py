"""A cancelled batch stays ``cancelling`` only while a worker may still commit
(``openai_api.batches.shards_stopping``): a ``running`` shard until its progress goes stale, a
``starting`` one (killed while loading its model) for :data:`STALE_AFTER_SECONDS` after the run ended."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace

from batch_inference.openai_api.batches import shards_stopping
from batch_inference.progress import STALE_AFTER_SECONDS
from hypothesis import given
from hypothesis import strategies as st

ENDED = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
STATES = ("complete", "running", "starting", "stale", "failed", "pending")


def _view(states: list[str], ended: datetime | None) -> SimpleNamespace:
    return SimpleNamespace(shards=[SimpleNamespace(state=s) for s in states], record=SimpleNamespace(end_date=ended))


@given(states=st.lists(st.sampled_from(STATES), max_size=8), after=st.floats(0, 3 * STALE_AFTER_SECONDS),
       ended=st.booleans())
def test_a_batch_waits_only_for_workers_that_may_still_commit(states: list[str], after: float, ended: bool) -> None:
    at = ENDED.timestamp() + after
    expected = "running" in states or ("starting" in states and (not ended or after < STALE_AFTER_SECONDS))
    assert shards_stopping(_view(states, ENDED if ended else None), at=at) is expected


def test_a_worker_killed_while_loading_does_not_hold_the_batch_forever() -> None:
    view = _view(["complete", "starting", "starting"], ENDED)
    assert shards_stopping(view, at=ENDED.timestamp() + 10)
    assert not shards_stopping(view, at=ENDED.timestamp() + STALE_AFTER_SECONDS + 1)
