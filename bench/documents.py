"""make bench-documents: the document preprocessing stage against a sequential extract-then-infer loop,
and the worker's peak memory as the corpus grows 10x.

A corpus is generated (``bench/doc_corpus.py``) from the bundled sample's real texts: PDFs with a text
layer, HTML pages with boilerplate, image-only (scanned) PDFs that need OCR, and three bad documents
(encrypted, corrupt, blank). Everything runs the real code: the planner writes the document index, the
encoder is the bundled all-MiniLM-L6-v2.

1. **Engine idle share, same process, same corpus, same chunks** (``chunk_rows`` fixed):
   * *pool*: the worker itself (``batch_worker.runtime.run_shard`` in this process): the extraction pool
     runs ahead of the engine; the idle share is the marker's ``engine_wait_seconds / (wait + busy)``;
   * *sequential*: for each chunk, extract its documents one by one in this process, then run the
     engine on them (``prepare`` + ``process``); the idle share is extraction time over the total.
2. **Peak RSS**: ``batch-worker run`` in a fresh process on the 1x and the 10x corpus (one shard each,
   the same fixed ``chunk_rows``), sampling the resident memory of the worker and its pool processes together
   (psutil, every 50 ms); the peak of that sum.

Every run gives the engine ``--threads`` intra-op threads (``BATCH_WORKER_THREADS``, default 1) and the
pool the other CPUs (``pool_workers`` 0: CPUs minus one), so on a small host the pool and the engine do
not fight over the same cores in one variant and not the other.

The last line printed is one JSON object: ``engine_idle_share_pool``, ``engine_idle_share_sequential``,
``idle_share_ratio``, ``peak_rss_mb_1x``, ``peak_rss_mb_10x``, ``rss_ratio_10x_1x`` and the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "plugins"), str(REPO / "worker_image"), str(REPO)]

import psutil  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from batch_contract.hostinfo import host_facts  # noqa: E402
from batch_contract.runstore import RunStore  # noqa: E402
from batch_inference.planner import PlanRequest, plan  # noqa: E402
from batch_worker.engines.base import engine_class  # noqa: E402
from batch_worker.extract import extract_document  # noqa: E402
from batch_worker.preprocess import apply_extraction  # noqa: E402
from batch_worker.reader import iter_shard_blocks  # noqa: E402
from batch_worker.runtime import run_shard  # noqa: E402
from batch_worker.stats import apply_thread_cap  # noqa: E402
from batch_worker.validate import Validator  # noqa: E402

from bench.doc_corpus import write_corpus  # noqa: E402

SAMPLE = REPO / "data" / "sample" / "debian_descriptions_sample.parquet"


def _texts() -> list[str]:
    return pq.read_table(SAMPLE, columns=["text"]).column("text").to_pylist()


def _corpus(folder: Path, docs: int, texts: list[str], seed: int) -> int:
    """A corpus of about ``docs`` documents: 70% text PDFs, 20% HTML, 10% scanned PDFs, plus 3 bad ones."""
    n_scanned = max(1, docs // 10)
    n_html = max(1, docs // 5)
    n_pdf = max(1, docs - n_scanned - n_html)
    counts = write_corpus(folder, texts, n_pdf, n_html, n_scanned, bad=True, seed=seed)
    return sum(counts.values())


def _plan(corpus: Path, out: Path, run_id: str, worker: dict) -> tuple[str, str]:
    request = PlanRequest(input_uri=str(corpus), id_column="id", text_column="text", output_root=str(out),
                          run_id=run_id, engine={"kind": "encoder"}, worker={"reuse": "off", **worker},
                          preprocess="auto", rows_per_shard=10_000_000)
    _, refs = plan(request)
    return refs[0]["run_dir"], refs[0]["shard_id"]


def pool_idle_share(corpus: Path, out: Path, chunk_rows: int) -> dict:
    """The worker's own run (pool ahead of the engine) on ``corpus``: its marker's figures."""
    run_dir, shard = _plan(corpus, out, "pool", {"chunk_rows": chunk_rows})
    t0 = time.perf_counter()
    code = run_shard(run_dir, shard, install_signals=False)
    wall = time.perf_counter() - t0
    if code != 0:
        raise SystemExit(f"pool run exited {code}")
    marker = RunStore.open(run_dir).marker(shard)
    pre = marker.preprocess
    wait, busy = pre["engine_wait_seconds"], pre["engine_busy_seconds"]
    return {"idle_share": wait / (wait + busy), "engine_wait_s": wait, "engine_busy_s": busy, "wall_s": round(wall, 2),
            "rows_ok": marker.rows_ok, "rows_dead_letter": marker.rows_dead_letter,
            "dead_letter_reasons": marker.dead_letter_reasons, "preprocess": pre,
            "stage_seconds": marker.stage_seconds}


def sequential_idle_share(corpus: Path, out: Path, chunk_rows: int) -> dict:
    """Extract each chunk's documents in this process, then run the engine on them; no overlap."""
    run_dir, shard = _plan(corpus, out, "sequential", {"chunk_rows": chunk_rows})
    manifest = RunStore.open(run_dir).manifest
    spec = manifest.input
    engine = engine_class(manifest.engine_config.kind)(manifest.engine_config, manifest.worker)
    engine.load()
    apply_thread_cap()  # the same intra-op threads as the worker's own run
    validator = Validator(spec.id_column, text_column=spec.text_column)
    rows_all = [validator.validate(b).rows for b in iter_shard_blocks(spec, manifest.shard(shard).segments, 8192)]
    idle = busy = 0.0
    n_ok = 0
    for part in rows_all:
        for lo in range(0, len(part), chunk_rows):
            rows = part.take(list(range(lo, min(lo + chunk_rows, len(part)))))
            t0 = time.perf_counter()
            results = [extract_document(uri, spec.documents, spec.roots) for uri in rows.texts]
            kept, _dead = apply_extraction(rows, results, spec.text_column)
            t1 = time.perf_counter()
            if len(kept):
                engine.process(engine.prepare(kept), lambda: False)
            t2 = time.perf_counter()
            idle += t1 - t0
            busy += t2 - t1
            n_ok += len(kept)
    return {"idle_share": idle / (idle + busy), "engine_wait_s": round(idle, 3), "engine_busy_s": round(busy, 3),
            "rows_ok": n_ok}


def peak_rss_mb(corpus: Path, out: Path, run_id: str, chunk_rows: int) -> dict:
    """``batch-worker run`` on ``corpus`` in a fresh process; the peak of the summed RSS of the worker and
    its descendants (pool processes, tesseract), sampled every 50 ms."""
    run_dir, shard = _plan(corpus, out, run_id, {"chunk_rows": chunk_rows})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "plugins"), str(REPO / "worker_image")])}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "batch_worker", "run", "--run-dir", run_dir, "--shard", shard],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ps = psutil.Process(proc.pid)
    peak = worker_peak = 0
    while proc.poll() is None:
        try:
            tree = [ps, *ps.children(recursive=True)]
            rss = {p.pid: p.memory_info().rss for p in tree if p.is_running()}
        except psutil.Error:
            rss = {}
        peak = max(peak, sum(rss.values()))
        worker_peak = max(worker_peak, rss.get(proc.pid, 0))
        time.sleep(0.05)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.returncode != 0:
        raise SystemExit(f"worker exited {proc.returncode}: {err[-2000:]}")
    return {"peak_rss_mb": round(peak / 2**20, 1), "worker_peak_rss_mb": round(worker_peak / 2**20, 1),
            "wall_s": round(time.perf_counter() - t0, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=60, help="documents in the 1x corpus (default 60)")
    parser.add_argument("--rss-chunk-rows", type=int, default=32,
                        help="rows per chunk in the RSS runs (the same for both: memory is bounded by the chunk "
                             "and the pool's window, so the corpus size alone changes)")
    parser.add_argument("--threads", type=int, default=1,
                        help="engine intra-op threads (BATCH_WORKER_THREADS) in every run; the pool gets the "
                             "other CPUs (default 1: on a 2-CPU host one for the engine, one for the pool)")
    parser.add_argument("--scale", type=int, default=10, help="the large corpus is this many times the 1x one")
    parser.add_argument("--chunk-rows", type=int, default=8, help="rows per chunk in the idle-share runs")
    parser.add_argument("--idle-docs", type=int, default=80, help="documents in the idle-share corpus")
    parser.add_argument("--out", default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ["BATCH_WORKER_THREADS"] = str(args.threads)
    texts = _texts()
    started = time.perf_counter()
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-documents-") as tmp:
        root = Path(tmp)
        n_idle = _corpus(root / "idle", args.idle_docs, texts, seed=1)
        seq = sequential_idle_share(root / "idle", root / "out-seq", args.chunk_rows)
        pool = pool_idle_share(root / "idle", root / "out-pool", args.chunk_rows)
        print(f"engine idle share: pool {pool['idle_share']:.3f} (wait {pool['engine_wait_s']:.1f} s, busy "
              f"{pool['engine_busy_s']:.1f} s) vs sequential {seq['idle_share']:.3f} (wait {seq['engine_wait_s']:.1f} s, "
              f"busy {seq['engine_busy_s']:.1f} s) on {n_idle} documents", flush=True)
        n1 = _corpus(root / "c1", args.docs, texts, seed=2)
        rss1 = peak_rss_mb(root / "c1", root / "out-rss", "rss-1x", args.rss_chunk_rows)
        n10 = _corpus(root / "c10", args.docs * args.scale, texts, seed=3)
        rss10 = peak_rss_mb(root / "c10", root / "out-rss", f"rss-{args.scale}x", args.rss_chunk_rows)
        print(f"peak RSS (worker + pool): {rss1['peak_rss_mb']} MB on {n1} documents, {rss10['peak_rss_mb']} MB on "
              f"{n10} documents", flush=True)
    result = {
        "engine_idle_share_pool": round(pool["idle_share"], 4),
        "engine_idle_share_sequential": round(seq["idle_share"], 4),
        "idle_share_ratio": round(pool["idle_share"] / seq["idle_share"], 4) if seq["idle_share"] else None,
        "peak_rss_mb_1x": rss1["peak_rss_mb"],
        "peak_rss_mb_10x": rss10["peak_rss_mb"],
        "rss_ratio_10x_1x": round(rss10["peak_rss_mb"] / rss1["peak_rss_mb"], 4),
        "worker_peak_rss_mb_1x": rss1["worker_peak_rss_mb"],
        "worker_peak_rss_mb_10x": rss10["worker_peak_rss_mb"],
        "documents_idle_run": n_idle, "documents_1x": n1, "documents_10x": n10,
        "chunk_rows": args.chunk_rows, "rss_chunk_rows": args.rss_chunk_rows, "engine_threads": args.threads,
        "pool": {k: pool[k] for k in ("engine_wait_s", "engine_busy_s", "wall_s", "rows_ok", "rows_dead_letter",
                                      "dead_letter_reasons", "preprocess")},
        "sequential": {k: seq[k] for k in ("engine_wait_s", "engine_busy_s", "rows_ok")},
        "rss_wall_s": {"1x": rss1["wall_s"], f"{args.scale}x": rss10["wall_s"]},
        "host": {"cpus": os.cpu_count(), "load_before": [round(x, 2) for x in load0],
                 "load_after": [round(x, 2) for x in os.getloadavg()], "cpu_model": host_facts().get("cpu_model")},
        "seconds": round(time.perf_counter() - started, 1),
    }
    line = json.dumps(result, sort_keys=False)
    if args.out:
        Path(args.out).write_text(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
