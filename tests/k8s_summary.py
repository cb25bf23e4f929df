"""Print the live-cluster suite's figures as one JSON line (the last line of ``make test-k8s``).

Usage: ``python tests/k8s_summary.py FIGURES_JSON [--seconds S]``. The figures are what the tests in
``tests/k8s`` recorded (``k8s_live.record``); the issue's keys come first, in its order, ``null`` when a
test did not record its figure (it failed or was deselected); extra figures follow. ``--seconds``: the
suite's wall time, added as ``suite_seconds``. Exit 0 always: the pytest run's exit code is what fails
``make test-k8s``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

KEYS = ("node", "image_digest", "shards", "shards_complete", "pods_created", "rows_input", "rows_published", "rows_dead_letter",
        "equal_to_local", "preemptions", "preemption_retries_consumed", "exit2_pods", "orphan_pods",
        "reattach_duplicate_pods", "unschedulable_failed_in_s", "max_concurrent_pods", "triggerer_restarts",
        "scheduler_restarts", "duplicate_pods", "budget_stop_pods_after_stop", "oom_killed", "oom_classified")
"""The keys issues 14, 27 and 28 ask for, in their order."""


def summary(figures: dict, seconds: float | None = None) -> dict:
    """The issue's keys first (``None`` when missing), then the other figures, then ``suite_seconds``."""
    out = {k: figures.get(k) for k in KEYS}
    out.update({k: v for k, v in sorted(figures.items()) if k not in out})
    if seconds is not None:
        out["suite_seconds"] = round(seconds, 1)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("figures", type=Path)
    ap.add_argument("--seconds", type=float)
    args = ap.parse_args(argv)
    figures = json.loads(args.figures.read_text()) if args.figures.exists() else {}
    print(json.dumps(summary(figures, args.seconds)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
