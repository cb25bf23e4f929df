"""The Batch inference app's routes are all behind Airflow's authentication, the run routes behind read
access to the DAG's runs (``DagAccessEntity.RUN``), and the list shows only the DAGs whose runs the auth
manager lets the user read (a fake auth manager; the real one is exercised by ``make test-ui``). Through
HTTP (``tests/ui/app_harness.py``): every response is ``no-store``/``nosniff``, downloads are attachments,
the error file is streamed, a served manifest is checked as served."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.core_api.security import get_user
from batch_contract import storage
from batch_inference.ui import app as app_module
from batch_inference.ui.deadletters import COLUMNS
from fastapi.routing import APIRoute
from ui.app_harness import DAG, OTHER_DAG, RUN, UiHarness, allow_only, make_run, record, run_path


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
    assert access is app_module.require_run_read
    for route in _routes():
        if "{dag_id}" in route.path:
            assert access in _calls(route.dependant), route.path


def test_run_read_is_asked_of_the_auth_manager_per_dag(monkeypatch: pytest.MonkeyPatch) -> None:
    """The list keeps the batch-inference DAGs whose *runs* the user may read: ``is_authorized_dag`` with
    ``access_entity=DagAccessEntity.RUN`` and the DAG's team, not the DAG-level read of
    ``get_authorized_dag_ids``."""
    asked = []

    def is_authorized_dag(*, method, user, access_entity=None, details=None):
        asked.append((user, method, access_entity, details.id, details.team_name))
        return details.id == "batch_inference_backfill"

    monkeypatch.setattr(app_module, "get_auth_manager", lambda: SimpleNamespace(
        is_authorized_dag=is_authorized_dag, get_authorized_dag_ids=lambda **kw: pytest.fail("DAG-level read")))
    monkeypatch.setattr(app_module, "batch_dag_ids", lambda session: ["batch_inference_backfill",
                                                                      "batch_inference_nightly"])
    monkeypatch.setattr(app_module, "_team_names", lambda session, dag_ids: {"batch_inference_nightly": "t1"})
    assert app_module._readable_dag_ids("alice", None) == ["batch_inference_backfill"]
    assert asked == [("alice", "GET", DagAccessEntity.RUN, "batch_inference_backfill", None),
                     ("alice", "GET", DagAccessEntity.RUN, "batch_inference_nightly", "t1")]


# -- through HTTP (tests/ui/app_harness.py: the real app, a fake auth manager and metadata DB) ----------

RUN_READ = {(DAG, DagAccessEntity.RUN), (DAG, None)}
DAG_READ_ONLY = {(DAG, None)}
SUFFIXES = ["", "/report.html", "/manifest.json", "/dead-letters.jsonl", "/dead-letters.csv"]


@pytest.fixture
def ui(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> UiHarness:
    """One finished run of :data:`DAG` with two dead letters and a report; ``alice`` may read its runs,
    ``bob`` only the DAG."""
    allow_only(monkeypatch, tmp_path / "out")
    layout = make_run(tmp_path / "out")
    storage.write_replace(layout.report_html_uri, b"<html><body>report</body></html>")
    harness = UiHarness(monkeypatch, [record(DAG, RUN, layout.run_dir)],
                        {"alice": RUN_READ, "bob": DAG_READ_ONLY})
    harness.layout = layout
    return harness


def test_anonymous_requests_are_401(ui: UiHarness) -> None:
    for path in ["/", "/api/runs", run_path(DAG, RUN), run_path(DAG, RUN, "/manifest.json")]:
        assert ui.get(path, user=None).status_code == 401, path


@pytest.mark.parametrize("path", ["/", "/api/runs", "/api/runs/" + DAG + "/" + RUN]
                         + [run_path(DAG, RUN, s) for s in SUFFIXES])
def test_every_response_is_no_store_and_nosniff(ui: UiHarness, path: str) -> None:
    resp = ui.get(path)
    assert resp.status_code == 200, resp.text
    assert resp.headers["cache-control"] == "no-store" and resp.headers["x-content-type-options"] == "nosniff"
    if path.endswith((".json", ".jsonl", ".csv")):
        assert resp.headers["content-disposition"].startswith("attachment; filename=")


@pytest.mark.parametrize(("path", "user", "status"), [
    (run_path(DAG, RUN), "bob", 403), (run_path(DAG, "nope"), "alice", 404), (run_path(DAG, RUN + "\n"), "alice", 404),
    (run_path(DAG, RUN, "/manifest.json"), None, 401),
])
def test_refusals_are_no_store_too(ui: UiHarness, path: str, user: str | None, status: int) -> None:
    resp = ui.get(path, user=user)
    assert resp.status_code == status
    assert resp.headers["cache-control"] == "no-store" and resp.headers["x-content-type-options"] == "nosniff"


def test_download_names(ui: UiHarness) -> None:
    cd = ui.get(run_path(DAG, RUN, "/dead-letters.csv")).headers["content-disposition"]
    assert cd == f'attachment; filename="dead-letters-{DAG}-manual__2026-01-01T00_00_00_00_00.csv"'
    cd = ui.get(run_path(DAG, RUN, "/manifest.json")).headers["content-disposition"]
    assert cd == f'attachment; filename="manifest-{DAG}-manual__2026-01-01T00_00_00_00_00.json"'


def test_runs_are_listed_only_for_run_readers(ui: UiHarness) -> None:
    assert [r["run_id"] for r in ui.get("/api/runs").json()["runs"]] == [RUN]
    assert ui.get("/api/runs", user="bob").json() == {"runs": []}
    assert RUN not in ui.get("/", user="bob").text
    assert ("bob", "GET", DagAccessEntity.RUN, DAG) in ui.auth.asked


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_every_run_route_needs_run_read(ui: UiHarness, suffix: str) -> None:
    assert ui.get(run_path(DAG, RUN, suffix), user="bob").status_code == 403
    assert ui.get(run_path(DAG, RUN, suffix)).status_code == 200
    assert ui.auth.asked[-1] == ("alice", "GET", DagAccessEntity.RUN, DAG)


def test_the_error_file_is_streamed_and_neutralised(ui: UiHarness) -> None:
    status, headers, size, chunks = ui.asgi_get(run_path(DAG, RUN, "/dead-letters.csv"))
    assert status == 200 and headers["content-type"] == "text/csv; charset=utf-8" and size > 0 and chunks >= 1
    assert "content-length" not in headers                          # streamed, not a sized body
    table = list(csv.reader(io.StringIO(ui.get(run_path(DAG, RUN, "/dead-letters.csv")).text)))
    assert table[0] == list(COLUMNS) and [r[5] for r in table[1:]] == ["1", "2"]
    lines = ui.get(run_path(DAG, RUN, "/dead-letters.jsonl")).text.splitlines()
    assert [json.loads(line)["source_row"] for line in lines] == [1, 2]


def test_a_manifest_is_checked_again_as_served(ui: UiHarness) -> None:
    """The view of a finished run is cached; a manifest replaced after that by another DAG's is refused."""
    assert ui.get(run_path(DAG, RUN)).status_code == 200
    manifest = json.loads(storage.read_bytes(ui.layout.manifest_uri))
    manifest["params"]["dag_id"] = OTHER_DAG
    storage.write_replace(ui.layout.manifest_uri, json.dumps(manifest).encode())
    resp = ui.get(run_path(DAG, RUN, "/manifest.json"))
    assert resp.status_code == 403 and f"is of DAG '{OTHER_DAG}', not of '{DAG}'" in resp.json()["detail"]
    assert ui.get(run_path(DAG, RUN, "/dead-letters.csv")).status_code == 403
