"""A finished batch's output and error files (``batch_inference.openai_api.results``) from a run's committed
files, on synthetic runs that follow the data contract: whatever was committed, dead-lettered, re-committed
or never run, and whatever the final status, every input line is in exactly one of the two files, with
the right code (hypothesis)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from batch_contract.openai_batch import EMBEDDINGS, parse_file
from batch_contract.runstore import RunStore
from batch_inference.openai_api.batches import finalize, live_status, to_openai, write_inputs
from batch_inference.openai_api.results import build_files
from batch_inference.openai_api.store import ApiStore, BatchRecord, new_batch_id
from batch_inference.ui.discovery import RunRecord
from batch_inference.ui.status import BatchStatus
from batch_inference.ui.views import RunView
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from synthetic_runs import RunSpec, build_run, write_input

openai_types = pytest.importorskip("openai.types")
DAG = "batch_inference_backfill"


def line(cid: str, text: str = "t", model: str = "minilm") -> bytes:
    return json.dumps({"custom_id": cid, "method": "POST", "url": EMBEDDINGS,
                       "body": {"model": model, "input": text}}).encode()


def make_batch(root: Path, n: int, bad: set[int]) -> tuple[ApiStore, BatchRecord, list[str]]:
    """A batch of ``n`` lines (those in ``bad`` name another model) with its inputs written."""
    api = ApiStore(str(root / "openai"))
    lines = [line(f"r{i}", model="other" if i in bad else "minilm") for i in range(n)]
    parsed = parse_file(enumerate(lines), EMBEDDINGS, "minilm")
    batch_id = new_batch_id()
    write_inputs(api, batch_id, parsed)
    record = BatchRecord(id=batch_id, endpoint=EMBEDDINGS, input_file_id="file-" + "0" * 24,
                         completion_window="24h", model="minilm", dag_id=DAG, owner="u", created_at=1,
                         total=parsed.total, rejected=len(parsed.rejections))
    return api, record, [r.custom_id for r in parsed.requests]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 40), data=st.data(), status=st.sampled_from(["completed", "cancelled", "expired", "failed"]),
       duplicate=st.booleans())
def test_every_line_lands_exactly_once(tmp_path_factory: pytest.TempPathFactory, n: int, data: st.DataObject,
                                       status: str, duplicate: bool) -> None:
    root = tmp_path_factory.mktemp("res")
    bad = data.draw(st.sets(st.integers(0, n - 1)))
    api, record, accepted = make_batch(root, n, bad)
    if not accepted:
        built = build_files(api, record, None, status, 5)
        assert (built.completed, built.failed) == (0, n)
        return
    rows = len(accepted)
    dead = data.draw(st.sets(st.integers(0, rows - 1)))
    drop = data.draw(st.sets(st.integers(0, rows - 1))) - dead
    src = write_input(root / "in.parquet", accepted)
    layout = build_run(root / "out", record.id, src, RunSpec(shards=2, chunk_rows=7, dead_rows=dead,
                                                             drop_rows=drop, duplicate_chunk=duplicate))
    built = build_files(api, record, RunStore(layout), status, 5)
    out = [json.loads(x) for x in built.output.splitlines()]
    err = [json.loads(x) for x in built.errors.splitlines()]
    assert built.total == n == len(out) + len(err)
    ids = [o["custom_id"] for o in out] + [e["custom_id"] for e in err]
    assert sorted(ids) == sorted(f"r{i}" for i in range(n))
    code = {e["custom_id"]: e["error"]["code"] for e in err}
    unfinished = {"cancelled": "batch_cancelled", "expired": "batch_expired"}.get(status, "batch_failed")
    for i in range(n):
        cid = f"r{i}"
        if i in bad:
            assert code[cid] == "model_mismatch"
    for j, cid in enumerate(accepted):
        want = "empty_text" if j in dead else unfinished if j in drop else None
        assert code.get(cid) == want
    for o in out:
        openai_types.CreateEmbeddingResponse.model_validate(o["response"]["body"])


def _view(state: BatchStatus, end: int | None = None) -> RunView:
    from datetime import UTC, datetime

    end_date = None if end is None else datetime.fromtimestamp(end, UTC)
    return RunView(RunRecord(dag_id=DAG, run_id="x", state="failed", end_date=end_date), state)


def test_status_cancelling_until_the_run_stops_then_files_and_counts_are_frozen(tmp_path: Path) -> None:
    api, record, _ = make_batch(tmp_path, 3, {2})
    asked = BatchRecord(**{**record.__dict__, "cancelling_at": 10})
    assert live_status(asked, _view(BatchStatus.IN_PROGRESS)) == "cancelling"
    assert live_status(asked, _view(BatchStatus.FAILED)) == "cancelled"  # marked failed by the cancel
    assert live_status(record, _view(BatchStatus.EXPIRED)) == "expired"
    done = finalize(api, asked, _view(BatchStatus.FAILED, end=20), "cancelled")
    batch = to_openai(done, _view(BatchStatus.FAILED, end=20))
    assert batch["status"] == "cancelled" and batch["cancelling_at"] == 10 and batch["cancelled_at"] is not None
    assert batch["request_counts"] == {"total": 3, "completed": 0, "failed": 3}
    assert batch["output_file_id"] is None and api.get_file(batch["error_file_id"]).batch_id == record.id
    expired = to_openai(finalize(api, record, _view(BatchStatus.EXPIRED, end=30), "expired"), None)
    assert expired["status"] == "expired" and expired["expired_at"] is not None
    assert expired["expires_at"] == record.created_at + 24 * 3600
