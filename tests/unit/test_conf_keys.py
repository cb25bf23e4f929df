"""Unknown conf keys: one rule (``params.check_known_params``) for the CLI and for every run the plan task
resolves, whatever triggered it (trigger form, REST ``conf``, ``airflow dags trigger -c``).

The class of defect: a key the DAG does not declare (a misspelt guardrail such as ``budjet_usd``) was
dropped without a word everywhere but the CLI, so the run went ahead unguarded. Properties over generated
confs and typos; the plan task's own path (``tasks.run_config``) with real DAGs from the factory,
including one with a Param of its own; a real ``dag.test()`` run is in ``tests/integration/test_dag_runs.py``.
"""

from __future__ import annotations

import difflib
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk import Param
from batch_contract.engine_config import ConfigError
from batch_inference import tasks
from batch_inference.dag_factory import DAG_SPECS, DagSpec, build_dag
from batch_inference.params import AIRFLOW_CONF_KEYS, PARAM_FIELDS, check_known_params, nearest_param
from hypothesis import given, settings
from hypothesis import strategies as st
from run_helpers import REPO_ROOT, SAMPLE_PARQUET

NAMES = sorted(PARAM_FIELDS)
KEY_CHARS = "abcdefghijklmnopqrstuvwxyz_0123456789"
keys = st.text(KEY_CHARS, min_size=1, max_size=24)


@st.composite
def typos(draw: Any) -> tuple[str, str]:
    """``(param name, the name with one edit: a deleted, inserted, replaced or swapped character)``."""
    name = draw(st.sampled_from(NAMES))
    i = draw(st.integers(0, len(name) - 1))
    char = draw(st.sampled_from(KEY_CHARS))
    op = draw(st.sampled_from(("delete", "insert", "replace", "swap")))
    if op == "delete":
        typo = name[:i] + name[i + 1:]
    elif op == "insert":
        typo = name[:i] + char + name[i:]
    elif op == "replace":
        typo = name[:i] + char + name[i + 1:]
    else:
        j = min(i + 1, len(name) - 1)
        typo = name[:i] + name[j] + name[i + 1:j] + name[i] + name[j + 1:] if j > i else name
    return name, typo


@settings(max_examples=200, deadline=None)
@given(known=st.lists(st.sampled_from(NAMES), unique=True, max_size=10),
       extra_declared=st.lists(keys, unique=True, max_size=3),
       unknown=st.lists(keys, unique=True, max_size=3),
       airflow_keys=st.booleans())
def test_a_conf_passes_exactly_when_every_key_is_declared(known, extra_declared, unknown, airflow_keys) -> None:
    declared = [*NAMES, *extra_declared]
    unknown = sorted(set(unknown) - set(declared) - AIRFLOW_CONF_KEYS)
    conf = {k: 1 for k in [*known, *extra_declared, *unknown]}
    if airflow_keys:
        conf |= {k: {"parentRunId": "x"} for k in AIRFLOW_CONF_KEYS}
    if not unknown:
        check_known_params(conf, declared)
        return
    with pytest.raises(ConfigError, match="not a Param of this DAG") as err:
        check_known_params(conf, declared)
    message = str(err.value)
    assert message.startswith(f"params.{unknown[0]}: not a Param of this DAG")
    hint = nearest_param(unknown[0], declared)
    assert (f"(did you mean {hint!r}?)" in message) if hint else "did you mean" not in message
    assert hint is None or hint in declared


@settings(max_examples=300, deadline=None)
@given(typos())
def test_a_one_edit_typo_of_a_param_is_refused_naming_a_param_at_least_as_close(case) -> None:
    name, typo = case
    if typo in PARAM_FIELDS:
        check_known_params({typo: 1})
        return
    with pytest.raises(ConfigError, match=r"did you mean '(\w+)'\?") as err:
        check_known_params({typo: 1})
    hint = str(err.value).split("did you mean '", 1)[1].split("'", 1)[0]
    assert hint in PARAM_FIELDS

    def ratio(a: str) -> float:
        return difflib.SequenceMatcher(None, typo, a).ratio()

    assert hint == name or ratio(hint) >= ratio(name)


@pytest.mark.parametrize(("key", "hint"), [("budget", "budget_usd"), ("budjet_usd", "budget_usd"),
                                           ("Budget_USD", "budget_usd"), ("deadline", "deadline_hours"),
                                           ("requre_approval", "require_approval"), ("bogus_param", None)])
def test_nearest_param_examples(key: str, hint: str | None) -> None:
    assert nearest_param(key, PARAM_FIELDS) == hint


def test_the_dags_own_params_are_the_declared_set() -> None:
    check_known_params({"team": "ads"}, [*NAMES, "team"])
    with pytest.raises(ConfigError, match=r"params.teem: not a Param of this DAG \(did you mean 'team'\?\)"):
        check_known_params({"teem": "ads"}, [*NAMES, "team"])
    with pytest.raises(ConfigError, match="params.team: not a Param"):
        check_known_params({"team": "ads"})  # the CLI's DAG declares only PARAM_FIELDS


def test_a_long_or_odd_key_is_shown_on_one_line() -> None:
    with pytest.raises(ConfigError, match="not a Param") as err:
        check_known_params({"x\n" + "y" * 500: 1})
    assert "\n" not in str(err.value) and len(str(err.value)) < 300


# -- the plan task's path: tasks.run_config with real DAGs ------------------------------------------------


def _context(dag: Any, conf: dict[str, Any]) -> dict[str, Any]:
    """What the plan task gets: the DAG's Params updated with the run's conf (Airflow's process_params)."""
    values = {name: dag.params[name] for name in dag.params}
    values |= {"input_uri": str(SAMPLE_PARQUET), "output_root": str(REPO_ROOT / "output")}
    values |= conf
    return {"params": values, "dag": dag, "dag_run": SimpleNamespace(conf=conf), "ds": "2026-05-01",
            "ds_nodash": "20260501"}


@pytest.mark.parametrize("dag_id", sorted(DAG_SPECS))
def test_the_plan_task_refuses_an_unknown_conf_key_of_any_trigger(dag_id: str) -> None:
    dag = build_dag(DAG_SPECS[dag_id], runners=("local",))
    with pytest.raises(ConfigError, match=r"params.budjet_usd: not a Param of this DAG \(did you mean 'budget_usd'\?\)"):
        tasks.run_config(_context(dag, {"budjet_usd": 1.0}))
    cfg = tasks.run_config(_context(dag, {"budget_usd": 1.0, "openlineage": {"parentRunId": "r"}}))
    assert cfg.budget_usd == 1.0


def test_a_factory_dag_with_a_param_of_its_own_accepts_it() -> None:
    spec = DagSpec(dag_id="team_embed", description="t", schedule=None,
                   params={"team": Param("search", type="string")})
    dag = build_dag(spec, runners=("local",))
    tasks.run_config(_context(dag, {"team": "ads"}))
    with pytest.raises(ConfigError, match=r"params.teams: not a Param of this DAG \(did you mean 'team'\?\)"):
        tasks.run_config(_context(dag, {"teams": "ads"}))


def test_a_run_without_conf_or_dag_run_passes() -> None:
    dag = build_dag(DAG_SPECS["batch_inference_backfill"], runners=("local",))
    context = _context(dag, {})
    context["dag_run"] = SimpleNamespace(conf=None)
    tasks.run_config(context)
    del context["dag_run"]
    tasks.run_config(context)
