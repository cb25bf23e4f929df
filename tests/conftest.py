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


# -- every report.json a test writes is checked against an independent reference ---------------------
# (tests/report_reference.py: schema + rows, worker seconds and cost recomputed from the run's files)

REPORT_CHECK_MARK = "no_report_check"
_CHECKED_DIRS: list[Path] = []
"""Function ``tmp_path`` directories already swept by :func:`check_reports_in_tmp_path`."""
_SWEPT: set[tuple[str, int]] = set()
"""``(path, mtime_ns)`` of reports the module sweep has already looked at."""
_FAILED_MODULES = pytest.StashKey[set]()
"""Stash key: node ids of the test modules with a failed test."""


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{REPORT_CHECK_MARK}: skip the reference check of report.json files this test writes "
        "(a test that writes a broken report on purpose)")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Keep each phase's report on the item, so the report check can skip tests that already failed."""
    rep = yield
    setattr(item, f"_rep_{rep.when}", rep)
    if rep.failed:
        item.session.stash.setdefault(_FAILED_MODULES, set()).add(item.nodeid.split("::", 1)[0])
    return rep


def _check_all(paths: list[Path]) -> None:
    import warnings

    from report_reference import check_report, is_stale

    failures = []
    for path in paths:
        if is_stale(path):
            warnings.warn(f"{path}: run files changed after the report was written; not checked", stacklevel=2)
            continue
        try:
            check_report(path)
        except AssertionError as exc:
            failures.append(str(exc))
    if failures:
        pytest.fail("report.json disagrees with the reference check (tests/report_reference.py):\n"
                    + "\n".join(failures), pytrace=False)


@pytest.fixture(autouse=True)
def check_reports_in_tmp_path(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that uses ``tmp_path``, check every ``runs/<run_id>/report.json`` under it with
    :func:`report_reference.check_report` (unless the test failed already or is marked
    ``no_report_check``). Tests without ``tmp_path`` get none created."""
    tmp = request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames else None
    if tmp is not None:
        _CHECKED_DIRS.append(Path(tmp))
    yield
    call = getattr(request.node, "_rep_call", None)
    if tmp is None or call is None or not call.passed or request.node.get_closest_marker(REPORT_CHECK_MARK):
        return
    from report_reference import find_reports

    _check_all(find_reports(tmp))


@pytest.fixture(autouse=True, scope="module")
def check_reports_in_shared_tmp(request: pytest.FixtureRequest,
                                tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """After each test module, check the ``report.json`` files written into module- or session-scoped
    temp directories (``tmp_path_factory.mktemp``): anywhere under this session's base temp directory
    except the function ``tmp_path`` directories checked per test, each report once per version (path,
    mtime). Skipped when a test of the module failed or when the module is marked ``no_report_check``
    (those reports are then not checked by a later module's sweep either)."""
    yield
    module = request.node.nodeid.split("::", 1)[0]
    skip = (module in request.session.stash.get(_FAILED_MODULES, set())
            or request.node.get_closest_marker(REPORT_CHECK_MARK) is not None)
    from report_reference import find_reports

    found = []
    for path in find_reports(tmp_path_factory.getbasetemp(), skip=_CHECKED_DIRS):
        key = (str(path), path.stat().st_mtime_ns)
        if key not in _SWEPT:
            _SWEPT.add(key)
            found.append(path)
    if not skip:
        _check_all(found)


# -- the slow test files first, so pytest-xdist's workers end together ---------------------------------

SLOW_FIRST_MARKS = ("dagrun",)
"""Test files with a test carrying one of these marks are collected first. pytest-xdist (``--dist
loadfile``) hands files to workers in collection order, so the longest files (real DAG runs, 1-4
minutes each) start at once and the short ones fill the gaps: longest first, not alphabetical, which
ended the main pass with four DAG-run files running on after everything else."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    slow = {item.nodeid.split("::", 1)[0] for item in items
            if any(item.get_closest_marker(m) for m in SLOW_FIRST_MARKS)}
    items.sort(key=lambda item: item.nodeid.split("::", 1)[0] not in slow)  # stable: file order kept
