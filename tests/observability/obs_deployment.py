"""Constants and the figures record of the observability suite (``conftest.py`` sets the deployment up)."""

from __future__ import annotations

import json
from typing import Any

from run_helpers import REPO_ROOT

SUMMARY = REPO_ROOT / "build" / "observability" / "summary.json"
DEADLINE_HOURS = 0.07
"""252 s: after the slow shard's first progress even on a loaded 2-core CI machine (queued -> plan ->
approve -> worker start -> 5 s of encoding took 40-60 s here, and over 144 s at a load average of 12),
before it could finish at 5% speed."""
RUN_TIMEOUT_S = 900.0
DAG_IDS = ("obs_slow", "obs_fail", "obs_budget")

_figures: dict[str, Any] = {}


def record(**figures: Any) -> None:
    """Add ``figures`` to the session's summary (``build/observability/summary.json``)."""
    _figures.update(figures)


def write_summary(passed: bool) -> None:
    """Write ``{"passed", **figures}`` to :data:`SUMMARY` (nothing when no test recorded a figure)."""
    if _figures:
        SUMMARY.parent.mkdir(parents=True, exist_ok=True)
        SUMMARY.write_text(json.dumps({"passed": passed, **_figures}, sort_keys=True, default=str))
