"""Attacks on the publish step (issue #38): every test is one attack that must be refused.

* **Foreign tables**: a table publish did not create (an application's ``users``, or a planted
  ``users__previous`` / ``users__staging`` / ...) in the publish schema or in ``public`` / ``main``, in
  real PostgreSQL, in a DuckDB file and in an Iceberg catalog. Publishing ``output_table=users`` (twice)
  and rolling back must raise :class:`ForeignTableError` naming the table and leave it exactly as it was
  (PostgreSQL: same OID, file node, rows and comment; DuckDB: the database file byte-identical; Iceberg:
  same metadata file, no data file written). A table publish created that someone dropped and created
  again under the same name is foreign too, and the preflight ``check_target`` refuses all of these
  before any shard runs, writing nothing.
* **Credentials**: a connection of the wrong type or a URI that cannot connect, both carrying the planted
  password, fail with an error whose text, the log, ``repr(target)`` and the exception chain hold no
  planted secret; the publish CLI never takes a DSN in its argv and its output holds none.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import traceback
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb
import pytest
from batch_inference.publish import (
    ForeignTableError,
    PublishConnectionError,
    PublishTarget,
    check_target,
    publish_run,
    rollback,
)
from batch_inference.publish.target import REGISTRY_TABLE, TABLE_FAMILY
from pg_fixture import pg_dsn  # noqa: F401 - pytest fixture
from synthetic_runs import RunSpec, build_run, write_input

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
FOREIGN = "users"
REFUSED = r"batch_inference\.users.* publish did not create"


@pytest.fixture
def runs(tmp_path: Path) -> tuple[str, str]:
    """Two complete runs over the same 20 ids (different fingerprints): ``(run_dir1, run_dir2)``."""
    inp = write_input(tmp_path / "in.parquet", [f"r{i:03d}" for i in range(20)])
    one = build_run(tmp_path / "out", "run1", inp, RunSpec(shards=1, dim=4))
    two = build_run(tmp_path / "out", "run2", inp, RunSpec(shards=1, dim=4, fingerprint="b" * 32))
    return one.run_dir, two.run_dir


def _attack_twice(target: PublishTarget, run_dir: str, match: str = REFUSED) -> None:
    """Publish twice and roll back once; each must be refused with ForeignTableError."""
    for _ in range(2):
        with pytest.raises(ForeignTableError, match=match):
            publish_run(run_dir, target)
    with pytest.raises(ForeignTableError, match=match):
        rollback(target)
    with pytest.raises(ForeignTableError, match=match):
        check_target(target)


# --------------------------------------------------------------------------------------------- PostgreSQL
def _pg(dsn: str, sql: str, params: list | None = None) -> list[tuple]:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description else []


@pytest.fixture
def pg_db(pg_dsn: str) -> Iterator[str]:  # noqa: F811
    """DSN of a fresh database of its own on the test server (dropped after the test), so an attack never
    meets another test's tables, even on a shared ``PG_TEST_DSN`` server."""
    name = f"attack_{uuid.uuid4().hex[:12]}"
    _pg(pg_dsn, f'CREATE DATABASE "{name}"')
    base, _, _ = pg_dsn.rpartition("/")
    try:
        yield f"{base}/{name}"
    finally:
        _pg(pg_dsn, f'DROP DATABASE "{name}" WITH (FORCE)')


def _pg_fresh_schema(dsn: str, schema: str) -> None:
    _pg(dsn, f'CREATE SCHEMA IF NOT EXISTS "{schema}"')


def _pg_plant(dsn: str, schema: str, name: str) -> None:
    _pg(dsn, f'CREATE TABLE "{schema}"."{name}" (id int PRIMARY KEY, email text NOT NULL)')
    _pg(dsn, f"INSERT INTO \"{schema}\".\"{name}\" SELECT g, 'user' || g || '@example.org' FROM generate_series(1, 50) g")
    _pg(dsn, f"COMMENT ON TABLE \"{schema}\".\"{name}\" IS 'the application''s {name}'")


def _pg_state(dsn: str, schema: str) -> dict[str, tuple]:
    """Every relation of ``schema`` whose name starts with ``users``: OID, file node, comment, rows."""
    state: dict[str, tuple] = {}
    for oid, name, node, kind in _pg(dsn, "SELECT c.oid, c.relname, c.relfilenode, c.relkind FROM pg_class c "
                                     "JOIN pg_namespace n ON n.oid = c.relnamespace "
                                     "WHERE n.nspname = %s AND c.relname LIKE 'users%%' AND c.relkind IN ('r', 'v')",
                                     [schema]):
        rows = _pg(dsn, f'SELECT md5(string_agg(t::text, \'|\' ORDER BY t::text)), count(*) FROM "{schema}"."{name}" t')
        comment = _pg(dsn, "SELECT obj_description(%s, 'pg_class')", [oid])[0][0]
        state[name] = (oid, node, kind, comment, rows[0])
    return state


def _pg_registry_rows(dsn: str, schema: str) -> list[tuple]:
    if not _pg(dsn, "SELECT to_regclass(%s) IS NOT NULL", [f'"{schema}"."{REGISTRY_TABLE}"'])[0][0]:
        return []
    return _pg(dsn, f'SELECT created_as FROM "{schema}"."{REGISTRY_TABLE}" WHERE created_as LIKE \'users%%\'')


@pytest.mark.parametrize("suffix", TABLE_FAMILY, ids=lambda s: f"users{s}")
def test_postgres_foreign_table_in_publish_schema_is_never_touched(
    pg_db: str, runs: tuple[str, str], suffix: str
) -> None:
    _pg_fresh_schema(pg_db, "batch_inference")
    _pg_plant(pg_db, "batch_inference", FOREIGN + suffix)
    before = _pg_state(pg_db, "batch_inference")
    target = PublishTarget(backend="postgres", table=FOREIGN, dsn=pg_db)
    _attack_twice(target, runs[0], match=rf"batch_inference\.users{suffix}\b.* publish did not create")
    assert _pg_state(pg_db, "batch_inference") == before, "the foreign table changed or a users* table appeared"
    assert _pg_registry_rows(pg_db, "batch_inference") == []


def test_postgres_foreign_users_in_public_is_never_touched(pg_db: str, runs: tuple[str, str]) -> None:
    _pg_plant(pg_db, "public", FOREIGN)
    before = _pg_state(pg_db, "public")
    target = PublishTarget(backend="postgres", table=FOREIGN, schema="public", dsn=pg_db)
    _attack_twice(target, runs[0], match=r"public\.users .* publish did not create")
    assert _pg_state(pg_db, "public") == before
    assert _pg_registry_rows(pg_db, "public") == []


def test_postgres_view_named_like_the_table_is_refused(pg_db: str, runs: tuple[str, str]) -> None:
    _pg_fresh_schema(pg_db, "batch_inference")
    _pg(pg_db, "CREATE VIEW batch_inference.users AS SELECT 1 AS id")
    before = _pg_state(pg_db, "batch_inference")
    _attack_twice(PublishTarget(backend="postgres", table=FOREIGN, dsn=pg_db), runs[0])
    assert _pg_state(pg_db, "batch_inference") == before


def test_postgres_table_recreated_under_a_published_name_is_refused(
    pg_db: str, runs: tuple[str, str], tmp_path: Path
) -> None:
    """Publish made ``users`` and ``users__previous``; someone drops ``users__previous`` and creates their
    own table under that name (the registry still names it, by the old OID): the next publish must not
    drop it, and rollback must not swap it in."""
    _pg_fresh_schema(pg_db, "batch_inference")
    target = PublishTarget(backend="postgres", table=FOREIGN, dsn=pg_db)
    publish_run(runs[0], target)
    publish_run(runs[1], target)
    _pg(pg_db, "DROP TABLE batch_inference.users__previous")
    _pg_plant(pg_db, "batch_inference", "users__previous")
    before = _pg_state(pg_db, "batch_inference")
    inp = write_input(tmp_path / "in3.parquet", [f"r{i:03d}" for i in range(20)])
    run3 = build_run(tmp_path / "out3", "run3", inp, RunSpec(shards=1, dim=4, fingerprint="c" * 32))
    _attack_twice(target, run3.run_dir, match=r"batch_inference\.users__previous\b")
    assert _pg_state(pg_db, "batch_inference") == before


# ----------------------------------------------------------------------------------------------- DuckDB
def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _duck_plant(db: Path, schema: str, name: str) -> None:
    con = duckdb.connect(str(db))
    try:
        con.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        con.execute(f'CREATE TABLE "{schema}"."{name}" (id INTEGER PRIMARY KEY, email VARCHAR)')
        con.execute(f"INSERT INTO \"{schema}\".\"{name}\" SELECT i, 'user' || i FROM range(50) t(i)")
    finally:
        con.close()


@pytest.mark.parametrize("suffix", TABLE_FAMILY, ids=lambda s: f"users{s}")
def test_duckdb_foreign_table_leaves_the_file_byte_identical(tmp_path: Path, runs: tuple[str, str], suffix: str) -> None:
    db = tmp_path / "app.duckdb"
    _duck_plant(db, "batch_inference", FOREIGN + suffix)
    before = _sha(db)
    target = PublishTarget(backend="duckdb", table=FOREIGN, duckdb_path=str(db))
    _attack_twice(target, runs[0], match=rf"batch_inference\.users{suffix}\b.* publish did not create")
    assert _sha(db) == before, "the DuckDB file changed"


def test_duckdb_foreign_users_in_main_leaves_the_file_byte_identical(tmp_path: Path, runs: tuple[str, str]) -> None:
    db = tmp_path / "app.duckdb"
    _duck_plant(db, "main", FOREIGN)
    before = _sha(db)
    _attack_twice(PublishTarget(backend="duckdb", table=FOREIGN, schema="main", duckdb_path=str(db)), runs[0],
                  match=r"main\.users .* publish did not create")
    assert _sha(db) == before


def test_duckdb_table_recreated_under_a_published_name_is_refused(tmp_path: Path, runs: tuple[str, str]) -> None:
    """The registry names ``users__previous``, but the table now there was created by someone else (no
    publish record in its comment): publish and rollback refuse, the file is unchanged."""
    db = tmp_path / "app.duckdb"
    target = PublishTarget(backend="duckdb", table=FOREIGN, duckdb_path=str(db))
    publish_run(runs[0], target)
    publish_run(runs[1], target)
    con = duckdb.connect(str(db))
    try:
        con.execute("DROP TABLE batch_inference.users__previous")
    finally:
        con.close()
    _duck_plant(db, "batch_inference", "users__previous")
    before = _sha(db)
    inp = write_input(tmp_path / "in3.parquet", [f"r{i:03d}" for i in range(20)])
    run3 = build_run(tmp_path / "out3", "run3", inp, RunSpec(shards=1, dim=4, fingerprint="c" * 32))
    _attack_twice(target, run3.run_dir, match=r"batch_inference\.users__previous\b")
    assert _sha(db) == before


# ---------------------------------------------------------------------------------------------- Iceberg
def _warehouse_files(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): _sha(p) for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("suffix", ["", "__dead_letters", "__publish_log"], ids=lambda s: f"users{s}")
def test_iceberg_foreign_table_is_never_written(tmp_path: Path, runs: tuple[str, str], suffix: str) -> None:
    pytest.importorskip("pyiceberg")
    import pyarrow as pa
    from batch_inference.publish.iceberg_backend import load_catalog

    target = PublishTarget(backend="iceberg", table=FOREIGN, iceberg_warehouse=str(tmp_path / "ice" / "wh"))
    catalog = load_catalog(target)
    catalog.create_namespace_if_not_exists("batch_inference")
    data = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "email": ["a", "b", "c"]})
    catalog.create_table(("batch_inference", FOREIGN + suffix), schema=data.schema).append(data)
    catalog.engine.dispose()
    location = load_catalog(target).load_table(("batch_inference", FOREIGN + suffix)).metadata_location
    before = _warehouse_files(tmp_path / "ice")
    _attack_twice(target, runs[0], match=rf"batch_inference\.users{suffix}\b.* publish did not create")
    after_catalog = load_catalog(target)
    assert after_catalog.load_table(("batch_inference", FOREIGN + suffix)).metadata_location == location
    assert {ident[-1] for ident in after_catalog.list_tables("batch_inference")} == {FOREIGN + suffix}
    after = _warehouse_files(tmp_path / "ice")
    assert {k: v for k, v in after.items() if k != "catalog.db"} == {k: v for k, v in before.items()
                                                                      if k != "catalog.db"}


# ------------------------------------------------------------------------------------------ credentials
def _chain_text(exc: BaseException) -> str:
    """The exception as a traceback would print it, with every chained exception."""
    return "".join(traceback.format_exception(exc))


def test_wrong_type_airflow_connection_never_shows_its_password(
    planted, no_secrets: Callable[..., None], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    tmp_path: Path
) -> None:
    from batch_inference.publish.connections import ConnectionTypeError, airflow_postgres_dsn

    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow"))  # in case this imports Airflow first
    monkeypatch.setenv("AIRFLOW_CONN_BI_ATTACK_HTTP", f"http://user:{planted.conn_password}@127.0.0.1:1/x")
    with pytest.raises(ConnectionTypeError, match=r"'bi_attack_http' is of type 'http'") as err:
        airflow_postgres_dsn("bi_attack_http")
    no_secrets(str(err.value), repr(err.value), _chain_text(err.value), caplog.text)


def test_postgres_connection_to_a_closed_port_never_shows_its_password(
    planted, no_secrets: Callable[..., None], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    runs: tuple[str, str], tmp_path: Path
) -> None:
    from batch_inference.publish.connections import airflow_postgres_dsn

    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow"))
    password = urllib.parse.quote(planted.conn_password, safe="")
    monkeypatch.setenv("AIRFLOW_CONN_BI_ATTACK_PG", f"postgresql://user:{password}@127.0.0.1:1/db")
    dsn = airflow_postgres_dsn("bi_attack_pg")
    target = PublishTarget(backend="postgres", table="emb", dsn=dsn)
    texts = [repr(target), str(target)]
    for call in (lambda: publish_run(runs[0], target), lambda: rollback(target), lambda: check_target(target)):
        with pytest.raises(PublishConnectionError, match=r"^postgres:batch_inference\.emb: cannot connect") as err:
            call()
        assert err.value.__cause__ is None and err.value.__context__ is None
        texts += [str(err.value), repr(err.value), _chain_text(err.value)]
    no_secrets(*texts, caplog.text)


def test_non_postgres_uri_given_as_dsn_is_refused_without_echo(
    planted, no_secrets: Callable[..., None], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(ValueError, match=r"^dsn: URI scheme 'http' is not a PostgreSQL one") as err:
        PublishTarget(backend="postgres", table="emb", dsn=f"http://user:{planted.conn_password}@127.0.0.1:1/x")
    no_secrets(str(err.value), _chain_text(err.value), caplog.text)


def test_malformed_keyword_dsn_is_not_echoed_by_psycopg(
    planted, no_secrets: Callable[..., None], caplog: pytest.LogCaptureFixture, runs: tuple[str, str]
) -> None:
    """psycopg quotes the part of a keyword string it cannot parse; that part may be the password."""
    caplog.set_level(logging.DEBUG)
    target = PublishTarget(backend="postgres", table="emb",
                           dsn=f"host=127.0.0.1 port=1 password={planted.conn_password} {planted.conn_password}")
    with pytest.raises(PublishConnectionError, match="cannot connect to PostgreSQL") as err:
        publish_run(runs[0], target)
    no_secrets(str(err.value), _chain_text(err.value), repr(target), caplog.text)


def test_iceberg_catalog_connection_never_shows_its_password(
    planted, no_secrets: Callable[..., None], caplog: pytest.LogCaptureFixture, runs: tuple[str, str], tmp_path: Path
) -> None:
    pytest.importorskip("pyiceberg")
    caplog.set_level(logging.DEBUG)
    password = urllib.parse.quote(planted.conn_password, safe="")
    target = PublishTarget(backend="iceberg", table="emb", iceberg_warehouse=str(tmp_path / "wh"),
                           dsn=f"postgresql://user:{password}@127.0.0.1:1/db")
    with pytest.raises(PublishConnectionError, match="cannot open the Iceberg catalog") as err:
        publish_run(runs[0], target)
    assert err.value.__cause__ is None and err.value.__context__ is None
    no_secrets(str(err.value), _chain_text(err.value), repr(target), caplog.text)


def _with_password(dsn: str, password: str) -> str:
    """``pg_dsn`` (``postgresql://user@host:port/db``, trust auth) with a password added."""
    scheme, rest = dsn.split("://", 1)
    user, host = rest.split("@", 1)
    return f"{scheme}://{user}:{urllib.parse.quote(password, safe='')}@{host}"


def _cli(args: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess, str]:
    """Run the publish CLI in a subprocess; returns the result and its ``/proc/<pid>/cmdline``."""
    cmd = [sys.executable, "-m", "batch_inference.publish", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO / "plugins"), **env})
    try:
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:  # already exited: the argv is what was passed
        cmdline = " ".join(cmd)
    out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), cmdline + " " + " ".join(cmd)


def test_cli_reads_the_dsn_from_the_environment_never_from_argv(
    planted, no_secrets: Callable[..., None], pg_db: str, runs: tuple[str, str]
) -> None:
    _pg_fresh_schema(pg_db, "batch_inference")
    env = {"BATCH_ATTACK_DSN": _with_password(pg_db, planted.conn_password)}
    args = ["publish", "--backend", "postgres", "--table", "cli_emb", "--dsn-env", "BATCH_ATTACK_DSN",
            "--run-dir", runs[0]]
    done, cmdline = _cli(args, env)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["rows_published"] == 20 and summary["table"] == "cli_emb"
    no_secrets(cmdline, done.stdout, done.stderr, json.dumps(summary))


def test_cli_refuses_a_dsn_on_the_command_line_without_echoing_it(
    planted, no_secrets: Callable[..., None], runs: tuple[str, str]
) -> None:
    dsn = f"postgresql://user:{planted.conn_password}@127.0.0.1:1/db"
    done, _ = _cli(["publish", "--backend", "postgres", "--table", "emb", "--dsn", dsn, "--run-dir", runs[0]], {})
    assert done.returncode == 2
    assert "--dsn is not accepted" in done.stderr
    no_secrets(done.stdout, done.stderr)


def test_cli_connection_failure_and_foreign_table_print_no_secret(
    planted, no_secrets: Callable[..., None], pg_db: str, runs: tuple[str, str]
) -> None:
    closed = {"BATCH_PUBLISH_DSN": f"postgresql://user:{planted.conn_password}@127.0.0.1:1/db"}
    done, cmdline = _cli(["publish", "--backend", "postgres", "--table", "emb", "--run-dir", runs[0]], closed)
    assert done.returncode == 1 and "cannot connect to PostgreSQL" in done.stderr
    no_secrets(cmdline, done.stdout, done.stderr)
    _pg_fresh_schema(pg_db, "batch_inference")
    _pg_plant(pg_db, "batch_inference", FOREIGN)
    before = _pg_state(pg_db, "batch_inference")
    real = {"BATCH_PUBLISH_DSN": _with_password(pg_db, planted.conn_password)}
    done, cmdline = _cli(["publish", "--backend", "postgres", "--table", FOREIGN, "--run-dir", runs[0]], real)
    assert done.returncode == 1 and "batch_inference.users exist(s) but publish did not create it" in done.stderr
    no_secrets(cmdline, done.stdout, done.stderr)
    assert _pg_state(pg_db, "batch_inference") == before
