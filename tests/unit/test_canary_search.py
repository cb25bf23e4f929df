"""The canary's batch-size search, its records and the projection (pure: no model, no Airflow)."""

from __future__ import annotations

import numpy as np
import pytest
from batch_contract.canary import AutotuneTrial, CanaryResult, TuningProfile, profile_uri
from batch_contract.manifest import InputFile, InputSpec, Manifest, Segment, ShardSpec
from batch_inference.pricing import cost_params_from_dict
from batch_inference.projection import Limits, RunRefused, calibration, format_table, makespan, project
from batch_worker.autotune import BudgetSearch, stratified_order
from batch_worker.canary import (
    SHAPE_FACTOR_BOUNDS,
    CanaryOptions,
    anchored_seconds_per_token,
    chunk_shape,
    cpu_profile_name,
    fit_engine_time,
    prefix_segments,
    sample_quotas,
)
from hypothesis import given, settings
from hypothesis import strategies as st


def _trial(budget: int, tps: float, oom: bool = False, warmup: bool = False) -> AutotuneTrial:
    return AutotuneTrial(token_budget=budget, max_batch_rows=256, rows=10, tokens_real=int(tps), tokens_padded=int(tps),
                         seconds=1.0, batches=1, oom=oom, warmup=warmup)


def _drive(search: BudgetSearch, speed: dict[int, float], oom_above: int | None = None) -> list[int]:
    tried = []
    while (b := search.next_budget()) is not None:
        tried.append(b)
        search.record(_trial(b, speed.get(b, 0.0), oom=oom_above is not None and b > oom_above))
    return tried


def test_grow_search_stops_at_out_of_memory_and_backs_off_one_step() -> None:
    search = BudgetSearch("grow", start=1024)
    speed = {1024: 100, 2048: 150, 4096: 200, 8192: 260, 16384: 300}
    assert _drive(search, speed, oom_above=8192) == [1024, 2048, 4096, 8192, 16384]
    assert search.trials[-1].oom and search.chosen(default=1) == 8192


def test_grow_search_stops_without_gain_and_keeps_the_previous_budget() -> None:
    search = BudgetSearch("grow", start=1024)
    assert _drive(search, {1024: 100, 2048: 150, 4096: 152}) == [1024, 2048, 4096]
    assert search.chosen(default=1) == 2048


def test_grow_search_halves_when_the_first_budget_does_not_fit() -> None:
    search = BudgetSearch("grow", start=4096)
    assert _drive(search, {4096: 1, 2048: 1, 1024: 90, 512: 50}, oom_above=1024)[:3] == [4096, 2048, 1024]
    assert search.chosen(default=1) <= 1024
    assert all(t.token_budget <= 1024 for t in search.trials if not t.oom)


def test_candidates_search_keeps_the_fastest_that_fits_and_ignores_warmup() -> None:
    search = BudgetSearch("candidates", candidates=(2048, 4096, 8192))
    search.record(_trial(2048, 10_000, warmup=True))
    assert _drive(search, {2048: 100, 4096: 180, 8192: 500}, oom_above=4096) == [2048, 4096, 8192]
    assert search.chosen(default=1) == 4096
    all_oom = BudgetSearch("candidates", candidates=(2048,))
    _drive(all_oom, {2048: 5}, oom_above=1)
    assert all_oom.chosen(default=99) == 1024


def test_stratified_order_is_a_permutation_whose_prefixes_span_the_lengths() -> None:
    lengths = np.arange(100)[::-1]
    order = stratified_order(lengths)
    assert sorted(order.tolist()) == list(range(100))
    first = lengths[order[:8]]
    assert first.min() < 20 and first.max() > 80
    assert stratified_order([]).size == 0


def _manifest(rows: list[int], est_per_row: float = 100.0) -> Manifest:
    total = sum(rows)
    shards, start = [], 0
    for k, n in enumerate(rows):
        shards.append(ShardSpec(shard_id=f"{k:05d}", segments=[Segment(0, start, start + n)], est_tokens=int(n * est_per_row)))
        start += n
    return Manifest(run_id="r", input=InputSpec(uri="x.parquet", format="parquet", id_column="id", text_column="text",
                                                files=[InputFile(uri="x.parquet", rows=total, row_group_rows=[total])]),
                    shards=shards, engine={"kind": "encoder"})


def test_sample_quotas_share_the_sample_by_shard_rows() -> None:
    m = _manifest([1000, 3000])
    q = sample_quotas(m, CanaryOptions(fraction=0.1, min_rows=10, max_rows=10_000))
    assert q == {"00000": 100, "00001": 300}
    assert sum(sample_quotas(m, CanaryOptions(fraction=0.0001, min_rows=50)).values()) == 50
    assert sample_quotas(_manifest([3]), CanaryOptions(min_rows=200)) == {"00000": 3}
    segs = prefix_segments([Segment(0, 10, 15), Segment(1, 0, 50)], 8)
    assert [(s.file_index, s.row_start, s.row_stop) for s in segs] == [(0, 10, 15), (1, 0, 3)]


def test_engine_fit_and_chunk_shape() -> None:
    trials = [AutotuneTrial(1, 1, tokens_padded=p, batches=n, seconds=0.001 * p + 0.5 * n) for p, n in
              ((1000, 2), (2000, 10), (4000, 3))]
    a, b = fit_engine_time(trials)
    assert a == pytest.approx(0.001) and b == pytest.approx(0.5)
    padded, batches = chunk_shape(np.array([10, 20, 30]), 300, 1000, 256, 8)
    assert padded >= 1.0 and 0 < batches < 0.01


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(100, 50_000), st.integers(1, 40), st.floats(0.05, 5.0)), min_size=1, max_size=6),
       st.floats(0.5, 1.0), st.floats(0.0, 0.01))
def test_full_chunk_seconds_per_token_stay_near_what_the_trials_measured(points, real_share, batches_per_token) -> None:
    """Whatever the trials' noise does to the fit, the projected engine seconds per real token are the
    measured ones x a shape factor inside SHAPE_FACTOR_BOUNDS (a fit of four noisy trials once projected
    2.5x the measured speed)."""
    trials = [AutotuneTrial(8192, 256, rows=10, tokens_real=max(1, int(p * real_share)), tokens_padded=p,
                            batches=n, seconds=sec) for p, n, sec in points]
    a, b = fit_engine_time(trials)
    fit = {"seconds_per_padded_token": a, "seconds_per_batch": b, "padded_per_token": 1.02,
           "batches_per_token": batches_per_token}
    got = anchored_seconds_per_token(fit, trials)
    measured = sum(t.seconds for t in trials) / sum(t.tokens_real for t in trials)
    low, high = SHAPE_FACTOR_BOUNDS
    assert measured * low * (1 - 1e-9) <= got <= measured * high * (1 + 1e-9)
    assert fit["measured_seconds_per_token"] == pytest.approx(measured)


def test_anchoring_keeps_an_exact_fit_when_its_correction_is_plausible() -> None:
    """Trials that follow seconds = a x padded + b x batches exactly: a full chunk that pads less and
    batches less is projected by the fit itself (its factor is inside the bounds)."""
    trials = [AutotuneTrial(8192, 256, rows=10, tokens_real=900, tokens_padded=1000, batches=2,
                            seconds=0.001 * 1000 + 0.01 * 2)]
    fit = {"seconds_per_padded_token": 0.001, "seconds_per_batch": 0.01, "padded_per_token": 1.0,
           "batches_per_token": 0.0005}
    assert anchored_seconds_per_token(fit, trials) == pytest.approx(0.001 + 0.01 * 0.0005)
    assert anchored_seconds_per_token(fit, []) == pytest.approx(0.001 + 0.01 * 0.0005)


def _canary(**kw) -> CanaryResult:
    base = dict(run_id="r", fingerprint="f", engine_kind="encoder", model_digest="d" * 64, device="cpu",
                device_name="cpu", threads=1, sample_rows=200, sample_text_bytes=80_000, sample_tokens_real=20_000,
                sample_tokens_padded=21_000, model_load_seconds=2.0, steady_rows_per_s=100.0,
                steady_tokens_per_s=10_000.0, worker_seconds_per_token=1e-4, padding_efficiency=0.95,
                strategy="candidates", chosen={"token_budget": 4096, "max_batch_rows": 256},
                shard_rows={"00000": 100, "00001": 100}, shard_tokens={"00000": 10_000, "00001": 10_000},
                stage_seconds={"model_load": 2.0, "inference": 2.0}, trials=[_trial(4096, 100)], elapsed_seconds=5.0)
    base.update(kw)
    return CanaryResult(**base)


def test_canary_records_round_trip() -> None:
    c = _canary()
    back = CanaryResult.from_json_bytes(c.to_json_bytes())
    assert back == c and isinstance(back.trials[0], AutotuneTrial)
    p = TuningProfile("encoder", "d" * 64, "NVIDIA H100 80GB HBM3", {"token_budget": 1, "max_batch_rows": 2}, "grow",
                      trials=[_trial(1, 1)])
    assert TuningProfile.from_json_bytes(p.to_json_bytes()) == p
    assert profile_uri("/o", "encoder", "ab" * 32, "NVIDIA H100 80GB HBM3").endswith(
        "/o/profiles/encoder-abababababababab-nvidia-h100-80gb-hbm3.json")
    with pytest.raises(ValueError, match="strategy"):
        _canary(strategy="guess")


def test_cpu_profiles_are_kept_apart_by_host_features_and_threads() -> None:
    """Two hosts that chose different budgets on one output_root must not share a profile."""
    bf16 = {"cpu_model": "AMD EPYC", "cpu_flags": ["avx512f", "avx512_bf16", "avx2"], "bf16": True, "amx": False}
    avx2 = {"cpu_model": "AMD EPYC", "cpu_flags": ["avx2"], "bf16": False, "amx": False}
    amx = {"cpu_model": "Intel Xeon", "cpu_flags": ["avx512f", "avx512_bf16", "amx_bf16"], "bf16": True, "amx": True}
    names = {cpu_profile_name(f, t) for f in (bf16, avx2, amx) for t in (1, 2)}
    assert len(names) == 6
    assert cpu_profile_name(bf16, 2) == cpu_profile_name(dict(bf16), 2) == "cpu AMD EPYC avx512-bf16 2t"
    uris = {profile_uri("/o", "encoder", "ab" * 32, n) for n in names}
    assert len(uris) == 6 and all(u.startswith("/o/profiles/encoder-abababababababab-cpu-") for u in uris)


def _limits(**kw) -> Limits:
    base = dict(runner="local", cores=2, parallelism=2, max_gpus=4, deadline_hours=24.0)
    base.update(kw)
    return Limits(**base)


def test_projection_calibrates_tokens_and_sums_worker_seconds() -> None:
    m = _manifest([1000, 1000], est_per_row=200.0)  # the canary measured 100 real tokens per row
    c = _canary()
    assert calibration(c, m) == pytest.approx(0.5)
    p = project(c, m, _limits(), cost_params_from_dict({"accelerator": "cpu"}), canary_wall_seconds=10.0)
    # per shard: 2 s load + (1000 x 200 x 0.5 - 10,000) tokens x 1e-4 s at 1 thread (parallelism 2 of 2 cores)
    assert p["fanout_worker_seconds"] == pytest.approx(2 * (2.0 + 90_000 * 1e-4))
    assert p["decision"] == "go" and p["chosen"]["parallelism"] == 2
    assert p["finish_seconds"] == pytest.approx(10.0 + 5.0 + 11.0)  # canary wall + start-up + one shard
    assert "workers" in format_table(p) and "GO" in p["message"]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 200), st.integers(0, 200)), min_size=2, max_size=2))
def test_rows_the_result_cache_holds_are_not_priced(sampled) -> None:
    """Per shard, the share of its sampled rows the cache held is taken off its remaining tokens: a fully
    cached rerun projects only the model loads (it was priced as a fresh run and refused for budget)."""
    m = _manifest([1000, 1000], est_per_row=100.0)
    computed = {f"{k:05d}": n for k, (n, _) in enumerate(sampled)}
    cached = {f"{k:05d}": c for k, (_, c) in enumerate(sampled)}
    c = _canary(shard_rows=computed, shard_tokens={s: 100 * n for s, n in computed.items()}, shard_rows_cached=cached)
    p = project(c, m, _limits(), cost_params_from_dict({"accelerator": "cpu"}), canary_wall_seconds=10.0)
    expected = 0.0
    for s, n in computed.items():
        share = 1.0 - cached[s] / (n + cached[s]) if n + cached[s] else 1.0
        expected += 2.0 + (100_000 - 100 * n) * share * 1e-4
    assert p["fanout_worker_seconds"] == pytest.approx(expected, abs=2e-3)  # the projection rounds to ms
    if all(n == 0 and cached[s] > 0 for s, n in computed.items()):
        assert p["fanout_worker_seconds"] == pytest.approx(2 * 2.0)


def test_projection_refuses_over_budget_and_says_what_would_fit() -> None:
    m = _manifest([1000, 1000], est_per_row=200.0)
    params = cost_params_from_dict({"accelerator": "nvidia-l4", "pricing": "on_demand"})
    budget = project(_canary(), m, _limits(), params, canary_wall_seconds=10.0)["cost_usd"] * 0.5
    p = project(_canary(), m, _limits(budget_usd=budget), params, canary_wall_seconds=10.0)
    assert p["decision"] == "refused_budget"
    assert "REFUSED (budget)" in p["message"] and "row_limit <=" in p["message"] and f"budget_usd={budget:g}" in p["message"]
    assert str(RunRefused(p)) == p["message"]


@pytest.mark.parametrize("budget_share", [0.05, 0.3, 0.6, 0.95])
def test_the_row_limit_a_budget_refusal_suggests_fits_that_budget(budget_share: float) -> None:
    """The suggestion leaves out the fixed cost (canary + one model load); below it, nothing fits and the
    message says so instead of suggesting a row limit that would be refused again."""
    import re

    from batch_inference.projection import fixed_cost_usd

    m = _manifest([1000, 1000], est_per_row=200.0)
    params = cost_params_from_dict({"accelerator": "nvidia-l4", "pricing": "spot"})
    c = _canary()
    full = project(c, m, _limits(), params, canary_wall_seconds=10.0)
    fixed = fixed_cost_usd(full["chosen"], c, params)
    budget = full["cost_usd"] * budget_share
    p = project(c, m, _limits(budget_usd=budget), params, canary_wall_seconds=10.0)
    assert p["decision"] == "refused_budget"
    if budget <= fixed:
        assert "Nothing smaller fits" in p["message"] and "row_limit" not in p["message"]
    else:
        limit = int(re.search(r"row_limit <= ([\d,]+)", p["message"]).group(1).replace(",", ""))
        assert fixed + limit / m.rows * (full["cost_usd"] - fixed) <= budget


def test_projection_refuses_a_deadline_no_parallelism_meets_and_picks_the_cheapest_that_does() -> None:
    m = _manifest([1000] * 8, est_per_row=100.0)
    c = _canary(worker_seconds_per_token=0.01, shard_rows={}, shard_tokens={})  # 1,000 s per shard
    params = cost_params_from_dict({"accelerator": "nvidia-l4"})
    k8s = project(c, m, _limits(runner="kubernetes", max_gpus=8, deadline_hours=2400 / 3600), params,
                  canary_wall_seconds=10.0)
    assert k8s["decision"] == "go" and k8s["chosen"]["parallelism"] == 4  # 2 x 1,002 s rounds: the fewest GPUs
    assert [o["parallelism"] for o in k8s["options"]] == list(range(1, 9))
    late = project(c, m, _limits(runner="kubernetes", max_gpus=2, deadline_hours=0.3), params, canary_wall_seconds=10.0)
    assert late["decision"] == "refused_deadline" and "max_gpus >= " in late["message"]
    assert "REFUSED (deadline)" in late["message"]


def test_makespan_schedules_longest_first() -> None:
    assert makespan([5, 4, 3, 3, 3], 2) == 10  # longest first onto the least loaded: 5+3, 4+3+3 (the optimum is 9)
    assert makespan([], 3) == 0.0 and makespan([2.0], 4) == 2.0


def _noisy_choice(speed: dict[int, float], noise: float, seed: int, repeats: bool = True) -> int:
    """Drive a ``candidates`` search whose trials measure ``speed`` times a random factor (seeded)."""
    rng = np.random.default_rng(seed)
    search = BudgetSearch("candidates", candidates=tuple(speed), incumbent=8192)
    while (b := search.next_budget()) is not None:
        if not repeats and len(search.trials) == len(speed):
            break
        search.record(_trial(b, speed[b] * float(rng.normal(1.0, noise))))
    return search.chosen(default=1)


@pytest.mark.parametrize("speed", [
    {2048: 100, 4096: 112, 8192: 113, 16384: 98},   # two candidates within timing noise of each other
    {2048: 100, 4096: 104, 8192: 106, 16384: 105},  # a flat curve: every candidate within 5%
    {2048: 100, 4096: 110, 8192: 116, 16384: 105},  # the default a little faster than its neighbour
    {2048: 60, 4096: 80, 8192: 120, 16384: 90},     # the default a clear winner
    {2048: 90, 4096: 140, 8192: 100, 16384: 80},    # another candidate a clear winner
])
def test_candidates_search_chooses_the_same_budget_on_every_run_of_the_same_host(speed: dict[int, float]) -> None:
    """Same true speeds, 3% timing noise per trial (what 1-2 s trials on a quiet CPU show), 100 runs with
    the device default 8,192 as the incumbent: the choice is repeatable (a single trial per candidate,
    fastest wins, flipped on close calls)."""
    choices = [_noisy_choice(speed, 0.03, seed) for seed in range(100)]
    top = max(set(choices), key=choices.count)
    assert choices.count(top) >= 0.9 * len(choices), {c: choices.count(c) for c in set(choices)}
    assert speed[top] * 1.05 >= max(speed.values()) * 0.97, "the choice is never far from the fastest"


def test_candidates_search_repeats_only_undecided_candidates_and_keeps_the_incumbent_on_a_close_call() -> None:
    search = BudgetSearch("candidates", candidates=(2048, 4096, 8192), incumbent=8192)
    tried = _drive(search, {2048: 50, 4096: 108, 8192: 100})
    assert tried == [2048, 4096, 8192, 4096, 8192, 4096, 8192]  # 2048 is slower: never repeated
    assert search.median_rates() == {2048: 50.0, 4096: 108.0, 8192: 100.0}
    assert search.chosen(default=1) == 4096  # 8% faster in all three trials: confidently
    close = BudgetSearch("candidates", candidates=(4096, 8192), incumbent=8192)
    _drive(close, {4096: 103, 8192: 100})
    assert close.chosen(default=1) == 8192  # 3% is not a gain
    clear = BudgetSearch("candidates", candidates=(2048, 4096))  # no incumbent: the smallest holds
    assert _drive(clear, {2048: 50, 4096: 100}) == [2048, 4096]  # twice as fast: no repeats needed
    assert clear.chosen(default=1) == 4096
