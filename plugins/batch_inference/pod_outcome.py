"""What a finished (or vanished, or stuck) shard pod means for the Airflow task: pure functions.

The worker's exit codes (:class:`batch_contract.enums.ExitCode`) and the pod's status decide one
:class:`PodOutcome`; :class:`batch_inference.shard_pod.ShardPodOperator` acts on it:

======================================================  ================  ===============================
pod                                                     outcome           the task
======================================================  ================  ===============================
base container exited 0 (or the pod is gone after the   ``succeeded``     succeeds
trigger saw it succeed)
exit 75 (SIGTERM: finished chunks committed), or the    ``preempted``     a fresh pod for the same shard,
pod vanished (deleted by the node / GC), or the pod                       same try; no retry consumed, up
ended with condition ``DisruptionTarget`` or a node-                      to ``max_preemptions`` per try
shutdown status reason (spot reclaim, any exit code),
or the kubelet lost the exit status
(``ContainerStatusUnknown``: its 137, not the worker's)
exit 2 (bad config or input)                            ``bad_input``     fails now, no retries
the container was ``OOMKilled`` (its memory limit is    ``out_of_memory`` fails now, no retries (the same
below what the worker needs)                                              limit is hit again), naming the
                                                                          limit and what to change
not scheduled when the startup timeout ran out          ``unschedulable`` fails this try naming the
                                                                          ``PodScheduled`` reason; retries
any other exit (1, 137 killed, ...) or a start          ``failed``       fails this try; retries with
timeout after scheduling                                                  exponential backoff
still running / pending (an ``error`` event)            ``running``       the provider re-defers
======================================================  ================  ===============================

The pod objects are ``kubernetes.client.V1Pod`` (or anything with the same attributes); this module
imports neither Airflow nor the Kubernetes client.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from batch_contract.enums import ExitCode

PREEMPTIONS_ANNOTATION = "batch-inference/preemptions"
"""Pod annotation: how many earlier pods of this shard and try were preempted (decimal string)."""
PREEMPTIONS_EVENT_KEY = "batch_inference_preemptions"
"""Key of the same count in the trigger's ``trigger_kwargs``, which the trigger copies into its event
(so the count survives a triggerer restart: trigger kwargs are stored with the trigger)."""
NODE_SHUTDOWN_REASONS = frozenset({"Shutdown", "NodeShutdown", "Terminated"})
"""``pod.status.reason`` values the kubelet's graceful node shutdown sets ("Pod was terminated in
response to imminent node shutdown"; GKE spot reclaims use it)."""
STATUS_LOST_REASON = "ContainerStatusUnknown"
"""``state.terminated.reason`` the kubelet writes, with exit code 137 of its own, when it can no longer find
a container whose pod is being deleted ("The container could not be located when the pod was deleted";
kubelet 1.20 under load removes the exited container before reporting its code). The worker's own exit
code is lost; its committed chunks are not, so the shard is relaunched and resumes like a preempted one."""
DISRUPTION_CONDITION = "DisruptionTarget"
"""Pod condition (Kubernetes 1.26+) set when a pod is evicted, preempted or its node is going away."""


class PodOutcome(str, Enum):
    """What a shard pod's end means for its task (table in the module docstring)."""

    SUCCEEDED = "succeeded"
    PREEMPTED = "preempted"
    BAD_INPUT = "bad_input"
    OUT_OF_MEMORY = "out_of_memory"
    UNSCHEDULABLE = "unschedulable"
    FAILED = "failed"
    RUNNING = "running"


def _container_status(pod: Any, container: str) -> Any | None:
    status = getattr(pod, "status", None)
    for cs in (getattr(status, "container_statuses", None) or []):
        if cs.name == container:
            return cs
    return None


def exit_code(pod: Any, container: str) -> int | None:
    """The exit code of ``container`` in ``pod`` when it has terminated, else ``None``."""
    cs = _container_status(pod, container)
    terminated = getattr(getattr(cs, "state", None), "terminated", None)
    return None if terminated is None else int(terminated.exit_code)


def condition(pod: Any, kind: str) -> Any | None:
    """The pod condition of type ``kind`` (e.g. ``PodScheduled``), or ``None``."""
    for cond in (getattr(getattr(pod, "status", None), "conditions", None) or []):
        if cond.type == kind:
            return cond
    return None


def is_scheduled(pod: Any) -> bool:
    """Whether the pod is bound to a node (``PodScheduled`` is ``True`` or ``spec.node_name`` is set)."""
    cond = condition(pod, "PodScheduled")
    if cond is not None and cond.status == "True":
        return True
    return bool(getattr(getattr(pod, "spec", None), "node_name", None))


def node_reclaimed(pod: Any) -> bool:
    """Whether the pod ended because its node went away: a ``DisruptionTarget`` condition or a
    node-shutdown status reason (:data:`NODE_SHUTDOWN_REASONS`)."""
    cond = condition(pod, DISRUPTION_CONDITION)
    if cond is not None and cond.status == "True":
        return True
    return getattr(getattr(pod, "status", None), "reason", None) in NODE_SHUTDOWN_REASONS


def _terminated_reason(pod: Any, container: str) -> str | None:
    """``state.terminated.reason`` of ``container`` (e.g. ``OOMKilled``), or ``None``."""
    cs = _container_status(pod, container)
    return getattr(getattr(getattr(cs, "state", None), "terminated", None), "reason", None)


def status_lost(pod: Any, container: str) -> bool:
    """True when ``container`` terminated with the kubelet's :data:`STATUS_LOST_REASON`: its exit code
    (137) is the kubelet's placeholder, not what the worker returned."""
    return _terminated_reason(pod, container) == STATUS_LOST_REASON


def _is_finished(pod: Any, container: str) -> bool:
    phase = getattr(getattr(pod, "status", None), "phase", None)
    return phase in ("Succeeded", "Failed") or exit_code(pod, container) is not None


def classify(event_status: str, pod: Any | None, container: str) -> PodOutcome:
    """The outcome of a shard pod when the trigger fired.

    Args:
        event_status: the trigger event's ``status`` (``success``, ``failed``, ``timeout``, ``error``).
        pod: the pod as read after the event, or ``None`` when the API server no longer has it (404).
        container: the worker container's name (the operator's ``base_container_name``).

    Returns:
        The :class:`PodOutcome` (rules in the module docstring).
    """
    if pod is None:
        return PodOutcome.SUCCEEDED if event_status == "success" else PodOutcome.PREEMPTED
    code = exit_code(pod, container)
    if code == ExitCode.OK:
        return PodOutcome.SUCCEEDED
    if code == ExitCode.INTERRUPTED or (node_reclaimed(pod) and _is_finished(pod, container)):
        return PodOutcome.PREEMPTED  # a reclaimed pod still running is waited for: one writer per shard
    if status_lost(pod, container):
        return PodOutcome.PREEMPTED  # the worker's exit code is unknown; its committed chunks are kept
    if code == ExitCode.BAD_INPUT:
        return PodOutcome.BAD_INPUT
    if oom_killed(pod, container):
        return PodOutcome.OUT_OF_MEMORY
    if event_status == "timeout":
        return PodOutcome.FAILED if is_scheduled(pod) else PodOutcome.UNSCHEDULABLE
    if getattr(pod.status, "phase", None) == "Succeeded":
        return PodOutcome.SUCCEEDED
    if not _is_finished(pod, container):
        return PodOutcome.RUNNING if event_status != "failed" else PodOutcome.FAILED
    return PodOutcome.FAILED


OOM_KILLED = "OOMKilled"
"""``state.terminated.reason`` the kubelet reports for a container the kernel killed at its cgroup's memory
limit (exit code 137)."""


def oom_killed(pod: Any, container: str) -> bool:
    """True when ``container`` last terminated because it reached its memory limit (:data:`OOM_KILLED`)."""
    return _terminated_reason(pod, container) == OOM_KILLED


def _memory_limit(pod: Any, container: str) -> str | None:
    for c in getattr(getattr(pod, "spec", None), "containers", None) or []:
        if c.name == container:
            limits = getattr(getattr(c, "resources", None), "limits", None) or {}
            return limits.get("memory")
    return None


def oom_failure(pod: Any, container: str, role: str = "shard") -> str:
    """Why an ``OOMKilled`` pod failed, for the task log and the exception: the pod, its memory limit and
    what to change (``BATCH_K8S_MEMORY``, or a smaller ``token_budget`` so batches need less memory)."""
    name = getattr(getattr(pod, "metadata", None), "name", "?")
    limit = _memory_limit(pod, container) or "(no limit set)"
    return (f"{role} pod {name} was OOMKilled: the worker needed more than its memory limit {limit}. "
            "Failing without retries (the same limit would be hit again); raise BATCH_K8S_MEMORY or lower "
            "the token_budget Param.")


def scheduling_failure(pod: Any, timeout_s: float, role: str = "shard") -> str:
    """Why ``pod`` did not start: its ``PodScheduled`` condition's reason and message (what
    ``kubectl describe pod`` prints), e.g. ``Unschedulable: 0/1 nodes are available: 1 node(s) didn't
    match Pod's node affinity/selector``.

    Args:
        pod: the stuck pod.
        timeout_s: the startup timeout that ran out (seconds), named in the message.
        role: what the pod is (``shard`` or ``canary``), named in the message.
    """
    name = getattr(getattr(pod, "metadata", None), "name", "?")
    cond = condition(pod, "PodScheduled")
    if cond is None or cond.status == "True":
        why = "no PodScheduled=False condition (no scheduler has looked at it, or it is bound but not started)"
    else:
        why = f"{cond.reason or 'PodScheduled=False'}: {cond.message or '(no message)'}"
    return f"{role} pod {name} was not scheduled within the startup timeout ({timeout_s:g} s): {why}"


def start_failure(pod: Any, container: str, timeout_s: float, role: str = "shard") -> str:
    """Why a scheduled ``pod`` did not start in time: the container's waiting reason and message
    (e.g. ``ImagePullBackOff: ...``), or its phase when there is none; ``role`` as in
    :func:`scheduling_failure`."""
    name = getattr(getattr(pod, "metadata", None), "name", "?")
    cs = _container_status(pod, container)
    waiting = getattr(getattr(cs, "state", None), "waiting", None)
    why = (f"{waiting.reason}: {waiting.message or '(no message)'}" if waiting is not None
           else f"phase {getattr(pod.status, 'phase', None)}")
    return f"{role} pod {name} was scheduled but did not start within the startup timeout ({timeout_s:g} s): {why}"


def run_window(pod: Any | None, container: str) -> tuple[Any, Any] | None:
    """``(created, finished)``: the pod's ``metadata.creation_timestamp`` and the moment ``container``
    terminated (``datetime`` objects, as the Kubernetes client returns them, timezone-aware); ``None``
    when the pod is unknown or either time is missing. Their difference is the pod's wall time with its
    scheduling, image pull and process start-up included (seconds, via ``timedelta``)."""
    if pod is None:
        return None
    created = getattr(getattr(pod, "metadata", None), "creation_timestamp", None)
    cs = _container_status(pod, container)
    finished = getattr(getattr(getattr(cs, "state", None), "terminated", None), "finished_at", None)
    if created is None or finished is None:
        return None
    return created, finished


def preemptions_of(pod: Any | None, event: dict[str, Any] | None = None) -> int:
    """Preemptions already counted for this shard and try: the event's
    :data:`PREEMPTIONS_EVENT_KEY` when present (it survives a vanished pod), else the pod's
    :data:`PREEMPTIONS_ANNOTATION`, else 0.

    Raises:
        ValueError: a count that is not a non-negative integer.
    """
    raw: Any = None
    if event is not None:
        raw = event.get(PREEMPTIONS_EVENT_KEY)
    if raw is None and pod is not None:
        raw = (getattr(pod.metadata, "annotations", None) or {}).get(PREEMPTIONS_ANNOTATION)
    count = int(raw or 0)
    if count < 0:
        raise ValueError(f"{PREEMPTIONS_ANNOTATION}: {raw!r} is negative")
    return count


def preemption_cause(pod: Any | None, container: str) -> str:
    """A short phrase for the log: why this pod counts as preempted."""
    if pod is None:
        return "pod vanished (deleted by its node or the API server)"
    code = exit_code(pod, container)
    if code == ExitCode.INTERRUPTED:
        return f"worker exited {int(ExitCode.INTERRUPTED)} (SIGTERM: finished chunks committed)"
    if status_lost(pod, container):
        return f"the kubelet lost the worker's exit status ({STATUS_LOST_REASON}; exit code {code})"
    reason = getattr(pod.status, "reason", None) or DISRUPTION_CONDITION
    return f"node reclaimed ({reason}; exit code {code})"
