"""Deployment settings per DAG (batch_inference.policy) and the bounds they put on every Param."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from batch_contract.engine_config import ConfigError
from batch_inference.params import PARAM_FIELDS, param_default, resolve_run_config
from batch_inference.policy import POLICY_ENV, DagPolicy, policy_for
from hypothesis import given, settings
from hypothesis import strategies as st


def _params(root: Path, **kw) -> dict:
    values = {name: param_default(name) for name in PARAM_FIELDS}
    values.update(input_uri=str(root / "in" / "x.parquet"), output_root=str(root / "out"),
                  duckdb_path=str(root / "out" / "w.duckdb"))
    values.update(kw)
    return values


def _write(tmp_path: Path, data: dict) -> dict[str, str]:
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(data))
    return {POLICY_ENV: str(path)}


def test_a_dags_entry_overrides_the_defaults_key_by_key(tmp_path: Path) -> None:
    env = _write(tmp_path, {"defaults": {"input_roots": [str(tmp_path / "a")], "max_budget_usd": 10},
                            "dags": {"d1": {"max_budget_usd": 2.5, "postgres_conn_ids": ["pg_d1"]}}})
    d1, other = policy_for("d1", env), policy_for("d2", env)
    assert d1.max_budget_usd == 2.5 and other.max_budget_usd == 10.0
    assert d1.input_roots == other.input_roots == (str(tmp_path / "a"),)
    assert d1.postgres_conn_ids == ("pg_d1",) and other.postgres_conn_ids == ("batch_inference_postgres",)


@pytest.mark.parametrize(("data", "where"), [
    ({"defaults": {"max_line_bytes": 0}}, "defaults.max_line_bytes: expected a positive integer"),
    ({"defaults": {"max_line_bytes": True}}, "defaults.max_line_bytes: expected a positive integer"),
    ({"defaults": {"max_budget_usd": float("nan")}}, "defaults.max_budget_usd: expected a positive number"),
    ({"dags": {"d": {"input_roots": "/data"}}}, r"dags.d.input_roots: expected a list"),
    ({"dags": {"d": {"input_roots": ["ftp://x"]}}}, r"dags.d.input_roots"),
    ({"dags": {"d": {"max_shards": 3}}}, r"dags.d.max_shards: not a deployment setting"),
    ({"teams": {}}, "expected an object with keys"),
    ({"dags": []}, "dags: expected an object"),
])
def test_a_malformed_policy_names_its_key(tmp_path: Path, data: dict, where: str) -> None:
    with pytest.raises(ConfigError, match=where):
        policy_for("d", _write(tmp_path, data))


def test_an_unreadable_policy_file_is_a_config_error_without_its_content(tmp_path: Path) -> None:
    bad = tmp_path / "p.json"
    bad.write_text("{not json; secret=hunter2")
    with pytest.raises(ConfigError, match=r"cannot read the policy file \(JSONDecodeError\)$"):
        policy_for("d", {POLICY_ENV: str(bad)})


def test_no_policy_file_takes_the_roots_and_connections_from_the_environment(tmp_path: Path) -> None:
    env = {"BATCH_INFERENCE_ALLOWED_ROOTS": str(tmp_path), "BATCH_INFERENCE_ALLOWED_CONN_IDS": "a, b"}
    policy = policy_for("any", env)
    assert policy.input_roots == policy.output_roots == (str(tmp_path),)
    assert policy.postgres_conn_ids == policy.iceberg_catalog_conn_ids == ("a", "b")


SECRET_LIKE = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_", min_size=12, max_size=24)


@settings(max_examples=60, deadline=None)
@given(hidden_root=SECRET_LIKE, hidden_conn=SECRET_LIKE, field=st.sampled_from(
    ["input_uri", "output_root", "duckdb_path", "postgres_conn_id", "iceberg_catalog_conn_id", "token_budget",
     "budget_usd", "deadline_hours", "parallelism", "max_gpus", "max_tokens"]))
def test_an_out_of_bounds_value_is_refused_without_naming_the_allowed_values(
        tmp_path_factory: pytest.TempPathFactory, hidden_root: str, hidden_conn: str, field: str) -> None:
    root = tmp_path_factory.mktemp("p")
    policy = DagPolicy(input_roots=(str(root), f"/srv/{hidden_root}"), output_roots=(str(root), f"/srv/{hidden_root}"),
                       postgres_conn_ids=(hidden_conn,), iceberg_catalog_conn_ids=(hidden_conn,),
                       max_token_budget=1024, max_max_tokens=16, max_budget_usd=1.0, max_deadline_hours=30.0,
                       max_parallelism=2)
    bad = {"input_uri": {"input_uri": "/etc/shadow"}, "output_root": {"output_root": "/var/out"},
           "duckdb_path": {"duckdb_path": "/var/w.duckdb"},
           "postgres_conn_id": {"publish_backend": "postgres", "postgres_conn_id": "prod_admin"},
           "iceberg_catalog_conn_id": {"publish_backend": "iceberg", "iceberg_catalog_conn_id": "prod_admin"},
           "token_budget": {"token_budget": 2048}, "budget_usd": {"budget_usd": 5.0},
           "deadline_hours": {"deadline_hours": 31.0}, "parallelism": {"parallelism": 3}, "max_gpus": {"max_gpus": 3},
           "max_tokens": {"engine_options": {"max_tokens": 17}}}[field]
    with pytest.raises(ConfigError, match=rf"^params\.{'engine_options.' if field == 'max_tokens' else ''}{field}") as err:
        resolve_run_config(_params(root, **bad), policy)
    assert hidden_root not in str(err.value) and hidden_conn not in str(err.value) and str(root) not in str(err.value)


def test_a_run_without_a_budget_gets_the_dags_ceiling_and_one_within_bounds_passes(tmp_path: Path) -> None:
    policy = DagPolicy(input_roots=(str(tmp_path),), output_roots=(str(tmp_path),), max_budget_usd=7.0)
    assert resolve_run_config(_params(tmp_path), policy).budget_usd == 7.0
    assert resolve_run_config(_params(tmp_path, budget_usd=3.0), policy).budget_usd == 3.0


@pytest.mark.parametrize("area", ["runs", "cache"])
def test_an_input_inside_what_runs_write_is_refused(tmp_path: Path, area: str) -> None:
    policy = DagPolicy(input_roots=(str(tmp_path),), output_roots=(str(tmp_path),))
    params = _params(tmp_path, input_uri=str(tmp_path / "out" / area / "d" / "r" / "x.parquet"))
    with pytest.raises(ConfigError, match=r"^params\.input_uri: lies in the runs/ or cache/"):
        resolve_run_config(params, policy)


@pytest.mark.parametrize("key", ["kind", "model_path"])
def test_engine_options_cannot_override_the_engine_or_model_params(tmp_path: Path, key: str) -> None:
    policy = DagPolicy(input_roots=(str(tmp_path),), output_roots=(str(tmp_path),))
    with pytest.raises(ConfigError, match=rf"^params\.engine_options: may not set '{key}'"):
        resolve_run_config(_params(tmp_path, engine_options={key: "llm" if key == "kind" else "/etc"}), policy)


def test_a_refusal_never_shows_where_a_path_resolves(tmp_path: Path) -> None:
    secret = tmp_path / "elsewhere" / "team_b_secret_file"
    secret.parent.mkdir()
    secret.write_text("x")
    root = tmp_path / "mine"
    root.mkdir()
    (root / "link").symlink_to(secret)
    policy = DagPolicy(input_roots=(str(root),), output_roots=(str(tmp_path),))
    with pytest.raises(ConfigError, match=r"^params\.input_uri: .* is outside the input roots") as err:
        resolve_run_config(_params(tmp_path, input_uri=str(root / "link")), policy)
    assert "team_b_secret_file" not in str(err.value) and "elsewhere" not in str(err.value)


def test_a_model_outside_the_model_roots_is_refused(tmp_path: Path) -> None:
    models = tmp_path / "models"
    policy = DagPolicy(input_roots=(str(tmp_path),), output_roots=(str(tmp_path),), model_roots=(str(models),))
    assert resolve_run_config(_params(tmp_path, model=str(models / "m1")), policy).model == str(models / "m1")
    with pytest.raises(ConfigError, match=r"^params\.model: '/tmp/x/\.\./etc' is outside the model roots"):
        resolve_run_config(_params(tmp_path, model="/tmp/x/../etc"), policy)
