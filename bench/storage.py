"""Storage benchmark: create-only part commits and directory listing, gs:// (fake-gcs-server) vs local disk.

Run: ``make bench-storage`` (or ``.venv/bin/python bench/storage.py [--commits N] [--objects N]``).

What is measured, in one process, on the same payloads:

* ``commits_per_s``: sequential :func:`batch_contract.storage.write_create_only` of ``--commits`` part
  files (an embedding part file of 32 rows x float32[384], Parquet zstd, about 66 KB each) into one shard
  directory on a fake-gcs-server started on loopback (one ``if_generation_match=0`` multipart upload
  each), as the worker commits its chunks.
* ``list_objects_per_s``: objects per second returned by :func:`batch_contract.storage.list_names` on a
  prefix holding ``--objects`` objects (1,000 per page, so 10 pages for 10,000); the objects are created
  beforehand by 8 threads and not timed.
* The local-disk baseline does the same in a temp directory (temp file + fsync + hard link per commit;
  ``iterdir`` for the listing); ``*_vs_local`` = gs:// rate / local rate.

The last line printed is one JSON object with the figures. The emulator is an in-memory Go server on
the same machine: the numbers measure client + protocol overhead, not GCS latency (tens of ms a write).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "plugins"), str(REPO / "tests")]

import hostbench  # noqa: E402
from batch_contract import storage  # noqa: E402
from batch_contract.layout import PART_PREFIX, part_name  # noqa: E402
from gcs_fixture import FakeGcsServer  # noqa: E402


def part_payload(rows: int = 32, dim: int = 384) -> bytes:
    """A Parquet part file of ``rows`` embeddings (float32[dim]) with ids: the bytes a worker commits."""
    values = pa.array(np.random.default_rng(0).standard_normal(rows * dim, dtype=np.float32))
    table = pa.table(
        {
            "id": [f"row-{i}" for i in range(rows)],
            "embedding": pa.FixedSizeListArray.from_arrays(values, dim),
        }
    )
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    return buf.getvalue()


def time_commits(shard_dir: str, n: int, payload: bytes) -> float:
    """Seconds to commit ``n`` part files create-only, one after another, under ``shard_dir``."""
    start = time.perf_counter()
    for chunk in range(n):
        storage.write_create_only(f"{shard_dir}/{part_name(PART_PREFIX, chunk)}", payload)
    return time.perf_counter() - start


def fill(dir_uri: str, n: int) -> None:
    """Create ``n`` tiny objects under ``dir_uri`` with 8 threads (setup, not timed)."""
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: storage.write_create_only(f"{dir_uri}/obj-{i:06d}.json", b"{}"), range(n)))


def time_list(dir_uri: str, expected: int) -> float:
    """Seconds for one full listing of ``dir_uri``; raises ``RuntimeError`` if the count is wrong."""
    start = time.perf_counter()
    names = storage.list_names(dir_uri)
    elapsed = time.perf_counter() - start
    if len(names) != expected:
        raise RuntimeError(f"listed {len(names)} objects under {dir_uri}, expected {expected}")
    return elapsed


def run(commits: int, objects: int) -> dict[str, float | int | str]:
    payload = part_payload()
    results: dict[str, float | int | str] = {"bench": "storage", "commits": commits, "part_bytes": len(payload)}
    with tempfile.TemporaryDirectory() as tmp:
        local_commit_s = time_commits(f"{tmp}/shards/00000", commits, payload)
        fill(f"{tmp}/listing", objects)
        local_list_s = min(time_list(f"{tmp}/listing", objects) for _ in range(3))
    server = FakeGcsServer().start()
    previous_env = os.environ.get("STORAGE_EMULATOR_HOST")
    os.environ["STORAGE_EMULATOR_HOST"] = server.url
    try:
        root = server.create_bucket(f"bench-{uuid.uuid4().hex[:8]}")
        time_commits(f"{root}/warmup", 5, payload)  # client, connection pool
        gcs_commit_s = time_commits(f"{root}/runs/r/shards/00000", commits, payload)
        fill(f"{root}/listing", objects)
        gcs_list_s = min(time_list(f"{root}/listing", objects) for _ in range(3))
    finally:
        server.stop()
        if previous_env is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = previous_env
    results.update(
        commits_per_s=round(commits / gcs_commit_s, 1),
        local_commits_per_s=round(commits / local_commit_s, 1),
        commits_vs_local=round(local_commit_s / gcs_commit_s, 4),
        list_objects=objects,
        list_objects_per_s=round(objects / gcs_list_s, 1),
        local_list_objects_per_s=round(objects / local_list_s, 1),
        list_vs_local=round(local_list_s / gcs_list_s, 4),
    )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=1000, help="part files to commit (default 1000)")
    parser.add_argument("--objects", type=int, default=10_000, help="objects to list (default 10000)")
    args = parser.parse_args(argv)
    hostbench.start()
    results = run(args.commits, args.objects)
    print(
        f"gs:// {results['commits_per_s']} commits/s vs local {results['local_commits_per_s']}; "
        f"list {results['list_objects_per_s']} objects/s vs local {results['local_list_objects_per_s']}",
        flush=True,
    )
    results["host"] = hostbench.finish()
    print(json.dumps(results), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
