"""``require_approval`` in a real Airflow run: the ``approve`` task (Airflow's ``ApprovalOperator``) waits
after the canary; a person answers it the way the UI's Required Actions page does, through the Core API
(``PATCH .../taskInstances/approve/-1/hitlDetails``, served by Airflow's own FastAPI app as a signed-in
user), from a second process sharing the metadata database.

``dag.test()`` runs in one subprocess (it keeps the run alive while the task is ``awaiting_input``), the
answering "person" in another: it lists the pending request (``GET .../hitlDetails``), prints what the UI
would show (subject, body) and answers. Approve: every shard runs and the table is published. Reject: no
shard starts, the gate fails saying who rejected it, ``approval.json`` records it. No answer: the
request's deadline (the TI's ``trigger_timeout``) is moved into the past, as time would move it, and
the scheduler's own timeout sweep (``SchedulerJobRunner.check_awaiting_input_timeouts``) answers with the
default, Reject. With ``require_approval`` on but no projection (canary off) nothing waits.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import airflow_test_home
import pytest
from run_helpers import dag_run_dir
from test_canary_dag import RUN_DAG, run_dag

pytestmark = [pytest.mark.integration, pytest.mark.dagrun]

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "data" / "sample" / "debian_descriptions_sample.parquet"
DAG_ID = "batch_inference_backfill"


ANSWER = textwrap.dedent("""
    import json, sys, time
    from fastapi.testclient import TestClient
    from airflow.api_fastapi.app import create_app, get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    dag_id, answer, user, wait = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    app = create_app(apps="core")
    with TestClient(app) as client:
        token = get_auth_manager().generate_jwt(SimpleAuthManagerUser(username=user, role="admin"))
        client.headers["Authorization"] = f"Bearer {token}"
        end, items, seen = time.time() + wait, [], []
        while time.time() < end and not items:
            r = client.get(f"/api/v2/dags/{dag_id}/dagRuns/~/hitlDetails",
                           params={"task_id": "approve", "response_received": False})
            assert r.status_code == 200, r.text
            # The request row is written while the task is still running, just before it defers: wait
            # until the task waits for input, as a person would see it on the Required Actions page.
            seen = r.json()["hitl_details"]
            items = [i for i in seen if i["task_instance"]["state"] == "awaiting_input"]
            if not items:
                time.sleep(1)
        assert items, f"no approval request reached awaiting_input: {seen!r}"
        item = items[0]
        ti = item["task_instance"]
        print("REQUEST " + json.dumps({k: item[k] for k in ("subject", "body", "options", "defaults", "multiple")}
                                      | {"run_id": ti["dag_run_id"], "state": ti["state"]}), flush=True)
        if answer != "TIMEOUT":
            r = client.patch(f"/api/v2/dags/{dag_id}/dagRuns/{ti['dag_run_id']}/taskInstances/approve/-1/hitlDetails",
                             json={"chosen_options": [answer], "params_input": {}})
            print("ANSWER " + json.dumps({"status": r.status_code, "body": r.json()}), flush=True)
            sys.exit(0)
    # Nobody answers: move the request's deadline (the TI's trigger_timeout) into the past, as time would,
    # and run the scheduler's own timeout sweep once.
    from datetime import timedelta
    from sqlalchemy import select
    from airflow.jobs.job import Job
    from airflow.jobs.scheduler_job_runner import SchedulerJobRunner
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils import timezone
    from airflow.utils.session import create_session
    with create_session() as session:
        row = session.scalars(select(TaskInstance).where(TaskInstance.run_id == ti["dag_run_id"],
                                                         TaskInstance.task_id == "approve")).one()
        left_h = (row.trigger_timeout - timezone.utcnow()).total_seconds() / 3600.0
        row.trigger_timeout = timezone.utcnow() - timedelta(seconds=1)
    SchedulerJobRunner(job=Job()).check_awaiting_input_timeouts()
    print("ANSWER " + json.dumps({"status": "timeout", "hours_left_before": left_h}), flush=True)
""")


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return airflow_test_home.airflow_env(tmp_path_factory.mktemp("airflow_home_approval"), {
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "alice:admin",
        "AIRFLOW__API_AUTH__JWT_SECRET": "approval-test-secret",
    })


def _conf(tmp_path: Path, **kw) -> dict:
    conf = {"input_uri": str(SAMPLE), "output_root": str(tmp_path / "out"),
            "duckdb_path": str(tmp_path / "out" / "warehouse.duckdb"), "runner": "local", "reuse": "off",
            "rows_per_shard": 100, "row_limit": 200, "shard_by": "rows", "output_table": "emb_approval",
            "canary_min_rows": 40, "accelerator": "nvidia-l4", "require_approval": True}
    conf.update(kw)
    return conf


def _result(stdout: str, out: str) -> dict:
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, out[-6000:]
    return json.loads(lines[-1][len("RESULT "):])


def _run_and_answer(conf: dict, env: dict[str, str], answer: str, user: str = "alice") -> tuple[dict, dict, dict, str]:
    """Run the DAG with ``dag.test()`` and answer its approval request as ``user``; returns
    ``(run result, request as the API listed it, the API's answer, the run's log)``."""
    run = subprocess.Popen([sys.executable, "-c", RUN_DAG, DAG_ID, json.dumps(conf), str(REPO / "dags")], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        person = subprocess.run([sys.executable, "-c", ANSWER, DAG_ID, answer, user, "600"], env=env,
                                capture_output=True, text=True, timeout=700)
        stdout, stderr = run.communicate(timeout=900)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    out = stdout + stderr
    said = {k: json.loads(line.split(" ", 1)[1]) for line in person.stdout.splitlines()
            for k in ("REQUEST", "ANSWER") if line.startswith(k + " ")}
    assert "REQUEST" in said and "ANSWER" in said, person.stdout[-3000:] + person.stderr[-6000:] + out[-3000:]
    return _result(stdout, out), said["REQUEST"], said["ANSWER"], out


def _shards_started(run_dir: Path) -> list[str]:
    return sorted(p.parent.parent.name for p in run_dir.glob("shards/*/attempts/*.json"))


def test_an_approved_run_shows_the_projection_then_runs_every_shard_and_publishes(tmp_path: Path,
                                                                                  airflow_env: dict[str, str]) -> None:
    result, request, answer, out = _run_and_answer(_conf(tmp_path), airflow_env, "Approve")
    assert result["state"].endswith("success"), out[-6000:]
    assert request["state"] == "awaiting_input" and request["options"] == ["Approve", "Reject"]
    assert request["defaults"] == ["Reject"], "no answer by the deadline rejects"
    run_dir = dag_run_dir(tmp_path / "out", result["run_id"])
    projection = json.loads((run_dir / "projection.json").read_text())
    chosen = projection["chosen"]
    assert request["subject"].startswith(f"Approve batch run {result['run_id']}: ${chosen['cost_usd']:.4g} (spot)")
    body = request["body"]
    for figure in (f"${chosen['cost_spot_usd']:.6g}", f"${chosen['cost_on_demand_usd']:.6g}",
                   f"{chosen['worker_seconds']:,.1f}", f"{chosen['gpu_hours']:.4g}",
                   f"{chosen['finish_seconds'] / 3600.0:.3f} h", f"{projection['canary']['token_budget']:,}",
                   projection["message"], "200 rows in 2 shard(s)"):
        assert figure in body, (figure, body)
    assert answer["status"] == 200 and answer["body"]["responded_by"]["name"] == "alice"
    assert result["tasks"]["approve"].endswith("success")
    assert _shards_started(run_dir) == ["00000", "00001"]
    report = json.loads((run_dir / "report.json").read_text())
    assert report["rows_published"] == 200
    approval = json.loads((run_dir / "approval.json").read_text())
    assert approval["decision"] == "approved" and approval["responded_by"]["name"] == "alice"
    assert approval["timed_out"] is False and approval["projection"]["cost_usd"] == chosen["cost_usd"]
    assert report["approval"]["responded_by"] == approval["responded_by"]  # the report says who and when
    assert report["approval"]["responded_at"] == approval["responded_at"] and report["approval"]["decision"] == "approved"
    assert f"approved by {approval['responded_by']['name']}" in out  # the summary task's log
    assert f"Approval: approved by {approval['responded_by']['name']}" in (run_dir / "report.html").read_text()


def test_a_rejected_run_starts_no_shard_and_the_gate_says_who_rejected_it(tmp_path: Path,
                                                                          airflow_env: dict[str, str]) -> None:
    result, request, answer, out = _run_and_answer(_conf(tmp_path), airflow_env, "Reject", user="bob")
    assert answer["status"] == 200, answer
    assert result["state"].endswith("failed"), out[-6000:]
    tasks = result["tasks"]
    assert tasks["canary"].endswith("success") and tasks["approve"].endswith("success")
    assert tasks["choose_runner"].endswith("skipped")
    assert all(v.endswith("skipped") for k, v in tasks.items() if k.startswith("infer_local")), tasks
    assert tasks["wait_for_shards"].endswith("failed") and not tasks.get("publish", "").endswith("success")
    run_dir = dag_run_dir(tmp_path / "out", result["run_id"])
    assert _shards_started(run_dir) == [], "no shard worker started"
    assert not list(run_dir.glob("shards/*/_SUCCESS.json"))
    approval = json.loads((run_dir / "approval.json").read_text())
    assert approval["decision"] == "rejected" and approval["responded_by"]["name"] == "bob"
    assert "completion gate: nothing to wait for: REJECTED (approval): bob rejected the projection ($" in out
    assert "no shard was started" in out


def test_with_no_projection_to_approve_nothing_waits(tmp_path: Path, airflow_env: dict[str, str]) -> None:
    result, out = run_dag(_conf(tmp_path, canary=False), airflow_env, DAG_ID)
    assert result["state"].endswith("success"), out[-6000:]
    assert result["tasks"]["approve"].endswith("success")
    assert "approval not asked: the canary was skipped (the canary Param is off)" in out
    run_dir = dag_run_dir(tmp_path / "out", result["run_id"])
    assert not (run_dir / "approval.json").exists()
    assert "Waiting for Human-in-the-loop input" not in out
    assert json.loads((run_dir / "report.json").read_text())["approval"] is None
    assert "Approval: not required" in (run_dir / "report.html").read_text()


def test_without_an_answer_the_scheduler_rejects_at_the_runs_deadline(tmp_path: Path,
                                                                     airflow_env: dict[str, str]) -> None:
    result, request, answer, out = _run_and_answer(_conf(tmp_path, deadline_hours=2.0), airflow_env, "TIMEOUT")
    assert 1.5 < answer["hours_left_before"] <= 2.0, "the request waits until the run's deadline"
    assert result["state"].endswith("failed"), out[-6000:]
    tasks = result["tasks"]
    assert tasks["approve"].endswith("success") and tasks["choose_runner"].endswith("skipped")
    run_dir = dag_run_dir(tmp_path / "out", result["run_id"])
    assert _shards_started(run_dir) == []
    approval = json.loads((run_dir / "approval.json").read_text())
    assert approval["decision"] == "rejected" and approval["timed_out"] is True and approval["responded_by"] is None
    assert "REJECTED (approval): nobody answered the approval request for the projection ($" in out
