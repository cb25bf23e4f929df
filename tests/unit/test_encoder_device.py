"""The encoder's device path, exercised on CPU: reused staging buffers and one output tensor per chunk
(the sync-free CUDA structure), an out-of-memory batch split and retried, the device-derived row cap,
and the NVML device the GPU sampler picks."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch
from batch_contract.engine_config import (
    AUTO_MAX_BATCH_ROWS,
    CUDA_MIN_ROW_TOKENS,
    EncoderConfig,
    WorkerSettings,
)
from batch_contract.enums import DeadLetterReason
from batch_worker.engines import device_io
from batch_worker.engines.base import ChunkRows
from batch_worker.engines.encoder import COMPILE_PAD_MULTIPLE, EncoderEngine
from batch_worker.stats import _nvml_handle

TEXTS = [f"{k} " + ("word " * n).strip() for n in (3, 40, 120, 64, 15, 90) for k in range(4)]
"""24 rows: six lengths, four rows each, so token-budget batches hold several rows."""



def _rows() -> ChunkRows:
    ids = [f"r{i}" for i in range(len(TEXTS))]
    return ChunkRows(ids=ids, texts=list(TEXTS), text_repaired=[False] * len(ids), source_uri=["x"] * len(ids),
                     source_row=list(range(len(ids))), fields=pa.table({"id": ids}))


@pytest.fixture(scope="module")
def engine() -> EncoderEngine:
    eng = EncoderEngine(EncoderConfig(dtype="float32"), WorkerSettings(token_budget=256))
    eng.load()
    return eng


def _embed(eng: EncoderEngine) -> tuple[dict[str, np.ndarray], list]:
    out = eng.process(eng.prepare(_rows()), lambda: False)
    vectors = dict(zip(out.table.column("id").to_pylist(), np.asarray(out.table.column("embedding").to_pylist()),
                       strict=True))
    return vectors, out.rejects


def test_staging_buffers_are_reused_across_batches(engine: EncoderEngine) -> None:
    staging = device_io.Staging(torch, "cpu")
    first = staging.batch(4, 16, pad_id=0)
    second = staging.batch(4, 16, pad_id=0)
    third = staging.batch(2, 8, pad_id=7)
    assert first.slot != second.slot and third.slot == first.slot, "two slots in rotation"
    assert np.shares_memory(first.input_ids, third.input_ids), "a slot's memory is reused, not reallocated"
    assert (third.input_ids == 7).all() and (third.mask == 0).all(), "a reused slot is cleared"
    ids_t, mask_t, idx_t = staging.to_device(third)
    assert ids_t.shape == (2, 8) and idx_t.shape == (2,) and staging.slots[third.slot].event is None


def test_many_small_batches_equal_one_batch_per_row(engine: EncoderEngine) -> None:
    """Outputs scattered into one tensor per chunk land on the right rows, whatever the batching."""
    batched, rejects = _embed(engine)
    assert not rejects and len(batched) == len(TEXTS)
    single = EncoderEngine(EncoderConfig(dtype="float32"), WorkerSettings(token_budget=256, max_batch_rows=1))
    single.load()
    alone, _ = _embed(single)
    for rid, vec in alone.items():
        assert float(np.dot(vec, batched[rid])) > 0.9999, rid


def test_out_of_memory_splits_the_batch_lowers_the_budget_and_loses_nothing(engine, monkeypatch) -> None:
    reference, _ = _embed(engine)
    eng = EncoderEngine(EncoderConfig(dtype="float32"), WorkerSettings(token_budget=4096))
    eng.load()
    real = eng._forward

    def forward(ids_t, mask_t):
        if ids_t.shape[0] > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")
        return real(ids_t, mask_t)

    monkeypatch.setattr(eng, "_forward", forward)
    got, rejects = _embed(eng)
    assert not rejects and eng.oom_splits > 0
    assert eng.token_budget < 4096, "the budget for the rest of the shard is lowered"
    for rid, vec in reference.items():
        assert float(np.dot(vec, got[rid])) > 0.9999, rid


def test_a_row_that_does_not_fit_alone_is_dead_lettered_not_fatal(engine, monkeypatch) -> None:
    eng = EncoderEngine(EncoderConfig(dtype="float32"), WorkerSettings(token_budget=4096))
    eng.load()
    real = eng._forward
    longest = max(len(engine.prepare(_rows()).token_ids[i]) for i in range(len(TEXTS)))

    def forward(ids_t, mask_t):
        if int(mask_t.sum(dim=1).max()) >= longest:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(ids_t, mask_t)

    monkeypatch.setattr(eng, "_forward", forward)
    got, rejects = _embed(eng)
    longest_ids = {f"r{i}" for i in range(8, 12)}
    assert [r.reason for r in rejects] == [DeadLetterReason.ENGINE_ERROR] * 4
    assert {r.id for r in rejects} == longest_ids and "out of device memory" in rejects[0].detail
    assert set(got) == {f"r{i}" for i in range(len(TEXTS))} - longest_ids


def test_other_errors_still_raise(engine, monkeypatch) -> None:
    monkeypatch.setattr(engine, "_forward", lambda ids_t, mask_t: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        engine.process(engine.prepare(_rows()), lambda: False)


def test_row_cap_and_padding_follow_the_device() -> None:
    auto = WorkerSettings()
    assert auto.max_batch_rows_for("cpu") == AUTO_MAX_BATCH_ROWS
    assert auto.max_batch_rows_for("cuda") == auto.token_budget_for("cuda") // CUDA_MIN_ROW_TOKENS == 4096
    assert WorkerSettings(max_batch_rows=32).max_batch_rows_for("cuda") == 32
    eng = EncoderEngine(EncoderConfig(compile=True), WorkerSettings())
    assert eng._pad_multiple() == COMPILE_PAD_MULTIPLE
    assert EncoderEngine(EncoderConfig(), WorkerSettings())._pad_multiple() == EncoderConfig().pad_to_multiple_of


class _FakeNvml:
    def nvmlDeviceGetHandleByUUID(self, uuid):  # noqa: N802 - NVML's own name
        return ("uuid", uuid)

    def nvmlDeviceGetHandleByIndex(self, index):  # noqa: N802
        return ("index", index)


@pytest.mark.parametrize(("uuid", "visible", "expected"), [
    ("GPU-abc", "3", ("uuid", "GPU-abc")),
    (None, "3,1", ("index", 3)),
    (None, "GPU-def,GPU-xyz", ("uuid", "GPU-def")),
    (None, "", ("index", 0)),
])
def test_gpu_sampler_samples_the_device_in_use(monkeypatch, uuid, visible, expected) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert _nvml_handle(_FakeNvml(), uuid) == expected
