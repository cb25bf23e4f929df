"""The LLM worker's outputs against an independent reference: a direct greedy ``vllm.LLM.generate``.

The real worker (``python -m batch_worker run``, several chunks) runs a few dozen sample rows, once with
free text and once with a JSON schema (structured output), at temperature 0. Then, in this test process
and without the project's prompting code, each prompt is rendered again: the user template with plain
``jinja2`` (it is the user's own template; the worker renders it in its sandbox), the messages through
the model's chat template with ``transformers.AutoTokenizer.apply_chat_template``. Those prompt strings go
through one plain ``vllm.LLM(...).generate`` call per mode with ``SamplingParams(temperature=0,
max_tokens=...)`` (plus ``StructuredOutputsParams(json=schema)`` for the schema mode) and every row's text
must be equal, byte for byte, per row id; so must its prompt and output token counts and finish reason.

The reference engine is configured only with what the product documents as its engine settings (the
model, ``dtype``, ``max_model_len``, and for structured output xgrammar with compact JSON,
``disable_any_whitespace``: docs/llm.md); its batch sizes, prefix caching and request order are vLLM's
defaults, so batch composition (the worker's chunks of 12, longest prompt first) must not change a greedy
output either. The worker's engines live in its subprocesses, gone before the reference engine starts.

``test_comparison_reports_an_altered_output`` checks the comparison itself, and
``test_manifest_keeps_the_json_schema_property_order`` the one input of structured output the worker
reads from the manifest (both pure Python, no vLLM).
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jinja2
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from batch_contract.layout import RunLayout
from llm_helpers import PREFIX, REPO, llm_engine_dict, write_llm_run

SHARD = "00000"
N_ROWS = 36
CHUNK_ROWS = 12
TEMPLATE = "Package {{ id }} ({{ section }}): {{ text | truncate(700) }}"
FREE_MAX_TOKENS = 24
JSON_MAX_TOKENS = 64
SCHEMA = {
    "type": "object",
    "properties": {"section": {"enum": ["admin", "devel", "libs", "net", "utils"]}, "keep": {"type": "boolean"}},
    "required": ["section", "keep"],
    "additionalProperties": False,
}
FEW_SHOT = [{"user": "Package demo (utils): a small command line tool", "assistant": '{"section":"utils","keep":true}'}]
COMPARED = ("output_text", "finish_reason", "output_tokens", "prompt_tokens")
"""Per-row fields compared with the reference (the text first: the issue's requirement)."""


# -- the comparison (pure Python) ----------------------------------------------------------------------

def output_mismatches(worker: Mapping[str, Mapping[str, Any]], reference: Mapping[str, Mapping[str, Any]],
                      fields: tuple[str, ...] = COMPARED) -> list[str]:
    """Every difference between the worker's rows and the reference's, by row id (``[]``: identical).

    Args:
        worker: ``{row id: {field: value}}`` from the worker's part files.
        reference: ``{row id: {field: value}}`` from the direct ``generate``.
        fields: the fields compared exactly (``==``, no normalisation) for each id present in both.
    """
    problems = [f"{rid}: missing from the worker's output" for rid in sorted(set(reference) - set(worker))]
    problems += [f"{rid}: in the worker's output but not in the reference" for rid in sorted(set(worker) - set(reference))]
    for rid in sorted(set(worker) & set(reference)):
        for name in fields:
            got, want = worker[rid].get(name), reference[rid].get(name)
            if got != want or type(got) is not type(want):
                problems.append(f"{rid}: {name} worker={got!r} reference={want!r}")
    return problems


def assert_outputs_equal(worker: Mapping[str, Mapping[str, Any]], reference: Mapping[str, Mapping[str, Any]],
                         fields: tuple[str, ...] = COMPARED) -> None:
    """Raise ``AssertionError`` listing every row where the worker differs from the reference."""
    problems = output_mismatches(worker, reference, fields)
    assert not problems, f"{len(problems)} difference(s) from greedy vllm.LLM.generate:\n" + "\n".join(problems)


def test_comparison_reports_an_altered_output():
    reference = {f"r{i}": {"output_text": f"text {i}", "finish_reason": "length", "output_tokens": 8,
                           "prompt_tokens": 300 + i} for i in range(5)}
    worker = {rid: dict(row) for rid, row in reference.items()}
    assert_outputs_equal(worker, reference)

    worker["r3"]["output_text"] += " "  # one character more in one row
    assert output_mismatches(worker, reference) == ["r3: output_text worker='text 3 ' reference='text 3'"]
    with pytest.raises(AssertionError, match="r3: output_text"):
        assert_outputs_equal(worker, reference)

    worker = {rid: dict(row) for rid, row in reference.items()}
    worker["r1"]["output_text"] = "text 2"  # two rows' texts swapped: a join by position
    worker["r2"]["output_text"] = "text 1"
    assert [p.split(":")[0] for p in output_mismatches(worker, reference)] == ["r1", "r2"]

    worker = {rid: dict(row) for rid, row in reference.items() if rid != "r4"}  # a row lost
    worker["r0"]["output_tokens"] = 8.0  # equal as a number, but not the same type
    assert output_mismatches(worker, reference) == [
        "r4: missing from the worker's output", "r0: output_tokens worker=8.0 reference=8"]


def test_manifest_keeps_the_json_schema_property_order(tmp_path, tiny_model):
    """The worker's schema is the manifest's: its property order is the order xgrammar makes the model
    write the keys in (``{"section":...,"keep":...}`` here), so the manifest must not reorder it."""
    from batch_contract.manifest import Manifest

    run_dir = write_llm_run(tmp_path, pa.table({"id": ["a"], "text": ["x"]}),
                            llm_engine_dict(tiny_model, json_schema=SCHEMA, max_tokens=JSON_MAX_TOKENS))
    manifest = Manifest.from_json_bytes(Path(RunLayout.from_run_dir(run_dir).manifest_uri).read_bytes())
    engine = manifest.engine if isinstance(manifest.engine, dict) else vars(manifest.engine)
    assert list(engine["json_schema"]["properties"]) == list(SCHEMA["properties"]) == ["section", "keep"]


# -- the worker -----------------------------------------------------------------------------------------

def input_table(sample_rows: pa.Table) -> pa.Table:
    """``N_ROWS`` sample rows with mixed prompt lengths (every prompt fits the context)."""
    rows = sample_rows.slice(0, N_ROWS).to_pylist()
    for i, r in enumerate(rows):
        r["text"] = ((r["text"] + " ") * 3)[: (60, 250, 700)[i % 3]]
    return pa.Table.from_pylist(rows, schema=sample_rows.schema)


def run_worker(run_dir: str) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "plugins"), str(REPO / "worker_image")])
    cmd = [sys.executable, "-m", "batch_worker", "run", "--run-dir", run_dir, "--shard", SHARD, "--log-level", "WARNING"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]


def worker_rows(run_dir: str) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """``({row id: part-file row}, dead letters)`` of the run's one shard."""
    shard = Path(RunLayout.from_run_dir(run_dir).shard_dir(SHARD))
    parts = [pq.read_table(f) for f in sorted(shard.glob("part-*.parquet"))]
    dead = [r for f in sorted(shard.glob("dead-letter-*.parquet")) for r in pq.read_table(f).to_pylist()]
    rows = {r["id"]: r for t in parts for r in t.to_pylist()}
    assert len(rows) == sum(t.num_rows for t in parts), "an id was committed twice"
    return rows, dead


@pytest.fixture(scope="module")
def vllm_module():
    """``vllm``, or a skip (from ``.venv``; under ``make test-llm`` the conftest has required it)."""
    return pytest.importorskip("vllm")


@pytest.fixture(scope="module")
def inputs(sample_rows) -> pa.Table:
    return input_table(sample_rows)


@pytest.fixture(scope="module")
def free_text_run(vllm_module, tmp_path_factory, tiny_model, inputs) -> str:
    engine = llm_engine_dict(tiny_model, user_template=TEMPLATE, max_tokens=FREE_MAX_TOKENS, temperature=0.0)
    run_dir = write_llm_run(tmp_path_factory.mktemp("llm-ref-free"), inputs, engine, worker={"chunk_rows": CHUNK_ROWS})
    run_worker(run_dir)
    return run_dir


@pytest.fixture(scope="module")
def json_run(vllm_module, tmp_path_factory, tiny_model, inputs) -> str:
    engine = llm_engine_dict(tiny_model, user_template=TEMPLATE, max_tokens=JSON_MAX_TOKENS, temperature=0.0,
                             json_schema=SCHEMA, few_shot=FEW_SHOT)
    run_dir = write_llm_run(tmp_path_factory.mktemp("llm-ref-json"), inputs, engine, worker={"chunk_rows": CHUNK_ROWS})
    run_worker(run_dir)
    return run_dir


# -- the reference ----------------------------------------------------------------------------------------

def reference_prompts(model: Path, table: pa.Table, few_shot: list[dict[str, str]]) -> dict[str, str]:
    """``{row id: prompt string}``: the user template in plain jinja2 (strict undefined, like the worker's
    documented contract), then the model's own chat template through ``transformers``."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model))
    template = jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(TEMPLATE)
    prompts = {}
    for row in table.to_pylist():
        messages = [{"role": "system", "content": PREFIX}]
        for example in few_shot:
            messages += [{"role": "user", "content": example["user"]},
                         {"role": "assistant", "content": example["assistant"]}]
        messages.append({"role": "user", "content": template.render(**row)})
        prompts[row["id"]] = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return prompts


def reference_rows(outputs: list[Any], ids: list[str]) -> dict[str, dict[str, Any]]:
    """``{row id: fields}`` from ``LLM.generate``'s outputs (in prompt order, as ``generate`` returns them)."""
    assert len(outputs) == len(ids)
    rows = {}
    for rid, out in zip(ids, outputs, strict=True):
        comp = out.outputs[0]
        rows[rid] = {"output_text": comp.text, "finish_reason": str(comp.finish_reason),
                     "output_tokens": len(comp.token_ids), "prompt_tokens": len(out.prompt_token_ids)}
    return rows


@pytest.fixture(scope="module")
def reference(free_text_run, json_run, vllm_module, tiny_model, inputs) -> dict[str, dict[str, dict[str, Any]]]:
    """Both modes through one directly built ``vllm.LLM`` (started after both worker runs finished)."""
    vllm = vllm_module
    from vllm.sampling_params import StructuredOutputsParams

    llm = vllm.LLM(model=str(tiny_model), dtype="float32", max_model_len=1024, enforce_eager=True,
                   structured_outputs_config={"backend": "xgrammar", "disable_any_whitespace": True})
    try:
        result = {}
        for mode, few_shot, params in (
            ("free", [], vllm.SamplingParams(temperature=0, max_tokens=FREE_MAX_TOKENS)),
            ("json", FEW_SHOT, vllm.SamplingParams(temperature=0, max_tokens=JSON_MAX_TOKENS,
                                                   structured_outputs=StructuredOutputsParams(json=SCHEMA))),
        ):
            prompts = reference_prompts(tiny_model, inputs, few_shot)
            ids = list(prompts)
            outputs = llm.generate([prompts[i] for i in ids], params, use_tqdm=False)
            result[mode] = reference_rows(outputs, ids)
        return result
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()


@pytest.mark.integration
@pytest.mark.llm
def test_free_text_outputs_equal_greedy_generate(free_text_run, reference):
    rows, dead = worker_rows(free_text_run)
    assert dead == [], f"dead letters: {dead}"
    assert len(rows) == N_ROWS
    assert_outputs_equal(rows, reference["free"])
    assert all(r["output_json"] is None for r in rows.values())


@pytest.mark.integration
@pytest.mark.llm
def test_structured_outputs_equal_greedy_generate(json_run, reference):
    import jsonschema

    rows, dead = worker_rows(json_run)
    problems = output_mismatches(rows, reference["json"])
    problems += [f"{d['id']}: dead letter {d['reason']}: {d.get('detail')}" for d in dead]
    assert not problems, f"{len(problems)} difference(s) from greedy vllm.LLM.generate:\n" + "\n".join(problems)
    for rid, ref in reference["json"].items():
        value = json.loads(ref["output_text"])
        jsonschema.validate(value, SCHEMA)
        assert rows[rid]["output_json"] == json.dumps(value, sort_keys=True, separators=(",", ":")), rid
