"""Storage benchmark: create-only part commits and directory listing on every scheme: local disk, gs://
(fake-gcs-server), s3:// (moto's S3 server) and az:// (Azurite), each emulator on loopback.

Run: ``make bench-storage`` (or ``.venv/bin/python bench/storage.py [--commits N] [--objects N]
[--schemes gs,s3,az]``).

What is measured, in one process, on the same payloads, per scheme (JSON keys ``local``, ``gs``, ``s3``,
``azure``):

* ``commits_per_s``: sequential :func:`batch_contract.storage.write_create_only` of ``--commits`` part
  files (an embedding part file of 32 rows x float32[384], Parquet zstd, about 66 KB each) into one shard
  directory, as the worker commits its chunks: locally temp file + fsync + hard link; on gs:// one
  ``if_generation_match=0`` upload; on s3:// and az:// one ``If-None-Match: *`` PUT.
* ``list_objects_per_s``: objects per second returned by :func:`batch_contract.storage.list_names` on a
  prefix holding ``--objects`` objects (1,000 per page on the object stores, so 10 pages for 10,000); the
  objects are created beforehand by 8 threads and not timed.
* ``commits_vs_local`` / ``list_vs_local``: the scheme's rate / local disk's rate in the same process.

The last line printed is one JSON object with the figures. The emulators run on the same machine (a Go
server, a Python server, a Node.js server): the numbers measure client + protocol + emulator overhead,
not the cloud services' latency (tens of ms a write), and the emulators differ from each other far more
than the real services do.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "plugins"), str(REPO / "tests")]

import hostbench  # noqa: E402
import object_stores  # noqa: E402 - the tests' emulator wrappers
from batch_contract import storage  # noqa: E402
from batch_contract.layout import PART_PREFIX, part_name  # noqa: E402


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


REPORT_KEYS = {"gs": "gs", "s3": "s3", "az": "azure"}
"""Scheme -> key of its figures in the JSON line."""


def measure(root: str, commits: int, objects: int, payload: bytes) -> dict[str, float]:
    """Commit and listing rates under ``root`` (any scheme): a warm-up, then the timed commits, then
    the best of three listings of ``objects`` objects."""
    time_commits(f"{root}/warmup", 5, payload)  # client, connection pool
    commit_s = time_commits(f"{root}/runs/r/shards/00000", commits, payload)
    fill(f"{root}/listing", objects)
    list_s = min(time_list(f"{root}/listing", objects) for _ in range(3))
    return {"commits_per_s": round(commits / commit_s, 1), "list_objects_per_s": round(objects / list_s, 1)}


def run(commits: int, objects: int, schemes: tuple[str, ...] = object_stores.SCHEMES) -> dict:
    """Every scheme's rates (one emulator at a time) and, per scheme, the ratios to local disk."""
    payload = part_payload()
    results: dict = {"bench": "storage", "commits": commits, "list_objects": objects, "part_bytes": len(payload)}
    with tempfile.TemporaryDirectory() as tmp:
        local = results["local"] = measure(tmp, commits, objects, payload)
    for scheme in schemes:
        with object_stores.started(scheme) as store:
            figures = measure(store.new_root("bench"), commits, objects, payload)
        figures["commits_vs_local"] = round(figures["commits_per_s"] / local["commits_per_s"], 4)
        figures["list_vs_local"] = round(figures["list_objects_per_s"] / local["list_objects_per_s"], 4)
        results[REPORT_KEYS[scheme]] = figures
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=1000, help="part files to commit (default 1000)")
    parser.add_argument("--objects", type=int, default=10_000, help="objects to list (default 10000)")
    parser.add_argument("--schemes", default=",".join(object_stores.SCHEMES),
                        help="remote schemes to measure, comma-separated (default gs,s3,az)")
    args = parser.parse_args(argv)
    hostbench.start()
    results = run(args.commits, args.objects, tuple(s for s in args.schemes.split(",") if s))
    for key in ("local", *(REPORT_KEYS[s] for s in object_stores.SCHEMES)):
        if key in results:
            print(f"{key}: {results[key]['commits_per_s']} commits/s, {results[key]['list_objects_per_s']} "
                  "listed objects/s", flush=True)
    results["host"] = hostbench.finish()
    print(json.dumps(results), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
