"""Params: the trigger form rejects bad values with a clear message; run-time resolution re-checks."""

from __future__ import annotations

import pytest
from airflow.sdk import Param
from airflow.sdk.definitions.param import ParamsDict
from airflow.sdk.exceptions import ParamValidationError
from batch_contract.engine_config import ConfigError
from batch_inference.params import base_params, resolve_run_config
from batch_inference.tasks import model_from_events


def _validated(**overrides) -> dict:
    params = ParamsDict(base_params())
    for key, value in overrides.items():
        params[key] = value  # ParamsDict validates on assignment
    return params.validate()


def test_every_param_has_title_description_and_type() -> None:
    for name, param in base_params().items():
        assert isinstance(param, Param)
        assert param.schema.get("title"), name
        assert param.description, name
        assert "type" in param.schema, name


def test_defaults_validate_and_resolve() -> None:
    cfg = resolve_run_config(_validated())
    assert cfg.runner == "local" and cfg.engine == "encoder" and cfg.max_shards == 1024
    assert cfg.engine_dict() == {"kind": "encoder"}
    assert cfg.cost_params() == {"accelerator": "cpu", "pricing": "spot"}


@pytest.mark.parametrize(
    ("name", "value"),
    [("rows_per_shard", 0), ("min_success_ratio", 1.5), ("runner", "slurm"), ("max_shards", 5000),
     ("output_table", "drop table;"), ("gpu_hour_usd_spot", -1), ("row_limit", -5), ("engine", "gpt")],
)
def test_form_rejects_bad_values_naming_the_param(name: str, value) -> None:
    with pytest.raises(ParamValidationError, match=name):
        _validated(**{name: value})


def test_run_time_resolution_names_the_field() -> None:
    params = _validated()
    with pytest.raises(ConfigError, match=r"params.runner: 'slurm' is not one of"):
        resolve_run_config({**params, "runner": "slurm"})
    with pytest.raises(ConfigError, match=r"params.output_table: .* is not a SQL identifier"):
        resolve_run_config({**params, "output_table": "x; drop"})
    with pytest.raises(ConfigError, match=r"params.model: the llm engine needs a model"):
        resolve_run_config({**params, "engine": "llm", "model": None})


@pytest.mark.parametrize("budget", [1, 63, -1, True, "100", 64.5, 5_000_000])
def test_token_budget_is_zero_or_64_up_at_run_time(budget) -> None:
    with pytest.raises(ConfigError, match=r"params.token_budget: .* is not 0 \(auto"):
        resolve_run_config({**_validated(), "token_budget": budget})


@pytest.mark.parametrize("budget", [0, 64, 8192, 4_194_304])
def test_token_budget_accepts_auto_and_explicit_values(budget: int) -> None:
    assert resolve_run_config({**_validated(), "token_budget": budget}).token_budget == budget


def test_kubernetes_runner_needs_shared_storage() -> None:
    params = _validated()
    with pytest.raises(ConfigError, match=r"params.output_root: the kubernetes runner needs storage"):
        resolve_run_config({**params, "runner": "kubernetes"})
    assert resolve_run_config({**params, "runner": "kubernetes", "dry_run": True}).dry_run
    cfg = resolve_run_config({**params, "runner": "kubernetes", "output_root": "gs://b/out",
                              "input_uri": "gs://b/in/*.parquet"})
    assert cfg.runner == "kubernetes"


class _Event:
    def __init__(self, extra: dict) -> None:
        self.extra = extra


def test_model_from_the_newest_event_extra_then_params_then_error() -> None:
    events = {"model": [_Event({"model_path": "/m/v1", "model_version": "v1"}),
                        _Event({"model_path": "/m/v2", "model_version": "v2"})]}
    path, source = model_from_events(events, fallback="/params/model")
    assert path == "/m/v2" and "v2" in source
    assert model_from_events({"model": [_Event({})]}, fallback="/params/model") == ("/params/model", "params.model")
    with pytest.raises(ConfigError, match="model: this run was not given a model"):
        model_from_events({}, fallback=None)


# ------------------------------------------------------------- strict run-time types, one field table


@pytest.mark.parametrize("value", ["false", "true", "False", 0, 1, None, "", [], {}])
def test_dry_run_must_be_a_boolean_not_coerced(value) -> None:
    """Regression: the string "false" used to resolve to a true ``dry_run`` (``bool("false")``)."""
    with pytest.raises(ConfigError, match=r"^params\.dry_run: .* is not a boolean"):
        resolve_run_config({**_validated(), "dry_run": value})


@pytest.mark.parametrize(("name", "value"), [
    ("rows_per_shard", "100"), ("rows_per_shard", 100.0), ("rows_per_shard", True), ("rows_per_shard", None),
    ("max_shards", "8"), ("parallelism", False), ("row_limit", "0"), ("min_success_ratio", "1"),
    ("deadline_hours", True), ("gpu_hour_usd_spot", "2.5"), ("runner", 1), ("shard_by", None),
    ("id_column", 5), ("model", 7), ("engine_options", "{}"), ("engine_options", []),
    ("output_table", 5), ("input_uri", ["/data"]),
])
def test_wrong_type_is_a_config_error_naming_the_field(name: str, value) -> None:
    """Regression: a string where an integer is expected raised a bare TypeError from a comparison."""
    with pytest.raises(ConfigError, match=rf"^params\.{name}: .* \(got "):
        resolve_run_config({**_validated(), name: value})


@pytest.mark.parametrize(("name", "value"), [
    ("rows_per_shard", 10_000_001), ("parallelism", 257), ("row_limit", 10_000_000_001),
    ("deadline_hours", 0.001), ("deadline_hours", 721), ("gpu_hour_usd_on_demand", 1000.5),
    ("id_column", ""), ("id_column", "x" * 201), ("accelerator", ""), ("shard_by", "bytes"),
    ("pricing", "reserved"), ("publish_backend", "sqlite"), ("min_success_ratio", float("nan")),
    ("deadline_hours", float("inf")),
])
def test_out_of_bounds_at_run_time_matches_the_form(name: str, value) -> None:
    with pytest.raises(ConfigError, match=rf"^params\.{name}: "):
        resolve_run_config({**_validated(), name: value})


def test_missing_required_field_and_non_mapping_params() -> None:
    params = _validated()
    del params["input_uri"]
    with pytest.raises(ConfigError, match=r"^params\.input_uri: is required"):
        resolve_run_config(params)
    with pytest.raises(ConfigError, match=r"^params: expected a mapping"):
        resolve_run_config(["input_uri"])  # type: ignore[arg-type]


def test_left_out_optional_params_take_the_table_default() -> None:
    from batch_inference.params import PARAM_FIELDS

    required = {name for name, spec in PARAM_FIELDS.items() if spec.required}
    cfg = resolve_run_config({k: v for k, v in _validated().items() if k in required})
    for name, spec in PARAM_FIELDS.items():
        if name not in required:
            assert getattr(cfg, name) == spec.default, name


# ---------------------------------------------------------------------------- property: no other error


def _json_values():
    from hypothesis import strategies as st

    scalars = (st.none() | st.booleans() | st.integers() | st.floats()
               | st.text(max_size=40) | st.sampled_from(["false", "true", "0", "1", "", "null"]))
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=5)


def _near_valid(spec):
    """Values at and around the field's bounds and enum (both sides of every check)."""
    from hypothesis import strategies as st

    values: list = [spec.default]
    values += list(spec.enum or ())
    for bound in (spec.minimum, spec.maximum, spec.zero_or_at_least):
        if bound is not None:
            values += [bound, bound - 1, bound + 1, bound - 0.5, float(bound)]
    for length in (spec.min_length, spec.max_length):
        if length is not None:
            values += ["a" * max(length - 1, 0), "a" * length, "a" * (length + 1)]
    return st.sampled_from(values)


def _field_names() -> list[str]:
    from batch_inference.params import PARAM_FIELDS

    return list(PARAM_FIELDS)


@pytest.fixture(scope="module")
def valid_params() -> dict:
    # a model and a dry run, so engine="llm" and runner="kubernetes" are valid too: an error can only
    # come from the field under test
    return {**_validated(), "model": "/models/some-model", "dry_run": True}


@pytest.mark.parametrize("name", _field_names())
def test_any_json_value_resolves_or_is_a_config_error_naming_the_field(name: str, valid_params: dict) -> None:
    from batch_inference.params import PARAM_FIELDS
    from hypothesis import HealthCheck, example, given, settings

    spec = PARAM_FIELDS[name]

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(value=_json_values() | _near_valid(spec))
    @example(value="\x00")  # found by this test in CI: a NUL byte in a path raised ValueError from realpath
    @example(value="/tmp/a\x00b")
    def check(value) -> None:
        try:
            cfg = resolve_run_config({**valid_params, name: value})
        except ConfigError as exc:
            assert str(exc).startswith(f"params.{name}:"), str(exc)
        else:
            assert spec.problem(value) is None, f"{name}={value!r} resolved although invalid"
            assert getattr(cfg, name) == value and type(getattr(cfg, name)) is type(value)

    check()


# ------------------------------------------------------------------------------ defaults in one place


def test_form_runconfig_planner_cli_and_sensor_defaults_come_from_the_table() -> None:
    import dataclasses
    import inspect

    from batch_inference.cli import build_parser
    from batch_inference.dag_factory import DagSpec
    from batch_inference.params import PARAM_FIELDS, RunConfig
    from batch_inference.planner import PlanRequest
    from batch_inference.sensors import ShardMarkerSensor

    form = base_params()
    assert list(form) == list(PARAM_FIELDS)
    run_config_fields = {f.name: f for f in dataclasses.fields(RunConfig)}
    assert list(run_config_fields) == list(PARAM_FIELDS)
    defaults = RunConfig()
    for name, spec in PARAM_FIELDS.items():
        assert form[name].value == spec.default, name
        assert form[name].schema == {"title": spec.title, **spec.schema()}, name
        assert getattr(defaults, name) == spec.default, name
        assert spec.problem(spec.default) is None, name

    plan_defaults = {f.name: f.default for f in dataclasses.fields(PlanRequest)}
    assert plan_defaults["shard_by"] == PARAM_FIELDS["shard_by"].default == "tokens"
    assert plan_defaults["rows_per_shard"] == PARAM_FIELDS["rows_per_shard"].default
    assert plan_defaults["max_map_length"] == PARAM_FIELDS["max_shards"].default

    from batch_inference.cli import CLI_DEFAULTS, param_conf

    run = build_parser().parse_args(["run"])
    assert param_conf(run) == {}  # a flag not given leaves the Param's default to the DAG
    assert set(CLI_DEFAULTS) == {"input_uri", "output_root", "parallelism"}  # one default per Param
    assert {f.name: f.default for f in dataclasses.fields(DagSpec)}["output_table"] == \
        PARAM_FIELDS["output_table"].default

    sensor = inspect.signature(ShardMarkerSensor.__init__).parameters
    for name in ("deadline_hours", "min_success_ratio", "dry_run"):
        assert sensor[name].default == PARAM_FIELDS[name].default, name


def test_docs_configuration_table_matches_the_params() -> None:
    """``docs/configuration.md``'s Params table lists every Param with the table's default and enum."""
    import json
    import re
    from pathlib import Path

    from batch_inference.params import PARAM_FIELDS, REPO_ROOT

    text = (REPO_ROOT / "docs" / "configuration.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| (.+?) \|$", text, flags=re.M))
    assert set(PARAM_FIELDS) <= set(rows), set(PARAM_FIELDS) - set(rows)
    for name, spec in PARAM_FIELDS.items():
        kind, default = (cell.strip() for cell in rows[name].split(" | ")[:2])
        if spec.enum is not None:
            assert kind == r" \| ".join(f"`{v}`" for v in spec.enum), name
        if name in ("input_uri", "output_root", "duckdb_path", "output_table"):
            continue  # described in words (machine paths, per DAG)
        shown = default.strip("`").replace(",", "")
        try:
            documented = json.loads(shown)
        except ValueError:
            documented = shown
        assert documented == spec.default, f"{name}: docs say {default}, the table {spec.default!r}"
    assert Path(REPO_ROOT / "docs" / "configuration.md").is_file()
