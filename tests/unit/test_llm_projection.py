"""The LLM canary's prefill/decode split (batch_worker.canary.LLMSpeed) and the projection by prompt and
output tokens at the expected prefix-cache hit rate (batch_inference.projection), and the report's
plan-versus-actual token figures."""

from __future__ import annotations

import pytest
from batch_contract.canary import CanaryResult
from batch_contract.manifest import InputFile, InputSpec, Manifest, Segment, ShardSpec
from batch_contract.tokens import TokenCounts
from batch_inference.pricing import CostParams
from batch_inference.projection import llm_rates, llm_token_projection, shard_hit_rate, shard_loads
from batch_inference.report.plan_vs_actual import projection_section
from batch_worker.canary import LLMSpeed
from hypothesis import given
from hypothesis import strategies as st


@given(st.floats(1e-6, 1e-3), st.floats(1e-4, 1e-1), st.integers(1_000, 10**6), st.integers(10, 10_000),
       st.integers(0, 500), st.integers(10, 10_000))
def test_speed_split_recovers_both_rates(prefill, decode, uncached, output, probe_uncached, probe_output):
    speed = LLMSpeed()
    speed.add_trial(prefill * uncached + decode * output, TokenCounts(prompt=uncached + 7, cached=7, output=output))
    speed.probe(prefill * probe_uncached + decode * probe_output,
                TokenCounts(prompt=probe_uncached + 5, cached=5, output=probe_output))
    got = speed.rates()
    assert got is not None
    if uncached * probe_output - output * probe_uncached > 0:
        assert got == pytest.approx((prefill, decode), rel=1e-6)
    assert got[0] >= 0 and got[1] >= 0


def test_speed_needs_a_probe():
    speed = LLMSpeed()
    speed.add_trial(1.0, TokenCounts(prompt=100, output=10))
    assert speed.rates() is None and speed.figures() == {}


def _manifest(prefix_plan: dict | None) -> Manifest:
    shards = [ShardSpec("00000", [Segment(0, 0, 10)], est_tokens=10_000),
              ShardSpec("00001", [Segment(0, 10, 20)], est_tokens=10_000)]
    files = [InputFile(uri="x.parquet", rows=20, row_group_rows=[20])]
    return Manifest(run_id="r", input=InputSpec("x.parquet", "parquet", "id", "text", files), shards=shards,
                    engine={"kind": "llm", "model_path": "/m", "max_tokens": 8, "user_template": "{{ text }}"},
                    prefix_plan=prefix_plan)


def _canary(llm: dict) -> CanaryResult:
    return CanaryResult(
        run_id="r", fingerprint="f", engine_kind="llm", model_digest="d" * 64, device="cpu", device_name="cpu",
        threads=2, sample_rows=4, sample_text_bytes=100, sample_tokens_real=4_000, sample_tokens_padded=4_000,
        model_load_seconds=3.0, steady_rows_per_s=1.0, steady_tokens_per_s=1_000.0, worker_seconds_per_token=1e-3,
        padding_efficiency=None, strategy="fixed", chosen={"token_budget": 2048, "max_batch_rows": 64},
        shard_rows={"00000": 2, "00001": 2}, shard_tokens={"00000": 2_000, "00001": 2_000},
        stage_seconds={"model_load": 3.0, "tokenize": 0.4}, llm=llm)


LLM = {"seconds_per_uncached_prompt_token": 1e-4, "seconds_per_output_token": 1e-2, "output_tokens_per_row": 8.0,
       "first_call_seconds": 0.5,
       "prompt_tokens": 4_000, "cached_tokens": 1_000, "shard_prompt_tokens": {"00000": 2_000, "00001": 2_000},
       "shard_cached_tokens": {"00000": 1_000, "00001": 0}}


def test_llm_shard_priced_by_uncached_prompt_and_output_tokens():
    canary = _canary(LLM)
    planned = _manifest({"status": "planned", "shard_hit_rates": {"00000": 0.75, "00001": 0.5}})
    loads = shard_loads(canary, planned).loads
    other = 0.4 / 4_000
    for load, hit in zip(loads, (0.75, 0.5), strict=True):
        assert load.hit_rate == hit and load.rows == 8 and load.tokens == pytest.approx(8_000)
        assert load.seconds == pytest.approx(3.0 + 0.5 + 1e-4 * 8_000 * (1 - hit) + 1e-2 * 8 * 8 + other * 8_000)
    # without the plan's estimate: the hit rate vLLM measured on each shard's sample
    assert [shard_hit_rate(canary, _manifest(None), s) for s in ("00000", "00001")] == [0.5, 0.0]
    tokens = llm_token_projection(shard_loads(canary, planned), canary)
    assert tokens["prompt_tokens"] == 20_000 and tokens["output_tokens"] == 8 * 16 + 8 * 4
    assert tokens["cached_prompt_tokens"] == int(8_000 * 0.75 + 8_000 * 0.5 + 1_000)


def test_older_or_encoder_canaries_keep_the_per_token_price():
    canary = _canary({"output_tokens_p50": 8.0})
    assert llm_rates(canary) is None
    assert shard_loads(canary, _manifest(None)).loads[0].seconds == pytest.approx(3.0 + 8_000 * 1e-3)


def test_plan_versus_actual_shows_token_figures():
    projection = {"decision": "go", "fanout_worker_seconds": 10.0, "cost_usd": 0.1, "finish_seconds": 20.0,
                  "llm_tokens": {"prompt_tokens": 100, "cached_prompt_tokens": 60, "output_tokens": 30, "hit_rate": 0.6}}
    actual = {"prompt_tokens": 100, "cached_prompt_tokens": 50, "output_tokens": 40, "hit_rate": 0.5}
    section = projection_section(projection, worker_seconds=8.0, canary_worker_seconds=1.0, plan_created_at=None,
                                 last_shard_finished_at=None, params=CostParams(), llm_tokens=actual)
    assert section["tokens"]["error"] == {"prompt_tokens": 0.0, "cached_prompt_tokens": 0.2, "output_tokens": -0.25,
                                          "hit_rate": 0.2}
    assert "tokens" not in projection_section({**projection, "llm_tokens": None}, worker_seconds=8.0,
                                              canary_worker_seconds=1.0, plan_created_at=None,
                                              last_shard_finished_at=None, params=CostParams(), llm_tokens=actual)
