"""The Batch inference app's routes are all behind Airflow's authentication, the run routes behind DAG
authorisation, and the list shows only the DAGs the auth manager lets the user read (a fake auth manager;
the real one is exercised by ``make test-ui``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from airflow.api_fastapi.core_api.security import get_user
from batch_inference.ui import app as app_module
from fastapi.routing import APIRoute


def _calls(dependant) -> list:
    out = []
    for dep in dependant.dependencies:
        out.append(dep.call)
        out.extend(_calls(dep))
    return out


def _routes() -> list[APIRoute]:
    app = app_module.create_app()
    return [r for r in app.routes if isinstance(r, APIRoute)]


def test_every_route_requires_a_user() -> None:
    routes = _routes()
    assert {r.path for r in routes} >= {"/", "/api/runs", "/runs/{dag_id}/{run_id}", "/api/runs/{dag_id}/{run_id}",
                                        "/runs/{dag_id}/{run_id}/report.html", "/runs/{dag_id}/{run_id}/manifest.json",
                                        "/runs/{dag_id}/{run_id}/dead-letters.jsonl",
                                        "/runs/{dag_id}/{run_id}/dead-letters.csv"}
    for route in routes:
        assert get_user in _calls(route.dependant), route.path


def test_run_routes_require_read_access_to_the_dag_runs() -> None:
    access = app_module.RunAccess.dependency
    for route in _routes():
        if "{dag_id}" in route.path:
            assert access in _calls(route.dependant), route.path


def test_list_shows_only_the_dags_the_user_may_read(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = []

    def authorized(*, user, method, session):
        asked.append((user, method))
        return {"batch_inference_backfill", "some_other_dag"}

    monkeypatch.setattr(app_module, "get_auth_manager", lambda: SimpleNamespace(get_authorized_dag_ids=authorized))
    monkeypatch.setattr(app_module, "batch_dag_ids", lambda session: ["batch_inference_backfill",
                                                                      "batch_inference_nightly"])
    assert app_module._readable_dag_ids("alice", None) == ["batch_inference_backfill"]
    assert asked == [("alice", "GET")]
