"""``python -m scripts.k8s.cluster up --env-file F``: what ``make`` targets and shells start the cluster with."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from kubernetes import client, config

from scripts.k8s.cluster import REPO_ROOT

pytestmark = [pytest.mark.k8s, pytest.mark.integration]


def read_env(path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if line)


def test_cli_up_writes_env_file_and_stops_everything_on_sigterm(k8s_cluster, tmp_path):
    # k8s_cluster: the binary is built (or the suite skipped) before this test starts a second cluster
    env_file, work = tmp_path / "env", tmp_path / "work"
    # the session's cluster holds the shared image store: this one would import the worker image into a
    # store of its own (a minute or more), which this test does not need
    proc = subprocess.Popen([sys.executable, "-m", "scripts.k8s.cluster", "up", "--env-file", str(env_file),
                             "--work-dir", str(work), "--no-worker-image"], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                            text=True)
    try:
        status = json.loads(proc.stdout.readline())
        env = read_env(env_file)
        assert env["BATCH_K8S_API_SERVER"] == status["server"]
        assert 0 < status["started_in_s"] < 90
        nodes = client.CoreV1Api(config.new_client_from_config(env["KUBECONFIG"])).list_node().items
        assert [n.metadata.name for n in nodes] == ["gpu-spot-node-0"]
        triggerer = client.CoreV1Api(config.new_client_from_config(env["BATCH_K8S_KUBECONFIG_AIRFLOW_TRIGGERER"]))
        assert triggerer.list_namespaced_pod("batch-inference").items == []
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
    assert not env_file.exists()
    deadline = time.monotonic() + 10
    while True:  # the API server's port is closed: everything the CLI started has stopped
        try:
            urllib.request.urlopen(status["server"] + "/readyz", timeout=1)
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, ConnectionRefusedError):
                break
        assert time.monotonic() < deadline, "kube-apiserver still answers after the CLI stopped"
        time.sleep(0.2)
    assert (work / "logs" / "kube-apiserver.log").exists()  # a given --work-dir is kept
