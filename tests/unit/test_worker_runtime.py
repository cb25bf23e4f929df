"""The worker runtime end to end with a tiny deterministic engine (no torch): chunked commit, id join,
dead letters, marker, resume, fingerprint change, signals and exit codes. The real-model runs are in
``tests/integration/test_worker_encoder.py``."""

from __future__ import annotations

import json
import os
import signal
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from batch_contract.enums import DeadLetterReason, EngineKind, ExitCode
from batch_contract.marker import AttemptRecord, ShardMarker
from batch_contract.schemas import part_schema
from batch_contract.tokens import TokenCounts
from batch_worker import cli, runtime
from batch_worker.engines.base import ChunkOutput, ChunkRows, Engine, LoadedModel, Reject
from run_helpers import write_run


def _vector(text: str) -> list[float]:
    return [float(len(text)), float(ord(text[0])), float(zlib.crc32(text.encode()) % 1000)]


class TinyEngine(Engine):
    """3-dim 'embedding' computed from the text; emits rows in reverse order (the runtime must join by id),
    rejects texts containing REJECT, stops between 2-row batches when asked."""

    kind = EngineKind.ENCODER
    signal_after_rows: int | None = None
    drop_one = False

    def model_digest(self) -> str:
        return f"tiny-{self.config.pooling}"

    def load(self) -> LoadedModel:
        return LoadedModel(self.model_digest(), {"engine": "tiny"}, part_schema("embedding", 3))

    def process(self, prepared: ChunkRows, should_stop) -> ChunkOutput:
        ids, vecs, rejects, interrupted = [], [], [], False
        for start in range(0, len(prepared), 2):
            if should_stop():
                interrupted = True
                break
            for i in range(start, min(start + 2, len(prepared))):
                if "REJECT" in prepared.texts[i]:
                    rejects.append(Reject(prepared.ids[i], DeadLetterReason.ENGINE_ERROR, "rejected"))
                else:
                    ids.append(prepared.ids[i])
                    vecs.append(_vector(prepared.texts[i]))
            if self.on_rows_done:
                self.on_rows_done(min(2, len(prepared) - start))
            TinyEngine.rows_seen = getattr(TinyEngine, "rows_seen", 0) + 2
            if self.signal_after_rows is not None and TinyEngine.rows_seen >= self.signal_after_rows:
                TinyEngine.signal_after_rows = None
                os.kill(os.getpid(), signal.SIGTERM)
        if self.drop_one and ids:
            ids, vecs = ids[1:], vecs[1:]
        ids, vecs = ids[::-1], vecs[::-1]
        n = len(ids)
        table = pa.table({
            "id": pa.array(ids, pa.string()),
            "n_tokens": pa.array([int(v[0]) for v in vecs], pa.int32()),
            "truncated": pa.array([False] * n),
            "embedding": pa.array(vecs, pa.list_(pa.float32(), 3)),
        })
        return ChunkOutput(table=table, rejects=rejects, interrupted=interrupted,
                           tokens=TokenCounts(real=sum(int(v[0]) for v in vecs),
                                              padded=sum(int(v[0]) for v in vecs) + n))


@pytest.fixture(autouse=True)
def tiny_engine(monkeypatch):
    monkeypatch.setattr(runtime, "engine_class", lambda kind: TinyEngine)
    TinyEngine.signal_after_rows = None
    TinyEngine.drop_one = False
    TinyEngine.rows_seen = 0


@pytest.fixture
def input_parquet(tmp_path: Path) -> Path:
    rng = np.random.default_rng(3)
    n = 60
    ids = [int(x) for x in rng.permutation(10_000)[:n]]  # deliberately unsorted ids
    texts = ["w" * int(k) + f" row{i}" for i, k in enumerate(rng.integers(1, 30, n))]
    texts[5], texts[17], texts[30] = None, "   ", "please REJECT me"
    ids[40] = ids[3]  # duplicate
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": ids, "text": texts}), path, row_group_size=16)
    return path


def _shard_dir(run_dir: str) -> Path:
    return Path(run_dir) / "shards" / "00000"


def _results(run_dir: str, fingerprint: str | None = None) -> pa.Table:
    d = _shard_dir(run_dir)
    t = pa.concat_tables([pq.read_table(p) for p in sorted(d.glob("part-*.parquet"))])
    return t.filter(pa.compute.equal(t["fingerprint"], fingerprint)) if fingerprint else t


def _dead(run_dir: str) -> pa.Table:
    return pa.concat_tables([pq.read_table(p) for p in sorted(_shard_dir(run_dir).glob("dead-letter-*.parquet"))])


def _files(run_dir: str) -> list[str]:
    return sorted(str(p.relative_to(run_dir)) for p in Path(run_dir).rglob("*") if p.is_file())


def test_complete_run_covers_every_row_once_joined_by_id(tmp_path: Path, input_parquet: Path) -> None:
    run_dir = write_run(tmp_path, input_parquet, worker={"chunk_rows": 7, "read_batch_rows": 5})
    assert runtime.run_shard(run_dir, "00000") == ExitCode.OK
    marker = ShardMarker.from_json_bytes((_shard_dir(run_dir) / "_SUCCESS.json").read_bytes())
    res, dead = _results(run_dir), _dead(run_dir)
    source = pq.read_table(input_parquet).to_pylist()
    text_by_id = {str(r["id"]): r["text"] for r in source[::-1]}  # first occurrence wins
    assert res.num_rows == len(set(res["id"].to_pylist())) == marker.rows_ok == 56
    assert dead.num_rows == marker.rows_dead_letter == 4
    assert marker.rows_ok + marker.rows_dead_letter == marker.rows_input == 60
    assert marker.dead_letter_reasons == {"null_text": 1, "empty_text": 1, "duplicate_id": 1, "engine_error": 1}
    for row in res.to_pylist():
        assert row["embedding"] == pytest.approx(_vector(text_by_id[row["id"]]))
    assert set(res["fingerprint"].to_pylist()) == {marker.fingerprint}
    assert marker.parts == sorted(p.name for p in _shard_dir(run_dir).glob("part-*"))
    assert len(marker.attempts) == 1 and marker.attempts[0]["exit_code"] == 0
    assert marker.tokens_padded == marker.tokens_real + 56
    progress = json.loads((_shard_dir(run_dir) / "_PROGRESS.json").read_text())
    assert progress["status"] == "complete" and progress["rows_done"] == 60


def test_rerun_of_complete_shard_writes_nothing(tmp_path: Path, input_parquet: Path) -> None:
    run_dir = write_run(tmp_path, input_parquet, worker={"chunk_rows": 20})
    assert runtime.run_shard(run_dir, "00000") == 0
    before = _files(run_dir)
    assert runtime.run_shard(run_dir, "00000") == 0
    assert _files(run_dir) == before


def test_resume_redoes_only_the_lost_chunk(tmp_path: Path, input_parquet: Path) -> None:
    run_dir = write_run(tmp_path, input_parquet, worker={"chunk_rows": 10, "reuse": "off"})  # cache would refill it
    assert runtime.run_shard(run_dir, "00000") == 0
    d = _shard_dir(run_dir)
    (d / "_SUCCESS.json").unlink()
    lost = sorted(d.glob("part-*"))[-1]
    lost_rows = pq.read_table(lost).num_rows
    lost.unlink()
    (d / ".tmp-part-00099-x.parquet-1").write_bytes(b"partial")  # stray temp file of a killed writer
    assert runtime.run_shard(run_dir, "00000") == 0
    marker = ShardMarker.from_json_bytes((d / "_SUCCESS.json").read_bytes())
    assert marker.attempts[-1]["rows_processed"] == lost_rows
    assert marker.attempts[-1]["rows_skipped_resume"] == 60 - lost_rows  # results by id, dead letters by position
    assert not list(d.glob(".tmp-*"))
    assert _results(run_dir).num_rows == 56


def test_all_rows_committed_before_restart_writes_marker_and_no_empty_part(tmp_path: Path, input_parquet: Path) -> None:
    run_dir = write_run(tmp_path, input_parquet, worker={"chunk_rows": 25})
    assert runtime.run_shard(run_dir, "00000") == 0
    d = _shard_dir(run_dir)
    (d / "_SUCCESS.json").unlink()
    parts = sorted(p.name for p in d.glob("*.parquet"))
    assert runtime.run_shard(run_dir, "00000") == 0
    assert sorted(p.name for p in d.glob("*.parquet")) == parts
    assert (d / "_SUCCESS.json").exists()


def test_changed_engine_config_redoes_every_row(tmp_path: Path, input_parquet: Path) -> None:
    run_dir = write_run(tmp_path, input_parquet, worker={"chunk_rows": 25})
    assert runtime.run_shard(run_dir, "00000") == 0
    old = ShardMarker.from_json_bytes((_shard_dir(run_dir) / "_SUCCESS.json").read_bytes())
    write_run(tmp_path, input_parquet, worker={"chunk_rows": 25}, engine={"kind": "encoder", "pooling": "cls"})
    assert runtime.run_shard(run_dir, "00000") == 0
    new = ShardMarker.from_json_bytes((_shard_dir(run_dir) / "_SUCCESS.json").read_bytes())
    assert new.fingerprint != old.fingerprint
    assert _results(run_dir, new.fingerprint).num_rows == 56
    assert new.attempts[-1]["rows_skipped_resume"] == 0 and len(new.attempts) == 1
    assert not set(new.parts) & set(old.parts)


def test_sigterm_commits_finished_rows_and_exits_75_then_rerun_completes(tmp_path: Path, input_parquet: Path) -> None:
    run_dir = write_run(tmp_path, input_parquet, worker={"chunk_rows": 20, "grace_seconds": 30})
    TinyEngine.signal_after_rows = 26  # mid second chunk
    assert runtime.run_shard(run_dir, "00000") == ExitCode.INTERRUPTED
    d = _shard_dir(run_dir)
    assert not (d / "_SUCCESS.json").exists()
    attempt = AttemptRecord.from_json_bytes(next((d / "attempts").glob("*.json")).read_bytes())
    assert attempt.exit_code == 75 and attempt.status == "interrupted"
    assert 20 < attempt.rows_committed < 60  # first chunk + the finished rows of the second
    assert signal.getsignal(signal.SIGTERM) is not None
    assert runtime.run_shard(run_dir, "00000") == 0
    assert _results(run_dir).num_rows == 56 and len(set(_results(run_dir)["id"].to_pylist())) == 56


def test_cli_exit_codes(tmp_path: Path, input_parquet: Path, capsys) -> None:
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"id": [1.5], "text": ["a"]}), bad)
    assert cli.main(["run", "--run-dir", write_run(tmp_path / "b", bad), "--shard", "00000"]) == 2
    assert cli.main(["run", "--run-dir", str(tmp_path / "runs" / "nope"), "--shard", "00000"]) == 2
    run_dir = write_run(tmp_path, input_parquet)
    assert cli.main(["run", "--run-dir", run_dir, "--shard", "00009"]) == 2
    TinyEngine.drop_one = True
    assert cli.main(["run", "--run-dir", run_dir, "--shard", "00000"]) == 1
    assert not (_shard_dir(run_dir) / "_SUCCESS.json").exists()
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    assert "75" in capsys.readouterr().out


def test_heap_trim_reports_glibc_free_bytes_and_trims_only_above_the_limit() -> None:
    from batch_worker import stats

    free = stats.heap_free_bytes()
    if free is None:
        pytest.skip("no glibc mallinfo2 here")
    blocks = [bytearray(64 * 1024) for _ in range(512)]  # 32 MiB below the mmap threshold: heap memory
    keep = blocks[1::2]  # free every other block: holes the heap cannot shrink past
    del blocks
    assert stats.heap_free_bytes() >= 16 << 20
    assert stats.trim_heap_above(1 << 50) is False
    assert stats.trim_heap_above(0) is True
    assert len(keep) == 256


def test_encoder_module_caps_torch_shape_caches_before_torch_loads() -> None:
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("LRU_CACHE_CAPACITY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY")}
    code = ("import os, sys; import batch_worker.engines.encoder; "
            "print(os.environ['LRU_CACHE_CAPACITY'], os.environ['ONEDNN_PRIMITIVE_CACHE_CAPACITY'], 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["16", "16", "False"]
