"""The in-run budget stop: once the run's actual spend passes ``budget_usd`` by the tolerance, no new
shard starts (``budget.over_budget_message``, checked by ``infer_local`` before each shard)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from batch_contract.runstore import RunStore
from batch_inference.budget import BUDGET_TOLERANCE, over_budget_message, spent_usd
from batch_inference.params import RunConfig
from batch_inference.pricing import cost_params_from_dict
from synthetic_runs import RunSpec, build_run, write_input

PARAMS = {"accelerator": "nvidia-l4", "gpu_hour_usd_spot": 3.6}  # $0.001 per worker-second


def _run(tmp_path: Path, seconds_per_shard: float) -> str:
    src = write_input(tmp_path / "in.parquet", [f"r{i}" for i in range(200)])
    layout = build_run(tmp_path / "out", "r1", src, RunSpec(shards=2))
    for shard in ("00000", "00001"):
        path = Path(layout.marker_uri(shard))
        marker = json.loads(path.read_text())
        marker["stage_seconds"] = {"model_load": 1.0, "inference": seconds_per_shard - 1.0}
        path.write_text(json.dumps(marker))
    return layout.run_dir


def test_spent_usd_prices_the_markers_stage_seconds_like_the_report() -> None:
    class M:
        stage_seconds = {"inference": 100.0, "model_load": 20.0}

    assert spent_usd([M(), M()], None, cost_params_from_dict(PARAMS)) == pytest.approx(0.24)


def test_no_shard_starts_once_spend_passes_the_budget_by_the_tolerance(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, seconds_per_shard=50.0)  # 100 worker-seconds: $0.10 spent
    assert over_budget_message(run_dir, RunConfig(**PARAMS, budget_usd=0.10), "00002") is None, "within tolerance"
    assert RunStore.open(run_dir).steal_stop() is None, "no stop: stealing workers go on"
    cfg = RunConfig(**PARAMS, budget_usd=0.10 / (1 + BUDGET_TOLERANCE) * 0.99)
    message = over_budget_message(run_dir, cfg, "00002")
    stop = RunStore.open(run_dir).steal_stop()  # workers stealing units (params.steal) stop taking them
    assert stop and stop.startswith("BUDGET EXCEEDED")
    assert message and message.startswith("BUDGET EXCEEDED") and "shard 00002 is not started" in message
    assert "2 complete shard(s)" in message and "committed row is kept" in message
    assert over_budget_message(run_dir, RunConfig(**PARAMS, budget_usd=0.10), "00002") is None, "within tolerance"
    assert over_budget_message(run_dir, RunConfig(**PARAMS), "00002") is None, "no budget: never stops"


@pytest.mark.parametrize(("budget", "stopped"), [(0.05, True), (0.10, False), (None, False)])
def test_the_gate_names_the_budget_stop_as_the_cause_of_a_shard_that_never_started(
        tmp_path: Path, budget: float | None, stopped: bool) -> None:
    """A shard with no attempt record in a run over its budget was stopped by the budget (the gate's
    failure says so, with the fix); within the budget, or with none, the generic cause stays."""
    from batch_inference.sensors import ShardMarkerSensor

    run_dir = _run(tmp_path, seconds_per_shard=50.0)  # $0.10 spent
    manifest_path = Path(run_dir) / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["params"] = {**manifest.get("params", {}), **PARAMS, "budget_usd": budget}
    manifest_path.write_text(json.dumps(manifest))
    causes = ShardMarkerSensor(task_id="gate", run_dir=run_dir)._causes(["00002"])
    assert ("not started: BUDGET EXCEEDED, the run has spent $0.1" in causes) is stopped, causes
    assert ("raise budget_usd and clear the failed shard tasks" in causes) is stopped, causes
    assert ("no attempt record" in causes) is not stopped, causes
