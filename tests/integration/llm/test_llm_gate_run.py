"""``batch-worker quality-gate`` on real vLLM (CPU): same config agrees with itself; a changed config
(bf16 vs float32 weights of the tiny model) is measured and reported; structured JSON per field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from batch_contract.layout import RunLayout  # noqa: E402
from batch_worker.cli import main  # noqa: E402
from llm_helpers import llm_engine_dict, write_llm_run  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.llm]

SCHEMA = {
    "type": "object",
    "properties": {"section": {"enum": ["admin", "devel", "libs", "net", "utils"]}, "keep": {"type": "boolean"}},
    "required": ["section", "keep"],
    "additionalProperties": False,
}


def test_quality_gate_report(tmp_path, tiny_model, sample_rows):
    table = sample_rows.slice(0, 60)
    engine = llm_engine_dict(tiny_model, json_schema=SCHEMA, max_tokens=40,
                             user_template="{{ text | truncate(600, true, '', 0) }}")
    run_dir = write_llm_run(tmp_path, table, engine)
    uri = RunLayout.from_run_dir(run_dir).quality_report_uri

    assert main(["quality-gate", "--run-dir", run_dir, "--candidate-engine", "{}", "--sample", "24",
                 "--enforce", "--log-level", "WARNING"]) == 0
    same = json.loads(Path(uri).read_text())
    assert same["rows"] == same["rows_both_valid"] == 24 and same["output_kind"] == "json"
    assert same["exact_match_rate"] == same["agreement"] == 1.0 and same["passed"]
    assert set(same["field_agreement"]) == {"section", "keep"}

    rc = main(["quality-gate", "--run-dir", run_dir, "--candidate-engine", '{"dtype": "bfloat16", "seed": 1}',
               "--sample", "24", "--log-level", "WARNING"])
    changed = json.loads(Path(uri).read_text())
    assert rc == 0 and changed["candidate_overrides"] == {"dtype": "bfloat16", "seed": 1}
    assert changed["candidate_engine"]["dtype"] == "bfloat16" and changed["baseline_engine"]["dtype"] == "float32"
    assert 0.0 <= changed["agreement"] <= 1.0 and changed["candidate_valid_rate"] == 1.0

    assert main(["quality-gate", "--run-dir", run_dir, "--candidate-engine", '{"quantization": "int3"}',
                 "--log-level", "WARNING"]) == 2
