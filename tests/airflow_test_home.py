"""Airflow homes for the tests that run real Airflow (``dag.test()`` in a subprocess).

``airflow db migrate`` of a fresh SQLite home takes 5-15 s on a 2-core machine and every DAG test module
needs a home of its own; the schema depends only on the installed Airflow. :func:`airflow_env` migrates
one template database per Airflow version and interpreter (kept under ``$BATCH_CACHE_DIR``, by default
``~/.cache/airflow-batch-inference``, behind a file lock, so parallel pytest-xdist workers and later
test runs on the same machine share it) and copies it into each new home (milliseconds).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path

from run_helpers import REPO_ROOT

DB_NAME = "airflow.db"
"""The SQLite file of a home whose ``sql_alchemy_conn`` is Airflow's default (``$AIRFLOW_HOME/airflow.db``)."""


def cache_dir() -> Path:
    """``$BATCH_CACHE_DIR/airflow-db`` (default ``~/.cache/airflow-batch-inference/airflow-db``)."""
    root = os.environ.get("BATCH_CACHE_DIR") or str(Path.home() / ".cache" / "airflow-batch-inference")
    return Path(root) / "airflow-db"


def _template_key() -> str:
    version = metadata.version("apache-airflow")
    digest = hashlib.sha256(f"{sys.executable}|{version}".encode()).hexdigest()[:12]
    return f"airflow-{version}-{digest}"


def base_env(home: Path, **extra: str) -> dict[str, str]:
    """``os.environ`` plus what every test home sets: the home, the repository's DAGs, no examples, the
    project on ``PYTHONPATH``, this interpreter's ``bin`` first on ``PATH``, offline model hubs; ``extra``
    last (it may override any of them)."""
    env = dict(os.environ)
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(home / "plugins"),  # not plugins/: see batch_inference.cli
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "plugins"), str(REPO_ROOT / "worker_image")]),
        "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    })
    env.update(extra)
    return env


def migrated_db() -> Path:
    """The template database, migrated once per Airflow version and interpreter (file-locked).

    Raises:
        subprocess.CalledProcessError: ``airflow db migrate`` failed.
    """
    target = cache_dir() / _template_key() / DB_NAME
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.is_file():
            return target
        build = target.parent / "home"
        shutil.rmtree(build, ignore_errors=True)
        build.mkdir()
        subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=base_env(build), check=True,
                       capture_output=True, timeout=600)
        os.replace(build / DB_NAME, target)
        shutil.rmtree(build, ignore_errors=True)
    return target


def airflow_env(home: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A ready Airflow home at ``home`` (created; the migrated template database copied in) and the
    environment for subprocesses that use it (:func:`base_env` with ``extra``)."""
    home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(migrated_db(), home / DB_NAME)
    return base_env(home, **dict(extra or {}))
