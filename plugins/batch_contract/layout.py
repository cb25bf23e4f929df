"""Run layout: where every object of a run lives, as URIs (local path, ``file://`` or ``gs://``).

```
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

RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:+-]{0,199}$")
SHARD_ID_PATTERN = re.compile(r"^[0-9]{5}$")
PART_PREFIX = "part-"
DEAD_LETTER_PREFIX = "dead-letter-"
PARQUET_SUFFIX = ".parquet"
TEMP_MARK = ".tmp-"
MARKER_NAME = "_SUCCESS.json"
PROGRESS_NAME = "_PROGRESS.json"
MANIFEST_NAME = "manifest.json"
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
    if not RUN_ID_PATTERN.match(run_id) or ".." in run_id:
        raise ValueError(
            f"run_id {run_id!r} is not a safe path segment: use letters, digits and _.:+- only"
        )
    return run_id


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

    Args:
        output_root: local directory, ``file://`` URI or ``gs://bucket/prefix``.
        run_id: the Airflow run id (validated by :func:`validate_run_id`).
    """

    output_root: str
    run_id: str

    def __post_init__(self) -> None:
        validate_run_id(self.run_id)

    @classmethod
    def from_run_dir(cls, run_dir: str) -> RunLayout:
        """Inverse of :attr:`run_dir`: ``<root>/runs/<run_id>`` -> layout."""
        trimmed = run_dir.rstrip("/")
        head, _, run_id = trimmed.rpartition("/")
        root, _, runs = head.rpartition("/")
        if runs != "runs" or not run_id:
            raise ValueError(f"run dir {run_dir!r} is not of the form <output_root>/runs/<run_id>")
        return cls(output_root=root or "/", run_id=run_id)

    @property
    def run_dir(self) -> str:
        return join_uri(self.output_root, "runs", self.run_id)

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

    def shards_dir(self) -> str:
        return join_uri(self.run_dir, "shards")

    def shard_dir(self, shard_id: str) -> str:
        if not SHARD_ID_PATTERN.match(shard_id):
            raise ValueError(f"shard id {shard_id!r} is not five digits")
        return join_uri(self.shards_dir(), shard_id)

    def marker_uri(self, shard_id: str) -> str:
        return join_uri(self.shard_dir(shard_id), MARKER_NAME)

    def progress_uri(self, shard_id: str) -> str:
        return join_uri(self.shard_dir(shard_id), PROGRESS_NAME)

    def attempts_dir(self, shard_id: str) -> str:
        return join_uri(self.shard_dir(shard_id), "attempts")
