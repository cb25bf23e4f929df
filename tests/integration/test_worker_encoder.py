"""The worker with the real all-MiniLM-L6-v2 on a few hundred real rows: correctness against a
one-row-at-a-time reference, SIGKILL/SIGTERM recovery, and re-doing every row after a model or pooling
change."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from batch_contract.marker import AttemptRecord, ShardMarker
from batch_worker.engines.encoder import default_model_path
from batch_worker.runtime import run_shard
from run_helpers import REPO_ROOT, SAMPLE_PARQUET, write_run

pytestmark = pytest.mark.integration

FP32 = {"kind": "encoder", "dtype": "float32"}
N_ROWS = 240


@pytest.fixture(scope="module")
def rows_parquet(tmp_path_factory) -> Path:
    """240 real rows, shuffled (ids out of order) and with a few very long texts (truncation)."""
    table = pq.read_table(SAMPLE_PARQUET).slice(0, N_ROWS)
    rng = np.random.default_rng(7)
    table = table.take(pa.array(rng.permutation(N_ROWS)))
    texts = table.column("text").to_pylist()
    for i in (3, 50):
        texts[i] = (texts[i] + " ") * 60  # > 256 tokens
    table = table.set_column(table.schema.get_field_index("text"), "text", pa.array(texts))
    path = tmp_path_factory.mktemp("input") / "rows.parquet"
    pq.write_table(table, path, row_group_size=64)
    return path


def _shard_dir(run_dir: str) -> Path:
    return Path(run_dir) / "shards" / "00000"


def _marker(run_dir: str) -> ShardMarker:
    return ShardMarker.from_json_bytes((_shard_dir(run_dir) / "_SUCCESS.json").read_bytes())


def _embeddings(run_dir: str, fingerprint: str) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    shard = _shard_dir(run_dir)  # files of an earlier fingerprint are set aside in quarantine/
    for p in sorted(shard.glob("part-*.parquet")) + sorted(shard.glob("quarantine/part-*.parquet")):
        t = pq.read_table(p)
        if set(t.column("fingerprint").to_pylist()) != {fingerprint}:
            continue
        for rid, emb in zip(t.column("id").to_pylist(), t.column("embedding").to_pylist(), strict=True):
            assert rid not in out, f"id {rid} committed twice"
            out[rid] = np.asarray(emb, dtype=np.float32)
    return out


@pytest.fixture(scope="module")
def reference_run(rows_parquet: Path, tmp_path_factory) -> tuple[str, dict[str, np.ndarray]]:
    """An uninterrupted fp32 run with small chunks and a small token budget (many mixed batches)."""
    root = tmp_path_factory.mktemp("ref")
    run_dir = write_run(root, rows_parquet, engine=FP32, worker={"chunk_rows": 80, "token_budget": 2048})
    assert run_shard(run_dir, "00000") == 0
    return run_dir, _embeddings(run_dir, _marker(run_dir).fingerprint)


def _cosines(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> np.ndarray:
    assert a.keys() == b.keys()
    keys = sorted(a)
    x = np.stack([a[k] for k in keys])
    y = np.stack([b[k] for k in keys])
    return (x * y).sum(1) / (np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1))


def test_each_embedding_equals_one_row_at_a_time_reference(reference_run, rows_parquet: Path) -> None:
    from sentence_transformers import SentenceTransformer

    run_dir, got = reference_run
    table = pq.read_table(rows_parquet)
    ids = [str(i) for i in table.column("id").to_pylist()]
    texts = table.column("text").to_pylist()
    model = SentenceTransformer(default_model_path(), device="cpu")
    ref = {rid: model.encode([t], batch_size=1, normalize_embeddings=True)[0] for rid, t in zip(ids, texts, strict=True)}
    cos = _cosines(got, ref)
    assert cos.min() >= 0.999, f"worst cosine {cos.min():.6f}"
    marker = _marker(run_dir)
    assert marker.rows_ok == N_ROWS and marker.rows_truncated >= 2  # the two padded-out texts, and more
    assert marker.engine["dtype"] == "float32" and marker.engine["pooling"] == "mean"
    # the CPU fast path's packed linears with GELU fused; fp32 keeps SDPA attention
    assert marker.engine["attention"] == "sdpa"
    # native BERT (no transformers import): six linears in each of the six layers, no pooler
    assert marker.engine["implementation"] == "native_bert"
    assert marker.engine["packed_linears"] == 36 and marker.engine["fused_gelu"] == 6
    assert all(abs(np.linalg.norm(v) - 1.0) < 1e-4 for v in got.values())


def test_bf16_fast_path_matches_the_fp32_reference(reference_run, rows_parquet: Path, tmp_path: Path) -> None:
    """The default dtype (bf16 where the CPU runs it natively) with the whole CPU fast path: chunked
    attention over padded batches and packed linears, against the fp32 run row by row."""
    from batch_worker.engines.encoder import cpu_supports_bf16

    _, ref = reference_run
    run_dir = write_run(tmp_path, rows_parquet, engine={"kind": "encoder"}, worker={"token_budget": 2048})
    assert run_shard(run_dir, "00000") == 0
    marker = _marker(run_dir)
    got = _embeddings(run_dir, marker.fingerprint)
    assert _cosines(got, ref).min() >= 0.999
    if cpu_supports_bf16():
        assert marker.engine["dtype"] == "bfloat16" and marker.engine["attention"] == "batch_worker_chunked"


def _worker_cmd(run_dir: str) -> list[str]:
    return [sys.executable, "-m", "batch_worker", "run", "--run-dir", run_dir, "--shard", "00000"]


def _env() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT / "plugins"), str(REPO_ROOT / "worker_image")])
    return env


def _wait_for_part(shard_dir: Path, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if list(shard_dir.glob("part-*.parquet")):
            return
        time.sleep(0.05)


def test_sigkill_at_random_points_then_rerun_gives_every_id_once(reference_run, rows_parquet, tmp_path) -> None:
    ref_dir, ref = reference_run
    run_dir = write_run(tmp_path, rows_parquet, engine=FP32, worker={"chunk_rows": 30, "token_budget": 4096})
    shard = _shard_dir(run_dir)
    rng = random.Random(1234)
    kills = 0
    for _ in range(3):
        if (shard / "_SUCCESS.json").exists():
            break
        started = len(list((shard / "attempts").glob("*.json")))
        parts_before = len(list(shard.glob("part-*.parquet")))
        proc = subprocess.Popen(_worker_cmd(run_dir), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while len(list((shard / "attempts").glob("*.json"))) == started and time.monotonic() < deadline:
            time.sleep(0.02)  # the attempt record exists: the kill lands in model load, inference or commit
        # a random point measured in committed chunks (0-2 more of the shard's 8), not in seconds, so the
        # kill lands mid-shard however fast or loaded the machine is
        target = parts_before + rng.randint(0, 2)
        while proc.poll() is None and len(list(shard.glob("part-*.parquet"))) < target and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.3))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait(timeout=60)
        assert not (shard / "_SUCCESS.json").exists() or proc.returncode == 0
    assert kills >= 1
    assert subprocess.run(_worker_cmd(run_dir), env=_env(), capture_output=True, timeout=300).returncode == 0
    marker = _marker(run_dir)
    got = _embeddings(run_dir, marker.fingerprint)
    assert sorted(got) == sorted(ref) and len(got) == N_ROWS
    assert marker.fingerprint == _marker(ref_dir).fingerprint
    assert _cosines(got, ref).min() >= 0.999
    assert not list(shard.glob(".tmp-*"))
    killed = [a for a in marker.attempts if a["exit_code"] is None]
    assert len(killed) == kills  # a killed attempt never rewrote its record at exit


def test_sigterm_exits_75_within_grace_and_rerun_completes(rows_parquet: Path, tmp_path: Path) -> None:
    grace = 8.0
    run_dir = write_run(tmp_path, rows_parquet, worker={"chunk_rows": 20, "grace_seconds": grace})
    shard = _shard_dir(run_dir)
    proc = subprocess.Popen(_worker_cmd(run_dir), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _wait_for_part(shard, proc)
    assert proc.poll() is None, "worker finished before the signal; make the input bigger"
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=grace + 30)
    elapsed = time.monotonic() - t0
    assert code == 75, proc.stderr.read().decode()[-2000:]
    assert elapsed <= grace
    assert not (shard / "_SUCCESS.json").exists()
    records = [AttemptRecord.from_json_bytes(p.read_bytes()) for p in (shard / "attempts").glob("*.json")]
    assert [r.exit_code for r in records] == [75] and records[0].rows_committed >= 20
    assert run_shard(run_dir, "00000") == 0
    marker = _marker(run_dir)
    assert marker.rows_ok == N_ROWS and len(_embeddings(run_dir, marker.fingerprint)) == N_ROWS
    assert marker.attempts[-1]["rows_skipped_resume"] == records[0].rows_committed


def _model_copy(dst: Path) -> Path:
    """A model directory identical to MiniLM except one config byte (a different model digest)."""
    src = Path(default_model_path())
    for p in src.rglob("*"):
        target = dst / p.relative_to(src)
        if p.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        elif p.name != "config.json" or p.parent != src:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(p)
    (dst / "config.json").write_text((src / "config.json").read_text().rstrip()[:-1] + ',\n  "_note": "copy"\n}\n')
    return dst


def test_rerun_after_changing_pooling_or_model_redoes_every_row(rows_parquet: Path, tmp_path: Path) -> None:
    rows = 60
    run_dir = write_run(tmp_path, rows_parquet, rows=rows, worker={"chunk_rows": 30})
    assert run_shard(run_dir, "00000") == 0
    first = _marker(run_dir)
    mean = _embeddings(run_dir, first.fingerprint)
    configs = [
        {"kind": "encoder", "pooling": "cls"},
        {"kind": "encoder", "model_path": str(_model_copy(tmp_path / "model"))},
    ]
    fingerprints = {first.fingerprint}
    for engine in configs:
        write_run(tmp_path, rows_parquet, rows=rows, worker={"chunk_rows": 30}, engine=engine)
        assert run_shard(run_dir, "00000") == 0
        marker = _marker(run_dir)
        assert marker.fingerprint not in fingerprints
        fingerprints.add(marker.fingerprint)
        redone = [a for a in marker.attempts if a["fingerprint"] == marker.fingerprint]
        assert len(redone) == 1 and redone[0]["rows_skipped_resume"] == 0 and redone[0]["rows_processed"] == rows
        assert len(_embeddings(run_dir, marker.fingerprint)) == rows
        stale = {f for f in fingerprints - {marker.fingerprint}}
        left = {fp for p in _shard_dir(run_dir).glob("*.parquet") for fp in pq.read_table(p)["fingerprint"].to_pylist()}
        assert not left & stale, "parts of an earlier fingerprint are quarantined, not left beside the new ones"
        assert marker.files_quarantined > 0
    cls = _embeddings(run_dir, sorted(fingerprints - {first.fingerprint, marker.fingerprint})[0])
    assert _cosines(mean, cls).mean() < 0.99  # cls pooling really changed the outputs


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory) -> Path:
    """MiniLM with a (seeded, untrained) 3-label sequence-classification head, saved locally."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(0)
    labels = {0: "neg", 1: "neu", 2: "pos"}
    model = AutoModelForSequenceClassification.from_pretrained(
        default_model_path(), num_labels=3, id2label=labels, label2id={v: k for k, v in labels.items()}
    )
    out = tmp_path_factory.mktemp("classifier")
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(default_model_path()).save_pretrained(out)
    return out


def test_classification_model_gives_label_and_score_per_row(classifier_dir: Path, rows_parquet: Path, tmp_path) -> None:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    rows = 40
    engine = {"kind": "encoder", "task": "classification", "model_path": str(classifier_dir), "dtype": "float32"}
    run_dir = write_run(tmp_path, rows_parquet, rows=rows, engine=engine, worker={"token_budget": 1024})
    assert run_shard(run_dir, "00000") == 0
    marker = _marker(run_dir)
    table = pa.concat_tables([pq.read_table(p) for p in _shard_dir(run_dir).glob("part-*.parquet")])
    assert table.num_rows == rows and marker.engine["task"] == "classification"
    got = dict(zip(table.column("id").to_pylist(), zip(table.column("label").to_pylist(),
                                                         table.column("score").to_pylist(), strict=True), strict=True))
    source = pq.read_table(rows_parquet).slice(0, rows)
    tok = AutoTokenizer.from_pretrained(classifier_dir)
    model = AutoModelForSequenceClassification.from_pretrained(classifier_dir).eval()
    for rid, text in zip(source.column("id").to_pylist(), source.column("text").to_pylist(), strict=True):
        with torch.inference_mode():
            enc = tok(text, truncation=True, max_length=marker.engine["max_length"], return_tensors="pt")
            probs = torch.softmax(model(**enc).logits, -1)[0]
        label, score = got[str(rid)]
        assert label == model.config.id2label[int(probs.argmax())]
        assert score == pytest.approx(float(probs.max()), abs=1e-4)
