"""`make test-llm` must fail, not pass on its unit tests alone, when vLLM cannot be imported: the LLM
modules skip cleanly from ``.venv`` (the main pass), and ``BATCH_REQUIRE_VLLM=1`` (set by the Makefile's
``test-llm``) turns a failed ``import vllm`` into a usage error of the whole session."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from run_helpers import REPO_ROOT

LLM_MODULE = "tests/integration/llm/test_llm_worker.py"


def _collect(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    shim = tmp_path / "shim"
    shim.mkdir(exist_ok=True)
    (shim / "vllm.py").write_text("raise ModuleNotFoundError(\"No module named 'vllm._C'\", name='vllm._C')\n")
    full = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shim), os.environ.get("PYTHONPATH", "")]), **env}
    return subprocess.run([sys.executable, "-m", "pytest", LLM_MODULE, "--collect-only", "-q", "-p", "no:cacheprovider"],
                          cwd=REPO_ROOT, env=full, capture_output=True, text=True, timeout=300, check=False)


def test_a_broken_vllm_skips_the_llm_modules_in_the_main_pass(tmp_path: Path) -> None:
    proc = _collect(tmp_path)
    assert proc.returncode in (0, 5), proc.stdout[-2000:] + proc.stderr[-2000:]  # 5: nothing collected


def test_a_broken_vllm_fails_the_llm_tier(tmp_path: Path) -> None:
    proc = _collect(tmp_path, BATCH_REQUIRE_VLLM="1")
    out = proc.stdout + proc.stderr
    assert proc.returncode not in (0, 5), out[-2000:]
    assert "vllm" in out, out[-2000:]


@pytest.mark.parametrize("needle", ["BATCH_REQUIRE_VLLM=1", 'import vllm'])
def test_the_make_target_sets_the_requirement(needle: str) -> None:
    proc = subprocess.run(["make", "-n", "-o", "venv-llm", "test-llm"], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=60, check=True)
    assert needle in proc.stdout, proc.stdout
