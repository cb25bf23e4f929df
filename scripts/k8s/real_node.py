"""A real node for :class:`~scripts.k8s.cluster.LocalCluster`: containerd + runc run the pods, the
kubelet (v1.20.2, built from the same Debian source tree as the API server) manages them, and
kube-scheduler and kube-controller-manager run beside the API server.

What one :class:`RealNode` starts, in order, and stops in reverse:

- **containerd** (Debian 1.6) with its CRI plugin, its own config, state and socket, cgroupfs, the
  ``runc`` runtime, the sandbox image :data:`~scripts.k8s.images.PAUSE_IMAGE` (compiled here) and a CNI
  ``bridge`` network whose bridge has no address: pod addresses live only in the pods' network
  namespaces, so a pod that is not ``hostNetwork`` reaches nothing outside itself and its peers. Pods
  that need the test's services on 127.0.0.1 (the worker pods) run with ``hostNetwork``.
- the **kubelet**, registered as ``system:node:<name>`` (x509 client certificate, Node authorizer),
  serving on 127.0.0.1 with the cluster CA's certificate, authenticating the API server's client
  certificate and authorizing through the API server (``Webhook``); the GPU spot pool's labels and
  taints (:func:`scripts.k8s.node_agent.spot_pool_shape`); ``cgroupsPerQOS`` off (no systemd here).
  ``nvidia.com/gpu`` is advertised as an extended resource by patching the node's status, the way
  Kubernetes documents for resources without a device plugin. Its root dir (pods' volumes, its Unix
  sockets) is a short folder ``/tmp/bk8s-kubelet-*`` (:func:`short_dir`), removed at stop.
- **kube-scheduler** and **kube-controller-manager** as the cluster admin, leader election off, no
  serving ports.

Images: the pause and busybox images (:mod:`.images`) are imported at start; a worker image is imported
by the caller (:meth:`RealNode.import_archive`).

What is not real: one node, pods of other namespaces than the test's are not isolated from the host's
network when ``hostNetwork`` is set, no GPU (``nvidia.com/gpu`` is a counted resource only), no
graceful node shutdown (it needs systemd's inhibitor locks): a spot reclaim is an eviction or a pod
deletion with its grace period.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from . import images

KUBE_VERSION = "v1.20.2"
NODE_BINARIES = ("kubelet", "kube-scheduler", "kube-controller-manager")
"""Built with kube-apiserver by ``scripts/k8s/build_k8s.sh`` and cached as ``<name>-v1.20.2``."""
HOST_TOOLS = ("containerd", "containerd-shim-runc-v2", "runc", "ctr", "tini", "buildah", "mmdebstrap")
"""From Debian's ``containerd``, ``runc``, ``tini`` (the node agent's pods run it from the host too) and
the worker image's builders, ``buildah`` and ``mmdebstrap``."""
CNI_PLUGINS = Path("/usr/lib/cni")
"""Debian's ``containernetworking-plugins`` install here."""
POD_SUBNET = "10.244.0.0/24"
"""Addresses of non-hostNetwork pods; they exist only inside the pods' network namespaces."""
READY_TIMEOUT_S = 120.0
"""How long start waits for the node to be Ready (seconds): containerd, the kubelet's first sync."""

Spawn = Callable[[list[str], str], subprocess.Popen[bytes]]


def cache_dir() -> Path:
    """``$BATCH_K8S_CACHE`` or ``~/.cache/airflow-batch-inference/k8s`` (the build script's rule)."""
    return Path(os.environ.get("BATCH_K8S_CACHE") or Path.home() / ".cache" / "airflow-batch-inference" / "k8s")


def binary(name: str) -> Path:
    """Path of a cached Kubernetes binary (``kubelet``, ``kube-scheduler``, ...; may not exist yet)."""
    return cache_dir() / f"{name}-{KUBE_VERSION}"


def pause_binary() -> Path:
    """The static ``pause`` the build script compiles from ``build/pause/linux/pause.c``."""
    return cache_dir() / f"pause-{KUBE_VERSION}"


NOT_ROOT = "the kubelet and containerd need root"


def unavailable_reason(built: bool = True) -> str | None:
    """Why a real node cannot run on this machine (a sentence), or None when it can: not root, a
    missing binary or host tool, no CNI plugins, or the memory cgroup controller not mounted.
    ``built=False`` leaves out what ``build_k8s.sh`` builds (the binaries and ``pause``): can it run here
    once they are built?"""
    if os.geteuid() != 0:
        return NOT_ROOT
    missing = [str(binary(n)) for n in NODE_BINARIES if built and not binary(n).exists()]
    missing += [str(pause_binary())] if built and not pause_binary().exists() else []
    missing += [t for t in HOST_TOOLS if not shutil.which(t)]
    if missing:
        return f"missing: {', '.join(missing)} (scripts/k8s/build_k8s.sh builds and installs them)"
    if not (CNI_PLUGINS / "bridge").exists():
        return f"no CNI bridge plugin in {CNI_PLUGINS} (Debian: containernetworking-plugins)"
    if not Path("/sys/fs/cgroup/memory").is_dir() and not Path("/sys/fs/cgroup/cgroup.controllers").exists():
        return "no memory cgroup controller mounted under /sys/fs/cgroup"
    return None


def containerd_config(root: Path, state: Path, address: str, cni_conf_dir: Path) -> str:
    """containerd's ``config.toml`` (version 2) for the node: CRI with runc on cgroupfs, overlayfs,
    the local sandbox image, CNI from Debian's plugins, the stream server on 127.0.0.1, OOM score
    adjustments no lower than containerd's own (``restrict_oom_score_adj``)."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{root}"
state = "{state}"
[grpc]
  address = "{address}"
[{cri}]
  sandbox_image = "{images.PAUSE_IMAGE}"
  # This machine's root cannot lower oom_score_adj below its own (runc: "failed to update
  # /proc/self/oom_score_adj: Permission denied" for the sandbox's -998): clamp to containerd's.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_tls_streaming = false
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
  [{cri}.cni]
    bin_dir = "{CNI_PLUGINS}"
    conf_dir = "{cni_conf_dir}"
"""


def cni_conflist(bridge: str) -> dict[str, Any]:
    """A ``bridge`` network with no gateway address on the host and no masquerade: pods get addresses
    in :data:`POD_SUBNET` inside their own namespaces, and nothing routes out of the bridge."""
    return {"cniVersion": "0.4.0", "name": "batch-pods", "plugins": [
        {"type": "bridge", "bridge": bridge, "isGateway": False, "isDefaultGateway": False, "ipMasq": False,
         "hairpinMode": False, "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_SUBNET}]]}},
        {"type": "loopback"}]}


def kubelet_config(*, port: int, healthz_port: int, ca_file: Path, cert: Path, key: Path) -> dict[str, Any]:
    """The ``KubeletConfiguration`` (v1beta1): loopback serving, x509 + webhook authentication, webhook
    authorization, cgroupfs without QoS cgroups, quick status updates, and eviction thresholds that a
    shared test machine's disk does not trip (the memory threshold stays, 100 MiB)."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "address": "127.0.0.1", "port": port, "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1", "healthzPort": healthz_port,
        "tlsCertFile": str(cert), "tlsPrivateKeyFile": str(key),
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(ca_file)}},
        "authorization": {"mode": "Webhook"},
        "cgroupDriver": "cgroupfs", "cgroupsPerQOS": False, "enforceNodeAllocatable": [],
        "failSwapOn": False, "syncFrequency": "2s", "fileCheckFrequency": "20s",
        "nodeStatusUpdateFrequency": "4s", "nodeStatusReportFrequency": "10s",
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                         "nodefs.inodesFree": "1%"},
        "serializeImagePulls": False, "resolvConf": "/etc/resolv.conf", "maxPods": 64,
    }


@dataclass(frozen=True)
class ControlPlaneAccess:
    """What the node's processes need from the cluster: the API server URL, the CA, the admin and node
    kubeconfigs, the kubelet's serving pair, the service-account signing key pair (the controller
    manager's token controller)."""

    server: str
    ca_file: Path
    admin_kubeconfig: Path
    node_kubeconfig: Path
    serving_cert: Path
    serving_key: Path
    sa_key: Path


SOCKET_PATH_MAX = 107
"""Longest path a Unix socket can be bound at (``sun_path`` is 108 bytes with its terminating NUL)."""

KUBELET_SOCKET_TAIL = len("/pod-resources/kubelet.sock.1234567890")
"""Room the kubelet's own socket names take below its root dir (``pod-resources/``, ``device-plugins/``,
``plugins_registry/`` and the random probe names it binds while it starts)."""


def short_dir(prefix: str, base: str = "/tmp") -> Path:
    """A new folder ``<base>/<prefix><random>`` for the kubelet's root dir, which holds Unix sockets.

    The cluster's work dir cannot hold them: its path is the caller's (a CI clone's pytest basetemp,
    ``.../build/k8s/pytest/test_cli_up_writes_env_file_an0/work/node/kubelet/...``, made the kubelet exit
    with ``listen unix ...: bind: invalid argument``), and Unix socket paths are limited to
    :data:`SOCKET_PATH_MAX` bytes. ``base`` is ``/tmp``, not ``$TMPDIR``, which may be long too.

    Raises:
        RuntimeError: even this folder leaves too little room for the kubelet's socket names.
    """
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    if len(str(path)) + KUBELET_SOCKET_TAIL > SOCKET_PATH_MAX:
        path.rmdir()
        raise RuntimeError(f"{path}: too long for the kubelet's Unix sockets ({SOCKET_PATH_MAX} bytes)")
    return path


class RealNode:
    """containerd, kubelet, kube-scheduler and kube-controller-manager for one cluster (see the module
    docstring).

    Args:
        work_dir: kubelet root, containerd config, CNI config (the caller owns it). containerd's image
            store is ``<cache>/containerd`` (held with a lock while a cluster runs), or ``work_dir`` when
            another cluster holds it.
        logs_dir: ``containerd.log``, ``kubelet.log``, ``kube-scheduler.log``, ``kube-controller-manager.log``.
        spawn: starts one process with its output appended to a log in ``logs_dir`` (the cluster's).
        shape: the node's name, labels, taints and GPU count (:class:`scripts.k8s.scheduling.NodeShape`).
    """

    def __init__(self, work_dir: Path, logs_dir: Path, spawn: Spawn, shape: Any) -> None:
        self.work_dir, self.logs_dir, self.spawn, self.shape = work_dir, logs_dir, spawn, shape
        # Unix sockets are limited to 108 bytes: containerd's state and socket live under /run (set with
        # the image store in _start_containerd).
        self.run_dir = Path("/run") / f"batch-k8s-{secrets.token_hex(4)}"
        self.address = str(self.run_dir / "containerd.sock")
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.kubelet_port = 0
        self.bridge = f"bk8s{secrets.token_hex(3)}"
        self._root_lock: Any = None
        self.kubelet_root: Path | None = None  # short_dir(): made when the kubelet starts

    @property
    def alive(self) -> bool:
        """True while containerd, the kubelet, kube-scheduler and kube-controller-manager all run."""
        return len(self.procs) == 4 and all(p.poll() is None for p in self.procs.values())

    @property
    def name(self) -> str:
        """The node's name."""
        return self.shape.name

    # ---- lifecycle --------------------------------------------------------------------------------
    def start(self, access: ControlPlaneAccess) -> None:
        """Start containerd, import the small images, start the control-plane helpers and the kubelet,
        advertise the GPUs and wait for the node to be Ready.

        Raises:
            RuntimeError: a process died or the node was not Ready in :data:`READY_TIMEOUT_S` (log tails
                included). The caller stops what was started.
        """
        self._start_containerd()
        self._import_small_images()
        self._start_control_plane_helpers(access)
        self._start_kubelet(access)
        self._wait_ready(access)

    def stop(self) -> None:
        """Stop the kubelet and the control-plane helpers, remove every pod sandbox containerd still
        runs (their processes and network namespaces), stop containerd, delete the bridge. Safe twice."""
        for name in ("kubelet", "kube-scheduler", "kube-controller-manager"):
            _stop(self.procs.pop(name, None))
        if "containerd" in self.procs:
            self._remove_all_pods()
        _stop(self.procs.pop("containerd", None))
        subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True)
        self._unmount_under(self.work_dir)
        if self.kubelet_root is not None:
            self._unmount_under(self.kubelet_root, include_self=True)
            if not self._mounts_under(self.kubelet_root, include_self=True):  # never delete through a mount
                shutil.rmtree(self.kubelet_root, ignore_errors=True)
                self.kubelet_root = None
        shutil.rmtree(self.run_dir, ignore_errors=True)
        if self._root_lock is not None:
            self._root_lock.close()
            self._root_lock = None

    # ---- containerd -------------------------------------------------------------------------------
    def _containerd_root(self) -> Path:
        """The image store: the cache's (images imported once stay for the next cluster) when no other
        cluster holds it, else a private one under the work dir. With the cache's, the state directory is
        fixed for that cache (``/run/batch-k8s-<hash of its path>``), so the containers of a cluster that was killed before it could
        stop (their shims keep running) are found and removed by the next one."""
        import fcntl

        cache = cache_dir()
        cache.mkdir(parents=True, exist_ok=True)
        self._root_lock = open(cache / "containerd.lock", "w")  # noqa: SIM115 - held until stop
        try:
            fcntl.flock(self._root_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._root_lock.close()
            self._root_lock = None
            return self.work_dir / "containerd"
        self.run_dir = Path("/run") / f"batch-k8s-{hashlib.sha256(str(cache).encode()).hexdigest()[:8]}"
        self.address = str(self.run_dir / "containerd.sock")
        return cache / "containerd"

    def _start_containerd(self) -> None:
        root = self._containerd_root()
        state = self.run_dir / "state"
        cni = self.work_dir / "cni"
        for d in (root, state, cni):
            d.mkdir(parents=True, exist_ok=True)
        (cni / "10-batch-pods.conflist").write_text(json.dumps(cni_conflist(self.bridge), indent=1))
        config = self.work_dir / "containerd.toml"
        config.write_text(containerd_config(root, state, self.address, cni))
        self.procs["containerd"] = self.spawn(["containerd", "--config", str(config)], "containerd.log")
        self._wait(lambda: Path(self.address).exists() and self.ctr("version").returncode == 0,
                   "containerd", 30.0)
        self._remove_all_pods()  # a shared image store may hold the containers of a killed earlier run

    def ctr(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run ``ctr -a <socket> -n k8s.io ARGS`` against this node's containerd."""
        return subprocess.run(["ctr", "-a", self.address, "-n", "k8s.io", *args], capture_output=True, text=True)

    def _import_small_images(self) -> None:
        out = self.work_dir / "images"
        out.mkdir(exist_ok=True)
        images.pause_archive(pause_binary(), out / "pause.tar")
        images.busybox_archive(Path(shutil.which("busybox") or "/bin/busybox"), out / "busybox.tar")
        for archive in ("pause.tar", "busybox.tar"):
            self.import_archive(out / archive)

    def import_archive(self, archive: Path) -> None:
        """Import an OCI or docker archive into this node's containerd (namespace ``k8s.io``).

        Raises:
            RuntimeError: ``ctr images import`` failed.
        """
        images.ctr_import(archive, self.address)

    def name_by_digest(self, name: str, pinned: str) -> str:
        """Give the imported image ``name`` its digest reference ``pinned`` (``repo@sha256:...``) as an
        image record, and return ``pinned``. The CRI plugin resolves a pod's image by the records' names;
        ``ctr images import`` records only the tag, where a registry pull would record both.

        Raises:
            RuntimeError: ``ctr images tag`` failed.
        """
        if pinned not in self.ctr("images", "list", "-q").stdout.split():
            out = self.ctr("images", "tag", name, pinned)
            if out.returncode != 0:
                raise RuntimeError(f"ctr images tag {name} {pinned} failed: {out.stdout}{out.stderr}")
        return pinned

    def task_pid(self, container_id: str) -> int:
        """Host PID of the running task (the container's PID 1) of ``container_id``.

        Raises:
            LookupError: no running task with that id.
        """
        for line in self.ctr("tasks", "list").stdout.splitlines()[1:]:
            fields = line.split()
            if len(fields) >= 3 and fields[0] == container_id and fields[2] == "RUNNING":
                return int(fields[1])
        raise LookupError(f"no running task {container_id}")

    def shutdown_pod(self, pod: Any, grace_seconds: int) -> None:
        """What the node's OS shutting down does to one pod's containers: SIGTERM to each container's
        PID 1 through the runtime, SIGKILL to those still running after ``grace_seconds`` (from a
        background thread; this returns at once)."""
        import threading

        ids = [c.container_id.rsplit("/", 1)[1] for c in pod.status.container_statuses or [] if c.container_id]
        for cid in ids:
            self.ctr("tasks", "kill", "--signal", "SIGTERM", cid)

        def kill_later() -> None:
            time.sleep(grace_seconds)
            for cid in ids:
                self.ctr("tasks", "kill", "--signal", "SIGKILL", cid)

        threading.Thread(target=kill_later, daemon=True, name=f"shutdown-{pod.metadata.name}").start()

    def _remove_all_pods(self) -> None:
        # What kubelet started and never stopped (it was stopped first): kill the tasks, so no container
        # process outlives the cluster.
        for cid in self.ctr("containers", "list", "-q").stdout.split():
            self.ctr("tasks", "kill", "-s", "SIGKILL", cid)
            for _ in range(50):
                if self.ctr("tasks", "delete", cid).returncode == 0 or "not found" in self.ctr(
                        "tasks", "list").stdout or cid not in self.ctr("tasks", "list").stdout:
                    break
                time.sleep(0.1)
            self.ctr("containers", "delete", cid)

    @staticmethod
    def _unmount_under(path: Path, include_self: bool = False) -> None:
        """Unmount what the kubelet mounted under ``path`` (its root dir's bind mount, pod volumes), the
        deepest first, until none is left (a mount stacked on another shows up once the top one is gone)."""
        for _ in range(5):
            under = sorted(RealNode._mounts_under(path, include_self), key=len, reverse=True)
            if not under:
                return
            for mount in under:
                subprocess.run(["umount", "-l", mount], capture_output=True)

    @staticmethod
    def _mounts_under(path: Path, include_self: bool = False) -> list[str]:
        """Mount points below ``path`` (``/proc/self/mounts``), and ``path`` itself with ``include_self``
        (the kubelet's own root dir, which it bind-mounts onto itself; never a caller's work dir)."""
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
        return [m for m in mounts if (include_self and m == str(path)) or m.startswith(str(path) + "/")]

    # ---- control plane helpers and kubelet --------------------------------------------------------
    def _start_control_plane_helpers(self, access: ControlPlaneAccess) -> None:
        from .cluster import free_port  # cluster imports this module
        kubeconfig = f"--kubeconfig={access.admin_kubeconfig}"
        self.procs["kube-scheduler"] = self.spawn([
            str(binary("kube-scheduler")), kubeconfig, "--leader-elect=false", "--port=0",
            "--bind-address=127.0.0.1", f"--secure-port={free_port()}", "--v=1"], "kube-scheduler.log")
        self.procs["kube-controller-manager"] = self.spawn([
            str(binary("kube-controller-manager")), kubeconfig, "--leader-elect=false", "--port=0",
            "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
            f"--service-account-private-key-file={access.sa_key}", f"--root-ca-file={access.ca_file}",
            "--use-service-account-credentials=false", "--controllers=*,-nodeipam,-cloud-node-lifecycle",
            "--v=1"], "kube-controller-manager.log")

    def _start_kubelet(self, access: ControlPlaneAccess) -> None:
        from .cluster import free_port  # cluster imports this module
        root = self.kubelet_root = short_dir("bk8s-kubelet-")
        self.kubelet_port = free_port()
        config = self.work_dir / "kubelet-config.yaml"
        config.write_text(yaml.safe_dump(kubelet_config(
            port=self.kubelet_port, healthz_port=free_port(), ca_file=access.ca_file,
            cert=access.serving_cert, key=access.serving_key), sort_keys=False))
        labels = ",".join(f"{k}={v}" for k, v in self.shape.labels.items() if not k.startswith("kubernetes.io/"))
        taints = ",".join(f"{t['key']}={t['value']}:{t['effect']}" for t in self.shape.taints)
        self.procs["kubelet"] = self.spawn([
            str(binary("kubelet")), f"--config={config}", f"--kubeconfig={access.node_kubeconfig}",
            "--container-runtime=remote", f"--container-runtime-endpoint=unix://{self.address}",
            "--image-service-endpoint=" + f"unix://{self.address}", f"--root-dir={root}",
            f"--hostname-override={self.name}", "--node-ip=127.0.0.1", f"--node-labels={labels}",
            f"--register-with-taints={taints}", f"--cert-dir={root / 'pki'}", "--v=1"], "kubelet.log")

    def _wait_ready(self, access: ControlPlaneAccess) -> None:
        from kubernetes import client, config

        api = client.CoreV1Api(config.new_client_from_config(str(access.admin_kubeconfig)))

        def ready() -> bool:
            try:
                node = api.read_node(self.name)
            except client.ApiException:
                return False
            return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])

        def registered() -> bool:
            try:
                return api.read_node(self.name) is not None
            except client.ApiException:
                return False

        self._wait(registered, "kubelet", READY_TIMEOUT_S)
        # The kubelet refuses a loopback --node-ip ("nodeIP can't be loopback address") and leaves the
        # addresses alone after that; the API server reaches it (logs, exec) at the address given here,
        # where it listens. The GPUs: an extended resource advertised through the status.
        gpus = str(self.shape.gpus)
        api.patch_node_status(self.name, [
            {"op": "add", "path": "/status/addresses", "value": [
                {"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": self.name}]},
            {"op": "add", "path": "/status/capacity/nvidia.com~1gpu", "value": gpus}])
        self._wait(ready, "kubelet", READY_TIMEOUT_S)
        self._wait(lambda: (api.read_node(self.name).status.allocatable or {}).get("nvidia.com/gpu") == gpus,
                   "kubelet (nvidia.com/gpu allocatable)", 30.0)

    def _wait(self, done: Callable[[], bool], what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited ({proc.returncode}): {self.tail(name + '.log')}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} not ready in {timeout:.0f} s: {self.tail(what.split()[0] + '.log')}")
            time.sleep(0.25)

    def tail(self, log_name: str, chars: int = 3000) -> str:
        """The last ``chars`` characters of one of this node's logs ("(no log)" when absent)."""
        path = self.logs_dir / log_name
        return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"


def _stop(proc: subprocess.Popen[bytes] | None, timeout: float = 10.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
