"""Does a pod fit the local node? The kube-scheduler filters the node agent stands in for.

Pure functions over ``kubernetes`` client models (``V1Pod``) and a :class:`NodeShape`, checked in
kube-scheduler's default filter order (TaintToleration, NodeAffinity, NodeResourcesFit for
``nvidia.com/gpu``). A misfit returns kube-scheduler v1.20.2's message (the version the live cluster runs,
measured against it by ``tests/k8s/test_k8s_cluster_smoke.py``), e.g.
``0/1 nodes are available: 1 node(s) didn't match Pod's node affinity.``, which the agent puts on
the pod's ``PodScheduled=False, reason=Unschedulable`` condition (what KubernetesPodOperator reports).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

GPU_RESOURCE = "nvidia.com/gpu"
SCHEDULING_EFFECTS = ("NoSchedule", "NoExecute")
"""Taint effects that keep a pod off a node (``PreferNoSchedule`` only lowers its score)."""


@dataclass(frozen=True)
class NodeShape:
    """What the scheduler looks at on the one node: name, labels, taints (dicts with ``key``, ``value``,
    ``effect``) and the ``nvidia.com/gpu`` count it offers."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[dict[str, str]] = field(default_factory=list)
    gpus: int = 8


def _get(obj: Any, name: str) -> Any:
    """Attribute of a client model or key of a plain dict (both shapes reach us)."""
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def tolerates(toleration: Any, taint: dict[str, str]) -> bool:
    """Kubernetes' toleration rule: matching effect (empty = all), key (empty + Exists = all) and, for
    operator ``Equal`` (the default), the same value."""
    effect = _get(toleration, "effect")
    if effect and effect != taint.get("effect"):
        return False
    operator = _get(toleration, "operator") or "Equal"
    key = _get(toleration, "key")
    if not key:
        return operator == "Exists"
    if key != taint.get("key"):
        return False
    return operator == "Exists" or (_get(toleration, "value") or "") == (taint.get("value") or "")


def untolerated_taint(pod: Any, node: NodeShape) -> dict[str, str] | None:
    """The first ``NoSchedule``/``NoExecute`` taint of ``node`` no toleration of ``pod`` covers, or None."""
    tolerations = _get(pod.spec, "tolerations") or []
    for taint in node.taints:
        if taint.get("effect") in SCHEDULING_EFFECTS and not any(tolerates(t, taint) for t in tolerations):
            return taint
    return None


def _requirement_matches(req: Any, labels: dict[str, str]) -> bool:
    key, operator, values = _get(req, "key"), _get(req, "operator"), _get(req, "values") or []
    if operator == "In":
        return labels.get(key) in values
    if operator == "NotIn":
        return labels.get(key) not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    if operator in ("Gt", "Lt") and key in labels:
        try:
            have, want = int(labels[key]), int(values[0])
        except (ValueError, IndexError):
            return False
        return have > want if operator == "Gt" else have < want
    return False


def _term_matches(term: Any, node: NodeShape) -> bool:
    fields = {"metadata.name": node.name}
    exprs = _get(term, "match_expressions") or []
    field_exprs = _get(term, "match_fields") or []
    if not exprs and not field_exprs:
        return False  # an empty term matches no node (Kubernetes API semantics)
    return (all(_requirement_matches(r, node.labels) for r in exprs)
            and all(_requirement_matches(r, fields) for r in field_exprs))


def matches_node_affinity(pod: Any, node: NodeShape) -> bool:
    """``spec.nodeSelector`` (every pair present) and the required node-affinity terms (any term whose
    every requirement holds). Preferred terms never exclude a node."""
    selector = _get(pod.spec, "node_selector") or {}
    if any(node.labels.get(k) != v for k, v in selector.items()):
        return False
    affinity = _get(_get(pod.spec, "affinity") or {}, "node_affinity")
    required = _get(affinity, "required_during_scheduling_ignored_during_execution") if affinity else None
    if not required:
        return True
    return any(_term_matches(t, node) for t in _get(required, "node_selector_terms") or [])


def pod_gpus(pod: Any) -> int:
    """``nvidia.com/gpu`` the pod asks for: the sum over its containers (an extended resource's request
    equals its limit), at least the largest init container's."""

    def one(container: Any) -> int:
        res = _get(container, "resources")
        for part in ("limits", "requests"):
            value = (_get(res, part) or {}).get(GPU_RESOURCE) if res else None
            if value is not None:
                return int(value)
        return 0

    main = sum(one(c) for c in _get(pod.spec, "containers") or [])
    init = max((one(c) for c in _get(pod.spec, "init_containers") or []), default=0)
    return max(main, init)


def unschedulable_message(pod: Any, node: NodeShape, gpus_in_use: int) -> str | None:
    """None when ``pod`` fits ``node`` with ``gpus_in_use`` GPUs already taken by bound, unfinished pods;
    else the scheduler's message for the first failing filter."""
    taint = untolerated_taint(pod, node)
    if taint is not None:
        reason = f"node(s) had taint {{{taint.get('key')}: {taint.get('value') or ''}}}, that the pod didn't tolerate"
    elif not matches_node_affinity(pod, node):
        reason = "node(s) didn't match Pod's node affinity"
    elif pod_gpus(pod) > node.gpus - gpus_in_use:
        return f"0/1 nodes are available: 1 Insufficient {GPU_RESOURCE}."
    else:
        return None
    return f"0/1 nodes are available: 1 {reason}."
