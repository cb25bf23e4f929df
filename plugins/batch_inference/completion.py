"""Which shards of a run are complete, read from storage (markers), and the gate's decision."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field

from batch_contract import storage
from batch_contract.layout import MARKER_NAME, RunLayout
from batch_contract.manifest import Manifest

log = logging.getLogger(__name__)
MAX_NAMED = 20
"""Most shard ids spelled out in a message; the rest are counted."""


@dataclass
class CompletionStatus:
    """Completion of one run. Rows are manifest rows; ``ratio = rows_complete / rows_total`` (1.0 when
    the run has no rows)."""

    shards_total: int
    shards_complete: int
    rows_total: int
    rows_complete: int
    min_success_ratio: float
    missing: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return self.rows_complete / self.rows_total if self.rows_total else 1.0

    @property
    def satisfied(self) -> bool:
        return not self.missing or self.ratio >= self.min_success_ratio

    def to_dict(self) -> dict:
        return {**asdict(self), "ratio": self.ratio, "satisfied": self.satisfied}


def name_shards(shard_ids: list[str]) -> str:
    """``"00003, 00007 (+12 more)"``: the first :data:`MAX_NAMED` ids and a count of the rest."""
    head = ", ".join(shard_ids[:MAX_NAMED])
    rest = len(shard_ids) - MAX_NAMED
    return f"{head} (+{rest} more)" if rest > 0 else head


def _complete_ids(layout: RunLayout, manifest: Manifest) -> set[str]:
    """Shard ids with a committed marker. One listing of ``shards/`` then one existence check per
    listed shard directory (a shard without a directory has no marker)."""
    present = set(storage.list_names(layout.shards_dir()))
    done = set()
    for spec in manifest.shards:
        if spec.shard_id in present and MARKER_NAME in storage.list_names(layout.shard_dir(spec.shard_id)):
            done.add(spec.shard_id)
    return done


def check_completion(run_dir: str, min_success_ratio: float = 1.0) -> CompletionStatus:
    """Read the manifest and markers of ``run_dir`` and decide whether the gate opens.

    Raises:
        FileNotFoundError: the run has no manifest (never planned).
    """
    layout = RunLayout.from_run_dir(run_dir)
    manifest = Manifest.from_json_bytes(storage.read_bytes(layout.manifest_uri))
    done = _complete_ids(layout, manifest)
    missing = [s.shard_id for s in manifest.shards if s.shard_id not in done]
    return CompletionStatus(
        shards_total=len(manifest.shards),
        shards_complete=len(done),
        rows_total=manifest.rows,
        rows_complete=sum(s.rows for s in manifest.shards if s.shard_id in done),
        min_success_ratio=min_success_ratio,
        missing=missing,
    )


def progress_line(run_dir: str, status: CompletionStatus) -> str:
    """One log line: shard counts, missing shards, and the live progress summary
    (``batch_inference.progress.format_progress``) when that module is installed."""
    line = (f"shards complete {status.shards_complete}/{status.shards_total}, rows in complete shards "
            f"{status.rows_complete}/{status.rows_total}")
    if status.missing:
        line += f"; missing: {name_shards(status.missing)}"
    try:
        from batch_inference.progress import collect_progress, format_progress
    except ImportError:
        return line
    layout = RunLayout.from_run_dir(run_dir)
    manifest = Manifest.from_json_bytes(storage.read_bytes(layout.manifest_uri))
    summary = collect_progress(run_dir, [s.shard_id for s in manifest.shards])
    return f"{line} | {format_progress(summary)}"
