"""Incremental runs: a second run on edited input computes only the changed and new rows.

Real MiniLM (fp32), real planner, in-process worker (``run_shard``), real DuckDB publish, on two corpora
made from the bundled sample: ``bundled`` (its 6,000 descriptions, about 90 tokens each) and ``short``
(every line of those descriptions, one row each: about 30,000 rows of about 14 tokens, many of them
repeated, like package summaries or titles). A changed description gets " (revised)" appended; a
changed short line gets two words swapped, so its length stays (:func:`revise`). For each:

1. run 1 from scratch (empty output root, ``reuse: same_root``);
2. run 2 on the same input with 5% of texts changed, 2% new ids, 1% ids deleted;
3. run 3: the run-2 input again, unchanged: the plan-time shard carry-over completes every shard, so
   zero rows are computed and no worker starts (``batch_inference.carryover``);
4. scratch: the run-2 input under a fresh output root with ``reuse: off`` (the reference table).

Worker seconds are the markers' stage seconds (what the cost report prices); what bounds their ratio
from below is reported beside it (:func:`cost_floor`: the engine's token share, padding, per-token
speed, the non-inference share). Also measured: hashing
the texts (the key) against inference, per row; and, on an input of 300 distinct short texts repeated
to 3,000 rows, run by four workers at the same time (threads), how many texts were published with two
different results (``duplicate_texts_with_two_outputs``, 0 under the one-result-per-key rule of
``batch_contract.resultcache``). Last line: one JSON object; the ``bundled`` figures at the top level
(as before), the short corpus's under ``short``.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "plugins"), str(REPO / "worker_image")]

import duckdb  # noqa: E402
import hostbench  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from batch_contract import resultcache  # noqa: E402
from batch_contract.layout import RunLayout  # noqa: E402
from batch_contract.runstore import RunStore  # noqa: E402
from batch_inference.carryover import carry_over, index_published  # noqa: E402
from batch_inference.params import default_model_path  # noqa: E402
from batch_inference.planner import PlanRequest, plan  # noqa: E402
from batch_inference.publish import PublishTarget, publish_run  # noqa: E402
from batch_worker.runtime import run_shard  # noqa: E402

SAMPLE = REPO / "data" / "sample" / "debian_descriptions_sample.parquet"
ENGINE = {"kind": "encoder", "dtype": "float32"}
ROWS_PER_SHARD = {"bundled": 3000, "short": 22000}
"""Two shards per corpus: each run pays two model loads (in-process, like the local runner's workers)."""
EDIT = {"bundled": "suffix", "short": "swap"}
"""How a changed row is edited (:func:`revise`)."""
SEED = 7


def run(root: Path, run_id: str, input_uri: str, reuse: str = "same_root", rows_per_shard: int = 3000,
        parallel: bool = False) -> dict:
    manifest, _ = plan(PlanRequest(input_uri=input_uri, id_column="id", text_column="text", output_root=str(root),
                                   run_id=run_id, engine=ENGINE, worker={"reuse": reuse, "progress_interval_seconds": 60.0},
                                   rows_per_shard=rows_per_shard))
    run_dir = RunLayout(str(root), run_id).run_dir
    t0 = time.perf_counter()
    carried = set()
    if reuse == "same_root":  # what the plan task does (tasks.carry_over_task)
        carried = set(carry_over(manifest, run_dir, runner="local", image=None,
                                 default_model=default_model_path()).carried)
    todo = [spec.shard_id for spec in manifest.shards if spec.shard_id not in carried]
    workers = len(todo)
    with ThreadPoolExecutor(workers if parallel and workers else 1) as pool:
        codes = list(pool.map(lambda shard_id: run_shard(run_dir, shard_id, install_signals=False), todo))
    assert all(code == 0 for code in codes), codes
    wall = time.perf_counter() - t0
    store = RunStore.open(run_dir)
    markers = [store.marker(s.shard_id) for s in manifest.shards]
    db = str(root / f"{run_id}.duckdb")
    publish_run(run_dir, PublishTarget(backend="duckdb", table="emb", duckdb_path=db))
    if reuse == "same_root":
        index_published(run_dir)
    with duckdb.connect(db, read_only=True) as con:
        rows = con.execute("SELECT id, n_tokens, truncated, text_repaired, embedding FROM batch_inference.emb").fetchall()
    tokens = sum(m.tokens_real for m in markers)
    padded = sum(m.tokens_padded for m in markers)
    computed = sum(m.rows_ok - m.rows_reused for m in markers)
    return {
        "stage_seconds": {k: round(sum(m.stage_seconds.get(k, 0.0) for m in markers), 3)
                          for k in sorted({k for m in markers for k in m.stage_seconds})},
        "mean_tokens_computed": round(tokens / computed, 2) if computed else None,
        "tokens_real": tokens,
        "tokens_padded": padded,
        "wall": wall,
        "worker_seconds": sum(sum(m.stage_seconds.values()) for m in markers),
        "inference_seconds": sum(m.stage_seconds.get("inference", 0.0) for m in markers),
        "reuse_seconds": sum(m.stage_seconds.get("reuse", 0.0) for m in markers),
        "rows_ok": sum(m.rows_ok for m in markers),
        "rows_through_engine": sum(a.get("rows_processed", 0) for m in markers for a in m.attempts),
        "rows_reused": sum(m.rows_reused for m in markers),
        "workers_started": workers,
        "shards_carried": len(carried),
        "models_loaded": sum(bool(m.engine.get("model_loaded", True)) for m in markers),
        "fingerprint": markers[0].fingerprint,
        "table": {r[0]: r[1:] for r in rows},
    }


def revise(text: str, how: str) -> str:
    """An edited text: ``suffix`` appends " (revised)"; ``swap`` swaps the first two words (same length,
    so a short text's edit does not cost 20% more tokens than the text did)."""
    if how == "swap":
        words = text.split(" ")
        if len(words) >= 2 and words[0] != words[1]:
            return " ".join([words[1], words[0], *words[2:]])
        return text + "."
    return text + " (revised)"


def edited_input(ids: list[str], texts: list[str], n: int,
                 how: str = "suffix") -> tuple[list[str], list[str], set[str], set[str], set[str]]:
    rng = np.random.default_rng(SEED)
    order = rng.permutation(len(ids))
    deleted = {ids[i] for i in order[: n // 100]}
    changed = {ids[i] for i in order[n // 100: n // 100 + n * 5 // 100]}
    new_ids = [f"new-{k}" for k in range(n * 2 // 100)]
    out_ids, out_texts = [], []
    for rid, text in zip(ids, texts, strict=True):
        if rid in deleted:
            continue
        out_ids.append(rid)
        out_texts.append(revise(text, how) if rid in changed else text)
    donors = rng.choice(len(texts), len(new_ids), replace=False)
    out_ids += new_ids
    out_texts += [f"{texts[d]} [new package {k}]" if how == "suffix" else revise(texts[d], how) + f" {k}"
                  for k, d in enumerate(donors)]
    return out_ids, out_texts, changed, set(new_ids), deleted


def compare(a: dict, b: dict) -> tuple[bool, float]:
    """Same ids once each, same flags and token counts, embeddings within 1e-5; the max abs diff."""
    if sorted(a) != sorted(b):
        return False, float("inf")
    worst = 0.0
    same = True
    for rid, row in a.items():
        same &= row[:3] == b[rid][:3]
        worst = max(worst, float(np.max(np.abs(np.asarray(row[3]) - np.asarray(b[rid][3])))))
    return same and worst <= 1e-5, worst


def short_corpus(ids: list[str], texts: list[str]) -> tuple[list[str], list[str]]:
    """Every non-empty line of every description as its own row (id ``<id>:<line>``)."""
    out_ids, out_texts = [], []
    for rid, text in zip(ids, texts, strict=True):
        for k, line in enumerate(text.splitlines()):
            line = line.strip()
            if line and line != ".":
                out_ids.append(f"{rid}:{k}")
                out_texts.append(line)
    return out_ids, out_texts


def measure(work: Path, name: str, ids: list[str], texts: list[str]) -> tuple[dict, dict]:
    """The four runs of one corpus; ``(summary figures, detail)``."""
    n = len(ids)
    rows_per_shard = ROWS_PER_SHARD[name]
    first_in = work / f"{name}-in1.parquet"
    pq.write_table(pa.table({"id": ids, "text": texts}), first_in)
    ids2, texts2, changed, new, deleted = edited_input(ids, texts, n, EDIT[name])
    second_in = work / f"{name}-in2.parquet"
    pq.write_table(pa.table({"id": ids2, "text": texts2}), second_in)

    root = work / f"{name}-out"
    first = run(root, "first", str(first_in), rows_per_shard=rows_per_shard)
    second = run(root, "second", str(second_in), rows_per_shard=rows_per_shard)
    unchanged = run(root, "unchanged", str(second_in), rows_per_shard=rows_per_shard)
    scratch = run(work / f"{name}-scratch", "scratch", str(second_in), reuse="off", rows_per_shard=rows_per_shard)

    equal, diff_scratch = compare(second["table"], scratch["table"])
    reused_ids = [i for i in ids2 if i not in changed and i not in new]
    max_diff_reused = max(float(np.max(np.abs(np.asarray(second["table"][i][3]) - np.asarray(first["table"][i][3]))))
                          for i in reused_ids)
    equal_unchanged, _ = compare(unchanged["table"], second["table"])

    t0 = time.perf_counter()
    resultcache.text_keys(texts)
    hash_s_per_row = (time.perf_counter() - t0) / n
    infer_s_per_row = first["inference_seconds"] / first["rows_ok"]
    cache_bytes = sum(p.stat().st_size for p in (root / "cache").rglob("*.parquet"))

    detail = {
        "first": {k: v for k, v in first.items() if k != "table"},
        "second": {k: v for k, v in second.items() if k != "table"},
        "unchanged": {k: v for k, v in unchanged.items() if k != "table"},
        "scratch": {k: v for k, v in scratch.items() if k != "table"},
        "hash_us_per_row": hash_s_per_row * 1e6,
        "inference_us_per_row": infer_s_per_row * 1e6,
        "hash_over_inference": hash_s_per_row / infer_s_per_row,
        "cache_bytes": cache_bytes,
    }
    summary = {
        "rows_first": first["rows_ok"],
        "rows_second": len(ids2),
        "rows_changed": len(changed),
        "rows_new": len(new),
        "rows_deleted": len(deleted),
        "mean_tokens": first["mean_tokens_computed"],
        "second_rows_computed": second["rows_ok"] - second["rows_reused"],
        "second_rows_reused": second["rows_reused"],
        "second_rows_through_engine": second["rows_through_engine"],
        "wall_ratio_second_over_first": round(second["wall"] / first["wall"], 4),
        "worker_seconds_ratio": round(second["worker_seconds"] / first["worker_seconds"], 4),
        "equal_to_scratch": equal,
        "max_abs_diff_reused": max_diff_reused,
        "max_abs_diff_vs_scratch": diff_scratch,
        "unchanged_rows_computed": unchanged["rows_ok"] - unchanged["rows_reused"],
        "unchanged_equal": equal_unchanged,
        "unchanged_workers_started": unchanged["workers_started"],
        "unchanged_shards_carried": unchanged["shards_carried"],
        "unchanged_wall_ratio": round(unchanged["wall"] / first["wall"], 4),
        "hash_over_inference_per_row": round(hash_s_per_row / infer_s_per_row, 6),
        **cost_floor(first, second),
    }
    return summary, detail


def cost_floor(first: dict, second: dict) -> dict:
    """What bounds ``worker_seconds_ratio`` from below: ``engine_token_fraction``, the real tokens run 2
    sent through the engine over run 1's (run 1 computes each distinct text once, so on a corpus with
    repeated texts this exceeds the changed share of rows); ``padding_efficiency_first`` /
    ``_second`` (real over padded tokens); ``inference_seconds_per_padded_token_ratio`` (run 2's
    inference seconds per padded token over run 1's: above 1 when run 2's few batches run slower per
    token); ``non_inference_share_second`` (run 2's worker-seconds outside inference, over run 1's
    worker-seconds: the reuse pass, reading, model loads, writing)."""
    per_token = [r["inference_seconds"] / r["tokens_padded"] if r["tokens_padded"] else None for r in (first, second)]
    return {
        "engine_token_fraction": round(second["tokens_real"] / first["tokens_real"], 4),
        "padding_efficiency_first": round(first["tokens_real"] / first["tokens_padded"], 4),
        "padding_efficiency_second": (round(second["tokens_real"] / second["tokens_padded"], 4)
                                      if second["tokens_padded"] else None),
        "inference_seconds_per_padded_token_ratio": (round(per_token[1] / per_token[0], 4)
                                                     if all(per_token) else None),
        "non_inference_share_second": round((second["worker_seconds"] - second["inference_seconds"])
                                            / first["worker_seconds"], 4),
    }


def duplicates_check(work: Path, texts: list[str]) -> dict:
    """300 distinct texts repeated to 3,000 rows in random order, four shards run at the same time;
    texts published with more than one distinct result."""
    rng = np.random.default_rng(SEED)
    distinct = sorted(set(texts))[:300]
    picks = rng.integers(0, len(distinct), 3000)
    src = work / "dups.parquet"
    pq.write_table(pa.table({"id": [f"d{i}" for i in range(len(picks))], "text": [distinct[k] for k in picks]}), src)
    result = run(work / "dups-out", "dups", str(src), rows_per_shard=750, parallel=True)
    outputs: dict[int, set[bytes]] = {}
    for i, k in enumerate(picks):
        outputs.setdefault(int(k), set()).add(np.asarray(result["table"][f"d{i}"][3], np.float32).tobytes())
    return {"rows": len(picks), "distinct_texts": len(outputs), "workers": result["workers_started"],
            "rows_through_engine": result["rows_through_engine"],
            "duplicate_texts_with_two_outputs": sum(len(v) > 1 for v in outputs.values())}


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=6000, help="descriptions of the sample to use (default: all 6,000)")
    parser.add_argument("--corpus", choices=["both", "bundled", "short"], default="both")
    args = parser.parse_args()
    hostbench.start()
    t = pq.read_table(SAMPLE, columns=["id", "text"]).slice(0, args.rows)
    ids = [str(i) for i in t.column("id").to_pylist()]
    texts = t.column("text").to_pylist()
    work = Path(tempfile.mkdtemp(prefix="bench-incremental-"))
    try:
        figures: dict = {}
        details: dict = {}
        if args.corpus in ("both", "bundled"):
            figures, details["bundled"] = measure(work, "bundled", ids, texts)
        short_ids, short_texts = short_corpus(ids, texts)
        if args.corpus in ("both", "short"):
            figures["short"], details["short"] = measure(work, "short", short_ids, short_texts)
        figures["duplicates"] = duplicates_check(work, short_texts)
        figures["duplicate_texts_with_two_outputs"] = figures["duplicates"]["duplicate_texts_with_two_outputs"]
        figures["host"] = hostbench.finish()
        print(json.dumps(details, indent=1, default=str))
        print(json.dumps(figures))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
