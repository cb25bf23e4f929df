"""Batches: create one (check and convert its input file, trigger its DAG run), read its state from the
run store, write its output files once its run ended, cancel it.

A batch is a run of the catalog's DAG for its model, with run id = batch id. Its OpenAI ``status``:

==============  =========================================================================================
``failed``      no line of the input file was accepted (the reasons are in the error file), or the run
                failed (a shard failed, or below ``min_success_ratio``; what was committed is kept)
``validating``  the run is queued or planning (:mod:`batch_inference.ui.status`)
``in_progress`` shards are running
``finalizing``  every shard is done; publish runs
``completed``   the run succeeded
``expired``     the completion window (the run's ``deadline_hours``) passed before enough shards completed
``cancelling``  ``cancel`` was asked and the run is still being stopped
``cancelled``   the run stopped after ``cancel`` (or was marked failed by hand with no task failed)
==============  =========================================================================================

``request_counts``: ``total`` input lines; ``completed`` result rows; ``failed`` lines refused before
the run + dead-letter rows (+ once ended, requests never run). When the run has ended the output and
error files are written (:mod:`batch_inference.openai_api.results`) and the counts frozen in the record.
"""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import datetime
from typing import Any

from batch_contract import storage
from batch_contract.openai_batch import COMPLETION_WINDOW_HOURS, ENDPOINTS, ENGINE_OPTIONS_OF_ENDPOINT, Parsed
from batch_contract.openai_output import error_line, jsonl
from batch_contract.runstore import RunStore

from batch_inference.openai_api.catalog import Catalog, ModelEntry
from batch_inference.openai_api.errors import ApiError
from batch_inference.openai_api.results import build_files
from batch_inference.openai_api.store import ApiStore, BatchRecord, FileRecord, new_file_id
from batch_inference.progress import STALE_AFTER_SECONDS
from batch_inference.ui.views import RunView

TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})
OUTPUT_DIR = "openai"
"""Folder of a run directory holding the batch's ``output.jsonl`` and ``errors.jsonl``."""


def now() -> int:
    """Unix seconds now."""
    return int(time.time())


def _ts(value: datetime | None) -> int | None:
    return None if value is None else int(value.timestamp())


def check_create(catalog: Catalog, endpoint: Any, completion_window: Any) -> None:
    """Refuse an unknown endpoint or completion window (400 naming the param)."""
    if endpoint not in ENDPOINTS:
        raise ApiError(400, f"endpoint {endpoint!r} is not one of {list(ENDPOINTS)}", "invalid_value", "endpoint")
    if completion_window not in COMPLETION_WINDOW_HOURS:
        raise ApiError(400, f"completion_window {completion_window!r} is not one of "
                       f"{list(COMPLETION_WINDOW_HOURS)}", "invalid_value", "completion_window")


def choose_model(catalog: Catalog, models: set[str], endpoint: str) -> ModelEntry:
    """The catalog entry of the batch: the one catalog model the file's lines name. Lines naming a
    model the catalog lacks are not the batch's model; they become ``model_mismatch`` error lines.

    Raises:
        ApiError: 400 when the lines name several catalog models (OpenAI refuses a file whose requests
            name different models too), none, or one whose engine cannot serve ``endpoint``.
    """
    served = sorted(models & set(catalog.models))
    if len(served) > 1:
        raise ApiError(400, f"the input file's lines name {len(served)} models ({served[:5]}): a batch's "
                       "requests must all name one model", "mismatched_model", "input_file_id")
    if not served:
        raise ApiError(400, f"no line of the input file names a model served here (they name "
                       f"{sorted(models)[:5]}; the operator's catalog has {sorted(catalog.models)})",
                       "model_not_found", "input_file_id")
    entry = catalog.models[served[0]]
    if not entry.serves(endpoint):
        raise ApiError(400, f"model {entry.name!r} runs the {entry.engine} engine, which cannot serve {endpoint}",
                       "invalid_value", "endpoint")
    return entry


def run_conf(catalog: Catalog, entry: ModelEntry, endpoint: str, input_uri: str, batch_id: str,
             window: str) -> dict[str, Any]:
    """The DAG run's conf: the converted input, the entry's engine, model and options (with the endpoint's,
    :data:`~batch_contract.openai_batch.ENGINE_OPTIONS_OF_ENDPOINT`), the window as deadline."""
    conf: dict[str, Any] = {
        "input_uri": input_uri, "id_column": "id", "text_column": "text", "engine": entry.engine,
        "model": entry.model, "engine_options": {**entry.engine_options, **ENGINE_OPTIONS_OF_ENDPOINT[endpoint]},
        "output_root": catalog.output_root,
        "output_table": f"openai_{batch_id}", "deadline_hours": COMPLETION_WINDOW_HOURS[window],
    }
    conf.update(entry.params)
    return conf


def write_inputs(api: ApiStore, batch_id: str, parsed: Parsed) -> str:
    """Write the accepted requests as the run's JSONL input and the refused lines as error lines;
    returns the input's URI."""
    rows = [{**r.row(), "line": r.line} for r in parsed.requests]
    uri = api.batch_uri(batch_id, "input.jsonl")
    storage.write_create_only(uri, jsonl(rows))
    errors = [error_line(batch_id, r.custom_id, r.line, r.code, r.message) for r in parsed.rejections]
    storage.write_create_only(api.batch_uri(batch_id, "rejected.jsonl"), jsonl(errors))
    return uri


def counts(record: BatchRecord, view: RunView | None) -> dict[str, int]:
    """``request_counts`` (module docstring)."""
    if record.counts is not None:
        return dict(record.counts)
    done = dead = 0
    for shard in view.shards if view is not None else ():
        done += shard.rows_done - shard.rows_dead_letter
        dead += shard.rows_dead_letter
    return {"total": record.total, "completed": done, "failed": record.rejected + dead}


def live_status(record: BatchRecord, view: RunView | None) -> str:
    """The status before the output files are written (module docstring)."""
    if record.status is not None:
        return record.status
    if view is None:
        return "validating"
    if record.cancelling_at is not None:
        return "cancelled" if view.status.terminal and not shards_stopping(view) else "cancelling"
    return view.status.value


def shards_stopping(view: RunView, at: float | None = None) -> bool:
    """Whether a shard's worker may still run: a cancelled run's workers commit what they finished after
    the run was marked failed, so its files wait for them. A ``running`` shard counts until its progress
    object goes ``stale`` (:data:`batch_inference.progress.STALE_AFTER_SECONDS` without a write); a
    ``starting`` one (attempt record, no progress yet) counts for that long after the run ended, then
    not: its worker was killed while it loaded the model and will never write again (``at``: Unix
    seconds now, default the clock)."""
    states = {s.state for s in view.shards}
    if "running" in states:
        return True
    if "starting" not in states:
        return False
    ended = _ts(view.record.end_date) if view.record is not None else None
    return ended is None or (time.time() if at is None else at) - ended < STALE_AFTER_SECONDS


def finalize(api: ApiStore, record: BatchRecord, view: RunView | None, status: str) -> BatchRecord:
    """Write the output and error files of a batch whose run ended, record them and the counts."""
    store = RunStore(view.layout) if view is not None and view.layout is not None else None
    ended = _ts(view.record.end_date) if view is not None else None
    built = build_files(api, record, store, status, ended or now())
    base = api.batch_dir(record.id) if store is None else f"{store.run_dir}/{OUTPUT_DIR}"
    ids = {}
    for kind, data in (("output", built.output), ("errors", built.errors)):
        if not data:
            continue
        fid = new_file_id()
        uri = f"{base}/{kind}.jsonl"
        storage.write_replace(uri, data)
        api.put_file(FileRecord(id=fid, filename=f"{record.id}_{kind}.jsonl", purpose="batch_output",
                                created_at=now(), bytes=len(data), uri=uri, batch_id=record.id))
        ids[kind] = fid
    done = replace(record, final_status=status, finalized_at=now(), output_file_id=ids.get("output"),
                   error_file_id=ids.get("errors"),
                   counts={"total": record.total, "completed": built.completed, "failed": built.failed},
                   cancelled_at=now() if status == "cancelled" and record.cancelling_at else record.cancelled_at)
    api.put_batch(done)
    return done


def to_openai(record: BatchRecord, view: RunView | None) -> dict[str, Any]:
    """The OpenAI ``batch`` object of ``record`` (after :func:`finalize` when its run ended)."""
    status = record.final_status or live_status(record, view)
    start = _ts(view.record.start_date) if view is not None else None
    end = _ts(view.record.end_date) if view is not None else None
    ended = end or record.finalized_at
    return {
        "id": record.id, "object": "batch", "endpoint": record.endpoint, "model": record.model,
        "errors": {"object": "list", "data": record.errors} if record.errors else None,
        "input_file_id": record.input_file_id, "completion_window": record.completion_window,
        "status": status, "output_file_id": record.output_file_id, "error_file_id": record.error_file_id,
        "created_at": record.created_at, "in_progress_at": start,
        "expires_at": record.created_at + int(COMPLETION_WINDOW_HOURS[record.completion_window] * 3600),
        "finalizing_at": None,
        "completed_at": ended if status == "completed" else None,
        "failed_at": ended if status == "failed" else None,
        "expired_at": ended if status == "expired" else None,
        "cancelling_at": record.cancelling_at,
        "cancelled_at": (record.cancelled_at or ended) if status == "cancelled" else None,
        "request_counts": counts(record, view), "metadata": record.metadata or None,
    }


def rejected_batch(record: BatchRecord, parsed: Parsed) -> BatchRecord:
    """The record of a batch none of whose lines was accepted: ``failed``, the first reasons as errors."""
    data = [{"code": r.code, "message": r.message, "param": None, "line": r.line + 1}
            for r in parsed.rejections[:10]]
    return replace(record, status="failed", errors=data)

