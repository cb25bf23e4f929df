"""The pre-flight canary with the real MiniLM: rows committed once, the out-of-memory edge of the search
(simulated on CPU), tuning-profile reuse, and the shards batching with the chosen budget."""

from __future__ import annotations

import collections
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from batch_contract.layout import PART_PREFIX, RunLayout
from batch_contract.runstore import RunStore
from batch_inference.planner import PlanRequest, plan
from batch_worker.canary import CanaryOptions, run_canary
from batch_worker.engines.encoder import SIMULATE_OOM_ENV
from batch_worker.runtime import run_shard

pytestmark = pytest.mark.integration

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample" / "debian_descriptions_sample.parquet"


def _plan(root: Path, run_id: str, rows: int = 240, reuse: str = "off", **engine) -> str:
    plan(PlanRequest(input_uri=str(SAMPLE), id_column="id", text_column="text", output_root=str(root), run_id=run_id,
                     engine={"kind": "encoder", **engine}, worker={"reuse": reuse, "min_chunk_rows": 64}, rows_per_shard=rows // 2,
                     shard_by="rows", row_limit=rows))
    return RunLayout(str(root), run_id).run_dir


def _part_ids(run_dir: str) -> collections.Counter:
    ids: collections.Counter = collections.Counter()
    for part in Path(run_dir, "shards").glob(f"*/{PART_PREFIX}*.parquet"):
        ids.update(pq.read_table(part, columns=["id"]).column("id").to_pylist())
    return ids


def test_canary_rows_count_towards_the_run_and_are_never_computed_twice(tmp_path: Path) -> None:
    run_dir = _plan(tmp_path / "out", "r1")
    canary = run_canary(run_dir, CanaryOptions(min_rows=80, strategy="candidates"))
    assert canary.sample_rows == 80 and canary.shard_rows == {"00000": 40, "00001": 40}
    assert canary.strategy == "candidates" and canary.chosen["token_budget"] in {2048, 4096, 8192, 16384}
    assert canary.steady_tokens_per_s > 0 and canary.worker_seconds_per_token > 0 and canary.model_load_seconds > 0
    assert 0 < canary.padding_efficiency <= 1 and canary.peak_rss_bytes > 0
    assert RunStore.open(run_dir).canary() == canary
    assert sum(_part_ids(run_dir).values()) == 80
    assert run_canary(run_dir) == canary, "a rerun reads canary.json back and computes nothing"
    assert sum(_part_ids(run_dir).values()) == 80
    store = RunStore.open(run_dir)
    for shard in ("00000", "00001"):
        assert run_shard(run_dir, shard, install_signals=False) == 0
        marker = store.marker(shard)
        assert marker.rows_ok == 120 and marker.engine["token_budget"] == canary.chosen["token_budget"]
        assert marker.engine["tuned_by"] == "canary"
        assert 0 < marker.tokens_real <= marker.tokens_padded  # padding efficiency <= 1 beside canary parts
        computed = sum(a["rows_committed"] for a in marker.attempts)
        assert computed == 120 - 40, "the shard computed only the rows the canary did not"
    ids = _part_ids(run_dir)
    assert len(ids) == 240 and set(ids.values()) == {1}, "every id exactly once"


def test_grow_search_meets_simulated_out_of_memory_backs_off_and_the_profile_skips_it_next_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SIMULATE_OOM_ENV, "1500")  # a batch over 1,500 padded tokens raises OutOfMemoryError
    root = tmp_path / "out"
    # rows truncated to 32 tokens fill batches exactly: budget B batches B / 32 rows of 32 tokens, so the
    # 2,048-token trial is the first whose batches pass the 1,500-token cap
    run_dir = _plan(root, "r1", rows=400, max_length=32)
    options = CanaryOptions(min_rows=200, strategy="grow", grow_start=256, min_gain=-1.0)  # grow until OOM
    first = run_canary(run_dir, options)
    search = [t for t in first.trials if not t.warmup][:4]
    assert [t.token_budget for t in search] == [256, 512, 1024, 2048]
    assert [t.oom for t in search] == [False, False, False, True], "the OOM is a data point, not a failure"
    assert first.chosen["token_budget"] == 1024, "one step back from the budget that ran out of memory"
    assert first.strategy == "grow" and not first.profile_reused and Path(first.profile_uri).is_file()
    assert sum(_part_ids(run_dir).values()) == first.sample_rows == 200, "the OOM trial's rows were committed too"

    second = run_canary(_plan(root, "r2", rows=400, max_length=32), options)
    assert second.profile_reused and second.strategy == "profile" and second.profile_uri == first.profile_uri
    assert second.chosen == first.chosen and second.autotune_seconds == 0.0
    assert {t.token_budget for t in second.trials} == {1024}, "no search: only the profile's budget ran"
