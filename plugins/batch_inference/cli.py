"""Local drivers behind ``make run`` and ``make render-k8s``.

``python -m batch_inference.cli run [--input URI] [--output DIR] [--runner local] [...]``:
an Airflow home inside the repository (``airflow_home/``, SQLite), ``airflow db migrate`` on first use,
then ``airflow dags test batch_inference_backfill`` with the run's conf. Airflow's own output goes to
``airflow_home/logs/make-run-<time>.log``; the terminal gets a short summary and, as its LAST line, the
path of the run's ``report.json``. The operator running it is trusted: the input's directory, the output
root and the DuckDB file's directory are added to ``BATCH_INFERENCE_ALLOWED_ROOTS`` for that run only
(:func:`run_allowed_roots`).

``python -m batch_inference.cli render-k8s [--input URI] [--out build/k8s]``: plans a run (metadata
only) and writes the pod manifests of the kubernetes runner, with no cluster and no Airflow run.
"""

from __future__ import annotations

import argparse
import json
import os
import posixpath
import re
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from batch_contract import storage
from batch_contract.engine_config import ConfigError

from batch_inference.params import (
    ALLOWED_ROOTS_ENV,
    REPO_ROOT,
    RUNNERS,
    SAMPLE_INPUT,
    allowed_roots_value,
    param_default,
)
from batch_inference.publish.target import BACKENDS

AIRFLOW_HOME = REPO_ROOT / "airflow_home"
REPORT_RE = re.compile(r"BATCH_INFERENCE_REPORT_JSON=(\S+)")


def airflow_env(airflow_home: Path = AIRFLOW_HOME) -> dict[str, str]:
    """Environment for Airflow CLI calls: repo-local home, SQLite, this repo's dags and plugins."""
    env = dict(os.environ)
    bin_dir = str(Path(sys.executable).parent)
    env.update({
        "AIRFLOW_HOME": str(airflow_home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_ROOT / "dags"),
        # Not plugins/: Airflow's plugin manager executes every .py file in its plugins folder (a
        # package's __main__.py included); the packages come in through PYTHONPATH instead.
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(airflow_home / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT / "plugins"),
                                                    str(REPO_ROOT / "worker_image"),
                                                    env.get("PYTHONPATH", "")])),
        "PATH": bin_dir + os.pathsep + env.get("PATH", ""),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    })
    return env


def ensure_db(env: dict[str, str]) -> None:
    """``airflow db migrate`` once per Airflow version (a stamp file in the Airflow home)."""
    import airflow

    home = Path(env["AIRFLOW_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    stamp = home / f".migrated-{airflow.__version__}"
    if stamp.exists():
        return
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    stamp.touch()


def dags_test(dag_id: str, conf: dict[str, Any], env: dict[str, str], log_path: Path) -> tuple[int, str]:
    """Run ``airflow dags test <dag_id> --conf <json>``; output to ``log_path``.

    Returns:
        ``(exit code, report URI or "")``; the URI comes from the summary task's log line.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "airflow", "dags", "test", dag_id, "--conf", json.dumps(conf)]
    report = ""
    with open(log_path, "w") as log_fh:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace", bufsize=1)
        assert proc.stdout is not None
        for line in proc.stdout:
            log_fh.write(line)
            match = REPORT_RE.search(line)
            if match:
                report = match.group(1)
            if "Marking task as" in line or "wrote part" in line.lower():
                print("  " + _short(line), flush=True)
        code = proc.wait()
    return code, report


def _short(line: str) -> str:
    line = re.sub(r"\x1b\[[0-9;]*m", "", line.strip())
    return line[-160:]


def _conf(args: argparse.Namespace) -> dict[str, Any]:
    # A URI (file://, gs://) stays as written, a plain path is resolved; the DuckDB file is always local:
    # next to a local output, in the repo's output/ for a remote one (gs://).
    output = args.output if storage.scheme_of(args.output) else str(Path(args.output).resolve())
    duckdb_dir = storage.local_path(output) if storage.is_local(output) else REPO_ROOT / "output"
    conf: dict[str, Any] = {
        "input_uri": args.input if storage.scheme_of(args.input) else str(Path(args.input).resolve()),
        "output_root": output,
        "duckdb_path": str(duckdb_dir / "warehouse.duckdb"),
        "runner": args.runner,
        "rows_per_shard": args.rows_per_shard,
        "parallelism": args.parallelism,
        "row_limit": args.row_limit,
        "output_table": args.table,
        "publish_backend": args.publish_backend,
    }
    if args.model:
        conf["model"] = args.model
    return conf


def _parent_of(uri: str) -> str:
    """The directory holding ``uri``: a local directory itself, else the parent (``gs://b/in/x`` ->
    ``gs://b/in``; ``gs://b`` stays; a glob -> the directory the pattern is written in)."""
    if storage.is_local(uri):
        path = storage.local_path(uri)
        return str(path if path.is_dir() else path.parent)
    trimmed = uri.rstrip("/")
    return posixpath.dirname(trimmed) if trimmed.count("/") > 2 else trimmed


def run_allowed_roots(conf: dict[str, Any], env: dict[str, str]) -> str:
    """``BATCH_INFERENCE_ALLOWED_ROOTS`` for one ``make run``: the roots already allowed (the variable,
    or the defaults when unset) plus the input's directory, the output root and the DuckDB file's
    directory from ``conf`` (the operator's own command line is trusted)."""
    extra = [_parent_of(conf["input_uri"]), conf["output_root"], str(Path(conf["duckdb_path"]).parent)]
    return allowed_roots_value(extra, env)


def _timing(report_uri: str, wall_s: float) -> dict[str, Any]:
    """Share of wall time in worker inference and in whole worker processes, from the run's markers."""
    from batch_contract.runstore import RunStore

    store = RunStore.open(report_uri.rsplit("/", 1)[0])
    inference = worker = 0.0
    for marker in store.markers().values():
        inference += float(marker.stage_seconds.get("inference", 0.0))
        worker += sum(float(v) for v in marker.stage_seconds.values())
    tasks = task_seconds(AIRFLOW_HOME / "airflow.db", store.run_id)
    in_tasks = sum(tasks.values())
    return {"wall_s": round(wall_s, 2), "worker_inference_s": round(inference, 2),
            "worker_total_s": round(worker, 2),
            "inference_share": round(inference / wall_s, 4) if wall_s else None,
            "worker_share": round(worker / wall_s, 4) if wall_s else None,
            "task_seconds": {k: round(v, 2) for k, v in tasks.items()},
            "outside_tasks_s": round(wall_s - in_tasks, 2)}


def task_seconds(db_path: Path, run_id: str) -> dict[str, float]:
    """Seconds per task id (mapped tasks summed) of one run, from the Airflow metadata DB (SQLite).

    ``{}`` when the database is not SQLite at ``db_path``.
    """
    import sqlite3

    if not db_path.is_file():
        return {}
    with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as con:
        rows = con.execute("SELECT task_id, SUM(COALESCE(duration, 0)) FROM task_instance WHERE run_id = ? "
                           "GROUP BY task_id", (run_id,)).fetchall()
    return {task_id: float(seconds) for task_id, seconds in rows}


def _print_summary(report_uri: str, timing: dict[str, Any]) -> None:
    from batch_contract import storage

    from batch_inference.report import markdown_summary

    report = json.loads(storage.read_bytes(report_uri))
    print(markdown_summary(report))
    print(f"wall {timing['wall_s']} s; worker inference {timing['worker_inference_s']} s "
          f"(share {timing['inference_share']}); whole worker processes {timing['worker_total_s']} s "
          f"(share {timing['worker_share']}); Airflow tasks {timing['task_seconds']}; outside tasks "
          f"(airflow dags test start-up, parsing, scheduling) {timing['outside_tasks_s']} s")
    print(json.dumps({"timing": timing}))


def cmd_run(args: argparse.Namespace) -> int:
    env = airflow_env()
    ensure_db(env)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    log_path = AIRFLOW_HOME / "logs" / f"make-run-{stamp}.log"
    conf = _conf(args)
    try:
        env[ALLOWED_ROOTS_ENV] = run_allowed_roots(conf, env)
    except ConfigError as exc:
        print(f"run refused: {exc}", file=sys.stderr)
        return 2
    print(f"batch_inference_backfill: {conf['input_uri']} -> {conf['output_root']} "
          f"(runner {conf['runner']}; Airflow log: {log_path})", flush=True)
    start = time.monotonic()
    code, report = dags_test("batch_inference_backfill", conf, env, log_path)
    wall = time.monotonic() - start
    if code != 0 or not report:
        tail = log_path.read_text(errors="replace").splitlines()[-40:]
        print("\n".join(tail), file=sys.stderr)
        print(f"run failed (exit {code}); full log: {log_path}", file=sys.stderr)
        return code or 1
    _print_summary(report, _timing(report, wall))
    print(report)
    return 0


def cmd_render(args: argparse.Namespace) -> int:
    from batch_inference.planner import PlanRequest, plan
    from batch_inference.pod_spec import K8sSettings, render_pod_manifests

    run_id = args.run_id or "render__" + datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    # the DAG's defaults for everything not on the command line (shard_by and the shard cap: PlanRequest's)
    request = PlanRequest(input_uri=str(Path(args.input).resolve()), id_column=param_default("id_column"),
                          text_column=param_default("text_column"),
                          output_root=str(Path(args.output).resolve()), run_id=run_id,
                          engine={"kind": param_default("engine")}, rows_per_shard=args.rows_per_shard)
    manifest, refs = plan(request)
    paths = render_pod_manifests(refs, run_id, K8sSettings.from_env(), args.out, worker=manifest.worker)
    for path in paths:
        print(path)
    print(f"{len(paths)} pod manifest(s) for run {run_id} in {args.out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``run`` and ``render-k8s`` command lines; options that are DAG Params default to the Param's
    default (:func:`batch_inference.params.param_default`)."""
    parser = argparse.ArgumentParser(prog="batch_inference.cli", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="airflow dags test batch_inference_backfill, local runner")
    run.add_argument("--input", default=SAMPLE_INPUT)
    run.add_argument("--output", default=str(REPO_ROOT / "output"))
    run.add_argument("--runner", default=param_default("runner"), choices=list(RUNNERS))
    run.add_argument("--rows-per-shard", type=int, default=3000)
    run.add_argument("--parallelism", type=int, default=param_default("parallelism"))
    run.add_argument("--row-limit", type=int, default=param_default("row_limit"))
    run.add_argument("--table", default=param_default("output_table"))
    run.add_argument("--publish-backend", default=param_default("publish_backend"), choices=list(BACKENDS))
    run.add_argument("--model", default=None)
    render = sub.add_parser("render-k8s", help="plan and write pod manifests (no cluster)")
    render.add_argument("--input", default=SAMPLE_INPUT)
    render.add_argument("--output", default=str(REPO_ROOT / "output"))
    render.add_argument("--out", default=str(REPO_ROOT / "build" / "k8s"))
    render.add_argument("--rows-per-shard", type=int, default=2000)
    render.add_argument("--run-id", default=None)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the ``run`` or ``render-k8s`` command; returns the process exit code."""
    args = build_parser().parse_args(argv)
    return cmd_run(args) if args.cmd == "run" else cmd_render(args)


if __name__ == "__main__":
    sys.exit(main())
