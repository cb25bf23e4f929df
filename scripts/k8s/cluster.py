"""``LocalCluster``: etcd + kube-apiserver v1.20.2 on loopback with RBAC, plus one node that runs pods.

Start to ready is about 10 s for the API server (its post-start hooks), 20-30 s with the kubelet node.
What one cluster holds:

- a throwaway CA and serving and client certificates (:mod:`.certs`) in a work dir;
- etcd (Debian ``etcd-server``) and kube-apiserver (``scripts/k8s/build_k8s.sh``, cached) on free
  127.0.0.1 ports, ``--authorization-mode=Node,RBAC``, static-token authentication for an ``admin``
  (``system:masters``) and for every service account that ``deploy/k8s/serviceaccounts.yaml`` defines or
  ``deploy/k8s/rbac.yaml`` binds (user ``system:serviceaccount:<ns>:<name>``, groups
  ``system:serviceaccounts`` and ``system:serviceaccounts:<ns>``), so a client using a service account's
  kubeconfig gets exactly what the documented RBAC grants; x509 client certificates for the kubelet and
  for the API server towards it;
- ``deploy/k8s/namespace.yaml``, ``serviceaccounts.yaml``, ``rbac.yaml`` and ``quota.yaml`` applied by the
  admin;
- one kubeconfig per identity (:meth:`LocalCluster.kubeconfig`);
- the node (:func:`choose_node`): the **kubelet** node (:mod:`.real_node`: containerd + runc, kubelet,
  kube-scheduler, kube-controller-manager; pods run the worker image built by :mod:`.worker_image`), or
  where a kubelet cannot run, the **node agent** (:mod:`.node_agent`): one Ready GPU spot node that binds
  pods itself and runs them as host processes, ``batch-worker`` being the project's ``.venv/bin/batch-worker``.

Use it as a context manager (tests) or from the CLI (``make run-k8s``)::

    python -m scripts.k8s.cluster up --env-file build/k8s-local/env    # foreground; SIGTERM/Ctrl-C stops it

Stop order is the node, API server, etcd (etcd first makes the API server hang for seconds).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from . import real_node
from .real_node import ControlPlaneAccess, RealNode

REPO_ROOT = Path(__file__).resolve().parents[2]
APISERVER_VERSION = "v1.20.2"
BUILD_SCRIPT = REPO_ROOT / "scripts" / "k8s" / "build_k8s.sh"
DEPLOY_DIR = REPO_ROOT / "deploy" / "k8s"
MANIFESTS = ("namespace.yaml", "serviceaccounts.yaml", "rbac.yaml", "quota.yaml")
"""Applied in this order by the admin at start (the order ``docs/kubernetes.md`` documents)."""
NAMESPACE = "batch-inference"
"""The worker pods' namespace (``K8sSettings.namespace`` default, ``deploy/k8s/namespace.yaml``)."""
READY_TIMEOUT_S = 90.0
"""How long start waits for ``/readyz`` and the node agent (seconds); cold disks need ~10 s."""
STOP_TIMEOUT_S = 10.0
"""SIGTERM to SIGKILL for each cluster process at stop (seconds)."""
ADMIN = "admin"
POD_CPU = "250m"
"""CPU request of a worker pod on the test node: its 2 cores hold 8 such pods (the production default, 4
cores, fits no pod here; kube-scheduler counts requests, not use)."""
POD_MEMORY = "2Gi"
"""Memory request and limit of a worker pod on the test node (the worker with MiniLM uses about 0.7 GiB)."""
PLACEHOLDER_IMAGE = "local.invalid/batch-worker@sha256:" + "0" * 64
"""The pod image on the agent node: a valid digest reference; the agent runs the venv's ``batch-worker``."""


def choose_node(requested: str | None = None) -> str:
    """Which node runs the pods: ``"kubelet"`` (:mod:`.real_node`: containerd, runc, the kubelet) or
    ``"agent"`` (:mod:`.node_agent`: pods as host processes, for machines where a kubelet cannot run).

    ``requested`` (else ``$BATCH_K8S_NODE``, else ``auto``): ``kubelet`` and ``agent`` are taken as
    given; ``auto`` is ``kubelet`` when :func:`.real_node.unavailable_reason` finds nothing missing.

    Raises:
        ValueError: any other value.
    """
    value = (requested or os.environ.get("BATCH_K8S_NODE") or "auto").strip().lower()
    if value not in ("auto", "kubelet", "agent"):
        raise ValueError(f"BATCH_K8S_NODE: {value!r} is not auto, kubelet or agent")
    if value == "auto":
        return "kubelet" if real_node.unavailable_reason() is None else "agent"
    return value


class ToolchainUnavailable(RuntimeError):
    """kube-apiserver is not built and apt cannot provide what building it needs (no root/sudo or no
    Debian archive): the reason, for a test skip."""


def cache_dir() -> Path:
    """Where the built binary lives: ``$BATCH_K8S_CACHE`` or ``~/.cache/airflow-batch-inference/k8s``
    (the same rule as ``build_k8s.sh``)."""
    return Path(os.environ.get("BATCH_K8S_CACHE") or Path.home() / ".cache" / "airflow-batch-inference" / "k8s")


def apiserver_binary() -> Path:
    """Path of the cached ``kube-apiserver-v1.20.2`` (may not exist yet)."""
    return cache_dir() / f"kube-apiserver-{APISERVER_VERSION}"


def ensure_built(log: Path | None = None) -> Path:
    """The kube-apiserver binary, building it and the node's binaries first when any is missing
    (``build_k8s.sh``: about 15 minutes wall clock on 2 cores the first time, nothing afterwards); also
    installs etcd, containerd, runc, the CNI plugins and busybox when missing.

    Raises:
        ToolchainUnavailable: no binary and no way to run apt (neither root nor sudo, or no apt-get).
        RuntimeError: the build ran and failed (its output tail in the message).
    """
    binary = apiserver_binary()
    if binary.exists() and shutil.which("etcd") and real_node.unavailable_reason() in (None, real_node.NOT_ROOT):
        return binary
    if not shutil.which("apt-get"):
        raise ToolchainUnavailable("kube-apiserver is not built and apt-get is not available to build it")
    if os.geteuid() != 0 and not shutil.which("sudo"):
        raise ToolchainUnavailable("kube-apiserver is not built and building it needs root or sudo for apt")
    out = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True)
    if log is not None:
        log.write_text(out.stdout + out.stderr)
    if out.returncode != 0 or not binary.exists():
        raise RuntimeError(f"{BUILD_SCRIPT.name} failed (rc {out.returncode}): {(out.stdout + out.stderr)[-3000:]}")
    return binary


def build_all() -> None:
    """What ``cluster build`` does: the Debian packages first, then the Kubernetes binaries
    (``build_k8s.sh``, CPU-bound compile) and, when the kubelet node can run here, the worker image
    (``worker_image.build``: mostly downloads and disk) side by side, so a cold machine waits for the
    longer of the two, not their sum.

    Raises:
        RuntimeError: a build failed (its output tail in the message).
        scripts.k8s.worker_image.ImageBuildError: the image build failed.
    """
    if os.geteuid() == 0 or shutil.which("sudo"):
        subprocess.run(["bash", str(BUILD_SCRIPT), "--packages-only"], check=True)
    forced = (os.environ.get("BATCH_K8S_NODE") or "auto").strip().lower()
    if forced == "agent" or (forced == "auto" and real_node.unavailable_reason(built=False) is not None):
        print(ensure_built())
        return
    from .worker_image import build

    binaries = subprocess.Popen(["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
    try:
        print(build())
    finally:
        out, _ = binaries.communicate()
    if binaries.returncode != 0:
        raise RuntimeError(f"{BUILD_SCRIPT.name} failed (rc {binaries.returncode}): {out[-3000:]}")
    print(ensure_built())


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class Identity:
    """One static-token user of the API server.

    Attributes:
        name: short key (``admin``, or the service account's name, e.g. ``airflow-triggerer``).
        user: authenticated user name (``system:serviceaccount:<ns>:<name>`` for a service account).
        groups: its groups.
        token: bearer token (random per cluster).
    """

    name: str
    user: str
    groups: tuple[str, ...]
    token: str


def service_account_identities(deploy_dir: Path = DEPLOY_DIR) -> list[Identity]:
    """Identities of the service accounts in ``serviceaccounts.yaml`` and the ServiceAccount subjects
    of ``rbac.yaml``'s RoleBindings, in file order (names must be unique across namespaces)."""
    found: dict[str, tuple[str, str]] = {}
    for doc in yaml.safe_load_all((deploy_dir / "serviceaccounts.yaml").read_text()):
        if doc and doc.get("kind") == "ServiceAccount":
            found[doc["metadata"]["name"]] = (doc["metadata"]["namespace"], doc["metadata"]["name"])
    for doc in yaml.safe_load_all((deploy_dir / "rbac.yaml").read_text()):
        for subject in (doc or {}).get("subjects") or []:
            if subject.get("kind") == "ServiceAccount":
                found[subject["name"]] = (subject["namespace"], subject["name"])
    return [Identity(name, f"system:serviceaccount:{ns}:{name}",
                     ("system:serviceaccounts", f"system:serviceaccounts:{ns}"), secrets.token_hex(16))
            for name, (ns, _) in found.items()]


def _die_with_parent() -> None:
    """In a child before exec: SIGTERM it when the process that started the cluster dies (no orphan
    servers after a killed test run)."""
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _stop_process(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class NodeAgentHandle:
    """The node agent child process: ``proc``, ``node_name``, ``log_path``, ``work_dir`` (per-pod dirs
    under ``work_dir/pods/<ns>_<pod>_<uid>/``, each with ``<container>.log``), ``port`` (kubelet port)."""

    def __init__(self, node_name: str, work_dir: Path, log_path: Path) -> None:
        self.node_name, self.work_dir, self.log_path = node_name, work_dir, log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    def pod_dirs(self, namespace: str, pod: str) -> list[Path]:
        """Working dirs of every run of ``namespace/pod`` on this node (oldest first)."""
        return sorted((self.work_dir / "pods").glob(f"{namespace}_{pod}_*"), key=lambda p: p.stat().st_mtime)

    @property
    def alive(self) -> bool:
        """True while the agent process runs."""
        return self.proc is not None and self.proc.poll() is None


class LocalCluster:
    """A live single-node cluster on loopback (see the module docstring). Context manager.

    Its processes get SIGTERM when the thread that started them ends (``PR_SET_PDEATHSIG``), so a
    killed test run leaves no servers behind: start it from a thread that outlives its use (the main
    thread, as the pytest fixture and the CLI do).

    Args:
        work_dir: certificates, kubeconfigs, logs, pod dirs; a fresh temp dir (removed at stop) when
            None, else kept (the caller owns it).
        gpus: ``nvidia.com/gpu`` the node offers (pods beyond it stay Pending: Insufficient).
        node_name: the node's name.
        deploy_dir: where the applied manifests come from.
        image_env: extra environment for every pod process (the "image ENV"), e.g. ``{"OMP_NUM_THREADS": "1"}``.

    Attributes (after start):
        server: ``https://127.0.0.1:<port>``; ca_file: the CA certificate; logs_dir: ``etcd.log``,
        ``kube-apiserver.log``, ``node-agent.log``; node_agent: :class:`NodeAgentHandle`;
        identities: ``{name: Identity}``; started_in_s: start-to-ready seconds.
    """

    def __init__(self, work_dir: Path | None = None, *, gpus: int = 8, node_name: str = "gpu-spot-node-0",
                 deploy_dir: Path = DEPLOY_DIR, image_env: dict[str, str] | None = None,
                 node: str | None = None, worker_image: bool = True) -> None:
        self._own_dir = work_dir is None
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix="batch-k8s-"))
        self.logs_dir = self.work_dir / "logs"
        self.gpus, self.deploy_dir, self.image_env = gpus, deploy_dir, dict(image_env or {})
        self.node_agent = NodeAgentHandle(node_name, self.work_dir / "node", self.logs_dir / "node-agent.log")
        self.node_kind = choose_node(node)
        self.real_node: RealNode | None = None
        self.with_worker_image = worker_image
        self.worker_image = PLACEHOLDER_IMAGE
        self.identities: dict[str, Identity] = {}
        self.server = ""
        self.ca_file = self.work_dir / "pki" / "ca.crt"
        self.started_in_s = 0.0
        self._etcd: subprocess.Popen[bytes] | None = None
        self._apiserver: subprocess.Popen[bytes] | None = None
        self._etcd_dir: Path | None = None

    # ---- lifecycle --------------------------------------------------------------------------------
    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> LocalCluster:
        """Start everything and wait until the API server is ready and the node registered.

        Raises:
            RuntimeError: a process died or did not get ready in :data:`READY_TIMEOUT_S` (log tail
                included); everything started so far is stopped first.
        """
        t0 = time.monotonic()
        try:
            binary = apiserver_binary()
            if not binary.exists():
                raise RuntimeError(f"{binary} missing: run scripts/k8s/build_k8s.sh (or ensure_built())")
            for d in (self.logs_dir, self.node_agent.work_dir):
                d.mkdir(parents=True, exist_ok=True)
            self._write_pki_and_tokens()
            self._start_etcd()
            self._start_apiserver(binary)
            self._wait_ready()
            self._write_kubeconfigs()
            self._apply_manifests()
            if self.node_kind == "kubelet":
                self._start_real_node()
            else:
                self._start_node_agent()
        except BaseException:
            self.stop()
            raise
        self.started_in_s = time.monotonic() - t0
        return self

    def stop(self) -> None:
        """Stop the node agent (it kills its pod processes), then the API server, then etcd; remove
        the etcd data and, when this cluster created it, the work dir. Safe to call twice."""
        _stop_process(self.node_agent.proc)
        if self.real_node is not None:
            self.real_node.stop()
        _stop_process(self._apiserver)
        _stop_process(self._etcd)
        if self._etcd_dir is not None:
            shutil.rmtree(self._etcd_dir, ignore_errors=True)
        if self._own_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    # ---- start steps ------------------------------------------------------------------------------
    def _write_pki_and_tokens(self) -> None:
        from .certs import CertificateAuthority, service_account_keys

        pki = self.work_dir / "pki"
        ca = CertificateAuthority(pki)
        self._serving = ca.issue_server("kube-apiserver", ["localhost", "kubernetes", "kubernetes.default",
                                                          "kubernetes.default.svc"], ["127.0.0.1"])
        self._kubelet = ca.issue_server("kubelet", ["localhost", self.node_agent.node_name], ["127.0.0.1"])
        # The API server's identity towards kubelets (logs, exec) and the kubelet's towards the API server
        # (the Node authorizer's system:node:<name> in system:nodes).
        self._apiserver_client = ca.issue_client("apiserver-kubelet-client", "kube-apiserver-kubelet-client",
                                                 ["system:masters"])
        self._node_client = ca.issue_client("node-client", f"system:node:{self.node_agent.node_name}",
                                            ["system:nodes"])
        self._sa = service_account_keys(pki)
        admin = Identity(ADMIN, ADMIN, ("system:masters",), secrets.token_hex(16))
        self.identities = {i.name: i for i in [admin, *service_account_identities(self.deploy_dir)]}
        lines = [f'{i.token},{i.user},{i.user},"{",".join(i.groups)}"' for i in self.identities.values()]
        self._tokens = pki / "tokens.csv"
        self._tokens.write_text("\n".join(lines) + "\n")
        self._tokens.chmod(0o600)

    def _spawn(self, argv: list[str], log_name: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        with open(self.logs_dir / log_name, "ab") as out:
            return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    preexec_fn=_die_with_parent, env=env)

    def _start_etcd(self) -> None:
        shm = Path("/dev/shm")
        self._etcd_dir = Path(tempfile.mkdtemp(prefix="batch-k8s-etcd-", dir=shm if shm.is_dir() else None))
        client_port, peer_port = free_port(), free_port()
        self._etcd_url = f"http://127.0.0.1:{client_port}"
        peer = f"http://127.0.0.1:{peer_port}"
        self._etcd = self._spawn([
            shutil.which("etcd") or "etcd", "--name", "default", "--data-dir", str(self._etcd_dir),
            "--listen-client-urls", self._etcd_url, "--advertise-client-urls", self._etcd_url,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"default={peer}", "--log-level", "warn"], "etcd.log")

    def _start_apiserver(self, binary: Path) -> None:
        port = free_port()
        self.server = f"https://127.0.0.1:{port}"
        self._apiserver_argv = [
            str(binary), f"--etcd-servers={self._etcd_url}", "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1", f"--secure-port={port}", "--insecure-port=0",
            f"--tls-cert-file={self._serving.cert}", f"--tls-private-key-file={self._serving.key}",
            f"--token-auth-file={self._tokens}", f"--client-ca-file={self.ca_file}", "--anonymous-auth=false",
            "--authorization-mode=Node,RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={self._sa.cert}", f"--service-account-signing-key-file={self._sa.key}",
            "--service-cluster-ip-range=10.96.0.0/24",
            f"--kubelet-certificate-authority={self.ca_file}", "--kubelet-preferred-address-types=InternalIP",
            f"--kubelet-client-certificate={self._apiserver_client.cert}",
            f"--kubelet-client-key={self._apiserver_client.key}",
            "--profiling=false", "--v=1"]
        self._apiserver = self._spawn(self._apiserver_argv, "kube-apiserver.log")

    def restart_apiserver(self) -> float:
        """Stop the API server and start it again on the same port and etcd (what a control-plane
        upgrade does to watchers); returns seconds until it is ready again. The node agent re-watches
        by itself; pods keep running.

        Raises:
            RuntimeError: it did not get ready (log tail included).
        """
        t0 = time.monotonic()
        _stop_process(self._apiserver)
        self._apiserver = self._spawn(self._apiserver_argv, "kube-apiserver.log")
        self._wait_ready()
        return time.monotonic() - t0

    def _wait_ready(self) -> None:
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        req = urllib.request.Request(f"{self.server}/readyz",
                                     headers={"Authorization": f"Bearer {self.identities[ADMIN].token}"})
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            for name, proc in (("etcd", self._etcd), ("kube-apiserver", self._apiserver)):
                if proc is None or proc.poll() is not None:
                    raise RuntimeError(f"{name} exited: {self._tail(name + '.log')}")
            try:
                with urllib.request.urlopen(req, timeout=2, context=ctx) as resp:
                    if resp.read().strip() == b"ok":
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.25)
        raise RuntimeError(f"kube-apiserver not ready in {READY_TIMEOUT_S:.0f} s: {self._tail('kube-apiserver.log')}")

    def _tail(self, log_name: str, chars: int = 2500) -> str:
        path = self.logs_dir / log_name
        return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"

    def _write_kubeconfigs(self) -> None:
        ca_data = base64.b64encode(self.ca_file.read_bytes()).decode()
        out = self.work_dir / "kubeconfig"
        out.mkdir(exist_ok=True)
        for ident in self.identities.values():
            doc = {"apiVersion": "v1", "kind": "Config", "current-context": ident.name,
                   "clusters": [{"name": "local", "cluster": {"server": self.server,
                                                              "certificate-authority-data": ca_data}}],
                   "users": [{"name": ident.name, "user": {"token": ident.token}}],
                   "contexts": [{"name": ident.name, "context": {"cluster": "local", "user": ident.name,
                                                                 "namespace": NAMESPACE}}]}
            path = out / f"{ident.name}.yaml"
            path.write_text(yaml.safe_dump(doc, sort_keys=False))
            path.chmod(0o600)

    def _apply_manifests(self) -> None:
        from kubernetes import client, utils

        admin = self.api_client(ADMIN)
        for name in MANIFESTS:
            path = self.deploy_dir / name
            if path.exists():
                utils.create_from_yaml(admin, yaml_file=str(path))
        # kube-controller-manager (not run here) gives every namespace a "default" service account; the
        # ServiceAccount admission plugin needs it for pods that name none. Without a token controller it
        # cannot mount a token, so this one opts out (the project's own accounts do too).
        core = client.CoreV1Api(admin)
        for ns in ("default", NAMESPACE):
            core.create_namespaced_service_account(ns, {"metadata": {"name": "default"},
                                                        "automountServiceAccountToken": False})

    def _start_real_node(self) -> None:
        from .node_agent import spot_pool_shape

        node_kubeconfig = self.work_dir / "kubeconfig" / "node.yaml"
        ca_data = base64.b64encode(self.ca_file.read_bytes()).decode()
        node_kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "node",
            "clusters": [{"name": "local", "cluster": {"server": self.server, "certificate-authority-data": ca_data}}],
            "users": [{"name": "node", "user": {"client-certificate": str(self._node_client.cert),
                                                "client-key": str(self._node_client.key)}}],
            "contexts": [{"name": "node", "context": {"cluster": "local", "user": "node"}}]}, sort_keys=False))
        node_kubeconfig.chmod(0o600)
        self.real_node = RealNode(self.work_dir / "node", self.logs_dir, self._spawn,
                                  spot_pool_shape(self.node_agent.node_name, self.gpus))
        self.real_node.start(ControlPlaneAccess(
            server=self.server, ca_file=self.ca_file, admin_kubeconfig=self.kubeconfig(ADMIN),
            node_kubeconfig=node_kubeconfig, serving_cert=self._kubelet.cert, serving_key=self._kubelet.key,
            sa_key=self._sa.key))
        if self.with_worker_image:
            from .worker_image import ensure_image

            ref = ensure_image(self.real_node.address)
            self.worker_image = self.real_node.name_by_digest(ref.name, ref.pinned)

    @property
    def node_alive(self) -> bool:
        """True while every process of the node runs (the agent, or containerd and the kubelet with
        kube-scheduler and kube-controller-manager)."""
        if self.real_node is not None:
            return self.real_node.alive
        return self.node_agent.alive

    def pod_settings_env(self) -> dict[str, str]:
        """``BATCH_K8S_*`` settings the ``kubernetes`` runner needs for this cluster's node: the worker
        image (the imported image's digest on the kubelet node; a placeholder digest the agent ignores),
        requests the node can hold (:data:`POD_CPU`, :data:`POD_MEMORY`) and, on the kubelet node,
        ``hostNetwork`` (the test's services listen on 127.0.0.1)."""
        env = {"BATCH_K8S_IMAGE": self.worker_image, "BATCH_K8S_CPU": POD_CPU, "BATCH_K8S_MEMORY": POD_MEMORY}
        if self.real_node is not None:
            env["BATCH_K8S_HOST_NETWORK"] = "true"
        return env

    def _start_node_agent(self) -> None:
        agent = self.node_agent
        ready = agent.work_dir / "ready"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(REPO_ROOT), str(REPO_ROOT / "plugins"), str(REPO_ROOT / "worker_image"),
             *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])}
        argv = [sys.executable, "-m", "scripts.k8s.node_agent", "--kubeconfig", str(self.kubeconfig(ADMIN)),
                "--work-dir", str(agent.work_dir), "--cert", str(self._kubelet.cert), "--key", str(self._kubelet.key),
                "--node-name", agent.node_name, "--gpus", str(self.gpus), "--ready-file", str(ready),
                "--log-file", str(agent.log_path), "--bin-dir", str(Path(sys.executable).parent)]
        argv += [a for k, v in self.image_env.items() for a in ("--image-env", f"{k}={v}")]
        agent.proc = self._spawn(argv, "node-agent.out", env=env)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not ready.exists():
            if agent.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"node agent did not start: {self._tail('node-agent.out')}")
            time.sleep(0.1)
        agent.port = int(ready.read_text())

    # ---- clients ----------------------------------------------------------------------------------
    def kubeconfig(self, identity: str = ADMIN) -> Path:
        """Kubeconfig file of ``identity`` (``admin`` or a service account name such as
        ``airflow-worker``, ``airflow-triggerer``, ``batch-worker``); its default namespace is
        ``batch-inference``.

        Raises:
            KeyError: unknown identity (the message lists the known ones).
        """
        if identity not in self.identities:
            raise KeyError(f"unknown identity {identity!r}; known: {sorted(self.identities)}")
        return self.work_dir / "kubeconfig" / f"{identity}.yaml"

    def api_client(self, identity: str = ADMIN):
        """A ``kubernetes.client.ApiClient`` authenticated as ``identity``."""
        from kubernetes import config

        return config.new_client_from_config(str(self.kubeconfig(identity)))

    def api(self, identity: str = ADMIN):
        """A ``kubernetes.client.CoreV1Api`` authenticated as ``identity``."""
        from kubernetes import client

        return client.CoreV1Api(self.api_client(identity))

    def pods(self, namespace: str = NAMESPACE, label_selector: str | None = None) -> list[Any]:
        """The ``V1Pod`` objects of ``namespace`` (as admin), optionally filtered by a label selector."""
        kwargs = {"label_selector": label_selector} if label_selector else {}
        return self.api().list_namespaced_pod(namespace, **kwargs).items

    def wait_for_pod(self, namespace: str, name: str, condition: Callable[[Any], bool],
                     timeout: float = 60.0) -> Any:
        """Poll ``namespace/name`` (as admin) until ``condition(pod)`` holds (``pod`` is None once the
        object is gone); returns that pod.

        Raises:
            TimeoutError: not within ``timeout`` seconds (the last phase in the message).
        """
        from kubernetes import client

        api, deadline, pod = self.api(), time.monotonic() + timeout, None
        while True:
            try:
                pod = api.read_namespaced_pod(name, namespace)
            except client.ApiException as exc:
                if exc.status != 404:
                    raise
                pod = None
            if condition(pod):
                return pod
            if time.monotonic() > deadline:
                phase = pod.status.phase if pod is not None else "gone"
                raise TimeoutError(f"{namespace}/{name}: condition not met in {timeout} s (phase {phase})")
            time.sleep(0.2)

    SPOT_GRACE_S = 15
    """What GKE gives a spot pod when its node is reclaimed (seconds): the eviction's grace period."""

    def preempt(self, namespace: str, pod: str, wait: float | None = None, how: str | None = None,
                grace_seconds: int = SPOT_GRACE_S) -> Any:
        """Take a running pod away as a spot reclaim or a drain does.

        ``how``:

        - ``"evict"`` (``kubectl drain``; the default on the ``kubelet`` node): the Eviction API with a
          ``grace_seconds`` grace period. The kubelet sends SIGTERM to each container's PID 1, SIGKILL
          when the grace ends, and the object is removed. ``wait`` waits for it to be gone (None returned).
        - ``"shutdown"`` (the node's OS shutting down; the default on the agent node): on the kubelet node
          the runtime sends SIGTERM to the containers' PID 1 (``ctr tasks kill``) and SIGKILL after
          ``grace_seconds``; the pod ends ``Failed`` with the container's exit code (the worker's 75).
          On the agent node it simulates GKE's graceful node shutdown: phase ``Failed``, reason
          ``Terminated``, a ``DisruptionTarget`` condition, the exit code kept. ``wait`` waits for
          ``Failed`` (the pod returned).

        Raises:
            kubernetes.client.ApiException: no such pod.
            ValueError: unknown ``how``.
            TimeoutError: ``wait`` given and the outcome did not come in time.
        """
        how = how or ("evict" if self.real_node is not None else "shutdown")
        failed: Callable[[Any], bool] = lambda p: p is not None and p.status.phase == "Failed"  # noqa: E731
        if how == "shutdown" and self.real_node is not None:
            self.real_node.shutdown_pod(self.api().read_namespaced_pod(pod, namespace), grace_seconds)
            done = failed
        elif how == "shutdown":
            from .node_agent import PREEMPT_ANNOTATION

            self.api().patch_namespaced_pod(pod, namespace, {"metadata": {"annotations": {
                PREEMPT_ANNOTATION: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}}})
            done = failed
        elif how in ("evict", "drain"):
            eviction = {"apiVersion": "policy/v1beta1", "kind": "Eviction",
                        "metadata": {"name": pod, "namespace": namespace},
                        "deleteOptions": {"gracePeriodSeconds": grace_seconds}}
            self.api().create_namespaced_pod_eviction(pod, namespace, eviction)
            done = lambda p: p is None  # noqa: E731
        else:
            raise ValueError(f"how: {how!r} is not 'evict', 'drain' or 'shutdown'")
        if wait is None:
            return None
        return self.wait_for_pod(namespace, pod, done, wait)

    def container_pid(self, container_id: str) -> int:
        """The host PID of a container's PID 1, from its status ``containerID``
        (``containerd://<id>`` on the kubelet node, ``agent://<pid>`` style on the agent node).

        Raises:
            LookupError: no such running container.
        """
        cid = container_id.rsplit("/", 1)[1]
        if self.real_node is None:
            return int(cid)
        return self.real_node.task_pid(cid)

    def env(self) -> dict[str, str]:
        """What ``cluster up --env-file`` writes: ``KUBECONFIG`` (admin), ``BATCH_K8S_KUBECONFIG_<NAME>``
        per identity (upper case, ``-`` as ``_``), ``BATCH_K8S_API_SERVER``, ``BATCH_K8S_CLUSTER_DIR`` and,
        on the agent node, ``BATCH_K8S_NODE_AGENT_LOG``."""
        out = {"KUBECONFIG": str(self.kubeconfig(ADMIN)), "BATCH_K8S_API_SERVER": self.server,
               "BATCH_K8S_CLUSTER_DIR": str(self.work_dir)}
        if self.real_node is None:
            out["BATCH_K8S_NODE_AGENT_LOG"] = str(self.node_agent.log_path)
        for name in self.identities:
            out[f"BATCH_K8S_KUBECONFIG_{name.upper().replace('-', '_')}"] = str(self.kubeconfig(name))
        return out


@contextlib.contextmanager
def _signals_stop() -> Iterator[list[int]]:
    got: list[int] = []
    previous = {s: signal.signal(s, lambda n, _f: got.append(n)) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield got
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def main(argv: list[str] | None = None) -> int:
    """CLI. ``up --env-file F``: build if needed, start, write ``F`` (``NAME=value`` lines, see
    :meth:`LocalCluster.env`) once ready, print one JSON line (``server``, ``started_in_s``, ``env_file``),
    then run in the foreground until SIGTERM/SIGINT, stop everything and remove ``F``. ``build``: only
    build. Exit 0 on a clean stop, 1 when the node's processes died without a signal."""
    ap = argparse.ArgumentParser(prog="python -m scripts.k8s.cluster", description=__doc__.split("\n", 1)[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start the cluster in the foreground")
    up.add_argument("--env-file", type=Path, required=True)
    up.add_argument("--work-dir", type=Path, help="keep certificates, logs and pod dirs here (default: temp, removed)")
    up.add_argument("--gpus", type=int, default=8)
    up.add_argument("--image-env", action="append", default=[], metavar="NAME=VALUE")
    up.add_argument("--node", choices=("auto", "kubelet", "agent"), default=None,
                    help="which node runs the pods (default: $BATCH_K8S_NODE, else auto)")
    up.add_argument("--no-worker-image", action="store_true",
                    help="kubelet node: do not build or import the worker image (pods of other images only)")
    sub.add_parser("build", help="build the Kubernetes binaries and (kubelet node) the worker image if missing")
    args = ap.parse_args(argv)
    if args.cmd == "up" and (bad := [kv for kv in args.image_env if "=" not in kv]):
        ap.error(f"--image-env {bad[0]!r} is not NAME=VALUE")
    if args.cmd == "up" and args.gpus < 0:
        ap.error("--gpus must be >= 0")
    if args.cmd == "build":
        build_all()
        return 0
    ensure_built()
    with _signals_stop() as got:
        cluster = LocalCluster(args.work_dir, gpus=args.gpus,
                               image_env=dict(kv.split("=", 1) for kv in args.image_env), node=args.node,
                               worker_image=not args.no_worker_image)
        with cluster:
            tmp = args.env_file.with_suffix(".tmp")
            args.env_file.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text("".join(f"{k}={v}\n" for k, v in cluster.env().items()))
            tmp.replace(args.env_file)
            print(json.dumps({"server": cluster.server, "started_in_s": round(cluster.started_in_s, 2),
                              "env_file": str(args.env_file)}), flush=True)
            try:
                while not got and cluster.node_alive:
                    time.sleep(0.5)
            finally:
                args.env_file.unlink(missing_ok=True)
            if not got:
                print(f"the {cluster.node_kind} node's processes died; logs in {cluster.logs_dir}", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
