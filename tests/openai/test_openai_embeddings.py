"""The official ``openai`` client against ``airflow standalone``: embeddings batches on the real MiniLM
encoder (uploaded, created, polled to ``completed``, output and error files downloaded), a batch
cancelled mid-run, refusals without or with a bad token, by permission, and at the limits."""

from __future__ import annotations

import io
import json
import math
from typing import Any

import pytest
from airflow_rest import http
from openai_helpers import MAX_FILE_BYTES, MAX_REQUESTS, SUMMARY, base_url, jsonl_objects, openai, wait_for

EMB = "/v1/embeddings"


def emb_line(cid: str, text: str, model: str = "minilm", url: str = EMB, **body: Any) -> str:
    return json.dumps({"custom_id": cid, "method": "POST", "url": url,
                       "body": {"model": model, "input": text, **body}})


def upload(client: Any, lines: list[str]) -> str:
    data = ("\n".join(lines) + "\n").encode()
    return client.files.create(file=("requests.jsonl", io.BytesIO(data)), purpose="batch").id


def check_every_line_once(lines: list[str], output: list[dict], errors: list[dict]) -> None:
    """Every readable custom id in exactly one file; the unreadable lines in the error file (id null)."""
    ids = [o["custom_id"] for o in output] + [e["custom_id"] for e in errors if e["custom_id"] is not None]
    unreadable = [e for e in errors if e["custom_id"] is None]
    assert len(ids) + len(unreadable) == len(lines)


def test_embeddings_batch_completes_with_output_and_error_files(client: Any) -> None:
    good = [emb_line(f"req-{i}", f"package number {i}: a tool that does thing {i % 7}") for i in range(150)]
    bad = {
        "not-json": "{this is not json",
        "other-model": emb_line("bad-model", "x", model="no-such-model"),
        "wrong-url": emb_line("bad-url", "x", url="/v1/chat/completions"),
        "duplicate": emb_line("req-3", "a second line with an id already used"),
        "unsupported": emb_line("bad-dims", "x", dimensions=8),
        "list-input": emb_line("bad-list", ["a", "b"]),  # type: ignore[arg-type]
    }
    lines = good[:75] + list(bad.values()) + good[75:]
    file_id = upload(client, lines)
    assert client.files.retrieve(file_id).bytes > 0
    batch = client.batches.create(input_file_id=file_id, endpoint=EMB, completion_window="24h",
                                  metadata={"team": "search"})
    assert batch.status == "validating" and batch.metadata == {"team": "search"}
    done = wait_for(client, batch.id, {"completed"})
    assert done.request_counts.total == len(lines)
    assert (done.request_counts.completed, done.request_counts.failed) == (150, len(bad))
    output = jsonl_objects(client.files.content(done.output_file_id).content)
    errors = jsonl_objects(client.files.content(done.error_file_id).content)
    check_every_line_once(lines, output, errors)
    assert sorted(o["custom_id"] for o in output) == sorted(f"req-{i}" for i in range(150))
    for o in output:
        body = openai.types.CreateEmbeddingResponse.model_validate(o["response"]["body"])
        vec = body.data[0].embedding
        assert len(vec) == 384 and abs(math.sqrt(sum(x * x for x in vec)) - 1.0) < 1e-3
        assert body.usage.prompt_tokens > 0 and o["response"]["status_code"] == 200
    codes = {e["custom_id"]: e["error"]["code"] for e in errors}
    assert codes == {None: "invalid_json_line", "bad-model": "model_mismatch", "bad-url": "mismatched_endpoint",
                     "req-3": "duplicate_custom_id", "bad-dims": "unsupported_parameter",
                     "bad-list": "unsupported_parameter"}
    assert [b.id for b in client.batches.list()].count(batch.id) == 1
    SUMMARY["batches_completed"] += 1
    SUMMARY["requests"] += len(lines)
    SUMMARY["errors"] += len(errors)


def test_cancel_stops_launching_shards_and_keeps_committed_rows(client: Any) -> None:
    lines = [emb_line(f"c-{i}", f"row {i} of a batch that is cancelled while it runs") for i in range(600)]
    batch = client.batches.create(input_file_id=upload(client, lines), endpoint=EMB, completion_window="24h")
    committed = wait_for(client, batch.id, {"in_progress"}, progress=lambda b: b.request_counts.completed > 0)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in {"cancelling", "cancelled"} and cancelling.cancelling_at is not None
    done = wait_for(client, batch.id, {"cancelled"})
    counts = done.request_counts
    assert counts.total == 600 and counts.completed + counts.failed == 600
    output = jsonl_objects(client.files.content(done.output_file_id).content) if done.output_file_id else []
    errors = jsonl_objects(client.files.content(done.error_file_id).content)
    check_every_line_once(lines, output, errors)
    assert committed.request_counts.completed <= len(output) == counts.completed < 600  # committed rows kept
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    assert done.cancelled_at is not None
    SUMMARY["batches_cancelled"] += 1
    SUMMARY["requests"] += len(lines)
    SUMMARY["errors"] += len(errors)


def test_no_token_or_a_bad_token_is_refused(airflow: Any) -> None:
    raw = http("GET", f"{base_url(airflow)}/batches")
    assert raw.status == 401
    assert raw.json()["error"]["code"] == "invalid_api_key"
    bad = openai.OpenAI(base_url=base_url(airflow), api_key="not-an-airflow-token", max_retries=0)
    with pytest.raises((openai.AuthenticationError, openai.PermissionDeniedError)):
        bad.batches.list()
    with pytest.raises((openai.AuthenticationError, openai.PermissionDeniedError)):
        bad.files.create(file=("x.jsonl", io.BytesIO(emb_line("a", "b").encode())), purpose="batch")
    SUMMARY["unauthenticated_refused"] += 3


def test_viewer_may_not_create_nor_read_others_uploads(client: Any, viewer: Any) -> None:
    file_id = upload(client, [emb_line("v-1", "text")])
    with pytest.raises(openai.NotFoundError):
        viewer.files.retrieve(file_id)
    with pytest.raises(openai.PermissionDeniedError):
        viewer.files.create(file=("x.jsonl", io.BytesIO(emb_line("a", "b").encode())), purpose="batch")
    with pytest.raises(openai.NotFoundError):
        viewer.batches.create(input_file_id=file_id, endpoint=EMB, completion_window="24h")
    with pytest.raises(openai.NotFoundError):
        viewer.batches.retrieve("batch_000000000000000000000000")


def test_limits_and_bad_requests_get_openai_error_bodies(client: Any) -> None:
    with pytest.raises(openai.APIStatusError) as big:
        client.files.create(file=("big.jsonl", io.BytesIO(b"x" * (MAX_FILE_BYTES + 1))), purpose="batch")
    assert big.value.status_code == 413 and big.value.body["code"] == "file_too_large"
    many = [emb_line(f"m-{i}", "t") for i in range(MAX_REQUESTS + 1)]
    with pytest.raises(openai.BadRequestError, match="at most"):
        upload(client, many)
    with pytest.raises(openai.BadRequestError, match="only 'batch'"):
        client.files.create(file=("x.jsonl", io.BytesIO(emb_line("a", "b").encode())), purpose="fine-tune")
    mixed = upload(client, [emb_line("a", "t"), emb_line("b", "t", model="minilm-copy")])
    with pytest.raises(openai.BadRequestError, match="one model") as exc:
        client.batches.create(input_file_id=mixed, endpoint=EMB, completion_window="24h")
    assert exc.value.body["code"] == "mismatched_model"
    single = upload(client, [emb_line("a", "t")])
    with pytest.raises(openai.BadRequestError, match="completion_window"):
        client.batches.create(input_file_id=single, endpoint=EMB, completion_window="48h")  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match="metadata"):
        client.batches.create(input_file_id=single, endpoint=EMB, completion_window="24h",
                              metadata={f"k{i}": "v" for i in range(17)})


def test_a_file_with_no_acceptable_line_is_a_failed_batch_with_an_error_file(client: Any) -> None:
    lines = [emb_line("x-1", "t", url="/v1/completions"), emb_line("x-2", "t", encoding_format="base64")]
    batch = client.batches.create(input_file_id=upload(client, lines), endpoint=EMB, completion_window="24h")
    assert batch.status == "failed" and batch.errors.data[0].code == "mismatched_endpoint"
    errors = jsonl_objects(client.files.content(batch.error_file_id).content)
    assert [e["custom_id"] for e in errors] == ["x-1", "x-2"] and batch.output_file_id is None
