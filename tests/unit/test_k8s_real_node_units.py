"""The real node's generated configuration and the small images, without starting anything
(``scripts/k8s/real_node.py``, ``scripts/k8s/images.py``, ``LocalCluster``'s node choice)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scripts.k8s import cluster, images, real_node


def test_containerd_config_is_cri_on_runc_with_cgroupfs_and_the_local_sandbox_image(tmp_path: Path) -> None:
    text = real_node.containerd_config(tmp_path / "root", tmp_path / "state", "/run/x/containerd.sock", tmp_path / "cni")
    doc = tomllib.loads(text)
    cri = doc["plugins"]["io.containerd.grpc.v1.cri"]
    assert doc["version"] == 2 and doc["grpc"]["address"] == "/run/x/containerd.sock"
    assert cri["sandbox_image"] == images.PAUSE_IMAGE
    assert cri["restrict_oom_score_adj"] is True and cri["stream_server_address"] == "127.0.0.1"
    runc = cri["containerd"]["runtimes"]["runc"]
    assert runc["runtime_type"] == "io.containerd.runc.v2" and runc["options"]["SystemdCgroup"] is False
    assert cri["cni"]["conf_dir"] == str(tmp_path / "cni")


def test_the_pod_network_has_no_address_on_the_host_and_routes_nothing_out() -> None:
    bridge = real_node.cni_conflist("bk8s0")["plugins"][0]
    assert bridge["type"] == "bridge" and bridge["bridge"] == "bk8s0"
    assert (bridge["isGateway"], bridge["isDefaultGateway"], bridge["ipMasq"]) == (False, False, False)
    assert bridge["ipam"]["ranges"] == [[{"subnet": real_node.POD_SUBNET}]]


def test_the_kubelet_serves_on_loopback_and_authenticates_every_caller(tmp_path: Path) -> None:
    cfg = real_node.kubelet_config(port=1, healthz_port=2, ca_file=tmp_path / "ca", cert=tmp_path / "c",
                                   key=tmp_path / "k")
    assert (cfg["address"], cfg["healthzBindAddress"], cfg["readOnlyPort"]) == ("127.0.0.1", "127.0.0.1", 0)
    assert cfg["authentication"]["anonymous"]["enabled"] is False
    assert cfg["authentication"]["x509"]["clientCAFile"] == str(tmp_path / "ca")
    assert cfg["authorization"]["mode"] == "Webhook"
    assert cfg["cgroupDriver"] == "cgroupfs" and cfg["cgroupsPerQOS"] is False


@pytest.mark.parametrize(("value", "expected"), [("agent", "agent"), ("kubelet", "kubelet"), (" Kubelet ", "kubelet")])
def test_the_node_is_taken_as_given(monkeypatch: pytest.MonkeyPatch, value: str, expected: str) -> None:
    monkeypatch.setenv("BATCH_K8S_NODE", value)
    assert cluster.choose_node() == expected


def test_auto_takes_the_kubelet_only_when_nothing_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BATCH_K8S_NODE", raising=False)
    monkeypatch.setattr(real_node, "unavailable_reason", lambda built=True: "missing: kubelet")
    assert cluster.choose_node() == "agent"
    monkeypatch.setattr(real_node, "unavailable_reason", lambda built=True: None)
    assert cluster.choose_node() == "kubelet"
    with pytest.raises(ValueError, match="not auto, kubelet or agent"):
        cluster.choose_node("docker")


def _read(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


@settings(max_examples=25, deadline=None)
@given(files=st.dictionaries(st.from_regex(r"[a-z]{1,8}", fullmatch=True), st.binary(max_size=64), min_size=1,
                             max_size=5))
def test_an_oci_archive_is_byte_stable_and_its_blobs_match_their_digests(tmp_path_factory, files) -> None:
    out = tmp_path_factory.mktemp("oci")
    entries = [images.ImageFile(name, data, 0o644) for name, data in files.items()]
    digests = {images.write_oci_archive(out / f"{i}.tar", "example.invalid/x:1", list(reversed(entries)) if i else
                                        entries, entrypoint=["/x"]) for i in range(2)}
    assert len(digests) == 1 and (out / "0.tar").read_bytes() == (out / "1.tar").read_bytes()
    blobs = _read(out / "0.tar")
    for name, blob in blobs.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(blob).hexdigest() == name.rsplit("/", 1)[1]
    index = json.loads(blobs["index.json"])
    (manifest_desc,) = index["manifests"]
    assert manifest_desc["digest"] == digests.pop()
    manifest = json.loads(blobs[f"blobs/sha256/{manifest_desc['digest'].split(':')[1]}"])
    layer = blobs[f"blobs/sha256/{manifest['layers'][0]['digest'].split(':')[1]}"]
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        assert {m.name: tar.extractfile(m).read() for m in tar.getmembers()} == files


@pytest.mark.parametrize("depth", [1, 8, 40])
def test_the_kubelets_sockets_fit_whatever_the_work_dirs_length(tmp_path, depth) -> None:
    """The kubelet's root dir holds Unix sockets (108-byte paths): it never follows the work dir, whose
    path is the caller's (a CI clone's basetemp made the kubelet exit with 'bind: invalid argument')."""
    from types import SimpleNamespace

    work = tmp_path.joinpath(*["a-rather-long-folder-name"] * depth)
    work.mkdir(parents=True)
    started: list[list[str]] = []
    shape = SimpleNamespace(name="gpu-spot-node-0", labels={"pool": "spot"}, taints=[])
    node = real_node.RealNode(work, work / "logs", spawn=lambda argv, log: started.append(argv), shape=shape)
    access = SimpleNamespace(ca_file=work / "ca.crt", serving_cert=work / "k.crt", serving_key=work / "k.key",
                             node_kubeconfig=work / "node.kubeconfig")
    node._start_kubelet(access)
    try:
        [root] = [a.split("=", 1)[1] for a in started[0] if a.startswith("--root-dir=")]
        assert len(root) + real_node.KUBELET_SOCKET_TAIL <= real_node.SOCKET_PATH_MAX
        assert not root.startswith(str(work)) and Path(root).is_dir()
        assert len(node.address) <= real_node.SOCKET_PATH_MAX  # containerd's socket lives under /run
    finally:
        node.stop()
    assert not Path(root).exists()  # removed at stop


def test_short_dir_refuses_a_base_too_long_for_sockets(tmp_path) -> None:
    base = tmp_path.joinpath(*["x" * 40] * 3)
    base.mkdir(parents=True)
    with pytest.raises(RuntimeError, match="too long"):
        real_node.short_dir("bk8s-kubelet-", base=str(base))
    assert list(base.iterdir()) == []
