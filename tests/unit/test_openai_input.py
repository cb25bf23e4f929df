"""A batch DAG run over an OpenAI batch file (``input_format: openai_batch``), through the real plan path.

The planner converts the file into the run directory with the contract's rules (the ones the
``/v1/batches`` API applies); the worker's own reader and validator classify the converted rows; the
run's output and error files are built from what they produce. Property: for any mix of valid and
invalid lines every line ends exactly once across the two files, and a refused line's error code is
the one the API's error file gives it. Also: the endpoint's engine options, the engine mismatch
refusal, the limits, a rerun reusing the plan.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from batch_contract.engine_config import ConfigError, WorkerSettings
from batch_contract.enums import DeadLetterReason
from batch_contract.openai_batch import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    REJECTION_KEY,
    Code,
    batch_endpoint,
    iter_lines,
    parse_file,
)
from batch_inference import openai_input
from batch_inference.openai_files import build_lines
from batch_inference.planner import PlanRequest, plan
from batch_worker.reader import iter_shard_blocks
from batch_worker.validate import Validator
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

MODEL = "minilm"


def emb_line(cid: object = "r1", model: str = MODEL, text: object = "a text", **extra: object) -> str:
    body = {"model": model, "input": text, **extra.pop("body", {})}
    return json.dumps({"custom_id": cid, "method": "POST", "url": extra.pop("url", EMBEDDINGS), "body": body,
                       **extra})


def chat_line(cid: str = "c1", **body: object) -> str:
    return json.dumps({"custom_id": cid, "method": "POST", "url": CHAT,
                       "body": {"model": "qwen", "messages": [{"role": "user", "content": "hi"}], **body}})


def request(tmp: Path, src: Path, run_id: str, engine: dict, roots: list[str] | None = None) -> PlanRequest:
    return PlanRequest(input_uri=str(src), id_column="ignored", text_column="ignored", output_root=str(tmp / "out"),
                       run_id=run_id, engine=engine, dag_id="dag", input_format="openai_batch", params={"dag_id": "dag"},
                       input_roots=roots)


def run_lines(tmp: Path, lines: list[str], run_id: str = "r") -> tuple[list[dict], list[dict], object]:
    """Plan ``lines`` as an OpenAI batch file on the encoder, classify every row with the worker's reader
    and validator, give each kept row a result; the run's output and error objects."""
    src = tmp / f"{run_id}.jsonl"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogatepass")
    manifest, _refs = plan(request(tmp, src, run_id, {"kind": "encoder"}))
    results, dead = {}, {}
    for shard in manifest.shards:
        validator = Validator(manifest.input.id_column, text_column=manifest.input.text_column)
        for block in iter_shard_blocks(manifest.input, shard.segments, 7, (), WorkerSettings()):
            checked = validator.validate(block)
            for rid in checked.rows.ids:
                results[rid] = {"id": rid, "embedding": [0.5], "n_tokens": 3}
            for d in checked.dead:
                dead[d.source_row] = {"reason": d.reason.value, "detail": d.detail, "id": d.id}
    run_dir = str(tmp / "out" / "runs" / "dag" / run_id)
    conv = (Path(openai_input.folder(run_dir)) / openai_input.INPUT_NAME).read_bytes()
    rows = [json.loads(x) for _n, x in iter_lines(conv)]
    outputs, errors = build_lines(run_id, openai_input.read_request(run_dir), rows, results, dead, 0)
    return outputs, errors, manifest


LINE = st.one_of(
    st.builds(emb_line, st.one_of(st.text(max_size=4), st.integers(), st.none()), st.sampled_from([MODEL, "other"]),
              st.one_of(st.text(max_size=6), st.lists(st.text(max_size=3), max_size=2), st.none())),
    st.builds(emb_line, st.text(min_size=1, max_size=3), body=st.fixed_dictionaries(
        {}, optional={"dimensions": st.integers(1, 4), "encoding_format": st.sampled_from(["float", "base64"]),
                      "user": st.text(max_size=3)})),
    st.builds(emb_line, st.text(min_size=1, max_size=3), url=st.sampled_from([CHAT, "/v1/responses", 5])),
    st.builds(emb_line, st.text(min_size=1, max_size=3), method=st.sampled_from(["GET", "POST"])),
    st.text(max_size=20).filter(lambda s: "\n" not in s and "\r" not in s),
    st.builds(json.dumps, st.one_of(st.integers(), st.lists(st.integers(), max_size=2))),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(LINE, min_size=1, max_size=20).filter(
    lambda ls: any(ln.strip() for ln in ls)))
def test_every_line_ends_exactly_once_with_the_apis_code(tmp_path_factory: pytest.TempPathFactory,
                                                          lines: list[str]) -> None:
    tmp = tmp_path_factory.mktemp("openai")
    data = ("\n".join(lines) + "\n").encode("utf-8", "surrogatepass")
    kept = [n for n, _ in iter_lines(data)]
    try:
        outputs, errors, manifest = run_lines(tmp, lines)
    except ConfigError as exc:  # the lines' endpoint needs the LLM engine: refused at plan time, nothing run
        assert batch_endpoint(data, "llm") in (CHAT, COMPLETIONS)
        assert "engine" in str(exc)
        return
    assert manifest.rows == len(kept)
    ids = [o["id"] for o in outputs] + [e["id"] for e in errors]
    assert len(outputs) + len(errors) == len(kept) and len(set(ids)) == len(ids)
    # the API's own rules on the same file give the same split and the same codes
    req = openai_input.read_request(str(tmp / "out" / "runs" / "dag" / "r"))
    parsed = parse_file(iter_lines(data), req["endpoint"], req["model"])
    assert sorted(o["custom_id"] for o in outputs) == sorted(r.custom_id for r in parsed.requests
                                                             if r.custom_id.strip())
    api_codes = {c.value for c in DeadLetterReason if c.name.startswith("OPENAI_")}
    assert [(e["custom_id"], e["error"]["code"]) for e in errors if e["error"]["code"] in api_codes] == [
        (r.custom_id, r.code) for r in parsed.rejections]
    # the only other error lines: accepted custom ids with no canonical form (blank), the worker's invalid_id
    assert all(e["error"]["code"] == "invalid_id" for e in errors if e["error"]["code"] not in api_codes)


def test_refused_rows_are_dead_letters_with_their_code_and_the_winner_keeps_its_id(tmp_path: Path) -> None:
    lines = [emb_line("a"), "{not json", emb_line("a", text="again"), emb_line("b", model="other"),
             emb_line("c", body={"dimensions": 3}), emb_line("d", url=CHAT), emb_line(7), emb_line("e")]
    outputs, errors, manifest = run_lines(tmp_path, lines)
    assert manifest.input.rejection_key == REJECTION_KEY and manifest.rows == len(lines)
    assert [o["custom_id"] for o in outputs] == ["a", "e"]
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [
        (None, Code.INVALID_JSON), ("a", Code.DUPLICATE_CUSTOM_ID), ("b", Code.MISMATCHED_MODEL),
        ("c", Code.UNSUPPORTED), ("d", Code.MISMATCHED_ENDPOINT), (None, Code.MISSING_CUSTOM_ID)]
    assert outputs[0]["response"]["body"]["data"][0]["embedding"] == [0.5]
    assert all(e["response"]["body"]["error"]["code"] == e["error"]["code"] for e in errors)


def test_every_api_code_is_a_dead_letter_reason_of_its_own() -> None:
    from batch_contract.rows import ROW_REASONS

    codes = {v for k, v in vars(Code).items() if k.isupper()}
    assert codes <= {r.value for r in ROW_REASONS}


def test_chat_lines_plan_the_llm_engine_with_the_rows_own_requests(tmp_path: Path) -> None:
    src = tmp_path / "chat.jsonl"
    src.write_text("\n".join([chat_line("x", max_tokens=5), chat_line("y"), emb_line("z")]) + "\n")
    engine = {"kind": "llm", "model_path": str(tmp_path / "model"), "max_model_len": 256, "max_tokens": 16}
    manifest, _ = plan(request(tmp_path, src, "c", engine))
    cfg = manifest.engine_config
    assert cfg.row_messages and cfg.row_sampling_column == "sampling"
    assert manifest.rows == 3
    again, _ = plan(request(tmp_path, src, "c", engine))  # a rerun reuses the plan and its conversion
    assert again.to_dict() == manifest.to_dict()


@pytest.mark.parametrize(("lines", "engine", "needs"), [
    ([emb_line("a"), emb_line("b")], "llm", "encoder"),
    ([chat_line("a"), chat_line("b"), emb_line("c")], "encoder", "llm"),
])
def test_lines_for_another_engine_are_refused_at_plan_time(tmp_path: Path, lines: list[str], engine: str,
                                                          needs: str) -> None:
    src = tmp_path / "x.jsonl"
    src.write_text("\n".join(lines) + "\n")
    eng = {"kind": engine, **({"model_path": str(tmp_path)} if engine == "llm" else {})}
    with pytest.raises(ConfigError, match=f"engine={needs!r}"):
        plan(request(tmp_path, src, "m", eng))
    assert not (tmp_path / "out" / "runs" / "dag" / "m" / "manifest.json").exists()


def test_a_folder_or_parquet_input_and_documents_are_refused(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    for name in ("a.jsonl", "b.jsonl"):
        (tmp_path / "d" / name).write_text(emb_line() + "\n")
    with pytest.raises(ConfigError, match="one JSONL file"):
        plan(request(tmp_path, tmp_path / "d", "f", {"kind": "encoder"}))
    with pytest.raises(ConfigError, match="preprocess"):
        PlanRequest(input_uri="x", id_column="id", text_column="text", output_root="o", run_id="r",
                    engine={"kind": "encoder"}, input_format="openai_batch", preprocess="pdf")
    with pytest.raises(ConfigError, match="input_format"):
        PlanRequest(input_uri="x", id_column="id", text_column="text", output_root="o", run_id="r",
                    engine={"kind": "encoder"}, input_format="csv")


@pytest.mark.parametrize("text", ["", "\n", "\n  \n\t\n", "\r\n"])
def test_a_file_without_a_request_line_is_refused(tmp_path: Path, text: str) -> None:
    """OpenAI refuses an empty batch file: so does the plan, before anything is written."""
    src = tmp_path / "empty.jsonl"
    src.write_text(text)
    with pytest.raises(ConfigError, match="no request lines"):
        plan(request(tmp_path, src, "e", {"kind": "encoder"}))
    assert not (tmp_path / "out" / "runs" / "dag" / "e" / "manifest.json").exists()


def test_input_roots_cover_the_converted_file(tmp_path: Path) -> None:
    src = tmp_path / "in" / "x.jsonl"
    src.parent.mkdir()
    src.write_text(emb_line("a") + "\n")
    manifest, _ = plan(request(tmp_path, src, "rr", {"kind": "encoder"}, roots=[str(tmp_path / "in")]))
    assert manifest.input.files[0].uri.endswith("/openai/input.jsonl")
    assert manifest.input.roots[-1].endswith("/openai")
    with pytest.raises(ConfigError, match="outside|allowed"):
        plan(request(tmp_path, src, "rx", {"kind": "encoder"}, roots=[str(tmp_path / "elsewhere")]))


def test_refusal_is_never_a_row_of_a_table_input(tmp_path: Path) -> None:
    """A table input whose rows happen to hold the key is read as it is (the key means nothing there)."""
    src = tmp_path / "t.jsonl"
    src.write_text(json.dumps({"id": "a", "text": "x", REJECTION_KEY: {"code": Code.INVALID_JSON, "message": "m"}})
                   + "\n")
    manifest, _ = plan(PlanRequest(input_uri=str(src), id_column="id", text_column="text",
                                   output_root=str(tmp_path / "o"), run_id="t", engine={"kind": "encoder"}))
    assert manifest.input.rejection_key is None
    blocks = list(iter_shard_blocks(manifest.input, manifest.shards[0].segments, 10, (), WorkerSettings()))
    assert Validator("id").validate(blocks[0]).rows.ids == ["a"]


def test_a_refusal_with_a_code_no_reason_knows_is_invalid_record_naming_it(tmp_path: Path) -> None:
    src = tmp_path / "conv.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in [
        {"id": "a", "text": "", REJECTION_KEY: {"code": "made_up", "message": "m"}},
        {"id": "b", "text": "", REJECTION_KEY: {"code": Code.INVALID_METHOD, "message": "method 'GET'"}},
        {"id": "c", "text": "kept", REJECTION_KEY: "not a refusal"}]) + "\n")
    manifest, _ = plan(PlanRequest(input_uri=str(src), id_column="id", text_column="text",
                                   output_root=str(tmp_path / "o"), run_id="k", engine={"kind": "encoder"}))
    spec = replace(manifest.input, rejection_key=REJECTION_KEY)
    checked = Validator("id").validate(next(iter_shard_blocks(spec, manifest.shards[0].segments, 10, (),
                                                              WorkerSettings())))
    assert [(d.id, d.reason, d.detail) for d in checked.dead] == [
        ("a", DeadLetterReason.INVALID_RECORD, "made_up: m"), ("b", DeadLetterReason.OPENAI_INVALID_METHOD, "method 'GET'")]
    assert checked.rows.ids == ["c"]
