"""A pod create refused by a namespace's ResourceQuota waits and tries again, inside the task's try.

Kubernetes does not queue a pod that would exceed a ``ResourceQuota``: the API server refuses the create
with ``403 Forbidden`` and a message such as ``pods "batch-worker-x" is forbidden: exceeded quota:
batch-inference-gpus, requested: requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu=16, limited:
requests.nvidia.com/gpu=16``. The provider's API retry covers only transient codes (429, 5xx), so without
this the task would fail and spend one of its ``retries`` per refusal, and a fan-out wider than the quota
would burn through them. :func:`create_with_quota_backoff` waits with exponential backoff (5 s doubling
to 120 s, from :data:`FIRST_DELAY_S` / :data:`MAX_DELAY_S`) while the quota refuses, up to
``quota_wait_seconds`` (``K8sSettings``), then lets the last refusal fail the try. Any other 403 (RBAC,
admission policy) is not a quota refusal and fails at once. Airflow side; no Airflow import.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

FIRST_DELAY_S = 5.0
"""First wait after a quota refusal (seconds): about the time a finished pod of the run takes to go."""
MAX_DELAY_S = 120.0
"""Longest single wait (seconds), so a freed quota is used within two minutes."""
QUOTA_MESSAGE = "exceeded quota"
"""What the API server's quota admission puts in the 403's message (``k8s.io/apiserver`` resourcequota)."""

log = logging.getLogger(__name__)


def is_quota_rejection(exc: BaseException) -> bool:
    """Whether ``exc`` is the API server refusing a create because a ResourceQuota is full: a
    ``kubernetes`` ``ApiException`` with status 403 whose body or reason says ``exceeded quota``."""
    if getattr(exc, "status", None) != 403:
        return False
    text = f"{getattr(exc, 'body', '') or ''} {getattr(exc, 'reason', '') or ''}"
    return QUOTA_MESSAGE in text


def quota_delays(wait_seconds: float, first: float = FIRST_DELAY_S, cap: float = MAX_DELAY_S) -> list[float]:
    """The waits (seconds) between tries: ``first`` doubling up to ``cap``, summing to at most
    ``wait_seconds`` (the last one shortened to fit); ``[]`` when ``wait_seconds`` <= 0."""
    delays: list[float] = []
    total, delay = 0.0, first
    while total < wait_seconds:
        step = min(delay, cap, wait_seconds - total)
        delays.append(step)
        total += step
        delay *= 2
    return delays


def create_with_quota_backoff(create: Callable[[], T], wait_seconds: float, *, what: str = "pod",
                              sleep: Callable[[float], Any] | None = None) -> T:
    """Call ``create`` until it does not raise a quota refusal (:func:`is_quota_rejection`), waiting
    :func:`quota_delays` in between; returns what ``create`` returned.

    Args:
        create: the create call (e.g. the provider's ``get_or_create_pod``, which reattaches first, so a
            retry never creates a second pod).
        wait_seconds: the most time to spend waiting for the quota (seconds).
        what: the object in log lines.
        sleep: the wait function (seconds; default ``time.sleep``).

    Raises:
        Exception: whatever ``create`` raises that is not a quota refusal, at once; the last quota
            refusal once ``wait_seconds`` are spent.
    """
    delays = quota_delays(wait_seconds)
    for attempt in range(len(delays) + 1):
        try:
            return create()
        except Exception as exc:
            if not is_quota_rejection(exc) or attempt == len(delays):
                raise
            log.warning("%s create refused by a ResourceQuota (%s); waiting %.0f s and trying again "
                        "(%d of %d, no task retry spent)", what, _message(exc), delays[attempt], attempt + 1,
                        len(delays))
            (sleep or time.sleep)(delays[attempt])
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


def _message(exc: BaseException) -> str:
    body = getattr(exc, "body", "") or ""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    return " ".join(str(body).split())[:300]


__all__ = ["FIRST_DELAY_S", "MAX_DELAY_S", "create_with_quota_backoff", "is_quota_rejection", "quota_delays"]
