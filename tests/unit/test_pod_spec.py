"""Pod spec: the provider renders one pod per shard offline; every manifest passes the k8s schema."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from batch_contract.engine_config import ConfigError, WorkerSettings
from batch_inference.pod_spec import (
    K8sSettings,
    kpo_expand_kwargs,
    kpo_partial_kwargs,
    label_value,
)
from batch_inference.shard_pod import render_pod_manifests

IMAGE = "europe-docker.pkg.dev/acme/ml/batch-worker@sha256:" + "ab" * 32
RUN_ID = "manual__2026-11-30T02:43:00.123456+00:00"


def _refs(n: int) -> list[dict]:
    return [{"run_dir": f"gs://bucket/out/runs/{RUN_ID}", "shard_id": f"{i:05d}", "rows": 10, "est_tokens": 100}
            for i in range(n)]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    settings = K8sSettings(image=IMAGE, secret_env={"WANDB_API_KEY": "wandb:api-key"})
    out = tmp_path_factory.mktemp("k8s")
    paths = render_pod_manifests(_refs(3), RUN_ID, settings, str(out))
    assert [Path(p).name for p in paths] == [f"{label_value(RUN_ID)}-{i:05d}.yaml" for i in range(3)]
    return [yaml.safe_load(Path(p).read_text()) for p in paths]


def test_three_shard_manifests_pass_the_kubernetes_schema(rendered: list[dict]) -> None:
    assert len(rendered) == 3
    for pod in rendered:
        kubernetes_validate.validate(pod, "1.33", strict=True)


def test_manifest_carries_gpu_spot_identity_and_command(rendered: list[dict]) -> None:
    for i, pod in enumerate(rendered):
        spec, container = pod["spec"], pod["spec"]["containers"][0]
        assert container["image"] == IMAGE
        assert container["command"] == ["tini", "--", "batch-worker"]
        assert container["args"] == ["run", "--run-dir", f"gs://bucket/out/runs/{RUN_ID}", "--shard", f"{i:05d}"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert spec["nodeSelector"]["cloud.google.com/gke-spot"] == "true"
        assert {t["key"] for t in spec["tolerations"]} == {"nvidia.com/gpu", "cloud.google.com/gke-spot"}
        assert spec["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        assert spec["terminationGracePeriodSeconds"] > WorkerSettings().grace_seconds
        assert spec["serviceAccountName"] == "batch-worker" and pod["metadata"]["namespace"] == "batch-inference"
        labels = pod["metadata"]["labels"]
        assert labels["batch-inference/shard-id"] == f"{i:05d}"
        assert labels["batch-inference/run-id"] == label_value(RUN_ID)
        env = {e["name"]: e for e in container["env"]}
        assert env["WANDB_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "wandb", "key": "api-key"}
        assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"  # the attempt's host
        assert env["HF_HUB_OFFLINE"]["value"] == "1"


def test_pods_run_as_the_images_non_root_user_with_no_capabilities(rendered: list[dict]) -> None:
    dockerfile = (Path(__file__).resolve().parents[2] / "worker_image" / "Dockerfile").read_text()
    assert "USER 10001:10001" in dockerfile
    for pod in rendered:
        sec, container = pod["spec"]["securityContext"], pod["spec"]["containers"][0]
        assert sec["runAsNonRoot"] is True and sec["runAsUser"] == sec["runAsGroup"] == 10001
        assert sec["seccompProfile"] == {"type": "RuntimeDefault"}
        assert container["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def test_partial_kwargs_retry_and_lifecycle() -> None:
    kw = kpo_partial_kwargs(K8sSettings(image=IMAGE))
    assert kw["deferrable"] is True and kw["on_finish_action"] == "delete_succeeded_pod"
    assert kw["retries"] >= 2 and kw["retry_exponential_backoff"]
    assert kw["max_active_tis_per_dagrun"] == 16 and kw["do_xcom_push"] is False
    exp = kpo_expand_kwargs(_refs(1)[0], RUN_ID)
    assert set(exp) == {"arguments", "labels"}


def test_label_value_is_a_valid_label() -> None:
    value = label_value(RUN_ID)
    assert len(value) <= 63 and ":" not in value and "+" not in value
    assert label_value("x" * 100) == "x" * 63


def test_settings_reject_unpinned_image_and_short_grace() -> None:
    with pytest.raises(ConfigError, match="k8s.image: .* not pinned by digest"):
        K8sSettings(image="repo/batch-worker:latest")
    with pytest.raises(ConfigError, match="k8s.termination_grace_seconds"):
        kpo_partial_kwargs(K8sSettings(image=IMAGE, termination_grace_seconds=20))
    with pytest.raises(ConfigError, match="k8s.retries"):
        K8sSettings(image=IMAGE, retries=1)
    with pytest.raises(ConfigError, match="k8s.secret_env.X"):
        K8sSettings(image=IMAGE, secret_env={"X": "no-key"})


def test_settings_from_env() -> None:
    env = {"BATCH_K8S_IMAGE": IMAGE, "BATCH_K8S_GPUS": "2", "BATCH_K8S_NODE_SELECTOR": '{"pool": "a100-spot"}',
           "BATCH_K8S_PREFER_SPOT": "false"}
    settings = K8sSettings.from_env(env)
    assert settings.gpus == 2 and settings.node_selector == {"pool": "a100-spot"} and not settings.prefer_spot


def _render(tmp_path: Path, settings: K8sSettings) -> dict:
    paths = render_pod_manifests(_refs(1), RUN_ID, settings, str(tmp_path))
    pod = yaml.safe_load(Path(paths[0]).read_text())
    kubernetes_validate.validate(pod, "1.33", strict=True)
    return pod


@pytest.mark.parametrize("shm", ["8Gi", "512Mi", ""])
def test_dev_shm_is_a_memory_volume_of_the_set_size_or_none(tmp_path: Path, shm: str) -> None:
    pod = _render(tmp_path, K8sSettings(image=IMAGE, shm_size=shm))
    volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
    mounts = {m["mountPath"]: m for m in pod["spec"]["containers"][0].get("volumeMounts", [])}
    if shm:
        assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": shm}
        assert mounts["/dev/shm"]["name"] == "dshm"
    else:
        assert "dshm" not in volumes and "/dev/shm" not in mounts
    assert not pod["spec"].get("initContainers") and "models" not in volumes   # no model_uri: baked weights


def test_a_model_uri_adds_the_sync_init_container_and_a_read_only_mount(tmp_path: Path) -> None:
    settings = K8sSettings(image=IMAGE, model_uri="gs://models/minilm/rev-1", model_sha256="c" * 64,
                           env={"GOOGLE_CLOUD_PROJECT": "p", "OTHER": "x"})
    pod = _render(tmp_path, settings)
    (init,) = pod["spec"]["initContainers"]
    env = {e["name"]: e["value"] for e in init["env"]}
    assert init["image"] == IMAGE and init["command"] == ["tini", "--", "batch-worker-sync-model"]
    assert env["MODEL_URI"] == settings.model_uri and env["MODEL_SHA256"] == "c" * 64
    assert env["MODEL_DIR"] == settings.model_dir and env["GOOGLE_CLOUD_PROJECT"] == "p" and "OTHER" not in env
    assert init["volumeMounts"] == [{"name": "models", "mountPath": "/models/synced"}]
    assert init["securityContext"]["allowPrivilegeEscalation"] is False
    worker_mounts = {m["name"]: m for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert worker_mounts["models"] == {"name": "models", "mountPath": "/models/synced", "readOnly": True}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["models"]["emptyDir"] == {"sizeLimit": "40Gi"}


@pytest.mark.parametrize("model_uri", ["s3://models/minilm/rev-1", "az://models/minilm/rev-1"])
def test_the_sync_init_container_gets_every_schemes_plain_settings_and_the_secret_refs(
        tmp_path: Path, model_uri: str) -> None:
    from batch_contract import storage

    plain = {"AWS_REGION": "eu-west-1", "AWS_ENDPOINT_URL": "http://minio:9000",
             "AZURE_STORAGE_ACCOUNT_NAME": "acct", "STORAGE_EMULATOR_HOST": "http://gcs:4443"}
    secret_env = {"AWS_ACCESS_KEY_ID": "s3-creds:id", "AWS_SECRET_ACCESS_KEY": "s3-creds:secret",
                  "AZURE_STORAGE_CONNECTION_STRING": "az-creds:connection-string"}
    settings = K8sSettings(image=IMAGE, model_uri=model_uri, model_sha256="c" * 64, secret_env=secret_env,
                           env={**plain, "AWS_SESSION_TOKEN": "plain-env-is-not-for-secrets"})
    pod = _render(tmp_path, settings)["spec"]
    (init,) = pod["initContainers"]
    env = {e["name"]: e.get("value") for e in init["env"]}
    assert {k: env[k] for k in plain} == plain and env["MODEL_URI"] == model_uri
    assert "AWS_SESSION_TOKEN" not in env  # only the backends' plain settings are copied from env
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in init["env"] if "valueFrom" in e}
    assert refs == {name: {"name": ref.split(":")[0], "key": ref.split(":")[1]} for name, ref in secret_env.items()}
    assert not any("value" in e for e in init["env"] if e["name"] in secret_env)  # never the secret's bytes
    (worker,) = pod["containers"]
    assert {e["name"] for e in worker["env"] if "valueFrom" in e} >= set(secret_env)  # same secrets as the worker
    assert set(plain) <= set(storage.config_env_names())


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"model_uri": "gs://m/x"}, "model_sha256"),
    ({"model_uri": "gs://m/x", "model_sha256": "C" * 64}, "model_sha256"),
    ({"model_uri": "gs://m/x", "model_sha256": "c" * 64, "model_dir": "/models/model"}, "model_dir"),
    ({"quota_wait_seconds": -1}, "quota_wait_seconds")])
def test_bad_model_sync_and_quota_settings_are_refused(kwargs: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=rf"k8s\.{field}"):
        K8sSettings(image=IMAGE, **kwargs)


def test_pod_settings_from_env_reach_the_operator() -> None:
    env = {"BATCH_K8S_IMAGE": IMAGE, "BATCH_K8S_SHM_SIZE": "2Gi", "BATCH_K8S_QUOTA_WAIT_SECONDS": "120",
           "BATCH_K8S_MODEL_URI": "gs://m/x", "BATCH_K8S_MODEL_SHA256": "d" * 64}
    settings = K8sSettings.from_env(env)
    kw = kpo_partial_kwargs(settings)
    assert kw["quota_wait_seconds"] == 120 and kw["volumes"][0].empty_dir.size_limit == "2Gi"
    assert kw["init_containers"][0].env[0].value == "gs://m/x"


@pytest.mark.parametrize(("env", "message"), [
    ({"BATCH_K8S_SHM_SIZE": "lots"}, r"k8s\.shm_size: 'lots' is not a Kubernetes quantity"),
    ({"BATCH_K8S_SHM_SIZE": "8GB"}, r"k8s\.shm_size"),
    ({"BATCH_K8S_MEMORY": "16 GB"}, r"k8s\.memory"),
    ({"BATCH_K8S_CPU": "four"}, r"k8s\.cpu"),
    ({"BATCH_K8S_MODEL_VOLUME_SIZE": "-1Gi"}, r"k8s\.model_volume_size"),
    ({"BATCH_K8S_NAMESPACE": "Bad_NS"}, r"k8s\.namespace: 'Bad_NS' is not a DNS-1123 label"),
    ({"BATCH_K8S_SERVICE_ACCOUNT": "Worker"}, r"k8s\.service_account"),
    ({"BATCH_K8S_RETRY_DELAY_SECONDS": "-5"}, r"k8s\.retry_delay_seconds: must be >= 0"),
    ({"BATCH_K8S_QUOTA_WAIT_SECONDS": "1h"}, r"BATCH_K8S_QUOTA_WAIT_SECONDS: '1h' is not an integer"),
    ({"BATCH_K8S_NODE_SELECTOR": "{bad"}, r"BATCH_K8S_NODE_SELECTOR: not valid JSON"),
    ({"BATCH_K8S_NODE_SELECTOR": '["a"]'}, r"k8s\.node_selector: must be a JSON object of strings"),
    ({"BATCH_K8S_ENV": '{"A": 1}'}, r"k8s\.env: must be a JSON object of strings"),
    ({"BATCH_K8S_TOLERATIONS": '{"key": "x"}'}, r"k8s\.tolerations: must be a JSON list of objects"),
    ({"BATCH_K8S_PREFER_SPOT": "flase"}, r"BATCH_K8S_PREFER_SPOT: 'flase' is not true/false"),
    ({"BATCH_K8S_MODEL_URI": "gs://m/x", "BATCH_K8S_MODEL_SHA256": "c" * 64,
      "BATCH_K8S_MODEL_DIR": "/models/synced/../../etc"}, r"k8s\.model_dir"),
])
def test_a_bad_setting_is_refused_naming_it(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        K8sSettings.from_env({"BATCH_K8S_IMAGE": IMAGE, **env})


@pytest.mark.parametrize("quantity", ["4", "500m", "0.5", "16Gi", "512Mi", "8G", "100k"])
def test_kubernetes_quantities_are_accepted(quantity: str) -> None:
    settings = K8sSettings(image=IMAGE, cpu=quantity, memory=quantity, shm_size=quantity)
    assert settings.cpu == settings.memory == settings.shm_size == quantity
