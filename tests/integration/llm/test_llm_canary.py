"""The pre-flight canary on the LLM engine (real vLLM on CPU, the tiny random Llama): the search over
vLLM's ``max_num_seqs`` / ``max_num_batched_tokens`` lowers the live scheduler's limits (no engine
re-created), the choice goes into ``canary.json`` and the tuning profile, a shard starts its engine with
it (``tuned_by: canary``), a second run reuses the profile, and the JSON-valid rate is recorded.

Three vLLM starts in all: the first run's canary, its shard (a worker subprocess), the second run's canary.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from batch_contract import storage  # noqa: E402
from batch_contract.canary import TuningProfile  # noqa: E402
from batch_contract.layout import RunLayout  # noqa: E402
from batch_contract.runstore import RunStore  # noqa: E402
from batch_worker.autotune import CLEAR_GAIN, llm_batched_tokens  # noqa: E402
from batch_worker.canary import Canary, CanaryOptions, run_canary  # noqa: E402
from llm_helpers import REPO, llm_engine_dict, write_llm_run  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.llm]

SCHEMA = {
    "type": "object",
    "properties": {"section": {"enum": ["admin", "devel", "libs", "net", "utils"]}, "keep": {"type": "boolean"}},
    "required": ["section", "keep"],
    "additionalProperties": False,
}
TEMPLATE = "{% if section %}Package {{ id }} ({{ section }}): {{ text }}{% endif %}"
SHARD = "00000"
CANDIDATES = (4, 8)
OPTIONS = CanaryOptions(min_rows=40, max_rows=40, fraction=0.01, strategy="candidates", candidates=CANDIDATES,
                        warmup_rows=8)


def _input(sample_rows: pa.Table, n: int) -> pa.Table:
    """Two rows rejected before generation (empty prompt, too long) first, so the canary's shard prefix
    holds them, then ``n`` sample rows."""
    rows = [{"id": "aa-no-section", "section": "", "text": "a package with no section"},
            {"id": "aa-too-long", "section": "utils", "text": "word " * 1200}]
    rows += [{**r, "text": r["text"][:600]} for r in sample_rows.slice(0, n).to_pylist()]
    return pa.Table.from_pylist(rows, schema=sample_rows.schema)


def _engine(model: Path, **overrides) -> dict:
    # max_num_seqs / max_num_batched_tokens unset: the run leaves them to the canary
    return llm_engine_dict(model, **{"max_num_seqs": None, "user_template": TEMPLATE, "json_schema": SCHEMA,
                                     "max_tokens": 40, **overrides})


def _dead_letters(run_dir: str) -> list[dict]:
    files = sorted(Path(RunLayout.from_run_dir(run_dir).shard_dir(SHARD)).glob("dead-letter-*.parquet"))
    return [r for f in files for r in pq.read_table(f).to_pylist()]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory, tiny_model, sample_rows):
    """Run 1's canary (kept open long enough to read its scheduler), then its shard in a worker process."""
    root = tmp_path_factory.mktemp("llm-canary")
    run_dir = write_llm_run(root, _input(sample_rows, 58), _engine(tiny_model), worker={"chunk_rows": 16})
    store = RunStore.open(run_dir)
    canary = Canary(store, OPTIONS)
    try:
        result = canary.run()
        scheduler = canary.engine.llm.llm_engine.engine_core.engine_core.scheduler
        live = {"started_max_num_seqs": scheduler.scheduler_config.max_num_seqs,
                "started_max_num_batched_tokens": scheduler.scheduler_config.max_num_batched_tokens,
                "admitted": scheduler.max_num_active_reqs, "scheduled_tokens": scheduler.max_num_scheduled_tokens}
    finally:
        canary.engine.close()
    storage.write_create_only(store.layout.canary_uri, result.to_json_bytes())  # what run_canary writes
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "plugins"), str(REPO / "worker_image")]))
    proc = subprocess.run([sys.executable, "-m", "batch_worker", "run", "--run-dir", run_dir, "--shard", SHARD,
                           "--log-level", "WARNING"], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"root": root, "run_dir": run_dir, "result": result, "live": live}


def test_canary_searches_max_num_seqs_by_lowering_the_live_scheduler(first_run):
    result, live = first_run["result"], first_run["live"]
    assert result.engine_kind == "llm" and result.strategy == "candidates" and result.device == "cpu"
    warmup, *searched, rest = result.trials  # warm-up at the largest candidate, one trial each, the rest
    assert warmup.warmup and warmup.max_batch_rows == max(CANDIDATES) and warmup.rows == 8
    assert [t.max_batch_rows for t in searched] == list(CANDIDATES)
    assert [t.token_budget for t in searched] == [llm_batched_tokens(s) for s in CANDIDATES]
    assert [t.rows for t in searched] == [2 * s for s in CANDIDATES]  # LLM_SLICE_SEQS x max_num_seqs rows
    assert all(t.output_tokens > 0 and t.output_tokens_per_s > 0 for t in searched)
    # one trial each (40 rows leave no room for repeats): the smallest candidate holds unless a larger one
    # is CLEAR_GAIN faster on that one trial (batch_worker.autotune's confident-beat rule)
    rate = {t.max_batch_rows: t.output_tokens_per_s for t in searched}
    seqs = min(CANDIDATES)
    for value in sorted(CANDIDATES):
        if value > seqs and rate[value] >= (1 + CLEAR_GAIN) * rate[seqs]:
            seqs = value
    assert rest.max_batch_rows == seqs and rest.rows == 40 - 8 - 8 - 16
    assert result.chosen == {"token_budget": llm_batched_tokens(seqs), "max_batch_rows": seqs,
                             "max_num_seqs": seqs, "max_num_batched_tokens": llm_batched_tokens(seqs)}
    # started once with the largest candidate; the choice was set on the live scheduler, nothing re-created
    assert live == {"started_max_num_seqs": max(CANDIDATES), "started_max_num_batched_tokens": llm_batched_tokens(8),
                    "admitted": seqs, "scheduled_tokens": llm_batched_tokens(seqs)}
    assert result.llm["engine_restarts"] == 0 and result.sample_rows == 40
    profile = TuningProfile.from_json_bytes(storage.read_bytes(result.profile_uri))
    assert profile.engine_kind == "llm" and profile.chosen == result.chosen and profile.strategy == "candidates"


def test_json_valid_rate_counts_generated_rows_only(first_run):
    result, run_dir = first_run["result"], first_run["run_dir"]
    llm = result.llm
    # constrained decoding with room for the whole object: every generated output is valid JSON; the two
    # rows rejected before generation (empty prompt, too long) are in neither count
    dead = {r["id"]: r["reason"] for r in _dead_letters(run_dir)}
    assert dead == {"aa-no-section": "empty_prompt", "aa-too-long": "too_long"}
    assert llm["json_valid_rows"] == 38 and llm["json_invalid_rows"] == 0 and llm["json_valid_rate"] == 1.0
    assert 0 < llm["output_tokens_p50"] <= llm["output_tokens_max"] <= 40


def test_shard_starts_its_engine_with_the_canary_choice(first_run):
    result, run_dir = first_run["result"], first_run["run_dir"]
    store = RunStore.open(run_dir)
    marker = store.marker(SHARD)
    assert marker.engine["tuned_by"] == "canary"
    assert marker.engine["max_num_seqs"] == result.chosen["max_num_seqs"]
    assert marker.engine["max_num_batched_tokens"] == result.chosen["max_num_batched_tokens"]
    assert marker.rows_ok + marker.rows_dead_letter == 60
    assert sum(a["rows_committed"] for a in marker.attempts) == 60 - 40, "the canary's rows are not redone"


def test_second_run_reuses_the_profile_and_measures_invalid_json(first_run, tiny_model, sample_rows):
    # same model on the same device, another config: unconstrained gibberish is never valid JSON
    run_dir = write_llm_run(first_run["root"], _input(sample_rows, 58),
                            _engine(tiny_model, constrain_output=False, max_tokens=24), run_id="llm_run_2")
    result = run_canary(run_dir, OPTIONS)
    assert result.strategy == "profile" and result.profile_reused
    assert result.chosen == first_run["result"].chosen
    assert [t for t in result.trials if not t.warmup and t.max_batch_rows != result.chosen["max_num_seqs"]] == []
    assert result.llm["json_valid_rows"] == 0 and result.llm["json_invalid_rows"] == 38
    assert result.llm["json_valid_rate"] == 0.0
    invalid = [r for r in _dead_letters(run_dir) if r["reason"] == "invalid_output"]
    assert len(invalid) == 38 and all("not JSON" in r["detail"] for r in invalid)
    assert json.loads(storage.read_bytes(RunLayout.from_run_dir(run_dir).canary_uri))["llm"]["json_valid_rate"] == 0.0


def test_apply_tuning_recreates_the_engine_only_to_raise_its_limits(tiny_model, sample_rows):
    """Before the load the settings are engine arguments; above what the engine started with it is
    re-created (the GPU path, where the engine core is another process, always takes this one); at or
    below, the in-process scheduler's limits change in place."""
    from batch_contract.engine_config import WorkerSettings
    from batch_contract.llm_config import LLMConfig
    from batch_worker.engines.base import ChunkRows
    from batch_worker.engines.llm import LLMEngine

    engine = LLMEngine(LLMConfig.from_dict(_engine(tiny_model, json_schema=None, max_tokens=4)), WorkerSettings())
    assert engine.tunable() and engine.planned_device() == "cpu"
    try:
        assert engine.apply_tuning(4096, 4) == {"max_num_seqs": 4, "max_num_batched_tokens": 4096}
        info = engine.load().info
        scheduler = engine.llm.llm_engine.engine_core.engine_core.scheduler
        assert (info["max_num_seqs"], scheduler.scheduler_config.max_num_seqs) == (4, 4)
        engine.apply_tuning(llm_batched_tokens(16), 16)  # above the start: a new engine
        scheduler = engine.llm.llm_engine.engine_core.engine_core.scheduler
        assert engine.restarts == 1 and engine.restart_seconds > 0
        assert scheduler.scheduler_config.max_num_seqs == 16 and engine._loaded.info["max_num_seqs"] == 16
        engine.apply_tuning(4096, 8)  # below: in place
        assert engine.restarts == 1 and scheduler.max_num_active_reqs == 8
        assert engine._loaded.info["max_num_seqs"] == 8 and scheduler.scheduler_config.max_num_seqs == 16
        records = sample_rows.slice(0, 12)
        ids = records.column("id").to_pylist()
        rows = ChunkRows(ids=ids, texts=records.column("text").to_pylist(), text_repaired=[False] * 12,
                         source_uri=["mem"] * 12, source_row=list(range(12)), fields=records)
        out = engine.process(engine.prepare(rows), lambda: False)
        assert out.table.num_rows == 12 and not out.rejects
    finally:
        engine.close()
