"""The LLM engine's canary search and figures (pure: no vLLM): the search space over ``max_num_seqs``,
the paired ``max_num_batched_tokens``, the JSON-valid rate and the projection's LLM line."""

from __future__ import annotations

import pytest
from batch_contract.canary import AutotuneTrial, json_valid_rate
from batch_inference.projection import format_table
from batch_worker.autotune import (
    ENCODER_SPACE,
    LLM_CPU_CANDIDATES,
    LLM_SPACE,
    BudgetSearch,
    llm_batched_tokens,
    search_space,
)


def _llm_trial(seqs: int, output_tps: float, input_tps: float = 1000.0, oom: bool = False) -> AutotuneTrial:
    return AutotuneTrial(token_budget=llm_batched_tokens(seqs), max_batch_rows=seqs, rows=2 * seqs,
                         tokens_real=int(input_tps), tokens_padded=int(input_tps), seconds=1.0, batches=1,
                         oom=oom, output_tokens=int(output_tps))


def _drive(search: BudgetSearch, output_tps: dict[int, float], oom_above: int | None = None) -> list[int]:
    tried = []
    while (seqs := search.next_budget()) is not None:
        tried.append(seqs)
        search.record(_llm_trial(seqs, output_tps.get(seqs, 0.0), oom=oom_above is not None and seqs > oom_above))
    return tried


def test_llm_candidates_are_max_num_seqs_ranked_by_output_tokens_per_second() -> None:
    search = BudgetSearch("candidates", space=LLM_SPACE)
    # input tokens/s would pick 8 sequences; generated tokens/s, what an LLM run pays for, picks 32
    warmup = _llm_trial(64, 10_000)
    warmup.warmup = True  # never chosen, however fast
    search.record(warmup)
    tried = []
    while (seqs := search.next_budget()) is not None:
        tried.append(seqs)
        search.record(_llm_trial(seqs, {8: 100, 16: 180, 32: 250, 64: 240}[seqs], input_tps=10_000 / seqs))
    assert tried == list(LLM_CPU_CANDIDATES)
    assert search.chosen(default=1) == 32


def test_llm_grow_doubles_sequences_until_preemption_and_backs_off() -> None:
    search = BudgetSearch("grow", space=LLM_SPACE)
    assert _drive(search, {128: 100, 256: 180, 512: 300, 1024: 320}, oom_above=512) == [128, 256, 512, 1024]
    assert search.chosen(default=1) == 512
    flat = BudgetSearch("grow", space=LLM_SPACE)
    assert _drive(flat, {128: 100, 256: 102}) == [128, 256] and flat.chosen(default=1) == 128
    tight = BudgetSearch("grow", start=4, space=LLM_SPACE)
    assert _drive(tight, {1: 50, 2: 60, 4: 70}, oom_above=0) == [4, 2, 1]
    assert tight.chosen(default=99) == 1  # never below one sequence


def test_llm_batched_tokens_pairs_with_max_num_seqs() -> None:
    assert llm_batched_tokens(8) == 4096 and llm_batched_tokens(256) == 4096  # vLLM's CPU default pair
    assert llm_batched_tokens(1024) == 16384  # vLLM's H100/H200 offline default pair
    assert all(llm_batched_tokens(s) >= s for s in (1, 64, 4096))
    assert search_space("llm") is LLM_SPACE and search_space("encoder") is ENCODER_SPACE


def test_json_valid_rate() -> None:
    assert json_valid_rate(38, 0) == 1.0 and json_valid_rate(0, 12) == 0.0
    assert json_valid_rate(2, 1) == pytest.approx(0.6667)
    assert json_valid_rate(0, 0) is None
    with pytest.raises(ValueError, match="^row counts must be >= 0, got valid=-1, invalid=3"):
        json_valid_rate(-1, 3)
    trial = _llm_trial(16, 400.0)
    assert trial.output_tokens_per_s == 400.0 and AutotuneTrial(1, 1).output_tokens_per_s == 0.0


def test_projection_table_has_the_llm_line() -> None:
    option = {"parallelism": 1, "worker_seconds": 10.0, "gpu_hours": 0.001, "cost_spot_usd": 0.01,
              "cost_on_demand_usd": 0.02, "finish_seconds": 60.0, "meets_deadline": True}
    canary = {"rows": 40, "tokens_per_s": 500.0, "token_budget": 4096, "strategy": "candidates",
              "autotune_seconds": 3.0, "model_load_seconds": 2.0, "wall_seconds": 20.0,
              "chosen": {"token_budget": 4096, "max_batch_rows": 32, "max_num_seqs": 32, "max_num_batched_tokens": 4096},
              "llm": {"output_tokens_p50": 12.0, "output_tokens_p90": 20.0, "output_tokens_max": 24,
                      "json_valid_rate": 0.95, "json_valid_rows": 38, "json_invalid_rows": 2, "preemptions": 0}}
    projection = {"canary": canary, "projected_tokens": 1000, "token_calibration": 1.0, "options": [option],
                  "chosen": option, "message": "GO"}
    lines = format_table(projection).splitlines()
    assert lines[1] == ("llm: max_num_seqs 32, max_num_batched_tokens 4096; output tokens p50/p90/max 12/20/24; "
                        "JSON-valid 95.0% (38/40)")
    encoder = dict(projection, canary=dict(canary, llm=None))
    assert not any(line.startswith("llm:") for line in format_table(encoder).splitlines())
