"""``airflow standalone`` for the browser tests: its own home under a temp dir, free loopback ports,
this repository's DAGs and plugins folder (so the Batch inference plugin loads), SimpleAuthManager with
a known admin password, and a small REST client.

The password is written to ``simple_auth_manager_passwords.json.generated`` in the home before the start:
SimpleAuthManager reads that file and generates only passwords it lacks (Airflow 3.3).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from airflow_rest import AdminRestClient, free_port, http

__all__ = ["BATCH_DAGS", "REPO", "Standalone", "free_port", "http"]

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 300.0
BATCH_DAGS = ("batch_inference_backfill", "batch_inference_nightly", "batch_inference_on_model_upgrade")


@dataclass
class Standalone(AdminRestClient):
    """One ``airflow standalone`` process group.

    Args:
        home: the Airflow home (created).
        extra_env: variables on top of this process's environment.
    """

    home: Path
    extra_env: dict[str, str] = field(default_factory=dict)
    password: str = "ui-test-admin-pw"
    users: dict[str, str] = field(default_factory=dict)
    """Further SimpleAuthManager users' passwords (their roles: ``AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS``
    in ``extra_env``)."""
    port: int = 0
    proc: subprocess.Popen | None = None
    start_seconds: float = 0.0
    _token: str = ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """The environment of the standalone and its components."""
        bin_dir = str(Path(sys.executable).parent)
        env = dict(os.environ)
        env.update({
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
            "PYTHONPATH": os.pathsep.join([str(REPO / "plugins"), str(REPO / "worker_image")]),
            "PATH": bin_dir + os.pathsep + env.get("PATH", ""),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        })
        env.update(self.extra_env)
        return env

    def start(self) -> Standalone:
        """Start and wait until the API answers with a token and the DAG processor has listed the batch
        DAGs; ``start_seconds`` is that wait. Raises ``RuntimeError`` with the log's tail if it does not."""
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "simple_auth_manager_passwords.json.generated").write_text(
            json.dumps({"admin": self.password, **self.users}))
        self.port = self.port or free_port()
        log = open(self.home / "standalone.log", "wb")  # noqa: SIM115 - closed with the process
        t0 = time.monotonic()
        self.proc = subprocess.Popen([sys.executable, "-m", "airflow", "standalone"], env=self.env(), cwd=self.home,
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = t0 + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"airflow standalone exited {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if set(BATCH_DAGS) <= set(self.dag_ids()):
                    self.start_seconds = time.monotonic() - t0
                    return self
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(1.0)
        self.stop()
        raise RuntimeError(f"airflow standalone not ready after {START_TIMEOUT_S:.0f} s:\n{self.log_tail()}")

    def log_tail(self, chars: int = 6000) -> str:
        path = self.home / "standalone.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL what is left after 30 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        pgid = os.getpgid(self.proc.pid)
        os.killpg(pgid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)

    # -- REST API: AdminRestClient ------------------------------------------------------------------

    def task_links(self, dag_id: str, run_id: str, task_id: str) -> dict[str, str | None]:
        rid = urllib.parse.quote(run_id, safe="")
        return self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{rid}/taskInstances/{task_id}/links")["extra_links"]
