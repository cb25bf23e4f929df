"""DAG integrity: every DAG file imports, every DAG is tagged, every task retries at least twice; the
Airflow-native parts (Asset alias outlet, named map indexes, Markdown docs, deadline alert, form sections)
are wired."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

DAGS_DIR = Path(__file__).resolve().parents[2] / "dags"
EXPECTED = {"batch_inference_nightly", "batch_inference_backfill", "batch_inference_on_model_upgrade",
            "model_upgrade_example"}


BATCH_DAGS = ("batch_inference_nightly", "batch_inference_backfill", "batch_inference_on_model_upgrade")


DEADLINE_CALLBACK = "batch_inference.notifiers.log_deadline_missed"


def _bag(**env: str):
    """A DagBag of ``dags/`` parsed with the environment ``env`` added (restored afterwards)."""
    from airflow.dag_processing.dagbag import DagBag

    previous = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return DagBag(dag_folder=str(DAGS_DIR))
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key)
            else:
                os.environ[key] = value


@pytest.fixture(scope="module")
def dagbag():
    """Both runners and a deadline callback (a Kubernetes deployment's DAG processor)."""
    return _bag(BATCH_INFERENCE_RUNNERS="local,kubernetes", BATCH_INFERENCE_DEADLINE_CALLBACK=DEADLINE_CALLBACK)


@pytest.fixture(scope="module")
def local_dagbag():
    """The local runner only (no Kubernetes provider import), no deadline callback."""
    return _bag(BATCH_INFERENCE_RUNNERS="local", BATCH_INFERENCE_DEADLINE_CALLBACK="")


def test_no_import_errors(dagbag) -> None:
    assert dagbag.import_errors == {}


def test_expected_dags_present(dagbag) -> None:
    assert EXPECTED <= set(dagbag.dag_ids)


def test_tags_and_retries(dagbag) -> None:
    for dag_id, dag in dagbag.dags.items():
        assert dag.tags, f"{dag_id} has no tags"
        if dag_id == "batch_inference_smoke":   # it checks set-up, which a retry does not change
            assert all(t.retries == 0 for t in dag.tasks)
            continue
        for t in dag.tasks:
            assert t.retries >= 2, f"{dag_id}.{t.task_id} retries={t.retries}"


def test_schedules(dagbag) -> None:
    nightly = dagbag.dags["batch_inference_nightly"]
    assert nightly.catchup is False and "{{ ds }}" in nightly.params.get_param("input_uri").value
    assert type(dagbag.dags["batch_inference_backfill"].timetable).__name__ == "NullTimetable"
    upgrade = dagbag.dags["batch_inference_on_model_upgrade"]
    assert "batch_inference_model" in repr(upgrade.timetable.asset_condition)


def test_shared_shape_and_fanout_spec(dagbag) -> None:
    for dag_id in ("batch_inference_nightly", "batch_inference_backfill", "batch_inference_on_model_upgrade"):
        dag = dagbag.dags[dag_id]
        ids = {t.task_id for t in dag.tasks}
        assert {"plan", "choose_runner", "infer_local", "kpo_args", "infer_k8s", "render_k8s",
                "wait_for_shards", "publish", "summary"} <= ids
        pods = dag.get_task("infer_k8s")
        kw = pods.partial_kwargs
        assert kw["deferrable"] is True and kw["retries"] >= 2 and kw["max_active_tis_per_dagrun"] >= 1
        assert "@sha256:" in kw["image"]
        assert dag.get_task("wait_for_shards").trigger_rule == "all_done"
        assert dag.get_task("publish").outlets, "publish must declare its outlet Asset"


def test_the_approval_step_sits_between_the_canary_and_the_fan_out(dagbag) -> None:
    from airflow.providers.standard.operators.hitl import ApprovalOperator

    for dag_id in BATCH_DAGS:
        dag = dagbag.dags[dag_id]
        approve = dag.get_task("approve")
        assert isinstance(approve, ApprovalOperator) and approve.defaults == ["Reject"]
        assert approve.upstream_task_ids == {"canary"} and approve.downstream_task_ids == {"choose_runner"}
        assert dag.get_task("choose_runner").upstream_task_ids == {"approve"}


def test_local_only_deployment_builds_no_pod_tasks(local_dagbag) -> None:
    assert local_dagbag.import_errors == {}
    for dag_id in BATCH_DAGS:
        ids = {t.task_id for t in local_dagbag.dags[dag_id].tasks}
        assert {"plan", "choose_runner", "infer_local", "render_k8s", "wait_for_shards", "publish"} <= ids
        assert not ids & {"kpo_args", "infer_k8s"}


def test_runner_setting() -> None:
    from batch_inference.dag_factory import enabled_runners

    assert enabled_runners({}) == ("local",)
    assert enabled_runners({"BATCH_K8S_IMAGE": "r@sha256:" + "0" * 64}) == ("local", "kubernetes")
    assert enabled_runners({"BATCH_INFERENCE_RUNNERS": " kubernetes ,local"}) == ("kubernetes", "local")
    with pytest.raises(ValueError, match="BATCH_INFERENCE_RUNNERS"):
        enabled_runners({"BATCH_INFERENCE_RUNNERS": "local,slurm"})


def test_publish_outlet_is_an_alias_per_dag(dagbag) -> None:
    from airflow.sdk import AssetAlias

    for dag_id in BATCH_DAGS:
        outlets = dagbag.dags[dag_id].get_task("publish").outlets
        assert outlets == [AssetAlias(name=f"{dag_id}__published_table")]


def test_mapped_shard_tasks_are_named(dagbag) -> None:
    from types import SimpleNamespace

    dag = dagbag.dags["batch_inference_backfill"]
    env = dag.get_template_env()
    local = dag.get_task("infer_local").map_index_template
    ref = {"run_dir": "/r", "shard_id": "00001", "rows": 15828}
    assert env.from_string(local).render(task=SimpleNamespace(op_kwargs={"ref": ref})) == "shard 00001 · 15,828 rows"
    from batch_inference.pod_spec import kpo_expand_kwargs

    pods = dag.get_task("infer_k8s")
    labels = kpo_expand_kwargs(ref, "manual__2026")["labels"]
    assert env.from_string(pods.partial_kwargs["map_index_template"]).render(
        task=SimpleNamespace(labels=labels)) == "shard 00001 · 15,828 rows"


def test_doc_md_is_markdown_with_the_task_list(dagbag) -> None:
    for dag_id in BATCH_DAGS:
        doc = dagbag.dags[dag_id].doc_md
        assert doc.startswith(f"# {dag_id}\n") and "::" not in doc
        steps = [line for line in doc.splitlines() if line[:3] in {f"{i}. " for i in range(1, 10)}]
        assert [s.split("`")[1].split("[")[0] for s in steps] == ["plan", "choose_runner", "infer_local", "render_k8s",
                                                     "wait_for_shards", "publish", "summary"]


def test_deadline_alert_follows_deadline_hours(dagbag) -> None:
    from datetime import timedelta

    from airflow.sdk import AsyncCallback, DeadlineReference
    from batch_inference.params import PARAM_FIELDS

    for dag_id in BATCH_DAGS:
        (alert,) = dagbag.dags[dag_id].deadline
        assert alert.reference == DeadlineReference.DAGRUN_QUEUED_AT
        assert alert.interval == timedelta(hours=PARAM_FIELDS["deadline_hours"].default)
        assert isinstance(alert.callback, AsyncCallback)
        assert alert.callback.path == DEADLINE_CALLBACK
        assert alert.callback.kwargs["dag_id"] == dag_id


def test_no_deadline_alert_without_a_callback(local_dagbag) -> None:
    # opt-in: Airflow 3.3.2's dag.test() (airflow dags test, make run) fails a successful run that has one
    for dag_id in BATCH_DAGS:
        assert not local_dagbag.dags[dag_id].deadline


def test_deadline_callback_is_configurable_and_logs() -> None:
    import asyncio

    from batch_inference.dag_factory import DAG_SPECS, deadline_alert
    from batch_inference.notifiers import log_deadline_missed

    assert deadline_alert(DAG_SPECS["batch_inference_backfill"], 2.0, environ={}) is None
    alert = deadline_alert(DAG_SPECS["batch_inference_backfill"], 2.0, "/srv/out",
                           environ={"BATCH_INFERENCE_DEADLINE_CALLBACK": DEADLINE_CALLBACK})
    assert alert.callback.kwargs == {"dag_id": "batch_inference_backfill", "deadline_hours": 2.0,
                                     "output_root": "/srv/out"}
    message = asyncio.run(log_deadline_missed(None, **alert.callback.kwargs))
    assert "batch_inference_backfill" in message and "2.0 h" in message


def test_trigger_form_sections_read_top_down(dagbag) -> None:
    from batch_inference.params import SECTIONS

    params = dagbag.dags["batch_inference_backfill"].params
    sections = [params.get_param(name).schema["section"] for name in params]
    order = list(dict.fromkeys(sections))
    assert order == list(SECTIONS)
    assert sections == sorted(sections, key=SECTIONS.index)  # each section's fields together
