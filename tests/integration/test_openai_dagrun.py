"""A batch DAG run (``make run``'s path: the real ``python -m batch_inference.cli run``, Airflow's
``dags test``) over an OpenAI batch JSONL file of ``/v1/embeddings`` requests on the MiniLM encoder:
every line ends exactly once in OpenAI's output or error file, the refused lines with the code the
``/v1/batches`` API's error file gives them; the published table and the report agree; lines that need
another engine fail the plan with a message naming it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from batch_contract.openai_batch import CHAT, EMBEDDINGS, Code

pytestmark = [pytest.mark.integration, pytest.mark.dagrun]

REPO = Path(__file__).resolve().parents[2]
MODEL = "all-minilm-l6-v2"


def _cli(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "BATCH_CLI_AIRFLOW_HOME": str(tmp_path / "airflow_home"),
           "PYTHONPATH": os.pathsep.join([str(REPO / "plugins"), str(REPO / "worker_image")])}
    return subprocess.run([sys.executable, "-m", "batch_inference.cli", "run", *argv, "--progress-interval", "1"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def _line(cid: object, url: str = EMBEDDINGS, **body: object) -> str:
    return json.dumps({"custom_id": cid, "method": "POST", "url": url,
                       "body": {"model": MODEL, "input": f"text of {cid}", **body}})


LINES = [
    *(_line(f"req-{i}") for i in range(9)),
    "{this is not json",
    _line("req-3"),  # duplicate_custom_id
    _line("req-x", model="gpt-4o"),  # model_mismatch
    _line("req-y", dimensions=64),  # unsupported_parameter
    _line("req-z", url=CHAT, messages=[{"role": "user", "content": "hi"}]),  # mismatched_endpoint
    _line(None),  # missing_custom_id
    _line("req-empty", input="   "),  # invalid_request
]
REFUSED = [(None, Code.INVALID_JSON), ("req-3", Code.DUPLICATE_CUSTOM_ID), ("req-x", Code.MISMATCHED_MODEL),
           ("req-y", Code.UNSUPPORTED), ("req-z", Code.MISMATCHED_ENDPOINT), (None, Code.MISSING_CUSTOM_ID),
           ("req-empty", Code.INVALID_BODY)]


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_bytes().splitlines() if x.strip()]


def test_an_embeddings_batch_file_runs_on_minilm_and_writes_openais_files(tmp_path: Path) -> None:
    src = tmp_path / "requests.jsonl"
    src.write_text("\n".join(LINES) + "\n")
    done = _cli(tmp_path, "--input", str(src), "--input-format", "openai_batch", "--output", str(tmp_path / "out"),
                "--rows-per-shard", "6")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report_uri = done.stdout.strip().splitlines()[-1]
    report = json.loads(Path(report_uri).read_text())
    run_dir = Path(report_uri).parent
    output, errors = _jsonl(run_dir / "openai" / "output.jsonl"), _jsonl(run_dir / "openai" / "errors.jsonl")
    assert report["uris"]["openai_output"] == str(run_dir / "openai" / "output.jsonl")
    assert report["uris"]["openai_errors"] == str(run_dir / "openai" / "errors.jsonl")
    assert f"OpenAI batch output: {run_dir / 'openai' / 'output.jsonl'}" in done.stdout  # the run's summary

    assert len(output) + len(errors) == len(LINES)
    assert [o["custom_id"] for o in output] == [f"req-{i}" for i in range(9)]
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == REFUSED
    assert (report["rows_input"], report["rows_published"], report["rows_dead_letter"]) == (len(LINES), 9, 7)
    for o in output:
        body = o["response"]["body"]
        assert o["response"]["status_code"] == 200 and body["object"] == "list" and body["model"] == MODEL
        assert len(body["data"][0]["embedding"]) == 384 and body["usage"]["prompt_tokens"] > 0
    assert len({o["response"]["body"]["data"][0]["embedding"][0] for o in output}) > 1  # not one vector copied
    assert len({x["id"] for x in output + errors}) == len(LINES)


def test_chat_lines_on_the_encoder_fail_the_plan_naming_the_engine(tmp_path: Path) -> None:
    src = tmp_path / "chat.jsonl"
    src.write_text(_line("a", url=CHAT, messages=[{"role": "user", "content": "hi"}]) + "\n")
    failed = _cli(tmp_path, "--input", str(src), "--input-format", "openai_batch", "--output", str(tmp_path / "out"))
    assert failed.returncode != 0
    assert "task plan" in failed.stderr and "engine='llm'" in failed.stderr, failed.stderr[-3000:]
