"""The operator CLI without Airflow: flags from the Param table, the conf, and reading ``dags test`` output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from batch_contract.engine_config import ConfigError
from batch_inference.cli import _conf, build_parser, param_conf, precheck
from batch_inference.params import PARAM_FIELDS, SAMPLE_INPUT
from batch_inference.terminal import DagTestOutput, run_line


def _args(*argv: str):
    return build_parser().parse_args(["run", *argv])


def test_every_param_is_a_flag() -> None:
    text = build_parser()._subparsers._group_actions[0].choices["run"].format_help()
    for name in PARAM_FIELDS:
        assert "--" + name.replace("_", "-") in text, name


def test_flags_become_the_conf_with_their_types() -> None:
    args = _args("--id-column", "key", "--text-column", "body", "--engine", "llm", "--model", "/m",
                 "--dry-run", "--row-limit", "20", "--min-success-ratio", "0.5",
                 "--engine-options", '{"dtype": "float32"}', "--gpu-hour-usd-spot", "null")
    assert param_conf(args) == {"id_column": "key", "text_column": "body", "engine": "llm", "model": "/m",
                                "dry_run": True, "row_limit": 20, "min_success_ratio": 0.5,
                                "engine_options": {"dtype": "float32"}, "gpu_hour_usd_spot": None}
    assert param_conf(_args("--no-dry-run")) == {"dry_run": False}


def test_conf_json_is_overridden_by_flags_and_old_flags_still_work(tmp_path: Path) -> None:
    args = _args("--conf", '{"row_limit": 5, "shard_by": "rows"}', "--row-limit", "7",
                 "--input", str(tmp_path / "in.parquet"), "--output", str(tmp_path / "out"), "--table", "t1")
    conf = _conf(args)
    assert conf["row_limit"] == 7 and conf["shard_by"] == "rows" and conf["output_table"] == "t1"
    assert conf["input_uri"] == str(tmp_path / "in.parquet")
    assert conf["duckdb_path"] == str(tmp_path / "out" / "warehouse.duckdb")
    defaults = _conf(_args())
    assert defaults["input_uri"] == SAMPLE_INPUT and "rows_per_shard" not in defaults  # the Param's default


def test_bad_values_are_refused_before_airflow_starts(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        _args("--engine", "nope")
    with pytest.raises(SystemExit):
        _args("--row-limit", "many")
    with pytest.raises(ConfigError, match="params.model"):
        precheck(_conf(_args("--engine", "llm", "--output", str(tmp_path))))
    precheck(_conf(_args("--output", str(tmp_path))))



@pytest.mark.parametrize(("key", "suggested"), [("budget", "budget_usd"), ("deadline", "deadline_hours"),
                                                ("requre_approval", "require_approval"), ("tokenbudget", "token_budget"),
                                                ("bogus_param", None)])
def test_conf_keys_that_are_not_params_are_refused_with_the_nearest_param(tmp_path: Path, key, suggested) -> None:
    """A misspelt guardrail must not be dropped silently (the run would go ahead without it)."""
    conf = _conf(_args("--output", str(tmp_path), "--conf", json.dumps({key: 1})))
    with pytest.raises(ConfigError, match=f"params.{key}: not a Param") as err:
        precheck(conf)
    assert (f"did you mean {suggested!r}" in str(err.value)) if suggested else "did you mean" not in str(err.value)
    with_jinja = {**conf, "output_table": "t_{{ ds_nodash }}"}
    with pytest.raises(ConfigError, match=f"params.{key}"):
        precheck(with_jinja)


FAILED_PLAN = """\
2026-12-01T03:20:34.989Z [info     ] Created dag run.               [airflow.models.dagrun] dagrun=<DagRun d @ 2026: manual__2026-12-01T03:20:34.989174+00:00, state:running, queued_at: None. run_type: manual>
2026-12-01T03:20:35.560834Z [info     ] [DAG TEST] starting task_id=plan map_index=-1 [airflow.sdk.definitions.dag] loc=dag.py:1501
2026-12-01T03:20:41.086309Z [error    ] Task failed with exception     [task] loc=task_runner.py:1639
Traceback (most recent call last):
  File "/x/task_runner.py", line 1579, in _run_task_and_map_outcome
    result = _execute_task(context=context, ti=ti, log=log)
airflow.sdk.exceptions.AirflowFailException: PlanError: id_column: column 'id' is missing from /in.parquet; its columns are: key, body
2026-12-01T03:20:41.10Z [info     ] Task instance state updated    [airflow.api_fastapi.execution_api.routes.task_instances] loc=task_instances.py:485 new_state=failed rows_affected=1
2026-12-01T03:20:43.238754Z [info     ] [DAG TEST] starting task_id=infer_local map_index=2 [airflow.sdk.definitions.dag] loc=dag.py:1501
2026-12-01T03:20:43.312538Z [error    ] Task failed with exception     [task] loc=task_runner.py:1639
Traceback (most recent call last):
  File "/x/sensors.py", line 92, in execute
ValueError: boom
2026-12-01T03:20:43.32Z [info     ] Task instance state updated    [x] new_state=failed rows_affected=1
"""


def test_dag_test_output_finds_the_run_the_tasks_and_the_first_real_error() -> None:
    out = DagTestOutput()
    shown = [line for raw in FAILED_PLAN.splitlines() for line in out.feed(raw, now=0.0)]
    assert out.run_id == "manual__2026-12-01T03:20:34.989174+00:00"
    assert shown[0] == f"run {out.run_id}" and shown[1] == "task plan: started"
    assert out.first_failure is not None and out.first_failure.task == "plan"
    assert out.first_failure.message == ("PlanError: id_column: column 'id' is missing from /in.parquet; its "
                                         "columns are: key, body")
    assert [f.task for f in out.failures] == ["plan", "infer_local[2]"]
    assert out.failures[1].message == "ValueError: boom"


def test_run_line() -> None:
    line = run_line({"total": 3, "completed": 1, "failed": 0, "running": 1, "pending": 1, "stale": 0,
                     "rows_total": 1500, "rows_done": 800, "rows_dead_letter": 0, "rows_per_s": 85.0,
                     "eta_s": 8.2, "fraction_done": 800 / 1500})
    assert line == "  run: shards 1/3 complete, 1 running, 1 pending | rows 800/1,500 (53.3%) | 85.0 rows/s | ETA 8s"


def test_ctrl_c_ends_with_a_resume_hint_not_a_traceback(tmp_path: Path, monkeypatch) -> None:
    """Ctrl-C while ``airflow dags test`` streams: the workers got SIGINT too (they commit and exit 75);
    the CLI says how to resume and returns 130 instead of raising KeyboardInterrupt."""
    from batch_inference import cli

    class _Proc:
        def __init__(self, *args, **kwargs) -> None:
            self.stdout = self

        def __iter__(self):
            yield "starting\n"
            raise KeyboardInterrupt

        def wait(self) -> int:
            return -2

    monkeypatch.setattr(cli.subprocess, "Popen", _Proc)
    lines: list[str] = []
    code, report = cli.dags_test("d", {}, {}, tmp_path / "log.txt", emit=lines.append)
    assert (code, report) == (cli.INTERRUPTED_EXIT, "")
    assert any("run the same command again to resume" in line for line in lines)
    assert (tmp_path / "log.txt").read_text() == "starting\n"


def test_a_shortened_flag_is_refused_not_taken_for_the_full_one() -> None:
    """argparse would read ``--budget 1`` as ``--budget-usd 1`` and start a real run: every proper prefix
    of every ``run`` and ``render-k8s`` flag is an error."""
    import argparse

    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    for cmd, sub in subs.items():
        for action in sub._actions:
            for flag in action.option_strings:
                if not flag.startswith("--") or len(flag) < 5:
                    continue
                with pytest.raises(SystemExit):
                    parser.parse_args([cmd, flag[:-1], "1"])
