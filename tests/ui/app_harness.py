"""The real Batch inference FastAPI app (:func:`batch_inference.ui.app.create_app`) behind an HTTP client,
without an Airflow API server or metadata DB, for the unit tests (``tests/unit/test_ui_*.py``) and the
attack suite (``tests/security/test_ui_attacks.py``). Import it as ``ui.app_harness``.

What is replaced, and what stays real:

* **Users**: Airflow's ``get_user`` dependency is overridden: ``Authorization: Bearer <name>`` is the user
  ``<name>``, no header is 401. (That every route depends on ``get_user`` is checked by
  ``tests/unit/test_ui_app.py``; the real JWT path by ``make test-ui``.)
* **Auth manager**: :class:`FakeAuthManager` answers ``is_authorized_dag`` from explicit grants
  ``{user: {(dag_id, access_entity)}}`` (``access_entity`` ``None``: the DAG itself, or
  ``DagAccessEntity.RUN``) and records every question.
* **Metadata DB**: ``batch_dag_ids`` / ``find_runs`` answer from a list of
  :class:`~batch_inference.ui.discovery.RunRecord` (run ids compared exactly, as the DB does); no DAG
  has a team.
* Real: routing, the app's dependencies, the storage guard, the views, the storage reads and the
  responses (headers, streaming). Each harness has a fresh view cache.

:func:`make_run` writes a synthetic run that follows the data contract (``tests/synthetic_runs.py``) at
``<output_root>/runs/<dag_id>/<run_id>``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import quote, unquote

import pytest
from airflow.api_fastapi.common.db.common import _get_session
from airflow.api_fastapi.core_api.security import get_user
from batch_contract import storage
from batch_contract.layout import RunLayout
from batch_contract.manifest import Manifest
from batch_inference.ui import app as app_module
from batch_inference.ui.discovery import RunRecord
from batch_inference.ui.views import ViewCache
from fastapi import HTTPException, Request
from fastapi.testclient import TestClient
from synthetic_runs import RunSpec, build_run, write_input

DAG = "batch_inference_backfill"
OTHER_DAG = "batch_inference_nightly"
RUN = "manual__2026-01-01T00:00:00+00:00"
FINISHED = {"plan": "success", "choose_runner": "success", "wait_for_shards": "success", "publish": "success"}


@dataclass
class FakeAuthManager:
    """``is_authorized_dag`` from ``grants``: ``{user name: {(dag_id, access_entity)}}``; only ``GET``."""

    grants: dict[str, set[tuple[str, Any]]]
    asked: list[tuple[str, str, Any, str | None]] = field(default_factory=list)

    def is_authorized_dag(self, *, method: str, user: Any, access_entity: Any = None, details: Any = None) -> bool:
        dag_id = details.id if details is not None else None
        self.asked.append((user.name, method, access_entity, dag_id))
        return method == "GET" and (dag_id, access_entity) in self.grants.get(user.name, set())


def _user(request: Request) -> Any:
    scheme, _, name = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not name:
        raise HTTPException(401, "Not authenticated")
    return SimpleNamespace(name=name)


class UiHarness:
    """The app with :class:`FakeAuthManager`, ``records`` as the metadata DB and ``batch_dags`` as the
    DAGs tagged ``batch-inference`` (default: the DAGs of ``records``).

    Attributes:
        app: the FastAPI app (``create_app()``).
        client: a Starlette ``TestClient`` on it.
        auth: the fake auth manager.
        records: the DagRuns (edit freely; read on every request).
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch, records: Iterable[RunRecord],
                 grants: dict[str, set[tuple[str, Any]]], batch_dags: Iterable[str] | None = None) -> None:
        self.records = list(records)
        self.auth = FakeAuthManager(grants)
        self._dags = sorted(set(batch_dags if batch_dags is not None else (r.dag_id for r in self.records)))
        monkeypatch.setattr(app_module, "batch_dag_ids", lambda session: list(self._dags))
        monkeypatch.setattr(app_module, "find_runs", self._find_runs)
        monkeypatch.setattr(app_module, "_team_names", lambda session, dag_ids: {})
        monkeypatch.setattr(app_module, "get_auth_manager", lambda: self.auth)
        monkeypatch.setattr(app_module, "CACHE", ViewCache())
        self.app = app_module.create_app()
        self.app.dependency_overrides[get_user] = _user
        self.app.dependency_overrides[_get_session] = lambda: None
        self.client = TestClient(self.app)

    def _find_runs(self, session: Any, dag_ids: Iterable[str], *, limit: int = 50,
                   run_id: str | None = None) -> list[RunRecord]:
        ids = set(dag_ids)
        found = [r for r in self.records if r.dag_id in ids and (run_id is None or r.run_id == run_id)]
        return [dataclasses.replace(r, task_states=dict(r.task_states)) for r in found[:limit]]

    def get(self, path: str, user: str | None = "alice", **kwargs: Any) -> Any:
        """``GET path`` as ``user`` (``None``: anonymous); returns the ``httpx.Response``."""
        headers = {"Authorization": f"Bearer {user}"} if user else {}
        return self.client.get(path, headers=headers, **kwargs)

    def asgi_get(self, path: str, user: str = "alice",
                 on_chunk: Callable[[bytes], None] | None = None) -> tuple[int, dict[str, str], int, int]:
        """``GET path`` (percent-encoded) straight through the ASGI interface, body chunks handed to
        ``on_chunk`` and dropped (the test client would buffer the whole body).

        Returns:
            ``(status, headers with lower-case names, body bytes, body chunks)``.
        """
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
                 "scheme": "http", "path": unquote(path), "raw_path": path.encode(), "root_path": "", "query_string": b"",
                 "headers": [(b"host", b"testserver"), (b"authorization", f"Bearer {user}".encode())],
                 "client": ("127.0.0.1", 1), "server": ("testserver", 80)}
        out: dict[str, Any] = {"status": 0, "headers": {}, "bytes": 0, "chunks": 0, "asked": 0}
        done = asyncio.Event()

        async def receive() -> dict[str, Any]:
            out["asked"] += 1
            if out["asked"] == 1:
                return {"type": "http.request", "body": b"", "more_body": False}
            await done.wait()            # the client stays connected until the whole body was sent
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                out["status"] = message["status"]
                out["headers"] = {k.decode().lower(): v.decode() for k, v in message.get("headers", [])}
            elif message["type"] == "http.response.body":
                body = message.get("body", b"")
                if body:
                    out["bytes"] += len(body)
                    out["chunks"] += 1
                    if on_chunk is not None:
                        on_chunk(body)
                if not message.get("more_body", False):
                    done.set()

        async def main() -> None:
            await self.app(scope, receive, send)

        asyncio.run(main())
        return out["status"], out["headers"], out["bytes"], out["chunks"]


def run_path(dag_id: str, run_id: str, suffix: str = "") -> str:
    """``/runs/<dag_id>/<run_id><suffix>`` with both ids percent-encoded as one segment."""
    return f"/runs/{quote(dag_id, safe='')}/{quote(run_id, safe='')}{suffix}"


def make_run(output_root: Path, dag_id: str | None = DAG, run_id: str = RUN, *, rows: int = 20,
             dead_rows: Iterable[int] = (1, 2), manifest_params: dict[str, Any] | None = None,
             manifest_run_id: str | None = None, ids: list[str] | None = None, chunk_rows: int = 10) -> RunLayout:
    """A finished synthetic run of one shard (chunks of ``chunk_rows`` rows) at
    ``<output_root>/runs/<dag_id>/<run_id>`` (``dag_id=None``: the older ``<output_root>/runs/<run_id>``).

    Args:
        output_root: the run's output root (created).
        dag_id / run_id: where the run lives.
        rows: input rows.
        dead_rows: input row numbers that are dead letters.
        manifest_params: the manifest's ``params`` (default ``{"dag_id": dag_id}`` when ``dag_id`` is set).
        manifest_run_id: the manifest's ``run_id`` (default ``run_id``).
        ids: the input ids (default ``"0"``, ``"1"``, ...).
        chunk_rows: rows per committed part / dead-letter file.
    """
    output_root.mkdir(parents=True, exist_ok=True)
    src = write_input(output_root / f"in-{dag_id}-{run_id}.parquet".replace(":", "_"),
                      ids if ids is not None else [str(i) for i in range(rows)])
    staging = output_root / ".staging"
    built = build_run(staging, run_id, src, RunSpec(shards=1, chunk_rows=chunk_rows, dead_rows=set(dead_rows)))
    layout = RunLayout(str(output_root), run_id, dag_id)
    Path(layout.run_dir).parent.mkdir(parents=True, exist_ok=True)
    shutil.move(built.run_dir, layout.run_dir)
    shutil.rmtree(staging)
    manifest = Manifest.from_json_bytes(storage.read_bytes(layout.manifest_uri))
    params = manifest_params if manifest_params is not None else ({"dag_id": dag_id} if dag_id else {})
    manifest = dataclasses.replace(manifest, params={**manifest.params, **params},
                                   run_id=manifest_run_id or manifest.run_id)
    storage.write_replace(layout.manifest_uri, manifest.to_json_bytes())
    return layout


def record(dag_id: str, run_id: str, run_dir: str | None, state: str = "success") -> RunRecord:
    """A finished DagRun of ``dag_id`` whose ``plan`` pushed ``run_dir``."""
    now = datetime.now(UTC)
    return RunRecord(dag_id=dag_id, run_id=run_id, state=state, start_date=now, end_date=now, run_dir=run_dir,
                     task_states=dict(FINISHED))


def allow_only(monkeypatch: pytest.MonkeyPatch, *roots: Path) -> None:
    """Make ``roots`` the only allowed storage roots of every DAG (``BATCH_INFERENCE_ALLOWED_ROOTS``, no
    ``BATCH_INFERENCE_POLICY``)."""
    monkeypatch.delenv("BATCH_INFERENCE_POLICY", raising=False)
    monkeypatch.setenv("BATCH_INFERENCE_ALLOWED_ROOTS", ",".join(str(r) for r in roots))
