"""The Batch inference page's status mapping (batch-API vocabulary) from DagRun/TaskInstance states and
shard markers: one case per rule, plus the precedence between rules."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from batch_inference.ui.status import BatchStatus, RunFacts, batch_status, deadline_of

T0 = datetime(2026, 1, 1, tzinfo=UTC)
PLANNED = {"plan": "success", "choose_runner": "success"}


@pytest.mark.parametrize(("facts", "expected"), [
    (RunFacts("queued"), BatchStatus.VALIDATING),
    (RunFacts("running", {"plan": "running"}), BatchStatus.VALIDATING),
    (RunFacts("running", {"plan": "up_for_retry"}), BatchStatus.VALIDATING),
    (RunFacts("running", {**PLANNED, "infer_local[0]": "running"}, shards_total=3, shards_complete=1),
     BatchStatus.IN_PROGRESS),
    # a shard failed and retries: still in progress while the run runs
    (RunFacts("running", {**PLANNED, "infer_local[0]": "up_for_retry", "wait_for_shards": "none"},
              shards_total=2), BatchStatus.IN_PROGRESS),
    (RunFacts("running", {**PLANNED, "wait_for_shards": "deferred"}, shards_total=3, shards_complete=2),
     BatchStatus.IN_PROGRESS),
    # every marker is there, the gate has not noticed yet
    (RunFacts("running", {**PLANNED, "wait_for_shards": "deferred"}, shards_total=3, shards_complete=3),
     BatchStatus.FINALIZING),
    (RunFacts("running", {**PLANNED, "wait_for_shards": "success", "publish": "none"}, shards_total=3),
     BatchStatus.FINALIZING),
    (RunFacts("running", {**PLANNED, "wait_for_shards": "running", "publish": "queued"}), BatchStatus.FINALIZING),
    (RunFacts("running", {**PLANNED, "publish": "success", "summary": "running"}), BatchStatus.FINALIZING),
    # zero shards (empty input) is not "all complete"
    (RunFacts("running", {**PLANNED}, shards_total=0), BatchStatus.IN_PROGRESS),
    (RunFacts("success", {**PLANNED, "summary": "success"}), BatchStatus.COMPLETED),
    (RunFacts("success", {"plan": "success", "render_k8s": "success", "wait_for_shards": "skipped"}),
     BatchStatus.COMPLETED),
    (RunFacts("failed", {**PLANNED, "infer_local[1]": "failed", "wait_for_shards": "failed"}), BatchStatus.FAILED),
    (RunFacts("failed", {"plan": "failed", "choose_runner": "upstream_failed"}), BatchStatus.FAILED),
    (RunFacts("failed", {**PLANNED, "wait_for_shards": "success", "publish": "failed"}), BatchStatus.FAILED),
    # marked failed by hand: Airflow skipped what had not finished, nothing failed
    (RunFacts("failed", {**PLANNED, "infer_local[0]": "skipped", "wait_for_shards": "skipped"}),
     BatchStatus.CANCELLED),
    (RunFacts("failed", {}), BatchStatus.CANCELLED),
    (RunFacts("failed", {**PLANNED, "wait_for_shards": "failed"}, gate_ended_at=T0 + timedelta(hours=25),
              deadline_at=T0 + timedelta(hours=24)), BatchStatus.EXPIRED),
    # the gate failed before its deadline: not enough shards completed, a plain failure
    (RunFacts("failed", {**PLANNED, "wait_for_shards": "failed"}, gate_ended_at=T0 + timedelta(hours=1),
              deadline_at=T0 + timedelta(hours=24)), BatchStatus.FAILED),
    (RunFacts("failed", {**PLANNED, "wait_for_shards": "failed"}, gate_ended_at=T0), BatchStatus.FAILED),
])
def test_batch_status(facts: RunFacts, expected: BatchStatus) -> None:
    assert batch_status(facts) is expected


def test_terminal_statuses() -> None:
    assert {s for s in BatchStatus if s.terminal} == {BatchStatus.COMPLETED, BatchStatus.FAILED,
                                                      BatchStatus.EXPIRED, BatchStatus.CANCELLED}


def test_deadline_of() -> None:
    assert deadline_of(T0, 1.5) == T0 + timedelta(minutes=90)
    assert deadline_of(None, 1.0) is None
    assert deadline_of(T0, None) is None


def test_status_values_are_the_batch_api_words() -> None:
    assert [s.value for s in BatchStatus] == ["validating", "in_progress", "finalizing", "completed", "failed",
                                              "expired", "cancelled"]
