"""Helpers shared by test modules (import them: ``from run_helpers import write_run``).

Kept out of ``conftest.py`` because several directories have a ``conftest.py`` and a plain
``from conftest import ...`` picks whichever was collected last.

* ``REPO_ROOT``, ``SAMPLE_PARQUET`` (6,000 real rows: ``id``, ``section``, ``text``).
* :func:`write_run` - write a small run's ``manifest.json`` and return its run dir.
"""

from __future__ import annotations

import dataclasses
import glob
import os
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from batch_contract import storage
from batch_contract.layout import RunLayout, shard_id_for
from batch_contract.manifest import InputFile, InputSpec, Manifest, Segment, ShardSpec
from batch_contract.rows import count_jsonl_rows

REPO_ROOT = Path(__file__).resolve().parents[1]
SAMPLE_PARQUET = REPO_ROOT / "data" / "sample" / "debian_descriptions_sample.parquet"
WORKER_ENV = {
    "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "plugins"), str(REPO_ROOT / "worker_image")]),
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}
"""What a worker or DAG subprocess started by a test needs on top of ``os.environ``: the project on
``PYTHONPATH`` and the model hubs offline."""


def _input_file(path: Path, fmt: str) -> InputFile:
    if fmt == "parquet":
        meta = pq.ParquetFile(path).metadata
        groups = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
        return InputFile(uri=str(path), rows=meta.num_rows, row_group_rows=groups, size_bytes=path.stat().st_size)
    with open(path, "rb") as fh:
        rows = count_jsonl_rows(fh)
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
    input_uri: str | None = None,
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
        input_uri: where the workers read ``input_path`` from when that is not the local file (a copy of it
            in a bucket, for pods that do not share this machine's file system).
    """
    from batch_contract.engine_config import WorkerSettings

    f = _input_file(Path(input_path), fmt)
    if input_uri is not None:
        f = dataclasses.replace(f, uri=input_uri)
    n = f.rows if rows is None else min(rows, f.rows)
    bounds = [round(i * n / shards) for i in range(shards + 1)]
    manifest = Manifest(
        run_id=run_id,
        input=InputSpec(uri=input_uri or str(input_path), format=fmt, id_column=id_column, text_column=text_column, files=[f]),
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


def dag_run_dir(output_root: str | Path, run_id: str) -> Path:
    """The run directory of DAG run ``run_id`` under ``output_root`` (``runs/<dag_id>/<run_id>``, the DAG
    found on disk); fails unless exactly one DAG has a run of that id there."""
    found = sorted(Path(output_root).glob(f"runs/*/{glob.escape(run_id)}"))
    assert len(found) == 1, f"expected one runs/<dag_id>/{run_id} under {output_root}, found {found}"
    return found[0]
