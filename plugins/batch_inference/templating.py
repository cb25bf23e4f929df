"""Which Param values are templates, and what a template may see.

A value typed into the trigger form or a run's ``conf`` is data, never a template: rendering it with
Airflow's task context would hand a form user ``conn``, ``var``, ``ti`` and the rest of the deployment
(``{{ conn.<id>.password[::-1] }}`` renders a secret, reversed past log masking). So:

* Only a DAG author's own default of a string Param may hold Jinja (``data/nightly/dt={{ ds }}``). It
  is rendered when the run's value is exactly that default, in Jinja's immutable sandbox with :data:`SCHEDULE_KEYS` (the
  schedule's dates) as the whole context and :class:`~jinja2.StrictUndefined`, so a name outside them
  is an error, not an empty string.
* A run's value of any string Param that differs from the default and contains Jinja syntax (``{{``,
  ``{%``, ``{#``) is a :class:`ConfigError`: never rendered, never used as a literal that merely looks
  like a template (a later templated field could render it). Values inside ``engine_options`` are the
  engine's own (an LLM ``user_template`` is a prompt template, rendered per row by the worker's bounded
  sandbox with the row's fields only), not Params.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from batch_contract.engine_config import ConfigError

TEMPLATED_FIELDS = ("input_uri", "output_root", "duckdb_path", "output_table")
"""The Params the shipped DAGs template (the nightly input); any string Param's DAG default may be one."""
SCHEDULE_KEYS = ("ds", "ds_nodash", "ts", "ts_nodash", "logical_date", "data_interval_start",
                 "data_interval_end")
"""The whole context a DAG default's template sees: the run's schedule dates (Airflow's names)."""
JINJA_MARKS = ("{{", "{%", "{#")
MAX_RENDERED_CHARS = 4096
"""Longest rendered value (characters): a default is a path or a table name."""


def has_jinja(value: Any) -> bool:
    """Whether ``value`` is a string holding Jinja syntax."""
    return isinstance(value, str) and any(mark in value for mark in JINJA_MARKS)


def schedule_context(context: Mapping[str, Any]) -> dict[str, Any]:
    """The schedule dates of the task ``context`` (:data:`SCHEDULE_KEYS` that have a value; a manual run
    of Airflow 3 may have no logical date)."""
    return {key: context[key] for key in SCHEDULE_KEYS if context.get(key) is not None}


def render_default(name: str, template: str, dates: Mapping[str, Any]) -> str:
    """Render a DAG author's default ``template`` for Param ``name`` with ``dates`` as the whole context.

    Raises:
        ConfigError: ``params.<name>: ...``: the template names anything but the dates given, breaks the
            sandbox's rules, fails to parse, or renders more than :data:`MAX_RENDERED_CHARS` characters.
    """
    from jinja2 import StrictUndefined, TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(undefined=StrictUndefined, autoescape=False)
    try:
        out = env.from_string(template).render(dict(dates))
    except TemplateError as exc:
        raise ConfigError(f"params.{name}: the DAG's default template cannot be rendered "
                          f"({type(exc).__name__}: {exc}); it may use only {', '.join(SCHEDULE_KEYS)}, and "
                          "only those this run has") from None
    if len(out) > MAX_RENDERED_CHARS:
        raise ConfigError(f"params.{name}: the DAG's default template renders {len(out):,} characters "
                          f"(at most {MAX_RENDERED_CHARS:,})")
    return out


def resolve_templates(params: Mapping[str, Any], defaults: Mapping[str, Any],
                      context: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` with each top-level string value that equals the DAG's default template rendered
    (:func:`render_default`); every other value unchanged.

    Args:
        params: the run's values (the form's or ``conf``'s over the DAG's defaults).
        defaults: the DAG author's defaults, by Param name (:func:`dag_defaults`).
        context: the task context (only :data:`SCHEDULE_KEYS` are read from it).

    Raises:
        ConfigError: ``params.<name>: ...``: a run's own value holds Jinja syntax, or a default fails to
            render.
    """
    out = dict(params)
    dates = schedule_context(context)
    for name, value in params.items():
        if not has_jinja(value):
            continue
        if value != defaults.get(name):
            raise ConfigError(f"params.{name}: a value given to a run (trigger form or conf) is not a "
                              "template and may not contain Jinja syntax ({{, {%, {#); give the concrete "
                              "value (only the DAG's own default may be a template of the schedule's dates)")
        out[name] = render_default(name, value, dates)
    return out


def dag_defaults(dag: Any) -> dict[str, Any]:
    """The DAG author's string defaults of ``dag``'s Params, by name (an Airflow DAG; Params without a
    default or of another type are left out)."""
    out: dict[str, Any] = {}
    for name in dag.params:
        param = dag.params.get_param(name)
        if param.has_value and isinstance(param.value, str):
            out[name] = param.value
    return out
