"""The pure parts of ``bench/gpu_check.py``: FLOP counts, the profiler interval union, the guarded sections
and the import hook that hides the modules the GPU machine lacks. The script itself runs on the CPU in
``tests/integration/test_gpu_check.py``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from run_helpers import REPO_ROOT


def _load_gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO_ROOT / "bench" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


gpu_check = _load_gpu_check()
INFO = {"params_non_embedding": 1000, "num_layers": 2, "hidden_size": 8}


def test_padded_flops_equal_real_flops_without_padding() -> None:
    # Two batches whose rows all have the batch's padded length: nothing is padding.
    assert gpu_check.padded_flops(INFO, [(3, 16), (2, 8)]) == gpu_check.real_flops(INFO, [16, 16, 16, 8, 8])


def test_padded_flops_count_every_padded_token() -> None:
    # One batch of 2 rows padded to 10: 20 tokens, each 2 x 1000 + 4 x 2 x 8 x 10 FLOPs.
    assert gpu_check.padded_flops(INFO, [(2, 10)]) == 20 * (2000 + 640)
    assert gpu_check.padded_flops(INFO, [(2, 10)]) > gpu_check.real_flops(INFO, [10, 3])


@pytest.mark.parametrize(
    ("intervals", "seconds"),
    [([], 0.0), ([(0, 1e6)], 1.0), ([(0, 2e6), (1e6, 3e6)], 3.0), ([(0, 4e6), (1e6, 2e6)], 4.0),
     ([(5e6, 6e6), (0, 1e6)], 2.0)],
)
def test_union_seconds_counts_overlaps_once(intervals: list[tuple[float, float]], seconds: float) -> None:
    assert gpu_check.union_seconds(intervals) == pytest.approx(seconds)


def _check(budget_s: float = 60.0):
    return gpu_check.Check(device="cpu", dtype="auto", assets=Path("unused"), rows=1, budget_s=budget_s)


def test_a_failing_section_is_recorded_and_the_check_fails() -> None:
    check = _check()

    def boom(_check) -> dict:
        raise ValueError("no such thing")

    check.section("correct", boom)
    assert check.results["correct"]["error"] == "ValueError: no such thing"
    assert "section_s" in check.results["correct"]
    assert check.failed()


def test_a_section_past_the_budget_is_skipped_and_a_slow_one_stopped() -> None:
    check = _check(budget_s=0.3)

    def slow(_check) -> dict:
        import time

        time.sleep(5)
        return {}

    check.section("throughput", slow)
    assert check.results["throughput"]["error"].startswith("SectionTimeout")
    check.section("worker", lambda _check: {"ran": True})
    assert check.results["worker"] == {"skipped": "--budget-s 0s spent before it started"}


def test_passing_correctness_without_errors_is_success() -> None:
    check = _check()
    check.section("correct", lambda _check: {"passed": True})
    check.section("worker", lambda _check: {"skipped": "--skip"})
    assert not check.failed()


def test_hidden_modules_cannot_be_imported_or_found() -> None:
    hook = gpu_check.HiddenModules(("json_hidden_for_test",))
    sys.meta_path.insert(0, hook)
    try:
        with pytest.raises(ModuleNotFoundError, match="hidden"):
            __import__("json_hidden_for_test.sub")
        assert not gpu_check.importable("json_hidden_for_test")
        assert gpu_check.importable("json")
    finally:
        sys.meta_path.remove(hook)
