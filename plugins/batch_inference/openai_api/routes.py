"""The OpenAI-compatible Files + Batches API, mounted at ``/batch-inference/v1`` on the Airflow API server.

Point the official ``openai`` client at it with ``base_url="<airflow>/batch-inference/v1"`` and an
Airflow token as ``api_key`` (``docs/openai-batch.md``):

=====================================  ==================================================================
``POST /files``                        upload a batch input file (multipart ``file``, ``purpose=batch``)
``GET /files/{id}``                    the file object
``GET /files/{id}/content``            its bytes (an upload, or a batch's output / error file)
``POST /batches``                      ``input_file_id``, ``endpoint``, ``completion_window``, ``metadata``
``GET /batches/{id}``                  the batch object (status, ``request_counts``, file ids)
``GET /batches``                       batches the user may read, newest first (``limit``, ``after``)
``POST /batches/{id}/cancel``          stop launching shards; committed rows are kept
=====================================  ==================================================================

Auth: every route depends on Airflow's ``get_user`` (the client's ``api_key`` is sent as ``Authorization:
Bearer``; none: 401, invalid: 403), and on the auth manager's DAG-run permission of the catalog DAG the
batch runs on (``is_authorized_dag(access_entity=DagAccessEntity.RUN)``: ``POST`` to upload and create,
``GET`` to read, ``PUT`` to cancel). An upload is readable by its uploader only; a batch, and its output
and error files, by whoever may read the runs of its DAG; a batch the user may not read is 404, as one
that does not exist. Upload size and request-line limits are the catalog's (at most OpenAI's).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any

from airflow.api.common.mark_tasks import set_dag_run_state_to_failed
from airflow.api.common.trigger_dag import trigger_dag
from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep, get_user
from airflow.exceptions import DagNotFound
from airflow.models.dag import DagModel
from airflow.models.dagbag import DBDagBag
from airflow.utils.types import DagRunTriggeredByType
from batch_contract import storage
from batch_contract.engine_config import ConfigError
from batch_contract.openai_batch import check_metadata, file_models, iter_lines, parse_file
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel

from batch_inference.openai_api import batches as B
from batch_inference.openai_api.catalog import Catalog, load_catalog
from batch_inference.openai_api.errors import ApiError, http_exception_handler, validation_handler
from batch_inference.openai_api.store import ApiStore, BatchRecord, FileRecord, new_batch_id, new_file_id
from batch_inference.ui.discovery import find_runs
from batch_inference.ui.views import RunView, ViewCache

UPLOAD_READ_BYTES = 1 << 20
"""An upload's file part is read this many bytes at a time, and refused as soon as it passes the size
limit. A request whose ``Content-Length`` already says it is over the limit is refused before its body
is read; one without (chunked) is parsed first (Starlette spools the file part to a temporary file)."""
LIST_LIMIT_MAX = 100
CACHE = ViewCache()


def catalog() -> Catalog:
    """The operator's catalog, read now (503 with the reason when it is missing or invalid)."""
    try:
        return load_catalog()
    except ConfigError as exc:
        raise ApiError(503, str(exc), "catalog_unavailable") from None


CatalogDep = Annotated[Catalog, Depends(catalog)]


def user_name(user: Any) -> str:
    """The Airflow user's name (``get_name()`` of the auth manager's user; ``name`` otherwise)."""
    getter = getattr(user, "get_name", None)
    return str(getter() if callable(getter) else getattr(user, "name", ""))


def _team_of(session: Any, dag_id: str) -> str | None:
    """The team owning ``dag_id``'s bundle (``None``: none), as Airflow's own DAG checks pass it."""
    return DagModel.get_dag_id_to_team_name_mapping([dag_id], session=session).get(dag_id)


def may(user: Any, session: Any, dag_id: str, method: str) -> bool:
    """Whether the auth manager lets ``user`` do ``method`` on the runs of ``dag_id``."""
    team = _team_of(session, dag_id)
    return get_auth_manager().is_authorized_dag(method=method, access_entity=DagAccessEntity.RUN,
                                                details=DagDetails(id=dag_id, team_name=team), user=user)


def require(user: Any, session: Any, dag_id: str, method: str) -> None:
    """403 unless :func:`may`."""
    if not may(user, session, dag_id, method):
        raise ApiError(403, f"you may not {'read' if method == 'GET' else 'run'} batches of this model "
                       f"(DAG-run permission on {dag_id!r})")


def _view(dag_id: str, batch_id: str, session: Any) -> RunView | None:
    found = [r for r in find_runs(session, [dag_id], limit=1, run_id=batch_id) if r.run_id == batch_id]
    return CACHE.get(found[0]) if found else None


def _readable_batch(api: ApiStore, batch_id: str, user: Any, session: Any) -> BatchRecord:
    record = api.get_batch(batch_id)
    if record is None or not may(user, session, record.dag_id, "GET"):
        raise ApiError(404, f"no batch {batch_id!r}", "not_found")
    return record


def _current(api: ApiStore, record: BatchRecord, session: Any) -> dict[str, Any]:
    """The batch object, after writing its output files when its run has just ended."""
    view = None if record.status is not None else _view(record.dag_id, record.id, session)
    if record.final_status is None:
        status = B.live_status(record, view)
        if status in B.TERMINAL:
            record = B.finalize(api, record, view, status)
    return B.to_openai(record, view)


def _file_readable(api: ApiStore, file: FileRecord | None, user: Any, session: Any) -> FileRecord:
    if file is not None and file.batch_id is not None:
        batch = api.get_batch(file.batch_id)
        if batch is not None and may(user, session, batch.dag_id, "GET"):
            return file
    elif file is not None and file.owner == user_name(user):
        return file
    raise ApiError(404, "no such file", "not_found")


async def _read_upload(request: Request, limit: int) -> tuple[str, str, bytes]:
    """``(purpose, filename, bytes)`` of a multipart upload, refused (413) past ``limit`` bytes."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit + (64 << 10):
        raise ApiError(413, f"the upload is {int(length)} bytes; files are at most {limit} bytes", param="file")
    form = await request.form(max_files=1, max_fields=8)
    upload, purpose = form.get("file"), form.get("purpose")
    if upload is None or isinstance(upload, str):
        raise ApiError(400, "a multipart field 'file' is required", "invalid_request", "file")
    if purpose != "batch":
        raise ApiError(400, f"purpose {purpose!r}: only 'batch' files are accepted", "invalid_value", "purpose")
    chunks, size = [], 0
    while chunk := await upload.read(UPLOAD_READ_BYTES):
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"the upload is over {limit} bytes, the limit of a batch input file", param="file")
        chunks.append(chunk)
    return purpose, upload.filename or "upload.jsonl", b"".join(chunks)


def _check_lines(data: bytes, cat: Catalog) -> None:
    lines = sum(1 for _ in iter_lines(data))
    if lines == 0:
        raise ApiError(400, "the file has no request lines", "empty_file", "file")
    if lines > cat.max_requests:
        raise ApiError(400, f"the file has {lines} request lines; a batch holds at most {cat.max_requests}",
                       "too_many_requests", "file")


def _check_dag_ready(session: Any, dag_id: str) -> None:
    """503 when the catalog's DAG is not deployed or is paused (its runs would never start)."""
    dag = DagModel.get_current(dag_id, session=session)
    if dag is None:
        raise ApiError(503, f"the catalog's DAG {dag_id!r} is not deployed", "dag_not_found")
    if dag.is_paused:
        raise ApiError(503, f"the catalog's DAG {dag_id!r} is paused: its runs would not start", "dag_paused")


class BatchCreate(BaseModel):
    """``POST /batches`` body."""

    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, Any] | None = None


def create_app() -> FastAPI:
    """The API app (mounted by :func:`batch_inference.ui.app.create_app` at ``/v1``)."""
    app = FastAPI(title="Batch inference: OpenAI Files + Batches", docs_url=None, redoc_url=None,
                  openapi_url=None, dependencies=[Depends(get_user)])
    app.add_exception_handler(HTTPException, http_exception_handler)
    app.add_exception_handler(RequestValidationError, validation_handler)

    @app.post("/files")
    async def upload_file(request: Request, user: GetUserDep, session: SessionDep, cat: CatalogDep) -> Any:
        """Store a batch input file (readable by its uploader only)."""
        if not any(may(user, session, d, "POST") for d in cat.dag_ids()):
            raise ApiError(403, "you may not run batches (no DAG-run permission on the catalog's DAGs)")
        purpose, filename, data = await _read_upload(request, cat.max_file_bytes)
        _check_lines(data, cat)
        api = ApiStore(cat.files_root)
        fid = new_file_id()
        record = FileRecord(id=fid, filename=filename, purpose=purpose, created_at=B.now(), bytes=len(data),
                            uri=api.file_data_uri(fid), owner=user_name(user))
        api.put_file(record, data)
        return record.to_openai()

    @app.get("/files/{file_id}")
    def get_file(file_id: str, user: GetUserDep, session: SessionDep, cat: CatalogDep) -> Any:
        """The file object."""
        api = ApiStore(cat.files_root)
        return _file_readable(api, api.get_file(file_id), user, session).to_openai()

    @app.get("/files/{file_id}/content")
    def file_content(file_id: str, user: GetUserDep, session: SessionDep, cat: CatalogDep) -> Response:
        """The file's bytes (JSONL)."""
        api = ApiStore(cat.files_root)
        file = _file_readable(api, api.get_file(file_id), user, session)
        return Response(storage.read_bytes(file.uri), media_type="application/jsonl")

    @app.post("/batches")
    def create_batch(body: BatchCreate, user: GetUserDep, session: SessionDep, cat: CatalogDep) -> Any:
        """Check and convert the input file, then start its DAG run (run id = batch id)."""
        api = ApiStore(cat.files_root)
        B.check_create(cat, body.endpoint, body.completion_window)
        try:
            metadata = check_metadata(body.metadata)
        except ValueError as exc:
            raise ApiError(400, str(exc), "invalid_value", "metadata") from None
        file = api.get_file(body.input_file_id)
        if file is None or file.batch_id is not None or file.owner != user_name(user):
            raise ApiError(404, f"no input file {body.input_file_id!r}", "not_found", "input_file_id")
        data = storage.read_bytes(file.uri)
        entry = B.choose_model(cat, file_models(data), body.endpoint)
        require(user, session, entry.dag_id, "POST")
        _check_dag_ready(session, entry.dag_id)
        parsed = parse_file(iter_lines(data), body.endpoint, entry.name)
        batch_id = new_batch_id()
        record = BatchRecord(id=batch_id, endpoint=body.endpoint, input_file_id=file.id,
                             completion_window=body.completion_window, model=entry.name, dag_id=entry.dag_id,
                             owner=user_name(user), created_at=B.now(), total=parsed.total,
                             rejected=len(parsed.rejections), metadata=metadata)
        input_uri = B.write_inputs(api, batch_id, parsed)
        if not parsed.requests:
            record = B.rejected_batch(record, parsed)
            api.put_batch(record)
            return _current(api, record, session)
        api.put_batch(record)
        try:
            trigger_dag(entry.dag_id, triggered_by=DagRunTriggeredByType.REST_API, run_id=batch_id,
                        conf=B.run_conf(cat, entry, body.endpoint, input_uri, batch_id, body.completion_window),
                        triggering_user_name=user_name(user), session=session)
        except DagNotFound:
            api.put_batch(replace(record, status="failed", errors=[{
                "code": "dag_not_found", "message": f"the catalog's DAG {entry.dag_id!r} is not deployed",
                "param": None, "line": None}]))
            raise ApiError(503, f"model {entry.name!r}: the catalog's DAG {entry.dag_id!r} is not deployed",
                           "dag_not_found") from None
        session.commit()
        return B.to_openai(record, None)

    @app.get("/batches/{batch_id}")
    def get_batch(batch_id: str, user: GetUserDep, session: SessionDep, cat: CatalogDep) -> Any:
        """The batch object (writes its output files the first time its run is seen ended)."""
        api = ApiStore(cat.files_root)
        return _current(api, _readable_batch(api, batch_id, user, session), session)

    @app.get("/batches")
    def list_batches(user: GetUserDep, session: SessionDep, cat: CatalogDep,
                     limit: int = Query(20, ge=1, le=LIST_LIMIT_MAX), after: str | None = None) -> Any:
        """Batches of DAGs whose runs the user may read, newest first, ``limit`` after the id ``after``."""
        api = ApiStore(cat.files_root)
        readable = {d for d in cat.dag_ids() if may(user, session, d, "GET")}
        records = [r for r in (api.get_batch(i) for i in api.batch_ids()) if r is not None and r.dag_id in readable]
        records.sort(key=lambda r: (r.created_at, r.id), reverse=True)
        if after is not None:
            ids = [r.id for r in records]
            records = records[ids.index(after) + 1:] if after in ids else []
        page = records[:limit]
        data = [_current(api, r, session) for r in page]
        return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None, "has_more": len(records) > limit}

    @app.post("/batches/{batch_id}/cancel")
    def cancel_batch(batch_id: str, user: GetUserDep, session: SessionDep, cat: CatalogDep) -> Any:
        """Mark the batch's run failed (no new shard starts; running ones are stopped and keep what
        they committed); the batch is ``cancelling`` until the run has stopped, then ``cancelled``."""
        api = ApiStore(cat.files_root)
        record = _readable_batch(api, batch_id, user, session)
        require(user, session, record.dag_id, "PUT")
        current = _current(api, record, session)
        if current["status"] in B.TERMINAL or record.cancelling_at is not None:
            return current
        record = replace(api.get_batch(batch_id) or record, cancelling_at=B.now())
        api.put_batch(record)
        dag = DBDagBag().get_latest_version_of_dag(record.dag_id, session=session)
        if dag is not None:
            set_dag_run_state_to_failed(dag=dag, run_id=batch_id, commit=True, session=session)
            session.commit()
        return _current(api, record, session)

    return app
