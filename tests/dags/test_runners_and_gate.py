"""Local runner exit-code semantics and the completion gate (trigger + sensor) over real storage."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest
from batch_contract import storage
from batch_contract.layout import RunLayout
from batch_contract.marker import ShardMarker
from batch_inference.completion import check_completion, name_shards
from batch_inference.local_runner import (
    ShardBadInputError,
    ShardNotStartedError,
    ShardRetryableError,
    run_shard,
)
from batch_inference.planner import PlanRequest, plan
from batch_inference.triggers import ShardMarkerTrigger

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample" / "debian_descriptions_sample.parquet"


@pytest.fixture
def run_dir(tmp_path: Path) -> str:
    plan(PlanRequest(input_uri=str(SAMPLE), id_column="id", text_column="text", output_root=str(tmp_path),
                     run_id="gate-run", engine={"kind": "encoder"}, rows_per_shard=2000, shard_by="rows"))
    return RunLayout(str(tmp_path), "gate-run").run_dir


def _mark(run_dir: str, shard_id: str, rows: int = 2000) -> None:
    marker = ShardMarker(run_id="gate-run", shard_id=shard_id, fingerprint="f", rows_input=rows, rows_ok=rows,
                         rows_dead_letter=0)
    storage.write_create_only(RunLayout.from_run_dir(run_dir).marker_uri(shard_id), marker.to_json_bytes())


def _fake_worker(monkeypatch: pytest.MonkeyPatch, code: int, run_dir: str | None = None) -> None:
    script = f"import sys; sys.exit({code})"
    if run_dir is not None:  # a worker that commits its marker, then exits 0
        script = (
            "import sys; sys.path.insert(0, {!r}); from batch_contract import storage; "
            "from batch_contract.layout import RunLayout; from batch_contract.marker import ShardMarker; "
            "m = ShardMarker(run_id='gate-run', shard_id=sys.argv[-1], fingerprint='f', rows_input=2000, "
            "rows_ok=1990, rows_dead_letter=10); "
            "storage.write_create_only(RunLayout.from_run_dir(sys.argv[-3]).marker_uri(sys.argv[-1]), "
            "m.to_json_bytes())".format(str(Path(__file__).resolve().parents[2] / "plugins"))
        )
    monkeypatch.setenv("BATCH_WORKER_COMMAND", f"{sys.executable} -c \"{script}\"")


@pytest.mark.parametrize(("code", "error"), [(75, ShardRetryableError), (1, ShardRetryableError),
                                             (2, ShardBadInputError), (0, ShardRetryableError)])
def test_exit_codes_map_to_retry_semantics(run_dir: str, monkeypatch: pytest.MonkeyPatch, code: int,
                                           error: type) -> None:
    _fake_worker(monkeypatch, code)
    with pytest.raises(error, match="shard 00000"):
        run_shard(run_dir, "00000")  # exit 0 without a marker is a failure too


def test_success_reads_the_marker_and_a_complete_shard_is_not_rerun(run_dir: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_worker(monkeypatch, 0, run_dir)
    result = run_shard(run_dir, "00001")
    assert (result.exit_code, result.skipped, result.rows_ok, result.rows_dead_letter) == (0, False, 1990, 10)
    _fake_worker(monkeypatch, 2)  # would fail if it ran
    again = run_shard(run_dir, "00001")
    assert again.skipped and again.rows_ok == 1990


def test_the_start_check_runs_once_the_slot_is_held_and_sees_what_the_holder_committed(
        run_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The in-run budget stop's class of defect: a check made before a shard waits for its slot cannot see
    what the shards ahead of it spend. ``parallelism`` 1: the second shard is asked only after the first
    one's worker committed its marker, and its refusal starts no worker."""
    import threading

    _fake_worker(monkeypatch, 0, run_dir)
    asked: dict[str, bool] = {}

    def check(shard_id: str):
        def may_start() -> str | None:
            asked[shard_id] = storage.exists(RunLayout.from_run_dir(run_dir).marker_uri("00000"))
            return "BUDGET EXCEEDED: test" if asked[shard_id] else None
        return may_start

    first = threading.Thread(target=run_shard, args=(run_dir, "00000"),
                             kwargs={"parallelism": 1, "may_start": check("00000")})
    first.start()
    while "00000" not in asked:
        time.sleep(0.01)
    with pytest.raises(ShardNotStartedError, match="BUDGET EXCEEDED: test"):
        run_shard(run_dir, "00001", parallelism=1, may_start=check("00001"))
    first.join()
    assert asked == {"00000": False, "00001": True}
    assert not storage.exists(RunLayout.from_run_dir(run_dir).marker_uri("00001"))  # no worker started


def test_completion_status_and_ratio(run_dir: str) -> None:
    status = check_completion(run_dir)
    assert (status.shards_total, status.shards_complete, status.missing) == (3, 0, ["00000", "00001", "00002"])
    _mark(run_dir, "00000")
    _mark(run_dir, "00001")
    status = check_completion(run_dir, min_success_ratio=0.6)
    assert status.missing == ["00002"] and status.satisfied and round(status.ratio, 4) == 0.6667
    assert not check_completion(run_dir).satisfied


def test_trigger_yields_success_when_markers_arrive(run_dir: str) -> None:
    async def scenario() -> dict:
        trigger = ShardMarkerTrigger(run_dir, deadline_epoch=time.time() + 30, poll_seconds=0.05)
        gen = trigger.run()
        task = asyncio.ensure_future(gen.__anext__())
        await asyncio.sleep(0.2)
        assert not task.done()
        for shard in ("00000", "00001", "00002"):
            _mark(run_dir, shard)
        event = await asyncio.wait_for(task, 10)
        return event.payload

    payload = asyncio.run(scenario())
    assert payload["status"] == "success" and payload["shards_complete"] == 3 and payload["missing"] == []


def test_trigger_times_out_naming_missing_shards(run_dir: str) -> None:
    _mark(run_dir, "00001")

    async def first_event() -> dict:
        trigger = ShardMarkerTrigger(run_dir, deadline_epoch=time.time() + 0.2, poll_seconds=0.05)
        async for event in trigger.run():
            return event.payload
        return {}

    payload = asyncio.run(first_event())
    assert payload["status"] == "timeout" and payload["missing"] == ["00000", "00002"]


def test_trigger_reports_errors_instead_of_raising(tmp_path: Path) -> None:
    async def first_event() -> dict:
        trigger = ShardMarkerTrigger(str(tmp_path / "runs" / "never-planned"), deadline_epoch=time.time() + 5)
        async for event in trigger.run():
            return event.payload
        return {}

    payload = asyncio.run(first_event())
    assert payload["status"] == "error" and "manifest.json" in payload["message"]


def test_sensor_fails_naming_the_missing_shards(run_dir: str) -> None:
    from airflow.sdk.exceptions import AirflowFailException
    from batch_inference.sensors import ShardMarkerSensor

    sensor = ShardMarkerSensor(task_id="gate", run_dir=run_dir)
    status = check_completion(run_dir).to_dict()
    with pytest.raises(AirflowFailException, match=r"3 shard\(s\) missing .*00000, 00001, 00002"):
        sensor.execute_complete({}, {"status": "timeout", **status})
    assert sensor.execute_complete({}, {"status": "success", "missing": []}) == {"missing": []}


def test_local_gate_fails_at_once_when_the_fan_out_left_shards_missing(run_dir: str) -> None:
    from airflow.sdk.exceptions import AirflowFailException
    from batch_inference.sensors import ShardMarkerSensor

    _mark(run_dir, "00000")
    sensor = ShardMarkerSensor(task_id="gate", run_dir=run_dir, wait_for_stragglers="False")
    with pytest.raises(AirflowFailException, match=r"the fan-out finished with 2 shard\(s\) missing .*00001, 00002"):
        sensor.execute({})
    relaxed = ShardMarkerSensor(task_id="gate", run_dir=run_dir, wait_for_stragglers="False",
                                min_success_ratio=0.3)
    assert relaxed.execute({})["shards_complete"] == 1


def test_kubernetes_gate_waits_for_stragglers_only_their_grace(run_dir: str) -> None:
    """A straggling pod gets its termination grace to commit, not the whole run deadline (24 h)."""
    from airflow.sdk.exceptions import AirflowFailException
    from batch_inference.sensors import ShardMarkerSensor

    _mark(run_dir, "00000")
    sensor = ShardMarkerSensor(task_id="gate", run_dir=run_dir, wait_for_stragglers="True",
                               straggler_grace_seconds="0.5", deadline_hours="24", deferrable=False,
                               poll_seconds=0.1)
    def poke_until_done() -> None:
        while not sensor.poke({}):
            time.sleep(0.1)

    t0 = time.monotonic()
    with pytest.raises(AirflowFailException, match=r"pods still being deleted had 0.5 s .* 2 shard\(s\) missing"):
        poke_until_done()
    assert time.monotonic() - t0 < 10
    _mark(run_dir, "00001")
    _mark(run_dir, "00002")
    assert sensor.poke({})


def test_name_shards_truncates() -> None:
    ids = [f"{i:05d}" for i in range(25)]
    assert name_shards(ids).endswith("00019 (+5 more)")


def test_bad_input_exit_names_the_cause_and_the_fix(run_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    script = ("import sys; print('2026 ERROR batch_worker: bad config or input (exit 2): engine.model_path: "
              "/nope is not a local model directory with config.json', flush=True); sys.exit(2)")
    monkeypatch.setenv("BATCH_WORKER_COMMAND", f"{sys.executable} -c \"{script}\"")
    with pytest.raises(ShardBadInputError, match=r"shard 00000: engine.model_path: /nope .* Fix: fix the model Param"):
        run_shard(run_dir, "00000")


def test_gate_names_why_each_missing_shard_stopped(run_dir: str) -> None:
    from airflow.sdk.exceptions import AirflowFailException
    from batch_contract.marker import AttemptRecord
    from batch_inference.sensors import ShardMarkerSensor

    layout = RunLayout.from_run_dir(run_dir)
    _mark(run_dir, "00000")
    bad = AttemptRecord(attempt_id="a1", shard_id="00001", started_at="t", status="failed", exit_code=2)
    storage.write_replace(f"{layout.attempts_dir('00001')}/a1.json", bad.to_json_bytes())
    sensor = ShardMarkerSensor(task_id="gate", run_dir=run_dir, wait_for_stragglers="False")
    with pytest.raises(AirflowFailException) as err:
        sensor.execute({})
    text = str(err.value)
    assert "bad config or input (worker exit 2" in text and "the model Param" in text and ": 00001" in text
    assert "no attempt record" in text and "00002" in text


def test_the_gate_takes_its_settings_from_the_run_as_planned(tmp_path: Path) -> None:
    """The plan task's resolved values (recorded in the manifest) win over the templated raw Params."""
    from batch_inference.sensors import ShardMarkerSensor

    plan(PlanRequest(input_uri=str(SAMPLE), id_column="id", text_column="text", output_root=str(tmp_path),
                     run_id="gate-run", engine={"kind": "encoder"}, rows_per_shard=2000, shard_by="rows",
                     params={"min_success_ratio": 0.3, "dry_run": False, "deadline_hours": 24.0}))
    run_dir = RunLayout(str(tmp_path), "gate-run").run_dir
    _mark(run_dir, "00000")
    sensor = ShardMarkerSensor(task_id="gate", run_dir=run_dir, wait_for_stragglers="False",
                               min_success_ratio="1.0", dry_run="True")
    assert sensor.execute({})["shards_complete"] == 1, "planned: not a dry run, 1 of 3 shards is enough"
