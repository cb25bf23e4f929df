"""Quality-gate comparison logic (pure, no vLLM) and the CLI's argument checks."""

from __future__ import annotations

import json

import pytest
from batch_contract.engine_config import ConfigError
from batch_worker.cli import build_parser
from batch_worker.quality_gate import (
    RowResult,
    compare,
    gate_passed,
    merged_engine,
    parse_overrides,
    text_similarity,
)


def js(**fields) -> RowResult:
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return RowResult(True, text, text, 5)


def test_json_outputs_agree_field_by_field():
    base = {"a": js(label="x", n=1), "b": js(label="y", n=2), "c": js(label="z", n=3), "d": js(label="w", n=4)}
    cand = {"a": js(label="x", n=1), "b": js(label="y", n=9), "c": js(label="q", n=3),
            "d": RowResult(False, reason="invalid_output")}
    figures = compare(base, cand)
    assert figures["output_kind"] == "json"
    assert (figures["rows"], figures["rows_both_valid"]) == (4, 3)
    assert figures["exact_match_rate"] == pytest.approx(1 / 3)
    assert figures["field_agreement"] == {"label": pytest.approx(2 / 3), "n": pytest.approx(2 / 3)}
    assert figures["agreement"] == pytest.approx(2 / 3)
    assert (figures["baseline_valid_rate"], figures["candidate_valid_rate"]) == (1.0, 0.75)
    assert [e["id"] for e in figures["examples"]] == ["b", "c"]
    assert not gate_passed(figures, 0.6)  # agreement passes, but the candidate lost 25% validity
    assert gate_passed(figures, 0.6, max_validity_drop=0.25)
    assert gate_passed({**figures, "candidate_valid_rate": 0.99}, 0.6)
    assert not gate_passed({**figures, "candidate_valid_rate": 1.0}, 0.9)


def test_free_text_uses_similarity():
    base = {"a": RowResult(True, "the quick brown fox"), "b": RowResult(True, "same")}
    cand = {"a": RowResult(True, "the quick brown cat"), "b": RowResult(True, "same")}
    figures = compare(base, cand)
    assert figures["output_kind"] == "text" and figures["field_agreement"] == {}
    sim = text_similarity("the quick brown fox", "the quick brown cat")
    assert 0.7 < sim < 1.0
    assert figures["agreement"] == pytest.approx((sim + 1.0) / 2)
    assert figures["text_similarity_min"] == pytest.approx(sim) and figures["exact_match_rate"] == 0.5


def test_nothing_comparable_never_passes():
    figures = compare({"a": RowResult(False, reason="too_long")}, {"a": RowResult(False, reason="too_long")})
    assert figures["agreement"] is None and not gate_passed(figures, 0.0)


def test_overrides_are_validated():
    base = {"kind": "llm", "model_path": "/m", "max_tokens": 16}
    assert merged_engine(base, {"quantization": "fp8"})["quantization"] == "fp8"
    with pytest.raises(ConfigError, match="engine.quantization"):
        merged_engine(base, {"quantization": "int3"})
    with pytest.raises(ConfigError, match="^quality-gate: engine overrides must keep kind 'llm'"):
        merged_engine(base, {"kind": "encoder"})
    with pytest.raises(ConfigError, match="--candidate-engine: not JSON"):
        parse_overrides("{quantization: fp8}", "--candidate-engine")
    with pytest.raises(ConfigError, match="--candidate-engine: must be a JSON object"):
        parse_overrides('["fp8"]', "--candidate-engine")


def test_cli_parses_quality_gate():
    args = build_parser().parse_args(["quality-gate", "--run-dir", "out/runs/r", "--candidate-engine", "{}"])
    assert (args.command, args.sample, args.min_agreement, args.enforce) == ("quality-gate", 500, 0.9, False)
