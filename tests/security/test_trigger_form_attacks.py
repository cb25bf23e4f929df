"""Attacks of a user who may only trigger a DAG: hostile ``conf`` values through real DAG runs.

One subprocess runs every attack as its own ``dag.test()`` (Airflow 3, real DAG files, a fresh SQLite
home) in a deployment with planted secrets: a PostgreSQL connection and an Iceberg catalog connection
whose URIs carry :attr:`Planted.conn_password`, a Variable, an env var, and a policy file
(``BATCH_INFERENCE_POLICY``) with ceilings and with roots and connection ids of *other* DAGs that a
refusal must never name. Each attack must fail its run in the plan task, before any shard, with a
``ConfigError`` naming the field; then the whole Airflow home (task logs, the metadata database with its
XComs), every run output and the console are searched for every planted secret form.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import airflow_test_home
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from run_helpers import REPO_ROOT

pytestmark = [pytest.mark.integration, pytest.mark.dagrun]

OTHER_ROOT = "/srv/other-team-root-5e1c"
OTHER_CONN = "other_team_conn_5e1c"
"""Allowed to another DAG (or as well to this one): a refusal message must never show them."""

RUN_ATTACKS = textwrap.dedent("""
    import json, sys
    from datetime import datetime, timedelta, timezone
    from airflow.dag_processing.dagbag import DagBag
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select
    attacks = json.loads(open(sys.argv[1]).read())
    bag = DagBag(dag_folder=sys.argv[2])
    assert not bag.import_errors, bag.import_errors
    start = datetime(2026, 3, 1, tzinfo=timezone.utc)
    for i, attack in enumerate(attacks):
        print(f"ATTACK-START {attack['name']}", flush=True)
        dag = bag.dags[attack["dag_id"]]
        when = start + timedelta(days=attack.get("day", i))
        try:
            dr = dag.test(run_conf=attack["conf"], logical_date=when, run_after=when)
        except Exception as exc:  # the form's own schema refused the conf: no run was created
            print(f"{type(exc).__name__}: {exc}", flush=True)
            print("RESULT " + json.dumps({"name": attack["name"], "state": "rejected", "run_id": None,
                                          "tasks": {}, "xcoms": []}), flush=True)
            continue
        states = {ti.task_id: str(ti.state) for ti in dr.get_task_instances()}
        with create_session() as session:
            xcoms = [str(v) for v in session.execute(select(XComModel.value).where(
                XComModel.run_id == dr.run_id, XComModel.dag_id == dr.dag_id)).scalars()]
        print("RESULT " + json.dumps({"name": attack["name"], "state": str(dr.state), "run_id": dr.run_id,
                                      "tasks": states, "xcoms": xcoms}), flush=True)
""")


def _cases(out: Path) -> list[tuple[str, dict, str]]:
    """``(name, conf, the message the plan task must fail with)`` for every attack (no I/O)."""
    other_run = out / "runs" / "batch_inference_nightly" / "r1" / "shards" / "00000"
    pw = "conn.planted_pg.password"
    cases = [
        ("template_conn_password_reversed", {"input_uri": f"{out}/{{{{ {pw}[::-1] }}}}"}, "input_uri: a value given to a run"),
        ("template_variable_in_output_root", {"output_root": f"{out}/{{{{ var.value.planted_var }}}}"}, "output_root: a value given to a run"),
        ("template_xcom_in_duckdb_path", {"duckdb_path": f"{out}/{{{{ ti.xcom_pull(task_ids='plan') }}}}.duckdb"}, "duckdb_path: a value given to a run"),
        ("template_statement_in_table", {"output_table": f"t{{% set p = {pw} %}}{{{{ p|lower }}}}"}, "output_table: a value given to a run"),
        ("template_in_a_column_name", {"text_column": f"{{{{ {pw} }}}}"}, "text_column: a value given to a run"),
        ("template_comment_smuggling", {"input_uri": f"{out}/{{# {pw} #}}x"}, "input_uri: a value given to a run"),
        ("postgres_conn_not_allowed", {"publish_backend": "postgres", "postgres_conn_id": "planted_pg"}, "postgres_conn_id: 'planted_pg' is not a connection this DAG may"),
        ("iceberg_conn_not_allowed", {"publish_backend": "iceberg", "iceberg_catalog_conn_id": "planted_pg"}, "iceberg_catalog_conn_id: 'planted_pg' is not a connection"),
        ("output_root_outside", {"output_root": "/etc/batch-out"}, "output_root: '/etc/batch-out' is outside the output roots"),
        ("duckdb_path_outside", {"duckdb_path": "/var/lib/other/w.duckdb"}, "duckdb_path: '/var/lib/other/w.duckdb' is outside"),
        ("input_outside", {"input_uri": "/etc/passwd"}, "input_uri: '/etc/passwd' is outside the input roots"),
        ("input_from_another_dags_outputs", {"input_uri": str(other_run / "part-00000-x.parquet")}, "input_uri: lies in the runs/ or cache/"),
        ("publish_replaces_a_foreign_table", {"output_table": "users", "duckdb_path": str(out / "prod.duckdb")},
         "output_table: duckdb:"),
        ("model_outside_the_model_roots", {"model": "/etc/ssl"}, "model: '/etc/ssl' is outside the model roots"),
        ("ceiling_token_budget", {"token_budget": 8192}, "token_budget: 8192 is above this DAG's ceiling"),
        ("ceiling_budget_usd", {"budget_usd": 500.0}, "budget_usd: 500.0 is above this DAG's ceiling"),
        ("ceiling_deadline_hours", {"deadline_hours": 100.0}, "deadline_hours: 100.0 is above"),
        ("ceiling_parallelism", {"parallelism": 64}, "parallelism: 64 is above"),
        ("ceiling_max_gpus", {"max_gpus": 64}, "max_gpus: 64 is above"),
        ("ceiling_llm_max_tokens", {"engine": "llm", "model": str(out / "m"), "engine_options": {"max_tokens": 100000}},
         "engine_options.max_tokens: 100000 is above"),
    ]
    return cases


def _foreign_table(path: Path) -> list[tuple]:
    """A DuckDB file holding ``batch_inference.users``, a table publish did not create; its rows."""
    import duckdb

    with duckdb.connect(str(path)) as con:
        con.execute("CREATE SCHEMA IF NOT EXISTS batch_inference")
        con.execute("CREATE TABLE IF NOT EXISTS batch_inference.users (id INTEGER, email VARCHAR)")
        if not con.execute("SELECT count(*) FROM batch_inference.users").fetchone()[0]:
            con.execute("INSERT INTO batch_inference.users VALUES (1, 'a@example.com'), (2, 'b@example.com')")
        return con.execute("SELECT * FROM batch_inference.users ORDER BY id").fetchall()


def _attacks(root: Path) -> list[dict]:
    """Every attack as the runner script reads it; writes the other DAG's part file the input attack names."""
    out = root / "out"
    sample = str(REPO_ROOT / "data" / "sample" / "debian_descriptions_sample.parquet")
    from batch_inference.params import PARAM_FIELDS, param_default

    # every Param given: dag.test() keeps one run's conf in the DAG's params for the next run in-process
    base = {name: param_default(name) for name in PARAM_FIELDS}
    base |= {"input_uri": sample, "output_root": str(out), "duckdb_path": str(out / "w.duckdb"),
            "runner": "local", "row_limit": 20, "canary": False, "reuse": "off", "output_table": "attack_t"}
    other_run = out / "runs" / "batch_inference_nightly" / "r1" / "shards" / "00000"
    other_run.mkdir(parents=True)
    pq.write_table(pa.table({"id": [1], "text": ["other team's result"]}), other_run / "part-00000-x.parquet")
    _foreign_table(out / "prod.duckdb")
    return [{"name": name, "dag_id": "batch_inference_backfill", "conf": {**base, **conf}, "expect": expect}
            for name, conf, expect in _cases(out)]


@pytest.fixture(scope="module")
def attacked(tmp_path_factory: pytest.TempPathFactory, planted) -> dict:
    """Run every attack once (one subprocess); ``{"results": {name: RESULT}, "sections": {name: console},
    "console", "home", "out", "attacks"}``."""
    tmp = tmp_path_factory.mktemp("trigger_form")
    attacks = _attacks(tmp)
    policy = tmp / "policy.json"
    policy.write_text(json.dumps({
        "defaults": {"input_roots": [str(tmp), str(REPO_ROOT / "data"), OTHER_ROOT],
                     "output_roots": [str(tmp), OTHER_ROOT], "postgres_conn_ids": ["batch_inference_postgres", OTHER_CONN],
                     "iceberg_catalog_conn_ids": [OTHER_CONN], "max_token_budget": 4096, "max_max_tokens": 256,
                     "max_budget_usd": 50.0, "max_deadline_hours": 48.0, "max_parallelism": 8},
        "dags": {"batch_inference_nightly": {"output_roots": [OTHER_ROOT + "-nightly"]}},
    }))
    spec = tmp / "attacks.json"
    spec.write_text(json.dumps(attacks))
    home = tmp / "airflow_home"
    dsn = f"postgresql://admin:{planted.conn_password}@127.0.0.1:1/prod"
    env = airflow_test_home.airflow_env(home, {
        "OMP_NUM_THREADS": "1", "BATCH_INFERENCE_POLICY": str(policy),
        "AIRFLOW_CONN_PLANTED_PG": dsn, "AIRFLOW_CONN_BATCH_INFERENCE_POSTGRES": dsn,
        "AIRFLOW_VAR_PLANTED_VAR": planted.variable, "MY_SERVICE_TOKEN": planted.env,
    })
    proc = subprocess.run([sys.executable, "-c", RUN_ATTACKS, str(spec), str(REPO_ROOT / "dags")], env=env,
                          capture_output=True, text=True, timeout=1200)
    console = proc.stdout + proc.stderr
    (tmp / "console.log").write_text(console)
    assert proc.returncode == 0, console[-6000:]
    results, sections, current = {}, {}, None
    for line in proc.stdout.splitlines():
        if line.startswith("ATTACK-START "):
            current = line.split(" ", 1)[1]
            sections[current] = []
        elif line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
            results[result["name"]] = result
        elif current:
            sections[current].append(line)
    return {"results": results, "sections": {k: "\n".join(v) for k, v in sections.items()}, "console": console,
            "home": home, "out": tmp / "out", "attacks": {a["name"]: a for a in attacks}}


ATTACK_NAMES = [case[0] for case in _cases(Path("/unused"))]


@pytest.mark.parametrize("name", ATTACK_NAMES)
def test_a_hostile_conf_fails_the_plan_task_and_starts_nothing(attacked: dict, name: str, no_secrets) -> None:
    result = attacked["results"].get(name)
    section = attacked["sections"].get(name, "")
    assert result is not None, attacked["console"][-4000:]
    field, _, message = attacked["attacks"][name]["expect"].partition(": ")
    if result["state"] == "rejected":  # the trigger form's JSON schema refused it: no run at all
        assert f"ParamValidationError: Invalid input for param {field}" in section, section[-3000:]
    else:
        assert result["state"].endswith("failed"), (result, section[-3000:])
        assert result["tasks"]["plan"].endswith("failed"), result["tasks"]
        assert not any(t.startswith(("infer", "publish")) and s.endswith("success") for t, s in result["tasks"].items())
        assert f"ConfigError: params.{field}: {message}" in section, section[-3000:]
        assert not (attacked["out"] / "runs" / "batch_inference_backfill" / result["run_id"]).exists(), \
            "no run directory for a refused plan"
    assert OTHER_ROOT not in section and OTHER_CONN not in section, "a refusal named another DAG's setting"
    no_secrets(section, "\n".join(result["xcoms"]))


def test_no_planted_secret_reaches_any_log_xcom_or_output(attacked: dict, no_secrets) -> None:
    """The whole Airflow home (task logs, metadata DB with XComs and rendered fields), every output."""
    assert len(attacked["results"]) == len(ATTACK_NAMES)
    import duckdb

    with duckdb.connect(str(attacked["out"] / "prod.duckdb"), read_only=True) as con:
        tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        rows = con.execute("SELECT * FROM batch_inference.users ORDER BY id").fetchall()
    assert rows == [(1, "a@example.com"), (2, "b@example.com")], "the foreign table is untouched"
    assert not {t for t in tables if t.startswith("users__")}, f"publish created tables beside it: {tables}"
    no_secrets(attacked["console"], attacked["home"], attacked["out"])
