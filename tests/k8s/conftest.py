"""Fixtures of the live-cluster tests: ``k8s_cluster`` (session; see ``tests/k8s_fixture.py``)."""

from k8s_fixture import k8s_cluster

__all__ = ["k8s_cluster"]
