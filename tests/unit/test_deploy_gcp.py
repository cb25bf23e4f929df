"""GKE deployment scripts (docs/deploy-gke.md), checked with no gcloud, no kubectl and no cluster.

* ``deploy/gcp/setup.sh``: shellcheck; ``--dry-run`` with a PATH that holds no gcloud prints every command
  and runs none; the printed cluster and node pools against the worker pods' placement
  (``K8sSettings`` defaults: node selector and tolerations), the bucket roles and the Workload Identity
  bindings against ``deploy/k8s/*.yaml``; a fake ``gcloud`` that records its argv and remembers what was
  created shows that a second run creates nothing, and that with everything in place no create is called.
* ``deploy/k8s/can-i.sh``: shellcheck; its checks are the Role of ``deploy/k8s/rbac.yaml`` for the
  Role's subjects; a fake ``kubectl`` that answers "no" to one permission makes it exit 1 naming it.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from batch_inference.pod_spec import K8sSettings

REPO = Path(__file__).resolve().parents[2]
SETUP = REPO / "deploy" / "gcp" / "setup.sh"
CAN_I = REPO / "deploy" / "k8s" / "can-i.sh"
K8S_DIR = REPO / "deploy" / "k8s"
PROJECT = "test-proj"
BASH = shutil.which("bash") or "/bin/bash"
# The only programs setup.sh may start besides gcloud (a temp dir for the lifecycle files, its cleanup,
# the retry pause), and can-i.sh besides kubectl: none.
HELPER_TOOLS = ("mktemp", "rm", "sleep")


def _tool(name: str) -> str:
    """Path of a console script of the test interpreter's environment (``.venv/bin/<name>``)."""
    candidate = Path(sys.executable).parent / name
    found = str(candidate) if candidate.exists() else shutil.which(name)
    assert found, f"{name} not found: install the dev extra (pip install -e '.[dev]')"
    return found


def _bin_dir(tmp_path: Path, fakes: dict[str, str] | None = None) -> str:
    """A PATH of one directory: links to HELPER_TOOLS plus the given fake programs (name -> source)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in HELPER_TOOLS:
        real = shutil.which(name)
        assert real, name
        if not (bin_dir / name).exists():
            (bin_dir / name).symlink_to(real)
    for name, source in (fakes or {}).items():
        (bin_dir / name).write_text(source)
        (bin_dir / name).chmod(0o755)
    return str(bin_dir)


def _run(script: Path, args: list[str], path: str, env: dict[str, str], tmp_path: Path
         ) -> subprocess.CompletedProcess[str]:
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    full = {"PATH": path, "HOME": str(tmp_path), "TMPDIR": str(tmp), "LC_ALL": "C", **env}
    return subprocess.run([BASH, str(script), *args], env=full, capture_output=True, text=True, timeout=60)


def _setup(tmp_path: Path, *args: str, path: str | None = None, script: Path | None = None, **env: str
           ) -> subprocess.CompletedProcess[str]:
    env = {"PROJECT": PROJECT, **env}
    return _run(script or SETUP, list(args), path or _bin_dir(tmp_path), env, tmp_path)


def _printed(stdout: str) -> list[list[str]]:
    """The commands of a ``+ cmd`` trace; every stdout line must be one."""
    lines = stdout.splitlines()
    assert lines and all(line.startswith("+ ") for line in lines), stdout
    return [shlex.split(line[2:]) for line in lines]


def _flags(cmd: list[str]) -> dict[str, str | bool]:
    out: dict[str, str | bool] = {}
    for arg in cmd:
        if arg.startswith("--"):
            key, eq, value = arg.partition("=")
            out[key] = value if eq else True
    return out


def _verb_at(cmd: list[str], verb: str) -> bool:
    """Whether ``cmd`` is ``gcloud <group...> <verb> ...`` (the verb is the first non-flag word that is one)."""
    return verb in [a for a in cmd if not a.startswith("-")][:5]


def _creates(cmds: list[list[str]]) -> list[list[str]]:
    return [c for c in cmds if _verb_at(c, "create") or _verb_at(c, "connect")]


def _k8s_docs() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(K8S_DIR.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def _one(kind: str) -> dict[str, Any]:
    (doc,) = [d for d in _k8s_docs() if d["kind"] == kind]
    return doc


def _tolerates(toleration: dict[str, str], taint: dict[str, str]) -> bool:
    """Kubernetes' rule: same effect (or none), same key (or none with Exists), Exists or an equal value."""
    if toleration.get("effect") and toleration["effect"] != taint["effect"]:
        return False
    if toleration.get("key") and toleration["key"] != taint["key"]:
        return False
    if toleration.get("operator", "Equal") == "Exists":
        return True
    return toleration.get("value", "") == taint["value"]


def _taints(flag: str) -> list[dict[str, str]]:
    out = []
    for item in flag.split(","):
        key_value, _, effect = item.rpartition(":")
        key, _, value = key_value.partition("=")
        out.append({"key": key, "value": value, "effect": effect})
    return out


# --------------------------------------------------------------------------------------------- lint


@pytest.mark.parametrize("script", [SETUP, CAN_I], ids=lambda p: p.name)
def test_shellcheck_passes_on_the_gke_scripts(script: Path) -> None:
    result = subprocess.run([_tool("shellcheck"), "--severity=info", str(script)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_shellcheck_flags_a_bad_script(tmp_path: Path) -> None:
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/usr/bin/env bash\nrm -rf $1/*\n")
    result = subprocess.run([_tool("shellcheck"), "--severity=info", str(bad)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode != 0 and "SC2086" in result.stdout


# ------------------------------------------------------------------------------------ setup.sh: dry


def test_dry_run_needs_no_gcloud_and_runs_nothing(tmp_path: Path) -> None:
    path = _bin_dir(tmp_path)
    assert shutil.which("gcloud", path=path) is None and shutil.which("gsutil", path=path) is None
    result = _setup(tmp_path, "--dry-run", path=path)
    assert result.returncode == 0, result.stderr
    cmds = _printed(result.stdout)
    assert {c[0] for c in cmds} == {"gcloud"}, "only gcloud commands (no gsutil, nothing else)"
    assert all(f"--project={PROJECT}" in c or c[1:4] == ["projects", "add-iam-policy-binding", PROJECT] for c in cmds)
    assert len(_creates(cmds)) >= 15
    # DRY_RUN=1 is the same mode; nothing is left in TMPDIR afterwards.
    again = _setup(tmp_path, path=path, DRY_RUN="1")
    assert again.returncode == 0 and len(_printed(again.stdout)) == len(cmds)
    assert list((tmp_path / "tmp").iterdir()) == []
    # Without --dry-run the same PATH fails at once, before any command.
    real = _setup(tmp_path, path=path)
    assert real.returncode == 2 and "gcloud not found" in real.stderr and real.stdout == ""


def test_dry_run_requires_project_and_prints_usage(tmp_path: Path) -> None:
    result = _setup(tmp_path, "--dry-run", PROJECT="")
    assert result.returncode == 2 and "PROJECT" in result.stderr and result.stdout == ""
    usage = _setup(tmp_path, "--help", PROJECT="")
    assert usage.returncode == 0 and "--dry-run" in usage.stdout
    assert _setup(tmp_path, "--bogus").returncode == 2


def test_dry_run_every_create_is_guarded_by_a_lookup(tmp_path: Path) -> None:
    cmds = _printed(_setup(tmp_path, "--dry-run").stdout)
    for i, cmd in enumerate(cmds):
        if not (_verb_at(cmd, "create") or _verb_at(cmd, "connect")):
            continue
        verb = "create" if _verb_at(cmd, "create") else "connect"
        group = cmd[:cmd.index(verb)]
        name = cmd[cmd.index(verb) + 1] if verb == "create" else None
        lookups = [c for c in cmds[:i] if c[:len(group)] == group and (_verb_at(c, "describe") or _verb_at(c, "list"))]
        if name is not None:
            lookups = [c for c in lookups if c[len(group) + 1] in (name, f"{name}@{PROJECT}.iam.gserviceaccount.com")
                       and _flags(c).get("--cluster") == _flags(cmd).get("--cluster")
                       and _flags(c).get("--instance") == _flags(cmd).get("--instance")]
        assert lookups, f"no lookup before: {shlex.join(cmd)}"


def test_dry_run_cluster_and_pools_match_the_worker_pod_placement(tmp_path: Path) -> None:
    defaults = K8sSettings()
    cmds = _printed(_setup(tmp_path, "--dry-run").stdout)
    (cluster,) = [c for c in cmds if c[1:4] == ["container", "clusters", "create"]]
    assert _flags(cluster).get("--workload-pool") == f"{PROJECT}.svc.id.goog"
    assert _flags(cluster).get("--workload-metadata") == "GKE_METADATA"
    pools = {c[4]: _flags(c) for c in cmds if c[1:4] == ["container", "node-pools", "create"]}
    assert set(pools) == {"airflow", "gpu-spot"}
    assert all(flags.get("--workload-metadata") == "GKE_METADATA" for flags in pools.values()), pools
    gpu, airflow = pools["gpu-spot"], pools["airflow"]
    # Labels: GKE labels the nodes of a --spot pool cloud.google.com/gke-spot=true and GPU nodes
    # cloud.google.com/gke-accelerator=<type of --accelerator>: the pods' node selector, key by key.
    accelerator = dict(kv.split("=", 1) for kv in str(gpu["--accelerator"]).split(","))
    node_labels = {"cloud.google.com/gke-accelerator": accelerator["type"]}
    if gpu.get("--spot") is True:
        node_labels["cloud.google.com/gke-spot"] = "true"
    assert node_labels == defaults.node_selector
    assert int(accelerator["count"]) >= defaults.gpus
    # Taints: each one tolerated by the pods, each toleration for one of them.
    taints = _taints(str(gpu["--node-taints"]))
    assert all(any(_tolerates(t, taint) for t in defaults.tolerations) for taint in taints), taints
    assert all(any(_tolerates(t, taint) for taint in taints) for t in defaults.tolerations), taints
    assert len(taints) == len(defaults.tolerations)
    assert gpu["--total-min-nodes"] == "0" and gpu["--num-nodes"] == "0"
    # The Airflow pool is on-demand and untainted.
    assert "--spot" not in airflow and "--node-taints" not in airflow and "--accelerator" not in airflow


def test_dry_run_accelerator_and_release_come_from_settings(tmp_path: Path) -> None:
    cmds = _printed(_setup(tmp_path, "--dry-run", ACCELERATOR="nvidia-h100-80gb", RELEASE="prod").stdout)
    (gpu,) = [c for c in cmds if c[1:5] == ["container", "node-pools", "create", "gpu-spot"]]
    assert str(_flags(gpu)["--accelerator"]).startswith("type=nvidia-h100-80gb,")
    members = {_flags(c)["--member"] for c in cmds if c[1:4] == ["iam", "service-accounts", "add-iam-policy-binding"]}
    assert f"serviceAccount:{PROJECT}.svc.id.goog[airflow/prod-airflow-worker]" in members
    assert f"serviceAccount:{PROJECT}.svc.id.goog[airflow/prod-airflow-api-server]" in members


def test_dry_run_grants_least_privilege(tmp_path: Path) -> None:
    cmds = _printed(_setup(tmp_path, "--dry-run").stdout)
    inp, out = f"gs://{PROJECT}-batch-input", f"gs://{PROJECT}-batch-output"

    def sa(name: str) -> str:
        return f"serviceAccount:{name}@{PROJECT}.iam.gserviceaccount.com"

    bucket_roles = {(c[4], str(_flags(c)["--member"]), str(_flags(c)["--role"]), str(_flags(c).get("--condition", "")))
                    for c in cmds if c[1:4] == ["storage", "buckets", "add-iam-policy-binding"]}
    logs_only = ('expression=resource.name.startsWith("projects/_/buckets/test-proj-batch-output/objects/'
                 'airflow-logs/"),title=airflow-logs-only')
    assert bucket_roles == {
        (inp, sa("batch-worker"), "roles/storage.objectViewer", ""),
        (out, sa("batch-worker"), "roles/storage.objectUser", ""),
        (inp, sa("airflow-tasks"), "roles/storage.objectViewer", ""),
        (out, sa("airflow-tasks"), "roles/storage.objectUser", ""),
        (out, sa("airflow-triggerer"), "roles/storage.objectViewer", ""),
        (out, sa("airflow-api-server"), "roles/storage.objectViewer", ""),
        # the triggerer uploads its part of deferred tasks' logs: write access to the log prefix only
        (out, sa("airflow-triggerer"), "roles/storage.objectUser", logs_only),
    }
    # The log prefix is deploy/helm/values-gke.yaml's remote_base_log_folder, when that file is there.
    values = REPO / "deploy" / "helm" / "values-gke.yaml"
    if values.exists():
        folder = yaml.safe_load(values.read_text())["config"]["logging"]["remote_base_log_folder"]
        assert folder == "gs://OUTPUT_BUCKET/airflow-logs"
    project_roles = {(str(_flags(c)["--member"]), str(_flags(c)["--role"]))
                     for c in cmds if c[1:3] == ["projects", "add-iam-policy-binding"]}
    assert project_roles == {(sa("batch-gke-nodes"), "roles/container.defaultNodeServiceAccount")}
    (reader,) = [c for c in cmds if c[1:4] == ["artifacts", "repositories", "add-iam-policy-binding"]]
    assert (_flags(reader)["--member"], _flags(reader)["--role"]) == (sa("batch-gke-nodes"),
                                                                       "roles/artifactregistry.reader")
    for pool in [c for c in cmds if c[1:3] == ["container", "node-pools"] and "create" in c]:
        assert _flags(pool)["--service-account"] == sa("batch-gke-nodes")[len("serviceAccount:"):]
    services = next(c for c in cmds if c[1:3] == ["services", "enable"])
    assert {"container.googleapis.com", "artifactregistry.googleapis.com", "iam.googleapis.com",
            "sqladmin.googleapis.com", "storage.googleapis.com"} <= set(services)


def test_dry_run_binds_every_kubernetes_identity_of_the_manifests(tmp_path: Path) -> None:
    cmds = _printed(_setup(tmp_path, "--dry-run").stdout)
    bindings = {}
    for c in cmds:
        if c[1:4] == ["iam", "service-accounts", "add-iam-policy-binding"]:
            assert _flags(c)["--role"] == "roles/iam.workloadIdentityUser"
            member = str(_flags(c)["--member"])
            prefix = f"serviceAccount:{PROJECT}.svc.id.goog["
            assert member.startswith(prefix) and member.endswith("]")
            bindings[member[len(prefix):-1]] = c[4].split("@")[0]
    defaults = K8sSettings()
    (worker_ksa,) = [d for d in _k8s_docs() if d["kind"] == "ServiceAccount"]
    assert f"{worker_ksa['metadata']['namespace']}/{worker_ksa['metadata']['name']}" == (
        f"{defaults.namespace}/{defaults.service_account}")
    assert bindings[f"{defaults.namespace}/{defaults.service_account}"] == "batch-worker"
    subjects = {f"{s['namespace']}/{s['name']}" for s in _one("RoleBinding")["subjects"]}
    assert subjects <= set(bindings), "every Airflow identity rbac.yaml binds needs a GCS identity too"
    assert bindings == {
        "batch-inference/batch-worker": "batch-worker",
        "airflow/airflow-worker": "airflow-tasks",
        "airflow/airflow-scheduler": "airflow-tasks",
        "airflow/airflow-triggerer": "airflow-triggerer",
        "airflow/airflow-api-server": "airflow-api-server",
    }


def test_dry_run_redacts_passwords_and_can_skip_cloud_sql(tmp_path: Path) -> None:
    result = _setup(tmp_path, "--dry-run", SQL_PASSWORD="s3cret-1", RESULTS_SQL_PASSWORD="s3cret-2")
    assert "s3cret" not in result.stdout + result.stderr
    users = [c for c in _printed(result.stdout) if c[1:4] == ["sql", "users", "create"]]
    assert [u[4] for u in users] == ["airflow", "batch"]
    assert all(_flags(u)["--password"] == "<redacted>" for u in users)
    without = _printed(_setup(tmp_path, "--dry-run", CLOUDSQL="0").stdout)
    assert not [c for c in without if c[1] in ("sql", "compute") or "sqladmin.googleapis.com" in c]
    no_results = _printed(_setup(tmp_path, "--dry-run", RESULTS_DB="").stdout)
    assert [c[4] for c in no_results if c[1:4] == ["sql", "databases", "create"]] == ["airflow"]


# ------------------------------------------------------------------------- setup.sh: a fake gcloud

FAKE_GCLOUD = """#!{python}
# A fake gcloud: appends its argv (and any --lifecycle-file's content) to $FAKE_LOG as one JSON line, and
# remembers created resources in $FAKE_STATE: describe succeeds for those (or for all, with
# FAKE_GCLOUD_EXISTS=all), create fails for one that exists, like gcloud.
import json, os, sys

argv = sys.argv[1:]
entry = {{"argv": argv}}
for arg in argv:
    if arg.startswith("--lifecycle-file="):
        entry["lifecycle"] = json.load(open(arg.split("=", 1)[1]))
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps(entry) + "\\n")
words = [a for a in argv if not a.startswith("-")]
flags = dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)
verb = next((w for w in words if w in ("describe", "create", "list", "connect")), None)
if verb is None:
    sys.exit(0)
group = words[:words.index(verb)]
name = words[words.index(verb) + 1].split("@")[0] if verb in ("describe", "create") else ""
key = " ".join(group + [name, flags.get("cluster", ""), flags.get("instance", "")]).strip()
state_path = os.environ["FAKE_STATE"]
state = set(json.load(open(state_path))) if os.path.exists(state_path) else set()
everything = os.environ.get("FAKE_GCLOUD_EXISTS") == "all"
if verb == "list":
    if everything or "services vpc-peerings" in state:
        print("servicenetworking-googleapis-com")
    sys.exit(0)
if verb == "describe":
    if everything or key in state:
        print("name: " + name)
        sys.exit(0)
    print("ERROR: (gcloud) NOT_FOUND: " + key, file=sys.stderr)
    sys.exit(1)
if verb == "connect":
    key = "services vpc-peerings"
if key in state:
    print("ERROR: (gcloud) ALREADY_EXISTS: " + key, file=sys.stderr)
    sys.exit(1)
state.add(key)
json.dump(sorted(state), open(state_path, "w"))
"""


def _fake_gcloud_env(tmp_path: Path, name: str) -> tuple[str, dict[str, str], Path]:
    path = _bin_dir(tmp_path, {"gcloud": FAKE_GCLOUD.format(python=sys.executable)})
    log = tmp_path / f"{name}.jsonl"
    return path, {"FAKE_LOG": str(log), "FAKE_STATE": str(tmp_path / f"{name}-state.json")}, log


def _calls(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


PASSWORDS = {"SQL_PASSWORD": "pw-airflow-1", "RESULTS_SQL_PASSWORD": "pw-results-2"}


def test_second_run_creates_nothing(tmp_path: Path) -> None:
    path, env, log = _fake_gcloud_env(tmp_path, "twice")
    first = _setup(tmp_path, path=path, **env, **PASSWORDS)
    assert first.returncode == 0, first.stderr
    calls = _calls(log)
    # What ran is what was printed, in order (the password aside: printed redacted).
    assert [shlex.join(["gcloud", *c["argv"]]) for c in calls if "--password" not in " ".join(c["argv"])] == [
        shlex.join(cmd) for cmd in _printed(first.stdout) if not any(a.startswith("--password") for a in cmd)]
    created = [c["argv"] for c in calls if _verb_at(["gcloud", *c["argv"]], "create")
               or _verb_at(["gcloud", *c["argv"]], "connect")]
    kinds = sorted(" ".join(a for a in argv[:2]) for argv in created)
    assert kinds == sorted(["iam service-accounts"] * 5 + ["artifacts repositories", "container clusters"]
                           + ["container node-pools"] * 2 + ["storage buckets"] * 2
                           + ["compute addresses", "services vpc-peerings", "sql instances"]
                           + ["sql databases"] * 2 + ["sql users"] * 2)
    # The passwords reach gcloud and nothing else.
    users = {argv[3]: dict(a[2:].split("=", 1) for a in argv if a.startswith("--password="))["password"]
             for argv in created if argv[:3] == ["sql", "users", "create"]}
    assert users == {"airflow": "pw-airflow-1", "batch": "pw-results-2"}
    assert "pw-" not in first.stdout + first.stderr
    # The output bucket's lifecycle rules delete run directories after RUN_RETENTION_DAYS (45) and Airflow's
    # task logs after LOG_RETENTION_DAYS (30); nothing else (cache/, iceberg/) expires.
    (output_bucket,) = [c for c in calls if c["argv"][:4] == ["storage", "buckets", "create",
                                                              f"gs://{PROJECT}-batch-output"]]
    assert output_bucket["lifecycle"] == {"lifecycle": {"rule": [
        {"action": {"type": "Delete"}, "condition": {"age": 45, "matchesPrefix": ["batch/runs/"]}},
        {"action": {"type": "Delete"}, "condition": {"age": 30, "matchesPrefix": ["airflow-logs/"]}}]}}
    (input_bucket,) = [c for c in calls if c["argv"][:4] == ["storage", "buckets", "create",
                                                             f"gs://{PROJECT}-batch-input"]]
    assert "lifecycle" not in input_bucket  # INPUT_RETENTION_DAYS=0: inputs are kept

    log.unlink()
    second = _setup(tmp_path, path=path, **env)  # no passwords needed: the users exist
    assert second.returncode == 0, second.stderr
    again = [c["argv"] for c in _calls(log)]
    assert again and not [a for a in again if _verb_at(["gcloud", *a], "create") or _verb_at(["gcloud", *a], "connect")]
    assert [a for a in again if "describe" in a]


def test_everything_existing_means_no_create(tmp_path: Path) -> None:
    path, env, log = _fake_gcloud_env(tmp_path, "existing")
    result = _setup(tmp_path, path=path, FAKE_GCLOUD_EXISTS="all", RUN_RETENTION_DAYS="7", **env)
    assert result.returncode == 0, result.stderr
    argvs = [c["argv"] for c in _calls(log)]
    assert not [a for a in argvs if "create" in a or "connect" in a], argvs
    lookups = [a for a in argvs if "describe" in a or "list" in a]
    # 5 GSAs, registry, cluster, 2 pools, 2 buckets, address range, peering, instance, 2 databases, 2 users
    assert len(lookups) == 18
    # IAM bindings are re-applied (add-iam-policy-binding leaves an existing binding as it is): node role,
    # registry reader, 7 bucket roles, 5 Workload Identity bindings.
    assert sum("add-iam-policy-binding" in a for a in argvs) == 14


def test_an_unguarded_create_fails_the_second_run(tmp_path: Path) -> None:
    """The fake refuses to create what exists, as gcloud does: a create without its lookup is caught."""
    text = SETUP.read_text()
    guard = 'if ! exists gcloud storage buckets describe "gs://$1" "${P[@]}"; then'
    assert text.count(guard) == 1
    broken = tmp_path / "setup.sh"
    broken.write_text(text.replace(guard, "if true; then"))
    path, env, log = _fake_gcloud_env(tmp_path, "unguarded")
    assert _setup(tmp_path, path=path, script=broken, **env, **PASSWORDS).returncode == 0
    second = _setup(tmp_path, path=path, script=broken, **env)
    assert second.returncode != 0 and "ALREADY_EXISTS: storage buckets" in second.stderr


def test_a_missing_password_stops_before_the_user_is_created(tmp_path: Path) -> None:
    path, env, log = _fake_gcloud_env(tmp_path, "nopw")
    result = _setup(tmp_path, path=path, **env)
    assert result.returncode == 2 and "SQL_PASSWORD is not set" in result.stderr
    assert not [c for c in _calls(log) if c["argv"][:3] == ["sql", "users", "create"]]


def test_lifecycle_settings_reach_the_bucket(tmp_path: Path) -> None:
    path, env, log = _fake_gcloud_env(tmp_path, "lifecycle")
    result = _setup(tmp_path, path=path, CLOUDSQL="0", RUN_RETENTION_DAYS="10", OUTPUT_PREFIX="",
                    INPUT_RETENTION_DAYS="90", LOG_RETENTION_DAYS="5", LOGS_PREFIX="logs", **env)
    assert result.returncode == 0, result.stderr
    rules = {c["argv"][3]: c["lifecycle"]["lifecycle"]["rule"] for c in _calls(log) if "lifecycle" in c}
    assert rules == {
        f"gs://{PROJECT}-batch-output": [
            {"action": {"type": "Delete"}, "condition": {"age": 10, "matchesPrefix": ["runs/"]}},
            {"action": {"type": "Delete"}, "condition": {"age": 5, "matchesPrefix": ["logs/"]}}],
        f"gs://{PROJECT}-batch-input": [{"action": {"type": "Delete"}, "condition": {"age": 90}}],
    }
    assert _setup(tmp_path, "--dry-run", RUN_RETENTION_DAYS="0").returncode == 2
    assert _setup(tmp_path, "--dry-run", RUN_RETENTION_DAYS="ten").returncode == 2


# ----------------------------------------------------------------------------------------- can-i.sh

FAKE_KUBECTL = """#!{python}
# A fake kubectl for `auth can-i`: "no" (exit 1) for "verb resource[/subresource] as NS:SA" in
# $FAKE_KUBECTL_DENY (';'-separated), "error: ..." (exit 1) with FAKE_KUBECTL_ERROR=1, else "yes".
import json, os, sys

argv = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps(argv) + "\\n")
if os.environ.get("FAKE_KUBECTL_ERROR") == "1":
    print("error: You must be logged in to the server (Unauthorized)", file=sys.stderr)
    sys.exit(1)
words = [a for a in argv if not a.startswith("-")]
assert words[:2] == ["auth", "can-i"], argv
flags = dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)
resource = words[3] + ("/" + flags["subresource"] if "subresource" in flags else "")
who = flags["as"].removeprefix("system:serviceaccount:")
denied = [d.strip() for d in os.environ.get("FAKE_KUBECTL_DENY", "").split(";") if d.strip()]
if f"{{words[2]}} {{resource}} as {{who}}" in denied:
    print("no")
    sys.exit(1)
print("yes")
"""


def _can_i(tmp_path: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess[str], list[list[str]]]:
    path = _bin_dir(tmp_path, {"kubectl": FAKE_KUBECTL.format(python=sys.executable)})
    log = tmp_path / "kubectl.jsonl"
    if log.exists():
        log.unlink()
    result = _run(CAN_I, list(args), path, {"FAKE_LOG": str(log), **env}, tmp_path)
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return result, calls


def _rbac_grants() -> set[tuple[str, str, str]]:
    return {(group, res, verb) for rule in _one("Role")["rules"] for group in rule["apiGroups"]
            for res in rule["resources"] for verb in rule["verbs"]}


def _checked(cmd: list[str]) -> tuple[str, str, str, str]:
    """(who, group, resource[/sub], verb) of one `kubectl auth can-i` command."""
    words = [a for a in cmd if not a.startswith("-")]
    assert words[:3] == ["kubectl", "auth", "can-i"], cmd
    flags = _flags(cmd)
    resource, _, group = words[4].partition(".")
    if "--subresource" in flags:
        resource += f"/{flags['--subresource']}"
    return str(flags["--as"]), group, resource, words[3]


def test_can_i_checks_are_the_rbac_role_for_its_subjects(tmp_path: Path) -> None:
    result, calls = _can_i(tmp_path, "--dry-run")
    assert result.returncode == 0 and calls == [], "dry run: kubectl never called"
    cmds = _printed(result.stdout)
    assert {c[0] for c in cmds} == {"kubectl"}
    role, binding = _one("Role"), _one("RoleBinding")
    assert {str(_flags(c)["--namespace"]) for c in cmds} == {role["metadata"]["namespace"], K8sSettings().namespace}
    subjects = {f"system:serviceaccount:{s['namespace']}:{s['name']}" for s in binding["subjects"]}
    checked: dict[str, set[tuple[str, str, str]]] = {}
    for cmd in cmds:
        who, group, resource, verb = _checked(cmd)
        checked.setdefault(who, set()).add((group, resource, verb))
    assert set(checked) == subjects
    assert all(granted == _rbac_grants() for granted in checked.values())
    # What the pod operator calls (test_deploy_artifacts.test_rbac_grants_what_the_pod_operator_calls).
    needed = {("", "pods", v) for v in ("create", "get", "list", "watch", "patch", "delete")}
    needed |= {("", "pods/log", "get"), ("", "events", "list")}
    assert all(needed <= granted for granted in checked.values())


def test_can_i_names_every_missing_permission(tmp_path: Path) -> None:
    deny = "delete pods as airflow:airflow-triggerer;get pods/log as airflow:airflow-worker"
    result, calls = _can_i(tmp_path, FAKE_KUBECTL_DENY=deny)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    checks = [line for line in lines if line.split()[0] in ("ok", "MISSING")]
    assert len(checks) == len(calls) == 2 * len(_rbac_grants())
    assert sorted(" ".join(line.split()[1:]) for line in checks if line.startswith("MISSING")) == [
        "airflow:airflow-triggerer delete pods", "airflow:airflow-worker get pods/log"]
    summary = result.stdout[result.stdout.index("can-i: 2 of"):]
    assert "airflow:airflow-triggerer may not delete pods in namespace batch-inference" in summary
    assert "airflow:airflow-worker may not get pods/log in namespace batch-inference" in summary


def test_can_i_all_allowed_and_kubectl_errors(tmp_path: Path) -> None:
    ok, calls = _can_i(tmp_path, "--namespace=other-ns", "--as=airflow:prod-airflow-worker", "--context=gke_x")
    assert ok.returncode == 0, ok.stdout
    assert ok.stdout.splitlines()[-1].startswith(f"can-i: all {len(_rbac_grants())} checks allowed in namespace "
                                                 "other-ns")
    assert all("--namespace=other-ns" in c and "--context=gke_x" in c
               and "--as=system:serviceaccount:airflow:prod-airflow-worker" in c for c in calls)
    error, _ = _can_i(tmp_path, FAKE_KUBECTL_ERROR="1")
    assert error.returncode == 2 and "kubectl failed" in error.stdout and "MISSING" not in error.stdout
    released, _ = _can_i(tmp_path, "--dry-run", RELEASE="prod")
    assert {str(_flags(c)["--as"]) for c in _printed(released.stdout)} == {
        "system:serviceaccount:airflow:prod-airflow-worker", "system:serviceaccount:airflow:prod-airflow-triggerer"}
