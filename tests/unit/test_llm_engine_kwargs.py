"""The LLM engine's vLLM arguments and device detection, without vLLM: scheduler limits default to
vLLM's own (only set values are passed; CPU caps them) and the GPU check goes through NVML, never
``torch.cuda`` (CUDA initialised in the parent before vLLM starts its engine breaks fork)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
from batch_contract.engine_config import WorkerSettings
from batch_contract.llm_config import LLMConfig
from batch_worker.engines import llm
from batch_worker.engines.llm import CPU_MAX_NUM_SEQS, LLMEngine


def _engine(tmp_path: Path, **overrides) -> LLMEngine:
    (tmp_path / "config.json").write_text("{}")
    return LLMEngine(LLMConfig.from_dict({"kind": "llm", "model_path": str(tmp_path), "max_tokens": 16, **overrides}), WorkerSettings())


def test_unset_scheduler_limits_are_left_to_vllm_on_gpu(tmp_path: Path) -> None:
    kwargs = _engine(tmp_path).engine_kwargs(on_cpu=False)
    assert "max_num_seqs" not in kwargs and "max_num_batched_tokens" not in kwargs


def test_set_scheduler_limits_are_passed_and_cpu_caps_them(tmp_path: Path) -> None:
    eng = _engine(tmp_path, max_num_seqs=2048, max_num_batched_tokens=32768)
    gpu = eng.engine_kwargs(on_cpu=False)
    assert (gpu["max_num_seqs"], gpu["max_num_batched_tokens"]) == (2048, 32768)
    assert eng.engine_kwargs(on_cpu=True)["max_num_seqs"] == CPU_MAX_NUM_SEQS
    assert _engine(tmp_path).engine_kwargs(on_cpu=True)["max_num_seqs"] == CPU_MAX_NUM_SEQS


class _FakeNvml(types.SimpleNamespace):
    def __init__(self, names: list[str]) -> None:
        super().__init__(names=names)

    def nvmlInit(self) -> None:  # noqa: N802 - NVML's own names
        pass

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.names)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:  # noqa: N802
        return i

    def nvmlDeviceGetName(self, handle: int) -> bytes:  # noqa: N802
        return self.names[handle].encode()


@pytest.mark.parametrize(("names", "visible", "expected"), [
    ([], None, []),
    (["H200", "H100"], None, ["H200", "H100"]),
    (["H200", "H100"], "1", ["H100"]),
    (["H200"], "", []),
])
def test_gpu_detection_uses_nvml_and_honours_visible_devices(monkeypatch, names, visible, expected) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _FakeNvml(names))
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    torch_cuda = sys.modules.get("torch.cuda")
    initialised = torch_cuda.is_initialized() if torch_cuda is not None else False
    assert llm._gpu_names() == expected
    assert llm._on_cpu() is (not expected)
    if torch_cuda is not None:
        assert torch_cuda.is_initialized() == initialised, "the check never touches torch.cuda"
