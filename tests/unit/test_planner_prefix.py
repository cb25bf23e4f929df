"""Prefix-aware plan (batch_inference.prefix_plan through planner.plan) with the tiny model's real tokenizer and
chat template, and the worker's reader over the scattered shards it makes (Parquet and JSONL)."""

from __future__ import annotations

import importlib.util
import json
import random
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from batch_contract.manifest import Manifest
from batch_inference.planner import PlanRequest, plan
from batch_worker.reader import is_scattered, iter_shard_blocks

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "data" / "sample" / "debian_descriptions_sample.parquet"
TEMPLATE = "Document:\n{{ doc }}\n\nQuestion: {{ text }}"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = importlib.util.spec_from_file_location("build_tiny_llm", REPO / "scripts" / "build_tiny_llm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build(tmp_path_factory.mktemp("tiny-llm") / "model")


def _rows(docs: int, questions: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    texts = [t for t in pq.read_table(SAMPLE).column("text").to_pylist() if t]
    rows = []
    for d in range(docs):
        doc = "\n".join(rng.choice(texts) for _ in range(4))
        rows += [{"id": f"d{d}-q{q}", "doc": doc, "text": f"question {q} about item {d}"} for q in range(questions)]
    rng.shuffle(rows)
    return rows


def _engine(model: Path, **kw) -> dict:
    return {"kind": "llm", "model_path": str(model), "max_model_len": 2048, "max_tokens": 8,
            "system_prompt": "Answer briefly.", "user_template": TEMPLATE, **kw}


def _plan(input_uri: str, out: Path, engine: dict, **kw) -> Manifest:
    base = dict(input_uri=input_uri, id_column="id", text_column="text", output_root=str(out), run_id="r1",
                engine=engine, rows_per_shard=12, prefix_block_tokens=16)
    base.update(kw)
    return plan(PlanRequest(**base))[0]


def _shard_ids(manifest: Manifest, rows: list[dict]) -> list[list[str]]:
    return [[rows[r]["id"] for seg in s.segments for r in range(seg.row_start, seg.row_stop)] for s in manifest.shards]


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_groups_share_a_shard_and_every_row_is_planned_once(tiny_model, tmp_path, fmt):
    rows = _rows(docs=12, questions=4)
    path = tmp_path / f"in.{fmt}"
    if fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=7)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    token = _plan(str(path), tmp_path / "token", _engine(tiny_model), prefix_plan=False)
    pre = _plan(str(path), tmp_path / "prefix", _engine(tiny_model))
    assert token.prefix_plan == {"status": "off", "reason": "the prefix_plan Param is false"}
    record = pre.prefix_plan
    assert record["status"] == "planned" and record["groups"] == 12 and record["split_groups"] == 0
    assert len(pre.shards) == len(token.shards) > 1
    ids = [i for shard in _shard_ids(pre, rows) for i in shard]
    assert Counter(ids) == Counter(r["id"] for r in rows)  # every row exactly once
    for shard in _shard_ids(pre, rows):
        docs = [i.split("-")[0] for i in shard]
        assert len(set(docs)) == sum(1 for k in range(len(docs)) if k == 0 or docs[k] != docs[k - 1])  # back to back
    owners = {i.split("-")[0]: k for k, shard in enumerate(_shard_ids(pre, rows)) for i in shard}
    for k, shard in enumerate(_shard_ids(pre, rows)):
        assert all(owners[i.split("-")[0]] == k for i in shard)  # a document's questions share its shard
    assert record["token_plan_hit_rate"] < record["expected_hit_rate"] <= record["ideal_hit_rate"]
    loads = [s.est_tokens for s in pre.shards]
    assert max(loads) - min(loads) <= 2 * max(loads) / 4 + 1  # balanced within about one group
    # the manifest round-trips with its record, and the worker reads each shard's rows in plan order
    assert Manifest.from_json_bytes(pre.to_json_bytes()).prefix_plan == record
    for shard, want in zip(pre.shards, _shard_ids(pre, rows), strict=True):
        assert is_scattered(shard.segments)
        got = [i for b in iter_shard_blocks(pre.input, shard.segments, 5, ["doc"]) for i in b.ids]
        assert got == want


def test_no_shared_block_beyond_the_global_prefix_keeps_the_token_plan(tiny_model, tmp_path):
    rows = _rows(docs=6, questions=3)
    path = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    engine = _engine(tiny_model, user_template="Row {{ id }}. Document:\n{{ doc }}\n\nQuestion: {{ text }}")
    token = _plan(str(path), tmp_path / "token", engine, prefix_plan=False)
    pre = _plan(str(path), tmp_path / "prefix", engine)
    assert pre.prefix_plan["status"] == "skipped" and "share" in pre.prefix_plan["reason"]
    assert pre.shards == token.shards


def test_unreadable_tokenizer_and_encoder_runs(tmp_path):
    rows = _rows(docs=3, questions=2)
    path = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    missing = _plan(str(path), tmp_path / "a", _engine(tmp_path / "no-model"))
    assert missing.prefix_plan["status"] == "skipped" and "tokenizer" in missing.prefix_plan["reason"]
    encoder = _plan(str(path), tmp_path / "b", {"kind": "encoder"})
    assert encoder.prefix_plan is None and "prefix_plan" not in encoder.to_dict()


def test_scattered_jsonl_shard_keeps_bad_lines_as_record_errors(tmp_path):
    from batch_contract.manifest import InputFile, InputSpec, Segment

    path = tmp_path / "in.jsonl"
    path.write_text('{"id": "a", "text": "x"}\nnot json\n{"id": "c", "text": "z"}\n{"id": "d", "text": "w"}\n')
    spec = InputSpec(uri=str(path), format="jsonl", id_column="id", text_column="text",
                     files=[InputFile(str(path), 4)])
    segments = [Segment(0, 3, 4), Segment(0, 0, 2)]
    blocks = list(iter_shard_blocks(spec, segments, 10))
    assert [r for b in blocks for r in b.source_rows] == [3, 0, 1]
    assert [e is not None for b in blocks for e in b.record_errors] == [False, False, True]
    from batch_worker.errors import BadInputError

    with pytest.raises(BadInputError, match="beyond"):
        list(iter_shard_blocks(spec, [Segment(0, 0, 1), Segment(0, 3, 6)], 10))
