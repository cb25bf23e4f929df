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
``/v1/...``                                      the OpenAI-compatible Files + Batches API
                                                (:mod:`batch_inference.openai_api.routes`)
==============================================  =====================================================

Security: every route depends on Airflow's own ``get_user`` (JWT from the ``Authorization`` header or
the UI's session cookie; none: 401, invalid: 403) - plugin apps are not protected by Airflow otherwise.
Runs are shown only of DAGs whose runs the auth manager lets the user read: the list asks
``is_authorized_dag(method="GET", access_entity=DagAccessEntity.RUN, details=DagDetails(id=dag_id,
team_name=...))`` for each batch-inference DAG, and every run route asks the same for its DAG (403
otherwise; read access to the DAG alone is not enough). A run is found by ``(dag_id, run_id)`` in the
metadata DB (only DAGs tagged ``batch-inference``; ids that are not safe path segments matched whole, a
trailing newline included, are 404), never by a path from the request; its ``run_dir`` and manifest pass
:mod:`batch_inference.ui.guard` before anything of it is shown (refused: 403), and a served
``manifest.json`` is checked again as served.

Every response carries ``Cache-Control: no-store`` and ``X-Content-Type-Options: nosniff`` (run data
must not stay in browser or proxy caches); downloads are ``Content-Disposition: attachment``. The error
file is streamed (:mod:`batch_inference.ui.deadletters`: bounded memory whatever its size).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep, get_user
from airflow.models.dag import DagModel
from batch_contract.layout import RunLayout
from batch_contract.runstore import RunStore
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, Response, StreamingResponse
from fastapi.templating import Jinja2Templates

from batch_inference.openai_api import routes as openai_routes
from batch_inference.report import fmt
from batch_inference.ui import deadletters
from batch_inference.ui.discovery import RunRecord, batch_dag_ids, find_runs
from batch_inference.ui.guard import PathRefused, check_manifest_identity, check_run_ids, guarded_manifest
from batch_inference.ui.views import TERMINAL_DAG_RUN_STATES, RunView, ViewCache, shard_page

LIST_LIMIT = 50
"""Runs on the list page (newest first)."""
REFRESH_SECONDS = 10
"""A page showing an unfinished run reloads itself this often (reads storage again: live progress)."""
SHARD_STATE_PATTERN = "^(complete|running|failed|stale|starting|pending)$"
"""The shard states the run page filters its table by (``batch_inference.ui.figures.ShardRow.state``)."""
REPORT_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; frame-ancestors 'self'"
"""The report page is static HTML with inline CSS and data-URI charts: it may load nothing else."""
NO_STORE_HEADERS = {"cache-control": "no-store", "x-content-type-options": "nosniff"}
"""Headers set on every response of the app (:class:`NoStoreMiddleware`)."""

TEMPLATES = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))
TEMPLATES.env.filters.update(usd=fmt.usd, num=fmt.num, pct=fmt.pct, seconds=fmt.seconds)
CACHE = ViewCache()
router = APIRouter()


def _team_names(session: Any, dag_ids: list[str]) -> dict[str, str | None]:
    """DAG id -> the team owning its bundle (absent: none), as Airflow's own DAG checks pass it."""
    return DagModel.get_dag_id_to_team_name_mapping(dag_ids, session=session)


def _run_readable(user: Any, session: Any, dag_ids: list[str]) -> list[str]:
    """Those of ``dag_ids`` whose runs the auth manager lets ``user`` read (order kept): one
    ``is_authorized_dag(method="GET", access_entity=DagAccessEntity.RUN, ...)`` per DAG."""
    if not dag_ids:
        return []
    teams = _team_names(session, dag_ids)
    manager = get_auth_manager()
    return [d for d in dag_ids if manager.is_authorized_dag(
        method="GET", access_entity=DagAccessEntity.RUN, details=DagDetails(id=d, team_name=teams.get(d)),
        user=user)]


def require_run_read(dag_id: str, user: GetUserDep, session: SessionDep) -> None:
    """Dependency of every run route: 403 unless the user may read the runs of ``dag_id``."""
    if not _run_readable(user, session, [dag_id]):
        raise HTTPException(403, "Forbidden")


RunAccess = Depends(require_run_read)


def _readable_dag_ids(user: Any, session: Any) -> list[str]:
    """Batch-inference DAGs whose runs the auth manager lets ``user`` read."""
    return _run_readable(user, session, batch_dag_ids(session))


def _views(user: Any, session: Any) -> list[RunView]:
    return CACHE.get_many(find_runs(session, _readable_dag_ids(user, session), limit=LIST_LIMIT))


def _record(session: Any, dag_id: str, run_id: str) -> RunRecord:
    """The DagRun ``(dag_id, run_id)`` of a batch-inference DAG, else 404 (also for ids that are not safe
    path segments matched whole: such a run can have no storage)."""
    try:
        check_run_ids(dag_id, run_id)
    except PathRefused as exc:
        raise HTTPException(404, str(exc)) from None
    if dag_id not in batch_dag_ids(session):
        raise HTTPException(404, f"{dag_id!r} is not a batch-inference DAG")
    found = [r for r in find_runs(session, [dag_id], limit=1, run_id=run_id)
             if r.dag_id == dag_id and r.run_id == run_id]
    if not found:
        raise HTTPException(404, f"no run {run_id!r} of {dag_id!r}")
    return found[0]


def _view(session: Any, dag_id: str, run_id: str) -> RunView:
    view = CACHE.get(_record(session, dag_id, run_id))
    if view.refused:
        raise HTTPException(403, view.problem)
    return view


def _layout(view: RunView) -> RunLayout:
    """The run's layout (its run dir passed the guard), else 404 naming the view's problem (not planned yet,
    or an older run dir whose manifest cannot be read to tell its DAG)."""
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
def run_page(request: Request, dag_id: str, run_id: str, session: SessionDep,
             shards_page: int = Query(1, ge=1, le=1_000_000),
             shard_state: str | None = Query(None, pattern=SHARD_STATE_PATTERN)) -> Response:
    """HTML page of one run; its shard table shows :data:`~batch_inference.ui.views.SHARD_PAGE_ROWS`
    shards a page (``?shards_page=N``, optionally only those of ``?shard_state=``) under the counts of
    every state, so the page stays small at 1,024 shards and more."""
    view = _view(session, dag_id, run_id)
    live = view.record.state not in TERMINAL_DAG_RUN_STATES
    has_report = view.figures is not None and view.figures.get("report")
    table = shard_page(view.shards, shards_page, shard_state)
    return TEMPLATES.TemplateResponse(request, "run.html", _page_context(request, view=view, live=live,
                                                                         has_report=has_report, table=table))


@router.get("/api/runs/{dag_id}/{run_id}", dependencies=[RunAccess])
def run_json(dag_id: str, run_id: str, session: SessionDep) -> dict[str, Any]:
    """:meth:`RunView.to_dict` of one run."""
    return _view(session, dag_id, run_id).to_dict()


@router.get("/runs/{dag_id}/{run_id}/report.html", response_class=HTMLResponse, dependencies=[RunAccess])
def report_html(dag_id: str, run_id: str, session: SessionDep) -> Response:
    """The run's ``report.html`` (404 before publish wrote it), under a CSP that lets it load nothing."""
    body = _or_404(RunStore(_layout(_view(session, dag_id, run_id))).report_html(),
                   "no report.html yet (publish writes it)")
    return HTMLResponse(body, headers={"Content-Security-Policy": REPORT_CSP})


@router.get("/runs/{dag_id}/{run_id}/manifest.json", dependencies=[RunAccess])
def manifest_json(dag_id: str, run_id: str, session: SessionDep) -> Response:
    """The run's ``manifest.json`` as stored, once it proved to be this run's (403 otherwise)."""
    view = _view(session, dag_id, run_id)
    layout = _layout(view)
    body = _or_404(RunStore(layout).manifest_bytes(), "no manifest yet (plan writes it)")
    try:
        guarded_manifest(body, layout, view.record.dag_id, view.record.run_id)
    except PathRefused as exc:
        raise HTTPException(403, f"refused: {exc}") from None
    return Response(body, media_type="application/json",
                    headers=_attachment(f"manifest-{view.record.dag_id}-{view.record.run_id}.json"))


def _or_404(body: bytes | None, missing: str) -> bytes:
    """The object's bytes read through the run store, or HTTP 404 (``missing`` as the detail) when the
    object does not exist (``None``)."""
    if body is None:
        raise HTTPException(404, missing)
    return body


def _attachment(name: str) -> dict[str, str]:
    """``Content-Disposition: attachment`` naming ``name`` (``:`` and ``+`` of run ids become ``_``)."""
    return {"Content-Disposition": f'attachment; filename="{name.replace(":", "_").replace("+", "_")}"'}


def _download(view: RunView, kind: str) -> Response:
    """The error file, streamed: its first rows leave before the last file is read (memory bounded, see
    :mod:`batch_inference.ui.deadletters`). The manifest is read and checked before the response starts
    (403 when it is another run's, 404 when missing or unreadable)."""
    store = RunStore(_layout(view))
    try:
        manifest = store.manifest
        check_manifest_identity(store.layout, view.record.dag_id, view.record.run_id, manifest.run_id,
                                manifest.params)
    except PathRefused as exc:
        raise HTTPException(403, f"refused: {exc}") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise HTTPException(404, f"no readable manifest: {exc}") from None
    rows = deadletters.iter_dead_letters(store)
    body = deadletters.to_jsonl(rows) if kind == "jsonl" else deadletters.to_csv(rows)
    media = "application/x-ndjson" if kind == "jsonl" else "text/csv; charset=utf-8"
    return StreamingResponse(body, media_type=media,
                             headers=_attachment(f"dead-letters-{view.record.dag_id}-{store.run_id}.{kind}"))


@router.get("/runs/{dag_id}/{run_id}/dead-letters.jsonl", dependencies=[RunAccess])
def dead_letters_jsonl(dag_id: str, run_id: str, session: SessionDep) -> Response:
    """The run's dead-letter rows, one JSON object a line (:mod:`batch_inference.ui.deadletters`)."""
    return _download(_view(session, dag_id, run_id), "jsonl")


@router.get("/runs/{dag_id}/{run_id}/dead-letters.csv", dependencies=[RunAccess])
def dead_letters_csv(dag_id: str, run_id: str, session: SessionDep) -> Response:
    """The run's dead-letter rows as CSV with a header, every cell neutralised against formula injection."""
    return _download(_view(session, dag_id, run_id), "csv")


class NoStoreMiddleware:
    """ASGI middleware setting :data:`NO_STORE_HEADERS` on every HTTP response (replacing any such header a
    route set), streamed responses included (the body passes through untouched)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                names = {n.encode("latin-1") for n in NO_STORE_HEADERS}
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() not in names]
                headers += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in NO_STORE_HEADERS.items()]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def create_app() -> FastAPI:
    """The app the plugin mounts (called once, on the API server's first request to it)."""
    app = FastAPI(title="Batch inference", docs_url=None, redoc_url=None, openapi_url=None,
                  dependencies=[Depends(get_user)])
    app.include_router(router)
    app.mount("/v1", openai_routes.create_app())
    app.add_middleware(NoStoreMiddleware)
    return app

