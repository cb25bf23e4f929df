"""A real, throwaway PostgreSQL server for integration tests (``scripts/pg_test_cluster.sh``).

Import the fixture into a test module: ``from pg_fixture import pg_dsn  # noqa: F401``.
``$PG_TEST_DSN`` (an existing server) skips the start/stop. The script installs Debian's
``postgresql`` package when the server binaries are missing (CI runs as root on a fresh machine).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "pg_test_cluster.sh"


def start_cluster() -> tuple[str, str]:
    """Start a cluster; returns ``(dsn, data_dir)``. Raises ``RuntimeError`` with the script's stderr."""
    proc = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"pg_test_cluster.sh start failed ({proc.returncode}): {proc.stderr[-2000:]}")
    env = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    return env["PG_TEST_DSN"], env["PG_TEST_DIR"]


def stop_cluster(data_dir: str) -> None:
    """Stop the cluster and remove its directory."""
    subprocess.run(["bash", str(SCRIPT), "stop", data_dir], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def pg_dsn() -> Iterator[str]:
    """DSN of a running PostgreSQL server, started for the module and stopped after it."""
    if os.environ.get("PG_TEST_DSN"):
        yield os.environ["PG_TEST_DSN"]
        return
    dsn, data_dir = start_cluster()
    try:
        yield dsn
    finally:
        stop_cluster(data_dir)
