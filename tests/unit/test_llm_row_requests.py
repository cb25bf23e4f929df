"""An LLM row that is a whole request (OpenAI batch chat lines): ``engine.row_messages`` takes the row's
conversation as the prompt, ``engine.row_sampling_column`` the row's own sampling settings. Configs that
use neither keep their manifest form and fingerprint."""

from __future__ import annotations

import json

import pytest
from batch_contract.engine_config import ConfigError
from batch_contract.llm_config import LLMConfig, with_row_sampling
from batch_contract.manifest import config_fingerprint
from batch_worker.prompting import PromptRenderer, PromptTooLongRenderError, RowRenderError, row_messages

BASE = {"kind": "llm", "model_path": "/models/m", "max_tokens": 8, "max_model_len": 64}


def test_defaults_leave_the_manifest_form_and_fingerprint_unchanged() -> None:
    plain = LLMConfig.from_dict(BASE)
    assert "row_messages" not in plain.to_dict() and "row_sampling_column" not in plain.to_dict()
    assert config_fingerprint(BASE) == config_fingerprint({**BASE, "row_messages": False,
                                                           "row_sampling_column": None})
    assert config_fingerprint(BASE) != config_fingerprint({**BASE, "row_messages": True})
    assert config_fingerprint(BASE) != config_fingerprint({**BASE, "row_sampling_column": "sampling"})


def test_row_messages_refuses_a_prompt_of_the_engine_too() -> None:
    with pytest.raises(ConfigError, match="engine.row_messages"):
        LLMConfig.from_dict({**BASE, "row_messages": True, "system_prompt": "be brief"})
    with pytest.raises(ConfigError, match="engine.row_messages"):
        LLMConfig.from_dict({**BASE, "row_messages": True, "user_template": "{{ id }}"})


def test_the_rows_conversation_is_the_prompt() -> None:
    config = LLMConfig.from_dict({**BASE, "row_messages": True})
    chat = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    parts = PromptRenderer(config).parts({"id": "1", "text": json.dumps(chat)})
    assert parts.messages() == chat and parts.user == "su"


@pytest.mark.parametrize("text", ["not json", "[]", '{"role": "user"}', '[{"role": "tool", "content": "x"}]',
                                  '[{"role": "user", "content": 3}]', None])
def test_a_text_that_is_no_conversation_is_a_row_error(text: object) -> None:
    with pytest.raises(RowRenderError, match="row_messages"):
        row_messages(text, 1000)


def test_a_conversation_over_the_character_limit_is_too_long() -> None:
    with pytest.raises(PromptTooLongRenderError):
        row_messages(json.dumps([{"role": "user", "content": "x" * 11}]), 10)


def test_row_sampling_replaces_only_what_the_row_gives_and_is_validated() -> None:
    config = LLMConfig.from_dict({**BASE, "temperature": 0.0, "stop": ["\n"]})
    assert with_row_sampling(config, "") is config and with_row_sampling(config, None) is config
    row = with_row_sampling(config, json.dumps({"max_tokens": 3, "stop": ["x"], "temperature": 0.5, "seed": 7}))
    assert (row.max_tokens, row.stop, row.temperature, row.seed, row.top_p) == (3, ["x"], 0.5, 7, 1.0)
    assert with_row_sampling(config, {"json_schema": {"type": "object"}}).json_schema == {"type": "object"}
    with pytest.raises(ConfigError, match="engine.max_tokens"):
        with_row_sampling(config, '{"max_tokens": 64}')  # not below max_model_len
    with pytest.raises(ConfigError, match="engine.temperature"):
        with_row_sampling(config, '{"temperature": 3}')
    with pytest.raises(ConfigError, match="unknown key"):
        with_row_sampling(config, '{"model_path": "/elsewhere"}')
    with pytest.raises(ConfigError, match="not JSON"):
        with_row_sampling(config, "{")
