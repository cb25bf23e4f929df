"""Helpers of the live-cluster DAG suite (``tests/k8s/test_k8s_*.py``): the Airflow side pointed at the
local cluster, a pod ledger, the run's task instances, and the figures ``make test-k8s`` prints.

* :func:`airflow_k8s_env` - the environment of ``airflow dags test`` for the ``kubernetes`` runner: the
  ``kubernetes_default`` connection (``AIRFLOW_CONN_KUBERNETES_DEFAULT``) holds the ``airflow-worker``
  service account's kubeconfig, so every API call Airflow makes (create, watch, logs, delete) is checked
  by the RBAC of ``deploy/k8s/rbac.yaml``; pods get the GCS emulator's address through
  ``BATCH_K8S_ENV``; the image and the pod network are the cluster's (``LocalCluster.pod_settings_env``:
  the built worker image by digest and ``hostNetwork`` on the kubelet node).
* :class:`PodLedger` - every pod the API server ever held in the namespace during a test (a watch as
  admin), with its labels, annotations and last status: pods created, exit codes, pods left.
* :func:`task_instances` - ``(task_id, map_index) -> (try_number, state)`` of a run, from the metadata DB.
* :func:`record` - merges figures into ``build/k8s/test-k8s-figures.json`` (``BATCH_K8S_FIGURES``).
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
FIGURES_ENV = "BATCH_K8S_FIGURES"
DEFAULT_FIGURES = REPO_ROOT / "build" / "k8s" / "test-k8s-figures.json"
PLACEHOLDER_IMAGE = "local.invalid/batch-worker@sha256:" + "0" * 64
"""The pod image: a valid digest reference; the node agent runs the venv's ``batch-worker`` instead."""
NAMESPACE = "batch-inference"
RUN_LABEL = "batch-inference/run-id"
SHARD_LABEL = "batch-inference/shard-id"
_LOCK = threading.Lock()


def figures_path() -> Path:
    """Where the suite's figures go (``$BATCH_K8S_FIGURES`` or ``build/k8s/test-k8s-figures.json``)."""
    return Path(os.environ.get(FIGURES_ENV) or DEFAULT_FIGURES)


def record(**figures: Any) -> None:
    """Merge ``figures`` into the figures file (one JSON object; later values win)."""
    path = figures_path()
    with _LOCK:
        path.parent.mkdir(parents=True, exist_ok=True)
        current = json.loads(path.read_text()) if path.exists() else {}
        current.update(figures)
        path.write_text(json.dumps(current, indent=1, sort_keys=True))


def connection_uri(kubeconfig: Path, namespace: str = NAMESPACE) -> str:
    """``AIRFLOW_CONN_KUBERNETES_DEFAULT`` value (JSON form) using ``kubeconfig``."""
    return json.dumps({"conn_type": "kubernetes",
                       "extra": {"kube_config_path": str(kubeconfig), "namespace": namespace}})


def airflow_k8s_env(base_env: dict[str, str], cluster: Any, gcs_url: str,
                    **k8s: str) -> dict[str, str]:
    """``base_env`` (``batch_inference.cli.airflow_env``) plus the ``kubernetes`` runner's settings.

    Args:
        base_env: the Airflow CLI environment.
        cluster: the started ``LocalCluster`` (Airflow uses its ``airflow-worker`` kubeconfig).
        gcs_url: the GCS emulator URL the pods get as ``STORAGE_EMULATOR_HOST``.
        **k8s: ``BATCH_K8S_<NAME>`` overrides (lower-case names, e.g. ``retries="2"``).
    """
    env = dict(base_env)
    env.update({
        "AIRFLOW_CONN_KUBERNETES_DEFAULT": connection_uri(cluster.kubeconfig("airflow-worker")),
        "BATCH_INFERENCE_RUNNERS": "local,kubernetes",
        **cluster.pod_settings_env(),
        "BATCH_K8S_ENV": json.dumps({"STORAGE_EMULATOR_HOST": gcs_url, "OMP_NUM_THREADS": "1",
                                     "MKL_NUM_THREADS": "1", "BATCH_WORKER_THREADS": "1"}),
        "BATCH_K8S_RETRY_DELAY_SECONDS": "1", "BATCH_K8S_MAX_RETRY_DELAY_SECONDS": "4",
        "BATCH_K8S_TERMINATION_GRACE_SECONDS": "30",
        "STORAGE_EMULATOR_HOST": gcs_url,
        # buckets made since base_env was built (make_bucket adds them to this process's environment)
        "BATCH_INFERENCE_ALLOWED_ROOTS": os.environ.get("BATCH_INFERENCE_ALLOWED_ROOTS", ""),
    })
    env.pop("KUBECONFIG", None)
    for name, value in k8s.items():
        env[f"BATCH_K8S_{name.upper()}"] = str(value)
    return env


@dataclass
class PodRecord:
    """One pod as last seen: ``labels``, ``annotations``, the first container's ``args``, ``phase``,
    ``exit_code``, ``reason`` (the pod's), ``exit_reason`` (the container's ``terminated.reason``, e.g.
    ``OOMKilled``), ``scheduled_reason`` (``PodScheduled=False``), ``deleted`` (the object is
    gone), ``first_seen`` / ``last_seen`` (monotonic seconds), and the API server's own timestamps
    (``created_at``: ``metadata.creationTimestamp``; ``started_at`` / ``finished_at``: the first
    container's ``startedAt`` / ``finishedAt``; aware datetimes, whole seconds)."""

    name: str
    labels: dict[str, str]
    annotations: dict[str, str]
    args: list[str] = field(default_factory=list)
    phase: str | None = None
    exit_code: int | None = None
    reason: str | None = None
    exit_reason: str | None = None
    scheduled_reason: str | None = None
    deleted: bool = False
    first_seen: float = 0.0
    last_seen: float = 0.0
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None


@dataclass
class PodLedger:
    """Watches every pod of ``namespace`` (as admin) from :meth:`start` to :meth:`stop`; pods that
    already existed at :meth:`start` are ignored."""

    api: Any
    namespace: str = NAMESPACE
    pods: dict[str, PodRecord] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._lock = threading.Lock()
        self._initial: set[str] | None = None
        self._listed = threading.Event()

    def start(self) -> PodLedger:
        """Start watching; returns once the pods that exist now are known (and ignored)."""
        self._thread.start()
        self._listed.wait(timeout=30)
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        from kubernetes import watch

        while not self._stop.is_set():
            try:
                items = self.api.list_namespaced_pod(self.namespace)
                if self._initial is None:
                    self._initial = {p.metadata.name for p in items.items}
                    self._listed.set()
                for pod in items.items:
                    self._see("MODIFIED", pod)
                self._forget_absent({p.metadata.name for p in items.items})
                w = watch.Watch()
                for ev in w.stream(self.api.list_namespaced_pod, self.namespace, timeout_seconds=5,
                                   resource_version=items.metadata.resource_version):
                    self._see(ev["type"], ev["object"])
                    if self._stop.is_set():
                        w.stop()
            except Exception:  # noqa: BLE001 - a dropped watch: list again
                time.sleep(0.2)

    def _forget_absent(self, listed: set[str]) -> None:
        """A pod deleted while no watch was open shows up only as missing from the next list (what
        client-go's informers call DeletedFinalStateUnknown): record it as deleted."""
        with self._lock:
            for name, rec in self.pods.items():
                if name not in listed:
                    rec.deleted = True

    def _see(self, kind: str, pod: Any) -> None:
        if pod.metadata.name in (self._initial or ()):
            return
        now = time.monotonic()
        with self._lock:
            rec = self.pods.get(pod.metadata.name)
            if rec is None:
                containers = pod.spec.containers if pod.spec else []
                rec = self.pods[pod.metadata.name] = PodRecord(
                    pod.metadata.name, dict(pod.metadata.labels or {}), {},
                    list((containers[0].args if containers else None) or []), first_seen=now)
            rec.created_at = pod.metadata.creation_timestamp or rec.created_at
            rec.labels = dict(pod.metadata.labels or rec.labels)
            rec.annotations = dict(pod.metadata.annotations or rec.annotations)
            status = pod.status
            if status is not None:
                rec.phase = status.phase or rec.phase
                rec.reason = status.reason or rec.reason
                for cs in (status.container_statuses or [])[:1]:
                    if cs.state and cs.state.running is not None:
                        rec.started_at = cs.state.running.started_at or rec.started_at
                    if cs.state and cs.state.terminated is not None:
                        rec.exit_code = cs.state.terminated.exit_code
                        rec.exit_reason = cs.state.terminated.reason
                        rec.started_at = cs.state.terminated.started_at or rec.started_at
                        rec.finished_at = cs.state.terminated.finished_at or rec.finished_at
                for cond in status.conditions or []:
                    if cond.type == "PodScheduled" and cond.status == "False":
                        rec.scheduled_reason = f"{cond.reason}: {cond.message}"
            rec.deleted = rec.deleted or kind == "DELETED"
            rec.last_seen = now

    def matching(self, **labels: str) -> list[PodRecord]:
        """Pods whose labels include ``labels`` (``shard="00001"`` and ``run`` are short for the
        shard-id and run-id labels), oldest first."""
        want = {SHARD_LABEL if k == "shard" else RUN_LABEL if k == "run" else k: v for k, v in labels.items()}
        with self._lock:
            found = [r for r in self.pods.values() if all(r.labels.get(k) == v for k, v in want.items())]
        return sorted(found, key=lambda r: r.first_seen)

    def wait_for(self, predicate, timeout: float, **labels: str) -> PodRecord:
        """The first pod matching ``labels`` for which ``predicate(record)`` holds.

        Raises:
            TimeoutError: none within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for rec in self.matching(**labels):
                if predicate(rec):
                    return rec
            time.sleep(0.2)
        raise TimeoutError(f"no pod with {labels} met the condition in {timeout} s: {self.matching(**labels)}")


def max_concurrent(records: list[PodRecord]) -> int:
    """The most pods whose first container ran at the same time, from the API server's ``startedAt`` /
    ``finishedAt`` (half-open intervals: a pod that finished in the second another started does not
    overlap it; a pod with no ``finishedAt`` yet runs on). Pods that never started do not count."""
    events = []
    for rec in records:
        if rec.started_at is None:
            continue
        events.append((rec.started_at.timestamp(), 1))
        if rec.finished_at is not None:
            events.append((rec.finished_at.timestamp(), -1))
    running = peak = 0
    for _, step in sorted(events):  # at equal times -1 sorts before +1
        running += step
        peak = max(peak, running)
    return peak


def run_dir_of(rec: PodRecord) -> str:
    """The ``--run-dir`` argument of a shard pod's worker command."""
    return rec.args[rec.args.index("--run-dir") + 1]


def live_pods(api: Any, selector: str, namespace: str = NAMESPACE) -> list[Any]:
    """Pods the API server holds now for ``selector`` (a label selector string)."""
    return api.list_namespaced_pod(namespace, label_selector=selector).items


def task_instances(airflow_home: Path, run_id: str, task_id: str = "infer_k8s") -> dict[int, tuple[int, str]]:
    """``map_index -> (try_number, state)`` of ``task_id`` in ``run_id`` (SQLite metadata DB)."""
    with sqlite3.connect(airflow_home / "airflow.db") as con:
        rows = con.execute("select map_index, try_number, state from task_instance where run_id = ? and "
                           "task_id = ?", (run_id, task_id)).fetchall()
    return {int(m): (int(t), str(s)) for m, t, s in rows}


def wait_gone(api: Any, selector: str, timeout: float, namespace: str = NAMESPACE) -> list[Any]:
    """Poll until no pod matches ``selector`` or ``timeout`` s pass; returns the pods left."""
    deadline = time.monotonic() + timeout
    left = live_pods(api, selector, namespace)
    while left and time.monotonic() < deadline:
        time.sleep(0.3)
        left = live_pods(api, selector, namespace)
    return left


def make_bucket(fake_gcs: Any, prefix: str) -> str:
    """A fresh ``gs://`` bucket on the emulator, added to ``BATCH_INFERENCE_ALLOWED_ROOTS`` (for the
    rest of the session: DAG runs copy the environment)."""
    import uuid

    bucket = fake_gcs.create_bucket(f"{prefix}-{uuid.uuid4().hex[:10]}")
    roots = os.environ.get("BATCH_INFERENCE_ALLOWED_ROOTS", "")
    os.environ["BATCH_INFERENCE_ALLOWED_ROOTS"] = f"{roots},{bucket}" if roots else bucket
    return bucket


def upload_rows(sample: Path, rows: int, uri: str, tmp: Path) -> str:
    """The first ``rows`` rows of ``sample`` as one Parquet object at ``uri``; returns ``uri``."""
    import pyarrow.parquet as pq
    from batch_contract import storage

    local = tmp / f"input-{rows}.parquet"
    pq.write_table(pq.read_table(sample).slice(0, rows), local)
    storage.write_replace(uri, local.read_bytes())
    return uri


def migrated_airflow_home(tmp: Path) -> tuple[Path, dict[str, str]]:
    """An Airflow home with its SQLite DB migrated; returns ``(home, cli env)``."""
    from batch_inference.cli import airflow_env, ensure_db

    home = tmp / "airflow_home"
    env = airflow_env(home)
    ensure_db(env)
    return home, env
