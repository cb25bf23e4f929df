"""Airflow's own services for the live-cluster suite, each its own process: ``api-server``,
``scheduler`` (LocalExecutor), ``triggerer`` and ``dag-processor``, on a PostgreSQL metadata DB, so a
test can kill one of them mid-run and start it again (``make test-k8s``, ``tests/k8s/test_k8s_scheduler_live.py``).

What ``airflow dags test`` does not do and these do: mapped tasks run at once (LocalExecutor, bounded by
``max_active_tis_per_dagrun``), one triggerer holds every deferred pod's trigger, a killed triggerer's
triggers move to the next one after ``[triggerer] triggerer_health_check_threshold``, and a task whose
process died with the scheduler is found by ``[scheduler] task_instance_heartbeat_timeout``. Both are set
to seconds here (:data:`FAST_FAILOVER`), not Airflow's minutes, so a test sees them within its time.

The admin password is written to ``simple_auth_manager_passwords.json.generated`` in the home before the
API server starts (SimpleAuthManager reads it, Airflow 3.3); every component shares one JWT secret, as a
deployment must.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_rest import AdminRestClient, free_port, http

COMPONENTS = ("api-server", "dag-processor", "scheduler", "triggerer")
START_TIMEOUT_S = 300.0
FAST_FAILOVER = {
    "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "10",
    "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "2",
    "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
    "AIRFLOW__SCHEDULER__JOB_HEARTBEAT_SEC": "2",
    "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "10",
    # 60, not 30: at load averages of 10-16 a live task's heartbeats were 30 s apart and the scheduler
    # retried it (a BUDGET EXCEEDED task that must not be retried got a second try)
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "60",
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
    "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "10",
}
"""Failover settings in seconds (Airflow's defaults: 30 s triggerer threshold, 300 s task heartbeat)."""


def sqlalchemy_url(dsn: str, database: str, driver: str = "psycopg") -> str:
    """``postgresql://user@host:port/db`` (``pg_fixture``) as SQLAlchemy's URL for ``database`` with
    ``driver`` (psycopg 3: ``psycopg``, its asyncio form ``psycopg_async``; Airflow would guess asyncpg,
    which is not installed)."""
    parts = urllib.parse.urlsplit(dsn)
    return urllib.parse.urlunsplit((f"postgresql+{driver}", parts.netloc, f"/{database}", "", ""))


def create_database(dsn: str, database: str) -> None:
    """``CREATE DATABASE database`` on the server of ``dsn`` (psycopg 3, autocommit)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as con:
        con.execute(f'CREATE DATABASE "{database}"')


@dataclass
class AirflowServices(AdminRestClient):
    """The four components of one Airflow deployment, each a process group of its own.

    Args:
        home: the Airflow home (created); each component logs to ``<home>/<component>-<n>.log``.
        base_env: the CLI environment (``batch_inference.cli.airflow_env`` plus the runner's settings).
        db_url: the SQLAlchemy URL of an empty PostgreSQL database (:func:`sqlalchemy_url`).
    """

    home: Path
    base_env: dict[str, str]
    db_url: str
    password: str = "services-test-admin-pw"
    port: int = 0
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    starts: dict[str, int] = field(default_factory=dict)
    start_seconds: float = 0.0
    _token: str = ""
    log_ports: dict[str, int] = field(default_factory=lambda: {"worker": free_port(), "trigger": free_port()})
    _jwt_secret: str = field(default_factory=lambda: secrets.token_urlsafe(32))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """The environment every component (and every task it runs) gets."""
        env = dict(self.base_env)
        env.update({
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.db_url,
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": self.db_url.replace("+psycopg:", "+psycopg_async:", 1),
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "16",
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__API_AUTH__JWT_SECRET": self._jwt_secret,
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(self.log_ports["worker"]),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(self.log_ports["trigger"]),
            **FAST_FAILOVER,
        })
        return env

    # -- lifecycle ----------------------------------------------------------------------------------
    def start(self, dag_ids: tuple[str, ...]) -> AirflowServices:
        """Migrate the DB, start every component, and wait until the API answers and lists ``dag_ids``;
        ``start_seconds`` is that wait. Raises ``RuntimeError`` with the logs' tails if it does not."""
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "simple_auth_manager_passwords.json.generated").write_text(json.dumps({"admin": self.password}))
        self.port = self.port or free_port()
        t0 = time.monotonic()
        migrate = subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=self.env(),
                                 capture_output=True, text=True, timeout=600)
        if migrate.returncode != 0:
            raise RuntimeError(f"airflow db migrate exited {migrate.returncode}:\n{migrate.stderr[-4000:]}")
        for name in COMPONENTS:
            self.start_component(name)
        deadline = t0 + START_TIMEOUT_S
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"airflow {name} exited {proc.returncode}:\n{self.log_tail(name)}")
            try:
                if set(dag_ids) <= set(self.dag_ids()):
                    self.start_seconds = time.monotonic() - t0
                    return self
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(1.0)
        tails = "\n".join(f"--- {n}\n{self.log_tail(n, 2000)}" for n in COMPONENTS)
        self.stop()
        raise RuntimeError(f"Airflow services not ready after {START_TIMEOUT_S:.0f} s:\n{tails}")

    def start_component(self, name: str) -> None:
        """Start ``airflow <name>`` in a new session (its own process group)."""
        n = self.starts[name] = self.starts.get(name, 0) + 1
        log = open(self.home / f"{name}-{n}.log", "wb")  # noqa: SIM115 - the child holds it
        self.procs[name] = subprocess.Popen([sys.executable, "-m", "airflow", name], env=self.env(), cwd=self.home,
                                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the component's whole process group (a crashed or evicted pod: its
        LocalExecutor workers and task processes go with the scheduler) and reap it."""
        proc = self.procs[name]
        try:
            os.killpg(os.getpgid(proc.pid), sig)
        except ProcessLookupError:
            pass
        proc.wait(timeout=60)

    def restart(self, name: str, down_seconds: float = 2.0) -> None:
        """:meth:`kill` (SIGKILL), wait ``down_seconds``, start it again."""
        self.kill(name)
        time.sleep(down_seconds)
        self.start_component(name)

    def stop(self) -> None:
        """SIGTERM every component's group, SIGKILL what is left after 30 s."""
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.killpg(os.getpgid(proc.pid), signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 30
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(os.getpgid(proc.pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=30)

    def log_tail(self, name: str, chars: int = 6000) -> str:
        path = self.home / f"{name}-{self.starts.get(name, 1)}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def logs(self, name: str) -> str:
        """Every log of ``name`` (all its starts) concatenated."""
        return "".join((self.home / f"{name}-{n}.log").read_text(errors="replace")
                       for n in range(1, self.starts.get(name, 0) + 1))

    # -- REST API: AdminRestClient ------------------------------------------------------------------

    def run_state(self, dag_id: str, run_id: str) -> str:
        rid = urllib.parse.quote(run_id, safe="")
        return self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{rid}")["state"]

    def wait_run(self, dag_id: str, run_id: str, timeout: float, poll: float = 2.0) -> str:
        """Poll until the run is ``success`` or ``failed``; returns the state. Raises ``TimeoutError``.
        API errors while a component restarts are retried (the API server itself is not restarted)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                state = self.run_state(dag_id, run_id)
            except (OSError, ValueError):
                state = ""
            if state in ("success", "failed"):
                return state
            time.sleep(poll)
        raise TimeoutError(f"{dag_id} {run_id} not finished in {timeout:.0f} s")

    def task_instances(self, dag_id: str, run_id: str, task_id: str) -> dict[int, dict[str, Any]]:
        """``map_index -> task instance`` (the REST API's JSON: ``try_number``, ``state``, ``end_date``...)."""
        rid = urllib.parse.quote(run_id, safe="")
        found = self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{rid}/taskInstances?task_id={task_id}&limit=1000")
        return {int(t["map_index"]): t for t in found["task_instances"] if t["task_id"] == task_id}

    def task_log(self, dag_id: str, run_id: str, task_id: str, map_index: int, try_number: int) -> str:
        """The task log of one try as text (``full_content``)."""
        rid = urllib.parse.quote(run_id, safe="")
        resp = http("GET", f"{self.url}/api/v2/dags/{dag_id}/dagRuns/{rid}/taskInstances/{task_id}/logs/"
                           f"{try_number}?map_index={map_index}&full_content=true", token=self.token())
        if resp.status != 200:
            return ""
        body = resp.json()
        content = body.get("content", "")
        if isinstance(content, list):  # structured log lines: the event plus its fields (error_detail...)
            return "\n".join(json.dumps(c, default=str) if isinstance(c, dict) else str(c) for c in content)
        return str(content)
