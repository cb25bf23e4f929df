"""Benchmark: publish 1,000,000 rows x 384-dim float32 embeddings into DuckDB, PostgreSQL and Iceberg.

Builds a synthetic run following the data contract (10 shards, 100,000-row part files written with the
worker's encodings from ``batch_contract.schemas.parquet_write_options``, embeddings that are random unit
vectors like a normalised model output, a few dead letters), publishes it with :func:`batch_inference.publish.publish_run` into a DuckDB file and into a
throwaway PostgreSQL cluster (``scripts/pg_test_cluster.sh``, or ``$PG_TEST_DSN`` if set), and compares
with a naive baseline in the same process: row-by-row ``executemany`` INSERTs of Python lists on a
small slice (the way a first version would load rows).

Figures: rows/s = published rows / wall seconds of ``publish_run`` (coverage check, staging load,
primary key, swap). ``peak_rss_mb`` is this process's peak resident set (``ru_maxrss``), which includes
DuckDB's memory; the PostgreSQL server's own memory is a separate process and not counted. The Iceberg
publish runs in a child process: ``iceberg_peak_rss_mb`` is that process's peak alone. CPU seconds
and the load average are printed too: on a shared machine the wall-clock rates fall with the load.
Last line: one JSON object.

What bounds the DuckDB load (issue #22: 221k rows/s on one host, 106k on another of the same kind) is
timed step by step in the same process, on the same part files, in a DuckDB file configured like
publish's (:func:`duckdb_profile`): a plain ``read_parquet`` scan that decodes every column, the same
scan with the cast to ``FLOAT[384]``, the table write (uncompressed, committed: the WAL/checkpoint and
its fsync), the primary-key build, and a plain sequential write + fsync of as many bytes as the table
(:func:`disk_write`), each with its CPU seconds (CPU seconds / wall near the core count means
CPU-bound, well below it means waiting on the disk). ``duckdb_vs_raw_parquet_scan``,
``duckdb_vs_plain_table_write`` and ``duckdb_vs_disk_write`` are the publish's rows/s over each
baseline's: figures that mean the same on a faster or slower host. ``host``
holds the host facts and memory bandwidth (:mod:`hostbench`).

Usage: ``make bench-publish`` (env ``BENCH_PUBLISH_ROWS`` overrides the row count).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "plugins"))
sys.path.insert(0, str(REPO / "tests"))  # synthetic_runs: test-data generation, not shipped in plugins/

import hostbench  # noqa: E402
from batch_contract.layout import RunLayout  # noqa: E402
from batch_inference.publish import PublishTarget, publish_run  # noqa: E402
from synthetic_runs import RunSpec, build_run, write_input  # noqa: E402

ROWS = int(os.environ.get("BENCH_PUBLISH_ROWS", "1000000"))
DIM = 384
NAIVE_ROWS = 2000


def peak_rss_mb() -> float:
    """Peak resident set size of this process in MiB (Linux reports ``ru_maxrss`` in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_seconds() -> float:
    """User + system CPU seconds of this process (all its threads, DuckDB's included)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def start_pg() -> tuple[str, str | None]:
    """DSN of a PostgreSQL server: ``$PG_TEST_DSN`` or a throwaway cluster (returns its dir to stop)."""
    if os.environ.get("PG_TEST_DSN"):
        return os.environ["PG_TEST_DSN"], None
    out = subprocess.run(["bash", str(REPO / "scripts/pg_test_cluster.sh"), "start"], check=True,
                         capture_output=True, text=True).stdout
    env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return env["PG_TEST_DSN"], env["PG_TEST_DIR"]


def naive_postgres(dsn: str, n: int) -> float:
    """Rows/s of row-by-row ``executemany`` INSERTs (embedding as a Python list) on ``n`` rows."""
    import psycopg

    rng = np.random.default_rng(0)
    rows = [(f"naive-{i}", "f" * 32, 10, False, False, rng.standard_normal(DIM, dtype=np.float32).tolist())
            for i in range(n)]
    with psycopg.connect(dsn) as conn:
        conn.execute("DROP TABLE IF EXISTS naive_baseline")
        conn.execute("CREATE TABLE naive_baseline (id text PRIMARY KEY, fingerprint text, n_tokens integer, "
                     "truncated boolean, text_repaired boolean, embedding real[])")
        start = time.perf_counter()
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO naive_baseline VALUES (%s, %s, %s, %s, %s, %s::real[])", rows)
        conn.commit()
        seconds = time.perf_counter() - start
        conn.execute("DROP TABLE naive_baseline")
    return n / seconds


def naive_duckdb(path: str, n: int) -> float:
    """Rows/s of row-by-row ``executemany`` INSERTs into DuckDB on ``n`` rows."""
    import duckdb

    rng = np.random.default_rng(0)
    rows = [(f"naive-{i}", "f" * 32, 10, False, False, rng.standard_normal(DIM, dtype=np.float32).tolist())
            for i in range(n)]
    con = duckdb.connect(path)
    con.execute(f"CREATE OR REPLACE TABLE naive_baseline (id VARCHAR PRIMARY KEY, fingerprint VARCHAR, "
                f"n_tokens INTEGER, truncated BOOLEAN, text_repaired BOOLEAN, embedding FLOAT[{DIM}])")
    start = time.perf_counter()
    con.executemany("INSERT INTO naive_baseline VALUES (?, ?, ?, ?, ?, ?)", rows)
    seconds = time.perf_counter() - start
    con.execute("DROP TABLE naive_baseline")
    con.close()
    return n / seconds


def _timed(con, sql: str, params: dict | None = None) -> dict[str, float]:
    """Run ``sql`` to completion; wall and CPU seconds of this process (DuckDB's threads included)."""
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    con.execute(sql, params or {}).fetchall()
    wall = time.perf_counter() - t0
    return {"wall_s": round(wall, 3), "cpu_s": round(cpu_seconds() - cpu0, 3)}


def duckdb_profile(run_dir: str, work: Path) -> dict:
    """Steps of a DuckDB load of the run's part files, timed alone (see the module docstring).

    Returns ``{step: {"wall_s", "cpu_s", "rows_per_s"}}`` for ``scan`` (every column decoded: ``id``,
    ``fingerprint`` and the first float of each embedding), ``scan_cast`` (plus the cast to
    ``FLOAT[dim]``), ``write`` (``CREATE TABLE AS`` with the cast, uncompressed, committed) and
    ``primary_key`` (``ALTER TABLE ... ADD PRIMARY KEY``), plus ``table_bytes`` (the database file after
    the write). Rows are the part files' rows.
    """
    from batch_inference.publish.duckdb_backend import connect
    from batch_inference.publish.target import PublishTarget

    parts = sorted(str(p) for p in Path(run_dir).glob("shards/*/part-*.parquet"))
    path = work / "profile.duckdb"
    con = connect(PublishTarget(backend="duckdb", table="profile", duckdb_path=str(path)))
    params = {"parts": parts}
    rows = con.execute("SELECT count(*) FROM read_parquet($parts)", params).fetchall()[0][0]
    scan = "FROM read_parquet($parts)"
    cast = f"CAST(embedding AS FLOAT[{DIM}])"
    steps = {
        "scan": _timed(con, f"SELECT max(id), max(fingerprint), sum(n_tokens), sum(embedding[1]) {scan}", params),
        "scan_cast": _timed(con, f"SELECT max(id), max(fingerprint), sum(n_tokens), sum({cast}[1]) {scan}", params),
    }
    con.execute("SET force_compression = 'uncompressed'")
    steps["write"] = _timed(con, f"CREATE TABLE t AS SELECT id, fingerprint, n_tokens, truncated, text_repaired, "
                                 f"{cast} AS embedding {scan}", params)
    steps["primary_key"] = _timed(con, 'ALTER TABLE t ADD PRIMARY KEY ("id")')
    con.close()
    steps["disk_write"] = disk_write(work / "disk_write.bin", path.stat().st_size)
    for step in steps.values():
        step["rows_per_s"] = round(rows / max(step["wall_s"], 1e-9))
    steps["table_bytes"] = path.stat().st_size
    return steps


def disk_write(path: Path, nbytes: int, block: int = 8 << 20) -> dict[str, float]:
    """Sequential write of ``nbytes`` (the table's size) to ``path`` in ``block``-byte writes, then
    ``fsync``: the disk's bound on a load that must write that many bytes (wall and CPU seconds)."""
    buf = os.urandom(block)
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for _ in range(max(1, nbytes // block)):
            os.write(fd, buf)
        os.fsync(fd)
    finally:
        os.close(fd)
    wall = time.perf_counter() - t0
    path.unlink()
    return {"wall_s": round(wall, 3), "cpu_s": round(cpu_seconds() - cpu0, 3),
            "mb_per_s": round(max(1, nbytes // block) * block / wall / 1e6, 1)}


def generate(work: Path) -> None:
    """Write the input file and the synthetic run (10 shards, 100,000-row part files, 2 dead letters)."""
    ids = pa.array([f"row-{i:08d}" for i in range(ROWS)], pa.string())
    inp = write_input(work / "input.parquet", ids)
    build_run(work / "out", "bench", inp, RunSpec(task="embedding", dim=DIM, shards=10, chunk_rows=100_000,
                                                  dead_rows={1, ROWS // 2 + 1}, unit_embeddings=True))


def main() -> None:
    hostbench.start()
    work = Path(tempfile.mkdtemp(prefix="bench-publish-"))
    pg_dir = None
    try:
        t0 = time.perf_counter()
        # generated in a child process so peak_rss_mb measures publishing, not the fixture
        subprocess.run([sys.executable, __file__, "--generate", str(work)], check=True)
        # the worker fsyncs every part file it commits; flush the generator's dirty pages the same way,
        # or their write-back competes with the publish being timed
        os.sync()
        layout = RunLayout(str(work / "out"), "bench")
        print(f"generated {ROWS:,} rows x {DIM} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)

        load_before = os.getloadavg()[0]
        cpu0 = cpu_seconds()
        duck = publish_run(layout.run_dir, PublishTarget(backend="duckdb", table="embeddings",
                                                         duckdb_path=str(work / "bench.duckdb")))
        duck_cpu = cpu_seconds() - cpu0
        duck_rps = duck["rows_published"] / duck["publish_seconds"]
        print(f"duckdb: {json.dumps(duck)}", file=sys.stderr)
        profile = duckdb_profile(layout.run_dir, work)
        print(f"duckdb steps: {json.dumps(profile)}", file=sys.stderr)

        dsn, pg_dir = start_pg()
        cpu0 = cpu_seconds()
        pg = publish_run(layout.run_dir, PublishTarget(backend="postgres", table="embeddings", dsn=dsn))
        pg_cpu = cpu_seconds() - cpu0
        pg_rps = pg["rows_published"] / pg["publish_seconds"]
        print(f"postgres: {json.dumps(pg)}", file=sys.stderr)

        ice = json.loads(subprocess.run([sys.executable, __file__, "--iceberg", str(work)], check=True,
                                        capture_output=True, text=True).stdout.splitlines()[-1])
        ice_rps = ice["rows_published"] / ice["publish_seconds"]
        print(f"iceberg: {json.dumps(ice)}", file=sys.stderr)

        naive_pg = naive_postgres(dsn, NAIVE_ROWS)
        naive_duck = naive_duckdb(str(work / "naive.duckdb"), NAIVE_ROWS)
        result = {
            "rows": duck["rows_published"],
            "dim": DIM,
            "duckdb_rows_per_s": round(duck_rps),
            "postgres_rows_per_s": round(pg_rps),
            "iceberg_rows_per_s": round(ice_rps),
            "peak_rss_mb": round(peak_rss_mb(), 1),
            "iceberg_peak_rss_mb": ice["peak_rss_mb"],
            "iceberg_publish_seconds": ice["publish_seconds"],
            "iceberg_process_cpu_seconds": ice["cpu_seconds"],
            "duckdb_publish_seconds": duck["publish_seconds"],
            "duckdb_stage_seconds": duck.get("stage_seconds"),
            "duckdb_vs_raw_parquet_scan": round(duck_rps / profile["scan"]["rows_per_s"], 3),
            "duckdb_vs_plain_table_write": round(duck_rps / profile["write"]["rows_per_s"], 3),
            "duckdb_vs_disk_write": round(duck_rps / profile["disk_write"]["rows_per_s"], 3),
            "duckdb_steps": profile,
            "postgres_publish_seconds": pg["publish_seconds"],
            "baseline": f"row-by-row executemany of {NAIVE_ROWS} rows, same process",
            "naive_duckdb_rows_per_s": round(naive_duck, 1),
            "naive_postgres_rows_per_s": round(naive_pg, 1),
            "duckdb_speedup_vs_naive": round(duck_rps / naive_duck, 1),
            "postgres_speedup_vs_naive": round(pg_rps / naive_pg, 1),
            "duckdb_process_cpu_seconds": round(duck_cpu, 1),
            "postgres_client_cpu_seconds": round(pg_cpu, 1),
            "load_avg_1m_at_start": round(load_before, 1),
            "cpu_cores": os.cpu_count(),
            "host": hostbench.finish(),
            "targets_met": duck_rps >= 200_000 and pg_rps >= 30_000 and peak_rss_mb() <= 2048
            and ice_rps >= 100_000 and ice["peak_rss_mb"] <= 2048,
        }
    finally:
        if pg_dir:
            subprocess.run(["bash", str(REPO / "scripts/pg_test_cluster.sh"), "stop", pg_dir], check=False,
                           capture_output=True)
        subprocess.run(["rm", "-rf", str(work)], check=False)
    print(json.dumps(result))


def iceberg(work: Path) -> None:
    """Publish the generated run into an Iceberg warehouse under ``work`` (SQLite catalog) in this
    (child) process, so its peak RSS is Iceberg's alone; prints the summary with ``peak_rss_mb`` and
    ``cpu_seconds``."""
    cpu0 = cpu_seconds()
    target = PublishTarget(backend="iceberg", table="embeddings", iceberg_warehouse=str(work / "iceberg" / "wh"))
    summary = publish_run(RunLayout(str(work / "out"), "bench").run_dir, target)
    summary.update(peak_rss_mb=round(peak_rss_mb(), 1), cpu_seconds=round(cpu_seconds() - cpu0, 1))
    print(json.dumps(summary))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--generate":
        generate(Path(sys.argv[2]))
    elif len(sys.argv) == 3 and sys.argv[1] == "--iceberg":
        iceberg(Path(sys.argv[2]))
    else:
        main()
