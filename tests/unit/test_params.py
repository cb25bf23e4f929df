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


def test_input_uri_is_rendered_with_the_logical_date() -> None:
    from airflow.sdk import DAG, BaseOperator
    from batch_inference.tasks import render_param

    with DAG("render_test", schedule=None):
        op = BaseOperator(task_id="t")
    context = {"task": op, "ds": "2026-11-29"}
    assert render_param("/data/nightly/dt={{ ds }}", context) == "/data/nightly/dt=2026-11-29"
    assert render_param("/plain/path", context) == "/plain/path"


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
