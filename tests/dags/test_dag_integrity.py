"""DAG integrity: every DAG file imports, every DAG is tagged, every task retries at least twice."""

from __future__ import annotations

from pathlib import Path

import pytest

DAGS_DIR = Path(__file__).resolve().parents[2] / "dags"
EXPECTED = {"batch_inference_nightly", "batch_inference_backfill", "batch_inference_on_model_upgrade",
            "model_upgrade_example"}


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS_DIR))


def test_no_import_errors(dagbag) -> None:
    assert dagbag.import_errors == {}


def test_expected_dags_present(dagbag) -> None:
    assert EXPECTED <= set(dagbag.dag_ids)


def test_tags_and_retries(dagbag) -> None:
    for dag_id, dag in dagbag.dags.items():
        assert dag.tags, f"{dag_id} has no tags"
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
