"""OpenAI batch JSONL in (``batch_contract.openai_batch``) and out (``batch_contract.openai_output``).

Every line ends exactly once as a request or a rejection with a code (generated files, hypothesis);
each class of bad line is rejected with its code; sampling fields map onto the row; the output and error
lines parse as the official ``openai`` package's own response types.
"""

from __future__ import annotations

import json

import pytest
from batch_contract.openai_batch import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    MAX_STOP_SEQUENCES,
    Code,
    Rejection,
    Request,
    check_metadata,
    file_models,
    iter_lines,
    parse_file,
    parse_line,
)
from batch_contract.openai_output import error_line, jsonl, output_line
from hypothesis import given, settings
from hypothesis import strategies as st


def chat_line(cid: str = "r1", model: str = "m", **body: object) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}], **body}
    return json.dumps({"custom_id": cid, "method": "POST", "url": CHAT, "body": body})


def test_chat_line_maps_messages_and_sampling() -> None:
    got = parse_line(0, chat_line(max_completion_tokens=7, temperature=0.5, top_p=0.9, seed=3, stop="\n",
                                  response_format={"type": "json_schema",
                                                   "json_schema": {"name": "x", "schema": {"type": "object"}}}),
                     CHAT, "m")
    assert isinstance(got, Request)
    assert got.custom_id == "r1"
    assert json.loads(got.text) == [{"role": "user", "content": "hello"}]
    assert json.loads(got.row()["sampling"]) == {"max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "seed": 3,
                                     "stop": ["\n"], "json_schema": {"type": "object"}}


def test_completion_and_embedding_lines_give_their_text() -> None:
    comp = parse_line(0, json.dumps({"custom_id": "c", "method": "POST", "url": COMPLETIONS,
                                     "body": {"model": "m", "prompt": "Once", "max_tokens": 4}}), COMPLETIONS, "m")
    emb = parse_line(0, json.dumps({"custom_id": "e", "method": "POST", "url": EMBEDDINGS,
                                    "body": {"model": "m", "input": ["a text"]}}), EMBEDDINGS, "m")
    assert isinstance(comp, Request) and comp.text == "Once" and comp.sampling.max_tokens == 4
    assert isinstance(emb, Request) and emb.text == "a text" and emb.row()["sampling"] == ""


BAD_LINES = [
    ("{not json", Code.INVALID_JSON),
    ("[1, 2]", Code.INVALID_JSON),
    (json.dumps({"method": "POST", "url": CHAT, "body": {}}), Code.MISSING_CUSTOM_ID),
    (json.dumps({"custom_id": "x", "method": "GET", "url": CHAT, "body": {}}), Code.INVALID_METHOD),
    (json.dumps({"custom_id": "x", "method": "POST", "url": "/v1/responses", "body": {}}), Code.INVALID_URL),
    (json.dumps({"custom_id": "x", "method": "POST", "url": EMBEDDINGS, "body": {"model": "m", "input": "a"}}),
     Code.MISMATCHED_ENDPOINT),
    (chat_line(model="other"), Code.MISMATCHED_MODEL),
    (chat_line(n=2), Code.UNSUPPORTED),
    (chat_line(tools=[{"type": "function"}]), Code.UNSUPPORTED),
    (chat_line(logprobs=True), Code.UNSUPPORTED),
    (chat_line(temperature=2.5), Code.INVALID_BODY),
    (chat_line(top_p=0), Code.INVALID_BODY),
    (chat_line(max_tokens=0), Code.INVALID_BODY),
    (chat_line(max_tokens=3, max_completion_tokens=4), Code.INVALID_BODY),
    (chat_line(stop=["a"] * (MAX_STOP_SEQUENCES + 1)), Code.INVALID_BODY),
    (chat_line(response_format={"type": "json_object"}), Code.UNSUPPORTED),
    (chat_line(messages=[]), Code.INVALID_BODY),
    (chat_line(messages=[{"role": "tool", "content": "x"}]), Code.UNSUPPORTED),
    (chat_line(messages=[{"role": "user", "content": [{"type": "text", "text": "x"}]}]), Code.UNSUPPORTED),
]


@pytest.mark.parametrize(("raw", "code"), BAD_LINES)
def test_bad_lines_are_rejected_with_their_code(raw: str, code: str) -> None:
    got = parse_line(4, raw, CHAT, "m")
    assert isinstance(got, Rejection), got
    assert (got.code, got.line) == (code, 4)
    assert got.message


def test_duplicate_custom_id_rejects_the_later_lines_only() -> None:
    parsed = parse_file(enumerate([chat_line("a"), chat_line("b"), chat_line("a"), chat_line("a")]), CHAT, "m")
    assert [r.custom_id for r in parsed.requests] == ["a", "b"]
    assert [(r.line, r.code) for r in parsed.rejections] == [(2, Code.DUPLICATE_CUSTOM_ID),
                                                              (3, Code.DUPLICATE_CUSTOM_ID)]


def test_iter_lines_skips_blank_lines_and_file_models_lists_models() -> None:
    data = (chat_line("a", model="x") + "\r\n\n  \n" + chat_line("b", model="y") + "\n{bad\n").encode()
    assert [n for n, _ in iter_lines(data)] == [0, 1, 2]
    assert file_models(data) == {"x", "y"}


LINE = st.one_of(
    st.builds(chat_line, st.text(max_size=5), st.sampled_from(["m", "other"]),
              temperature=st.one_of(st.none(), st.floats(-1, 3, allow_nan=False)),
              max_tokens=st.one_of(st.none(), st.integers(-2, 50))),
    st.text(max_size=30),
    st.builds(json.dumps, st.dictionaries(st.sampled_from(["custom_id", "method", "url", "body"]),
                                          st.one_of(st.text(max_size=4), st.integers(), st.none()))),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(LINE, max_size=25))
def test_every_line_ends_exactly_once(lines: list[str]) -> None:
    numbered = list(enumerate(lines))
    parsed = parse_file(numbered, CHAT, "m")
    assert parsed.total == len(lines)
    assert sorted([r.line for r in parsed.requests] + [r.line for r in parsed.rejections]) == list(range(len(lines)))
    ids = [r.custom_id for r in parsed.requests]
    assert len(ids) == len(set(ids))
    for req in parsed.requests:
        assert req.model == "m" and req.url == CHAT


def test_metadata_limits() -> None:
    assert check_metadata({"k": "v"}) == {"k": "v"}
    with pytest.raises(ValueError, match="at most 16"):
        check_metadata({str(i): "v" for i in range(17)})
    with pytest.raises(ValueError, match="over 512"):
        check_metadata({"k": "v" * 513})
    with pytest.raises(ValueError, match="string keys"):
        check_metadata({"k": 1})


def test_output_lines_parse_as_the_openai_response_types() -> None:
    openai_types = pytest.importorskip("openai.types")  # the dev extra installs it
    chat_types = pytest.importorskip("openai.types.chat")
    llm_row = {"id": "r1", "output_text": "hi", "output_json": None, "finish_reason": "stop",
               "prompt_tokens": 5, "output_tokens": 2}
    chat = output_line("batch_x", CHAT, "m", 1700000000, llm_row)
    body = chat_types.ChatCompletion.model_validate(chat["response"]["body"])
    assert body.choices[0].message.content == "hi"
    assert (body.usage.prompt_tokens, body.usage.completion_tokens, body.usage.total_tokens) == (5, 2, 7)
    assert chat["custom_id"] == "r1" and chat["response"]["status_code"] == 200 and chat["error"] is None
    comp = openai_types.Completion.model_validate(output_line("b", COMPLETIONS, "m", 1, llm_row)["response"]["body"])
    assert comp.choices[0].text == "hi"
    emb = output_line("b", EMBEDDINGS, "m", 1, {"id": "e", "embedding": [0.5, 0.25], "n_tokens": 3})
    parsed = openai_types.CreateEmbeddingResponse.model_validate(emb["response"]["body"])
    assert parsed.data[0].embedding == [0.5, 0.25] and parsed.usage.total_tokens == 3


def test_error_lines_carry_code_and_message_and_are_stable() -> None:
    one = error_line("batch_x", "r9", 3, "too_long", "prompt has 900 tokens")
    assert one == error_line("batch_x", "r9", 3, "too_long", "prompt has 900 tokens")
    assert one["error"] == {"code": "too_long", "message": "prompt has 900 tokens"}
    assert one["response"]["status_code"] == 400
    assert one["response"]["body"]["error"]["code"] == "too_long"
    assert error_line("batch_x", None, 3, "c", "m")["id"] != error_line("batch_x", None, 4, "c", "m")["id"]
    lines = jsonl([one, one]).decode().splitlines()
    assert [json.loads(x) for x in lines] == [one, one]
