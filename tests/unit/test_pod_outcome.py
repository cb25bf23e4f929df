"""Exit code / pod status -> task outcome table of the shard pod task (``batch_inference.pod_outcome``)."""

from __future__ import annotations

import re

import pytest
from batch_contract.enums import ExitCode
from batch_inference.pod_outcome import (
    PREEMPTIONS_ANNOTATION,
    PREEMPTIONS_EVENT_KEY,
    STATUS_LOST_REASON,
    PodOutcome,
    classify,
    oom_failure,
    preemption_cause,
    preemptions_of,
    scheduling_failure,
    start_failure,
)
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.client import models as k8s

C = "base"


def pod(*, phase: str = "Failed", code: int | None = None, reason: str | None = None,
        conditions: list[tuple[str, str, str | None, str | None]] | None = None, node: str | None = "n1",
        waiting: tuple[str, str] | None = None, annotations: dict[str, str] | None = None,
        term_reason: str | None = None, memory: str | None = None) -> k8s.V1Pod:
    state = k8s.V1ContainerState()
    if code is not None:
        state.terminated = k8s.V1ContainerStateTerminated(exit_code=code, reason=term_reason)
    elif waiting is not None:
        state.waiting = k8s.V1ContainerStateWaiting(reason=waiting[0], message=waiting[1])
    statuses = [k8s.V1ContainerStatus(name=C, image="i", image_id="", ready=False, restart_count=0, state=state)]
    conds = [k8s.V1PodCondition(type=t, status=s, reason=r, message=m) for t, s, r, m in (conditions or [])]
    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name="batch-worker-abc", annotations=annotations),
        spec=k8s.V1PodSpec(containers=[k8s.V1Container(
            name=C, resources=k8s.V1ResourceRequirements(limits={"memory": memory} if memory else None))],
            node_name=node),
        status=k8s.V1PodStatus(phase=phase, reason=reason, conditions=conds,
                               container_statuses=statuses if (code is not None or waiting) else None),
    )


UNSCHEDULED = [("PodScheduled", "False", "Unschedulable",
                "0/1 nodes are available: 1 node(s) didn't match node selector.")]


@pytest.mark.parametrize(("status", "the_pod", "expected"), [
    ("success", pod(phase="Succeeded", code=0), PodOutcome.SUCCEEDED),
    ("success", None, PodOutcome.SUCCEEDED),                      # GC'd after the trigger saw success
    ("failed", pod(code=int(ExitCode.INTERRUPTED)), PodOutcome.PREEMPTED),
    ("error", None, PodOutcome.PREEMPTED),                        # vanished: the node deleted it
    ("failed", None, PodOutcome.PREEMPTED),
    ("failed", pod(code=137, reason="Terminated"), PodOutcome.PREEMPTED),   # graceful node shutdown
    ("failed", pod(code=143, conditions=[("DisruptionTarget", "True", "PreemptionByScheduler", "")]),
     PodOutcome.PREEMPTED),
    ("failed", pod(code=int(ExitCode.BAD_INPUT)), PodOutcome.BAD_INPUT),
    ("failed", pod(code=int(ExitCode.FAILURE)), PodOutcome.FAILED),
    ("failed", pod(code=137, reason="OOMKilled"), PodOutcome.FAILED),   # not a pod-level reason
    ("failed", pod(code=137, term_reason="OOMKilled"), PodOutcome.OUT_OF_MEMORY),
    ("failed", pod(code=137, term_reason="Error"), PodOutcome.FAILED),
    ("failed", pod(code=137, term_reason="ContainerStatusUnknown"), PodOutcome.PREEMPTED),  # status lost
    ("timeout", pod(phase="Pending", node=None, conditions=UNSCHEDULED), PodOutcome.UNSCHEDULABLE),
    ("timeout", pod(phase="Pending", node=None), PodOutcome.UNSCHEDULABLE),
    ("timeout", pod(phase="Pending", waiting=("ImagePullBackOff", "no such image")), PodOutcome.FAILED),
    ("error", pod(phase="Running"), PodOutcome.RUNNING),         # the provider re-defers
    ("error", pod(phase="Running", conditions=[("DisruptionTarget", "True", "TerminationByKubelet", "")]),
     PodOutcome.RUNNING),                                         # reclaimed but still running: wait for it
])
def test_outcome_table(status: str, the_pod: k8s.V1Pod | None, expected: PodOutcome) -> None:
    assert classify(status, the_pod, C) is expected


def test_unschedulable_message_names_the_scheduler_reason() -> None:
    text = scheduling_failure(pod(phase="Pending", node=None, conditions=UNSCHEDULED), 5)
    assert "Unschedulable: 0/1 nodes are available: 1 node(s) didn't match node selector." in text
    assert "5 s" in text and "batch-worker-abc" in text


def test_start_failure_names_the_waiting_reason() -> None:
    text = start_failure(pod(phase="Pending", waiting=("ImagePullBackOff", "no such image")), C, 30)
    assert "ImagePullBackOff: no such image" in text and "30 s" in text


def test_preemption_count_prefers_the_event_then_the_pod() -> None:
    annotated = pod(code=75, annotations={PREEMPTIONS_ANNOTATION: "3"})
    assert preemptions_of(annotated) == 3
    assert preemptions_of(annotated, {PREEMPTIONS_EVENT_KEY: 5}) == 5
    assert preemptions_of(None, {PREEMPTIONS_EVENT_KEY: 2}) == 2
    assert preemptions_of(pod(code=75)) == 0 and preemptions_of(None, {}) == 0
    with pytest.raises(ValueError, match=f"^{re.escape(PREEMPTIONS_ANNOTATION)}: '-1' is negative"):
        preemptions_of(pod(code=75, annotations={PREEMPTIONS_ANNOTATION: "-1"}))


def test_preemption_cause_says_which_kind() -> None:
    assert "vanished" in preemption_cause(None, C)
    assert "exited 75" in preemption_cause(pod(code=75), C)
    assert "Terminated" in preemption_cause(pod(code=137, reason="Terminated"), C)
    assert "lost the worker's exit status" in preemption_cause(pod(code=137, term_reason=STATUS_LOST_REASON), C)


@given(code=st.integers(min_value=1, max_value=255), status=st.sampled_from(["failed", "error", "success"]),
       phase=st.sampled_from(["Failed", "Running", "Unknown"]))
def test_a_lost_exit_status_is_a_preemption_whatever_code_the_kubelet_wrote(code: int, status: str,
                                                                             phase: str) -> None:
    """The kubelet's ``ContainerStatusUnknown`` placeholder code is not the worker's: never a failure or a
    bad-input verdict, always a relaunch that resumes from the committed chunks."""
    lost = pod(phase=phase, code=code, term_reason=STATUS_LOST_REASON)
    assert classify(status, lost, C) is PodOutcome.PREEMPTED


@given(code=st.integers(min_value=1, max_value=255).filter(
    lambda c: c not in (int(ExitCode.INTERRUPTED), int(ExitCode.BAD_INPUT))),
       status=st.sampled_from(["failed", "error", "success"]))
def test_an_oom_killed_container_is_its_own_outcome_whatever_the_exit_code(code: int, status: str) -> None:
    """The kubelet's ``OOMKilled`` decides, not the exit code (137 from the kernel's SIGKILL, or what an
    init process makes of it); a worker that committed and exited 75 or refused its input (2) keeps its
    meaning."""
    assert classify(status, pod(code=code, term_reason="OOMKilled"), C) is PodOutcome.OUT_OF_MEMORY


def test_oom_failure_names_the_limit_and_what_to_change() -> None:
    message = oom_failure(pod(code=137, term_reason="OOMKilled", memory="300Mi"), C)
    assert "batch-worker-abc was OOMKilled" in message and "memory limit 300Mi" in message
    assert "BATCH_K8S_MEMORY" in message and "without retries" in message
