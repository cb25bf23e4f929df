"""Reader (Parquet segments, JSONL lines) and validation to dead letters."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from batch_contract.enums import DeadLetterReason as R
from batch_contract.manifest import InputFile, InputSpec, Segment
from batch_worker.errors import BadInputError
from batch_worker.reader import iter_shard_blocks
from batch_worker.validate import Validator, id_to_str


def _spec(path: Path, fmt: str, rows: int) -> InputSpec:
    return InputSpec(uri=str(path), format=fmt, id_column="id", text_column="text",
                     files=[InputFile(uri=str(path), rows=rows)])


def _validate_all(spec: InputSpec, segments, batch_rows=3, validator=None, extra=()):
    v = validator or Validator("id")
    out = [v.validate(b) for b in iter_shard_blocks(spec, segments, batch_rows, extra)]
    ids = [i for vb in out for i in vb.rows.ids]
    dead = [d for vb in out for d in vb.dead]
    return out, ids, dead


def test_parquet_reads_only_the_segment_across_row_groups(tmp_path: Path) -> None:
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": list(range(20)), "text": [f"t{i}" for i in range(20)], "extra": list(range(20))}),
                   path, row_group_size=6)
    spec = _spec(path, "parquet", 20)
    blocks = list(iter_shard_blocks(spec, [Segment(0, 5, 14)], 4))
    assert [r for b in blocks for r in b.source_rows] == list(range(5, 14))
    assert [i for b in blocks for i in b.ids] == list(range(5, 14))
    assert all(len(b) <= 4 for b in blocks)
    _, ids, dead = _validate_all(spec, [Segment(0, 5, 14)])
    assert ids == [str(i) for i in range(5, 14)] and not dead


def test_validation_dead_letters_every_bad_row_and_keeps_extra_fields(tmp_path: Path) -> None:
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({
        "id": ["a", None, "b", "a", "c", "d", "e", "  "],
        "text": ["ok", "x", None, "dup", "", "   \n", "fine", "y"],
        "section": ["s0", "s1", "s2", "s3", "s4", "s5", "s6", "s7"],
    }), path)
    out, ids, dead = _validate_all(_spec(path, "parquet", 8), [Segment(0, 0, 8)], extra=["section"])
    assert ids == ["a", "e"]
    assert [(d.id, d.reason) for d in dead] == [
        (None, R.NULL_ID), ("b", R.NULL_TEXT), ("a", R.DUPLICATE_ID), ("c", R.EMPTY_TEXT), ("d", R.EMPTY_TEXT),
        ("  ", R.INVALID_ID),
    ]
    assert [d.source_row for d in dead] == [1, 2, 3, 4, 5, 7]
    fields = [r for vb in out for r in vb.rows.fields.to_pylist()]
    assert [f["section"] for f in fields] == ["s0", "s6"] and fields[0]["id"] == "a"


def test_resume_ledger_skips_committed_rows_and_duplicates_stay_stable(tmp_path: Path) -> None:
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": [1, 2, 1, 3], "text": ["a", "", "b", "c"]}), path)
    spec = _spec(path, "parquet", 4)
    _, ids, dead = _validate_all(spec, [Segment(0, 0, 4)])
    assert ids == ["1", "3"] and [(d.id, d.reason) for d in dead] == [("2", R.EMPTY_TEXT), ("1", R.DUPLICATE_ID)]
    # rerun after "1" and both dead letters were committed: only "3" is left
    resumed = Validator("id", done_ids={"1"}, done_dead={(str(path), 1), (str(path), 2)})
    out, ids, dead = _validate_all(spec, [Segment(0, 0, 4)], validator=resumed)
    assert ids == ["3"] and not dead and sum(vb.skipped for vb in out) == 3


def test_jsonl_bad_lines_types_and_invalid_utf8(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    lines = [
        json.dumps({"id": 1, "text": "one", "lang": "en"}).encode(),
        b"",
        b"{not json",
        json.dumps({"id": 2.5, "text": "float id"}).encode(),
        json.dumps({"id": 3, "text": 42}).encode(),
        b'{"id": 4, "text": "caf\xe9 broken"}',
        b"[1, 2]",
        json.dumps({"id": "5", "text": "five"}).encode(),
    ]
    path.write_bytes(b"\n".join(lines))  # no trailing newline on the last line
    spec = _spec(path, "jsonl", 7)
    out, ids, dead = _validate_all(spec, [Segment(0, 0, 7)], batch_rows=2)
    assert ids == ["1", "4", "5"]
    assert [(d.source_row, d.reason) for d in dead] == [
        (1, R.INVALID_RECORD), (2, R.INVALID_ID), (3, R.NON_STRING_TEXT), (5, R.INVALID_RECORD)]
    rows = [vb.rows for vb in out if len(vb.rows)]
    repaired = dict(zip([i for r in rows for i in r.ids], [x for r in rows for x in r.text_repaired], strict=True))
    assert repaired == {"1": False, "4": True, "5": False}
    texts = [t for r in rows for t in r.texts]
    assert "\ufffd" in texts[1]
    # a segment in the middle of the file
    _, ids, _ = _validate_all(spec, [Segment(0, 5, 7)])
    assert ids == ["5"]


def test_wrong_id_column_type_or_missing_column_is_bad_input(tmp_path: Path) -> None:
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": [1.5, 2.5], "text": ["a", "b"]}), path)
    with pytest.raises(BadInputError, match=f"^{re.escape(str(path))}: id column 'id' has type double"):
        list(iter_shard_blocks(_spec(path, "parquet", 2), [Segment(0, 0, 2)], 10))
    pq.write_table(pa.table({"key": [1], "body": ["a"]}), path)
    with pytest.raises(BadInputError, match=f"^{re.escape(str(path))}: column 'id' not found"):
        list(iter_shard_blocks(_spec(path, "parquet", 1), [Segment(0, 0, 1)], 10))
    pq.write_table(pa.table({"id": [1], "text": ["a"]}), path)
    with pytest.raises(BadInputError, match=f"^{re.escape(str(path))}: segment rows 0\\.\\.5 beyond the file's 1 rows"):
        list(iter_shard_blocks(_spec(path, "parquet", 1), [Segment(0, 0, 5)], 10))


def test_id_to_str() -> None:
    assert id_to_str(7) == ("7", None, "")
    assert id_to_str("x")[0] == "x"
    assert id_to_str(None)[1] is R.NULL_ID
    assert id_to_str(True)[1] is R.INVALID_ID
    assert id_to_str(True)[0] is None  # matched by source position, as publish does
    assert id_to_str(1.0)[1] is R.INVALID_ID
