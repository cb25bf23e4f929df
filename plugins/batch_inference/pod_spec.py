"""What the kubernetes runner's pods are: cluster settings and the KubernetesPodOperator kwargs.

:func:`kpo_partial_kwargs` gives the kwargs shared by every shard's pod (``.partial(...)``), and
:func:`kpo_expand_kwargs` the per-shard ones (``.expand_kwargs(...)``): the worker command and the
run-id / shard-id labels; :func:`canary_pod_kwargs` / :func:`canary_command` the canary pod's. The
operators that run these pods, and the offline build of the exact pod the provider would submit
(``build_pod`` / ``render_pod_manifests``), are in :mod:`batch_inference.shard_pod`.

Imported when a DAG file parses: the Kubernetes client and provider are imported inside the functions
that build their objects, not with this module.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from batch_contract.documents import POOL_WORKERS_ENV
from batch_contract.engine_config import ConfigError, WorkerSettings

DIGEST_PATTERN = re.compile(r"^[^@\s]+@sha256:[0-9a-f]{64}$")
SHA256_PATTERN = re.compile(r"[0-9a-f]{64}")
QUANTITY_PATTERN = re.compile(r"[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")
"""A Kubernetes resource quantity as these settings use it (decimal or binary suffix; no exponent form)."""
DNS_LABEL_PATTERN = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
DNS_SUBDOMAIN_PATTERN = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
LABEL_VALUE_MAX = 63
DEFAULT_IMAGE = (
    "us-docker.pkg.dev/example-project/batch-inference/batch-worker"
    "@sha256:0000000000000000000000000000000000000000000000000000000000000000"
)
"""Placeholder-free default: a syntactically valid digest reference. Set ``BATCH_K8S_IMAGE`` to the
digest your CI pushed (``docker buildx imagetools inspect <tag>`` prints it)."""


def label_value(value: str) -> str:
    """A Kubernetes label value for ``value``: ``[A-Za-z0-9._-]``, alphanumeric at both ends, <= 63
    chars (Airflow run ids contain ``:`` and ``+``, which labels do not allow)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "-", value)[:LABEL_VALUE_MAX]
    return cleaned.strip("._-") or "x"


@dataclass(frozen=True)
class K8sSettings:
    """Cluster-side settings of the worker pods (one per shard).

    Attributes:
        image: worker image pinned by digest (``repo@sha256:<64 hex>``); tags are rejected.
        namespace / service_account: where pods run and the identity they use (Workload Identity
            on GKE maps it to a cloud service account that can read inputs and write ``output_root``).
        gpus: ``nvidia.com/gpu`` limit per pod.
        cpu / memory: requests (CPU cores, Kubernetes quantity); memory is also the limit.
        node_selector / tolerations / prefer_spot: GPU spot node-pool placement.
        secret_env: env var -> ``"secret-name:key"`` injected from Kubernetes secrets.
        termination_grace_seconds: must exceed the worker's flush grace so a preempted pod commits
            its in-flight chunk before SIGKILL.
        retries / retry_delay_seconds / max_retry_delay_seconds: exponential backoff for spot deaths.
        max_active_pods: ``max_active_tis_per_dagrun`` of the mapped pod task.
        startup_timeout_seconds: image pull + GPU node scale-up allowance (seconds); a pod still not
            started then is deleted and its try fails naming the ``PodScheduled`` reason.
        max_preemptions: preempted pods (exit 75, vanished, node reclaimed) one try replaces with a
            fresh pod without consuming ``retries`` (``shard_pod.ShardPodOperator``).
        env: extra plain environment variables of the worker container (e.g. ``STORAGE_EMULATOR_HOST``
            for a GCS emulator, ``GOOGLE_CLOUD_PROJECT``); secrets go in ``secret_env``.
        quota_wait_seconds: how long a pod create refused by a ResourceQuota (403 ``exceeded quota``)
            waits and tries again inside the try (seconds; :mod:`batch_inference.quota`); 0: fail the
            try at once (the normal retries apply).
        shm_size: size of the memory-backed ``/dev/shm`` volume (Kubernetes quantity; PyTorch and vLLM
            need more than the container default of 64 MiB); ``""``: none. It counts towards the pod's
            memory limit.
        host_network: run the pods in the node's network namespace (``hostNetwork``). Only for a test
            cluster whose services (a storage emulator, the API server) listen on the node's loopback
            (``scripts/k8s``); production pods keep their own network namespace (the default, False).
        model_uri / model_sha256: when set, an init container (``model-sync``, the worker image's
            ``batch-worker-sync-model``) copies the pinned weights (``gs://``, ``s3://``, ``az://``, ``file://`` or a path;
            sha256 of their ``SHA256SUMS``) to ``model_dir`` (under ``/models/synced``) on an ``emptyDir``
            of ``model_volume_size`` that the worker mounts read-only; point the ``model`` Param at
            ``model_dir``. ``""``: the weights are baked into the image.
    """

    image: str = DEFAULT_IMAGE
    namespace: str = "batch-inference"
    service_account: str = "batch-worker"
    gpus: int = 1
    cpu: str = "4"
    memory: str = "16Gi"
    node_selector: dict[str, str] = field(default_factory=lambda: {
        "cloud.google.com/gke-spot": "true",
        "cloud.google.com/gke-accelerator": "nvidia-l4",
    })
    tolerations: list[dict[str, str]] = field(default_factory=lambda: [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
    ])
    prefer_spot: bool = True
    secret_env: dict[str, str] = field(default_factory=dict)
    termination_grace_seconds: int = 60
    retries: int = 8
    retry_delay_seconds: int = 30
    max_retry_delay_seconds: int = 900
    max_active_pods: int = 16
    startup_timeout_seconds: int = 900
    max_preemptions: int = 20
    env: dict[str, str] = field(default_factory=dict)
    quota_wait_seconds: int = 3600
    shm_size: str = "8Gi"
    model_uri: str = ""
    model_sha256: str = ""
    model_dir: str = "/models/synced/model"
    model_volume_size: str = "40Gi"
    host_network: bool = False

    def __post_init__(self) -> None:
        if not DIGEST_PATTERN.match(self.image):
            raise ConfigError(f"k8s.image: {self.image!r} is not pinned by digest (repo@sha256:<64 hex>)")
        if self.gpus < 0:
            raise ConfigError("k8s.gpus: must be >= 0")
        if self.retries < 2:
            raise ConfigError("k8s.retries: must be >= 2 (spot preemptions are expected)")
        if self.max_active_pods < 1:
            raise ConfigError("k8s.max_active_pods: must be >= 1")
        if self.max_preemptions < 0:
            raise ConfigError("k8s.max_preemptions: must be >= 0")
        if self.startup_timeout_seconds < 1:
            raise ConfigError("k8s.startup_timeout_seconds: must be >= 1")
        if self.quota_wait_seconds < 0:
            raise ConfigError("k8s.quota_wait_seconds: must be >= 0")
        if self.model_uri and not SHA256_PATTERN.fullmatch(self.model_sha256):
            raise ConfigError("k8s.model_sha256: must be the sha256 (64 lower-case hex) of the model's "
                              "SHA256SUMS when k8s.model_uri is set")
        if self.model_uri and not self.model_dir.startswith(MODELS_MOUNT + "/"):
            raise ConfigError(f"k8s.model_dir: {self.model_dir!r} is not under the synced models' volume "
                              f"({MODELS_MOUNT}/)")
        for name, ref in self.secret_env.items():
            if ref.count(":") != 1:
                raise ConfigError(f"k8s.secret_env.{name}: {ref!r} is not 'secret-name:key'")
        self._check_shapes()

    def _check_shapes(self) -> None:
        """Quantities, names, delays and maps in the shapes the API server takes (an error here names
        the setting; the API server would refuse the pod only when a run starts)."""
        for name in ("cpu", "memory", "model_volume_size", "shm_size"):
            value = getattr(self, name)
            if not (name == "shm_size" and value == "") and not QUANTITY_PATTERN.fullmatch(value):
                raise ConfigError(f"k8s.{name}: {value!r} is not a Kubernetes quantity (e.g. 4, 500m, 16Gi)")
        if not DNS_LABEL_PATTERN.fullmatch(self.namespace):
            raise ConfigError(f"k8s.namespace: {self.namespace!r} is not a DNS-1123 label (lower-case "
                              "letters, digits, '-', at most 63)")
        if not DNS_SUBDOMAIN_PATTERN.fullmatch(self.service_account) or len(self.service_account) > 253:
            raise ConfigError(f"k8s.service_account: {self.service_account!r} is not a DNS-1123 subdomain")
        for name in ("retry_delay_seconds", "max_retry_delay_seconds", "termination_grace_seconds"):
            if getattr(self, name) < 0:
                raise ConfigError(f"k8s.{name}: must be >= 0")
        if self.model_uri and posixpath.normpath(self.model_dir) != self.model_dir:
            raise ConfigError(f"k8s.model_dir: {self.model_dir!r} is not a normalized path (no '..', '//')")
        for name in ("node_selector", "env"):
            value = getattr(self, name)
            if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                      for k, v in value.items()):
                raise ConfigError(f"k8s.{name}: must be a JSON object of strings to strings")
        if not isinstance(self.tolerations, list) or not all(isinstance(t, dict) for t in self.tolerations):
            raise ConfigError("k8s.tolerations: must be a JSON list of objects (key, operator, value, effect)")

    def check_grace(self, worker: WorkerSettings) -> None:
        """Raise unless the pod's grace period exceeds the worker's flush grace (seconds)."""
        if self.termination_grace_seconds <= worker.grace_seconds:
            raise ConfigError(
                f"k8s.termination_grace_seconds: {self.termination_grace_seconds} s must exceed the "
                f"worker's grace_seconds ({worker.grace_seconds} s) or preempted pods lose their chunk"
            )

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> K8sSettings:
        """Settings from ``BATCH_K8S_*`` environment variables (JSON for dicts/lists), defaults elsewhere.

        Read at DAG-parse time, so they are deployment settings, not per-run Params.
        """
        env = os.environ if environ is None else environ
        kwargs: dict[str, Any] = {}
        simple = {"image": str, "namespace": str, "service_account": str, "gpus": int, "cpu": str,
                  "memory": str, "termination_grace_seconds": int, "retries": int,
                  "retry_delay_seconds": int, "max_retry_delay_seconds": int, "max_active_pods": int,
                  "startup_timeout_seconds": int, "max_preemptions": int, "quota_wait_seconds": int,
                  "shm_size": str, "model_uri": str, "model_sha256": str, "model_dir": str,
                  "model_volume_size": str}
        for name, conv in simple.items():
            raw = env.get(f"BATCH_K8S_{name.upper()}")
            if raw:
                try:
                    kwargs[name] = conv(raw)
                except ValueError:
                    raise ConfigError(f"BATCH_K8S_{name.upper()}: {raw!r} is not an integer") from None
        for name in ("node_selector", "tolerations", "secret_env", "env"):
            raw = env.get(f"BATCH_K8S_{name.upper()}")
            if raw:
                try:
                    kwargs[name] = json.loads(raw)
                except ValueError as exc:
                    raise ConfigError(f"BATCH_K8S_{name.upper()}: not valid JSON ({exc})") from None
        for name in ("prefer_spot", "host_network"):
            raw = env.get(f"BATCH_K8S_{name.upper()}", "").strip().lower()
            if raw:
                if raw not in ("1", "true", "yes", "0", "false", "no"):
                    raise ConfigError(f"BATCH_K8S_{name.upper()}: {raw!r} is not true/false (1/0, yes/no)")
                kwargs[name] = raw in ("1", "true", "yes")
        return cls(**kwargs)


def _resources(settings: K8sSettings):
    from kubernetes.client import models as k8s  # parse time: kubernetes runner only

    limits = {"memory": settings.memory}
    if settings.gpus:
        limits["nvidia.com/gpu"] = str(settings.gpus)
    return k8s.V1ResourceRequirements(requests={"cpu": settings.cpu, "memory": settings.memory},
                                      limits=limits)


def _affinity(settings: K8sSettings):
    from kubernetes.client import models as k8s  # parse time: kubernetes runner only

    if not settings.prefer_spot:
        return None
    term = k8s.V1NodeSelectorTerm(match_expressions=[k8s.V1NodeSelectorRequirement(
        key="cloud.google.com/gke-spot", operator="In", values=["true"])])
    return k8s.V1Affinity(node_affinity=k8s.V1NodeAffinity(
        preferred_during_scheduling_ignored_during_execution=[
            k8s.V1PreferredSchedulingTerm(weight=100, preference=term)]))


def _tolerations(settings: K8sSettings):
    from kubernetes.client import models as k8s  # parse time: kubernetes runner only

    return [k8s.V1Toleration(**t) for t in settings.tolerations]


def _secrets(settings: K8sSettings):
    from airflow.providers.cncf.kubernetes.secret import Secret  # parse time: kubernetes runner only

    out = []
    for env_name, ref in sorted(settings.secret_env.items()):
        secret, key = ref.split(":")
        out.append(Secret("env", env_name, secret, key))
    return out


def _secret_env_vars(settings: K8sSettings) -> list:
    """``secret_env`` as ``V1EnvVar``s with a ``secretKeyRef`` (for containers the provider's ``secrets``
    do not reach)."""
    from kubernetes.client import models as k8s  # parse time: kubernetes runner only

    return [k8s.V1EnvVar(name=name, value_from=k8s.V1EnvVarSource(
        secret_key_ref=k8s.V1SecretKeySelector(name=ref.split(":")[0], key=ref.split(":")[1])))
        for name, ref in sorted(settings.secret_env.items())]


POD_NAME_ENV = "POD_NAME"
"""The worker container's environment variable holding its pod's name (the downward API's
``metadata.name``): the worker records it as its attempt's ``host``. ``HOSTNAME`` is the pod's name only
in the pod's own UTS namespace; a ``hostNetwork`` pod has the node's."""


def _worker_env(settings: K8sSettings) -> list:
    """The worker container's plain environment (``settings.env`` and the offline/unbuffered switches) as
    ``V1EnvVar``s, plus :data:`POD_NAME_ENV` from the downward API."""
    from kubernetes.client import models as k8s  # parse time: kubernetes runner only

    plain = {**settings.env, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    return [*(k8s.V1EnvVar(name=k, value=v) for k, v in plain.items()),
            k8s.V1EnvVar(name=POD_NAME_ENV, value_from=k8s.V1EnvVarSource(
                field_ref=k8s.V1ObjectFieldSelector(field_path="metadata.name")))]


SHM_VOLUME = "dshm"
MODELS_VOLUME = "models"
MODELS_MOUNT = "/models/synced"
"""Where the synced weights' volume is mounted: beside, not over, weights baked into ``/models``."""
MODEL_SYNC_JITTER_SECONDS = 60
"""Spread of the init containers' sync starts (seconds; ``deploy/k8s/indexed-job.yaml``: 16 pods
starting together spread over a minute)."""


def _volumes(settings: K8sSettings) -> tuple[list, list]:
    """``(volumes, worker volume mounts)``: the memory-backed ``/dev/shm`` and the synced models' volume."""
    from kubernetes.client import models as k8s  # parse time: kubernetes runner only

    volumes, mounts = [], []
    if settings.shm_size:
        volumes.append(k8s.V1Volume(name=SHM_VOLUME, empty_dir=k8s.V1EmptyDirVolumeSource(
            medium="Memory", size_limit=settings.shm_size)))
        mounts.append(k8s.V1VolumeMount(name=SHM_VOLUME, mount_path="/dev/shm"))
    if settings.model_uri:
        volumes.append(k8s.V1Volume(name=MODELS_VOLUME, empty_dir=k8s.V1EmptyDirVolumeSource(
            size_limit=settings.model_volume_size)))
        mounts.append(k8s.V1VolumeMount(name=MODELS_VOLUME, mount_path=MODELS_MOUNT, read_only=True))
    return volumes, mounts


def _init_containers(settings: K8sSettings) -> list:
    """The ``model-sync`` init container when ``model_uri`` is set (the worker image's
    ``batch-worker-sync-model``: copy, verify against ``model_sha256``, then exit), else none.

    Its environment: the sync settings, the storage backends' plain settings found in ``env``
    (:func:`batch_contract.storage.config_env_names`) and every ``secret_env`` entry as a
    ``secretKeyRef`` (the provider attaches ``secrets`` to the worker container only, and the store's
    credentials are among them: ``AWS_SECRET_ACCESS_KEY``, ``AZURE_STORAGE_CONNECTION_STRING``)."""
    from kubernetes.client import models as k8s  # parse time: kubernetes runner only

    if not settings.model_uri:
        return []
    from batch_contract import storage  # pyarrow: only for a DAG whose pods sync a model

    env = {"MODEL_URI": settings.model_uri, "MODEL_SHA256": settings.model_sha256,
           "MODEL_DIR": settings.model_dir, "MODEL_SYNC_JITTER_SECONDS": str(MODEL_SYNC_JITTER_SECONDS),
           **{k: v for k, v in settings.env.items() if k in storage.config_env_names()}}
    return [k8s.V1Container(
        name="model-sync", image=settings.image, image_pull_policy="IfNotPresent",
        command=["tini", "--", "batch-worker-sync-model"],  # tini: SIGTERM reaches the bash script
        env=[k8s.V1EnvVar(name=k, value=v) for k, v in env.items()] + _secret_env_vars(settings),
        volume_mounts=[k8s.V1VolumeMount(name=MODELS_VOLUME, mount_path=MODELS_MOUNT)],
        resources=k8s.V1ResourceRequirements(requests={"cpu": "1", "memory": "2Gi"}, limits={"memory": "2Gi"}),
        security_context=k8s.V1SecurityContext(**{_snake(k): v for k, v in CONTAINER_SECURITY_CONTEXT.items()}),
    )]


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


WORKER_COMMAND = ("tini", "--", "batch-worker")
"""The worker container's command, the worker image's ``ENTRYPOINT``: ``tini`` as PID 1 forwards SIGTERM
(a deletion, an eviction) to the worker and reaps its children; a process that is PID 1 itself gets no
signal it has no handler for. Set explicitly so a pod runs it whatever the image's entrypoint."""

WORKER_UID = 10001
"""Numeric uid/gid of the ``worker`` user in ``worker_image/Dockerfile`` (``USER 10001:10001``)."""

POD_SECURITY_CONTEXT: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": WORKER_UID,
    "runAsGroup": WORKER_UID,
    "fsGroup": WORKER_UID,
    "seccompProfile": {"type": "RuntimeDefault"},
}
"""Pod security context of shard pods (Kubernetes "restricted" Pod Security Standard)."""

CONTAINER_SECURITY_CONTEXT: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}
"""Container security context of the worker (restricted profile; GPUs are exposed by the device plugin,
which needs no capabilities)."""


def kpo_partial_kwargs(settings: K8sSettings, worker: WorkerSettings | None = None) -> dict[str, Any]:
    """Kwargs shared by every shard pod, for ``ShardPodOperator.partial(task_id=..., **kwargs)``
    (``batch_inference.shard_pod``: a ``KubernetesPodOperator`` plus ``max_preemptions``).

    Args:
        settings: cluster settings.
        worker: the worker settings the manifest will carry (default: :class:`WorkerSettings`); used to
            check the termination grace.

    Raises:
        ConfigError: grace period too short.
    """
    settings.check_grace(worker or WorkerSettings())
    volumes, mounts = _volumes(settings)
    return {
        "name": "batch-worker",
        "namespace": settings.namespace,
        "image": settings.image,
        "image_pull_policy": "IfNotPresent",
        "cmds": list(WORKER_COMMAND),
        "service_account_name": settings.service_account,
        "container_resources": _resources(settings),
        "node_selector": dict(settings.node_selector),
        "tolerations": _tolerations(settings),
        "affinity": _affinity(settings),
        "secrets": _secrets(settings),
        "env_vars": _worker_env(settings),
        "security_context": dict(POD_SECURITY_CONTEXT),
        "container_security_context": dict(CONTAINER_SECURITY_CONTEXT),
        "termination_grace_period": settings.termination_grace_seconds,
        "startup_timeout_seconds": settings.startup_timeout_seconds,
        "on_finish_action": "delete_succeeded_pod",
        "deferrable": True,
        "get_logs": True,
        "do_xcom_push": False,
        "retries": settings.retries,
        "retry_delay": timedelta(seconds=settings.retry_delay_seconds),
        "retry_exponential_backoff": 2.0,
        "max_retry_delay": timedelta(seconds=settings.max_retry_delay_seconds),
        "max_active_tis_per_dagrun": settings.max_active_pods,
        "max_preemptions": settings.max_preemptions,
        "quota_wait_seconds": settings.quota_wait_seconds,
        "hostnetwork": settings.host_network,
        "volumes": volumes,
        "volume_mounts": mounts,
        "init_containers": _init_containers(settings),
    }


def worker_arguments(run_dir: str, shard_id: str) -> list[str]:
    """Arguments of the worker command for one shard: ``run --run-dir <run_dir> --shard <id>``."""
    return ["run", "--run-dir", run_dir, "--shard", shard_id]


def kpo_expand_kwargs(ref: dict[str, Any], run_id: str) -> dict[str, Any]:
    """Per-shard kwargs for ``.expand_kwargs``: worker arguments and identity labels (plus the shard's
    row count, which names the mapped task in the UI: ``dag_factory.K8S_SHARD_LABEL``).

    Args:
        ref: a planner shard ref (``run_dir``, ``shard_id``, ``rows``).
        run_id: the Airflow run id (sanitised into a label value).
    """
    labels = {
        "app.kubernetes.io/name": "batch-worker",
        "app.kubernetes.io/part-of": "batch-inference",
        "batch-inference/run-id": label_value(run_id),
        "batch-inference/shard-id": ref["shard_id"],
        "batch-inference/rows": str(int(ref.get("rows", 0))),
    }
    if int(ref.get("preprocess_workers") or 0) > 0:
        labels[PREPROCESS_LABEL] = str(int(ref["preprocess_workers"]))
    return {"arguments": worker_arguments(ref["run_dir"], ref["shard_id"]), "labels": labels}


PREPROCESS_LABEL = "batch-inference/preprocess-workers"
"""Label of a shard pod whose input points at documents: the extraction processes its worker runs
(the plan's ``preprocess_workers`` of the shard ref). :func:`with_preprocess_cpus` adds that many CPUs
to the container's request and tells the worker the pool size (``BATCH_PREPROCESS_WORKERS``)."""
PREPROCESS_WORKERS_ENV = POOL_WORKERS_ENV


def _cpu_millis(quantity: str) -> int:
    """Millicores of a Kubernetes CPU quantity (``"4"``, ``"500m"``, ``"1.5"``).

    Raises:
        ConfigError: not a CPU quantity.
    """
    text = str(quantity).strip()
    try:
        return int(text[:-1]) if text.endswith("m") else round(float(text) * 1000)
    except ValueError:
        raise ConfigError(f"cpu: {quantity!r} is not a Kubernetes CPU quantity") from None


def with_preprocess_cpus(pod: Any) -> Any:
    """``pod`` (a ``V1Pod``) with the CPUs its document extraction pool needs: when the pod carries
    :data:`PREPROCESS_LABEL` = N, the worker container's CPU request grows by N cores (the engine's own
    request stays: the pool runs beside it) and the container gets ``BATCH_PREPROCESS_WORKERS=N``. Other
    pods are returned unchanged.

    Raises:
        ConfigError: the container's CPU request is not a quantity.
    """
    from kubernetes.client import models as k8s  # parse time: kubernetes runner only

    workers = int((pod.metadata.labels or {}).get(PREPROCESS_LABEL) or 0)
    if workers <= 0:
        return pod
    for container in pod.spec.containers:
        if container.name != "base":
            continue
        resources = container.resources or k8s.V1ResourceRequirements()
        requests = dict(resources.requests or {})
        millis = _cpu_millis(requests.get("cpu", "0")) + workers * 1000
        requests["cpu"] = f"{millis}m" if millis % 1000 else str(millis // 1000)
        resources.requests = requests
        container.resources = resources
        env = [e for e in (container.env or []) if e.name != PREPROCESS_WORKERS_ENV]
        container.env = [*env, k8s.V1EnvVar(name=PREPROCESS_WORKERS_ENV, value=str(workers))]
    return pod


CANARY_POD_NAME = "batch-worker-canary"
"""Name prefix of the canary pod (the provider adds a random suffix)."""
ROLE_LABEL = "batch-inference/role"
"""Label of the canary pod (``canary``); shard pods are told apart by ``batch-inference/shard-id``."""


def canary_pod_kwargs(settings: K8sSettings, worker: WorkerSettings | None = None) -> dict[str, Any]:
    """Kwargs of the canary pod task (``canary_pod.CanaryPodOperator``): the shard pods' kwargs
    (:func:`kpo_partial_kwargs`: image, resources, GPU node pool placement, env, security context,
    retries, ``max_preemptions``) with the pod named :data:`CANARY_POD_NAME`; one task, so no
    ``max_active_tis_per_dagrun``. The command is set when the task runs (:func:`canary_command`).

    Raises:
        ConfigError: grace period too short.
    """
    kwargs = kpo_partial_kwargs(settings, worker)
    kwargs.pop("max_active_tis_per_dagrun")
    kwargs["name"] = CANARY_POD_NAME
    return kwargs


def canary_command(run_dir: str, run_id: str, options: list[str]) -> dict[str, Any]:
    """The canary pod's worker arguments (``canary --run-dir <run_dir> <options>``) and labels (the
    shard pods' identity labels with :data:`ROLE_LABEL` ``canary`` instead of a shard id).

    Args:
        run_dir: ``<output_root>/runs/<run_id>``.
        run_id: the Airflow run id (sanitised into a label value).
        options: ``batch-worker canary`` options (``canary_task.canary_options``).
    """
    return {
        "arguments": ["canary", "--run-dir", run_dir, *options],
        "labels": {
            "app.kubernetes.io/name": "batch-worker",
            "app.kubernetes.io/part-of": "batch-inference",
            "batch-inference/run-id": label_value(run_id),
            ROLE_LABEL: "canary",
        },
    }


def shard_of(arguments: list[str] | None) -> tuple[str, str] | None:
    """``(run_dir, shard_id)`` of a shard worker command (:func:`worker_arguments`), or ``None`` for any
    other command (the canary's)."""
    args = list(arguments or [])
    if not args or args[0] != "run" or "--run-dir" not in args or "--shard" not in args:
        return None
    try:
        return args[args.index("--run-dir") + 1], args[args.index("--shard") + 1]
    except IndexError:
        return None
