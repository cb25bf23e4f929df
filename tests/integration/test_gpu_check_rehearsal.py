"""``bench/build_gpu_assets.py`` and the CPU rehearsal of ``bench/gpu_check.py`` on tiny sizes, so the
prepared GPU check cannot rot between GPU loans: the assets build (and are reused), every section runs
with the modules the GPU machine lacks hidden, the engine matches the float32 reference, and the JSON
line has the shape the GPU run's reader expects."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from run_helpers import REPO_ROOT

pytestmark = pytest.mark.integration

REF_ROWS = 24
ROWS = 40
TIMEOUT_S = 600  # the shared 2-core machine can be very slow under load


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=TIMEOUT_S, check=False)


def _last_json(proc: subprocess.CompletedProcess) -> dict:
    assert proc.stdout.strip(), proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gpu") / "assets"
    proc = _run("bench/build_gpu_assets.py", "--out", str(out), "--ref-rows", str(REF_ROWS))
    assert proc.returncode == 0, proc.stderr[-3000:]
    built = _last_json(proc)
    assert built["assets_dir"] == str(out) and not built["reused"]
    assert 40 * 2**20 < built["bytes"] <= 60 * 2**20
    return out


def test_assets_are_reused_when_up_to_date(assets: Path) -> None:
    proc = _run("bench/build_gpu_assets.py", "--out", str(assets), "--ref-rows", str(REF_ROWS))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _last_json(proc)["reused"] is True
    assert {p.name for p in assets.iterdir()} == {"minilm_bf16", "reference.parquet", "assets.json"}


def test_cpu_rehearsal_runs_every_section(assets: Path, tmp_path: Path) -> None:
    proc = _run("bench/gpu_check.py", "--device", "cpu", "--rows", str(ROWS), "--assets", str(assets),
                "--skip", "compile", "--rehearse-image", "--out", str(tmp_path))
    result = _last_json(proc)
    assert proc.returncode == 0, (result, proc.stderr[-3000:])
    assert json.loads((tmp_path / "gpu_check.json").read_text()) == result
    assert list(result) == ["bench", "env", "matmul", "correct", "throughput", "worker", "compile", "wall_s"]
    assert not any(result["env"]["importable"].values())  # vllm, jsonschema, MiniLM package: hidden
    assert result["matmul"]["tflops"] > 0
    correct = result["correct"]
    assert correct["passed"] is True and correct["rows"] == REF_ROWS and correct["device"] == "cpu"
    assert correct["cos_min"] >= correct["threshold"]
    tp = result["throughput"]
    assert tp["rows"] == ROWS and tp["replay_matches_engine"] is True
    assert tp["rows_per_s"] > 0 and tp["host_overhead_x"] > 0 and 0 < tp["mfu_padded"]
    assert 0 < tp["padding_eff"] <= 1
    worker = result["worker"]
    assert worker["exit_code"] == 0 and worker["rows_ok"] == ROWS and worker["rows_per_s_excl_load"] > 0
    assert worker["engine"]["device"] == "cpu" and worker["gpu"] == {}
    assert result["compile"] == {"skipped": "--skip"}
