"""An OpenAI batch file of chat requests planned by the real planner (``input_format: openai_batch``) and
run by the real worker on vLLM (CPU, tiny random Llama): each accepted line is a row with its own
conversation and settings (the planner added the chat endpoint's engine options), each refused line a
dead letter with the API's code, and the run's OpenAI output and error files hold every line once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from batch_contract.openai_batch import CHAT, COMPLETIONS, Code  # noqa: E402
from batch_inference.openai_files import write_run_files  # noqa: E402
from batch_inference.planner import PlanRequest, plan  # noqa: E402
from llm_helpers import REPO  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.llm]
NAME = "tiny-chat"


def chat(cid: str, **body: object) -> str:
    return json.dumps({"custom_id": cid, "method": "POST", "url": CHAT,
                       "body": {"model": NAME, "messages": [{"role": "system", "content": "You file packages."},
                                                            {"role": "user", "content": f"package {cid}"}], **body}})


LINES = [
    chat("a", max_tokens=3),
    chat("b", max_completion_tokens=6, temperature=0),
    json.dumps({"custom_id": "c", "method": "POST", "url": COMPLETIONS, "body": {"model": NAME, "prompt": "x"}}),
    chat("d", temperature=7),
    chat("e", response_format={"type": "json_object"}),
    chat("f"),
]


def test_a_chat_batch_file_plans_and_runs_on_vllm(tiny_model: Path, tmp_path: Path) -> None:
    src = tmp_path / "chat.jsonl"
    src.write_text("\n".join(LINES) + "\n")
    engine = {"kind": "llm", "model_path": str(tiny_model), "dtype": "float32", "max_model_len": 1024,
              "max_num_seqs": 64, "max_tokens": 8}
    manifest, _ = plan(PlanRequest(input_uri=str(src), id_column="id", text_column="text",
                                   output_root=str(tmp_path / "out"), run_id="chat_run", engine=engine,
                                   input_format="openai_batch"))
    assert manifest.engine_config.row_messages and len(manifest.shards) == 1
    run_dir = str(tmp_path / "out" / "runs" / "chat_run")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "plugins"), str(REPO / "worker_image")])}
    proc = subprocess.run([sys.executable, "-m", "batch_worker", "run", "--run-dir", run_dir, "--shard",
                           manifest.shards[0].shard_id, "--log-level", "WARNING"], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]

    files = write_run_files(run_dir)
    assert files is not None and files.output_lines + files.error_lines == len(LINES)
    output = [json.loads(x) for x in Path(files.output_uri).read_bytes().splitlines()]
    errors = [json.loads(x) for x in Path(files.errors_uri).read_bytes().splitlines()]
    assert [o["custom_id"] for o in output] == ["a", "b", "f"]
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [
        ("c", Code.MISMATCHED_ENDPOINT), ("d", Code.INVALID_BODY), ("e", Code.UNSUPPORTED)]
    usage = {o["custom_id"]: o["response"]["body"]["usage"] for o in output}
    assert usage["a"]["completion_tokens"] <= 3 and usage["b"]["completion_tokens"] <= 6
    assert usage["f"]["completion_tokens"] <= 8  # the run's own max_tokens where the line gives none
    for o in output:
        body = o["response"]["body"]
        assert body["object"] == "chat.completion" and body["model"] == NAME
        assert body["choices"][0]["finish_reason"] in ("stop", "length") and body["usage"]["prompt_tokens"] > 0
