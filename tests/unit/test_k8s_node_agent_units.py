"""The node agent's pure parts: scheduling filters, ``$(VAR)`` expansion, exit codes, the CRI log reader."""

from __future__ import annotations

import datetime as dt

import pytest
from kubernetes.client import models as k8s

from scripts.k8s.node_agent import expand, spot_pool_shape
from scripts.k8s.pod_process import LogLine, exit_code, parse_rfc3339, read_log
from scripts.k8s.scheduling import NodeShape, pod_gpus, tolerates, unschedulable_message

NODE = spot_pool_shape("n0", gpus=2)
SPOT_TOLERATIONS = [
    k8s.V1Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule"),
    k8s.V1Toleration(key="cloud.google.com/gke-spot", operator="Equal", value="true", effect="NoSchedule"),
]


def make_pod(*, selector=None, tolerations=SPOT_TOLERATIONS, gpus=1, affinity=None, init_gpus=0) -> k8s.V1Pod:
    def container(name, n):
        return k8s.V1Container(name=name, resources=k8s.V1ResourceRequirements(limits={"nvidia.com/gpu": str(n)}))

    return k8s.V1Pod(spec=k8s.V1PodSpec(
        containers=[container("main", gpus)], init_containers=[container("init", init_gpus)] if init_gpus else None,
        node_selector=selector, tolerations=tolerations, affinity=affinity))


def required(*exprs) -> k8s.V1Affinity:
    term = k8s.V1NodeSelectorTerm(match_expressions=[k8s.V1NodeSelectorRequirement(**e) for e in exprs])
    return k8s.V1Affinity(node_affinity=k8s.V1NodeAffinity(
        required_during_scheduling_ignored_during_execution=k8s.V1NodeSelector(node_selector_terms=[term])))


def test_spot_pool_node_comes_from_k8s_settings_defaults():
    from batch_inference.pod_spec import K8sSettings

    assert K8sSettings().node_selector.items() <= NODE.labels.items()
    assert {(t["key"], t["effect"]) for t in NODE.taints} == {
        ("nvidia.com/gpu", "NoSchedule"), ("cloud.google.com/gke-spot", "NoSchedule")}


def test_the_runners_default_pod_fits():
    from batch_inference.pod_spec import K8sSettings, kpo_partial_kwargs

    kw = kpo_partial_kwargs(K8sSettings())
    pod = make_pod(selector=kw["node_selector"], tolerations=kw["tolerations"], affinity=kw["affinity"])
    assert unschedulable_message(pod, NODE, gpus_in_use=0) is None


@pytest.mark.parametrize(("pod", "in_use", "message"), [
    (make_pod(selector={"cloud.google.com/gke-accelerator": "nvidia-h100"}), 0,
     "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity."),
    (make_pod(tolerations=None), 0,
     "0/1 nodes are available: 1 node(s) had taint {nvidia.com/gpu: present}, that the pod didn't tolerate."),
    (make_pod(tolerations=SPOT_TOLERATIONS[:1]), 0,
     "0/1 nodes are available: 1 node(s) had taint {cloud.google.com/gke-spot: true}, that the pod didn't tolerate."),
    (make_pod(gpus=1), 2, "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."),
    (make_pod(gpus=0, init_gpus=3), 0, "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."),
    (make_pod(affinity=required({"key": "cloud.google.com/gke-spot", "operator": "NotIn", "values": ["true"]})), 0,
     "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity."),
])
def test_unfit_pods_get_the_schedulers_message(pod, in_use, message):
    assert unschedulable_message(pod, NODE, gpus_in_use=in_use) == message


@pytest.mark.parametrize("expr", [
    {"key": "cloud.google.com/gke-spot", "operator": "In", "values": ["true"]},
    {"key": "cloud.google.com/gke-accelerator", "operator": "Exists"},
    {"key": "example.com/missing", "operator": "DoesNotExist"},
])
def test_required_affinity_that_holds(expr):
    assert unschedulable_message(make_pod(affinity=required(expr)), NODE, 0) is None


def test_tolerations_rules():
    taint = {"key": "k", "value": "v", "effect": "NoSchedule"}
    assert tolerates({"operator": "Exists"}, taint)  # empty key + Exists tolerates everything
    assert tolerates({"key": "k", "operator": "Exists"}, taint)
    assert tolerates({"key": "k", "value": "v"}, taint)  # operator defaults to Equal
    assert not tolerates({"key": "k", "value": "w"}, taint)
    assert not tolerates({"key": "k", "operator": "Exists", "effect": "NoExecute"}, taint)
    prefer = NodeShape("n", taints=[{"key": "x", "value": "", "effect": "PreferNoSchedule"}])
    assert unschedulable_message(make_pod(gpus=0), prefer, 0) is None


def test_pod_gpus_sums_containers():
    assert pod_gpus(make_pod(gpus=2)) == 2
    assert pod_gpus(make_pod(gpus=1, init_gpus=4)) == 4


def test_expand_like_kubernetes():
    env = {"RUN_DIR": "gs://b/r", "N": "3"}
    assert expand("--run-dir=$(RUN_DIR) $(N)", env) == "--run-dir=gs://b/r 3"
    assert expand("$(UNDEFINED) stays", env) == "$(UNDEFINED) stays"
    assert expand("$$(RUN_DIR) escaped", env) == "$(RUN_DIR) escaped"
    assert expand("$HOME is the shell's", env) == "$HOME is the shell's"


def test_exit_codes_like_a_container_runtime():
    assert (exit_code(0), exit_code(75), exit_code(-9), exit_code(-15)) == (0, 75, 137, 143)


def test_read_log_options(tmp_path):
    path = tmp_path / "main.log"
    path.write_bytes(b"2026-12-01T06:00:00.000000001Z stdout F one\n"
                     b"2026-12-01T06:00:05.500000000Z stdout F two words\n"
                     b"2026-12-01T06:00:09.000000000Z stdout F three\n"
                     b"2026-12-01T06:00:10.000000000Z stdout F partial")  # no newline yet: held back
    lines, offset = read_log(path)
    assert [ln.text for ln in lines] == [b"one", b"two words", b"three"]
    assert lines[1].render(timestamps=True) == b"2026-12-01T06:00:05.500000000Z two words\n"
    assert lines[1].render(timestamps=False) == b"two words\n"
    assert [ln.text for ln in read_log(path, tail_lines=1)[0]] == [b"three"]
    assert read_log(path, tail_lines=0)[0] == []
    since = dt.datetime(2026, 12, 1, 6, 0, 5, tzinfo=dt.UTC)
    assert [ln.text for ln in read_log(path, since=since)[0]] == [b"two words", b"three"]
    with open(path, "ab") as fh:
        fh.write(b" line\n")
    more, _ = read_log(path, offset=offset)
    assert more == [LogLine("2026-12-01T06:00:10.000000000Z", "stdout", b"partial line")]


def test_parse_rfc3339_keeps_microseconds():
    assert parse_rfc3339("2026-12-01T06:00:05.123456789Z") == dt.datetime(2026, 12, 1, 6, 0, 5, 123456, tzinfo=dt.UTC)
    assert parse_rfc3339("2026-12-01T06:00:05Z").microsecond == 0
