"""Who sees what through the OpenAI Files + Batches API (``batch_inference.openai_api.routes``): the real
app, routes, storage and error bodies; Airflow's user lookup, auth manager and metadata DB replaced as in
``tests/ui/app_harness.py`` (a bearer name is the user; grants per DAG and method). The real JWT path and
SimpleAuthManager's roles: ``make test-openai``."""

from __future__ import annotations

import io
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.api_fastapi.common.db.common import _get_session
from airflow.api_fastapi.core_api.security import get_user
from batch_inference.openai_api import routes
from batch_inference.openai_api.catalog import CATALOG_ENV
from batch_inference.openai_api.store import ApiStore, BatchRecord, new_batch_id
from fastapi import HTTPException, Request
from fastapi.testclient import TestClient

A, B = "batch_inference_backfill", "batch_inference_nightly"


class Auth:
    """``is_authorized_dag`` from ``{user: {(dag_id, method)}}``."""

    def __init__(self, grants: dict[str, set[tuple[str, str]]]) -> None:
        self.grants = grants

    def is_authorized_dag(self, *, method: str, user: Any, access_entity: Any = None, details: Any = None) -> bool:
        return (details.id, method) in self.grants.get(user.name, set())


def _user(request: Request) -> Any:
    scheme, _, name = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not name:
        raise HTTPException(401, "Not authenticated")
    return SimpleNamespace(name=name)


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[TestClient, ApiStore]:
    cat = {"files_root": str(tmp_path / "files"), "models": {
        "m-a": {"dag_id": A, "engine": "encoder", "model": "/models/a"},
        "m-b": {"dag_id": B, "engine": "encoder", "model": "/models/b"}}}
    (tmp_path / "catalog.json").write_text(json.dumps(cat))
    monkeypatch.setenv(CATALOG_ENV, str(tmp_path / "catalog.json"))
    grants = {"alice": {(A, "GET"), (A, "POST")}, "bob": {(B, "GET"), (B, "POST")}, "reader": {(A, "GET")}}
    monkeypatch.setattr(routes, "get_auth_manager", lambda: Auth(grants))
    monkeypatch.setattr(routes, "_team_of", lambda session, dag_id: None)
    monkeypatch.setattr(routes, "find_runs", lambda *a, **k: [])
    app = routes.create_app()
    app.dependency_overrides[get_user] = _user
    app.dependency_overrides[_get_session] = lambda: None
    return TestClient(app), ApiStore(cat["files_root"])


def _batch(store: ApiStore, dag_id: str, created: int) -> str:
    """A batch record of ``dag_id`` that failed validation (its state needs no DAG run)."""
    bid = new_batch_id()
    store.put_batch(BatchRecord(id=bid, endpoint="/v1/embeddings", input_file_id="file-" + "0" * 24,
                                completion_window="24h", model="m", dag_id=dag_id, owner="x", created_at=created,
                                total=1, rejected=1, status="failed"))
    return bid


def _as(user: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {user}"} if user else {}


def test_a_user_lists_and_reads_only_batches_of_dags_whose_runs_they_may_read(api: Any) -> None:
    client, store = api
    a1, b1, a2 = _batch(store, A, 1), _batch(store, B, 2), _batch(store, A, 3)
    listed = client.get("/batches", headers=_as("alice")).json()
    assert [b["id"] for b in listed["data"]] == [a2, a1] and listed["has_more"] is False
    assert [b["id"] for b in client.get("/batches", headers=_as("bob")).json()["data"]] == [b1]
    assert client.get(f"/batches/{a1}", headers=_as("reader")).json()["status"] == "failed"
    refused = client.get(f"/batches/{b1}", headers=_as("alice"))
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "not_found"
    page = client.get("/batches?limit=1", headers=_as("alice")).json()
    assert ([b["id"] for b in page["data"]], page["has_more"]) == ([a2], True)
    after = client.get(f"/batches?limit=1&after={a2}", headers=_as("alice")).json()
    assert [b["id"] for b in after["data"]] == [a1]


def test_uploads_are_their_uploaders_and_need_run_permission(api: Any) -> None:
    client, _ = api
    data = json.dumps({"custom_id": "1", "method": "POST", "url": "/v1/embeddings",
                       "body": {"model": "m-a", "input": "x"}}).encode() + b"\n"
    up = client.post("/files", headers=_as("alice"), files={"file": ("r.jsonl", io.BytesIO(data))},
                     data={"purpose": "batch"})
    assert up.status_code == 200 and up.json()["object"] == "file"
    fid = up.json()["id"]
    assert client.get(f"/files/{fid}/content", headers=_as("alice")).content == data
    assert client.get(f"/files/{fid}", headers=_as("bob")).status_code == 404
    denied = client.post("/files", headers=_as("reader"), files={"file": ("r.jsonl", io.BytesIO(data))},
                         data={"purpose": "batch"})
    assert denied.status_code == 403 and denied.json()["error"]["type"] == "permission_error"
    bob_create = client.post("/batches", headers=_as("bob"), json={
        "input_file_id": fid, "endpoint": "/v1/embeddings", "completion_window": "24h"})
    assert bob_create.status_code == 404  # another user's upload is not there for them


@pytest.mark.parametrize("path", ["/batches", "/files/file-000000000000000000000000", "/batches/batch_x"])
def test_no_token_is_401_with_an_openai_error_body(api: Any, path: str) -> None:
    client, _ = api
    resp = client.get(path)
    assert resp.status_code == 401
    assert resp.json()["error"]["code"] == "invalid_api_key"


def test_ids_not_of_the_id_form_are_never_looked_up(api: Any) -> None:
    client, _ = api
    for bad in ("..%2F..%2Fcatalog", "batch_../x", "file-zz"):
        assert client.get(f"/batches/{bad}", headers=_as("alice")).status_code == 404
        assert client.get(f"/files/{bad}/content", headers=_as("alice")).status_code == 404
