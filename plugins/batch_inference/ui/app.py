"""The Batch inference FastAPI app (mounted under ``/batch-inference`` on the Airflow API server).

Routes (HTML pages are server-rendered Jinja2; the list and a running run's page refresh themselves):

==============================================  =====================================================
``GET /``                                       runs of every batch-inference DAG the user may read
``GET /api/runs``                               the same as JSON
``GET /runs/{dag_id}/{run_id}``                 run page: figures, shard table, report, downloads
``GET /api/runs/{dag_id}/{run_id}``             the same as JSON
``GET /runs/{dag_id}/{run_id}/report.html``     the run's cost report page (embedded in the run page)
``GET /runs/{dag_id}/{run_id}/manifest.json``   the run's manifest
``GET /runs/{dag_id}/{run_id}/dead-letters.jsonl`` / ``.csv``  the error file
==============================================  =====================================================

Security: every route depends on Airflow's own ``get_user`` (JWT from the ``Authorization`` header or
the UI's session cookie; none: 401, invalid: 403) - plugin apps are not protected by Airflow otherwise.
The list shows only DAGs the auth manager lets the user read (``get_authorized_dag_ids``); run routes
require read access to the DAG's runs (``requires_access_dag("GET", DagAccessEntity.RUN)``). A run is
found by ``(dag_id, run_id)`` in the metadata DB (only DAGs tagged ``batch-inference``), never by a
path from the request, and its ``run_dir`` passes :mod:`batch_inference.ui.guard` before any read
(refused: 403).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep, get_user, requires_access_dag
from batch_contract import storage
from batch_contract.layout import RunLayout
from batch_contract.runstore import RunStore
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, Response, StreamingResponse
from fastapi.templating import Jinja2Templates

from batch_inference.report import fmt
from batch_inference.ui import deadletters
from batch_inference.ui.discovery import RunRecord, batch_dag_ids, find_runs
from batch_inference.ui.views import TERMINAL_DAG_RUN_STATES, RunView, ViewCache

LIST_LIMIT = 50
"""Runs on the list page (newest first)."""
REFRESH_SECONDS = 10
"""A page showing an unfinished run reloads itself this often (reads storage again: live progress)."""
REPORT_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; frame-ancestors 'self'"
"""The report page is static HTML with inline CSS and data-URI charts: it may load nothing else."""

TEMPLATES = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))
TEMPLATES.env.filters.update(usd=fmt.usd, num=fmt.num, pct=fmt.pct, seconds=fmt.seconds)
CACHE = ViewCache()
router = APIRouter()
RunAccess = Depends(requires_access_dag("GET", DagAccessEntity.RUN))


def _readable_dag_ids(user: Any, session: Any) -> list[str]:
    """Batch-inference DAGs the auth manager lets ``user`` read."""
    authorized = get_auth_manager().get_authorized_dag_ids(user=user, method="GET", session=session)
    return [d for d in batch_dag_ids(session) if d in authorized]


def _views(user: Any, session: Any) -> list[RunView]:
    return CACHE.get_many(find_runs(session, _readable_dag_ids(user, session), limit=LIST_LIMIT))


def _record(session: Any, dag_id: str, run_id: str) -> RunRecord:
    if dag_id not in batch_dag_ids(session):
        raise HTTPException(404, f"{dag_id!r} is not a batch-inference DAG")
    found = find_runs(session, [dag_id], limit=1, run_id=run_id)
    if not found:
        raise HTTPException(404, f"no run {run_id!r} of {dag_id!r}")
    return found[0]


def _view(session: Any, dag_id: str, run_id: str) -> RunView:
    view = CACHE.get(_record(session, dag_id, run_id))
    if view.refused:
        raise HTTPException(403, view.problem)
    return view


def _layout(view: RunView) -> RunLayout:
    """The run's layout (its run dir passed the guard), else 404: not planned yet."""
    if view.layout is None:
        raise HTTPException(404, view.problem or "the run has no storage yet")
    return view.layout


def _page_context(request: Request, **extra: Any) -> dict[str, Any]:
    base = request.scope.get("root_path", "").rstrip("/")  # the mount point, with [api] base_url's path

    def run_href(view: RunView) -> str:
        return f"{base}/runs/{quote(view.record.dag_id, safe='')}/{quote(view.record.run_id, safe='')}"

    return {"request": request, "base": base, "run_href": run_href, "refresh_seconds": REFRESH_SECONDS, **extra}


@router.get("/", response_class=HTMLResponse)
def runs_page(request: Request, user: GetUserDep, session: SessionDep) -> Response:
    """HTML list of runs (newest first), refreshing itself while a run is unfinished."""
    views = _views(user, session)
    live = any(v.record.state not in TERMINAL_DAG_RUN_STATES for v in views)
    return TEMPLATES.TemplateResponse(request, "runs.html", _page_context(request, views=views, live=live))


@router.get("/api/runs")
def runs_json(user: GetUserDep, session: SessionDep) -> dict[str, Any]:
    """``{"runs": [RunView.to_dict(), ...]}`` newest first."""
    return {"runs": [v.to_dict() for v in _views(user, session)]}


@router.get("/runs/{dag_id}/{run_id}", response_class=HTMLResponse, dependencies=[RunAccess])
def run_page(request: Request, dag_id: str, run_id: str, session: SessionDep) -> Response:
    """HTML page of one run."""
    view = _view(session, dag_id, run_id)
    live = view.record.state not in TERMINAL_DAG_RUN_STATES
    has_report = view.figures is not None and view.figures.get("report")
    return TEMPLATES.TemplateResponse(request, "run.html", _page_context(request, view=view, live=live,
                                                                         has_report=has_report))


@router.get("/api/runs/{dag_id}/{run_id}", dependencies=[RunAccess])
def run_json(dag_id: str, run_id: str, session: SessionDep) -> dict[str, Any]:
    """:meth:`RunView.to_dict` of one run."""
    return _view(session, dag_id, run_id).to_dict()


@router.get("/runs/{dag_id}/{run_id}/report.html", response_class=HTMLResponse, dependencies=[RunAccess])
def report_html(dag_id: str, run_id: str, session: SessionDep) -> Response:
    """The run's ``report.html`` (404 before publish wrote it), under a CSP that lets it load nothing."""
    body = _read_or_404(_layout(_view(session, dag_id, run_id)).report_html_uri, "no report.html yet (publish writes it)")
    return HTMLResponse(body, headers={"Content-Security-Policy": REPORT_CSP})


@router.get("/runs/{dag_id}/{run_id}/manifest.json", dependencies=[RunAccess])
def manifest_json(dag_id: str, run_id: str, session: SessionDep) -> Response:
    """The run's ``manifest.json`` as stored."""
    body = _read_or_404(_layout(_view(session, dag_id, run_id)).manifest_uri, "no manifest yet (plan writes it)")
    return Response(body, media_type="application/json")


def _read_or_404(uri: str, missing: str) -> bytes:
    """The object's bytes, or HTTP 404 with ``missing`` as the detail."""
    try:
        return storage.read_bytes(uri)
    except FileNotFoundError:
        raise HTTPException(404, missing) from None


def _download(view: RunView, kind: str) -> Response:
    store = RunStore(_layout(view))
    rows = deadletters.iter_dead_letters(store)
    body = deadletters.to_jsonl(rows) if kind == "jsonl" else deadletters.to_csv(rows)
    media = "application/x-ndjson" if kind == "jsonl" else "text/csv; charset=utf-8"
    name = f"dead-letters-{view.record.dag_id}-{store.run_id}.{kind}".replace(":", "_").replace("+", "_")
    return StreamingResponse(body, media_type=media, headers={"Content-Disposition": f'attachment; filename="{name}"'})


@router.get("/runs/{dag_id}/{run_id}/dead-letters.jsonl", dependencies=[RunAccess])
def dead_letters_jsonl(dag_id: str, run_id: str, session: SessionDep) -> Response:
    """The run's dead-letter rows, one JSON object a line (:mod:`batch_inference.ui.deadletters`)."""
    return _download(_view(session, dag_id, run_id), "jsonl")


@router.get("/runs/{dag_id}/{run_id}/dead-letters.csv", dependencies=[RunAccess])
def dead_letters_csv(dag_id: str, run_id: str, session: SessionDep) -> Response:
    """The run's dead-letter rows as CSV with a header."""
    return _download(_view(session, dag_id, run_id), "csv")


def create_app() -> FastAPI:
    """The app the plugin mounts (called once, on the API server's first request to it)."""
    app = FastAPI(title="Batch inference", docs_url=None, redoc_url=None, openapi_url=None,
                  dependencies=[Depends(get_user)])
    app.include_router(router)
    return app

