"""Issue #35 on the worker side: a worker whose shard is already complete exits before torch is imported
(checked in a fresh interpreter's ``sys.modules``), still redoes a shard whose marker is of another config,
and the producer cuts chunks at one read of the chunk target while the main thread resizes it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from batch_contract import storage
from batch_contract.enums import ExitCode
from batch_contract.layout import RunLayout
from batch_contract.manifest import result_fingerprint
from batch_contract.marker import ShardMarker
from batch_contract.runstore import RunStore
from batch_contract.schemas import part_schema
from batch_contract.tokens import TokenCounts
from batch_worker import pipeline, runtime
from batch_worker.engines.base import ChunkOutput, ChunkRows, LoadedModel
from batch_worker.engines.encoder import EncoderEngine
from run_helpers import write_run

REPO = Path(__file__).resolve().parents[2]
ENGINE = {"kind": "encoder", "task": "classification"}  # dtype auto: resolving it imports torch


class LabelEngine(EncoderEngine):
    """The real encoder (model dir, digest, resolved settings) answering a label and a score per row
    without loading the model."""

    def load(self) -> LoadedModel:
        return LoadedModel(self.model_digest(), {"engine": "label"}, part_schema("classification"))

    def prepare(self, rows: ChunkRows) -> ChunkRows:
        return rows

    def resolved_settings(self) -> dict:
        return {"dtype": "float32"}  # what a CPU without bf16 resolves, without importing torch here

    def process(self, prepared: ChunkRows, should_stop) -> ChunkOutput:
        n = len(prepared)
        table = pa.table({"id": pa.array(prepared.ids, pa.string()), "n_tokens": pa.array(np.ones(n, np.int32)),
                          "truncated": pa.array(np.zeros(n, bool)), "label": pa.array(["a"] * n),
                          "score": pa.array(np.full(n, 0.5, np.float32))})
        return ChunkOutput(table=table, tokens=TokenCounts(real=n, padded=n))


@pytest.fixture
def run_dir(tmp_path: Path) -> str:
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(50)], "text": [f"text {i}" for i in range(50)]}), src)
    return write_run(tmp_path, src, engine=ENGINE, worker={"reuse": "off"})


def _complete(run_dir: str, monkeypatch: pytest.MonkeyPatch) -> ShardMarker:
    monkeypatch.setattr(runtime, "engine_class", lambda kind: LabelEngine)
    assert runtime.run_shard(run_dir, "00000", install_signals=False) == ExitCode.OK
    return RunStore.open(run_dir).marker("00000")


def test_complete_shard_worker_exits_before_importing_torch(run_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = _complete(run_dir, monkeypatch)
    before = sorted(p.name for p in (Path(run_dir) / "shards" / "00000").iterdir())
    code = ("import sys; from batch_worker.cli import main; "
            f"rc = main(['run', '--run-dir', {run_dir!r}, '--shard', '00000']); "
            "print(rc, 'torch' in sys.modules, 'vllm' in sys.modules)")
    env = {"PYTHONPATH": f"{REPO / 'plugins'}:{REPO / 'worker_image'}", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split() == ["0", "False", "False"], out.stderr[-2000:]
    assert "already complete" in out.stderr and marker.fingerprint in out.stderr
    assert sorted(p.name for p in (Path(run_dir) / "shards" / "00000").iterdir()) == before, "nothing written"


def test_marker_under_either_auto_dtype_completes_but_another_config_does_not(
        run_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = _complete(run_dir, monkeypatch)
    store = RunStore.open(run_dir)
    engine = LabelEngine(store.manifest.engine_config, store.manifest.worker)
    bf16 = result_fingerprint(store.manifest.config_fingerprint, engine.model_digest(), {"dtype": "bfloat16"})
    assert runtime.complete_before_load(run_dir, "00000") == marker
    uri = RunLayout(str(Path(run_dir).parents[1]), "test_run").marker_uri("00000")
    for fingerprint, complete in ((bf16, True), ("0" * 32, False)):
        storage.write_replace(uri, json.dumps({**json.loads(marker.to_json_bytes()),
                                                "fingerprint": fingerprint}).encode())
        found = runtime.complete_before_load(run_dir, "00000")
        assert (found is not None) is complete, fingerprint
    # the full path still treats the other config's marker as stale: deleted, the shard re-done
    assert runtime.run_shard(run_dir, "00000", install_signals=False) == ExitCode.OK
    assert RunStore.open(run_dir).marker("00000").fingerprint == marker.fingerprint


def test_chunks_are_cut_at_one_read_of_a_target_the_main_thread_resizes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The target grows at every read (as ``ChunkSizer.update`` may make it between two reads on the
    producer thread): every row still comes out exactly once."""
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(300)], "text": ["t"] * 300}), src, row_group_size=7)
    run_dir = write_run(tmp_path, src, engine=ENGINE, worker={"reuse": "off", "read_batch_rows": 7})
    reads = iter(range(5, 10_000))
    monkeypatch.setattr(pipeline.ChunkSizer, "target", lambda self: next(reads))
    monkeypatch.setattr(runtime, "engine_class", lambda kind: LabelEngine)
    assert runtime.run_shard(run_dir, "00000", install_signals=False) == ExitCode.OK
    parts = sorted((Path(run_dir) / "shards" / "00000").glob("part-*.parquet"))
    ids = pa.concat_arrays([pq.read_table(p).column("id").combine_chunks() for p in parts])
    assert len(parts) > 3 and len(ids) == 300 and len(pc.unique(ids)) == 300
