"""Pre-flight canary: how close is its projection, what does it cost, does it refuse what it must?

Real MiniLM, real planner, the canary task's own code (``canary_task.canary_and_project``: the
``batch-worker canary`` subprocess at a fan-out worker's thread cap, then the projection) and the local
runner's shard subprocesses (``local_runner.run_shard``, ``auto_parallelism`` workers at once), on:

* **A**: the bundled sample (6,000 Debian package descriptions, ~95 tokens per row);
* **B**: the same ids with only each description's first line (the one-line synopsis, ~10 tokens):
  a differently distributed input, generated here from the bundled sample.

For each input: plan (3,000 rows per shard), canary + projection, fan-out, then the report's
projection-versus-actual section. ``projection_error`` = (projected - actual) / actual fan-out
worker-seconds (the markers' stage seconds, what the report prices). ``canary_share_of_wall`` = the
canary task's wall over (canary + fan-out wall) of input A; ``canary_overhead_share`` the same less
the wall the fan-out would have spent on the canary's rows (they are committed, not redone). Then two more runs of A, each with
``budget_usd`` or ``deadline_hours`` set 10% below its own projection (its canary runs, then the
decision is taken again with the limit): both must be refused, with no shard started. The A canary searches the batch size; B and the refused runs reuse its tuning profile.

The machine is shared: the fan-out's throughput moves with the other processes' load, the canary's
measurement with the load during its few seconds. The result names the load average before and after.

Env: ``BENCH_CANARY_ROWS`` (rows per input, default 6000). Last line: one JSON object; also saved as
``bench/results/canary-<UTC stamp>-cpu-<note>.json`` (``BENCH_NOTE``, default ``shared``).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "plugins"), str(REPO / "worker_image")]

import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from batch_contract.layout import RunLayout  # noqa: E402
from batch_contract.runstore import RunStore  # noqa: E402
from batch_inference.canary_task import canary_and_project  # noqa: E402
from batch_inference.local_runner import auto_parallelism, machine_cores, run_shard  # noqa: E402
from batch_inference.params import ALLOWED_ROOTS_ENV, resolve_run_config  # noqa: E402
from batch_inference.planner import PlanRequest, plan  # noqa: E402
from batch_inference.pricing import cost_params_from_dict  # noqa: E402
from batch_inference.projection import Limits, project  # noqa: E402
from batch_inference.report import build_report  # noqa: E402

SAMPLE = REPO / "data" / "sample" / "debian_descriptions_sample.parquet"
ROWS_PER_SHARD = 3000
TARGET_ERROR = 0.25
TARGET_SHARE = 0.10


def make_inputs(work: Path, rows: int) -> dict[str, Path]:
    """Input A (the sample's first ``rows`` rows) and B (their descriptions' first lines)."""
    table = pq.read_table(SAMPLE, columns=["id", "text"]).slice(0, rows)
    a, b = work / "a.parquet", work / "b.parquet"
    pq.write_table(table, a)
    first = pc.utf8_trim_whitespace(pc.list_element(pc.split_pattern(table.column("text"), "\n"), 0))
    pq.write_table(pa.table({"id": table.column("id"), "text": first}), b)
    return {"A": a, "B": b}


def _cfg(input_uri: Path, out: Path, **params):
    return resolve_run_config({"input_uri": str(input_uri), "output_root": str(out), "reuse": "off",
                               "id_column": "id", "text_column": "text", "engine": "encoder",
                               "duckdb_path": str(out / "w.duckdb"), "rows_per_shard": ROWS_PER_SHARD,
                               "accelerator": "cpu", **params})


def _plan(cfg, run_id: str):
    return plan(PlanRequest(input_uri=cfg.input_uri, id_column="id", text_column="text", output_root=cfg.output_root,
                            run_id=run_id, engine=cfg.engine_dict(), worker={"reuse": cfg.reuse},
                            rows_per_shard=cfg.rows_per_shard, shard_by=cfg.shard_by, params=cfg.to_dict()))


def full_run(name: str, input_uri: Path, out: Path) -> dict:
    """Canary + projection + fan-out + report of one input; the projection-versus-actual figures."""
    cfg = _cfg(input_uri, out)
    manifest, refs = _plan(cfg, f"bench_{name}")
    run_dir = refs[0]["run_dir"]
    t0 = time.perf_counter()
    projection = canary_and_project(cfg, manifest, run_dir)
    canary_wall = time.perf_counter() - t0
    parallelism = auto_parallelism()
    t1 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=parallelism) as pool:
        list(pool.map(lambda r: run_shard(run_dir, r["shard_id"], parallelism=parallelism), refs))
    fanout_wall = time.perf_counter() - t1
    report = build_report(run_dir, dag_id="bench_canary", publish_summary=None, cost_params=cfg.cost_params(),
                          write_html=False)
    section = report["projection"]
    canary = json.loads(Path(RunLayout.from_run_dir(run_dir).canary_uri).read_text())
    # wall the fan-out would have spent on the canary's rows, at the fan-out's own rows per second
    saved = fanout_wall * canary["sample_rows"] / max(manifest.rows - canary["sample_rows"], 1)
    return {
        "rows": manifest.rows, "shards": len(refs), "parallelism": parallelism,
        "mean_tokens_per_row": round(report["tokens"]["input"] / max(manifest.rows, 1), 1),
        "projected_worker_s": section["projected"]["worker_seconds"],
        "actual_worker_s": round(section["actual"]["worker_seconds"], 3),
        "projection_error": section["error"]["worker_seconds"],
        "projected_cost_usd": section["projected"]["cost_usd"], "actual_cost_usd": section["actual"]["cost_usd"],
        "projected_finish_s": projection["finish_seconds"], "actual_wall_s": round(canary_wall + fanout_wall, 2),
        "finish_error": round((canary_wall + projection["finish_seconds"] - projection["canary"]["wall_seconds"]
                               - (canary_wall + fanout_wall)) / (canary_wall + fanout_wall), 4),
        "canary_wall_s": round(canary_wall, 2), "fanout_wall_s": round(fanout_wall, 2),
        "canary_share_of_wall": round(canary_wall / (canary_wall + fanout_wall), 4),
        "canary_overhead_share": round(max(0.0, canary_wall - saved) / (canary_wall + fanout_wall), 4),
        "canary_rows": canary["sample_rows"], "chosen_token_budget": canary["chosen"]["token_budget"],
        "strategy": canary["strategy"], "autotune_s": canary["autotune_seconds"],
        "token_calibration": projection["token_calibration"], "canary_threads": canary["threads"],
    }


def refused_run(name: str, input_uri: Path, out: Path, limit: str) -> dict:
    """A run whose ``budget_usd`` or ``deadline_hours`` is set 10% below its own projection: plan, canary,
    project without the limit, then decide again with the limit (the same ``project`` the canary task
    calls, on the same canary figures). Returns the decision and whether any shard started."""
    cfg = _cfg(input_uri, out)
    manifest, refs = _plan(cfg, f"bench_{name}")
    run_dir = refs[0]["run_dir"]
    free = canary_and_project(cfg, manifest, run_dir)
    value = (free["cost_usd"] * 0.9 if limit == "budget_usd" else free["finish_seconds"] * 0.9 / 3600.0)
    limited = _cfg(input_uri, out, **{limit: value})
    limits = Limits(runner="local", cores=machine_cores(), parallelism=auto_parallelism(), max_gpus=limited.max_gpus,
                    deadline_hours=limited.deadline_hours, budget_usd=limited.budget_usd)
    canary = RunStore.open(run_dir).canary()
    projection = project(canary, manifest, limits, cost_params_from_dict(limited.cost_params()),
                         canary_wall_seconds=free["canary"]["wall_seconds"])
    started = any((Path(run_dir) / "shards" / r["shard_id"] / "attempts").exists() for r in refs)
    return {"limit": {limit: value}, "decision": projection["decision"], "message": projection["message"],
            "shards_started": started}


def main() -> dict:
    rows = int(os.environ.get("BENCH_CANARY_ROWS", "6000"))
    work = Path(tempfile.mkdtemp(prefix="bench-canary-"))
    os.environ[ALLOWED_ROOTS_ENV] = f"{work},{REPO / 'data'}"
    load_before = os.getloadavg()[0]
    try:
        inputs = make_inputs(work, rows)
        out = work / "out"
        per_input = {name: full_run(name, path, out) for name, path in inputs.items()}
        a = per_input["A"]
        budget = refused_run("budget", inputs["A"], out, "budget_usd")
        deadline = refused_run("deadline", inputs["A"], out, "deadline_hours")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {
        "projected_worker_s": a["projected_worker_s"], "actual_worker_s": a["actual_worker_s"],
        "projection_error": a["projection_error"], "projection_error_b": per_input["B"]["projection_error"],
        "chosen_token_budget": a["chosen_token_budget"], "autotune_s": a["autotune_s"],
        "canary_share_of_wall": a["canary_share_of_wall"],
        "canary_overhead_share": a["canary_overhead_share"],
        "budget_refused": budget["decision"] == "refused_budget" and not budget["shards_started"],
        "deadline_refused": deadline["decision"] == "refused_deadline" and not deadline["shards_started"],
        "targets_met": {
            "projection_error": all(abs(v["projection_error"]) <= TARGET_ERROR for v in per_input.values()),
            "canary_share_of_wall": a["canary_share_of_wall"] <= TARGET_SHARE,
            "canary_overhead_share": a["canary_overhead_share"] <= TARGET_SHARE,
        },
        "inputs": per_input, "budget_run": budget, "deadline_run": deadline,
        "load_average_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "cores": os.cpu_count(),
    }
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%MZ")
    path = REPO / "bench" / "results" / f"canary-{stamp}-cpu-{os.environ.get('BENCH_NOTE', 'shared')}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    print(json.dumps(main()))
