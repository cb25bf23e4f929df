"""The LLM engine on real vLLM (CPU) with a tiny random Llama: join by id, guards, structured output,
token accounting, interruption. Outputs are gibberish; the pipeline around them is what is tested."""

from __future__ import annotations

import json
import random

import pytest

pytest.importorskip("vllm")

import jsonschema  # noqa: E402
import pyarrow as pa  # noqa: E402
from batch_contract.engine_config import WorkerSettings  # noqa: E402
from batch_contract.enums import DeadLetterReason  # noqa: E402
from batch_contract.llm_config import LLMConfig  # noqa: E402
from batch_worker.engines.base import ChunkRows, check_chunk_output  # noqa: E402
from batch_worker.engines.llm import LLMEngine  # noqa: E402
from batch_worker.prompting import row_context  # noqa: E402
from llm_helpers import llm_engine_dict  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.llm]

SCHEMA = {
    "type": "object",
    "properties": {"section": {"enum": ["admin", "devel", "libs", "net", "utils"]}, "keep": {"type": "boolean"}},
    "required": ["section", "keep"],
    "additionalProperties": False,
}


def chunk(records: list[dict]) -> ChunkRows:
    """ChunkRows of ``records`` (dicts with at least ``id`` and ``text``), ids as strings."""
    table = pa.Table.from_pylist([{**r, "id": str(r["id"])} for r in records])
    ids = table.column("id").to_pylist()
    return ChunkRows(ids=ids, texts=table.column("text").to_pylist(), text_repaired=[False] * len(ids),
                     source_uri=["mem"] * len(ids), source_row=list(range(len(ids))), fields=table)


def make_engine(tiny_model, **overrides) -> LLMEngine:
    engine = LLMEngine(LLMConfig.from_dict(llm_engine_dict(tiny_model, **overrides)), WorkerSettings())
    engine.load()
    return engine


@pytest.fixture(scope="module")
def free_text_engine(tiny_model):
    """Free-text engine; the template returns nothing without a section and fails on a null count."""
    engine = make_engine(
        tiny_model,
        user_template="{% if section %}[{{ section }}] {{ text }}{% if count is defined %} #{{ count + 1 }}"
                      "{% endif %}{% endif %}",
    )
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def records(sample_rows) -> list[dict]:
    """100 sample rows with deliberately mixed prompt lengths, shuffled (seeded)."""
    rows = sample_rows.slice(0, 100).to_pylist()
    rng = random.Random(7)
    for r in rows:
        r["text"] = (r["text"] + " ") * rng.choice([1, 1, 2, 3])
        r["text"] = r["text"][: rng.choice([40, 200, 600, 900])]
    rng.shuffle(rows)
    return rows


def metric_totals(engine: LLMEngine) -> dict[str, int]:
    names = ("vllm:prompt_tokens", "vllm:generation_tokens", "vllm:prompt_tokens_cached")
    return {m.name: int(m.value) for m in engine.llm.get_metrics() if m.name in names}


def test_outputs_join_by_id_with_mixed_prompt_lengths(free_text_engine, records):
    rows = chunk(records)
    prepared = free_text_engine.prepare(rows)
    out = free_text_engine.process(prepared, lambda: False)
    assert check_chunk_output(rows, out) == set() and not out.interrupted and out.rejects == []
    expected = {rid: len(ids) for rid, ids in zip(prepared.ids, prepared.prompt_ids, strict=True)}
    assert len(set(expected.values())) > 20  # lengths really are mixed
    got = {r["id"]: r for r in out.table.to_pylist()}
    assert set(got) == set(expected)
    renderer = free_text_engine.renderer
    by_id = {str(r["id"]): r for r in records}
    for rid, row in got.items():
        # The engine's own prompt length for this request id equals this row's independently
        # rendered prompt: a positional join would mismatch rows of different lengths.
        rec = by_id[rid]
        ids = renderer.render_ids(renderer.parts(row_context(rec, rid, rec["text"])))
        assert row["prompt_tokens"] == row["n_tokens"] == expected[rid] == len(ids)
        assert row["finish_reason"] in {"stop", "length"}
        assert 1 <= row["output_tokens"] <= 8 and row["output_json"] is None


def test_too_long_empty_and_template_errors_do_not_fail_the_chunk(free_text_engine, records):
    good = [dict(r) for r in records[:10]]
    long_row = {**records[10], "text": "word " * 1200}
    empty_row = {**records[11], "section": ""}
    for r in good + [long_row, empty_row]:
        r["count"] = 1
    bad_template = {**records[12], "count": None}
    rows = chunk(good + [long_row, empty_row, bad_template])
    out = free_text_engine.process(free_text_engine.prepare(rows), lambda: False)
    check_chunk_output(rows, out)
    reasons = {r.id: r.reason for r in out.rejects}
    assert reasons == {
        str(long_row["id"]): DeadLetterReason.TOO_LONG,
        str(empty_row["id"]): DeadLetterReason.EMPTY_PROMPT,
        str(bad_template["id"]): DeadLetterReason.TEMPLATE_ERROR,
    }
    too_long = next(r for r in out.rejects if r.reason == DeadLetterReason.TOO_LONG)
    assert "max_model_len - max_tokens = 1024 - 8 = 1016" in too_long.detail
    assert sorted(out.table.column("id").to_pylist()) == sorted(str(r["id"]) for r in good)


def test_token_and_cache_accounting_equal_what_the_engine_reported(free_text_engine, records):
    rows = chunk(records[:60])
    before = metric_totals(free_text_engine)
    out = free_text_engine.process(free_text_engine.prepare(rows), lambda: False)
    after = metric_totals(free_text_engine)
    table = out.table
    assert out.tokens.prompt == sum(table.column("prompt_tokens").to_pylist())
    assert out.tokens.cached == sum(table.column("cached_tokens").to_pylist())
    assert out.tokens.output == sum(table.column("output_tokens").to_pylist())
    assert out.tokens.prompt == after["vllm:prompt_tokens"] - before["vllm:prompt_tokens"]
    assert out.tokens.output == after["vllm:generation_tokens"] - before["vllm:generation_tokens"]
    assert out.tokens.cached == after["vllm:prompt_tokens_cached"] - before["vllm:prompt_tokens_cached"]
    # the ~300-token shared system prompt is served from the prefix cache for most rows
    prefix = free_text_engine.load().info["prefix_tokens"]
    assert prefix >= 256
    assert out.tokens.cached >= 256 * (len(rows) // 2)


def test_interruption_aborts_unfinished_requests_and_engine_stays_usable(free_text_engine, records):
    rows = chunk(records[:60])
    core = free_text_engine.llm.llm_engine
    # SIGTERM arrives as soon as the first request finished (prefill of 60 prompts spans several steps)
    out = free_text_engine.process(free_text_engine.prepare(rows),
                                   lambda: core.get_num_unfinished_requests() < len(rows))
    missing = check_chunk_output(rows, out)
    assert out.interrupted and 0 < len(missing) < len(rows)
    assert not free_text_engine.llm.llm_engine.has_unfinished_requests()
    again = free_text_engine.process(free_text_engine.prepare(rows.take(list(range(10)))), lambda: False)
    assert again.table.num_rows == 10 and not again.interrupted


def test_structured_output_constrained_is_valid_json(tiny_model, records):
    engine = make_engine(tiny_model, json_schema=SCHEMA, max_tokens=40)
    try:
        rows = chunk(records[:30])
        out = engine.process(engine.prepare(rows), lambda: False)
    finally:
        engine.close()
    check_chunk_output(rows, out)
    assert out.rejects == [] and out.table.num_rows == 30
    for row in out.table.to_pylist():
        value = json.loads(row["output_json"])
        jsonschema.validate(value, SCHEMA)
        assert json.loads(row["output_text"]) == value and row["finish_reason"] == "stop"


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"constrain_output": False, "max_tokens": 24}, "not JSON"),  # gibberish model, unconstrained
        ({"max_tokens": 4}, "generation hit max_tokens"),  # constrained but cut off
    ],
)
def test_schema_invalid_outputs_are_dead_lettered_with_the_reason(tiny_model, records, overrides, expected):
    engine = make_engine(tiny_model, json_schema=SCHEMA, **overrides)
    try:
        rows = chunk(records[:12])
        out = engine.process(engine.prepare(rows), lambda: False)
    finally:
        engine.close()
    check_chunk_output(rows, out)
    assert out.table.num_rows == 0 and len(out.rejects) == 12
    assert {r.reason for r in out.rejects} == {DeadLetterReason.INVALID_OUTPUT}
    assert all(expected in r.detail for r in out.rejects)
    assert out.tokens.output > 0  # tokens spent on rejected outputs still count in the totals
