"""Shared test fixtures.

* ``sample_parquet`` - path of ``data/sample/debian_descriptions_sample.parquet`` (6,000 real rows:
  ``id`` int64, ``section`` string, ``text`` string).
* :func:`write_run` - write a small run's ``manifest.json`` under ``tmp_path`` and return its run dir;
  usable from any test (``from conftest import write_run``) or through the ``make_run`` fixture.
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

import pyarrow.parquet as pq
import pytest
from batch_contract import storage
from batch_contract.layout import RunLayout, shard_id_for
from batch_contract.manifest import InputFile, InputSpec, Manifest, Segment, ShardSpec

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO_ROOT = Path(__file__).resolve().parents[1]
SAMPLE_PARQUET = REPO_ROOT / "data" / "sample" / "debian_descriptions_sample.parquet"
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


def _input_file(path: Path, fmt: str) -> InputFile:
    if fmt == "parquet":
        meta = pq.ParquetFile(path).metadata
        groups = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
        return InputFile(uri=str(path), rows=meta.num_rows, row_group_rows=groups, size_bytes=path.stat().st_size)
    with open(path, "rb") as fh:
        rows = sum(1 for line in fh if line.strip())
    return InputFile(uri=str(path), rows=rows, size_bytes=path.stat().st_size)


def write_run(
    root: Path,
    input_path: Path,
    *,
    rows: int | None = None,
    shards: int = 1,
    fmt: str = "parquet",
    engine: dict[str, Any] | None = None,
    worker: dict[str, Any] | None = None,
    run_id: str = "test_run",
    id_column: str = "id",
    text_column: str = "text",
) -> str:
    """Write ``<root>/runs/<run_id>/manifest.json`` for one input file and return the run dir.

    Args:
        root: output root (e.g. ``tmp_path``).
        input_path: one Parquet or JSONL file.
        rows: use only the first ``rows`` rows (default: all).
        shards: split those rows into this many contiguous shards (``00000``...).
        fmt: ``parquet`` or ``jsonl``.
        engine: engine config dict (default: the encoder with defaults, i.e. MiniLM embeddings).
        worker: ``WorkerSettings`` fields (default: defaults).
    """
    from batch_contract.engine_config import WorkerSettings

    f = _input_file(Path(input_path), fmt)
    n = f.rows if rows is None else min(rows, f.rows)
    bounds = [round(i * n / shards) for i in range(shards + 1)]
    manifest = Manifest(
        run_id=run_id,
        input=InputSpec(uri=str(input_path), format=fmt, id_column=id_column, text_column=text_column, files=[f]),
        shards=[
            ShardSpec(shard_id=shard_id_for(i), segments=[Segment(0, bounds[i], bounds[i + 1])])
            for i in range(shards)
        ],
        engine=engine or {"kind": "encoder"},
        worker=WorkerSettings(**(worker or {})),
    )
    layout = RunLayout(output_root=str(root), run_id=run_id)
    storage.write_replace(layout.manifest_uri, manifest.to_json_bytes())
    return layout.run_dir


@pytest.fixture
def make_run(tmp_path: Path):
    """``make_run(input_path, **kwargs) -> run_dir``: :func:`write_run` rooted at ``tmp_path``."""

    def _make(input_path: Path, **kwargs: Any) -> str:
        return write_run(tmp_path, input_path, **kwargs)

    return _make
