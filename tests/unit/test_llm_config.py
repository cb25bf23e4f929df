"""LLMConfig: validation naming the field, defaults, registration, and the fingerprint covering templates."""

from __future__ import annotations

import json
import re

import pytest
from batch_contract import engine_config_from_dict
from batch_contract.engine_config import ConfigError
from batch_contract.llm_config import LLMConfig
from batch_contract.manifest import config_fingerprint

BASE = {"kind": "llm", "model_path": "/models/tiny", "max_tokens": 64}


def test_defaults_are_the_throughput_settings():
    cfg = engine_config_from_dict(BASE)
    assert isinstance(cfg, LLMConfig)
    assert (cfg.gpu_memory_utilization, cfg.enable_prefix_caching) == (0.92, True)
    assert (cfg.max_num_seqs, cfg.max_num_batched_tokens) == (None, None), "vLLM's own defaults for the device"
    assert (cfg.temperature, cfg.tensor_parallel_size, cfg.quantization) == (0.0, 1, None)
    assert cfg.max_prompt_tokens == cfg.max_model_len - 64


def test_round_trip_through_json():
    cfg = LLMConfig.from_dict({**BASE, "few_shot": [{"user": "u", "assistant": "a"}], "stop": ["\n\n"],
                               "json_schema": {"type": "object"}, "quantization": "fp8"})
    again = LLMConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"max_tokens": None}, "engine.max_tokens"),
        ({"max_tokens": 0}, "engine.max_tokens"),
        ({"max_tokens": 4096, "max_model_len": 4096}, "engine.max_tokens"),
        ({"model_path": ""}, "engine.model_path"),
        ({"dtype": "int4"}, "engine.dtype"),
        ({"quantization": "awq"}, "engine.quantization"),
        ({"max_model_len": 8}, "engine.max_model_len"),
        ({"gpu_memory_utilization": 1.5}, "engine.gpu_memory_utilization"),
        ({"max_num_seqs": 0}, "engine.max_num_seqs"),
        ({"max_num_seqs": True}, "engine.max_num_seqs"),
        ({"max_num_batched_tokens": 8}, "engine.max_num_batched_tokens"),
        ({"max_num_batched_tokens": "4096"}, "engine.max_num_batched_tokens"),
        ({"tensor_parallel_size": 3}, "engine.tensor_parallel_size"),
        ({"enable_prefix_caching": "yes"}, "engine.enable_prefix_caching"),
        ({"seed": -1}, "engine.seed"),
        ({"temperature": -0.1}, "engine.temperature"),
        ({"temperature": float("nan")}, "engine.temperature"),
        ({"top_p": 0.0}, "engine.top_p"),
        ({"stop": "###"}, "engine.stop"),
        ({"stop": [""]}, "engine.stop"),
        ({"user_template": "  "}, "engine.user_template"),
        ({"few_shot": [{"user": "u"}]}, "engine.few_shot[0]"),
        ({"few_shot": {"user": "u", "assistant": "a"}}, "engine.few_shot"),
        ({"json_schema": "{}"}, "engine.json_schema"),
        ({"json_schema": {"type": 3}}, "engine.json_schema"),
        ({"json_schema": {"type": "number", "maximum": float("inf")}}, "engine.json_schema"),
        ({"json_schema": "null"}, "engine.json_schema"),                  # text: not an object
        ({"json_schema": "[1, 2]"}, "engine.json_schema"),
        ({"json_schema": '{"type": "object"'}, "engine.json_schema"),     # truncated
        ({"json_schema": '{"maximum": ' + "9" * 5000 + "}"}, "engine.json_schema"),  # over-long integer
        ({"json_schema": "[" * 100_000 + "]" * 100_000}, "engine.json_schema"),       # nesting
        ({"json_schema": '{"description": "\\ud800"}'}, "engine.json_schema"),      # lone surrogate
        ({"constrain_output": 1}, "engine.constrain_output"),
        ({"speculative_model": "draft"}, "unknown field"),
    ],
)
def test_invalid_values_name_the_field(override, field):
    with pytest.raises(ConfigError, match=re.escape(field)):
        engine_config_from_dict({**BASE, **override})


def test_changed_template_changes_the_fingerprint():
    base = LLMConfig.from_dict(BASE).to_dict()
    fp = config_fingerprint(base)
    for change in ({"user_template": "Describe: {{ text }}"}, {"system_prompt": "Be brief."},
                   {"few_shot": [{"user": "x", "assistant": "y"}]}, {"json_schema": {"type": "string"}},
                   {"max_tokens": 65}):
        changed = LLMConfig.from_dict({**BASE, **change}).to_dict()
        assert config_fingerprint(changed) != fp, change
    assert config_fingerprint(LLMConfig.from_dict(BASE).to_dict()) == fp
