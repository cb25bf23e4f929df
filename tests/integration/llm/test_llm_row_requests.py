"""Rows that are whole requests (OpenAI batch chat lines) on real vLLM (CPU), tiny random Llama: each row's
conversation is its prompt (``engine.row_messages``) and its own sampling settings apply to it alone
(``engine.row_sampling_column``): max_tokens, a JSON schema; invalid settings or a text that is no
conversation are dead letters, not a failed chunk."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm")

import jsonschema  # noqa: E402
import pyarrow as pa  # noqa: E402
from batch_contract.engine_config import WorkerSettings  # noqa: E402
from batch_contract.enums import DeadLetterReason  # noqa: E402
from batch_contract.llm_config import LLMConfig  # noqa: E402
from batch_worker.engines.base import ChunkRows, check_chunk_output  # noqa: E402
from batch_worker.engines.llm import LLMEngine  # noqa: E402
from llm_helpers import llm_engine_dict  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.llm]
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}


def conversation(i: int) -> str:
    return json.dumps([{"role": "system", "content": "You file packages."},
                       {"role": "user", "content": f"package {i}: a small tool number {i}"}])


@pytest.fixture(scope="module")
def engine(tiny_model):
    config = llm_engine_dict(tiny_model, system_prompt="", user_template="{{ text }}", max_tokens=8,
                             row_messages=True, row_sampling_column="sampling")
    eng = LLMEngine(LLMConfig.from_dict(config), WorkerSettings())
    eng.load()
    yield eng
    eng.close()


def test_each_row_gets_its_own_conversation_and_settings(engine) -> None:
    rows = [{"id": f"r{i}", "text": conversation(i), "sampling": json.dumps({"max_tokens": 1 + i % 5})}
            for i in range(10)]
    rows.append({"id": "default", "text": conversation(99), "sampling": ""})
    rows.append({"id": "schema", "text": conversation(7), "sampling": json.dumps({"max_tokens": 40,
                                                                                    "json_schema": SCHEMA})})
    rows.append({"id": "bad-temp", "text": conversation(1), "sampling": json.dumps({"temperature": 5})})
    rows.append({"id": "bad-key", "text": conversation(1), "sampling": json.dumps({"model_path": "/x"})})
    rows.append({"id": "no-chat", "text": "plain text, not a conversation", "sampling": ""})
    table = pa.Table.from_pylist(rows)
    chunk = ChunkRows(ids=table.column("id").to_pylist(), texts=table.column("text").to_pylist(),
                      text_repaired=[False] * len(rows), source_uri=["mem"] * len(rows),
                      source_row=list(range(len(rows))), fields=table)
    assert engine.extra_columns() == ["sampling"]
    out = engine.process(engine.prepare(chunk), lambda: False)
    assert check_chunk_output(chunk, out) == set()
    rejects = {r.id: (r.reason, r.detail) for r in out.rejects}
    assert {k: v[0] for k, v in rejects.items()} == {
        "bad-temp": DeadLetterReason.TEMPLATE_ERROR, "bad-key": DeadLetterReason.TEMPLATE_ERROR,
        "no-chat": DeadLetterReason.TEMPLATE_ERROR}
    assert "engine.temperature" in rejects["bad-temp"][1] and "row_messages" in rejects["no-chat"][1]
    got = {r["id"]: r for r in out.table.to_pylist()}
    tok = engine.tokenizer
    for i in range(10):
        row = got[f"r{i}"]
        assert row["output_tokens"] <= 1 + i % 5
        assert row["finish_reason"] == "stop" or row["output_tokens"] == 1 + i % 5
        chat = json.loads(conversation(i))
        expected = tok.encode(tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True),
                              add_special_tokens=False)
        assert row["prompt_tokens"] == len(expected)  # the row's conversation, nothing of the engine's
    assert got["default"]["output_tokens"] <= 8
    jsonschema.validate(json.loads(got["schema"]["output_json"]), SCHEMA)
    assert got["r1"]["output_json"] is None  # no schema of its own: free text


def test_the_rows_settings_are_in_its_reuse_key(engine) -> None:
    rows = [{"id": "a", "text": conversation(1), "sampling": ""},
            {"id": "b", "text": conversation(1), "sampling": json.dumps({"max_tokens": 2})},
            {"id": "c", "text": conversation(1), "sampling": ""}]
    table = pa.Table.from_pylist(rows)
    chunk = ChunkRows(ids=["a", "b", "c"], texts=table.column("text").to_pylist(), text_repaired=[False] * 3,
                      source_uri=["mem"] * 3, source_row=[0, 1, 2], fields=table)
    a, b, c = engine.reuse_keys(chunk)
    assert a == c and a != b and a is not None and b is not None
