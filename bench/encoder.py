"""Encoder throughput benchmark: the worker end to end against a naive loop and sentence-transformers.

In one process, on the same rows (default 3,000 sampled with seed 0 from
``$BATCH_FULL_PARQUET``, default ``../shared/data/debian_descriptions.parquet`` beside the repository, else
the bundled 6,000-row sample):

(a) naive loop: random order, fp32, ``torch.no_grad``, batch 64, padding to the batch's longest row;
(b) sentence-transformers ``encode`` in the worker's dtype on this host (bfloat16 where the CPU runs it
    natively, its best setting on the dev machine; float32 elsewhere: emulated bf16 is many times slower
    and would flatter the worker), batch 64;
(c) the worker end to end (``batch_worker.runtime.run_shard``: read the shard, tokenize, sort, batch,
    infer, commit parts, write the marker), with the manifest's defaults (bf16 where supported).

Each contender first encodes ``WARMUP_ROWS`` rows untimed (see there). The worker and
sentence-transformers are then timed ``--repeats`` times (default 3) and the best run counts, as the
matmul peak (in the same dtype) is the best of 5: on a shared 2-core machine single runs of either moved by 15%.

Short texts (issue #22): ``--short-rows`` (default 10,000) rows cut from the same data set's texts
(:func:`short_corpus`: first sentence, at most 160 characters, 5% empty), through the worker in this
process and, for the fixed per-shard cost a real run pays, once through the worker CLI in a fresh
process, and through sentence-transformers. Reported under ``short``: rows/s and the ratio to
sentence-transformers, ``padding_efficiency``, ``load_share`` (the marker's ``model_load`` over the
worker's wall time, in this process: imports already warm) and ``fresh_process`` (the CLI run: its
``load_share`` of the process's wall, and ``load_seconds`` step by step: imports, tokenizer, model
code, weights, fast path). The main corpus reports the same ``padding_efficiency`` and ``load_share``.

Then, in a subprocess, the worker on a 64,000-row shard to measure its peak RSS (``VmHWM`` of the
worker process, polled every 0.5 s; ``--rss-rows``; the run is stopped with SIGTERM after
``--rss-seconds`` if it has not finished, which also exercises the preemption path). The last line printed is one JSON object:

``rows``, ``naive_rows_per_s``, ``st_rows_per_s``, ``worker_rows_per_s`` (excluding model load; the
figure including it is ``worker_rows_per_s_with_load``), ``vs_naive``, ``vs_sentence_transformers``,
``padding_efficiency`` (real / processed tokens, from the marker), ``mfu`` (real tokens/s x FLOPs per
token (:func:`flops_per_token`) / matmul FLOP/s measured in this run in the worker's dtype: ``matmul_gflops``
and ``matmul_dtype``; ``bf16_matmul_gflops`` is the same figure, kept only where that dtype is bfloat16),
``peak_rss_mb`` and ``rss_rows_done``,
``load_share`` (the marker's ``model_load`` over the worker's wall time), ``fast_path`` (what the worker
picked on this host: implementation, attention per length class, linears per shape, load steps),
``batch_overhead`` (:func:`batch_overhead`: the per-batch cost the exact planner weighs), ``short`` (above) and
``host`` (:mod:`hostbench`: CPU, caches, bf16/AMX, memory bandwidth, load before and after).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins"), str(ROOT / "worker_image"), str(ROOT / "tests")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import hostbench  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import torch  # noqa: E402

SHARED_DATA = Path(os.environ.get("BATCH_FULL_PARQUET", ROOT.parent / "shared" / "data" / "debian_descriptions.parquet"))
SAMPLE_DATA = ROOT / "data" / "sample" / "debian_descriptions_sample.parquet"
MAX_LENGTH = 256
BATCH = 64
WARMUP_ROWS = 200
"""Rows each contender encodes, untimed, before its timed run: the first batches of a process pay for
oneDNN's kernel generation (about 1.5 s here), which a real shard amortises and a 3,000-row run does
not; whichever contender ran first would otherwise carry it alone."""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def load_rows(n: int, seed: int = 0) -> pa.Table:
    """``n`` rows (id, text) sampled without replacement (seed ``seed``) from the shared data set."""
    path = SHARED_DATA if SHARED_DATA.is_file() else SAMPLE_DATA
    table = pq.read_table(path, columns=["id", "text"])
    rng = np.random.default_rng(seed)
    idx = np.sort(rng.choice(table.num_rows, size=min(n, table.num_rows), replace=False))
    log(f"data: {path} ({table.num_rows} rows), using {len(idx)}")
    return table.take(pa.array(idx))


SHORT_MAX_CHARS = 160
SHORT_EMPTY_SHARE = 0.05
SHORT_REPEATS = 2
"""Timed runs of the worker and sentence-transformers on the short corpus (best counts)."""


def short_text(text: str) -> str:
    """The first sentence (or line) of ``text``, cut at a word boundary to at most
    :data:`SHORT_MAX_CHARS` characters: the length of a package summary or a search query."""
    first = text.strip().split("\n", 1)[0]
    end = first.find(". ")
    first = first[: end + 1] if end >= 0 else first
    if len(first) > SHORT_MAX_CHARS:
        first = first[:SHORT_MAX_CHARS].rsplit(" ", 1)[0]
    return first


def short_corpus(n: int, seed: int = 2) -> pa.Table:
    """``n`` short texts (:func:`short_text` of the data set's texts, drawn with replacement, fresh
    ids), :data:`SHORT_EMPTY_SHARE` of them empty (dead letters, as in real short-text data)."""
    base = load_rows(10**9).column("text").to_pylist()
    rng = np.random.default_rng(seed)
    texts = [short_text(base[i]) for i in rng.integers(0, len(base), size=n)]
    for i in rng.choice(n, size=int(n * SHORT_EMPTY_SHARE), replace=False):
        texts[i] = ""
    return pa.table({"id": [f"s{i}" for i in range(n)], "text": texts})


def fresh_process_run(rows: pa.Table, workdir: Path) -> dict:
    """The worker CLI on one shard of ``rows`` in a fresh Python process (what a pod or the local runner
    starts): process wall seconds, the marker's stage seconds and engine ``load_seconds``, and
    ``load_share`` = ``model_load`` / process wall (the process's start, imports included, counts)."""
    from batch_contract.marker import ShardMarker
    from run_helpers import write_run

    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "fresh_input.parquet"
    pq.write_table(rows, path)
    run_dir = write_run(workdir, path, run_id="bench_fresh")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "plugins"), str(ROOT / "worker_image")]))
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "batch_worker", "run", "--run-dir", run_dir, "--shard", "00000"],
                   env=env, check=True, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    marker = ShardMarker.from_json_bytes((Path(run_dir) / "shards/00000/_SUCCESS.json").read_bytes())
    stages = marker.stage_seconds
    return {"wall_s": round(wall, 2), "model_load_s": stages.get("model_load", 0.0),
            "load_share": round(stages.get("model_load", 0.0) / wall, 3),
            "before_stages_s": round(wall - sum(stages.values()), 2),
            "stage_seconds": stages, "load_seconds": marker.engine.get("load_seconds"),
            "rows_per_s_with_load": round(rows.num_rows / wall, 1)}


def worker_dtype() -> torch.dtype:
    """The dtype the worker's ``dtype: auto`` resolves to on this CPU (``resolve_dtype``): bfloat16 where
    it runs natively (AVX512-BF16 or AMX), else float32."""
    from batch_worker.engines.encoder import resolve_dtype

    return getattr(torch, resolve_dtype("auto", "cpu"))


def matmul_flops(dtype: torch.dtype, size: int = 2048, reps: int = 5) -> tuple[float, str]:
    """Best measured matmul throughput in FLOP/s (``size``^3 multiply-adds in ``dtype``), with the kernel
    that reached it: ``torch.matmul`` (MKL's GEMM for float32) or oneDNN's packed linear (the worker's
    fast-path kernel, ``cpu_linear.PackedLinear``), and the faster counts: the peak an MFU is taken
    against has to be the best this host does, not one library's. On a 2-core AVX2 EPYC,
    ``torch.matmul`` in float32 measured 116 GFLOP/s in one run and 143 in the next, oneDNN 142."""
    from batch_worker.engines.cpu_linear import PackedLinear, fast_linear_supported

    a = torch.randn(size, size, dtype=dtype)
    b = torch.randn(size, size, dtype=dtype)
    kernels = {"torch.matmul": lambda: torch.matmul(a, b)}
    if fast_linear_supported(dtype):
        packed = PackedLinear(torch.nn.Linear(size, size, bias=False).to(dtype))
        kernels["onednn_packed_linear"] = lambda: packed(a)
    best = {}
    with torch.no_grad():
        for name, run in kernels.items():
            run()
            best[name] = float("inf")
            for _ in range(reps):
                t0 = time.perf_counter()
                run()
                best[name] = min(best[name], time.perf_counter() - t0)
    kernel = min(best, key=best.get)
    return 2 * size**3 / best[kernel], kernel


def naive_loop(model_dir: str, texts: list[str]) -> float:
    """(a) rows/s: random order, fp32, no_grad, batch 64, pad to the longest row, mean pooling."""
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()
    order = np.random.default_rng(1).permutation(len(texts))
    shuffled = [texts[i] for i in order]
    with torch.no_grad():
        for s in range(0, WARMUP_ROWS, BATCH):
            model(**tok(shuffled[s : s + BATCH], padding=True, truncation=True, max_length=MAX_LENGTH, return_tensors="pt"))
    t0 = time.perf_counter()
    with torch.no_grad():
        for s in range(0, len(shuffled), BATCH):
            enc = tok(shuffled[s : s + BATCH], padding=True, truncation=True, max_length=MAX_LENGTH, return_tensors="pt")
            out = model(**enc).last_hidden_state
            m = enc["attention_mask"].unsqueeze(-1).to(out.dtype)
            emb = (out * m).sum(1) / m.sum(1)
            torch.nn.functional.normalize(emb, dim=1)
    return len(texts) / (time.perf_counter() - t0)


def st_encode(model_dir: str, texts: list[str], repeats: int = 1) -> float:
    """(b) rows/s: sentence-transformers encode in :func:`worker_dtype`, batch 64 (best of ``repeats``
    timed runs)."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(model_dir, device="cpu").to(worker_dtype())
    model.max_seq_length = MAX_LENGTH
    model.encode(texts[:WARMUP_ROWS], batch_size=BATCH, normalize_embeddings=True)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        model.encode(texts, batch_size=BATCH, normalize_embeddings=True)
        best = min(best, time.perf_counter() - t0)
    return len(texts) / best


def worker_run(rows: pa.Table, workdir: Path) -> dict:
    """(c) the worker end to end on one shard holding ``rows``; returns timing and marker figures."""
    from batch_contract.marker import ShardMarker
    from batch_worker.runtime import run_shard
    from run_helpers import write_run

    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "bench_input.parquet"
    pq.write_table(rows, path)
    run_dir = write_run(workdir, path, run_id="bench_encoder")
    t0 = time.perf_counter()
    code = run_shard(run_dir, "00000")
    wall = time.perf_counter() - t0
    if code != 0:
        raise SystemExit(f"worker exited {code}")
    shard = Path(run_dir) / "shards/00000"
    marker = ShardMarker.from_json_bytes((shard / "_SUCCESS.json").read_bytes())
    load = marker.stage_seconds.get("model_load", 0.0)
    lengths = np.concatenate([pq.read_table(p, columns=["n_tokens"]).column("n_tokens").to_numpy()
                              for p in sorted(shard.glob("part-*.parquet"))])
    return {"wall": wall, "load": load, "marker": marker, "lengths": lengths}


def fast_path_summary(engine: dict) -> dict:
    """What the worker's fast path picked on this host (marker engine info)."""
    keys = ("implementation", "implementation_reason", "attention", "attention_steps", "attention_choice",
            "packed_linears", "linear_choice", "pad_exact_when_cheaper", "load_seconds")
    return {k: engine.get(k) for k in keys}


def short_bench(n: int, model_dir: str, work: Path, repeats: int, skip_baselines: bool) -> dict:
    """The short-text figures of the module docstring (``short`` in the JSON)."""
    rows = short_corpus(n)
    worker_run(rows.slice(0, WARMUP_ROWS), work / "short_warmup")
    runs = [worker_run(rows, work / f"short{i}") for i in range(min(repeats, SHORT_REPEATS))]
    w = min(runs, key=lambda r: r["wall"] - r["load"])
    marker = w["marker"]
    rps = marker.rows_ok / (w["wall"] - w["load"])  # rows embedded: the empty ones are dead letters
    texts = [t for t in rows.column("text").to_pylist() if t]  # the worker dead-letters the empty ones
    st = st_encode(model_dir, texts, min(repeats, SHORT_REPEATS)) if not skip_baselines else float("nan")
    fresh = fresh_process_run(rows, work / "short_fresh")
    log(f"short: worker {rps:.1f} rows/s, st {st:.1f}, padding {marker.padding_efficiency:.3f}, "
        f"load {w['load']:.2f} of {w['wall']:.2f} s; fresh process {fresh}")
    return {
        "rows": rows.num_rows,
        "mean_tokens": round(marker.tokens_real / max(marker.rows_ok, 1), 1),
        "worker_rows_per_s": round(rps, 1),
        "worker_rows_per_s_each": [round(r["marker"].rows_ok / (r["wall"] - r["load"]), 1) for r in runs],
        "st_rows_per_s": round(st, 1) if not skip_baselines else None,
        "vs_sentence_transformers": round(rps / st, 3) if not skip_baselines else None,
        "padding_efficiency": round(marker.padding_efficiency or 0.0, 4),
        "load_share": round(w["load"] / w["wall"], 3),
        "model_load_s": round(w["load"], 3),
        "fresh_process": fresh,
        "fast_path": fast_path_summary(marker.engine),
    }


OVERHEAD_SHAPES = [(rows, length) for length in (12, 32, 96) for rows in (8, 32, 128, 256) if rows * length <= 8192]
"""(rows, padded length) of the batches :func:`batch_overhead` times: short to long rows, few to the CPU
row cap, all within the CPU token budget."""


def batch_overhead(repeats: int = 5) -> dict:
    """The fixed cost of one batch in padded tokens, as the exact planner uses it
    (``batch_worker.batching.BATCH_OVERHEAD_TOKENS``): the engine's forward pass timed (best of
    ``repeats`` after a warm-up) at :data:`OVERHEAD_SHAPES`, least squares of ``seconds = a x padded
    tokens + b``; returns ``a`` (µs per padded token), ``b`` (ms per batch) and ``b / a``."""
    from batch_contract.engine_config import EncoderConfig, WorkerSettings
    from batch_worker.engines.encoder import EncoderEngine

    engine = EncoderEngine(EncoderConfig(), WorkerSettings())
    engine.load()
    x, y = [], []
    for rows, length in OVERHEAD_SHAPES:
        ids = torch.randint(1000, 20000, (rows, length))
        mask = torch.ones(rows, length, dtype=torch.long)
        engine._forward(ids, mask)
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            engine._forward(ids, mask)
            best = min(best, time.perf_counter() - t0)
        x.append([rows * length, 1.0])
        y.append(best)
    (a, b), *_ = np.linalg.lstsq(np.asarray(x), np.asarray(y), rcond=None)
    log(f"batch overhead: {a * 1e6:.1f} us/padded token, {b * 1e3:.2f} ms/batch = {b / a:.0f} tokens")
    return {"us_per_padded_token": round(a * 1e6, 2), "ms_per_batch": round(b * 1e3, 2),
            "batch_overhead_tokens": round(b / a, 1)}


def flops_per_token(info: dict, lengths: np.ndarray) -> float:
    """Model FLOPs per real token: 2 x per-token parameters (``params_non_embedding``: the encoder
    layers, without embeddings, pooler or head) + attention, 4 x layers x hidden x the length the token
    attends over (QK^T and AV). A row of n tokens does n^2 of that attention work, so the per-token
    average length is sum(n^2) / sum(n), not the mean row length (the forward-pass attention term of
    PaLM's appendix B, 2 x 2 x layers x hidden x sequence length, with each row's own length)."""
    lengths = lengths.astype(np.float64)
    attended = float((lengths**2).sum() / lengths.sum())
    return 2 * info["params_non_embedding"] + 4 * info["num_layers"] * info["hidden_size"] * attended


def vm_hwm_mb(pid: int) -> float:
    """Peak resident set (``VmHWM``, MiB) of a live process; 0.0 once it is gone.

    Read from ``/proc`` rather than ``RUSAGE_CHILDREN``: Linux carries the parent's resident set
    across fork + exec into the child's ``ru_maxrss``, so that figure would report this benchmark
    process (torch, sentence-transformers and two models loaded) instead of the worker.
    """
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def rss_run(n_rows: int, seconds: float, workdir: Path) -> tuple[float, int]:
    """Peak RSS (MB) of the worker CLI on an ``n_rows``-row shard, and rows it committed.

    The shard tiles the shared data set with fresh ids up to ``n_rows``; the run gets SIGTERM after
    ``seconds`` if still going (exit 75), so the figure covers model load and steady-state chunks.
    """
    from batch_contract.marker import AttemptRecord
    from run_helpers import write_run

    base = load_rows(10**9)
    reps = -(-n_rows // base.num_rows)
    texts = (base.column("text").to_pylist() * reps)[:n_rows]
    path = workdir / "rss_input.parquet"
    pq.write_table(pa.table({"id": list(range(n_rows)), "text": texts}), path, row_group_size=8192)
    run_dir = write_run(workdir / "rss", path, run_id="bench_rss", worker={"grace_seconds": 20})
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "plugins"), str(ROOT / "worker_image")]))
    proc = subprocess.Popen([sys.executable, "-m", "batch_worker", "run", "--run-dir", run_dir, "--shard", "00000"],
                            env=env, stderr=subprocess.DEVNULL)
    peak_mb = 0.0
    deadline = time.monotonic() + seconds
    while proc.poll() is None:
        peak_mb = max(peak_mb, vm_hwm_mb(proc.pid))
        if time.monotonic() > deadline:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
            break
        time.sleep(0.5)
    done = 0
    for p in (Path(run_dir) / "shards/00000/attempts").glob("*.json"):
        done += AttemptRecord.from_json_bytes(p.read_bytes()).rows_committed
    log(f"rss run: exit {proc.returncode}, {done}/{n_rows} rows committed, peak RSS {peak_mb:.0f} MB")
    return peak_mb, done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=3000)
    parser.add_argument("--rss-rows", type=int, default=64000, help="rows of the RSS shard (0 skips it)")
    parser.add_argument("--rss-seconds", type=float, default=900.0, help="stop the RSS run after this long")
    parser.add_argument("--skip-baselines", action="store_true", help="worker only (no ratios)")
    parser.add_argument("--skip-naive", action="store_true",
                        help="leave out the naive loop (8x slower than the worker; only vs_naive needs it)")
    parser.add_argument("--short-rows", type=int, default=10000, help="rows of the short-text corpus (0 skips it)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="timed runs of the worker and of sentence-transformers; the best counts (the matmul "
                        "peak is a best of 5 too). The naive loop, 8x slower, runs once")
    args = parser.parse_args()
    hostbench.start()
    from batch_worker.engines.encoder import default_model_path

    model_dir = default_model_path()
    rows = load_rows(args.rows)
    texts = rows.column("text").to_pylist()
    log(f"torch {torch.__version__}, threads {torch.get_num_threads()}, cpu {torch.backends.cpu.get_cpu_capability()}")
    dtype = worker_dtype()
    peak, peak_kernel = matmul_flops(dtype)
    log(f"{dtype} matmul peak: {peak / 1e9:.0f} GFLOP/s ({peak_kernel})")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        worker_run(rows.slice(0, WARMUP_ROWS), work / "warmup")
        runs = [worker_run(rows, work / f"run{i}") for i in range(args.repeats)]
        w = min(runs, key=lambda r: r["wall"] - r["load"])
        marker = w["marker"]
        worker_rps = rows.num_rows / (w["wall"] - w["load"])
        log(f"(c) worker: {worker_rps:.1f} rows/s (wall {w['wall']:.1f} s incl. model load {w['load']:.1f} s)")
        naive_rps = st_rps = float("nan")
        if not args.skip_baselines:
            st_rps = st_encode(model_dir, texts, args.repeats)
            log(f"(b) sentence-transformers {dtype} batch 64: {st_rps:.1f} rows/s")
            if not args.skip_naive:
                naive_rps = naive_loop(model_dir, texts)
                log(f"(a) naive fp32 random order batch 64: {naive_rps:.1f} rows/s")
        fpt = flops_per_token(marker.engine, w["lengths"])
        tokens_per_s = marker.tokens_real / (w["wall"] - w["load"])
        short = short_bench(args.short_rows, model_dir, work, args.repeats, args.skip_baselines) \
            if args.short_rows else None
        overhead = batch_overhead()
        peak_rss, rss_done = rss_run(args.rss_rows, args.rss_seconds, work) if args.rss_rows else (float("nan"), 0)
    result = {
        "rows": rows.num_rows,
        "repeats": args.repeats,
        "worker_rows_per_s_each": [round(rows.num_rows / (r["wall"] - r["load"]), 1) for r in runs],
        "naive_rows_per_s": round(naive_rps, 2) if not (args.skip_baselines or args.skip_naive) else None,
        "st_rows_per_s": round(st_rps, 2) if not args.skip_baselines else None,
        "worker_rows_per_s": round(worker_rps, 2),
        "worker_rows_per_s_with_load": round(rows.num_rows / w["wall"], 2),
        "vs_naive": round(worker_rps / naive_rps, 3) if not (args.skip_baselines or args.skip_naive) else None,
        "vs_sentence_transformers": round(worker_rps / st_rps, 3) if not args.skip_baselines else None,
        "padding_efficiency": round(marker.padding_efficiency or 0.0, 4),
        "load_share": round(w["load"] / w["wall"], 3),
        "mfu": round(tokens_per_s * fpt / peak, 3),
        "real_tokens_per_s": round(tokens_per_s, 1),
        "flops_per_token": round(fpt),
        "matmul_gflops": round(peak / 1e9, 1),
        "matmul_dtype": str(dtype).removeprefix("torch."),
        "matmul_kernel": peak_kernel,
        "bf16_matmul_gflops": round(peak / 1e9, 1) if dtype == torch.bfloat16 else None,
        "dtype": marker.engine.get("dtype"),
        "attention": marker.engine.get("attention"),
        "packed_linears": marker.engine.get("packed_linears"),
        "peak_rss_mb": round(peak_rss, 1) if args.rss_rows else None,
        "rss_rows": args.rss_rows,
        "rss_rows_done": rss_done,
        "fast_path": fast_path_summary(marker.engine),
        "batch_overhead": overhead,
        "short": short,
        "host": hostbench.finish(),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
