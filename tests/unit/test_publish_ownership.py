"""Publish's own schema, the marks on the tables it creates, the preflight ``check_target``, and the
handling of DSNs (repr, scheme check, redaction, CLI). The attacks themselves (foreign tables on every
backend, planted passwords) are in ``tests/security/test_publish_attacks.py``."""

from __future__ import annotations

import hashlib
import urllib.parse
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
from batch_inference.publish.__main__ import main as cli_main
from batch_inference.publish.backend import read_published
from batch_inference.publish.redact import redact
from batch_inference.publish.target import DEFAULT_SCHEMA, REGISTRY_TABLE, TABLE_FAMILY
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from synthetic_runs import RunSpec, build_run, write_input

IDS = [f"r{i:03d}" for i in range(30)]


@pytest.fixture
def runs(tmp_path: Path) -> tuple[str, str]:
    inp = write_input(tmp_path / "in.parquet", IDS)
    one = build_run(tmp_path / "out", "run1", inp, RunSpec(shards=1, dim=4, dead_rows={3}))
    two = build_run(tmp_path / "out", "run2", inp, RunSpec(shards=1, dim=4, fingerprint="b" * 32))
    return one.run_dir, two.run_dir


def _duck(tmp_path: Path, **kw) -> PublishTarget:
    return PublishTarget(backend="duckdb", table="emb", duckdb_path=str(tmp_path / "w.duckdb"), **kw)


def _registry(db: Path, schema: str = DEFAULT_SCHEMA) -> set[str]:
    with duckdb.connect(str(db), read_only=True) as con:
        return {r[0] for r in con.execute(f'SELECT table_name FROM "{schema}"."{REGISTRY_TABLE}"').fetchall()}


def _tables(db: Path, schema: str = DEFAULT_SCHEMA) -> set[str]:
    with duckdb.connect(str(db), read_only=True) as con:
        return {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE schema_name = ?",
                                          [schema]).fetchall()} - {REGISTRY_TABLE}


def test_default_schema_and_quoted_qualified_names(tmp_path: Path) -> None:
    target = _duck(tmp_path)
    assert target.schema == DEFAULT_SCHEMA == "batch_inference"
    assert _duck(tmp_path, schema=None).schema == DEFAULT_SCHEMA
    assert target.qualified("__previous") == '"batch_inference"."emb__previous"'
    assert target.describe() == "duckdb:batch_inference.emb"
    assert _duck(tmp_path, schema="analytics").qualified() == '"analytics"."emb"'
    with pytest.raises(ValueError, match="^schema:"):
        _duck(tmp_path, schema="Bad Schema")
    assert len(REGISTRY_TABLE) > 39 and not REGISTRY_TABLE.endswith(("__staging", "__previous", "__dead_letters",
                                                                        "__publish_log"))


@pytest.mark.parametrize(
    ("backend", "dsn", "ok"),
    [
        ("postgres", "postgresql://u:secretpw@h:5432/db", True),
        ("postgres", "postgres://u:secretpw@h/db", True),
        ("postgres", "host=h dbname=d password=se://cretpw", True),  # keyword string, '://' in a value
        ("postgres", "http://u:secretpw@h/db", False),
        ("postgres", "mysql://u:secretpw@h/db", False),
        ("postgres", "postgresql+psycopg://u:secretpw@h/db", False),
        ("iceberg", "postgresql+psycopg://u:secretpw@h/db", True),
        ("iceberg", "sqlite:///secretpw.db", False),
    ],
)
def test_dsn_never_in_repr_and_only_postgres_uris_pass(backend: str, dsn: str, ok: bool) -> None:
    kw = {"iceberg_warehouse": "/tmp/wh"} if backend == "iceberg" else {}
    if ok:
        target = PublishTarget(backend=backend, table="emb", dsn=dsn, **kw)
        assert "secretpw" not in repr(target) and "secretpw" not in target.describe()
    else:
        with pytest.raises(ValueError, match=r"^dsn: URI scheme '[a-z+]+' is not a PostgreSQL one") as err:
            PublishTarget(backend=backend, table="emb", dsn=dsn, **kw)
        assert "secretpw" not in str(err.value)


def test_marks_follow_swap_and_rollback(tmp_path: Path, runs: tuple[str, str]) -> None:
    db, target = tmp_path / "w.duckdb", _duck(tmp_path)
    publish_run(runs[0], target)
    assert _registry(db) == _tables(db) == {"emb", "emb__dead_letters", "emb__publish_log"}
    publish_run(runs[1], target)
    family = {"emb", "emb__previous", "emb__dead_letters", "emb__dead_letters__previous", "emb__publish_log"}
    assert _registry(db) == _tables(db) == family
    assert rollback(target)["restored_run_id"] == "run1"
    assert _registry(db) == _tables(db) == family

    def crash() -> None:
        raise RuntimeError("after staging")

    inp = write_input(tmp_path / "in3.parquet", IDS)
    run3 = build_run(tmp_path / "out3", "run3", inp, RunSpec(shards=1, dim=4, fingerprint="c" * 32))
    with pytest.raises(RuntimeError, match="after staging"):
        publish_run(run3.run_dir, target, after_staging=crash)
    assert _registry(db) == _tables(db) == family | {"emb__staging", "emb__dead_letters__staging"}
    assert publish_run(run3.run_dir, target)["noop"] is False, "publish's own leftover staging is replaced"
    assert _registry(db) == _tables(db) == family
    check_target(target)


def test_check_target_reads_only(tmp_path: Path, runs: tuple[str, str]) -> None:
    db, target = tmp_path / "w.duckdb", _duck(tmp_path)
    check_target(target)
    assert not db.exists(), "the preflight created the database file"
    with duckdb.connect(str(db)) as con:
        con.execute("CREATE TABLE main.emb (x INTEGER)")  # another schema: not publish's business
    digest = hashlib.sha256(db.read_bytes()).hexdigest()
    check_target(target)
    assert hashlib.sha256(db.read_bytes()).hexdigest() == digest
    with pytest.raises(ForeignTableError, match=r"^duckdb:main\.emb: main\.emb exist\(s\)") as err:
        check_target(_duck(tmp_path, schema="main"))
    assert err.value.tables == ["main.emb"]
    publish_run(runs[0], target)
    check_target(target)


def test_read_published_ignores_a_live_table_publish_did_not_create(tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    with duckdb.connect(str(db)) as con:
        con.execute("CREATE SCHEMA batch_inference")
        con.execute("CREATE TABLE batch_inference.emb (id VARCHAR, embedding FLOAT[4])")
        con.execute("""COMMENT ON TABLE batch_inference.emb IS '{"kind":"batch_inference.publish/v1"}'""")
    assert read_published(_duck(tmp_path), ["a"], ["embedding"]) == (None, None)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(table=st.from_regex(r"[a-z_][a-z0-9_]{0,20}", fullmatch=True), suffix=st.sampled_from(TABLE_FAMILY),
       schema=st.sampled_from([DEFAULT_SCHEMA, "main", "analytics"]),
       case=st.sampled_from([str.lower, str.upper, str.title]))
def test_any_foreign_table_of_the_family_is_refused_before_any_write(
    tmp_path_factory: pytest.TempPathFactory, table: str, suffix: str, schema: str, case
) -> None:
    """Whatever its letter case: DuckDB resolves names case-insensitively, so ``"EMB"`` is ``emb``."""
    if table.endswith(("__staging", "__previous", "__dead_letters", "__publish_log")):
        return
    db = tmp_path_factory.mktemp("fam") / "w.duckdb"
    with duckdb.connect(str(db)) as con:
        con.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        con.execute(f'CREATE TABLE "{schema}"."{case(table + suffix)}" (x INTEGER)')
    digest = hashlib.sha256(db.read_bytes()).hexdigest()
    target = PublishTarget(backend="duckdb", table=table, schema=schema, duckdb_path=str(db))
    for call in (check_target, rollback):
        with pytest.raises(ForeignTableError) as err:
            call(target)
        assert [t.lower() for t in err.value.tables] == [f"{schema}.{table}{suffix}"]
    assert hashlib.sha256(db.read_bytes()).hexdigest() == digest


def test_iceberg_tables_carry_the_owner_property(tmp_path: Path, runs: tuple[str, str]) -> None:
    pytest.importorskip("pyiceberg")
    from batch_inference.publish.iceberg_backend import OWNER_PROPERTY, load_catalog

    target = PublishTarget(backend="iceberg", table="emb", iceberg_warehouse=str(tmp_path / "ice" / "wh"))
    check_target(target)
    assert not (tmp_path / "ice").exists(), "the preflight created the catalog"
    publish_run(runs[0], target)
    catalog = load_catalog(target)
    names = {ident[-1] for ident in catalog.list_tables(DEFAULT_SCHEMA)}
    assert names == {"emb", "emb__dead_letters", "emb__publish_log"}
    for name in names:
        assert catalog.load_table((DEFAULT_SCHEMA, name)).properties[OWNER_PROPERTY] == "1"
    check_target(target)


# ------------------------------------------------------------------------------------------- redaction
_PASSWORD = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc", "Zs", "Zl", "Zp")),
                    min_size=6, max_size=24)


@settings(max_examples=200, deadline=None)
@given(password=_PASSWORD, user=st.from_regex(r"[a-z]{1,8}", fullmatch=True))
def test_redact_never_leaves_a_uri_password(password: str, user: str) -> None:
    dsn = f"postgresql://{user}:{urllib.parse.quote(password, safe='')}@db.example:5432/prod"
    messages = [
        f'missing "=" after "{dsn}" in connection info string',
        f"invalid dsn: {dsn}\n\tmore",
        f"connection to server at \"db.example\", port 5432 failed: password={password} rejected",
        f"FATAL: bad password {password} for {user}",
        f"URL (postgresql+psycopg://{user}:{password}@db.example/prod)",
    ]
    for message in messages:
        out = redact(message, dsn)
        assert password not in out and urllib.parse.quote(password, safe="") not in out, (message, out)
        assert "\n" not in out


@settings(max_examples=100, deadline=None)
@given(password=st.from_regex(r"[A-Za-z0-9!#$%&()*+,./:;<>?@^_~-]{6,20}", fullmatch=True))
def test_redact_never_leaves_a_keyword_password(password: str) -> None:
    dsn = f"host=db.example port=5432 password={password} {password}"
    for message in (f'missing "=" after "{password}" in connection info string',
                    f"connection failed for {dsn}"):
        out = redact(message, dsn)
        assert password not in out, (message, out)


def test_redact_keeps_where_it_failed() -> None:
    dsn = "postgresql://u:pw-123456@127.0.0.1:1/db"
    msg = 'connection failed: connection to server at "127.0.0.1", port 1 failed: Connection refused'
    assert redact(msg, dsn) == msg


# ---------------------------------------------------------------------------------------------- the CLI
def test_cli_refuses_dsn_on_argv_and_reads_the_named_variable(
    tmp_path: Path, runs: tuple[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "postgresql://u:argv-secret-99@127.0.0.1:1/db"
    with pytest.raises(SystemExit) as exit_:
        cli_main(["publish", "--backend", "postgres", "--table", "emb", "--dsn", secret, "--run-dir", runs[0]])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--dsn is not accepted" in err and "argv-secret-99" not in err
    with pytest.raises(SystemExit):  # no abbreviation of --dsn-env either
        cli_main(["publish", "--backend", "postgres", "--table", "emb", "--dsn-e", "X", "--run-dir", runs[0]])
    monkeypatch.delenv("BATCH_PUBLISH_DSN", raising=False)
    assert cli_main(["publish", "--backend", "postgres", "--table", "emb", "--run-dir", runs[0]]) == 2
    assert "set it in $BATCH_PUBLISH_DSN" in capsys.readouterr().err
    assert cli_main(["publish", "--backend", "postgres", "--table", "emb", "--dsn-env", "1BAD",
                     "--run-dir", runs[0]]) == 2
    monkeypatch.setenv("MY_PUBLISH_DSN", secret)
    assert cli_main(["publish", "--backend", "postgres", "--table", "emb", "--dsn-env", "MY_PUBLISH_DSN",
                     "--run-dir", runs[0]]) == 1
    err = capsys.readouterr().err
    assert "cannot connect to PostgreSQL" in err and "argv-secret-99" not in err


def test_postgres_connect_failure_is_a_publish_error_without_the_dsn(runs: tuple[str, str]) -> None:
    target = PublishTarget(backend="postgres", table="emb", dsn="postgresql://u:pw-5d2e77@127.0.0.1:1/db")
    with pytest.raises(PublishConnectionError, match=r"^postgres:batch_inference\.emb: cannot connect") as err:
        check_target(target)
    assert "pw-5d2e77" not in str(err.value) and err.value.__context__ is None


def test_airflow_connection_resolves_only_postgres_types(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from batch_inference.publish.connections import ConnectionTypeError, airflow_postgres_dsn

    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow"))
    monkeypatch.setenv("AIRFLOW_CONN_BI_UNIT_PG", "postgres://u:pw-1x2y3z@db.example:5432/prod")
    monkeypatch.setenv("AIRFLOW_CONN_BI_UNIT_GCP", "google-cloud-platform://?key_path=%2Fk.json")
    assert airflow_postgres_dsn("bi_unit_pg") == "postgresql://u:pw-1x2y3z@db.example:5432/prod"
    with pytest.raises(ConnectionTypeError, match=r"^params\.iceberg_catalog_conn_id: Airflow connection "
                                                  r"'bi_unit_gcp' is of type 'google_cloud_platform'"):
        airflow_postgres_dsn("bi_unit_gcp", field="iceberg_catalog_conn_id")
    with pytest.raises(PublishConnectionError, match=r"^params\.postgres_conn_id: Airflow connection "
                                                     r"'bi_unit_nope' does not exist"):
        airflow_postgres_dsn("bi_unit_nope")
