"""A pod create a ResourceQuota refuses (403 ``exceeded quota``) waits and tries again inside the try, and
spends no task retry; any other refusal fails at once (``batch_inference.quota``, ``ShardPodOperator``)."""

from __future__ import annotations

import json
from pathlib import Path
from unittest import mock

import pytest
from airflow.sdk.exceptions import TaskDeferred
from batch_inference.pod_spec import K8sSettings
from batch_inference.quota import (
    FIRST_DELAY_S,
    MAX_DELAY_S,
    create_with_quota_backoff,
    is_quota_rejection,
    quota_delays,
)
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.client.exceptions import ApiException
from test_canary_pod import _context, _run, _shard_op
from test_shard_pod import Api

QUOTA_BODY = json.dumps({
    "kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403,
    "message": 'pods "batch-worker-abc" is forbidden: exceeded quota: batch-inference-gpus, requested: '
               "requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu=16, limited: requests.nvidia.com/gpu=16"})
RBAC_BODY = json.dumps({
    "kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403,
    "message": 'pods is forbidden: User "system:serviceaccount:airflow:airflow-worker" cannot create resource '
               '"pods" in API group "" in the namespace "batch-inference"'})


def api_error(status: int, body: str) -> ApiException:
    exc = ApiException(status=status, reason="Forbidden" if status == 403 else "Error")
    exc.body = body
    return exc


@pytest.mark.parametrize(("status", "body", "quota"), [
    (403, QUOTA_BODY, True), (403, QUOTA_BODY.encode(), True), (403, RBAC_BODY, False), (403, "", False),
    (429, QUOTA_BODY, False), (500, QUOTA_BODY, False), (404, "", False)])
def test_only_a_403_naming_the_quota_is_a_quota_refusal(status: int, body, quota: bool) -> None:
    exc = api_error(status, body.decode() if isinstance(body, bytes) else body)
    assert is_quota_rejection(exc) is quota
    assert not is_quota_rejection(ValueError("exceeded quota"))


@given(st.floats(min_value=0, max_value=100_000, allow_nan=False))
def test_the_waits_double_up_to_the_cap_and_fill_the_wait_exactly(wait: float) -> None:
    delays = quota_delays(wait)
    assert sum(delays) == pytest.approx(wait)
    assert all(0 < d <= MAX_DELAY_S for d in delays)
    assert not delays or delays[0] == min(FIRST_DELAY_S, wait)
    full = delays[:-1]
    assert all(b == min(2 * a, MAX_DELAY_S) for a, b in zip(full, full[1:], strict=False))


@given(refusals=st.integers(0, 12), wait=st.sampled_from([0, 30, 600, 3600]))
def test_refusals_within_the_wait_are_retried_and_beyond_it_the_last_is_raised(refusals: int, wait: int) -> None:
    calls, slept = [], []

    def create() -> str:
        calls.append(1)
        if len(calls) <= refusals:
            raise api_error(403, QUOTA_BODY)
        return "pod"

    allowed = len(quota_delays(wait))
    if refusals <= allowed:
        assert create_with_quota_backoff(create, wait, sleep=slept.append) == "pod"
        assert slept == quota_delays(wait)[:refusals] and len(calls) == refusals + 1
    else:
        with pytest.raises(ApiException) as info:
            create_with_quota_backoff(create, wait, sleep=slept.append)
        assert is_quota_rejection(info.value) and len(calls) == allowed + 1
        assert slept == quota_delays(wait)


def test_any_other_error_is_raised_at_once_without_waiting() -> None:
    slept = []
    for exc in (api_error(403, RBAC_BODY), api_error(422, "invalid"), OSError("connection reset")):
        with pytest.raises(type(exc)):
            create_with_quota_backoff(mock.Mock(side_effect=exc), 3600, sleep=slept.append)
    assert slept == []


class QuotaApi(Api):
    """The API server with a full quota for the first ``refusals`` creates."""

    def __init__(self, refusals: int) -> None:
        super().__init__()
        self.refusals = refusals
        self.refused = 0

    def create_pod(self, pod):
        if self.refused < self.refusals:
            self.refused += 1
            raise api_error(403, QUOTA_BODY)
        return super().create_pod(pod)


def test_the_shard_task_waits_for_the_quota_in_the_same_try_and_creates_one_pod(tmp_path: Path,
                                                                                monkeypatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr("batch_inference.quota.time.sleep", slept.append)
    run_dir = _run(tmp_path, {"runner": "kubernetes"}, markers=False)
    api = QuotaApi(refusals=3)
    op = _shard_op(api, run_dir, "00001")
    ctx = _context(run_dir, "infer_k8s")
    with pytest.raises(TaskDeferred):                  # created, then deferred on the pod: the normal path
        op.execute(ctx)
    assert api.refused == 3 and len(api.created) == 1
    assert slept == quota_delays(K8sSettings.quota_wait_seconds)[:3]
    assert ctx["ti"].try_number == 1                   # no retry spent


def test_with_no_quota_wait_the_refusal_fails_the_try(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, {"runner": "kubernetes"}, markers=False)
    api = QuotaApi(refusals=1)
    op = _shard_op(api, run_dir, "00001")
    op.quota_wait_seconds = 0
    with pytest.raises(ApiException):
        op.execute(_context(run_dir, "infer_k8s"))
    assert api.created == []
