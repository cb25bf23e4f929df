"""Run layout: where every object of a run lives, as URIs (local path, ``file://`` or ``gs://``).

```
<output_root>/runs/<dag_id>/<run_id>/manifest.json  (a run of a DAG; <output_root>/runs/<run_id>/ without one)
<output_root>/runs/<run_id>/manifest.json
<output_root>/runs/<run_id>/shards/<shard_id>/part-<chunk>-<uuid>.parquet      committed chunks
<output_root>/runs/<run_id>/shards/<shard_id>/dead-letter-<chunk>-<uuid>.parquet rejected rows
<output_root>/runs/<run_id>/shards/<shard_id>/attempts/<attempt_id>.json       one per worker start
<output_root>/runs/<run_id>/shards/<shard_id>/_PROGRESS.json                   live progress
<output_root>/runs/<run_id>/shards/<shard_id>/_SUCCESS.json                    completion marker
<output_root>/runs/<run_id>/report.json, report.html
<output_root>/runs/<run_id>/canary.json, projection.json                         pre-flight canary
<output_root>/profiles/<kind>-<model digest>-<device>.json                       autotune profiles
```

A part file name carries its chunk number (``part-00003-<uuid>``) so files sort by commit order, and a
random suffix so two attempts of the same chunk never collide (publish de-duplicates by id).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:+-]{0,199}")
"""A run id: one safe path segment (matched whole with ``fullmatch``: no trailing newline slips in)."""
DAG_ID_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,249}")
"""A DAG id as Airflow allows it (letters, digits, ``_.-``; at most 250 characters), matched whole."""
SHARD_ID_PATTERN = re.compile(r"[0-9]{5}")
"""A shard id: five digits, matched whole with ``fullmatch``."""
PART_PREFIX = "part-"
DEAD_LETTER_PREFIX = "dead-letter-"
PARQUET_SUFFIX = ".parquet"
TEMP_MARK = ".tmp-"
MARKER_NAME = "_SUCCESS.json"
PROGRESS_NAME = "_PROGRESS.json"
MANIFEST_NAME = "manifest.json"
APPROVAL_NAME = "approval.json"
"""The run's approval record (``batch_inference.approval``), beside ``projection.json``."""
REUSED_MARK = "reuse-"
"""Infix of a part file holding rows carried over from the result cache (:func:`part_name`)."""


def join_uri(base: str, *parts: str) -> str:
    """Join URI/path segments with ``/`` without doubling separators."""
    out = base.rstrip("/")
    for part in parts:
        out = f"{out}/{part.strip('/')}"
    return out


def shard_id_for(index: int) -> str:
    """Shard id of the ``index``-th shard: five zero-padded digits (``"00007"``)."""
    if not 0 <= index < 100_000:
        raise ValueError(f"shard index {index} out of range 0..99999")
    return f"{index:05d}"


def validate_run_id(run_id: str) -> str:
    """Return ``run_id`` if it is safe as one path segment, else raise ``ValueError``.

    Airflow run ids such as ``manual__2026-11-30T02:43:00+00:00`` pass; ``/``, ``..`` and spaces do not.
    """
    if not isinstance(run_id, str) or not RUN_ID_PATTERN.fullmatch(run_id) or ".." in run_id:
        raise ValueError(
            f"run_id {run_id!r} is not a safe path segment: use letters, digits and _.:+- only"
        )
    return run_id


def validate_dag_id(dag_id: str) -> str:
    """Return ``dag_id`` if it is a DAG id Airflow accepts and a safe path segment, else raise ``ValueError``."""
    if not isinstance(dag_id, str) or not DAG_ID_PATTERN.fullmatch(dag_id) or ".." in dag_id or dag_id == "runs":
        raise ValueError(f"dag_id {dag_id!r} is not a safe path segment: use letters, digits and _.- only")
    return dag_id


def part_name(kind_prefix: str, chunk: int, reused: bool = False) -> str:
    """File name for a new part or dead-letter file of chunk ``chunk`` (unique per call).

    ``reused=True`` names a part whose rows were carried over from the result cache
    (``part-<chunk>-reuse-<uuid>.parquet``, see :mod:`batch_contract.resultcache`); it is an ordinary
    part file for every reader, and :func:`is_reused_part` tells the marker which rows were not computed.
    """
    mark = REUSED_MARK if reused else ""
    return f"{kind_prefix}{chunk:05d}-{mark}{uuid.uuid4().hex[:12]}{PARQUET_SUFFIX}"


def is_reused_part(name: str) -> bool:
    """Whether a committed part file name was written by :func:`part_name` with ``reused=True``."""
    return name.startswith(PART_PREFIX) and name[len(PART_PREFIX):].split("-", 1)[-1].startswith(REUSED_MARK)


def chunk_of(name: str) -> int | None:
    """Chunk number of a committed part/dead-letter file name, or ``None`` for any other name."""
    if TEMP_MARK in name or not name.endswith(PARQUET_SUFFIX):
        return None
    for prefix in (PART_PREFIX, DEAD_LETTER_PREFIX):
        if name.startswith(prefix):
            digits = name[len(prefix) :].split("-", 1)[0]
            return int(digits) if digits.isdigit() else None
    return None


@dataclass(frozen=True)
class RunLayout:
    """URIs of one run's objects under ``output_root``.

    A DAG's runs live in a directory of their own, ``<output_root>/runs/<dag_id>/<run_id>``, so two DAGs
    sharing an output root never share a run directory even when their run ids are equal (a backfill
    that reuses another DAG's run id plans afresh instead of reusing that DAG's manifest). A run without
    a DAG (a benchmark, the worker's tests) lives in ``<output_root>/runs/<run_id>``.

    Args:
        output_root: local directory, ``file://`` URI or ``gs://bucket/prefix``.
        run_id: the Airflow run id (validated by :func:`validate_run_id`).
        dag_id: the DAG whose run it is (validated by :func:`validate_dag_id`), or ``None``.

    Raises:
        ValueError: an unsafe run id or DAG id.
    """

    output_root: str
    run_id: str
    dag_id: str | None = None

    def __post_init__(self) -> None:
        validate_run_id(self.run_id)
        if self.dag_id is not None:
            validate_dag_id(self.dag_id)

    @classmethod
    def from_run_dir(cls, run_dir: str) -> RunLayout:
        """Inverse of :attr:`run_dir`: ``<root>/runs/<dag_id>/<run_id>`` or ``<root>/runs/<run_id>``.

        Raises:
            ValueError: ``run_dir`` has neither form, or its ids are unsafe.
        """
        parts = run_dir.rstrip("/").split("/")
        if len(parts) >= 3 and parts[-2] == "runs" and parts[-1]:
            return cls(output_root="/".join(parts[:-2]) or "/", run_id=parts[-1])
        if len(parts) >= 4 and parts[-3] == "runs" and parts[-1] and parts[-2]:
            return cls(output_root="/".join(parts[:-3]) or "/", run_id=parts[-1], dag_id=parts[-2])
        raise ValueError(f"run dir {run_dir!r} is not of the form <output_root>/runs/<dag_id>/<run_id>")

    @property
    def runs_dir(self) -> str:
        """The directory holding this run's directory and its sibling runs (of the same DAG, if any)."""
        if self.dag_id is None:
            return join_uri(self.output_root, "runs")
        return join_uri(self.output_root, "runs", self.dag_id)

    @property
    def run_dir(self) -> str:
        return join_uri(self.runs_dir, self.run_id)

    @property
    def manifest_uri(self) -> str:
        return join_uri(self.run_dir, MANIFEST_NAME)

    @property
    def report_json_uri(self) -> str:
        return join_uri(self.run_dir, "report.json")

    @property
    def report_html_uri(self) -> str:
        return join_uri(self.run_dir, "report.html")

    @property
    def quality_report_uri(self) -> str:
        return join_uri(self.run_dir, "quality_gate.json")

    @property
    def canary_uri(self) -> str:
        """The pre-flight canary's measurements (:class:`batch_contract.canary.CanaryResult`)."""
        return join_uri(self.run_dir, "canary.json")

    @property
    def projection_uri(self) -> str:
        """The plan's projection and decision (``batch_inference.projection``)."""
        return join_uri(self.run_dir, "projection.json")

    @property
    def approval_uri(self) -> str:
        """The run's approval record (``batch_inference.approval``)."""
        return join_uri(self.run_dir, APPROVAL_NAME)

    def shards_dir(self) -> str:
        return join_uri(self.run_dir, "shards")

    def shard_dir(self, shard_id: str) -> str:
        if not isinstance(shard_id, str) or not SHARD_ID_PATTERN.fullmatch(shard_id):
            raise ValueError(f"shard id {shard_id!r} is not five digits")
        return join_uri(self.shards_dir(), shard_id)

    def marker_uri(self, shard_id: str) -> str:
        return join_uri(self.shard_dir(shard_id), MARKER_NAME)

    def progress_uri(self, shard_id: str) -> str:
        return join_uri(self.shard_dir(shard_id), PROGRESS_NAME)

    def attempts_dir(self, shard_id: str) -> str:
        return join_uri(self.shard_dir(shard_id), "attempts")
