"""Deterministic random records of every JSON record class of the contract, for the byte-identity test
(``test_record_bytes.py``) and for writing its golden files (``python tests/unit/record_cases.py``)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from batch_contract.canary import STRATEGIES, AutotuneTrial, CanaryResult, TuningProfile
from batch_contract.carryover import CarryOverPlan, ShardIndexEntry
from batch_contract.engine_config import WorkerSettings
from batch_contract.manifest import InputFile, InputSpec, Manifest, Segment, ShardSpec
from batch_contract.marker import STAGES, AttemptRecord, ShardMarker, ShardProgress

GOLDEN_DIR = Path(__file__).parent / "golden_records"
SEEDS = range(4)
_CHARS = "abcXYZ09 _-é✓\"\\\n"


def _text(r: random.Random, n: int = 8) -> str:
    return "".join(r.choice(_CHARS) for _ in range(r.randint(0, n)))


def _num(r: random.Random) -> float:
    return round(r.uniform(0, 1000), r.randint(0, 6))


def _stages(r: random.Random) -> dict[str, float]:
    return {s: _num(r) for s in r.sample(STAGES, r.randint(0, len(STAGES)))}


def _files(r: random.Random) -> dict[str, dict[str, Any]]:
    return {f"part-{i:05d}-x.parquet": {"bytes": r.randint(0, 10**9), "sha256": f"{r.getrandbits(256):064x}"}
            for i in range(r.randint(0, 3))}


def _trial(r: random.Random) -> AutotuneTrial:
    return AutotuneTrial(token_budget=r.randint(1, 65536), max_batch_rows=r.randint(1, 512), rows=r.randint(0, 999),
                         tokens_real=r.randint(0, 10**6), tokens_padded=r.randint(0, 10**6), seconds=_num(r),
                         batches=r.randint(0, 99), oom=r.random() < 0.3, warmup=r.random() < 0.3,
                         output_tokens=r.randint(0, 10**5))


def _attempt(r: random.Random) -> AttemptRecord:
    return AttemptRecord(
        attempt_id=_text(r), shard_id=f"{r.randint(0, 99999):05d}", started_at=_text(r), host=_text(r),
        status=r.choice(["running", "complete", "interrupted", "failed"]),
        ended_at=r.choice([None, _text(r)]), exit_code=r.choice([None, 0, 75, 1]),
        rows_skipped_resume=r.randint(0, 99), rows_committed=r.randint(0, 10**6), rows_processed=r.randint(0, 10**6),
        chunks_committed=r.randint(0, 99), stage_seconds=_stages(r), tokens_real=r.randint(0, 10**9),
        tokens_padded=r.randint(0, 10**9), cpu_seconds=_num(r), steady_rows_per_s=_num(r),
        gpu=r.choice([{}, {"util_mean": _num(r), "mem_max_bytes": r.randint(0, 10**11)}]), fingerprint=_text(r),
        files=_files(r), rows_reused=r.randint(0, 99), reuse_seconds_avoided=_num(r), updated_at=_text(r),
        threads=r.randint(0, 64), host_facts=r.choice([{}, {"cpu_model": _text(r), "cores": r.randint(1, 128)}]),
    )


def _marker(r: random.Random) -> ShardMarker:
    return ShardMarker(
        run_id=_text(r), shard_id=f"{r.randint(0, 99999):05d}", fingerprint=_text(r), rows_input=r.randint(0, 10**6),
        rows_ok=r.randint(0, 10**6), rows_dead_letter=r.randint(0, 999), rows_truncated=r.randint(0, 99),
        rows_text_repaired=r.randint(0, 9), dead_letter_reasons={_text(r): r.randint(1, 9) for _ in range(r.randint(0, 3))},
        tokens_real=r.randint(0, 10**9), tokens_padded=r.randint(0, 10**9), tokens_prompt=r.randint(0, 10**9),
        tokens_cached=r.randint(0, 10**9), tokens_output=r.randint(0, 10**9), stage_seconds=_stages(r),
        steady_rows_per_s=_num(r), cpu_seconds=_num(r), engine={"model_digest": _text(r), "dim": r.randint(1, 4096)},
        gpu=r.choice([{}, {"util_mean": _num(r)}]), attempts=[_attempt(r).to_dict() for _ in range(r.randint(0, 2))],
        parts=[_text(r) for _ in range(r.randint(0, 3))], dead_letter_parts=[_text(r) for _ in range(r.randint(0, 2))],
        files=_files(r), files_quarantined=r.randint(0, 3), rows_reused=r.randint(0, 99),
        reuse_seconds_avoided=_num(r), host_facts=r.choice([{}, {"cores": r.randint(1, 64)}]), started_at=_text(r),
        finished_at=_text(r), status=r.choice(["complete", "failed"]),
    )


def _progress(r: random.Random) -> ShardProgress:
    return ShardProgress(shard_id=_text(r), status=_text(r), rows_total=r.randint(0, 10**6), rows_done=r.randint(0, 10**6),
                         rows_dead_letter=r.randint(0, 99), rows_per_s=_num(r), eta_s=r.choice([None, _num(r)]),
                         updated_at=_text(r), attempt_id=_text(r))


def _index_entry(r: random.Random) -> ShardIndexEntry:
    return ShardIndexEntry(run_dir=_text(r), shard_id=_text(r), fingerprint=_text(r),
                           resolved=r.choice([{}, {"dtype": "bfloat16"}]), rows_input=r.randint(0, 10**6), seconds=_num(r))


def _plan(r: random.Random) -> CarryOverPlan:
    return CarryOverPlan(
        keys={f"{i:05d}": _text(r) for i in range(r.randint(0, 3))},
        carried={f"{i:05d}": {"source_run_dir": _text(r), "source_shard_id": _text(r), "fingerprint": _text(r),
                              "seconds": _num(r)} for i in range(r.randint(0, 2))},
        pinned=r.choice([{}, {"fingerprint": _text(r), "resolved": {"dtype": "float32"}}]), disabled=_text(r))


def _canary(r: random.Random) -> CanaryResult:
    return CanaryResult(
        run_id=_text(r), fingerprint=_text(r), engine_kind=r.choice(["encoder", "llm"]), model_digest=_text(r),
        device=r.choice(["cpu", "cuda"]), device_name=_text(r), threads=r.randint(0, 64), sample_rows=r.randint(0, 999),
        sample_text_bytes=r.randint(0, 10**6), sample_tokens_real=r.randint(0, 10**6),
        sample_tokens_padded=r.randint(0, 10**6), model_load_seconds=_num(r), steady_rows_per_s=_num(r),
        steady_tokens_per_s=_num(r), worker_seconds_per_token=_num(r), padding_efficiency=r.choice([None, _num(r)]),
        strategy=r.choice(STRATEGIES), chosen={"token_budget": r.randint(1, 9999), "max_batch_rows": r.randint(1, 99)},
        shard_rows={"00000": r.randint(0, 99)}, shard_tokens={"00000": r.randint(0, 999)},
        shard_rows_cached={}, stage_seconds=_stages(r), trials=[_trial(r) for _ in range(r.randint(0, 3))],
        engine_fit=r.choice([{}, {"seconds_per_padded_token": _num(r), "seconds_per_batch": _num(r)}]),
        autotune_seconds=_num(r), profile_uri=_text(r), profile_reused=r.random() < 0.5,
        peak_rss_bytes=r.randint(0, 10**10), peak_device_bytes=r.choice([None, r.randint(0, 10**10)]),
        llm=r.choice([None, {"json_valid_rate": _num(r)}]), elapsed_seconds=_num(r), created_at=_text(r),
        speed_source=r.choice(["steady", "warmup", "none"]),
    )


def _profile(r: random.Random) -> TuningProfile:
    return TuningProfile(engine_kind=_text(r), model_digest=_text(r), device_name=_text(r),
                         chosen={"token_budget": r.randint(1, 9999)}, strategy=r.choice(STRATEGIES),
                         trials=[_trial(r) for _ in range(r.randint(0, 2))], threads=r.randint(0, 64),
                         run_id=_text(r), created_at=_text(r))


def _manifest(r: random.Random) -> Manifest:
    props = [f"p{r.randint(0, 99)}" for _ in range(3)]
    engine: dict[str, Any] = r.choice([
        {"kind": "encoder", "pooling": r.choice(["mean", "cls", "auto"])},
        {"kind": "llm", "model_path": "/m", "user_template": "{{ text }}", "max_tokens": r.randint(1, 512),
         "json_schema": {"type": "object", "properties": {p: {"type": "string"} for p in props}}},
    ])
    rows = r.randint(1, 100)
    cut = r.randint(0, rows)
    return Manifest(
        run_id=f"manual__{r.randint(0, 10**6)}",
        input=InputSpec(uri=_text(r) or "/x", format=r.choice(["parquet", "jsonl"]), id_column="id", text_column="text",
                        files=[InputFile(uri="/data/x", rows=rows, row_group_rows=[rows], size_bytes=r.choice([None, 9]))],
                        roots=r.choice([[], ["/data"]])),
        shards=[ShardSpec("00000", [Segment(0, 0, cut)], est_tokens=r.choice([None, 5])),
                ShardSpec("00001", [Segment(0, cut, rows)])],
        engine=engine, worker=WorkerSettings(chunk_rows=r.randint(1, 1000)), params={"table": _text(r)},
        created_at=_text(r),
    )


BUILDERS = {
    "attempt": _attempt, "marker": _marker, "progress": _progress, "index_entry": _index_entry,
    "carryover_plan": _plan, "canary": _canary, "tuning_profile": _profile, "manifest": _manifest,
}
"""Golden-file stem -> builder of one random record from a seeded ``random.Random``."""


def cases() -> list[tuple[str, Any]]:
    """``(golden file name, record)`` for every builder and seed."""
    return [(f"{name}-{seed}.json", build(random.Random(f"{name}:{seed}"))) for name, build in BUILDERS.items()
            for seed in SEEDS]


if __name__ == "__main__":  # write the golden files (only ever from code known to write the right bytes)
    GOLDEN_DIR.mkdir(exist_ok=True)
    for file_name, record in cases():
        (GOLDEN_DIR / file_name).write_bytes(record.to_json_bytes())
