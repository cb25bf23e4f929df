"""``make run-k8s``: the main job through the production path on this machine.

Starts fake-gcs-server and the local live cluster (:class:`scripts.k8s.cluster.LocalCluster`), copies
the input to ``gs://<bucket>/input/``, then runs ``batch_inference.cli run --runner kubernetes`` with
output on ``gs://<bucket>/output``: the backfill DAG's mapped, deferrable KubernetesPodOperator creates
one pod per shard through the API server (as the ``airflow-worker`` service account, via the
``kubernetes_default`` connection), the node (the kubelet with the built worker image, or the fallback
node agent) runs ``batch-worker`` in each, and the gate, publish
and report steps read the markers from the emulator. The pods get the emulator's address through
their pod spec (``BATCH_K8S_SECRET_ENV``: a Secret key, as a real deployment injects settings). At the
end the report is copied to ``<output>/k8s/<run id>/`` and its local path is printed LAST; everything
started here is stopped, whatever happened.

Usage: ``python -m scripts.k8s.run_k8s --input FILE --output DIR [--rows-per-shard N] [-- CLI FLAGS]``.
Exit code: the CLI's (0 on success).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from .cluster import NAMESPACE, REPO_ROOT, LocalCluster, apiserver_binary, ensure_built

EMULATOR_SECRET = "gcs-emulator"
"""Secret (key ``host``) holding the emulator URL the worker pods get as ``STORAGE_EMULATOR_HOST``."""
STATE_DIR = REPO_ROOT / "build" / "k8s-local"
"""Cluster work dir (logs, pod dirs) and the run's own Airflow home (SQLite) live here."""


def _start_gcs():
    sys.path.insert(0, str(REPO_ROOT / "tests"))
    from gcs_fixture import FakeGcsServer  # the tests' fake-gcs-server wrapper (bundled binary)

    return FakeGcsServer().start()


def _upload(local: Path, uri: str) -> None:
    from batch_contract import storage

    storage.write_replace(uri, local.read_bytes())


def _copy_report(report_uri: str, dest: Path) -> Path:
    """Copy ``report.json`` (and ``report.html`` when present) next to each other under ``dest``."""
    from batch_contract import storage

    dest.mkdir(parents=True, exist_ok=True)
    base = report_uri.rsplit("/", 1)[0]
    for name in ("report.json", "report.html"):
        if storage.exists(f"{base}/{name}"):
            (dest / name).write_bytes(storage.read_bytes(f"{base}/{name}"))
    return dest / "report.json"


def airflow_k8s_env(cluster: LocalCluster, emulator_url: str, airflow_home: Path) -> dict[str, str]:
    """Environment of the Airflow CLI run: the ``kubernetes`` runner enabled, the ``kubernetes_default``
    connection on the ``airflow-worker`` service account's kubeconfig, the emulator for the Airflow side
    and (through a Secret) for the pods, and a separate Airflow home."""
    conn = {"conn_type": "kubernetes",
            "extra": {"kube_config_path": str(cluster.kubeconfig("airflow-worker")), "namespace": NAMESPACE,
                      "in_cluster": False}}
    paths = [str(REPO_ROOT / "plugins"), str(REPO_ROOT / "worker_image"),
             *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ,
            "PYTHONPATH": os.pathsep.join(paths),
            "BATCH_CLI_AIRFLOW_HOME": str(airflow_home),
            "BATCH_INFERENCE_RUNNERS": "local,kubernetes",
            "AIRFLOW_CONN_KUBERNETES_DEFAULT": json.dumps(conn),
            "BATCH_K8S_SECRET_ENV": json.dumps({"STORAGE_EMULATOR_HOST": f"{EMULATOR_SECRET}:host"}),
            **cluster.pod_settings_env(),
            "STORAGE_EMULATOR_HOST": emulator_url}


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def run(args: argparse.Namespace) -> int:
    """Start, run, copy the report, stop. Returns the CLI's exit code."""
    if not apiserver_binary().exists():
        print("building the Kubernetes v1.20.2 binaries once (about 15 minutes on 2 cores) ...", flush=True)
    ensure_built()
    work = STATE_DIR / "cluster"
    shutil.rmtree(work, ignore_errors=True)
    gcs = _start_gcs()
    try:
        os.environ["STORAGE_EMULATOR_HOST"] = gcs.url
        bucket = gcs.create_bucket(f"batch-inference-{uuid.uuid4().hex[:8]}")
        src = Path(args.input)
        input_uri = f"{bucket}/input/{src.name}"
        _upload(src, input_uri)
        with LocalCluster(work) as cluster:
            print(f"cluster: kube-apiserver {cluster.server} ready in {cluster.started_in_s:.1f} s; "
                  f"node {cluster.node_agent.node_name} ({cluster.node_kind}, image {cluster.worker_image}); "
                  f"logs {cluster.logs_dir}; gcs {gcs.url} {bucket}", flush=True)
            cluster.api().create_namespaced_secret(NAMESPACE, {
                "metadata": {"name": EMULATOR_SECRET}, "stringData": {"host": gcs.url}})
            env = airflow_k8s_env(cluster, gcs.url, STATE_DIR / "airflow_home")
            cmd = [sys.executable, "-m", "batch_inference.cli", "run", "--input", input_uri,
                   "--output", f"{bucket}/output", "--runner", "kubernetes",
                   *(["--rows-per-shard", str(args.rows_per_shard)] if args.rows_per_shard else []), *args.cli_args]
            t0 = time.monotonic()
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT)
            out = []
            assert proc.stdout is not None
            for line in proc.stdout:
                print(line, end="", flush=True)
                out.append(line)
            code = proc.wait()
            scheduled = cluster.api().list_namespaced_event(NAMESPACE, field_selector="reason=Scheduled").items
            left = len(cluster.pods())
            print(f"kubernetes: {len(scheduled)} pod(s) scheduled onto the {cluster.node_kind} node, {left} left in "
                  f"{NAMESPACE} (run {time.monotonic() - t0:.0f} s)", flush=True)
            report_uri = _last_line("".join(out))
            if code != 0 or not report_uri.startswith("gs://"):
                print(f"run-k8s failed (exit {code}); cluster logs were in {cluster.logs_dir}", file=sys.stderr)
                return code or 1
            run_id = report_uri.rstrip("/").split("/")[-2]
            local = _copy_report(report_uri, Path(args.output) / "k8s" / run_id)
    finally:
        gcs.stop()
    print(local)
    return 0


def _terminated(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    """CLI entry (see the module docstring)."""
    ap = argparse.ArgumentParser(prog="python -m scripts.k8s.run_k8s", description=__doc__.split("\n", 1)[0])
    ap.add_argument("--input", default=str(REPO_ROOT / "data" / "sample" / "debian_descriptions_sample.parquet"))
    ap.add_argument("--output", default=str(REPO_ROOT / "output"))
    ap.add_argument("--rows-per-shard", type=int, default=None,
                    help="rows per shard (default: the Param's; make run-k8s passes ROWS_PER_SHARD_K8S)")
    ap.add_argument("cli_args", nargs=argparse.REMAINDER, help="more batch_inference.cli run flags after --")
    args = ap.parse_args(argv)
    args.cli_args = [a for a in args.cli_args if a != "--"]
    signal.signal(signal.SIGTERM, _terminated)  # run the cleanup (finally/with) on `kill`, too
    try:
        return run(args)
    except KeyboardInterrupt:
        print("run-k8s interrupted; everything it started was stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
