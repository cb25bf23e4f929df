"""The live local Kubernetes cluster for tests: :class:`scripts.k8s.cluster.LocalCluster`, once per session.

Use from any test module (``tests`` and the repository root are on pytest's ``pythonpath``)::

    import k8s_fixture

    k8s_cluster = k8s_fixture.k8s_cluster      # pytest fixture (``tests/k8s/conftest.py`` re-exports it)

    def test_x(k8s_cluster):                   # a started LocalCluster
        api = k8s_cluster.api("airflow-worker")
        kubeconfig = k8s_cluster.kubeconfig("airflow-triggerer")

The fixture builds kube-apiserver when it is not cached (``scripts/k8s/build_k8s.sh``: about 5
minutes of wall clock on 2 cores, once per machine), and skips with the reason only when apt cannot
provide the toolchain (:class:`~scripts.k8s.cluster.ToolchainUnavailable`); a build that runs and fails is
an error, not a skip. Its work dir (certificates, kubeconfigs, ``logs/``, pod dirs) stays under pytest's
base temp for post-mortems.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from scripts.k8s.cluster import (
    NAMESPACE,
    POD_CPU,
    POD_MEMORY,
    LocalCluster,
    ToolchainUnavailable,
    ensure_built,
)

__all__ = ["NAMESPACE", "k8s_cluster", "shard_pod_manifest"]


@pytest.fixture(scope="session")
def k8s_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A started :class:`LocalCluster` for the whole session (stopped at the end)."""
    work = tmp_path_factory.mktemp("k8s-cluster")
    try:
        ensure_built(log=work / "build.log")
    except ToolchainUnavailable as exc:
        pytest.skip(f"live Kubernetes cluster unavailable: {exc}")
    with LocalCluster(work) as cluster:
        from k8s_live import record

        record(node=cluster.node_kind, image=cluster.worker_image,
               image_digest=cluster.worker_image.rsplit("@", 1)[1] if cluster.real_node is not None else None,
               cluster_start_s=round(cluster.started_in_s, 1))
        yield cluster


def shard_pod_manifest(cluster: LocalCluster, ref: dict, run_id: str, name: str,
                       env: dict[str, str] | None = None) -> dict:
    """The pod the ``kubernetes`` runner submits for one shard (``shard_pod.build_pod`` with
    ``K8sSettings`` defaults and ``cluster``'s image and pod network, serialized by the provider), renamed
    ``name``, with ``env`` added to the worker container (e.g. ``STORAGE_EMULATOR_HOST``)."""
    from airflow.providers.cncf.kubernetes.pod_generator import PodGenerator
    from batch_inference.pod_spec import K8sSettings
    from batch_inference.shard_pod import build_pod

    # requests that fit the 2-CPU test node (the defaults ask for a GPU machine's 4 CPUs and 16 GiB)
    settings = K8sSettings(image=cluster.worker_image, host_network=cluster.real_node is not None,
                           cpu=POD_CPU, memory=POD_MEMORY)
    manifest = PodGenerator.serialize_pod(build_pod(ref, run_id, settings))
    manifest["metadata"]["name"] = name
    container = manifest["spec"]["containers"][0]
    container["env"] = [*container.get("env", []), *({"name": k, "value": v} for k, v in (env or {}).items())]
    return manifest
