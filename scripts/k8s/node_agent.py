"""The project's node agent: a kubelet + scheduler stand-in that really runs pods as local processes.

Like KWOK, but executing. One agent registers one Ready node (``nvidia.com/gpu`` capacity, the GPU spot
pool's labels and taints from ``K8sSettings``' defaults) and then, from a watch on every pod:

- binds a pending pod whose tolerations, node selector / required affinity and GPU request fit the node
  (the ``binding`` subresource, as kube-scheduler does); a pod that does not fit stays ``Pending`` with
  ``PodScheduled=False, reason=Unschedulable`` and the scheduler's message (:mod:`.scheduling`);
- runs a bound pod's containers (init containers first, in order) as process groups in a per-pod working
  directory: ``command + args`` with ``$(VAR)`` expansion, the container's ``env`` / ``envFrom`` (literal
  values, Secret / ConfigMap keys, ``fieldRef``) over the "image environment" (``PATH`` with the
  project's ``.venv/bin`` first, so ``batch-worker`` is the real worker); an empty ``command`` runs the
  image entrypoint only for the worker image (``batch-worker``). Resources, volumes, security contexts
  and the image itself are ignored;
- drives the pod status like a kubelet: ``Pending`` -> ``Running`` (``containerStatuses[].state.running``,
  ``podIP`` 127.0.0.1) -> ``Succeeded``/``Failed`` (``terminated.exitCode``, ``reason`` Completed / Error /
  StartError, ``finishedAt``);
- serves the container logs on the node's kubelet port (:mod:`.log_server`), so ``pods/log`` works
  through the API server;
- turns a pod deletion (``deletionTimestamp``) into SIGTERM to the process group, SIGKILL after the
  deletion's grace period, then removes the object (``gracePeriodSeconds=0``), like a kubelet;
- simulates a spot preemption (graceful node shutdown) of a pod annotated with :data:`PREEMPT_ANNOTATION`:
  SIGTERM, SIGKILL after ``terminationGracePeriodSeconds``, then phase ``Failed`` with reason
  ``Terminated`` and a ``DisruptionTarget`` condition; the container's real exit code is kept and the pod
  object stays, as on GKE.

It re-lists and re-watches after any watch error (an API server restart included). Runs as its own
process (``python -m scripts.k8s.node_agent``, started by :class:`scripts.k8s.cluster.LocalCluster`);
on SIGTERM it kills every pod process it started and exits.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client, config, watch

from .log_server import LogServer
from .pod_process import START_ERROR_EXIT, ContainerProcess, StartError, now_rfc3339
from .scheduling import NodeShape, pod_gpus, unschedulable_message

log = logging.getLogger("node_agent")

PREEMPT_ANNOTATION = "node-agent.batch-inference.local/preempt"
"""Set this annotation (any value) on a running pod to preempt it like a spot reclaim."""
PREEMPT_MESSAGE = "Pod was terminated in response to imminent node shutdown."
"""The kubelet's message on a pod stopped by a graceful node shutdown (GKE spot reclaim)."""
WORKER_IMAGE_MARK = "batch-worker"
"""An image whose name contains this runs ``batch-worker`` when the container sets no ``command``
(the worker image's ``ENTRYPOINT``)."""
INHERITED_ENV = ("PYTHONPATH", "LANG", "LC_ALL", "TZ", "HF_HOME", "TMPDIR")
"""Variables of the agent's own environment every container starts with (the "image ENV")."""
POD_IP = "127.0.0.1"
WATCH_TIMEOUT_S = 60
"""Server-side timeout of one watch (seconds); the agent then re-lists and watches again."""
NEVER_STARTED_EXIT = 137
"""Exit code reported for a container whose pod was deleted or preempted before it started (what a
kubelet reports for a container it cannot find at termination)."""
API_RETRY_S = 120.0
"""How long a pod thread keeps retrying a status write while the API server is away (seconds)."""
DEFAULT_GRACE_S = 30
"""``terminationGracePeriodSeconds`` when a pod leaves it unset (the Kubernetes default)."""


class ContainerConfigError(RuntimeError):
    """A container's env cannot be built (a missing Secret or key): ``CreateContainerConfigError``."""


def spot_pool_shape(name: str, gpus: int) -> NodeShape:
    """The node of the GPU spot pool ``K8sSettings`` targets by default: its ``node_selector`` as labels
    and one taint per toleration (GKE's ``nvidia.com/gpu=present`` and ``cloud.google.com/gke-spot=true``,
    both ``NoSchedule``)."""
    from batch_inference.pod_spec import K8sSettings

    settings = K8sSettings()
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
              **settings.node_selector}
    taints = [{"key": t["key"], "value": t.get("value") or "present", "effect": t.get("effect", "NoSchedule")}
              for t in settings.tolerations]
    return NodeShape(name=name, labels=labels, taints=taints, gpus=gpus)


@dataclass
class AgentConfig:
    """How one agent runs.

    Attributes:
        kubeconfig: admin kubeconfig (binds pods, writes pod and node status, reads Secrets).
        work_dir: per-pod working dirs and logs go under ``work_dir/pods/<ns>_<pod>_<uid>/``.
        cert / key: the kubelet port's serving certificate (cluster CA, SAN 127.0.0.1).
        node: the node's shape; port: kubelet port (0 = free).
        bin_dirs: prepended to ``PATH`` in every container (the project's ``.venv/bin``).
        image_env: extra "image ENV" variables for every container (after :data:`INHERITED_ENV`).
    """

    kubeconfig: Path
    work_dir: Path
    cert: Path
    key: Path
    node: NodeShape
    port: int = 0
    bin_dirs: list[str] = field(default_factory=list)
    image_env: dict[str, str] = field(default_factory=dict)


@dataclass
class PodRun:
    """What the agent holds for one pod it runs (keyed by uid)."""

    namespace: str
    name: str
    uid: str
    grace_s: int
    dir: Path
    containers: dict[str, ContainerProcess] = field(default_factory=dict)
    stop_reason: str = ""  # "", "deleted", "preempted"
    finished: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    kill_timer: threading.Timer | None = None
    kill_deadline: float | None = None  # time.monotonic() of the pending SIGKILL

    def stop(self, reason: str, grace_s: int) -> None:
        """SIGTERM every running container now and SIGKILL after ``grace_s`` seconds (a pod not yet
        started never starts). A second stop only shortens the grace."""
        with self.lock:
            first = not self.stop_reason
            self.stop_reason = self.stop_reason or reason
            for proc in self.containers.values():
                if first:
                    proc.signal(signal.SIGTERM)
            deadline = time.monotonic() + max(grace_s, 0)
            if self.kill_deadline is not None and deadline >= self.kill_deadline:
                return
            if self.kill_timer is not None:
                self.kill_timer.cancel()
            self.kill_deadline = deadline
            self.kill_timer = threading.Timer(max(grace_s, 0), self.kill)
            self.kill_timer.daemon = True
            self.kill_timer.start()

    def kill(self) -> None:
        """SIGKILL every container's process group."""
        with self.lock:
            for proc in self.containers.values():
                proc.signal(signal.SIGKILL)


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion in command, args and env values: defined names are replaced,
    ``$$(`` escapes, undefined references stay as written."""

    def sub(match: re.Match[str]) -> str:
        if match.group(0).startswith("$$"):
            return match.group(0)[1:]
        return env.get(match.group(1), match.group(0))

    return re.sub(r"\$\$\(|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", sub, value) if "$" in value else value


def _field_ref(pod: Any, path: str) -> str:
    simple = {"metadata.name": pod.metadata.name, "metadata.namespace": pod.metadata.namespace,
              "metadata.uid": pod.metadata.uid, "spec.nodeName": pod.spec.node_name,
              "spec.serviceAccountName": pod.spec.service_account_name,
              "status.hostIP": POD_IP, "status.podIP": POD_IP}
    if path in simple:
        return simple[path] or ""
    match = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if match:
        return (getattr(pod.metadata, match.group(1)) or {}).get(match.group(2), "")
    raise ContainerConfigError(f"unsupported fieldRef {path!r}")


class NodeAgent:
    """The running agent (see the module docstring).

    Args:
        cfg: :class:`AgentConfig`.
    """

    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg
        self.api = client.CoreV1Api(config.new_client_from_config(str(cfg.kubeconfig)))
        self.node = cfg.node
        self.pods: dict[str, Any] = {}  # uid -> latest V1Pod seen
        self.runs: dict[str, PodRun] = {}  # uid -> PodRun
        self.lock = threading.RLock()
        self.stopping = threading.Event()
        self.log_server = LogServer(cfg.port, cfg.cert, cfg.key, self.resolve_log, log.debug)

    # ---- node -------------------------------------------------------------------------------------
    def register_node(self) -> None:
        """Create the node (once) and set its status: Ready, capacity, addresses, kubelet port."""
        body = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": self.node.name, "labels": self.node.labels},
                "spec": {"taints": self.node.taints}}
        try:
            self.api.create_node(body)
        except client.ApiException as exc:
            if exc.status != 409:
                raise
            self.api.patch_node(self.node.name, {"metadata": {"labels": self.node.labels},
                                                 "spec": {"taints": self.node.taints}})
        cap = {"cpu": str(os.cpu_count() or 1), "memory": "64Gi", "pods": "110", "ephemeral-storage": "100Gi",
               "nvidia.com/gpu": str(self.node.gpus)}
        now = now_rfc3339()
        self.api.patch_node_status(self.node.name, {"status": {
            "capacity": cap, "allocatable": cap,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "node agent is posting ready status", "lastHeartbeatTime": now,
                            "lastTransitionTime": now}],
            "addresses": [{"type": "InternalIP", "address": POD_IP}, {"type": "Hostname", "address": self.node.name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.log_server.port}},
            "nodeInfo": {"architecture": "amd64", "bootID": "", "containerRuntimeVersion": "local-process://1",
                         "kernelVersion": os.uname().release, "kubeProxyVersion": "", "kubeletVersion": "v1.20.2",
                         "machineID": "", "operatingSystem": "linux", "osImage": "local processes",
                         "systemUUID": ""}}})

    # ---- logs -------------------------------------------------------------------------------------
    def resolve_log(self, namespace: str, pod: str, container: str):
        """The newest run of ``namespace/pod``'s ``container``: its log path and an "exited?" check."""
        with self.lock:
            runs = [r for r in self.runs.values() if (r.namespace, r.name) == (namespace, pod)]
        for run in reversed(runs):
            proc = run.containers.get(container)
            if proc is not None and proc.log_path.exists():
                return proc.log_path, lambda p=proc, r=run: r.finished or not p.running
        return f'container "{container}" in pod "{pod}" is not running or has no log'

    # ---- watch loop -------------------------------------------------------------------------------
    def serve(self) -> None:
        """Register the node, serve logs, then watch pods until :meth:`shutdown`."""
        self.log_server.start()
        while not self.stopping.is_set():
            try:
                self.register_node()
                self._watch_once()
            except Exception as exc:  # API server restart, dropped watch, 410 Gone: list and watch again
                if self.stopping.is_set():
                    break
                log.warning("watch ended (%s: %s); re-watching", type(exc).__name__, exc)
                self.stopping.wait(1.0)

    def _watch_once(self) -> None:
        """List every pod (pods that vanished while no watch was open count as DELETED), then watch from
        the list's resourceVersion until the server ends the watch or it fails (an informer's loop)."""
        listing = self.api.list_pod_for_all_namespaces(_request_timeout=(5, 30))
        listed = {p.metadata.uid for p in listing.items}
        with self.lock:
            vanished = [p for uid, p in self.pods.items() if uid not in listed]
        for pod in vanished:
            self.on_event("DELETED", pod)
        for pod in listing.items:
            self.on_event("MODIFIED", pod)
        w = watch.Watch()
        for event in w.stream(self.api.list_pod_for_all_namespaces, resource_version=listing.metadata.resource_version,
                              timeout_seconds=WATCH_TIMEOUT_S, _request_timeout=(5, WATCH_TIMEOUT_S + 10)):
            if self.stopping.is_set():
                w.stop()
                return
            if event["type"] == "ERROR":
                raise RuntimeError(f"watch error: {event['raw_object']}")
            self.on_event(event["type"], event["object"])

    def on_event(self, kind: str, pod: Any) -> None:
        """Act on one watch event, ``ADDED``/``MODIFIED``/``DELETED`` (idempotent: every relist replays
        all pods as ``MODIFIED``)."""
        uid = pod.metadata.uid
        with self.lock:
            if kind == "DELETED":
                self.pods.pop(uid, None)
                run = self.runs.get(uid)
                if run is not None and not run.finished:
                    run.stop("deleted", 0)  # force-deleted while running: no grace left
                elif run is not None:
                    self.runs.pop(uid)
                self.schedule_pending()
                return
            self.pods[uid] = pod
            if not pod.spec.node_name:
                if pod.metadata.deletion_timestamp is None:
                    self.schedule_pending()
                return
            if pod.spec.node_name == self.node.name:
                self._on_bound(pod)

    def _on_bound(self, pod: Any) -> None:
        run = self.runs.get(pod.metadata.uid)
        if pod.metadata.deletion_timestamp is not None:
            if run is None or run.finished:
                self._remove(pod)
            elif not run.stop_reason:
                grace = pod.metadata.deletion_grace_period_seconds
                grace = DEFAULT_GRACE_S if grace is None else int(grace)
                run.stop("deleted", grace)
                self.record_event(pod, "Normal", "Killing", f"Stopping container(s) (grace period {grace} s)")
            else:  # already stopping (preempted, or an earlier delete): a shorter grace wins
                grace = pod.metadata.deletion_grace_period_seconds
                run.stop("deleted", DEFAULT_GRACE_S if grace is None else int(grace))
            return
        if run is not None:
            if PREEMPT_ANNOTATION in (pod.metadata.annotations or {}) and not run.finished and not run.stop_reason:
                run.stop("preempted", self._grace(pod))
                self.record_event(pod, "Warning", "Preempting", PREEMPT_MESSAGE)
            return
        phase = pod.status.phase if pod.status else None
        if phase in (None, "Pending"):
            self._start(pod)
        elif phase == "Running":  # a previous agent's process is gone: report it like a lost container
            self._patch_status(pod, self._final_status(pod, {c.name: (137, "Error", "", "") for c in
                                                             pod.spec.containers}, "node agent restarted"))

    @staticmethod
    def _grace(pod: Any) -> int:
        grace = pod.spec.termination_grace_period_seconds
        return DEFAULT_GRACE_S if grace is None else int(grace)

    # ---- scheduling -------------------------------------------------------------------------------
    def gpus_in_use(self) -> int:
        """``nvidia.com/gpu`` held by pods bound here that have not finished."""
        return sum(pod_gpus(p) for p in self.pods.values()
                   if p.spec.node_name == self.node.name and (p.status.phase if p.status else None)
                   not in ("Succeeded", "Failed"))

    def schedule_pending(self) -> None:
        """Bind every unbound pod that fits, oldest first; mark the others Unschedulable (once per
        message)."""
        with self.lock:
            pending = sorted((p for p in self.pods.values()
                              if not p.spec.node_name and p.metadata.deletion_timestamp is None),
                             key=lambda p: (p.metadata.creation_timestamp, p.metadata.name))
            for pod in pending:
                message = unschedulable_message(pod, self.node, self.gpus_in_use())
                if message is None:
                    self._bind(pod)
                else:
                    self._mark_unschedulable(pod, message)

    def _bind(self, pod: Any) -> None:
        body = {"apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": pod.metadata.name, "namespace": pod.metadata.namespace},
                "target": {"apiVersion": "v1", "kind": "Node", "name": self.node.name}}
        try:
            self.api.create_namespaced_pod_binding(pod.metadata.name, pod.metadata.namespace, body,
                                                   _preload_content=False)
        except client.ApiException as exc:
            if exc.status not in (404, 409):
                raise
            return
        pod.spec.node_name = self.node.name  # counted as bound until the watch brings the new object
        self.record_event(pod, "Normal", "Scheduled", f"Successfully assigned {pod.metadata.namespace}/"
                          f"{pod.metadata.name} to {self.node.name}", "default-scheduler")
        log.info("bound %s/%s", pod.metadata.namespace, pod.metadata.name)

    def _mark_unschedulable(self, pod: Any, message: str) -> None:
        for cond in (pod.status.conditions if pod.status else None) or []:
            if cond.type == "PodScheduled" and cond.reason == "Unschedulable" and cond.message == message:
                return
        self._patch_status(pod, {"phase": "Pending", "conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
            "lastTransitionTime": now_rfc3339()}]})
        self.record_event(pod, "Warning", "FailedScheduling", message, "default-scheduler")
        log.info("unschedulable %s/%s: %s", pod.metadata.namespace, pod.metadata.name, message)

    def record_event(self, pod: Any, kind: str, reason: str, message: str, component: str = "kubelet") -> None:
        """Write a core/v1 Event about ``pod`` as kube-scheduler / kubelet do (what ``kubectl describe``
        and KubernetesPodOperator's pod-event logging show). Best effort: a failure is only logged."""
        now = now_rfc3339()
        md = pod.metadata
        body = {"metadata": {"generateName": f"{md.name}.", "namespace": md.namespace},
                "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": md.namespace,
                                   "name": md.name, "uid": md.uid},
                "type": kind, "reason": reason, "message": message, "count": 1,
                "firstTimestamp": now, "lastTimestamp": now,
                "source": {"component": component, "host": self.node.name}}
        try:
            self.api.create_namespaced_event(md.namespace, body)
        except (client.ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            log.warning("event %s for %s/%s not written: %s", reason, md.namespace, md.name, exc)

    # ---- running ----------------------------------------------------------------------------------
    def _start(self, pod: Any) -> None:
        md = pod.metadata
        run = PodRun(md.namespace, md.name, md.uid, self._grace(pod),
                     self.cfg.work_dir / "pods" / f"{md.namespace}_{md.name}_{md.uid}")
        self.runs[md.uid] = run
        threading.Thread(target=self._run_pod, args=(pod, run), name=f"pod-{md.name}", daemon=True).start()

    def _run_pod(self, pod: Any, run: PodRun) -> None:
        results: dict[str, tuple[int, str, str, str]] | None
        try:
            results = self._execute(pod, run)
        except ContainerConfigError as exc:
            log.warning("%s/%s: %s", run.namespace, run.name, exc)
            self._patch_status(pod, self._waiting_status(pod, "CreateContainerConfigError", str(exc)))
            results = None
        except Exception:
            log.exception("%s/%s: agent error", run.namespace, run.name)
            results = {c.name: (START_ERROR_EXIT, "StartError", "node agent error", "") for c in pod.spec.containers}
        with self.lock:
            run.finished = True
            if run.kill_timer is not None:
                run.kill_timer.cancel()
            current = self.pods.get(run.uid)
        if results is not None and current is not None:
            reason = "preempted" if run.stop_reason == "preempted" else ""
            self._patch_status(pod, self._final_status(pod, results, reason))
        with self.lock:
            current = self.pods.get(run.uid)
            if current is None:
                self.runs.pop(run.uid, None)  # the object is gone already (force-deleted)
            elif current.metadata.deletion_timestamp is not None:
                self._remove(current)
            self.schedule_pending()

    def _execute(self, pod: Any, run: PodRun) -> dict[str, tuple[int, str, str, str]]:
        """Run the init containers in order, then the containers together; ``{container name: (exit
        code, reason, message, startedAt)}`` for the pod's containers."""
        run.dir.mkdir(parents=True, exist_ok=True)
        for init in pod.spec.init_containers or []:
            code, _reason, _message, _started = self._run_one(pod, run, init, wait=True)[init.name]
            if code != 0:
                note = f"init container {init.name} exited with {code}"
                return {c.name: (code, "Error", note, "") for c in pod.spec.containers}
        results: dict[str, tuple[int, str, str, str]] = {}
        for c in pod.spec.containers:
            results.update(self._run_one(pod, run, c, wait=False))
        if run.containers:
            self._patch_status(pod, self._running_status(pod, run, results))
        for name, proc in list(run.containers.items()):
            if name not in results:
                code = proc.wait()
                results[name] = (code, "Completed" if code == 0 else "Error", "", proc.started_at)
        return results

    def _run_one(self, pod: Any, run: PodRun, container: Any, wait: bool) -> dict[str, tuple[int, str, str, str]]:
        """Start one container (and wait for it when ``wait``); a container that cannot start, or whose
        pod was stopped before it started, is a result at once."""
        env = self.container_env(pod, container)
        command = list(container.command or [])
        if not command and WORKER_IMAGE_MARK in (container.image or ""):
            command = [WORKER_IMAGE_MARK]
        argv = [expand(a, env) for a in command + list(container.args or [])]
        proc = ContainerProcess(argv, env, run.dir, run.dir / f"{container.name}.log")
        with run.lock:
            if run.stop_reason:
                return {container.name: (NEVER_STARTED_EXIT, "ContainerStatusUnknown",
                                         "the pod was stopped before the container started", "")}
            try:
                proc.start()
            except StartError as exc:
                return {container.name: (START_ERROR_EXIT, "StartError", str(exc), now_rfc3339())}
            run.containers[container.name] = proc
        log.info("started %s/%s[%s] pid %s: %s", run.namespace, run.name, container.name, proc.proc.pid, argv)
        if not wait:
            return {}
        code = proc.wait()
        return {container.name: (code, "Completed" if code == 0 else "Error", "", proc.started_at)}

    def container_env(self, pod: Any, container: Any) -> dict[str, str]:
        """The container's environment: image ENV, then ``envFrom``, then ``env`` (later wins).

        Raises:
            ContainerConfigError: a referenced Secret/ConfigMap or key is missing and not optional.
        """
        path = os.pathsep.join([*self.cfg.bin_dirs, os.environ.get("PATH", "/usr/bin:/bin")])
        env = {"PATH": path, "HOME": str(self.cfg.work_dir), "HOSTNAME": pod.metadata.name}
        env.update({k: os.environ[k] for k in INHERITED_ENV if k in os.environ})
        env.update(self.cfg.image_env)
        ns = pod.metadata.namespace
        for src in container.env_from or []:
            ref = src.secret_ref or src.config_map_ref
            data = self._source(ns, "secret" if src.secret_ref else "configmap", ref.name, ref.optional)
            env.update({(src.prefix or "") + k: v for k, v in data.items()})
        for var in container.env or []:
            if var.value_from is None:
                env[var.name] = expand(var.value or "", env)
                continue
            vf = var.value_from
            if vf.field_ref is not None:
                env[var.name] = _field_ref(pod, vf.field_ref.field_path)
                continue
            ref, kind = (vf.secret_key_ref, "secret") if vf.secret_key_ref else (vf.config_map_key_ref, "configmap")
            if ref is None:
                raise ContainerConfigError(f"env {var.name}: unsupported valueFrom")
            data = self._source(ns, kind, ref.name, ref.optional)
            if ref.key in data:
                env[var.name] = data[ref.key]
            elif not ref.optional:
                raise ContainerConfigError(f"couldn't find key {ref.key} in {kind} {ns}/{ref.name}")
        return env

    def _source(self, ns: str, kind: str, name: str, optional: bool | None) -> dict[str, str]:
        import base64

        try:
            if kind == "secret":
                data = self.api.read_namespaced_secret(name, ns).data or {}
                return {k: base64.b64decode(v).decode() for k, v in data.items()}
            return dict(self.api.read_namespaced_config_map(name, ns).data or {})
        except client.ApiException as exc:
            if exc.status == 404 and optional:
                return {}
            if exc.status == 404:
                raise ContainerConfigError(f'{kind} "{name}" not found') from exc
            raise

    # ---- status -----------------------------------------------------------------------------------
    @staticmethod
    def _container_status(c: Any, state: dict[str, Any], ready: bool, pid: str = "") -> dict[str, Any]:
        return {"name": c.name, "image": c.image, "imageID": f"local-process://{c.image}", "ready": ready,
                "started": ready, "restartCount": 0, "state": state, "containerID": f"local-process://{pid}"}

    def _running_status(self, pod: Any, run: PodRun, failed: dict[str, tuple[int, str, str, str]]):
        now = now_rfc3339()
        statuses = []
        for c in pod.spec.containers:
            proc = run.containers.get(c.name)
            if proc is None:
                code, reason, message, started = failed[c.name]
                statuses.append(self._container_status(c, {"terminated": {
                    "exitCode": code, "reason": reason, "message": message, "startedAt": started or now,
                    "finishedAt": now}}, False))
            else:
                statuses.append(self._container_status(c, {"running": {"startedAt": proc.started_at}}, True,
                                                       str(proc.proc.pid)))
        return {"phase": "Running", "hostIP": POD_IP, "podIP": POD_IP, "podIPs": [{"ip": POD_IP}],
                "startTime": now, "containerStatuses": statuses,
                "conditions": [{"type": t, "status": "True", "lastTransitionTime": now}
                               for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")]}

    def _waiting_status(self, pod: Any, reason: str, message: str) -> dict[str, Any]:
        return {"phase": "Pending", "hostIP": POD_IP,
                "containerStatuses": [self._container_status(c, {"waiting": {"reason": reason, "message": message}},
                                                             False) for c in pod.spec.containers]}

    def _final_status(self, pod: Any, results: dict[str, tuple[int, str, str, str]], why: str):
        """Terminal status: Succeeded when every container exited 0 (and no preemption), else Failed."""
        now = now_rfc3339()
        statuses = []
        for c in pod.spec.containers:
            code, reason, message, started = results.get(c.name, (START_ERROR_EXIT, "StartError", "", ""))
            term = {"exitCode": code, "reason": reason, "startedAt": started or now, "finishedAt": now,
                    "containerID": "local-process://"}
            if message:
                term["message"] = message
            statuses.append(self._container_status(c, {"terminated": term}, False))
        ok = all(r[0] == 0 for r in results.values()) and not why
        status = {"phase": "Succeeded" if ok else "Failed", "hostIP": POD_IP, "podIP": POD_IP,
                  "podIPs": [{"ip": POD_IP}], "containerStatuses": statuses,
                  "conditions": [{"type": t, "status": "False" if t in ("Ready", "ContainersReady") else "True",
                                  "lastTransitionTime": now}
                                 for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")]}
        if why == "preempted":
            status.update(reason="Terminated", message=PREEMPT_MESSAGE)
            status["conditions"].append({"type": "DisruptionTarget", "status": "True", "lastTransitionTime": now,
                                         "reason": "TerminationByKubelet", "message": PREEMPT_MESSAGE})
        elif why:
            status.update(reason="NodeAgentRestarted", message=why)
        return status

    def _retrying(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        """``call(*args, **kwargs)``, retried every second for up to :data:`API_RETRY_S` seconds while the
        API server is unreachable or answers 429/5xx (a restart); 404/409 mean the pod is gone or moved
        on and end quietly (None)."""
        deadline = time.monotonic() + API_RETRY_S
        while True:
            try:
                return call(*args, **kwargs)
            except client.ApiException as exc:
                if exc.status in (404, 409):
                    return None
                if exc.status != 429 and exc.status < 500 or time.monotonic() > deadline:
                    raise
            except (urllib3.exceptions.HTTPError, OSError):
                if time.monotonic() > deadline or self.stopping.is_set():
                    raise
            time.sleep(1.0)

    def _patch_status(self, pod: Any, status: dict[str, Any]) -> None:
        self._retrying(self.api.patch_namespaced_pod_status, pod.metadata.name, pod.metadata.namespace,
                       {"status": status})

    def _remove(self, pod: Any) -> None:
        """Finish a graceful deletion: remove the object now (``gracePeriodSeconds=0``, this uid only)."""
        body = client.V1DeleteOptions(grace_period_seconds=0,
                                      preconditions=client.V1Preconditions(uid=pod.metadata.uid))
        self._retrying(self.api.delete_namespaced_pod, pod.metadata.name, pod.metadata.namespace, body=body)
        log.info("removed %s/%s", pod.metadata.namespace, pod.metadata.name)

    def shutdown(self) -> None:
        """Stop watching and SIGKILL every pod process still running (no orphans outlive the agent)."""
        self.stopping.set()
        with self.lock:
            runs = list(self.runs.values())
        for run in runs:
            run.kill()
        self.log_server.stop()


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m scripts.k8s.node_agent --kubeconfig K --work-dir D --cert C --key K [...]``.
    Writes the kubelet port to ``--ready-file`` once the node is registered; exits 0 on SIGTERM."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--kubeconfig", type=Path, required=True)
    ap.add_argument("--work-dir", type=Path, required=True)
    ap.add_argument("--cert", type=Path, required=True)
    ap.add_argument("--key", type=Path, required=True)
    ap.add_argument("--node-name", default="gpu-spot-node-0")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--bin-dir", action="append", default=[], help="prepended to PATH in containers")
    ap.add_argument("--image-env", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--ready-file", type=Path)
    ap.add_argument("--log-file", type=Path)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, filename=args.log_file,
                        format="%(asctime)s %(levelname)s %(threadName)s %(message)s")
    cfg = AgentConfig(kubeconfig=args.kubeconfig, work_dir=args.work_dir, cert=args.cert, key=args.key,
                      node=spot_pool_shape(args.node_name, args.gpus), port=args.port, bin_dirs=args.bin_dir,
                      image_env=dict(kv.split("=", 1) for kv in args.image_env))
    agent = NodeAgent(cfg)
    signal.signal(signal.SIGTERM, lambda *_: agent.stopping.set())
    signal.signal(signal.SIGINT, lambda *_: agent.stopping.set())
    agent.register_node()
    if args.ready_file:
        args.ready_file.write_text(str(agent.log_server.port))
    loop = threading.Thread(target=agent.serve, name="watch", daemon=True)
    loop.start()
    while not agent.stopping.wait(0.5):
        pass
    agent.shutdown()
    log.info("node agent stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
