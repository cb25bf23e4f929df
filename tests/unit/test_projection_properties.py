"""Property tests of the canary's projection for any canary sample, however small: every figure is finite,
a speed is never zero (it is measured, taken from the warm-up, or reported unknown), and a refusal never
suggests a row limit below one row (pure: no model, no Airflow)."""

from __future__ import annotations

import math
import re
from typing import Any

from batch_contract.canary import AutotuneTrial, CanaryResult
from batch_contract.manifest import InputFile, InputSpec, Manifest, Segment, ShardSpec
from batch_inference.pricing import cost_params_from_dict
from batch_inference.projection import DECISIONS, Limits, format_table, project
from batch_worker.canary import anchored_seconds_per_token, fit_engine_time, speed_trials
from hypothesis import given, settings
from hypothesis import strategies as st

trials_st = st.lists(st.builds(
    AutotuneTrial,
    token_budget=st.sampled_from([256, 2048, 8192]),
    max_batch_rows=st.just(256),
    rows=st.integers(0, 40),
    tokens_real=st.integers(0, 4000),
    tokens_padded=st.integers(0, 5000),
    seconds=st.sampled_from([0.0, 1e-7, 1e-3, 0.2, 3.0]),
    batches=st.integers(0, 4),
    warmup=st.booleans(),
), max_size=4)


def _canary_from(trials: list[AutotuneTrial], shard_rows: dict[str, int], load_s: float) -> CanaryResult:
    """A canary record built from ``trials`` the way the worker builds it (``Canary._result``): the speed
    from :func:`speed_trials`, the engine fit and the anchored seconds per token."""
    measured, source = speed_trials(trials)
    a, b = fit_engine_time(measured)
    fit = {"seconds_per_padded_token": a, "seconds_per_batch": b, "chunk_rows": 100,
           "padded_per_token": 1.05, "batches_per_token": 1e-3}
    per_token = anchored_seconds_per_token(fit, measured) if source != "none" else 0.0
    engine_s = sum(t.seconds for t in measured)
    real = sum(t.tokens_real for t in trials)
    return CanaryResult(
        run_id="r", fingerprint="f", engine_kind="encoder", model_digest="d" * 64, device="cpu", device_name="cpu",
        threads=2, sample_rows=sum(shard_rows.values()), sample_text_bytes=4 * real, sample_tokens_real=real,
        sample_tokens_padded=sum(t.tokens_padded for t in trials), model_load_seconds=load_s,
        steady_rows_per_s=sum(t.rows for t in measured) / engine_s if engine_s else 0.0,
        steady_tokens_per_s=sum(t.tokens_real for t in measured) / engine_s if engine_s else 0.0,
        worker_seconds_per_token=per_token, padding_efficiency=None, strategy="fixed",
        chosen={"token_budget": 256, "max_batch_rows": 256}, shard_rows=shard_rows,
        shard_tokens={k: 30 * v for k, v in shard_rows.items()}, stage_seconds={"model_load": load_s},
        trials=trials, engine_fit=fit, elapsed_seconds=load_s + engine_s, speed_source=source)


def _manifest(rows: list[int]) -> Manifest:
    shards, start = [], 0
    for k, n in enumerate(rows):
        shards.append(ShardSpec(shard_id=f"{k:05d}", segments=[Segment(0, start, start + n)], est_tokens=40 * n))
        start += n
    files = [InputFile(uri="x.parquet", rows=start, row_group_rows=[start])]
    return Manifest(run_id="r", input=InputSpec(uri="x.parquet", format="parquet", id_column="id",
                                                text_column="text", files=files),
                    shards=shards, engine={"kind": "encoder"})


def _numbers(value: Any) -> list[float]:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return []
    if isinstance(value, int | float):
        return [float(value)]
    if isinstance(value, dict):
        return [x for v in value.values() for x in _numbers(v)]
    if isinstance(value, list | tuple):
        return [x for v in value for x in _numbers(v)]
    return []


@settings(max_examples=300, deadline=None)
@given(trials=trials_st,
       shard_rows=st.lists(st.integers(1, 5000), min_size=1, max_size=6),
       sampled=st.integers(0, 8),
       load_s=st.sampled_from([0.0, 0.1, 30.0]),
       runner=st.sampled_from(["local", "kubernetes"]),
       deadline_hours=st.sampled_from([1e-4, 0.01, 1.0, 24.0]),
       elapsed_hours=st.sampled_from([0.0, 0.5, 30.0]),
       budget=st.sampled_from([None, 0.0, 1e-9, 1e-5, 1.0, 1e6]),
       wall=st.sampled_from([0.0, 2.0, 8.1]))
def test_projection_is_finite_and_suggests_at_least_one_row_for_any_canary_sample(
        trials, shard_rows, sampled, load_s, runner, deadline_hours, elapsed_hours, budget, wall) -> None:
    manifest = _manifest(shard_rows)
    taken = {s.shard_id: min(sampled, s.rows) for s in manifest.shards if sampled}
    canary = _canary_from(trials, taken, load_s)
    limits = Limits(runner=runner, cores=2, parallelism=1, max_gpus=3, deadline_hours=deadline_hours,
                    budget_usd=budget, elapsed_seconds=elapsed_hours * 3600.0)
    params = cost_params_from_dict({"accelerator": "nvidia-l4", "pricing": "spot"})
    p = project(canary, manifest, limits, params, canary_wall_seconds=wall)

    assert all(math.isfinite(x) for x in _numbers(p)), p
    assert p["decision"] in DECISIONS
    if canary.speed_source != "none":
        assert canary.worker_seconds_per_token > 0 and p["speed_known"]
    if not p["speed_known"]:
        assert p["decision"] == "go" and "projection unknown" in p["message"]
    limits_suggested = [int(v.replace(",", "")) for v in re.findall(r"row_limit <= ([\d,]+)", p["message"])]
    assert all(1 <= n < manifest.rows for n in limits_suggested), p["message"]
    for key in ("budget_usd", "deadline_hours", "max_gpus"):
        for v in re.findall(rf"{key} >= ([\d.e+-]+)", p["message"]):
            assert float(v.rstrip(".")) > 0, p["message"]
    if p["decision"] == "refused_deadline":
        suggested = float(re.search(r"deadline_hours >= ([\d.e+-]+)", p["message"]).group(1).rstrip("."))
        assert suggested * 3600.0 >= p["finish_seconds"]
    format_table(p)  # renders for any projection


def test_a_canary_of_four_rows_takes_its_speed_from_the_warmup_not_zero() -> None:
    """The example from the issue: 4 sampled rows all go to the warm-up slice; no later slice ran."""
    warm = AutotuneTrial(token_budget=256, max_batch_rows=256, rows=4, tokens_real=120, tokens_padded=128,
                         seconds=0.05, batches=1, warmup=True)
    measured, source = speed_trials([warm])
    assert source == "warmup" and measured == [warm]
    canary = _canary_from([warm], {"00000": 4}, 0.1)
    assert canary.steady_rows_per_s == 80.0 and canary.worker_seconds_per_token > 0
    assert speed_trials([]) == ([], "none")
    assert speed_trials([AutotuneTrial(256, 256, rows=4, tokens_real=10, seconds=0.0, warmup=True)]) == ([], "none")


def test_a_run_that_spent_its_deadline_before_the_canary_is_refused_without_a_row_limit() -> None:
    canary = _canary_from([AutotuneTrial(256, 256, rows=4, tokens_real=120, tokens_padded=128, seconds=0.05,
                                         batches=1, warmup=True)], {"00000": 4}, 0.1)
    limits = Limits(runner="local", cores=2, parallelism=1, max_gpus=1, deadline_hours=24.0,
                    elapsed_seconds=28.5 * 3600.0)
    p = project(canary, _manifest([4, 4]), limits, cost_params_from_dict({"accelerator": "cpu"}),
                canary_wall_seconds=8.0)
    assert p["decision"] == "refused_deadline"
    assert "row_limit" not in p["message"] and "no row limit fits" in p["message"]
    assert re.search(r"deadline_hours >= 31\.\d", p["message"]), p["message"]
