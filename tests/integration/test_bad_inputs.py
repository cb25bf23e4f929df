"""Bad-input catalogue: every kind of bad input gets a clear answer, never a crash or a silent loss.

Two kinds of expected outcome, each case a row of a parametrised table:

* **up-front error**: the real planner (``batch_inference.planner.plan``) raises ``PlanError`` whose
  message names the file and the column (or the line) before any worker starts;
* **per-row outcome**: the real worker (``batch_worker.runtime.run_shard``, real MiniLM, in-process so the
  model loads once per run) turns the row into exactly one dead letter with a reason code
  (``DeadLetterReason``), or into a result whose id is kept verbatim (ids with ``/``, spaces, newlines;
  integer ids in decimal) and whose flags say what happened (``truncated``, ``text_repaired``).

One JSONL run and one Parquet run carry all per-row cases (planned by the real planner), so the suite
pays two model loads. Rows are located by ``(source file, row)`` for dead letters and by id for results.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from batch_contract import storage
from batch_contract.enums import DeadLetterReason, ExitCode
from batch_contract.layout import RunLayout, chunk_of, join_uri
from batch_contract.marker import ShardMarker
from batch_inference.planner import PlanError, PlanRequest, plan

pytestmark = pytest.mark.integration

ENGINE = {"kind": "encoder", "dtype": "float32"}
WORKER = {"chunk_rows": 64, "token_budget": 4096, "progress_interval_seconds": 60.0}
JSONL_SAMPLE_LINES = 200  # the planner type-checks the first 200 lines of each JSONL file
LONG_TEXT = ("lorem ipsum dolor sit amet " * 20_000)[:500_000]
BAD_UTF8_LINE = b'{"id": "bad-utf8", "text": "caf\xc3 \xff\xfe bytes"}'


def _plan(tmp: Path, input_uri: str, run_id: str, rows_per_shard: int = 10_000, **kw):
    request = PlanRequest(input_uri=input_uri, id_column=kw.pop("id_column", "id"),
                          text_column=kw.pop("text_column", "text"), output_root=str(tmp / "out"),
                          run_id=run_id, engine=ENGINE, worker=kw.pop("worker", WORKER),
                          rows_per_shard=rows_per_shard, **kw)
    return plan(request)


def _jsonl(path: Path, lines: list[bytes | dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        for line in lines:
            fh.write((json.dumps(line).encode() if isinstance(line, dict) else line) + b"\n")
    return path


def _parquet(path: Path, table: pa.Table) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path


# ------------------------------------------------------------------------------------ up-front errors


def _missing_text(d: Path) -> Path:
    return _parquet(d / "no_text.parquet", pa.table({"id": ["a", "b"], "body": ["x", "y"]}))


def _text_wrong_type(d: Path) -> Path:
    return _parquet(d / "int_text.parquet", pa.table({"id": ["a", "b"], "text": [1, 2]}))


def _id_wrong_type(d: Path) -> Path:
    return _parquet(d / "float_id.parquet", pa.table({"id": [1.5, 2.5], "text": ["x", "y"]}))


def _null_type_vs_string(d: Path) -> Path:
    _parquet(d / "ds" / "a.parquet", pa.table({"id": ["a"], "text": pa.array([None], pa.null())}))
    _parquet(d / "ds" / "b.parquet", pa.table({"id": ["b"], "text": ["words"]}))
    return d / "ds"


def _int_ids_vs_string_ids(d: Path) -> Path:
    _jsonl(d / "ds" / "a.jsonl", [{"id": 1, "text": "x"}])
    _jsonl(d / "ds" / "b.jsonl", [{"id": "b", "text": "y"}])
    return d / "ds"


def _mixed_type_ids(d: Path) -> Path:
    return _jsonl(d / "mixed.jsonl", [{"id": "a", "text": "x"}, {"id": 2, "text": "y"}])


def _bool_ids(d: Path) -> Path:
    return _jsonl(d / "bools.jsonl", [{"id": True, "text": "x"}, {"id": False, "text": "y"}])


def _non_json_line_early(d: Path) -> Path:
    return _jsonl(d / "broken.jsonl", [{"id": "a", "text": "x"}, b"{this is not json", {"id": "c", "text": "z"}])


def _json_array_line(d: Path) -> Path:
    return _jsonl(d / "array.jsonl", [{"id": "a", "text": "x"}, b'["id", "text"]'])


def _missing_id_column_jsonl(d: Path) -> Path:
    return _jsonl(d / "noid.jsonl", [{"key": "a", "text": "x"}])


def _no_such_input(d: Path) -> Path:
    return d / "does-not-exist.parquet"


def _mixed_formats(d: Path) -> Path:
    _jsonl(d / "ds" / "a.jsonl", [{"id": "a", "text": "x"}])
    _parquet(d / "ds" / "b.parquet", pa.table({"id": ["b"], "text": ["y"]}))
    return d / "ds"


UPFRONT_CASES = [
    # case id, builder, regex the PlanError message must match (names file and column/line)
    ("parquet_missing_text_column", _missing_text, r"text_column: column 'text' is missing from .*no_text\.parquet"),
    ("parquet_text_wrong_type", _text_wrong_type, r"text_column: column 'text' has type int64 in .*int_text\.parquet"),
    ("parquet_id_wrong_type", _id_wrong_type, r"id_column: column 'id' has type double in .*float_id\.parquet"),
    ("column_null_typed_in_one_file_string_in_other", _null_type_vs_string, r"text_column: column 'text' is all null in .*a\.parquet"),
    ("integer_ids_in_one_file_string_ids_in_other", _int_ids_vs_string_ids, r"id_column: column 'id' is integer in .*a\.jsonl but string in .*b\.jsonl"),
    ("mixed_type_ids_in_one_file", _mixed_type_ids, r"id_column: column 'id' mixes types \['integer', 'string'\] in .*mixed\.jsonl"),
    ("boolean_ids", _bool_ids, r"id_column: column 'id' has type other:bool in .*bools\.jsonl"),
    ("jsonl_line_not_json_in_sampled_lines", _non_json_line_early, r"broken\.jsonl line 2 \(non-blank\) is not valid JSON"),
    ("jsonl_line_json_but_not_object", _json_array_line, r"array\.jsonl line 2 \(non-blank\) is not a JSON object"),
    ("jsonl_missing_id_column", _missing_id_column_jsonl, r"id_column: column 'id' is missing from .*noid\.jsonl"),
    ("input_does_not_exist", _no_such_input, r"input_uri: .*does-not-exist\.parquet does not exist"),
    ("parquet_and_jsonl_mixed", _mixed_formats, r"mixes Parquet and JSONL"),
]


@pytest.mark.parametrize(("case", "build", "message"), UPFRONT_CASES, ids=[c[0] for c in UPFRONT_CASES])
def test_upfront_error_names_file_and_column(case: str, build, message: str, tmp_path: Path) -> None:
    input_path = build(tmp_path / "in")
    with pytest.raises(PlanError, match=message):
        _plan(tmp_path, str(input_path), run_id=f"bad_{case}")
    assert not (tmp_path / "out" / "runs" / f"bad_{case}" / "manifest.json").exists(), "no manifest for a bad plan"


def test_invalid_utf8_in_sampled_jsonl_lines_is_planned_like_later_lines(tmp_path: Path) -> None:
    src = _jsonl(tmp_path / "in" / "utf8.jsonl", [{"id": "a", "text": "fine"}, BAD_UTF8_LINE])
    manifest, _ = _plan(tmp_path, str(src), run_id="bad_utf8_early")
    assert manifest.rows == 2


def test_upfront_error_in_worker_names_the_column(tmp_path: Path) -> None:
    """A file that changed after planning (text column gone) stops the worker with exit 2 naming it."""
    from batch_worker.cli import main as worker_main

    src = _parquet(tmp_path / "in" / "data.parquet", pa.table({"id": ["a", "b"], "text": ["x", "y"]}))
    manifest, _ = _plan(tmp_path, str(src), run_id="changed_after_plan")
    _parquet(src, pa.table({"id": ["a", "b"], "body": ["x", "y"]}))
    run_dir = RunLayout(str(tmp_path / "out"), "changed_after_plan").run_dir
    assert worker_main(["run", "--run-dir", run_dir, "--shard", manifest.shards[0].shard_id]) == int(ExitCode.BAD_INPUT)


# ------------------------------------------------------------------------------------ per-row outcomes


def _jsonl_dataset(d: Path) -> dict[str, object]:
    """The JSONL run's files; returns case -> locator (``("row", file, row)`` or ``("id", id)``)."""
    a: list[bytes | dict] = [
        {"id": "ok-1", "text": "A library for parsing command line options."},
        {"id": "empty", "text": ""},
        {"id": "blank", "text": " \t \n "},
        {"id": "nulltext", "text": None},
        {"id": None, "text": "row with a null id"},
        {"id": "dup-in-file", "text": "first occurrence is kept"},
        {"id": "dup-in-file", "text": "second occurrence is a dead letter"},
        {"id": "dup-across", "text": "first occurrence, in a.jsonl"},
        {"id": "pkg/with/slash", "text": "ids with slashes stay verbatim"},
        {"id": "id with  spaces ", "text": "ids with spaces stay verbatim"},
        {"id": "id\nwith\nnewlines", "text": "ids with newlines stay verbatim"},
        {"id": "huge", "text": LONG_TEXT},
        {"id": "", "text": "empty string id"},
        # json.dumps writes a lone surrogate as the escape \ud800 (valid JSON, not valid Unicode)
        {"id": "surrogate-text", "text": "lone \ud800 surrogate in the text"},
        {"id": "bad-\udc00-id", "text": "an id with a lone surrogate"},
        {"id": "surrogate-unused", "text": "fine text", "section": "unused \ud800 column"},
        {"id": "dup-empty-first", "text": ""},
        {"id": "dup-empty-first", "text": "the first valid row of this id wins"},
        {"id": "dup-valid-first", "text": "first and valid"},
        {"id": "dup-valid-first", "text": None},
    ]
    # pad past the planner's sampled lines with cheap rows (empty text: dead letters, no inference)
    a += [{"id": f"pad-{i:03d}", "text": ""} for i in range(JSONL_SAMPLE_LINES)]
    late_start = len(a)
    a += [
        b"{not json at all",
        {"id": 7, "text": "an integer id among string ids, after the sampled lines"},
        {"id": "numtext", "text": 12345},
        {"id": ["a", "list"], "text": "an id that is a list"},
        BAD_UTF8_LINE,
    ]
    b: list[bytes | dict] = [
        {"id": "dup-across", "text": "second occurrence, in b.jsonl"},
        {"id": "ok-2", "text": "Another ordinary package description."},
    ]
    _jsonl(d / "ds" / "a.jsonl", a)
    _jsonl(d / "ds" / "b.jsonl", b)
    _jsonl(d / "ds" / "c_empty.jsonl", [])
    fa, fb = str(d / "ds" / "a.jsonl"), str(d / "ds" / "b.jsonl")
    return {
        "a": fa, "b": fb, "late_start": late_start,
    }


def _run_worker(run_dir: str, shard_id: str) -> int:
    from batch_worker.runtime import run_shard

    return run_shard(run_dir, shard_id, install_signals=False)


def _outputs(run_dir: str, shard_ids: list[str]) -> tuple[dict[str, list[dict]], dict[tuple[str, int], list[dict]]]:
    """(results by id, dead letters by (source_uri, source_row)) over the given shards."""
    layout = RunLayout.from_run_dir(run_dir)
    results: dict[str, list[dict]] = {}
    dead: dict[tuple[str, int], list[dict]] = {}
    for sid in shard_ids:
        sdir = layout.shard_dir(sid)
        for name in storage.list_names(sdir):
            if chunk_of(name) is None:
                continue
            table = pq.read_table(join_uri(sdir, name))
            for row in table.to_pylist():
                if name.startswith("part-"):
                    results.setdefault(row["id"], []).append(row)
                else:
                    dead.setdefault((row["source_uri"], row["source_row"]), []).append(row)
    return results, dead


@pytest.fixture(scope="module")
def jsonl_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    tmp = tmp_path_factory.mktemp("bad_jsonl")
    files = _jsonl_dataset(tmp / "in")
    manifest, refs = _plan(tmp, str(tmp / "in" / "ds"), run_id="bad_jsonl")
    codes = {r["shard_id"]: _run_worker(r["run_dir"], r["shard_id"]) for r in refs}
    run_dir = refs[0]["run_dir"]
    results, dead = _outputs(run_dir, [r["shard_id"] for r in refs])
    return {"manifest": manifest, "refs": refs, "codes": codes, "results": results, "dead": dead,
            "run_dir": run_dir, **files}


def test_jsonl_run_completes_and_covers_every_row(jsonl_run) -> None:
    manifest = jsonl_run["manifest"]
    assert set(jsonl_run["codes"].values()) == {int(ExitCode.OK)}
    n_results = sum(len(v) for v in jsonl_run["results"].values())
    n_dead = sum(len(v) for v in jsonl_run["dead"].values())
    assert n_results + n_dead == manifest.rows, "every input row is a result or a dead letter, once"
    assert all(len(v) == 1 for v in jsonl_run["results"].values()), "an id committed twice"
    assert all(len(v) == 1 for v in jsonl_run["dead"].values()), "a row dead-lettered twice"
    empty_files = [f for f in manifest.input.files if f.uri.endswith("c_empty.jsonl")]
    assert [f.rows for f in empty_files] == [0], "the empty input file is planned as 0 rows, not an error"


# case -> (file key, row) and the expected dead-letter reason
DEAD_CASES = [
    ("empty_text", "a", 1, DeadLetterReason.EMPTY_TEXT, None),
    ("whitespace_only_text", "a", 2, DeadLetterReason.EMPTY_TEXT, None),
    ("null_text", "a", 3, DeadLetterReason.NULL_TEXT, None),
    ("null_id", "a", 4, DeadLetterReason.NULL_ID, None),
    ("duplicate_id_within_file", "a", 6, DeadLetterReason.DUPLICATE_ID, "dup-in-file"),
    ("duplicate_id_across_files", "b", 0, DeadLetterReason.DUPLICATE_ID, "dup-across"),
    ("empty_string_id", "a", 12, DeadLetterReason.INVALID_ID, None),
    ("jsonl_line_not_json_after_sampled_lines", "a", "late+0", DeadLetterReason.INVALID_RECORD, None),
    ("non_string_text", "a", "late+2", DeadLetterReason.NON_STRING_TEXT, "numtext"),
    ("list_id", "a", "late+3", DeadLetterReason.INVALID_ID, None),
    ("id_with_lone_surrogate", "a", 14, DeadLetterReason.INVALID_ID, None),
    ("duplicate_id_whose_first_row_is_empty", "a", 16, DeadLetterReason.EMPTY_TEXT, "dup-empty-first"),
    ("duplicate_id_later_row_with_null_text", "a", 19, DeadLetterReason.NULL_TEXT, "dup-valid-first"),
]


@pytest.mark.parametrize(("case", "file_key", "row", "reason", "dead_id"), DEAD_CASES, ids=[c[0] for c in DEAD_CASES])
def test_bad_row_becomes_one_dead_letter_with_reason(jsonl_run, case, file_key, row, reason, dead_id) -> None:
    if isinstance(row, str):
        row = jsonl_run["late_start"] + int(row.split("+")[1])
    key = (jsonl_run[file_key], row)
    letters = jsonl_run["dead"].get(key)
    assert letters is not None, f"{case}: no dead letter for {key}"
    assert len(letters) == 1
    assert letters[0]["reason"] == reason.value, letters[0]
    assert letters[0]["detail"], "a dead letter says why"
    if dead_id is not None:
        assert letters[0]["id"] == dead_id


# case -> id that must come out verbatim as a result, and flags
RESULT_CASES = [
    ("id_with_slash", "pkg/with/slash", {}),
    ("id_with_spaces", "id with  spaces ", {}),
    ("id_with_newlines", "id\nwith\nnewlines", {}),
    ("integer_id_among_strings_after_sampled_lines", "7", {}),
    ("first_of_duplicate_ids_within_file", "dup-in-file", {}),
    ("first_of_duplicate_ids_across_files", "dup-across", {}),
    ("text_500k_chars_truncated", "huge", {"truncated": True}),
    ("invalid_utf8_repaired_and_flagged", "bad-utf8", {"text_repaired": True}),
    ("lone_surrogate_in_text_repaired_and_flagged", "surrogate-text", {"text_repaired": True}),
    ("lone_surrogate_in_an_unused_column_ignored", "surrogate-unused", {}),
    ("duplicate_id_first_valid_row_wins", "dup-empty-first", {}),
]


@pytest.mark.parametrize(("case", "rid", "flags"), RESULT_CASES, ids=[c[0] for c in RESULT_CASES])
def test_odd_but_valid_row_gives_one_result(jsonl_run, case, rid, flags) -> None:
    rows = jsonl_run["results"].get(rid)
    assert rows is not None and len(rows) == 1, f"{case}: {rid!r} has {rows and len(rows)} results"
    row = rows[0]
    assert len(row["embedding"]) == 384
    assert row["truncated"] is flags.get("truncated", False)
    assert row["text_repaired"] is flags.get("text_repaired", False)
    if case == "text_500k_chars_truncated":
        assert row["n_tokens"] == 256, "truncated at MiniLM's max_seq_length"


def test_marker_counts_match_the_catalogue(jsonl_run) -> None:
    layout = RunLayout.from_run_dir(jsonl_run["run_dir"])
    markers = [ShardMarker.from_json_bytes(storage.read_bytes(layout.marker_uri(r["shard_id"])))
               for r in jsonl_run["refs"]]
    reasons: dict[str, int] = {}
    for m in markers:
        for k, v in m.dead_letter_reasons.items():
            reasons[k] = reasons.get(k, 0) + v
    assert reasons[DeadLetterReason.EMPTY_TEXT.value] == 3 + JSONL_SAMPLE_LINES
    assert reasons[DeadLetterReason.DUPLICATE_ID.value] == 2
    assert sum(m.rows_truncated for m in markers) == 1
    assert sum(m.rows_text_repaired for m in markers) == 2


def test_rerun_of_a_shard_whose_rows_were_all_done_writes_nothing(jsonl_run) -> None:
    """Killed after the last commit but before the marker: the restart commits no (empty) file, exit 0."""
    layout = RunLayout.from_run_dir(jsonl_run["run_dir"])
    sid = jsonl_run["refs"][0]["shard_id"]
    before = [n for n in storage.list_names(layout.shard_dir(sid)) if chunk_of(n) is not None]
    old = ShardMarker.from_json_bytes(storage.read_bytes(layout.marker_uri(sid)))
    storage.delete(layout.marker_uri(sid))
    assert _run_worker(jsonl_run["run_dir"], sid) == int(ExitCode.OK)
    after = [n for n in storage.list_names(layout.shard_dir(sid)) if chunk_of(n) is not None]
    assert after == before, "no new part or dead-letter file (empty or otherwise)"
    new = ShardMarker.from_json_bytes(storage.read_bytes(layout.marker_uri(sid)))
    assert (new.rows_ok, new.rows_dead_letter, new.fingerprint) == (old.rows_ok, old.rows_dead_letter, old.fingerprint)
    assert _run_worker(jsonl_run["run_dir"], sid) == int(ExitCode.OK), "complete shard: exit 0 at once"


# ------------------------------------------------------------------------------------ Parquet run


@pytest.fixture(scope="module")
def parquet_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    tmp = tmp_path_factory.mktemp("bad_parquet")
    ds = tmp / "in" / "ds"
    _parquet(ds / "a.parquet", pa.table({"id": pa.array([10, None, 12, 10], pa.int64()),
                                         "text": ["integer id ten", "null id", "integer id twelve", "ten again"]}))
    _parquet(ds / "b_empty.parquet", pa.table({"id": pa.array([], pa.int64()), "text": pa.array([], pa.string())}))
    # all-null text in one file, but typed string (the null-typed variant is an up-front error above)
    _parquet(ds / "c.parquet", pa.table({"id": pa.array([13, 14], pa.int64()), "text": pa.array([None, None], pa.string())}))
    manifest, refs = _plan(tmp, str(ds), run_id="bad_parquet")
    codes = {r["shard_id"]: _run_worker(r["run_dir"], r["shard_id"]) for r in refs}
    results, dead = _outputs(refs[0]["run_dir"], [r["shard_id"] for r in refs])
    return {"manifest": manifest, "codes": codes, "results": results, "dead": dead, "a": str(ds / "a.parquet"),
            "c": str(ds / "c.parquet")}


def test_parquet_integer_ids_null_id_duplicate_all_null_file_and_empty_file(parquet_run) -> None:
    assert set(parquet_run["codes"].values()) == {int(ExitCode.OK)}
    assert sorted(parquet_run["results"]) == ["10", "12"], "integer ids come out in decimal, once"
    dead = {k: v[0]["reason"] for k, v in parquet_run["dead"].items()}
    a, c = parquet_run["a"], parquet_run["c"]
    assert dead == {(a, 1): "null_id", (a, 3): "duplicate_id", (c, 0): "null_text", (c, 1): "null_text"}
    rows = {f.uri.rsplit("/", 1)[-1]: f.rows for f in parquet_run["manifest"].input.files}
    assert rows == {"a.parquet": 4, "b_empty.parquet": 0, "c.parquet": 2}


def test_empty_input_plans_no_shards(tmp_path: Path) -> None:
    src = _parquet(tmp_path / "in" / "empty.parquet", pa.table({"id": pa.array([], pa.string()),
                                                               "text": pa.array([], pa.string())}))
    manifest, refs = _plan(tmp_path, str(src), run_id="empty_input")
    assert manifest.rows == 0 and refs == []


def test_duplicate_id_across_shards_is_not_lost_silently(tmp_path: Path) -> None:
    from batch_inference.publish.api import publish_run
    from batch_inference.publish.errors import PublishError
    from batch_inference.publish.target import PublishTarget

    _jsonl(tmp_path / "in" / "ds" / "a.jsonl", [{"id": "same", "text": "first text"}, {"id": "a2", "text": "x"}])
    _jsonl(tmp_path / "in" / "ds" / "b.jsonl", [{"id": "same", "text": "a different text"}, {"id": "b2", "text": "y"}])
    manifest, refs = _plan(tmp_path, str(tmp_path / "in" / "ds"), run_id="dup_across_shards", rows_per_shard=2)
    assert len(refs) == 2, "one file per shard"
    assert [_run_worker(r["run_dir"], r["shard_id"]) for r in refs] == [0, 0]
    target = PublishTarget(backend="duckdb", table="dups", duckdb_path=str(tmp_path / "pub.duckdb"))
    try:
        summary = publish_run(refs[0]["run_dir"], target)
    except PublishError as exc:
        assert "same" in str(exc), "the error names the duplicated id"
        return
    assert summary["rows_published"] + summary["rows_dead_letter"] == summary["rows_input"] == 4


def test_id_with_lone_surrogate_is_matched_by_position(jsonl_run) -> None:
    letter = jsonl_run["dead"][(jsonl_run["a"], 14)][0]
    assert letter["id"] is None and "surrogate" in letter["detail"]


# ------------------------------------------------------------------------------------ not valid UTF-8 in Parquet


def _invalid_utf8(values: list[bytes | None]) -> pa.Array:
    """A Parquet/Arrow string column holding bytes that are not UTF-8 (as other writers produce)."""
    return pa.array(values, pa.binary()).view(pa.string())


def test_parquet_strings_that_are_not_utf8_never_fail_the_shard_or_publish(tmp_path: Path) -> None:
    """Text is repaired (U+FFFD, ``text_repaired``), the id becomes an ``invalid_id`` dead letter matched by
    position, an unused column is never read; plan, worker and publish all succeed."""
    from batch_inference.publish.api import publish_run
    from batch_inference.publish.target import PublishTarget

    src = _parquet(tmp_path / "in" / "bad.parquet", pa.table({
        "id": _invalid_utf8([b"ok", b"bad-\xff-id", b"txt", b"\xed\xa0\x80"]),
        "text": _invalid_utf8([b"fine", b"words", b"caf\xc3 cut", b"more"]),
        "section": _invalid_utf8([b"\xff", b"\xfe", b"x", b"y"]),
    }))
    manifest, refs = _plan(tmp_path, str(src), run_id="not_utf8")
    assert [_run_worker(r["run_dir"], r["shard_id"]) for r in refs] == [0]
    results, dead = _outputs(refs[0]["run_dir"], [r["shard_id"] for r in refs])
    assert sorted(results) == ["ok", "txt"]
    assert results["txt"][0]["text_repaired"] is True and results["ok"][0]["text_repaired"] is False
    assert {k[1]: (v[0]["id"], v[0]["reason"]) for k, v in dead.items()} == {
        1: (None, "invalid_id"), 3: (None, "invalid_id")}
    target = PublishTarget(backend="duckdb", table="utf8", duckdb_path=str(tmp_path / "pub.duckdb"))
    summary = publish_run(refs[0]["run_dir"], target)
    assert (summary["rows_published"], summary["rows_dead_letter"], summary["rows_missing"]) == (2, 2, 0)


# ------------------------------------------------------------------------------------ sharding invariance


def _published(db: Path, table: str) -> tuple[list[tuple], list[tuple]]:
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        results = con.execute(f"SELECT id, text_repaired, truncated FROM batch_inference.{table} ORDER BY id").fetchall()
        dead = con.execute(f"SELECT id, reason, detail, source_uri, source_row FROM batch_inference.{table}__dead_letters "
                           "ORDER BY source_uri, source_row").fetchall()
    finally:
        con.close()
    return results, dead


def test_duplicate_ids_publish_the_same_table_whatever_the_shard_boundaries(tmp_path: Path) -> None:
    """The defect: one id on an empty-text row and then a valid row gave no result in one shard and a
    result in two. Every ``rows_per_shard`` from 1 to n must publish identical tables."""
    from batch_inference.publish.api import publish_run
    from batch_inference.publish.target import PublishTarget

    lines: list[bytes | dict] = [
        {"id": "x", "text": ""}, {"id": "y", "text": "first y"}, {"id": "x", "text": "valid x"},
        {"id": "y", "text": "second y"}, {"id": "x", "text": "third x"}, {"id": "z", "text": None},
        {"id": "z", "text": "valid z after a null text"}, {"id": "w", "text": "w once"},
        {"id": "w", "text": " \t "},
    ]
    src = _jsonl(tmp_path / "in" / "dups.jsonl", lines)
    tables = {}
    for rows_per_shard in range(1, len(lines) + 1):
        run_id = f"dups_{rows_per_shard}"
        _, refs = _plan(tmp_path, str(src), run_id=run_id, rows_per_shard=rows_per_shard)
        assert all(_run_worker(r["run_dir"], r["shard_id"]) == 0 for r in refs)
        target = PublishTarget(backend="duckdb", table=f"t{rows_per_shard}", duckdb_path=str(tmp_path / "p.duckdb"))
        summary = publish_run(refs[0]["run_dir"], target)
        assert summary["rows_published"] + summary["rows_dead_letter"] == len(lines)
        tables[rows_per_shard] = _published(tmp_path / "p.duckdb", f"t{rows_per_shard}")
    results, dead = tables[len(lines)]
    assert [r[0] for r in results] == ["w", "x", "y", "z"]
    assert [(d[0], d[1], d[4]) for d in dead] == [
        ("x", "empty_text", 0), ("y", "duplicate_id", 3), ("x", "duplicate_id", 4), ("z", "null_text", 5),
        ("w", "empty_text", 8)]
    assert dead[1][2] == f"duplicate of {src}#1, the first valid row with this id in input order (the one processed)"
    for rows_per_shard, got in tables.items():
        assert got == tables[len(lines)], f"rows_per_shard={rows_per_shard} published another table"


# ------------------------------------------------------------------------------------ torn committed files


def test_torn_part_file_without_marker_is_quarantined_and_recomputed(tmp_path: Path) -> None:
    """A truncated committed part and no marker used to crash every retry ("Parquet magic bytes not
    found"). The restart sets it aside, recomputes its rows and completes; the marker counts it."""
    src = _jsonl(tmp_path / "in" / "rows.jsonl", [{"id": f"r{i}", "text": f"row number {i}"} for i in range(12)])
    _, refs = _plan(tmp_path, str(src), run_id="torn", worker={**WORKER, "chunk_rows": 4})
    run_dir, sid = refs[0]["run_dir"], refs[0]["shard_id"]
    assert _run_worker(run_dir, sid) == 0
    layout = RunLayout.from_run_dir(run_dir)
    shard = storage.local_path(layout.shard_dir(sid))
    parts = sorted(shard.glob("part-*.parquet"))
    assert len(parts) == 3, "4-row chunks"
    before, _ = _outputs(run_dir, [sid])
    torn = parts[1]
    torn.write_bytes(torn.read_bytes()[: torn.stat().st_size // 2])
    storage.delete(layout.marker_uri(sid))
    assert _run_worker(run_dir, sid) == 0
    assert (shard / "quarantine" / torn.name).exists() and not torn.exists()
    after, _ = _outputs(run_dir, [sid])
    assert sorted(after) == sorted(before) and all(len(v) == 1 for v in after.values())
    marker = ShardMarker.from_json_bytes(storage.read_bytes(layout.marker_uri(sid)))
    assert marker.files_quarantined == 1 and marker.rows_ok == 12
    assert set(marker.files) == {p.name for p in shard.glob("part-*.parquet")}
