"""``deploy/helm/values-gke.yaml`` against the official Apache Airflow Helm chart, with no cluster and no
``helm`` binary.

* The chart's own parameter schema is vendored (``deploy/helm/chart-values.schema.json``, chart 1.22.0,
  see ``deploy/helm/README.md``): the values validate against it (types, enums, patterns, and
  ``additionalProperties: false`` where the chart sets it), and every key path they set is walked down
  the schema's ``properties``, so a misspelt key fails even inside the objects the chart leaves open.
* The image the values name is the one ``deploy/airflow/Dockerfile`` builds: same Airflow version, and
  that image holds the DAGs and the plugins folder where the chart's Airflow looks for them (its build
  context: ``deploy/airflow/Dockerfile.dockerignore``).
* The project settings in ``env`` are the names the code reads (recorded while ``K8sSettings.from_env``,
  the runners, the storage roots and the policy read them), and their values parse.
"""

from __future__ import annotations

import copy
import importlib
import json
import re
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from dockerignore import ignore_rules, in_context

REPO = Path(__file__).resolve().parents[2]
HELM_DIR = REPO / "deploy" / "helm"
SCHEMA_FILE = HELM_DIR / "chart-values.schema.json"
VALUES_FILE = HELM_DIR / "values-gke.yaml"
AIRFLOW_DOCKERFILE = REPO / "deploy" / "airflow" / "Dockerfile"
AIRFLOW_DOCKERIGNORE = REPO / "deploy" / "airflow" / "Dockerfile.dockerignore"
CHART_VERSION = "1.22.0"
# Where the official image (AIRFLOW_HOME=/opt/airflow) and the chart (airflowHome, dags.mountPath unset)
# look for DAG files and plugins; batch_inference.locations.REPO_ROOT is then /opt/airflow.
AIRFLOW_HOME = "/opt/airflow"


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    data = json.loads(SCHEMA_FILE.read_text())
    jsonschema.Draft7Validator.check_schema(data)
    return data


@pytest.fixture(scope="module")
def validator(schema: dict[str, Any]) -> jsonschema.Draft7Validator:
    assert schema["$schema"].startswith("http://json-schema.org/draft-07/")
    return jsonschema.Draft7Validator(schema)


@pytest.fixture(scope="module")
def values() -> dict[str, Any]:
    return yaml.safe_load(VALUES_FILE.read_text())


def _errors(validator: jsonschema.Draft7Validator, doc: Any) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in validator.iter_errors(doc)]


def _resolve(node: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """``node`` with local ``$ref``s (``#/definitions/...``) followed."""
    while "$ref" in node:
        ref = node["$ref"]
        assert ref.startswith("#/"), ref
        target: Any = schema
        for part in ref[2:].split("/"):
            target = target[part]
        node = target
    return node


def _alternatives(node: dict[str, Any], schema: dict[str, Any]) -> list[dict[str, Any]]:
    node = _resolve(node, schema)
    alts = [node]
    for key in ("anyOf", "oneOf", "allOf"):
        for alt in node.get(key, []):
            alts += _alternatives(alt, schema)
    return alts


def unknown_key_paths(value: Any, node: dict[str, Any], schema: dict[str, Any], path: str = "") -> list[str]:
    """Key paths of ``value`` that the schema ``node`` does not declare.

    A mapping's key must be one of the node's ``properties`` (of any ``anyOf``/``oneOf``/``allOf``
    branch), unless the node declares ``additionalProperties`` as a schema: a free-form map whose keys
    are the user's (annotations, ``nodeSelector``, ``config``), whose values are walked against that
    schema. A list's items are walked against ``items``.
    """
    alts = _alternatives(node, schema)
    out: list[str] = []
    if isinstance(value, Mapping):
        for key, sub in value.items():
            where = f"{path}.{key}" if path else str(key)
            declared = [a["properties"][key] for a in alts if key in a.get("properties", {})]
            free = [a["additionalProperties"] for a in alts if isinstance(a.get("additionalProperties"), dict)]
            if declared:
                out += unknown_key_paths(sub, declared[0], schema, where)
            elif free:
                out += unknown_key_paths(sub, free[0], schema, where)
            else:
                out.append(where)
    elif isinstance(value, list):
        items = [a["items"] for a in alts if isinstance(a.get("items"), dict)]
        if items:
            for i, item in enumerate(value):
                out += unknown_key_paths(item, items[0], schema, f"{path}[{i}]")
    return out


# --------------------------------------------------------------------------- the vendored chart schema


def test_vendored_schema_is_the_chart_release_the_readme_names(schema: dict[str, Any]) -> None:
    readme = (HELM_DIR / "README.md").read_text()
    assert f"chart {CHART_VERSION}" in readme.lower() or f"chart version {CHART_VERSION}" in readme.lower()
    assert "Apache-2.0" in readme or "Apache License, Version 2.0" in readme
    # Chart 1.22.0 is the Airflow 3 chart: it defaults to Airflow 3.2.2 and has the API server.
    assert schema["properties"]["defaultAirflowTag"]["default"] == "3.2.2"
    assert "apiServer" in schema["properties"] and "kubernetes" in schema["properties"]["workers"]["properties"]


# --------------------------------------------------------------------------- values-gke.yaml against it


def test_values_validate_against_the_chart_schema(values: dict[str, Any], validator) -> None:
    assert _errors(validator, values) == []


def test_every_key_the_values_set_exists_in_the_chart(values: dict[str, Any], schema: dict[str, Any]) -> None:
    assert unknown_key_paths(values, schema, schema) == []
    # The walk reaches nested keys, maps and lists (it would see a mistake there).
    assert unknown_key_paths({"workers": {"kubernetes": {"serviceAccount": {"annotations": {"a/b": "c"}}}},
                              "env": [{"name": "A", "value": "b"}]}, schema, schema) == []


def test_a_misspelt_key_is_rejected(values: dict[str, Any], schema: dict[str, Any], validator) -> None:
    # Where the chart sets additionalProperties: false, the schema itself (and so helm) refuses it.
    strict = copy.deepcopy(values)
    strict["images"]["airflow"]["tga"] = strict["images"]["airflow"].pop("tag")
    assert any(e.startswith("images.airflow:") and "'tga'" in e for e in _errors(validator, strict))
    assert unknown_key_paths(strict, schema, schema) == ["images.airflow.tga"]

    # The top level and workers.kubernetes leave additionalProperties open: only the key walk sees these.
    top = copy.deepcopy(values)
    top["executer"] = top.pop("executor")
    assert _errors(validator, top) == []
    assert unknown_key_paths(top, schema, schema) == ["executer"]

    nested = copy.deepcopy(values)
    nested["workers"]["kubernetes"]["serviceAcount"] = nested["workers"]["kubernetes"].pop("serviceAccount")
    assert _errors(validator, nested) == []
    assert unknown_key_paths(nested, schema, schema) == ["workers.kubernetes.serviceAcount"]

    env = copy.deepcopy(values)
    env["env"][0]["valeu"] = env["env"][0].pop("value")
    assert _errors(validator, env), "an env entry without value must fail"
    assert unknown_key_paths(env, schema, schema) == ["env[0].valeu"]


def test_a_wrong_type_is_rejected(values: dict[str, Any], validator) -> None:
    broken = copy.deepcopy(values)
    broken["dags"]["gitSync"]["enabled"] = "false"
    assert any(e.startswith("dags.gitSync.enabled:") for e in _errors(validator, broken))
    broken = copy.deepcopy(values)
    broken["executor"] = "Kubernetes"
    assert any(e.startswith("executor:") for e in _errors(validator, broken))


def test_the_deployment_shape(values: dict[str, Any]) -> None:
    assert values["executor"] == "KubernetesExecutor"
    assert values["dags"]["gitSync"]["enabled"] is False and values["dags"]["persistence"]["enabled"] is False
    assert values["postgresql"]["enabled"] is False and values["data"]["metadataSecretName"]
    assert values["triggerer"]["enabled"] is True and values["apiServer"]["enabled"] is True
    assert values["nodeSelector"], "the Airflow pods go to the Airflow node pool"
    wi = "iam.gke.io/gcp-service-account"
    accounts = {"workers.kubernetes": values["workers"]["kubernetes"]["serviceAccount"],
                **{name: values[name]["serviceAccount"] for name in ("triggerer", "apiServer", "scheduler")}}
    for name, account in accounts.items():
        assert account["annotations"][wi].endswith(".iam.gserviceaccount.com"), name
    # deploy/k8s/rbac.yaml binds airflow/airflow-worker (and airflow/airflow-triggerer, the chart's name for
    # release "airflow"): the task pods that create the shard pods run as that account.
    rbac = [d for d in yaml.safe_load_all((REPO / "deploy" / "k8s" / "rbac.yaml").read_text())
            if d and d["kind"] == "RoleBinding"]
    subjects = {(s["namespace"], s["name"]) for d in rbac for s in d["subjects"] if s["kind"] == "ServiceAccount"}
    assert ("airflow", values["workers"]["kubernetes"]["serviceAccount"]["name"]) in subjects
    # Secrets only by reference: no password or key in the file.
    text = VALUES_FILE.read_text()
    assert not re.search(r"(?im)^\s*(password|fernetKey|jwtSecret|apiSecretKey|webserverSecretKey)\s*:", text)


# --------------------------------------------------------------------------- the image the values name


def _dockerfile_args() -> dict[str, str]:
    text = re.sub(r"\\\n", " ", AIRFLOW_DOCKERFILE.read_text())
    return {m.group(1): m.group(2).strip('"') for m in re.finditer(r"(?m)^ARG (\w+)=(\S+)", text)}


def test_values_run_the_airflow_version_the_image_pins(values: dict[str, Any]) -> None:
    args = _dockerfile_args()
    version = args["AIRFLOW_VERSION"]
    assert args["AIRFLOW_IMAGE"] == f"apache/airflow:{version}"
    assert values["airflowVersion"] == version == values["defaultAirflowTag"]
    image, pod = values["images"]["airflow"], values["images"]["pod_template"]
    assert image["tag"] == version or image["tag"].startswith(f"{version}-"), image["tag"]
    assert (pod["repository"], pod["tag"]) == (image["repository"], image["tag"])
    assert image["repository"].endswith("/batch-inference/airflow")
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["airflow"]
    assert f"apache-airflow=={version}" in extra


def test_image_holds_the_dags_and_plugins_where_the_chart_looks() -> None:
    text = AIRFLOW_DOCKERFILE.read_text()
    copies = {tuple(m.groups()) for m in re.finditer(r"(?m)^COPY (?:--\S+ )*(\S+) (\S+)$", text)}
    assert copies == {("dags/", f"{AIRFLOW_HOME}/dags/"), ("plugins/", f"{AIRFLOW_HOME}/plugins/")}
    assert re.search(rf"(?m)^ENV PYTHONPATH={AIRFLOW_HOME}/plugins$", text)
    users = re.findall(r"(?m)^USER (\S+)$", text)
    assert users and users[-1].split(":")[0] not in {"0", "root"}
    assert not re.search(r"(?i)\b(torch|vllm)\b", "\n".join(line for line in text.splitlines()
                                                           if not line.lstrip().startswith("#")))
    # pyiceberg (Iceberg publish) at the version the root pyproject pins exactly.
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["airflow"]
    (pin,) = [r for r in extra if r.startswith("pyiceberg")]
    assert f'"{pin}"' in text


def _files(root: Path) -> Iterator[str]:
    for p in root.rglob("*"):
        if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith(".pyc"):
            yield str(p.relative_to(REPO))


def test_airflow_image_build_context_sends_dags_and_plugins_and_nothing_else() -> None:
    # The root .dockerignore is the worker image's allow-list (it keeps dags/ and batch_inference out, a
    # test of test_deploy_artifacts.py); BuildKit reads deploy/airflow/Dockerfile.dockerignore instead.
    rules = ignore_rules(AIRFLOW_DOCKERIGNORE)
    wanted = [*_files(REPO / "dags"), *_files(REPO / "plugins")]
    assert "plugins/batch_inference/ui/templates" in "\n".join(wanted)
    assert "plugins/.airflowignore" in wanted and "plugins/batch_inference_ui.py" in wanted
    missing = [p for p in wanted if not in_context(p, rules)]
    assert not missing, f"Dockerfile.dockerignore drops files the Airflow image needs: {missing}"
    unwanted = [".venv/bin/python", ".git/HEAD", ".env", "data/sample/debian_descriptions_sample.parquet",
                "worker_image/batch_worker/cli.py", "tests/conftest.py", "output/runs/r/manifest.json",
                "airflow_home/airflow.cfg", "build/x.whl", "plugins/batch_inference/__pycache__/x.pyc"]
    sent = [p for p in unwanted if in_context(p, rules)]
    assert not sent, f"Dockerfile.dockerignore lets these into the build context: {sent}"


# --------------------------------------------------------------------------- the project's settings in env


class _Recorder(dict):
    """A mapping that records every key read through it."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.read: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.read.add(str(key))
        return super().__contains__(key)


def _env(values: dict[str, Any], component: str | None = None) -> dict[str, str]:
    env = {e["name"]: e["value"] for e in values["env"]}
    if component:
        env.update({e["name"]: e["value"] for e in values[component].get("env", [])})
    return env


def test_env_names_are_what_the_code_reads_and_their_values_parse(values: dict[str, Any]) -> None:
    from batch_contract import gcs
    from batch_inference import dag_factory, locations, policy
    from batch_inference.pod_spec import DIGEST_PATTERN, K8sSettings

    env = _env(values)
    recorder = _Recorder(env)
    settings = K8sSettings.from_env(recorder)
    runners = dag_factory.enabled_runners(recorder)
    nightly = dag_factory.nightly_root(recorder)
    bounds = policy.policy_for("batch_inference_backfill", recorder)
    roots = locations.allowed_roots(recorder)
    read = recorder.read | {gcs.PROJECT_ENV, gcs.EMULATOR_ENV, gcs.CREDENTIALS_JSON_ENV}
    project = {name for name in env if not name.startswith("AIRFLOW_")}
    assert project - read == set(), f"set in values-gke.yaml but read by no code: {sorted(project - read)}"

    assert DIGEST_PATTERN.match(settings.image)
    assert settings.namespace == env["BATCH_K8S_NAMESPACE"] and settings.service_account == "batch-worker"
    assert settings.env == {gcs.PROJECT_ENV: env[gcs.PROJECT_ENV]}
    assert runners == ("kubernetes", "local")   # the first is the runner Param's default: the cluster
    assert {r for r in roots if r.startswith("gs://")} and bounds.input_roots == tuple(roots)
    locations.check_allowed_location("nightly", nightly, roots)
    # The default duckdb_path of the image (REPO_ROOT is /opt/airflow there) is checked on every run.
    locations.check_allowed_location("duckdb_path", f"{AIRFLOW_HOME}/output/warehouse.duckdb", roots)
    assert "batch_inference_postgres" in bounds.postgres_conn_ids
    # The publish target's connection comes from a Kubernetes secret, under the id the policy allows.
    (conn,) = [s for s in values["secret"] if s["envName"] == "AIRFLOW_CONN_BATCH_INFERENCE_POSTGRES"]
    assert conn["secretName"] and conn["secretKey"]
    kube = json.loads(env["AIRFLOW_CONN_KUBERNETES_DEFAULT"])
    assert kube["extra"]["in_cluster"] is True and kube["extra"]["namespace"] == settings.namespace


def test_a_run_on_gcs_passes_the_deployment_bounds(values: dict[str, Any]) -> None:
    from batch_inference import policy
    from batch_inference.params import resolve_run_config

    bounds = policy.policy_for("batch_inference_backfill", _env(values))
    buckets = [r for r in bounds.output_roots if r.startswith("gs://")]
    cfg = resolve_run_config({
        "input_uri": f"{bounds.input_roots[0]}/in/part-*.parquet", "id_column": "id", "text_column": "text",
        "engine": "encoder", "runner": "kubernetes", "output_root": f"{buckets[-1]}/batch",
        "duckdb_path": f"{AIRFLOW_HOME}/output/warehouse.duckdb", "publish_backend": "postgres"}, bounds)
    assert cfg.runner == "kubernetes"


def test_deadline_callback_is_set_where_the_dags_are_parsed(values: dict[str, Any]) -> None:
    from batch_inference import dag_factory

    assert dag_factory.DEADLINE_CALLBACK_ENV not in _env(values), "set it on the DAG processor only"
    path = _env(values, "dagProcessor")[dag_factory.DEADLINE_CALLBACK_ENV]
    assert path == dag_factory.DEFAULT_DEADLINE_CALLBACK
    module, _, name = path.rpartition(".")
    assert callable(getattr(importlib.import_module(module), name))


def test_config_overrides_are_airflow_options(values: dict[str, Any]) -> None:
    from airflow.configuration import conf

    for section, options in values["config"].items():
        for option in options:
            assert conf.get_default_value(section, option) is not None, (
                f"config.{section}.{option} is not an Airflow option")
    assert conf.get_default_value("logging", "remote_logginng") is None  # the check can fail
