"""A run's own values are never templates; a DAG's default renders with the schedule's dates only."""

from __future__ import annotations

import pytest
from batch_contract.engine_config import ConfigError
from batch_inference.templating import (
    JINJA_MARKS,
    SCHEDULE_KEYS,
    TEMPLATED_FIELDS,
    dag_defaults,
    render_default,
    resolve_templates,
)
from hypothesis import given, settings
from hypothesis import strategies as st

DATES = {"ds": "2026-11-29", "ds_nodash": "20261129"}
CONTEXT = {**DATES, "conn": object(), "var": object(), "ti": object(), "params": {}, "task": object()}


@settings(max_examples=200, deadline=None)
@given(field=st.sampled_from([*TEMPLATED_FIELDS, "id_column", "text_column", "model", "accelerator", "own_param"]),
       head=st.text(max_size=20), mark=st.sampled_from(JINJA_MARKS),
       tail=st.text(max_size=20))
def test_a_run_value_with_jinja_is_refused_whatever_it_holds(field: str, head: str, mark: str, tail: str) -> None:
    value = f"{head}{mark}{tail}"
    defaults = {name: "data/dt={{ ds }}" for name in TEMPLATED_FIELDS}
    if value == defaults.get(field):
        return
    with pytest.raises(ConfigError, match=rf"^params\.{field}: a value given to a run .* is not a template"):
        resolve_templates({field: value}, defaults, CONTEXT)


@settings(max_examples=100, deadline=None)
@given(field=st.sampled_from(TEMPLATED_FIELDS), value=st.text(max_size=40).filter(
    lambda v: not any(m in v for m in JINJA_MARKS)))
def test_a_plain_run_value_is_kept_as_given(field: str, value: str) -> None:
    assert resolve_templates({field: value}, {field: "x/{{ ds }}"}, CONTEXT)[field] == value


def test_the_dags_own_default_renders_with_the_schedule_dates() -> None:
    out = resolve_templates({"input_uri": "/d/dt={{ ds }}", "output_table": "t_{{ ds_nodash }}"},
                            {"input_uri": "/d/dt={{ ds }}", "output_table": "t_{{ ds_nodash }}"}, CONTEXT)
    assert out == {"input_uri": "/d/dt=2026-11-29", "output_table": "t_20261129"}


@pytest.mark.parametrize("name", ["conn", "var", "ti", "params", "task", "macros", "dag_run", "run_id", "dag"])
def test_a_default_template_sees_nothing_but_the_dates(name: str) -> None:
    """Even the DAG author's template cannot reach connections, Variables or the task instance."""
    with pytest.raises(ConfigError, match=r"^params\.input_uri: the DAG's default template cannot be rendered"):
        render_default("input_uri", "{{ " + name + " }}", {**DATES})


@pytest.mark.parametrize("template", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ ds.__class__.__init__.__globals__ }}",
    "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "{{ 'x' * 100000 }}",
    "{% for i in range(10000) %}xxxxxxxxxx{% endfor %}",
])
def test_a_hostile_default_is_refused_by_the_sandbox_or_the_length_cap(template: str) -> None:
    with pytest.raises(ConfigError, match=r"^params\.input_uri: the DAG's default template"):
        render_default("input_uri", template, DATES)


def test_a_manual_run_without_dates_names_what_is_missing() -> None:
    with pytest.raises(ConfigError, match="only those this run has"):
        render_default("input_uri", "x/{{ ds }}", {})
    assert set(SCHEDULE_KEYS) >= set(DATES)


def test_dag_defaults_are_the_authors_not_the_runs() -> None:
    from batch_inference.dag_factory import build_all

    nightly = build_all()["batch_inference_nightly"]
    assert dag_defaults(nightly)["input_uri"].endswith("/dt={{ ds }}")
    assert "var." not in dag_defaults(nightly)["input_uri"]
