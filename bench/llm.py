"""LLM engine benchmark: the worker end to end against a direct ``LLM.generate`` call, in one process.

Same 400 prompts (bundled sample rows, descriptions cut to 600 characters) sharing a system prompt of
about 300 tokens, the same tiny random Llama (``scripts/build_tiny_llm.py``, built into a temp dir), the
same engine settings (``LLMEngine.engine_kwargs``: prefix caching on; on CPU eager mode, ``uni``
executor), greedy decoding with ``max_tokens`` 32:

(a) direct: ``vllm.LLM(...)`` then one ``llm.generate(prompt_texts, params)`` over all 400 prompts
    (prompts pre-rendered with the chat template, untimed; vLLM tokenises them inside the timed call);
(b) the worker: ``batch_worker.runtime.run_shard`` over a one-shard run of the same rows (read Parquet,
    validate, render the template in the sandbox, tokenise, generate, validate outputs, commit part
    files, write the marker), manifest worker settings at their defaults;
(c) diagnostic: the engine alone (``LLMEngine.prepare`` + ``process`` over one chunk of all rows), to
    split the engine's overhead from the runtime's (``engine_only_vs_direct_generate``).

Both are run ``--repeats`` times (default 3), interleaved (direct, worker, direct, worker, ...) and the
best of each is kept, because the development machine is shared: under load, wall-clock figures move by
2x between identical runs. ``vs_direct_generate_cpu_time`` (direct CPU seconds over worker CPU seconds,
process CPU time of all threads, the worker's minus the direct path's ``LLM(...)`` start-up CPU) is less
sensitive to other processes and is printed beside it. Model start-up is excluded from both (the direct
path's ``LLM(...)`` construction, the worker's ``model_load`` stage); the worker figure including its
start-up is ``worker_output_tokens_per_s_with_load``.

The last line printed is one JSON object: ``prompts``, ``prefix_tokens``, ``direct_output_tokens_per_s``,
``output_tokens_per_s`` (the worker's), ``vs_direct_generate`` (worker over direct; target >= 0.9),
``prefix_cache_hit_rate`` (worker: ``tokens_cached / tokens_prompt`` from the shard marker),
``direct_prefix_cache_hit_rate`` and the raw seconds and token counts.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins"), str(ROOT / "worker_image"), str(ROOT / "scripts")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")

import hostbench  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from batch_contract import storage  # noqa: E402
from batch_contract.engine_config import WorkerSettings  # noqa: E402
from batch_contract.layout import RunLayout, shard_id_for  # noqa: E402
from batch_contract.llm_config import LLMConfig  # noqa: E402
from batch_contract.manifest import InputFile, InputSpec, Manifest, Segment, ShardSpec  # noqa: E402
from batch_contract.marker import ShardMarker  # noqa: E402

SAMPLE = ROOT / "data" / "sample" / "debian_descriptions_sample.parquet"
TEMPLATE = "Package {{ id }} ({{ section }}): {{ text }}"
PREFIX_SENTENCES = [
    "You are a careful assistant that files Debian packages into archive sections.",
    "Read the package description and decide which section of the archive it belongs to.",
    "Sections include admin, devel, doc, editors, games, graphics, libs, mail, math, net, python, "
    "science, sound, text, utils, video, web and x11.",
    "Prefer the most specific section; a library goes to libs unless it is a Python module.",
    "Command line tools for system administration go to admin; programs that edit text go to editors.",
    "Answer in lower case, with no punctuation and no explanation.",
]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def system_prompt(tokenizer, target_tokens: int) -> str:
    """Repeat the instruction sentences until the prompt has at least ``target_tokens`` tokens."""
    parts: list[str] = []
    while len(tokenizer.encode(" ".join(parts), add_special_tokens=False)) < target_tokens:
        parts.append(PREFIX_SENTENCES[len(parts) % len(PREFIX_SENTENCES)])
    return " ".join(parts)


def write_run(root: Path, table: pa.Table, engine: dict) -> str:
    """A one-shard run of ``table`` (Parquet input) with ``engine``; returns the run dir."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / "input.parquet"
    pq.write_table(table, path)
    meta = pq.ParquetFile(path).metadata
    manifest = Manifest(
        run_id=f"bench-{time.time_ns()}",
        input=InputSpec(uri=str(path), format="parquet", id_column="id", text_column="text",
                        files=[InputFile(str(path), meta.num_rows, [meta.row_group(0).num_rows])]),
        shards=[ShardSpec(shard_id=shard_id_for(0), segments=[Segment(0, 0, meta.num_rows)])],
        engine=engine,
        worker=WorkerSettings(),
    )
    layout = RunLayout(output_root=str(root), run_id=manifest.run_id)
    storage.write_replace(layout.manifest_uri, manifest.to_json_bytes())
    return layout.run_dir


def direct(config: LLMConfig, engine_kwargs: dict, prompts: list[str]) -> dict:
    """(a): one ``LLM.generate`` call over all prompts; seconds exclude ``LLM(...)`` construction."""
    import vllm
    from vllm import SamplingParams

    c_load = time.process_time()
    llm = vllm.LLM(**engine_kwargs)
    load_cpu = time.process_time() - c_load
    params = SamplingParams(temperature=config.temperature, max_tokens=config.max_tokens)
    t0, c0 = time.perf_counter(), time.process_time()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    prompt_tokens = sum(len(o.prompt_token_ids) for o in outputs)
    cached = sum(int(o.num_cached_tokens or 0) for o in outputs)
    out_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    llm.llm_engine.engine_core.shutdown()
    del llm, outputs
    gc.collect()
    return {"seconds": seconds, "cpu": cpu, "load_cpu": load_cpu, "output_tokens": out_tokens, "prompt_tokens": prompt_tokens,
            "cached": cached}


def engine_only(config: LLMConfig, table: pa.Table) -> dict:
    """(c) diagnostic: ``LLMEngine.prepare`` + ``process`` on one chunk of all rows, without the runtime
    (no reading, no commit, no threads); seconds exclude ``load()``."""
    from batch_worker.engines.base import ChunkRows
    from batch_worker.engines.llm import LLMEngine

    engine = LLMEngine(config, WorkerSettings())
    engine.load()
    ids = [str(i) for i in table.column("id").to_pylist()]
    rows = ChunkRows(ids=ids, texts=table.column("text").to_pylist(), text_repaired=[False] * len(ids),
                     source_uri=["bench"] * len(ids), source_row=list(range(len(ids))), fields=table)
    t0, c0 = time.perf_counter(), time.process_time()
    out = engine.process(engine.prepare(rows), lambda: False)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    engine.close()
    return {"seconds": seconds, "cpu": cpu, "output_tokens": out.tokens.output}


def worker(root: Path, table: pa.Table, engine: dict) -> dict:
    """(b): ``run_shard`` end to end; seconds exclude the attempt's ``model_load`` stage."""
    from batch_worker.runtime import run_shard

    run_dir = write_run(root, table, engine)
    t0, c0 = time.perf_counter(), time.process_time()
    rc = run_shard(run_dir, "00000", install_signals=False)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    if rc != 0:
        raise RuntimeError(f"worker exited {rc}")
    layout = RunLayout.from_run_dir(run_dir)
    marker = ShardMarker.from_json_bytes(storage.read_bytes(layout.marker_uri("00000")))
    load = float(marker.stage_seconds.get("model_load", 0.0))
    gc.collect()
    return {"seconds": wall - load, "wall": wall, "cpu_with_load": cpu, "output_tokens": marker.tokens_output,
            "prompt_tokens": marker.tokens_prompt, "cached": marker.tokens_cached, "rows_ok": marker.rows_ok,
            "hit_rate": marker.prefix_cache_hit_rate}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=400)
    parser.add_argument("--prefix-tokens", type=int, default=300)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.92,
                        help="GPU only: engine fraction of GPU memory (lower it so two engines fit at once)")
    parser.add_argument("--hidden", type=int, default=128, help="tiny model hidden size (GPU smoke: larger)")
    parser.add_argument("--layers", type=int, default=2, help="tiny model layers (GPU smoke: more)")
    args = parser.parse_args(argv)
    hostbench.start()

    import build_tiny_llm
    from batch_worker.engines.llm import LLMEngine, _configure_cpu_env, _on_cpu
    from batch_worker.prompting import PromptRenderer, row_context
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory(prefix="bench-llm-") as tmp:
        tmp_path = Path(tmp)
        model = build_tiny_llm.build(tmp_path / "model", hidden=args.hidden, layers=args.layers)
        tokenizer = AutoTokenizer.from_pretrained(str(model))
        table = pq.read_table(SAMPLE).slice(0, args.prompts)
        table = table.set_column(table.column_names.index("text"), "text",
                                 pa.array([t[:600] for t in table.column("text").to_pylist()]))
        engine = {"kind": "llm", "model_path": str(model), "dtype": "bfloat16", "max_model_len": 1024,
                  "max_tokens": args.max_tokens, "system_prompt": system_prompt(tokenizer, args.prefix_tokens),
                  "user_template": TEMPLATE, "gpu_memory_utilization": args.gpu_memory_utilization}
        config = LLMConfig.from_dict(engine)
        renderer = PromptRenderer(config, tokenizer)
        prompts = [renderer.render_text(renderer.parts(row_context(r, str(r["id"]), r["text"])))
                   for r in table.to_pylist()]
        prefix_tokens = len(tokenizer.encode(renderer.prefix_text(), add_special_tokens=False))
        on_cpu = _on_cpu()
        if on_cpu:
            _configure_cpu_env()
        kwargs = LLMEngine(config, WorkerSettings()).engine_kwargs(on_cpu)
        log(f"{len(prompts)} prompts, shared prefix {prefix_tokens} tokens, engine {kwargs}")

        directs, workers, engines = [], [], []
        for i in range(args.repeats):
            directs.append(direct(config, kwargs, prompts))
            log(f"direct #{i}: {directs[-1]}")
            engines.append(engine_only(config, table))
            log(f"engine #{i}: {engines[-1]}")
            workers.append(worker(tmp_path / f"w{i}", table, engine))
            log(f"worker #{i}: {workers[-1]}")

    for d, w in zip(directs, workers, strict=True):  # the worker's start-up CPU ~ the direct path's LLM(...)
        w["cpu"] = max(1e-9, w["cpu_with_load"] - d["load_cpu"])
    best_d = max(directs, key=lambda r: r["output_tokens"] / r["seconds"])
    best_w = max(workers, key=lambda r: r["output_tokens"] / r["seconds"])
    direct_tps = best_d["output_tokens"] / best_d["seconds"]
    engine_tps = max(r["output_tokens"] / r["seconds"] for r in engines)
    worker_tps = best_w["output_tokens"] / best_w["seconds"]
    result = {
        "bench": "llm",
        "device": "cpu" if on_cpu else "cuda",
        "prompts": len(prompts),
        "prefix_tokens": prefix_tokens,
        "max_tokens": args.max_tokens,
        "model": {"hidden": args.hidden, "layers": args.layers},
        "direct_output_tokens_per_s": round(direct_tps, 1),
        "output_tokens_per_s": round(worker_tps, 1),
        "worker_output_tokens_per_s_with_load": round(best_w["output_tokens"] / best_w["wall"], 1),
        "vs_direct_generate": round(worker_tps / direct_tps, 3),
        "vs_direct_generate_cpu_time": round(min(d["cpu"] for d in directs) / min(w["cpu"] for w in workers), 3),
        "engine_only_vs_direct_generate": round(engine_tps / direct_tps, 3),
        "prefix_cache_hit_rate": round(best_w["hit_rate"] or 0.0, 3),
        "direct_prefix_cache_hit_rate": round(best_d["cached"] / best_d["prompt_tokens"], 3),
        "direct_seconds": round(best_d["seconds"], 3),
        "worker_seconds": round(best_w["seconds"], 3),
        "direct_output_tokens": best_d["output_tokens"],
        "worker_output_tokens": best_w["output_tokens"],
        "worker_rows_ok": best_w["rows_ok"],
    }
    result["host"] = hostbench.finish()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
