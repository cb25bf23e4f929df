"""The worker end to end with the LLM engine (``python -m batch_worker run``, real vLLM on CPU): marker
token accounting, guards as dead letters, resume after SIGKILL, and a changed template re-doing rows."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("vllm")

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from batch_contract.layout import RunLayout  # noqa: E402
from batch_contract.marker import AttemptRecord, ShardMarker  # noqa: E402
from llm_helpers import REPO, llm_engine_dict, write_llm_run  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.llm]

TEMPLATE = "{% if section %}Package {{ id }} ({{ section }}): {{ text }}{% endif %}"
SHARD = "00000"


def run_worker(run_dir: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(worker_cmd(run_dir), env=worker_env(), capture_output=True, text=True, timeout=timeout)


def worker_cmd(run_dir: str) -> list[str]:
    return [sys.executable, "-m", "batch_worker", "run", "--run-dir", run_dir, "--shard", SHARD, "--log-level", "WARNING"]


def worker_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "plugins"), str(REPO / "worker_image")])
    return env


def shard_dir(run_dir: str) -> Path:
    return Path(RunLayout.from_run_dir(run_dir).shard_dir(SHARD))


def read_parts(run_dir: str, prefix: str = "part-") -> pa.Table:
    files = sorted(shard_dir(run_dir).glob(f"{prefix}*.parquet"))
    return pa.concat_tables([pq.read_table(f) for f in files]) if files else pa.table({})


def marker_of(run_dir: str) -> ShardMarker:
    return ShardMarker.from_json_bytes((shard_dir(run_dir) / "_SUCCESS.json").read_bytes())


def input_table(sample_rows: pa.Table, n: int) -> pa.Table:
    """``n`` sample rows plus one row too long for the context and one whose template renders empty."""
    rows = [{**r, "text": r["text"][:1200]} for r in sample_rows.slice(0, n).to_pylist()]  # all fit the context
    rows.append({"id": "zz-too-long", "section": "utils", "text": "word " * 1200})
    rows.append({"id": "zz-no-section", "section": "", "text": "a package with no section"})
    return pa.Table.from_pylist(rows, schema=sample_rows.schema)


@pytest.fixture(scope="module")
def completed_run(tmp_path_factory, tiny_model, sample_rows) -> str:
    root = tmp_path_factory.mktemp("llm-worker")
    engine = llm_engine_dict(tiny_model, user_template=TEMPLATE)
    run_dir = write_llm_run(root, input_table(sample_rows, 100), engine, worker={"chunk_rows": 32})
    proc = run_worker(run_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


def test_marker_carries_token_totals_and_guards_are_dead_letters(completed_run):
    marker = marker_of(completed_run)
    parts = read_parts(completed_run)
    ids = parts.column("id").to_pylist()
    assert len(ids) == len(set(ids)) == marker.rows_ok == 100
    assert marker.rows_dead_letter == 2 and marker.rows_input == 102
    assert marker.dead_letter_reasons == {"too_long": 1, "empty_prompt": 1}
    dead = read_parts(completed_run, "dead-letter-").to_pylist()
    assert {(d["id"], d["reason"]) for d in dead} == {("zz-too-long", "too_long"), ("zz-no-section", "empty_prompt")}
    # marker totals are the per-row figures vLLM reported, summed
    assert marker.tokens_prompt == sum(parts.column("prompt_tokens").to_pylist()) > 0
    assert marker.tokens_cached == sum(parts.column("cached_tokens").to_pylist()) > 0
    assert marker.tokens_output == sum(parts.column("output_tokens").to_pylist()) > 0
    assert parts.column("n_tokens").to_pylist() == parts.column("prompt_tokens").to_pylist()
    assert set(parts.column("finish_reason").to_pylist()) <= {"stop", "length"}
    assert marker.prefix_cache_hit_rate is not None and marker.prefix_cache_hit_rate > 0.5
    assert marker.engine["engine"] == "vllm" and marker.engine["prefix_tokens"] >= 256


def test_changed_template_redoes_every_row(completed_run, tmp_path, tiny_model):
    root = tmp_path / "copy"
    shutil.copytree(Path(completed_run).parents[1], root)
    run_dir = str(root / "runs" / Path(completed_run).name)
    old = marker_of(run_dir)
    old_parts = sorted(p.name for p in shard_dir(run_dir).glob("part-*.parquet"))
    engine = llm_engine_dict(tiny_model, user_template=TEMPLATE.replace("Package", "Debian package"))
    write_llm_run(root, pa.table({}), engine, worker={"chunk_rows": 32})  # same run, new manifest
    proc = run_worker(run_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    new = marker_of(run_dir)
    assert new.fingerprint != old.fingerprint and new.rows_ok == 100
    fresh = [p for p in sorted(shard_dir(run_dir).glob("part-*.parquet")) if p.name not in old_parts]
    redone = pa.concat_tables([pq.read_table(p) for p in fresh])
    assert set(redone.column("fingerprint").to_pylist()) == {new.fingerprint}
    assert sorted(redone.column("id").to_pylist()) == sorted(read_parts(completed_run).column("id").to_pylist())
    latest = AttemptRecord.from_json_bytes(
        sorted((shard_dir(run_dir) / "attempts").glob("*.json"))[-1].read_bytes())
    assert latest.rows_skipped_resume == 0  # nothing of the old template was reused


def test_resume_after_sigkill_redoes_only_uncommitted_rows(tmp_path, tiny_model, sample_rows):
    engine = llm_engine_dict(tiny_model, user_template=TEMPLATE, max_tokens=16)
    run_dir = write_llm_run(tmp_path, input_table(sample_rows, 240), engine, worker={"chunk_rows": 8})
    proc = subprocess.Popen(worker_cmd(run_dir), env=worker_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    try:
        while len(list(shard_dir(run_dir).glob("part-*.parquet"))) < 2:
            assert proc.poll() is None, f"worker exited early: {proc.stderr.read()[-3000:]}"
            assert time.monotonic() < deadline, "no part committed in time"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
        proc.stderr.close()
    assert not (shard_dir(run_dir) / "_SUCCESS.json").exists(), "the worker finished before the kill"
    first = {p.name: p.read_bytes() for p in shard_dir(run_dir).glob("*.parquet")}
    committed = set(read_parts(run_dir).column("id").to_pylist())
    assert committed

    done = run_worker(run_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    marker = marker_of(run_dir)
    ids = read_parts(run_dir).column("id").to_pylist()
    assert len(ids) == len(set(ids)) == marker.rows_ok == 240  # every id exactly once
    assert marker.rows_dead_letter == 2
    for name, data in first.items():  # first attempt's commits kept as they were
        assert (shard_dir(run_dir) / name).read_bytes() == data
    attempts = [json.loads(p.read_bytes()) for p in sorted((shard_dir(run_dir) / "attempts").glob("*.json"))]
    assert len(attempts) == 2
    assert attempts[-1]["rows_skipped_resume"] >= len(committed)
    assert attempts[0]["status"] == "running"  # killed: its record was never closed


def test_a_second_run_reuses_every_keyed_row_from_the_result_cache(completed_run, tiny_model, sample_rows):
    """Same root, same input, new run: every row with a rendered prompt comes from the cache (keyed by
    the whole rendered prompt), bit for bit; rows the template rejects have no key and are dead-lettered
    again by the engine."""
    root = Path(completed_run).parents[1]
    engine = llm_engine_dict(tiny_model, user_template=TEMPLATE)
    run_dir = write_llm_run(root, input_table(sample_rows, 100), engine, worker={"chunk_rows": 32},
                            run_id="llm_run_again")
    proc = run_worker(run_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    first, again = marker_of(completed_run), marker_of(run_dir)
    assert again.fingerprint == first.fingerprint
    assert again.rows_reused == again.rows_ok == 100  # zz-too-long has a key but no cached result
    assert again.dead_letter_reasons == {"too_long": 1, "empty_prompt": 1}
    cols = ["id", "output_text", "output_json", "prompt_tokens", "output_tokens", "finish_reason"]
    before = {r["id"]: r for r in read_parts(completed_run).select(cols).to_pylist()}
    after = {r["id"]: r for r in read_parts(run_dir).select(cols).to_pylist()}
    assert after == before
