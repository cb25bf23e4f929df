"""The deployment smoke DAG: built only with the kubernetes runner, one pod with the shard pods' spec
running ``batch-worker smoke`` on the validated output root."""

from __future__ import annotations

import pytest
from batch_contract.engine_config import ConfigError
from batch_inference.pod_spec import K8sSettings, kpo_partial_kwargs
from test_dag_integrity import _bag

IMAGE = "europe-docker.pkg.dev/acme/ml/batch-worker@sha256:" + "ab" * 32


@pytest.fixture(scope="module")
def smoke_bag():
    return _bag(BATCH_INFERENCE_RUNNERS="local,kubernetes", BATCH_K8S_IMAGE=IMAGE, BATCH_K8S_SHM_SIZE="4Gi")


def test_the_smoke_dag_is_one_check_then_one_pod_with_the_shard_pods_spec(smoke_bag) -> None:
    assert smoke_bag.import_errors == {}
    dag = smoke_bag.dags["batch_inference_smoke"]
    assert {t.task_id for t in dag.tasks} == {"check_settings", "smoke_pod"}
    pod = dag.get_task("smoke_pod")
    assert pod.upstream_task_ids == {"check_settings"} and pod.deferrable
    assert pod.arguments == ["smoke", "--output-root", "{{ ti.xcom_pull(task_ids='check_settings') }}",
                             "--gpu", "{{ params.gpu }}"]
    shard = kpo_partial_kwargs(K8sSettings.from_env({"BATCH_K8S_IMAGE": IMAGE, "BATCH_K8S_SHM_SIZE": "4Gi"}))
    assert pod.image == IMAGE and pod.node_selector == shard["node_selector"]
    assert pod.tolerations == shard["tolerations"] and pod.service_account_name == shard["service_account_name"]
    assert pod.container_resources == shard["container_resources"]
    assert [v.empty_dir.size_limit for v in pod.volumes] == ["4Gi"]
    assert "batch-inference" not in dag.tags            # the UI page lists the batch DAGs' runs only


def test_no_smoke_dag_without_the_kubernetes_runner() -> None:
    bag = _bag(BATCH_INFERENCE_RUNNERS="local")
    assert bag.import_errors == {} and "batch_inference_smoke" not in bag.dag_ids


def test_the_output_root_must_be_under_the_dags_output_roots(tmp_path, monkeypatch) -> None:
    from batch_inference.smoke_dag import check_output_root

    monkeypatch.setenv("BATCH_INFERENCE_ALLOWED_ROOTS", str(tmp_path / "allowed"))
    monkeypatch.delenv("BATCH_INFERENCE_POLICY", raising=False)
    assert check_output_root(str(tmp_path / "allowed" / "out")) == str(tmp_path / "allowed" / "out")
    for outside in (str(tmp_path / "other"), "gs://someone-elses-bucket/x", str(tmp_path / "allowed" / ".." / "x")):
        with pytest.raises(ConfigError, match="params.output_root"):
            check_output_root(outside)
