"""Shared test fixtures.

* ``sample_parquet`` - path of ``data/sample/debian_descriptions_sample.parquet`` (6,000 real rows:
  ``id`` int64, ``section`` string, ``text`` string).
* ``make_run`` - :func:`run_helpers.write_run` rooted at ``tmp_path`` (import ``write_run`` itself from
  ``run_helpers``, never from ``conftest``: several directories have a ``conftest.py``).
* ``allowed_storage_roots`` (autouse, session) - sets ``BATCH_INFERENCE_ALLOWED_ROOTS`` (the params'
  allow-list of storage roots) to the repository's ``data/`` and ``output/``, this session's pytest
  temporary directory and the placeholder bucket ``gs://b`` of the params unit tests, so DAG runs
  (which copy ``os.environ`` into their Airflow subprocesses) may use ``tmp_path``. ``gcs_bucket`` adds
  its fresh bucket for its test.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from run_helpers import REPO_ROOT, SAMPLE_PARQUET, write_run

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

ALLOWED_ROOTS_ENV = "BATCH_INFERENCE_ALLOWED_ROOTS"
PLACEHOLDER_BUCKET = "gs://b"
"""The bucket the params unit tests name in ``gs://`` URIs (never contacted)."""


@pytest.fixture(scope="session", autouse=True)
def allowed_storage_roots(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Allow the repository's data/output, this session's pytest temp dir and ``gs://b`` as storage
    roots for the whole session (not the system temp dir as a whole); restores the previous value."""
    roots = [str(REPO_ROOT / "data"), str(REPO_ROOT / "output"),
             os.path.realpath(tmp_path_factory.getbasetemp()), PLACEHOLDER_BUCKET]
    previous = os.environ.get(ALLOWED_ROOTS_ENV)
    os.environ[ALLOWED_ROOTS_ENV] = ",".join(roots)
    try:
        yield os.environ[ALLOWED_ROOTS_ENV]
    finally:
        if previous is None:
            os.environ.pop(ALLOWED_ROOTS_ENV, None)
        else:
            os.environ[ALLOWED_ROOTS_ENV] = previous


@pytest.fixture(scope="session")
def sample_parquet() -> Path:
    """The bundled 6,000-row Debian descriptions sample (id, section, text)."""
    assert SAMPLE_PARQUET.is_file(), f"missing {SAMPLE_PARQUET}"
    return SAMPLE_PARQUET


@pytest.fixture
def make_run(tmp_path: Path):
    """``make_run(input_path, **kwargs) -> run_dir``: :func:`write_run` rooted at ``tmp_path``."""

    def _make(input_path: Path, **kwargs: Any) -> str:
        return write_run(tmp_path, input_path, **kwargs)

    return _make
