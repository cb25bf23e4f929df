"""The prefix-aware plan end to end on real vLLM (CPU, the tiny random Llama): documents x questions, shuffled,
planned token-balanced and prefix-aware (planner.plan), every shard run by a worker process (a fresh
engine per shard, as the local runner runs them). Each id ends exactly once, both plans give the same outputs, vLLM's own cached-token
counters in the markers show the higher hit rate of the prefix plan and meet the planner's model, and the
canary on the prefix plan measures prefill and decode apart and projects by prompt and output tokens.

Five vLLM starts: two shards per plan and the canary.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("vllm")

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from batch_contract import storage  # noqa: E402
from batch_contract.layout import PART_PREFIX, RunLayout  # noqa: E402
from batch_contract.marker import ShardMarker  # noqa: E402
from batch_inference.planner import PlanRequest, plan  # noqa: E402
from batch_inference.projection import llm_token_projection, shard_loads  # noqa: E402
from batch_worker.canary import CanaryOptions, run_canary  # noqa: E402
from llm_helpers import REPO  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.llm]

DOCS, QUESTIONS = 6, 3


def _input(path: Path) -> list[dict]:
    rng = random.Random(7)
    texts = [t for t in pq.read_table(REPO / "data" / "sample" / "debian_descriptions_sample.parquet")
             .column("text").to_pylist() if t and len(t) > 200]
    rows = []
    for d in range(DOCS):
        doc = "\n".join(rng.choice(texts) for _ in range(3))
        rows += [{"id": f"doc{d}-q{q}", "doc": doc, "text": f"Question {q}: what is it for?"} for q in range(QUESTIONS)]
    rng.shuffle(rows)
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=5)
    return rows


def _plan(root: Path, input_path: Path, model: Path, prefix: bool):
    engine = {"kind": "llm", "model_path": str(model), "dtype": "float32", "max_model_len": 2048,
              "max_tokens": 6, "system_prompt": "Answer the question about the document.",
              "user_template": "Document:\n{{ doc }}\n\nQuestion: {{ text }}"}
    manifest, _ = plan(PlanRequest(input_uri=str(input_path), id_column="id", text_column="text",
                                   output_root=str(root), run_id="prefix-run", engine=engine,
                                   rows_per_shard=DOCS * QUESTIONS // 2, prefix_plan=prefix, prefix_block_tokens=128))
    return manifest, RunLayout(str(root), manifest.run_id).run_dir


def _run(run_dir: str, manifest) -> tuple[dict[str, str], int, int]:
    """Run every shard; ``({id: output_text}, prompt tokens, cached tokens)`` from parts and markers."""
    prompt = cached = 0
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "plugins"), str(REPO / "worker_image")]))
    for shard in manifest.shards:  # one worker process per shard, as the local runner runs them
        proc = subprocess.run([sys.executable, "-m", "batch_worker", "run", "--run-dir", run_dir, "--shard",
                               shard.shard_id, "--log-level", "WARNING"], env=env, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        marker = ShardMarker.from_json_bytes(storage.read_bytes(RunLayout.from_run_dir(run_dir).marker_uri(shard.shard_id)))
        prompt += marker.tokens_prompt
        cached += marker.tokens_cached
    ids, texts = [], []
    for part in sorted(Path(run_dir, "shards").glob(f"*/{PART_PREFIX}*.parquet")):
        table = pq.read_table(part, columns=["id", "output_text"])
        ids += table.column("id").to_pylist()
        texts += table.column("output_text").to_pylist()
    assert Counter(ids).most_common(1)[0][1] == 1, "an id was committed twice"
    return dict(zip(ids, texts, strict=True)), prompt, cached


def test_prefix_plan_end_to_end(tiny_model: Path, tmp_path: Path):
    rows = _input(tmp_path / "input.parquet")
    token_manifest, token_dir = _plan(tmp_path / "token", tmp_path / "input.parquet", tiny_model, False)
    prefix_manifest, prefix_dir = _plan(tmp_path / "prefix", tmp_path / "input.parquet", tiny_model, True)
    record = prefix_manifest.prefix_plan
    assert record["status"] == "planned" and record["groups"] == DOCS
    assert len(prefix_manifest.shards) == len(token_manifest.shards) == 2

    canary = run_canary(prefix_dir, CanaryOptions(min_rows=6, max_rows=6, warmup_rows=2, candidates=(64,),
                                                  use_profile=False))
    llm = canary.llm
    assert llm["seconds_per_output_token"] >= 0 and llm["seconds_per_uncached_prompt_token"] >= 0
    assert llm["seconds_per_engine_step"] >= 0 and sum(llm[k] for k in (
        "seconds_per_output_token", "seconds_per_uncached_prompt_token", "seconds_per_engine_step")) > 0
    calls = llm["engine_calls"]
    # every measured call stepped the engine and counted its steps
    assert len(calls["probes"]) == 2 and all(c["steps"] >= 1 for c in [calls["warmup"], *calls["trials"], *calls["probes"]])
    # each shard's sample on an engine of its own: the planner's cache model over the same prompts
    assert set(llm["shard_own_hit_rates"]) == set(canary.shard_rows)
    assert all(0.0 <= v < 1.0 for v in llm["shard_own_hit_rates"].values())
    assert llm["output_tokens_per_row"] > 0 and llm["prompt_tokens"] > llm["cached_tokens"] > 0
    inputs = shard_loads(canary, prefix_manifest)
    assert {s.hit_rate for s in inputs.loads} == set(record["shard_hit_rates"].values())
    assert llm_token_projection(inputs, canary)["output_tokens"] > 0

    token_out, token_prompt, token_cached = _run(token_dir, token_manifest)
    prefix_out, prefix_prompt, prefix_cached = _run(prefix_dir, prefix_manifest)
    assert set(token_out) == {r["id"] for r in rows}
    assert prefix_out == token_out  # same outputs whichever shard and order a row ran in
    assert prefix_prompt == token_prompt
    token_rate, prefix_rate = token_cached / token_prompt, prefix_cached / prefix_prompt
    assert prefix_rate > token_rate
    # vLLM's counters meet the planner's cache model (the canary's engine computed one group prefix more)
    assert prefix_rate >= 0.9 * record["ideal_hit_rate"]
    assert abs(token_rate - record["token_plan_hit_rate"]) < 0.05
