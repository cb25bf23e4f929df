"""The local live cluster behaves like Kubernetes where the kubernetes runner depends on it.

Real kube-apiserver 1.20 with RBAC, the project's node agent executing pods as processes. Pods are
created with the ``airflow-worker`` service account's kubeconfig (what Airflow uses), so every test
also proves ``deploy/k8s/rbac.yaml`` grants enough.
"""

from __future__ import annotations

import os
import threading
import time
import uuid

import pytest
from kubernetes import client

from scripts.k8s.cluster import NAMESPACE
from scripts.k8s.images import BUSYBOX_IMAGE

pytestmark = [pytest.mark.k8s, pytest.mark.integration]

SPOT_TOLERATIONS = [
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
]
SPOT_SELECTOR = {"cloud.google.com/gke-spot": "true", "cloud.google.com/gke-accelerator": "nvidia-l4"}


def pod(script: str, *, grace: int | None = None, selector: dict | None = None,
        tolerations: list | None = None, gpus: int = 1) -> dict:
    """A one-container ``sh -c script`` pod for the spot GPU node (``gpus`` nvidia.com/gpu)."""
    spec = {"restartPolicy": "Never", "nodeSelector": SPOT_SELECTOR if selector is None else selector,
            "tolerations": SPOT_TOLERATIONS if tolerations is None else tolerations,
            "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "command": ["sh", "-c", script],
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"smoke-{uuid.uuid4().hex[:8]}"}, "spec": spec}


def create(cluster, manifest: dict, identity: str = "airflow-worker") -> str:
    cluster.api(identity).create_namespaced_pod(NAMESPACE, manifest)
    return manifest["metadata"]["name"]


def finished(p) -> bool:
    return p is not None and p.status.phase in ("Succeeded", "Failed")


def running(p) -> bool:
    return p is not None and p.status.phase == "Running"


def log_text(api, name: str, **kwargs) -> str:
    # _preload_content=False: the client's str deserialisation of pods/log returns "b'...'" (client 36)
    resp = api.read_namespaced_pod_log(name, NAMESPACE, container="main", _preload_content=False, **kwargs)
    return resp.data.decode()


def wait_log(cluster, name: str, text: str, timeout: float = 20.0) -> None:
    """Wait until the container has printed ``text`` (its trap is installed by then)."""
    deadline = time.monotonic() + timeout
    while text not in log_text(cluster.api(), name):
        assert time.monotonic() < deadline, f"{name} never printed {text!r}"
        time.sleep(0.1)


def test_failed_pod_reports_exit_code_and_log(k8s_cluster):
    api = k8s_cluster.api("airflow-worker")
    name = create(k8s_cluster, pod("echo hi; echo second line; exit 3"))
    done = k8s_cluster.wait_for_pod(NAMESPACE, name, finished, 30)
    term = done.status.container_statuses[0].state.terminated
    assert (done.status.phase, term.exit_code, term.reason) == ("Failed", 3, "Error")
    assert done.spec.node_name == k8s_cluster.node_agent.node_name
    assert log_text(api, name) == "hi\nsecond line\n"
    assert log_text(api, name, tail_lines=1) == "second line\n"
    stamped = log_text(api, name, timestamps=True).splitlines()
    assert [line.split(" ", 1)[1] for line in stamped] == ["hi", "second line"]
    assert all(line[:4].isdigit() and line.split(" ", 1)[0].endswith("Z") for line in stamped)


def test_succeeded_pod_and_env(k8s_cluster):
    manifest = pod('echo "$GREETING from $(POD_NAME)"')
    manifest["spec"]["containers"][0]["env"] = [
        {"name": "GREETING", "value": "hello"},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    manifest["spec"]["containers"][0]["command"] = ["sh", "-c", 'echo "$GREETING from $(POD_NAME)"']
    name = create(k8s_cluster, manifest)
    done = k8s_cluster.wait_for_pod(NAMESPACE, name, finished, 30)
    assert done.status.phase == "Succeeded"
    assert done.status.container_statuses[0].state.terminated.reason == "Completed"
    assert log_text(k8s_cluster.api(), name) == f"hello from {name}\n"


@pytest.mark.parametrize(("kwargs", "reason"), [
    ({"selector": {"cloud.google.com/gke-accelerator": "nvidia-h100"}},
     "1 node(s) didn't match Pod's node affinity."),
    ({"tolerations": []}, "1 node(s) had taint {nvidia.com/gpu: present}, that the pod didn't tolerate."),
    ({"gpus": 9}, "1 Insufficient nvidia.com/gpu."),  # the node has 8; the namespace's quota allows 16
], ids=["selector", "taint", "gpus"])
def test_unfit_pod_stays_pending_unschedulable(k8s_cluster, kwargs, reason):
    name = create(k8s_cluster, pod("echo never", **kwargs))

    def marked(p) -> bool:
        return any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in p.status.conditions or [])

    p = k8s_cluster.wait_for_pod(NAMESPACE, name, marked, 20)
    cond = next(c for c in p.status.conditions if c.type == "PodScheduled")
    assert (p.status.phase, cond.status) == ("Pending", "False")
    assert cond.message == f"0/1 nodes are available: {reason}"
    events = k8s_cluster.api("airflow-worker").list_namespaced_event(
        NAMESPACE, field_selector=f"involvedObject.name={name}").items
    # kube-scheduler retries an unschedulable pod and may record the same event again
    assert {(e.type, e.reason, e.message) for e in events} == {("Warning", "FailedScheduling", cond.message)}
    time.sleep(1.0)
    assert k8s_cluster.api().read_namespaced_pod(name, NAMESPACE).spec.node_name is None
    k8s_cluster.api().delete_namespaced_pod(name, NAMESPACE)
    k8s_cluster.wait_for_pod(NAMESPACE, name, lambda p: p is None, 20)


class FollowedLog(threading.Thread):
    """The container's log followed through the API server until the container exits (``text``; when the
    kubelet removes the container of a deleted pod first, the stream ends with the runtime's error line)."""

    def __init__(self, cluster, name: str) -> None:
        super().__init__(daemon=True)
        self.resp = cluster.api().read_namespaced_pod_log(name, NAMESPACE, container="main", follow=True,
                                                          _preload_content=False)
        self.text = ""
        self.start()

    def run(self) -> None:
        self.text = b"".join(self.resp.stream()).decode()


def test_delete_sends_sigterm_then_removes_pod(k8s_cluster):
    script = "trap 'echo got TERM; exit 0' TERM; echo ready; while true; do sleep 0.1; done"
    name = create(k8s_cluster, pod(script, grace=30))
    k8s_cluster.wait_for_pod(NAMESPACE, name, running, 30)
    wait_log(k8s_cluster, name, "ready")
    followed = FollowedLog(k8s_cluster, name)
    t0 = time.monotonic()
    k8s_cluster.api("airflow-worker").delete_namespaced_pod(name, NAMESPACE)
    k8s_cluster.wait_for_pod(NAMESPACE, name, lambda p: p is None, 20)
    assert time.monotonic() - t0 < 10, "a pod that exits on SIGTERM must not wait out its grace period"
    followed.join(10)
    assert "got TERM" in followed.text.splitlines()


def test_delete_kills_after_grace(k8s_cluster):
    script = "trap '' TERM; echo ready; while true; do sleep 0.1; done"
    name = create(k8s_cluster, pod(script, grace=2))
    p = k8s_cluster.wait_for_pod(NAMESPACE, name, running, 30)
    pid = k8s_cluster.container_pid(p.status.container_statuses[0].container_id)
    wait_log(k8s_cluster, name, "ready")
    t0 = time.monotonic()
    k8s_cluster.api().delete_namespaced_pod(name, NAMESPACE)
    time.sleep(1.0)
    assert k8s_cluster.api().read_namespaced_pod(name, NAMESPACE).metadata.deletion_timestamp is not None
    assert os.path.exists(f"/proc/{pid}"), "SIGTERM is ignored: the process must live until the grace ends"
    k8s_cluster.wait_for_pod(NAMESPACE, name, lambda p: p is None, 20)
    assert time.monotonic() - t0 >= 1.9
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{pid}")


def test_preemption_keeps_failed_pod_with_exit_code(k8s_cluster):
    script = "trap 'echo committing; exit 75' TERM; echo ready; while true; do sleep 0.1; done"
    name = create(k8s_cluster, pod(script, grace=30))
    k8s_cluster.wait_for_pod(NAMESPACE, name, running, 30)
    wait_log(k8s_cluster, name, "ready")
    p = k8s_cluster.preempt(NAMESPACE, name, wait=20, how="shutdown")
    assert p.status.phase == "Failed"
    assert p.status.container_statuses[0].state.terminated.exit_code == 75
    if k8s_cluster.node_kind == "agent":  # GKE's graceful node shutdown, which a kubelet without systemd lacks
        assert p.status.reason == "Terminated"
        assert any(c.type == "DisruptionTarget" and c.status == "True" for c in p.status.conditions)
    assert log_text(k8s_cluster.api("airflow-triggerer"), name).endswith("committing\n")


def test_many_pods_at_once_and_delete_before_start(k8s_cluster):
    names = [create(k8s_cluster, pod(f"sleep 1; echo shard {i}")) for i in range(5)]
    early = create(k8s_cluster, pod("echo should not matter"))
    k8s_cluster.api().delete_namespaced_pod(early, NAMESPACE, grace_period_seconds=0)
    for i, name in enumerate(names):
        done = k8s_cluster.wait_for_pod(NAMESPACE, name, finished, 60)
        assert done.status.phase == "Succeeded"
        assert log_text(k8s_cluster.api(), name) == f"shard {i}\n"
    k8s_cluster.wait_for_pod(NAMESPACE, early, lambda p: p is None, 20)


def test_service_accounts_get_exactly_what_rbac_yaml_grants(k8s_cluster):
    for identity in ("airflow-worker", "airflow-triggerer"):
        api = k8s_cluster.api(identity)
        name = create(k8s_cluster, pod("echo rbac"), identity=identity)
        k8s_cluster.wait_for_pod(NAMESPACE, name, finished, 30)
        assert name in [p.metadata.name for p in api.list_namespaced_pod(NAMESPACE).items]
        api.patch_namespaced_pod(name, NAMESPACE, {"metadata": {"labels": {"already_checked": "True"}}})
        assert log_text(api, name) == "rbac\n"
        api.list_namespaced_event(NAMESPACE)
        api.delete_namespaced_pod(name, NAMESPACE)
        forbidden = [(api.list_namespaced_secret, ("kube-system",)), (api.list_namespaced_secret, (NAMESPACE,)),
                     (api.create_namespaced_pod, ("default", pod("echo no"))), (api.list_node, ())]
        for call, args in forbidden:
            with pytest.raises(client.ApiException) as err:
                call(*args)
            assert err.value.status == 403, (identity, call.__name__)
    with pytest.raises(client.ApiException) as err:  # the worker pods' own account has no API access
        k8s_cluster.api("batch-worker").list_namespaced_pod(NAMESPACE)
    assert err.value.status == 403


def test_follow_streams_until_the_container_exits(k8s_cluster):
    name = create(k8s_cluster, pod("for i in 1 2 3 4; do echo line $i; sleep 0.5; done"))
    k8s_cluster.wait_for_pod(NAMESPACE, name, lambda p: p.status.phase != "Pending", 30)
    resp = k8s_cluster.api("airflow-worker").read_namespaced_pod_log(
        name, NAMESPACE, container="main", follow=True, timestamps=True, _preload_content=False)
    text = b"".join(resp.stream()).decode().splitlines()  # the stream ends when the container has exited
    assert [t.split(" ", 1)[1] for t in text] == [f"line {i}" for i in range(1, 5)]
    # the kubelet reports the exit in its next status sync, which may come after the stream ended
    k8s_cluster.wait_for_pod(NAMESPACE, name, finished, 20)


def test_pods_survive_an_api_server_restart(k8s_cluster):
    name = create(k8s_cluster, pod("sleep 4; echo after restart"))
    k8s_cluster.wait_for_pod(NAMESPACE, name, running, 30)
    k8s_cluster.restart_apiserver()
    done = k8s_cluster.wait_for_pod(NAMESPACE, name, finished, 90)
    assert done.status.phase == "Succeeded"
    later = create(k8s_cluster, pod("echo new pod"))  # the agent watches again
    assert k8s_cluster.wait_for_pod(NAMESPACE, later, finished, 60).status.phase == "Succeeded"


def test_pod_naming_a_missing_service_account_is_rejected(k8s_cluster):
    manifest = pod("echo never")
    manifest["spec"]["serviceAccountName"] = "no-such-account"
    with pytest.raises(client.ApiException) as err:
        k8s_cluster.api("airflow-worker").create_namespaced_pod(NAMESPACE, manifest)
    assert err.value.status == 403 and "no-such-account" in err.value.body


def test_drain_evicts_with_sigterm_and_removes_the_pod(k8s_cluster):
    script = "trap 'echo drained; exit 75' TERM; echo ready; while true; do sleep 0.1; done"
    name = create(k8s_cluster, pod(script, grace=30))
    k8s_cluster.wait_for_pod(NAMESPACE, name, running, 30)
    wait_log(k8s_cluster, name, "ready")
    followed = FollowedLog(k8s_cluster, name)
    assert k8s_cluster.preempt(NAMESPACE, name, wait=20, how="drain") is None
    followed.join(10)
    assert "drained" in followed.text.splitlines()


def test_env_from_secrets_and_missing_secret(k8s_cluster):
    admin = k8s_cluster.api()
    secret = f"s-{uuid.uuid4().hex[:6]}"
    admin.create_namespaced_secret(NAMESPACE, {"metadata": {"name": secret}, "stringData": {"host": "http://x:1"}})
    manifest = pod('echo "$STORAGE_EMULATOR_HOST"')
    manifest["spec"]["containers"][0]["env"] = [
        {"name": "STORAGE_EMULATOR_HOST", "valueFrom": {"secretKeyRef": {"name": secret, "key": "host"}}}]
    name = create(k8s_cluster, manifest)
    assert k8s_cluster.wait_for_pod(NAMESPACE, name, finished, 30).status.phase == "Succeeded"
    assert log_text(admin, name) == "http://x:1\n"

    manifest = pod("echo never")
    manifest["spec"]["containers"][0]["env"] = [
        {"name": "X", "valueFrom": {"secretKeyRef": {"name": "no-such-secret", "key": "k"}}}]
    name = create(k8s_cluster, manifest)

    def config_error(p) -> bool:
        statuses = p.status.container_statuses or []
        return bool(statuses) and (statuses[0].state.waiting or {}) and statuses[0].state.waiting.reason != "ContainerCreating"

    waiting = k8s_cluster.wait_for_pod(NAMESPACE, name, config_error, 30).status.container_statuses[0].state.waiting
    assert (waiting.reason, waiting.message) == ("CreateContainerConfigError", 'secret "no-such-secret" not found')
    assert k8s_cluster.api().read_namespaced_pod(name, NAMESPACE).status.phase == "Pending"
    # it holds a GPU of the session's node until deleted; no container ever started, so no grace is due
    admin.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)
    k8s_cluster.wait_for_pod(NAMESPACE, name, lambda p: p is None, 20)


def test_missing_command_is_a_start_error(k8s_cluster):
    manifest = pod("unused")
    manifest["spec"]["containers"][0]["command"] = ["no-such-binary-xyz"]
    name = create(k8s_cluster, manifest)
    done = k8s_cluster.wait_for_pod(NAMESPACE, name, finished, 30)
    term = done.status.container_statuses[0].state.terminated
    assert (done.status.phase, term.exit_code, term.reason) == ("Failed", 128, "StartError")
    assert "no-such-binary-xyz" in term.message
