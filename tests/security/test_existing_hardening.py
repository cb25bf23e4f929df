"""Security: trigger-form values are validated, templates are sandboxed, credentials never leak.

* **SQL injection**: table names from the trigger form are checked by the form's JSON schema, by
  ``resolve_run_config`` and again by ``PublishTarget`` before any SQL text is built.
* **Paths**: run ids and shard ids are single safe path segments (no ``..``, no ``/``), so nothing a
  form or a manifest says can make a worker write outside ``<output_root>/runs/<run_id>/``.
* **Credentials**: a real DAG run with a planted fake service-account key (``BATCH_GCS_CREDENTIALS_JSON``),
  a planted secret env var and a PostgreSQL connection whose URI carries a planted password publishes
  to a real PostgreSQL server; then every file under the run directory, the Airflow home (task logs)
  and the run's console output is grepped for the planted strings.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import airflow_test_home
import pytest
from batch_contract.engine_config import ConfigError
from batch_contract.layout import RunLayout
from pg_fixture import pg_dsn  # noqa: F401 - pytest fixture
from run_helpers import dag_run_dir

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import chaos_lib  # noqa: E402

pytestmark = pytest.mark.integration

INJECTIONS = [
    'emb"; DROP TABLE users; --',
    "emb; DELETE FROM x",
    "emb' OR '1'='1",
    "emb/*comment*/",
    "main.emb",
    "emb\nDROP",
    "",
    "1emb",
    "emb name",
]


def _backfill_dag():
    from batch_inference.dag_factory import build_all

    return build_all()["batch_inference_backfill"]


def _params(**kw) -> dict:
    from batch_inference.params import base_params

    values = {k: (v.value if hasattr(v, "value") else v) for k, v in base_params().items()}
    values.update(kw)
    return values


@pytest.mark.parametrize("name", INJECTIONS)
def test_sql_injection_in_table_name_is_rejected_everywhere(name: str) -> None:
    from airflow.sdk.definitions.param import ParamValidationError
    from batch_inference.params import resolve_run_config
    from batch_inference.publish.target import PublishTarget

    with pytest.raises(ParamValidationError):
        _backfill_dag().params.get_param("output_table").resolve(name)
    with pytest.raises(ConfigError, match="params.output_table"):
        resolve_run_config(_params(output_table=name))
    with pytest.raises(ValueError, match="table"):
        PublishTarget(backend="duckdb", table=name, duckdb_path="/tmp/unused.duckdb")


@pytest.mark.parametrize("name", ["Embeddings", "e" * 50, "e" * 40, "emb__staging", "emb__previous",
                                  "emb__dead_letters", "emb__publish_log", "e" * 39, "emb__stagingx"])
def test_every_table_name_the_form_accepts_can_be_published(name: str) -> None:
    """The form and ``resolve_run_config`` accept exactly the names ``PublishTarget`` accepts, so a bad
    name (upper case, 40+ characters, a reserved suffix) is refused before the run, not at publish."""
    from airflow.sdk.definitions.param import ParamValidationError
    from batch_inference.params import resolve_run_config
    from batch_inference.publish.target import PublishTarget

    try:
        PublishTarget(backend="duckdb", table=name, duckdb_path="/tmp/unused.duckdb")
    except ValueError:
        with pytest.raises(ParamValidationError):
            _backfill_dag().params.get_param("output_table").resolve(name)
        with pytest.raises(ConfigError, match="params.output_table"):
            resolve_run_config(_params(output_table=name))
    else:
        _backfill_dag().params.get_param("output_table").resolve(name)
        assert resolve_run_config(_params(output_table=name)).output_table == name


@pytest.mark.parametrize("run_id", ["../escape", "a/b", "..", "x/../../etc", "with space", "", "/abs"])
def test_run_id_cannot_leave_the_output_root(run_id: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="run_id"):
        RunLayout(str(tmp_path), run_id)


@pytest.mark.parametrize("shard_id", ["../00000", "00000/..", "0000", "../../etc", "00000 "])
def test_shard_id_cannot_leave_the_run_dir(shard_id: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="shard id"):
        RunLayout(str(tmp_path), "run").shard_dir(shard_id)


@pytest.mark.parametrize("field", ["output_root", "input_uri", "duckdb_path"])
def test_paths_outside_configured_roots_are_rejected(field: str) -> None:
    from batch_inference.params import resolve_run_config

    with pytest.raises(ConfigError, match=f"params.{field}"):
        resolve_run_config(_params(**{field: "/etc/cron.d/evil"}))


# ------------------------------------------------------------------------------- planted credentials

FAKE_KEY_MARK = "PLANTEDPRIVATEKEYb64Zm9vYmFy"
FAKE_KEY_ID = "planted0key0id0f00dfeedbeef"
FAKE_ENV_SECRET = "planted-env-secret-7c1a9e"
FAKE_PG_PASSWORD = "PlantedPgPassw0rd-93kq"
FAKE_SERVICE_ACCOUNT = json.dumps({
    "type": "service_account", "project_id": "planted-project", "private_key_id": FAKE_KEY_ID,
    "private_key": f"-----BEGIN PRIVATE KEY-----\n{FAKE_KEY_MARK}\n-----END PRIVATE KEY-----\n",
    "client_email": "planted@planted-project.iam.gserviceaccount.com", "client_id": "1",
    "token_uri": "https://oauth2.googleapis.com/token",
})
SECRETS = [FAKE_KEY_MARK, FAKE_KEY_ID, FAKE_ENV_SECRET, FAKE_PG_PASSWORD]

RUN_DAG = textwrap.dedent("""
    import json, sys
    from airflow.dag_processing.dagbag import DagBag
    bag = DagBag(dag_folder=sys.argv[2])
    assert not bag.import_errors, bag.import_errors
    dr = bag.dags["batch_inference_backfill"].test(run_conf=json.loads(sys.argv[1]))
    print("RESULT " + json.dumps({"state": str(dr.state), "run_id": dr.run_id}))
""")


def _files_containing(root: Path, needles: list[str]) -> dict[str, list[str]]:
    hits: dict[str, list[str]] = {}
    for path in root.rglob("*"):
        if not path.is_file():
            continue
        data = path.read_bytes()
        found = [n for n in needles if n.encode() in data]
        if found:
            hits[str(path)] = found
    return hits


@pytest.mark.dagrun
def test_planted_credentials_never_reach_logs_manifests_or_reports(tmp_path: Path, pg_dsn: str) -> None:  # noqa: F811
    home = tmp_path / "airflow_home"
    dsn_with_password = pg_dsn.replace("postgresql://postgres@", f"postgresql://postgres:{FAKE_PG_PASSWORD}@", 1)
    assert FAKE_PG_PASSWORD in dsn_with_password, f"unexpected DSN shape {pg_dsn}"
    env = airflow_test_home.airflow_env(home, {
        "OMP_NUM_THREADS": "1",
        "BATCH_GCS_CREDENTIALS_JSON": FAKE_SERVICE_ACCOUNT,
        "MY_SERVICE_TOKEN": FAKE_ENV_SECRET,
        "AIRFLOW_CONN_BI_SECRET_PG": dsn_with_password,
        "BATCH_INFERENCE_ALLOWED_CONN_IDS": "bi_secret_pg",
    })
    env.pop("STORAGE_EMULATOR_HOST", None)
    src = tmp_path / "in" / "rows.parquet"
    chaos_lib.make_chaos_input(src, 12, seed=4, max_chars=200)
    out = tmp_path / "out"
    conf = {"input_uri": str(src), "output_root": str(out), "runner": "local", "rows_per_shard": 1000,
            "publish_backend": "postgres", "postgres_conn_id": "bi_secret_pg", "output_table": "secret_test",
            "duckdb_path": str(out / "unused.duckdb")}
    proc = subprocess.run([sys.executable, "-c", RUN_DAG, json.dumps(conf), str(REPO / "dags")], env=env,
                          capture_output=True, text=True, timeout=900)
    console = proc.stdout + proc.stderr
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, console[-6000:]
    assert json.loads(lines[-1][7:])["state"].endswith("success"), console[-6000:]
    run_dir = dag_run_dir(out, json.loads(lines[-1][7:])["run_id"])
    assert (run_dir / "manifest.json").is_file() and (run_dir / "report.json").is_file()
    import psycopg

    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM batch_inference.secret_test").fetchone()[0] == 12, "published for real"
    assert [s for s in SECRETS if s in console] == [], "a planted secret reached the run's console/task output"
    leaks = {**_files_containing(out, SECRETS), **_files_containing(home / "logs", SECRETS)}
    assert leaks == {}, f"planted secrets found in run outputs or task logs: {leaks}"
    # positive controls: the grep does see the manifest/report and the worker's own log lines
    assert _files_containing(out, ["secret_test"]), "the table name (a form value) is recorded in run outputs"
    assert "[shard 00000]" in console, "the worker's log lines are part of the grepped task output"
