"""The approval request's text and record (``batch_inference.approval``): what a person sees before the
fan-out, when nothing is asked, how long the request waits, and what the gate says after a rejection."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from batch_contract.canary import AutotuneTrial, CanaryResult
from batch_contract.manifest import InputFile, InputSpec, Manifest, Segment, ShardSpec
from batch_inference.approval import (
    MIN_WAIT_SECONDS,
    ProjectionApprovalOperator,
    approval_body,
    approval_subject,
    key_figures,
    not_required_reason,
    read_approval,
    rejection_message,
    wait_seconds,
    write_approval,
)
from batch_inference.pricing import cost_params_from_dict
from batch_inference.projection import Limits, format_table, project


def _projection(**limits) -> dict:
    """A real projection (:func:`project`) of a 2-shard, 2,000-row run from a small canary record."""
    shards = [ShardSpec(shard_id=f"{k:05d}", segments=[Segment(0, k * 1000, (k + 1) * 1000)], est_tokens=200_000)
              for k in range(2)]
    manifest = Manifest(run_id="r1", input=InputSpec(uri="x.parquet", format="parquet", id_column="id",
                                                      text_column="text",
                                                      files=[InputFile(uri="x.parquet", rows=2000, row_group_rows=[2000])]),
                        shards=shards, engine={"kind": "encoder"})
    canary = CanaryResult(
        run_id="r1", fingerprint="f", engine_kind="encoder", model_digest="d" * 64, device="cpu", device_name="cpu",
        threads=1, sample_rows=200, sample_text_bytes=80_000, sample_tokens_real=20_000, sample_tokens_padded=21_000,
        model_load_seconds=2.0, steady_rows_per_s=100.0, steady_tokens_per_s=10_000.0, worker_seconds_per_token=1e-4,
        padding_efficiency=0.95, strategy="candidates", chosen={"token_budget": 16384, "max_batch_rows": 256},
        shard_rows={"00000": 100, "00001": 100}, shard_tokens={"00000": 10_000, "00001": 10_000},
        stage_seconds={"model_load": 2.0, "inference": 2.0},
        trials=[AutotuneTrial(16384, 100, tokens_padded=16384, batches=1, seconds=1.0)], elapsed_seconds=5.0)
    base = {"runner": "local", "cores": 2, "parallelism": 2, "max_gpus": 4, "deadline_hours": 24.0}
    base.update(limits)
    return project(canary, manifest, Limits(**base), cost_params_from_dict({"accelerator": "nvidia-l4"}),
                   canary_wall_seconds=10.0)


def test_the_body_shows_every_figure_a_person_approves_and_the_canary_table() -> None:
    p = _projection(budget_usd=5.0)
    c = p["chosen"]
    started = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    body = approval_body(p, run_dir="/o/runs/r1", shards=2, run_started_at=started)
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")[1].strip(" |") for line in body.splitlines()
            if line.startswith("| ") and " | " in line}
    assert rows["Projected cost, spot"] == f"${c['cost_spot_usd']:.6g}"
    assert rows["Projected cost, on-demand"] == f"${c['cost_on_demand_usd']:.6g}"
    assert c["cost_on_demand_usd"] > c["cost_spot_usd"] > 0
    assert rows["Fan-out worker-seconds"] == f"{c['worker_seconds']:,.1f}"
    assert rows["GPU-hours (canary included)"] == f"{c['gpu_hours']:.4g}"
    assert rows["Parallelism (chosen)"] == "2" and rows["Token budget per batch"] == "16,384"
    assert rows["Rows / shards"] == "2,000 rows in 2 shard(s)"
    assert rows["Limits"] == "budget_usd $5, deadline_hours 24"
    hours = c["finish_seconds"] / 3600.0
    at = datetime.fromtimestamp(started.timestamp() + c["finish_seconds"], UTC)
    assert rows["Projected finish"].startswith(f"{hours:.3f} h after the run started ({at:%Y-%m-%d %H:%M} UTC)")
    assert body.startswith(f"**{p['message']}**") and p["message"].startswith("GO")
    assert "```text\n" + format_table(p) + "\n```" in body, "the canary's own table, verbatim"
    assert "`/o/runs/r1/projection.json`" in body
    assert "**Reject** starts no shard" in body


def test_the_subject_is_one_line_with_cost_gpu_hours_and_finish() -> None:
    p = _projection()
    subject = approval_subject(p, "manual__2026")
    c = p["chosen"]
    assert subject == (f"Approve batch run manual__2026: ${c['cost_usd']:.4g} (spot), {c['gpu_hours']:.4g} GPU-h, "
                       f"finish in {c['finish_seconds'] / 3600.0:.3f} h at parallelism 2")
    assert "\n" not in subject


def test_nothing_is_asked_without_the_param_or_without_a_go_projection() -> None:
    p = _projection()
    assert not_required_reason(False, {"decision": "go"}, p) == "require_approval is off"
    skipped = not_required_reason(True, {"decision": "skipped", "message": "dry run"}, p)
    assert skipped and "canary was skipped (dry run)" in skipped
    assert "no projection.json" in not_required_reason(True, {"decision": "go"}, None)
    assert "refused" in not_required_reason(True, None, {**p, "decision": "refused_budget"})
    assert not_required_reason(True, {"decision": "go"}, p) is None


def test_the_wait_ends_at_the_runs_deadline_but_never_under_the_minimum() -> None:
    start = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    now = start.timestamp() + 3600.0
    assert wait_seconds(start, 24.0, now=now) == pytest.approx(23 * 3600.0)
    assert wait_seconds(start, 1.0, now=now) == MIN_WAIT_SECONDS
    assert wait_seconds(None, 2.0, now=now) == pytest.approx(7200.0)


def _record(p: dict, **kw) -> dict:
    record = {"decision": "pending", "asked_at": "2026-03-01T12:05:00+00:00", "wait_seconds": 3600.0,
              "responded_by": None, "responded_at": None, "timed_out": False, "projection": key_figures(p)}
    record.update(kw)
    return record


def test_the_gate_message_names_who_rejected_and_the_figures_they_saw(tmp_path: Path) -> None:
    p = _projection()
    run_dir = str(tmp_path / "runs" / "dag" / "r1")  # the approval record lives in a run directory
    assert rejection_message(run_dir) is None, "never asked"
    write_approval(run_dir, _record(p, decision="approved", responded_by={"id": "alice", "name": "alice"}))
    assert read_approval(run_dir)["decision"] == "approved" and rejection_message(run_dir) is None
    write_approval(run_dir, _record(p, decision="rejected", responded_by={"id": "7", "name": "bob"},
                                    responded_at="2026-03-01T12:07:00+00:00"))
    message = rejection_message(run_dir)
    c = p["chosen"]
    assert message.startswith(f"REJECTED (approval): bob (id 7) rejected the projection (${c['cost_usd']:.6g} spot, ")
    assert "at 2026-03-01T12:07:00+00:00; no shard was started" in message
    assert "clear the approve task and its downstream tasks" in message
    write_approval(run_dir, _record(p, decision="rejected", timed_out=True, responded_at="2026-03-01T13:05:00+00:00"))
    assert rejection_message(run_dir).startswith("REJECTED (approval): nobody answered the approval request")
    assert "within 1.000 h" in rejection_message(run_dir)
    write_approval(run_dir, _record(p))
    assert rejection_message(run_dir).startswith("NOT APPROVED: ")
    with pytest.raises(ValueError, match="decision"):
        write_approval(run_dir, _record(p, decision="maybe"))


def test_the_operator_is_airflows_approval_operator_rejecting_by_default() -> None:
    from airflow.providers.standard.operators.hitl import ApprovalOperator

    op = ProjectionApprovalOperator()
    assert isinstance(op, ApprovalOperator) and op.task_id == "approve"
    assert op.options == ["Approve", "Reject"] and op.defaults == ["Reject"] and op.multiple is False
    assert op.execution_timeout is None and op.response_timeout is None, "set when it runs, from the deadline"
