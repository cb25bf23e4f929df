"""Helpers for the LLM engine tests (import: ``from llm_helpers import ...``; the fixtures live in
``conftest.py``). Kept out of ``conftest.py`` so ``from conftest import`` never picks the wrong one of the
suite's several ``conftest.py`` files."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from batch_contract import storage
from batch_contract.engine_config import WorkerSettings
from batch_contract.layout import RunLayout, shard_id_for
from batch_contract.manifest import InputFile, InputSpec, Manifest, Segment, ShardSpec

REPO = Path(__file__).resolve().parents[3]

PREFIX = (
    "You are a careful assistant that files Debian packages into archive sections. Read the package "
    "description, decide which section of the archive it belongs to, and answer with the section name "
    "only. Sections include admin, devel, doc, editors, games, graphics, libs, mail, math, net, python, "
    "science, sound, text, utils, video, web and x11. Prefer the most specific section; a library goes "
    "to libs unless it is a Python module, which goes to python. Command line tools for system "
    "administration go to admin; programs that edit text go to editors. Answer in lower case, with no "
    "punctuation and no explanation, and never invent a section that is not in the list above. "
) * 2
"""A shared system prompt of about 300 tokens with the tiny model's tokenizer: the cacheable prefix."""


def load_builder():
    spec = importlib.util.spec_from_file_location("build_tiny_llm", REPO / "scripts" / "build_tiny_llm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def llm_engine_dict(model: Path, **overrides: Any) -> dict[str, Any]:
    """An LLM engine config dict for the tiny model (float32, 1024-token context, 8 output tokens)."""
    engine = {
        "kind": "llm",
        "model_path": str(model),
        "dtype": "float32",
        "max_model_len": 1024,
        "max_num_seqs": 64,
        "max_tokens": 8,
        "system_prompt": PREFIX,
        "user_template": "Package {{ id }} ({{ section }}): {{ text }}",
    }
    engine.update(overrides)
    return engine


def write_llm_run(root: Path, table: pa.Table, engine: dict[str, Any], worker: dict[str, Any] | None = None,
                  run_id: str = "llm_run") -> str:
    """Write ``table`` as the run's one Parquet input, a one-shard manifest, and return the run dir.

    Re-writing the manifest of an existing run (same ``root``/``run_id``) keeps its committed files.
    """
    input_path = root / f"{run_id}-input.parquet"
    if not input_path.exists():
        pq.write_table(table, input_path)
    meta = pq.ParquetFile(input_path).metadata
    groups = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
    manifest = Manifest(
        run_id=run_id,
        input=InputSpec(uri=str(input_path), format="parquet", id_column="id", text_column="text",
                        files=[InputFile(str(input_path), meta.num_rows, groups, input_path.stat().st_size)]),
        shards=[ShardSpec(shard_id=shard_id_for(0), segments=[Segment(0, 0, meta.num_rows)])],
        engine=engine,
        worker=WorkerSettings(**(worker or {})),
    )
    layout = RunLayout(output_root=str(root), run_id=run_id)
    storage.write_replace(layout.manifest_uri, manifest.to_json_bytes())
    return layout.run_dir
