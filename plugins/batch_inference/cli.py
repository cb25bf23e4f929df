"""Local drivers behind ``make run`` and ``make render-k8s``.

``python -m batch_inference.cli run [--input URI] [--output DIR] [--id-column C] [--dry-run] [...]``:
every DAG Param is a ``--kebab-case`` flag (:func:`add_param_flags`, from ``PARAM_FIELDS``), plus
``--conf JSON``; the conf is checked as the plan task will check it, then an Airflow home inside the
repository (``airflow_home/``, SQLite), ``airflow db migrate`` on first use, then ``airflow dags test
batch_inference_backfill`` with the run's conf. Airflow's own output goes to
``airflow_home/logs/make-run-<time>.log``; the terminal gets each task's start and end, a progress line
per running shard and one for the run every few seconds (:mod:`batch_inference.terminal`), then a short
summary and, as its LAST line, the path of the run's ``report.json``. On a failure it prints the first
failing task's own error and exits non-zero. The operator running it is trusted: the input's directory, the output
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
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from batch_contract import storage
from batch_contract.engine_config import ConfigError
from batch_contract.runstore import RunStore

from batch_inference.params import (
    ALLOWED_ROOTS_ENV,
    PARAM_FIELDS,
    REPO_ROOT,
    SAMPLE_INPUT,
    ParamField,
    allowed_roots_value,
    check_known_params,
    param_default,
    resolve_run_config,
)
from batch_inference.planner import PlanRequest, plan
from batch_inference.pod_spec import K8sSettings
from batch_inference.templating import resolve_templates
from batch_inference.terminal import DagTestOutput, Printer, ProgressWatcher

AIRFLOW_HOME = Path(os.environ.get("BATCH_CLI_AIRFLOW_HOME") or REPO_ROOT / "airflow_home")
"""The Airflow home of ``make run`` (SQLite); ``BATCH_CLI_AIRFLOW_HOME`` moves it (tests use their own)."""


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


def dags_test(dag_id: str, conf: dict[str, Any], env: dict[str, str], log_path: Path, *,
              emit: Callable[[str], None] | None = None, output: DagTestOutput | None = None,
              progress_interval: float = 5.0) -> tuple[int, str]:
    """Run ``airflow dags test <dag_id> --conf <json>``; output to ``log_path``.

    While it runs, ``emit`` (when given) gets a line per task start/end (:class:`DagTestOutput`) and,
    every ``progress_interval`` seconds, a line per running shard and one for the run
    (:class:`ProgressWatcher`, reading ``conf["output_root"]``'s run store).

    Returns:
        ``(exit code, report URI or "")``; the URI comes from the summary task's log line. ``output``
        (when given) holds the run id and the failed tasks' messages afterwards.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "airflow", "dags", "test", dag_id, "--conf", json.dumps(conf)]
    parsed = output if output is not None else DagTestOutput()
    watcher = None
    if emit is not None and conf.get("output_root"):
        watcher = ProgressWatcher(str(conf["output_root"]), lambda: parsed.run_id, emit,
                                  interval=progress_interval, dag_id=dag_id).start()
    try:
        with open(log_path, "w") as log_fh:
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    errors="replace", bufsize=1)
            assert proc.stdout is not None
            try:
                for line in proc.stdout:
                    log_fh.write(line)
                    for shown in parsed.feed(line):
                        if emit is not None:
                            emit(shown)
                code = proc.wait()
            except KeyboardInterrupt:  # Ctrl-C: the workers got SIGINT too, commit what is done, exit 75
                code = INTERRUPTED_EXIT
                (emit or print)("interrupted: the running shard committed its finished chunks; run the same "
                                "command again to resume (committed rows and cached results are reused)")
                proc.wait()
    finally:
        if watcher is not None:
            watcher.stop()
            try:
                watcher.poll()  # the last state (shards completed since the previous poll)
            except Exception as exc:  # noqa: BLE001 - progress is advisory
                emit(f"  (progress unavailable: {type(exc).__name__}: {exc})")
    return code, parsed.report_uri


INTERRUPTED_EXIT = 130
"""Exit code of the CLI after Ctrl-C (128 + SIGINT, the shell's convention)."""

_FLAG_ALIASES = {"input_uri": ("--input",), "output_root": ("--output",), "output_table": ("--table",)}
"""Older spellings kept working next to the Param-named flags."""
CLI_DEFAULTS: dict[str, Any] = {"input_uri": SAMPLE_INPUT, "output_root": str(REPO_ROOT / "output"),
                                "parallelism": 1}
"""Where the CLI differs from the Param defaults: the bundled sample, the repo's output/, and
parallelism 1: ``airflow dags test`` runs mapped tasks one at a time, so the one running worker gets every
core (parallelism N would only give it cores // N threads). Every other Param, ``rows_per_shard``
included, has one default: its :data:`~batch_inference.params.PARAM_FIELDS` entry (``make run`` passes
``--rows-per-shard $(ROWS_PER_SHARD)`` so the 6,000-row sample shows a fan-out)."""
_NULL = object()


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object ({...})")
    return value


def _flag_type(spec: ParamField) -> Callable[[str], Any]:
    base: Callable[[str], Any] = {"integer": int, "number": float, "object": _json_object}.get(spec.type, str)
    if not spec.nullable:
        return base

    def nullable(text: str) -> Any:
        return _NULL if text.strip().lower() in ("", "null", "none") else base(text)

    nullable.__name__ = base.__name__
    return nullable


def add_param_flags(parser: argparse.ArgumentParser) -> None:
    """One ``--kebab-case`` flag per Param of :data:`PARAM_FIELDS` (its type, enum and help from the
    table; booleans as ``--flag/--no-flag``; nullable ones accept ``null``), plus ``--conf JSON``.
    Every flag defaults to ``None`` (not given: the Param's default, or :data:`CLI_DEFAULTS`)."""
    group = parser.add_argument_group("DAG Params (passed as the run's conf; flags override --conf)")
    group.add_argument("--conf", type=_json_object, default=None, metavar="JSON",
                       help="a JSON object of Params, e.g. '{\"engine_options\": {\"dtype\": \"float32\"}}'")
    for name, spec in PARAM_FIELDS.items():
        flags = ("--" + name.replace("_", "-"), *_FLAG_ALIASES.get(name, ()))
        default = CLI_DEFAULTS.get(name, spec.default)
        shown = "warehouse.duckdb next to the output root" if name == "duckdb_path" else repr(default)
        text = f"{spec.title}: {spec.description} (default: {shown})".replace("%", "%%")
        if spec.type == "boolean":
            group.add_argument(*flags, dest=name, action=argparse.BooleanOptionalAction, default=None, help=text)
            continue
        group.add_argument(*flags, dest=name, type=_flag_type(spec), default=None, help=text,
                           choices=list(spec.enum) if spec.enum else None,
                           metavar=None if spec.enum else spec.type.upper())


def param_conf(args: argparse.Namespace) -> dict[str, Any]:
    """The Params given on the command line: ``--conf`` updated with the flags that were given."""
    conf = dict(args.conf or {})
    for name in PARAM_FIELDS:
        value = getattr(args, name, None)
        if value is not None:
            conf[name] = None if value is _NULL else value
    return conf


def _resolved(uri: str) -> str:
    """A URI (``file://``, ``gs://``) as written; a plain path made absolute."""
    return uri if storage.scheme_of(uri) else str(Path(uri).resolve())


def _conf(args: argparse.Namespace) -> dict[str, Any]:
    """The run's conf: :func:`param_conf` over :data:`CLI_DEFAULTS`, paths resolved; the DuckDB file
    (unless given) next to a local output, in the repo's output/ for a remote one (gs://)."""
    conf = {**CLI_DEFAULTS, **param_conf(args)}
    conf["input_uri"] = _resolved(conf["input_uri"])
    output = conf["output_root"] = _resolved(conf["output_root"])
    if conf.get("duckdb_path"):
        conf["duckdb_path"] = _resolved(conf["duckdb_path"])
    else:
        duckdb_dir = storage.local_path(output) if storage.is_local(output) else REPO_ROOT / "output"
        conf["duckdb_path"] = str(duckdb_dir / "warehouse.duckdb")
    return conf


def precheck(conf: dict[str, Any]) -> None:
    """Check the conf as the plan task will (:func:`resolve_run_config`) before starting Airflow, so a
    bad flag fails in a second, not after Airflow's start-up, and reject keys that are not Params
    (:func:`check_known_params`, the rule the plan task applies too: a typo would be ignored), and refuse Jinja in a value (a conf is never
    rendered: :mod:`batch_inference.templating`).

    Raises:
        ConfigError: naming ``params.<field>``.
    """
    check_known_params(conf)
    resolve_templates(conf, {}, {})  # a run's own value is never a template: refuse Jinja at once
    previous = os.environ.get(ALLOWED_ROOTS_ENV)
    os.environ[ALLOWED_ROOTS_ENV] = run_allowed_roots(conf, dict(os.environ))
    try:
        resolve_run_config({**{name: param_default(name) for name in PARAM_FIELDS}, **conf})
    finally:
        if previous is None:
            os.environ.pop(ALLOWED_ROOTS_ENV, None)
        else:
            os.environ[ALLOWED_ROOTS_ENV] = previous


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
    store = RunStore.open(report_uri.rsplit("/", 1)[0])
    inference = worker = 0.0
    for marker in store.complete_markers().values():
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
    from batch_inference.report import text_summary  # numpy: only for the summary of a finished run

    report = RunStore.open(report_uri.rsplit("/", 1)[0]).report()
    if report is None:
        raise FileNotFoundError(f"{report_uri}: no report")
    print(text_summary(report))
    print(f"wall {timing['wall_s']} s; worker inference {timing['worker_inference_s']} s "
          f"(share {timing['inference_share']}); whole worker processes {timing['worker_total_s']} s "
          f"(share {timing['worker_share']}); Airflow tasks {timing['task_seconds']}; outside tasks "
          f"(airflow dags test start-up, parsing, scheduling) {timing['outside_tasks_s']} s")
    print(json.dumps({"timing": timing}))


def cmd_run(args: argparse.Namespace) -> int:
    """``run``: precheck the conf, ``airflow dags test`` with live progress, then the summary; on a
    failure the first failing task's own error and a non-zero exit code."""
    env = airflow_env()
    conf = _conf(args)
    try:
        env[ALLOWED_ROOTS_ENV] = run_allowed_roots(conf, env)
        precheck(conf)
    except ConfigError as exc:
        print(f"run refused: {exc}", file=sys.stderr)
        return 2
    ensure_db(env)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    log_path = AIRFLOW_HOME / "logs" / f"make-run-{stamp}.log"
    if int(conf.get("parallelism") or 1) > 1:
        print(f"note: airflow dags test runs the shards one at a time; parallelism {conf['parallelism']} only "
              "gives each worker cores // parallelism threads (it overlaps shards under a real executor)",
              flush=True)
    print(f"batch_inference_backfill: {conf['input_uri']} -> {conf['output_root']} "
          f"(runner {conf.get('runner', param_default('runner'))}; Airflow log: {log_path})", flush=True)
    start = time.monotonic()
    output = DagTestOutput()
    printer = Printer()
    code, report = dags_test("batch_inference_backfill", conf, env, log_path, emit=printer, output=output,
                             progress_interval=args.progress_interval)
    wall = time.monotonic() - start
    if code == INTERRUPTED_EXIT:
        return code
    if code == 0 and not output.failures and conf.get("dry_run"):
        print(f"dry run done in {wall:.0f} s: nothing was run (pod manifests: see the render_k8s task in {log_path})")
        return 0
    if code != 0 or not report or output.failures:
        return _report_failure(output, code, log_path)
    _print_summary(report, _timing(report, wall))
    print(report)
    return 0


def _report_failure(output: DagTestOutput, code: int, log_path: Path) -> int:
    """Print the first failing task's own error (or the log's tail when none was found); returns the
    exit code (never 0)."""
    failure = output.first_failure
    if failure is not None:
        print(f"run failed: task {failure.task}: {failure.message}", file=sys.stderr)
        later = [f.task for f in output.failures[1:]]
        if later:
            print(f"  (then also failed, downstream of it: {', '.join(later)})", file=sys.stderr)
    else:
        tail = log_path.read_text(errors="replace").splitlines()[-40:]
        print("\n".join(tail), file=sys.stderr)
    print(f"run failed (exit {code or 1}); full Airflow log: {log_path}", file=sys.stderr)
    return code or 1


def cmd_render(args: argparse.Namespace) -> int:
    # the kubernetes provider (~1 s of CPU): render-k8s only
    from batch_inference.shard_pod import render_pod_manifests

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
    # allow_abbrev=False: a shortened flag (--budget for --budget-usd) is an error, never a silent guess
    parser = argparse.ArgumentParser(prog="batch_inference.cli", description=__doc__.split("\n\n")[0],
                                     allow_abbrev=False)
    sub = parser.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="airflow dags test batch_inference_backfill, local runner", allow_abbrev=False,
                         description="Every DAG Param is a flag; the run's conf is --conf updated with the "
                                     "flags given; a Param not given takes the DAG's default (the input and "
                                     "output default to the bundled sample and output/; make run passes "
                                     "--rows-per-shard 3000).")
    run.add_argument("--progress-interval", type=float, default=5.0, metavar="SECONDS",
                     help="seconds between progress lines (default 5)")
    add_param_flags(run)
    render = sub.add_parser("render-k8s", help="plan and write pod manifests (no cluster)", allow_abbrev=False)
    render.add_argument("--input", default=SAMPLE_INPUT)
    render.add_argument("--output", default=str(REPO_ROOT / "output"))
    render.add_argument("--out", default=str(REPO_ROOT / "build" / "k8s"))
    render.add_argument("--rows-per-shard", type=int, default=param_default("rows_per_shard"))
    render.add_argument("--run-id", default=None)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the ``run`` or ``render-k8s`` command; returns the process exit code."""
    args = build_parser().parse_args(argv)
    return cmd_run(args) if args.cmd == "run" else cmd_render(args)


if __name__ == "__main__":
    sys.exit(main())
