"""Local runner parallelism: N shards of the sample started at once (as a real executor starts mapped
tasks), run through :func:`batch_inference.local_runner.run_shard` at each parallelism; prints one JSON
line per setting with the wall time and the threads the workers recorded.

``PYTHONPATH=plugins:worker_image .venv/bin/python bench/local_parallelism.py --rows 500 --shards 3``
(``BATCH_WORKER_THREADS=2`` with ``--parallelism 3`` reproduces the uncapped behaviour on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "plugins"), str(REPO / "worker_image")]
os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO / "plugins"), str(REPO / "worker_image"),
                                            os.environ.get("PYTHONPATH", "")])
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import hostbench  # noqa: E402
from batch_contract.runstore import RunStore  # noqa: E402
from batch_inference.local_runner import auto_parallelism, run_shard  # noqa: E402
from batch_inference.planner import PlanRequest, plan  # noqa: E402

SAMPLE = REPO / "data" / "sample" / "debian_descriptions_sample.parquet"


def measure(parallelism: int, rows: int, shards: int, out: str) -> dict:
    """Plan ``shards`` x ``rows`` of the sample, run them all at once at ``parallelism``; the figures."""
    run_id = f"p{parallelism}-{time.strftime('%H%M%S')}"
    manifest, refs = plan(PlanRequest(input_uri=str(SAMPLE), id_column="id", text_column="text", output_root=out,
                                      run_id=run_id, engine={"kind": "encoder"}, rows_per_shard=rows,
                                      shard_by="rows", row_limit=rows * shards))
    run_dir = refs[0]["run_dir"]
    t0 = time.monotonic()
    with ThreadPoolExecutor(len(refs)) as pool:
        results = list(pool.map(lambda r: run_shard(run_dir, r["shard_id"], parallelism=parallelism), refs))
    wall = time.monotonic() - t0
    threads = sorted({a.get("threads", 0) for m in RunStore.open(run_dir).markers().values() for a in m.attempts})
    return {"parallelism": parallelism, "effective": parallelism or auto_parallelism(),
            "threads_env": os.environ.get("BATCH_WORKER_THREADS"), "threads_recorded": threads,
            "shards": len(refs), "rows": manifest.rows, "wall_s": round(wall, 1),
            "shard_s": [round(r.seconds, 1) for r in results], "load_1m": round(os.getloadavg()[0], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=500, help="rows per shard")
    parser.add_argument("--shards", type=int, default=3)
    parser.add_argument("--parallelism", type=int, nargs="+", default=[1, 2, 0], help="0: auto")
    args = parser.parse_args()
    hostbench.start()
    with tempfile.TemporaryDirectory() as out:
        for p in args.parallelism:
            result = measure(p, args.rows, args.shards, out)
            if p == args.parallelism[-1]:  # the last line carries the host, its load before and after
                result["host"] = hostbench.finish()
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
