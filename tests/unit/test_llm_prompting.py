"""Sandboxed prompt rendering (no vLLM): template errors, sandbox escapes, chat template, token ids."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from batch_contract.engine_config import ConfigError
from batch_contract.llm_config import LLMConfig
from batch_worker.engines.llm import OutputValidator
from batch_worker.prompting import (
    PromptRenderer,
    RowRenderError,
    row_context,
    template_fields,
    validate_template,
)

REPO = Path(__file__).resolve().parents[2]


def _config(**kw) -> LLMConfig:
    return LLMConfig(model_path="/m", max_tokens=16, **kw)


@pytest.fixture(scope="module")
def tokenizer():
    """The tiny model's tokenizer (byte-level BPE trained on 300 sample rows: about a second)."""
    spec = importlib.util.spec_from_file_location("build_tiny_llm", REPO / "scripts" / "build_tiny_llm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.build_tokenizer(512, mod.training_texts()[:300])


@pytest.mark.parametrize(
    ("template", "reason"),
    [
        ("{{ text.upper() }}", r"^SecurityError: Undefined is not safely callable"),
        ("{{ text.__class__ }}", r"^SecurityError: access to attribute '__class__' of 'str' object is unsafe"),
        ("{{ text.__class__.__mro__[1].__subclasses__() }}",
         r"^SecurityError: access to attribute '__class__' of 'str' object is unsafe"),
        ("{{ cycler.__init__.__globals__ }}", r"^SecurityError: access to attribute '__init__' of 'type' object"),
        ("{{ self._TemplateReference__context }}",
         r"^SecurityError: access to attribute '_TemplateReference__context' of 'TemplateReference' object"),
        ("{{ range(10) | list }}", r"^SecurityError: <function safe_range at 0x[0-9a-f]+> is not safely callable"),
        ("{{ 'a' * 1000000 }}", r"^SecurityError: repetition builds more than 100000 characters"),
        ("{{ 9 ** 999999 }}", r"^SecurityError: exponent 999999 is above the template limit 64"),
        ("{{ missing_field }}", r"^UndefinedError: 'missing_field' is undefined"),
    ],
)
def test_sandbox_refuses_escapes_and_undefined_names(template, reason):
    renderer = PromptRenderer(_config(user_template=template, use_chat_template=False))
    with pytest.raises(RowRenderError, match=reason):
        renderer.user_message(row_context({"title": "t"}, "1", "hello"))


def test_filters_loops_and_named_fields_render():
    renderer = PromptRenderer(_config(
        user_template="{{ title | upper }}: {{ text | truncate(8, true, '', 0) }}"
                      "{% for w in tags %} {{ loop.index }}={{ w }}{% endfor %}",
        use_chat_template=False))
    row = row_context({"title": "pkg", "tags": ["a", "b"]}, "7", "hello world")
    assert renderer.user_message(row) == "PKG: hello wo 1=a 2=b"


def test_syntax_error_and_unknown_field_fail_at_plan_time():
    with pytest.raises(ConfigError, match="engine.user_template.*syntax"):
        validate_template(_config(user_template="{{ text "), ["id", "text"])
    with pytest.raises(ConfigError, match=r"engine.user_template.*\['section2'\]"):
        validate_template(_config(user_template="{{ section2 }} {{ text }}"), ["id", "section", "text"])
    validate_template(_config(user_template="{{ section }} {{ text }}"), ["id", "section", "text"])
    assert template_fields("{{ a }}{% for x in b %}{{ x }}{% endfor %}") == {"a", "b"}


def test_plain_prompt_layout():
    cfg = _config(system_prompt="SYS", few_shot=[{"user": "q1", "assistant": "a1"}], use_chat_template=False)
    renderer = PromptRenderer(cfg)
    assert renderer.render_text(renderer.parts(row_context({}, "1", "row"))) == "SYS\n\nq1\n\na1\n\nrow"


def test_chat_template_prefix_is_shared_and_bos_not_doubled(tokenizer):
    cfg = _config(system_prompt="You label Debian packages.", few_shot=[{"user": "vim", "assistant": "editors"}],
                  user_template="Package: {{ text }}")
    renderer = PromptRenderer(cfg, tokenizer)
    text = renderer.render_text(renderer.parts(row_context({}, "1", "gcc")))
    assert text.startswith("<s><|system|>\nYou label Debian packages.<|end|>\n<|user|>\nvim<|end|>\n")
    assert text.endswith("<|user|>\nPackage: gcc<|end|>\n<|assistant|>\n")
    ids_a = renderer.render_ids(renderer.parts(row_context({}, "1", "gcc")))
    ids_b = renderer.render_ids(renderer.parts(row_context({}, "2", "a much longer description")))
    bos = tokenizer.convert_tokens_to_ids("<s>")
    assert ids_a[0] == bos and ids_a[1] != bos
    prefix = tokenizer.encode(renderer.prefix_text(), add_special_tokens=False)
    assert ids_a[: len(prefix)] == ids_b[: len(prefix)] == prefix


def test_chat_template_required_when_asked(tokenizer):
    tokenizer.chat_template, saved = None, tokenizer.chat_template
    try:
        with pytest.raises(ConfigError, match="engine.use_chat_template"):
            PromptRenderer(_config(), tokenizer)
    finally:
        tokenizer.chat_template = saved


def test_output_validator():
    schema = {"type": "object", "properties": {"label": {"enum": ["yes", "no"]}}, "required": ["label"]}
    validator = OutputValidator(schema)
    assert validator.check('{ "label" : "no" }', "stop") == ('{"label":"no"}', None)
    canonical, problem = validator.check('{"label": "maybe"}', "stop")
    assert canonical is None and "at label" in problem and "maybe" in problem
    canonical, problem = validator.check('{"label": "ye', "length")
    assert canonical is None and "not JSON" in problem and "max_tokens" in problem
    assert OutputValidator(None).check("free text", "stop") == (None, None)
    with pytest.raises(ConfigError, match="engine.json_schema"):
        OutputValidator({"type": "no-such-type"})
