"""Cost per million rows of recent runs of the same DAG, read from their ``report.json``."""

from __future__ import annotations

from typing import Any

from batch_contract import storage
from batch_contract.layout import RunLayout, join_uri
from batch_contract.runstore import RunStore

MAX_RUNS_SCANNED = 200
"""Run directories read at most (the last ones by name), to bound the listing cost on big roots."""


def recent_runs(output_root: str, dag_id: str, exclude_run_id: str, limit: int = 20) -> list[dict[str, Any]]:
    """Key figures of the latest ``limit`` other runs of ``dag_id`` under ``<output_root>/runs/``.

    Reads ``<output_root>/runs/<dag_id>/*/report.json`` (a DAG's runs) and, for runs planned before run
    directories were namespaced by DAG, ``<output_root>/runs/*/report.json``; runs without a report, with
    another ``dag_id`` or an unreadable report are skipped.

    Returns:
        Oldest first: ``[{"run_id", "generated_at", "rows_published", "cost_usd",
        "cost_per_million_rows_usd"}]``.
    """
    found = []
    for runs_dir in (RunLayout(output_root, exclude_run_id, dag_id).runs_dir, join_uri(output_root, "runs")):
        for run_id in storage.list_names(runs_dir)[-MAX_RUNS_SCANNED:]:
            if run_id == exclude_run_id:
                continue
            try:
                data = RunStore.open(join_uri(runs_dir, run_id)).report()
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError, ValueError):
                continue
            if not isinstance(data, dict) or data.get("dag_id") != dag_id:
                continue
            found.append(
                {
                    "run_id": str(data.get("run_id", run_id)),
                    "generated_at": str(data.get("generated_at", "")),
                    "rows_published": data.get("rows_published"),
                    "cost_usd": data.get("cost_usd"),
                    "cost_per_million_rows_usd": data.get("cost_per_million_rows_usd"),
                }
            )
    found.sort(key=lambda r: (r["generated_at"], r["run_id"]))
    return found[-limit:]
