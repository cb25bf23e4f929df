"""The contract's row rules (``batch_contract.rows``) and the worker's validator that applies them:
property tests over generated ids, texts and JSONL byte streams."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from batch_contract.enums import DeadLetterReason as R
from batch_contract.manifest import InputFile, InputSpec, Segment
from batch_contract.rows import (
    ROW_REASONS,
    canonical_id,
    duplicate_detail,
    iter_jsonl_lines,
    repair_text,
    repair_value,
)
from batch_inference.publish.expected import _jsonl_id
from batch_worker.reader import iter_shard_blocks
from batch_worker.validate import Validator
from hypothesis import given, settings
from hypothesis import strategies as st

SURROGATES = st.sampled_from(["\ud800", "\udfff", "a\udc00b", "\ud83d"])
ODD_TEXT = st.one_of(st.text(max_size=12), SURROGATES, st.sampled_from(["", " ", "\t\n", "e\u0301", "\u200f"]))
RAW_IDS = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20), st.floats(allow_nan=False),
                    ODD_TEXT, st.binary(max_size=6), st.lists(st.integers(), max_size=2))


def _utf8_ok(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@given(RAW_IDS)
def test_canonical_id_is_total_and_always_encodable(value) -> None:
    cid = canonical_id(value)
    assert cid.id is None or (isinstance(cid.id, str) and _utf8_ok(cid.id))
    assert (cid.reason is None) == (cid.detail == "")
    assert _utf8_ok(cid.detail) and _utf8_ok(repr(cid))
    if isinstance(value, int) and not isinstance(value, bool):
        assert cid == canonical_id(str(value)) or cid.id == str(value)
    if cid.reason is None:
        assert cid.id is not None and cid.id.strip()
    if cid.reason in (R.NULL_ID,) or (cid.reason is R.INVALID_ID and not isinstance(value, str | bytes)):
        assert cid.id is None, "no canonical form: matched by position"


@given(st.one_of(ODD_TEXT, st.binary(max_size=12)))
def test_repair_text_gives_valid_unicode_and_flags_exactly_the_repairs(value) -> None:
    fixed, repaired = repair_text(value)
    assert isinstance(fixed, str) and _utf8_ok(fixed)
    valid = _utf8_ok(value) if isinstance(value, str) else _decodes(value)
    assert repaired is (not valid)
    assert repair_text(fixed) == (fixed, False), "idempotent"
    if valid:
        assert fixed == (value if isinstance(value, str) else value.decode())


def _decodes(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@given(st.recursive(st.one_of(ODD_TEXT, st.integers(), st.none()),
                    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(ODD_TEXT, inner, max_size=3)),
                    max_leaves=8))
def test_repair_value_leaves_no_string_that_utf8_cannot_encode(value) -> None:
    json.dumps(repair_value(value), ensure_ascii=False).encode("utf-8")  # raises on a lone surrogate


@settings(max_examples=60)
@given(st.lists(st.one_of(st.binary(max_size=8), st.sampled_from([b"", b" ", b"\t", b"\r", b"{}"])), max_size=12),
       st.integers(1, 7))
def test_jsonl_rows_do_not_depend_on_read_block_size(lines: list[bytes], block: int) -> None:
    data = b"\n".join(line.replace(b"\n", b"") for line in lines)
    expected = [line for line in data.split(b"\n") if line.strip()]
    got = list(iter_jsonl_lines(io.BytesIO(data), block_bytes=block))
    assert got == list(enumerate(expected))


@given(RAW_IDS.filter(lambda v: not isinstance(v, bytes)))
def test_publish_expects_the_id_the_worker_writes(value) -> None:
    """Publish's JSONL id (from the raw line, as written with json.dumps) equals the worker's
    canonical id for every value: the two sides can never disagree on which ids to cover."""
    line = json.dumps({"id": value, "text": "t"}).encode()
    assert _jsonl_id(line, "id") == canonical_id(json.loads(line)["id"]).id


# ------------------------------------------------------------------ duplicates: the validator vs an oracle

ID_POOL = st.sampled_from(["a", "b", "c", 1, None, " ", "bad\ud800"])
TEXT_POOL = st.sampled_from(["words", "more words", "", " ", None, 5, "caf\ud800"])


def _oracle(rows: list[tuple[object, object]], uri: str) -> list[tuple[str | None, R | None, str]]:
    """The rule written out directly: own problems first, then the first eligible row of an id wins."""
    out = []
    winners: dict[str, int] = {}
    for i, (rid, text) in enumerate(rows):
        cid = canonical_id(rid)
        fixed, _ = repair_text(text)
        reason = cid.reason
        if reason is None:
            reason = (R.NULL_TEXT if fixed is None else R.NON_STRING_TEXT if not isinstance(fixed, str)
                      else R.EMPTY_TEXT if not fixed.strip() else None)
        if reason is not None:
            assert reason in ROW_REASONS
            out.append((cid.id, reason, ""))
            continue
        first = winners.setdefault(cid.id, i)
        out.append((cid.id, R.DUPLICATE_ID, duplicate_detail(uri, first)) if first != i else (cid.id, None, ""))
    return out


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(ID_POOL, TEXT_POOL), min_size=1, max_size=14), st.integers(1, 5), st.data())
def test_validator_applies_the_duplicate_rule_in_any_block_size_and_after_any_resume(tmp_path_factory, rows,
                                                                                      batch_rows, data) -> None:
    path = Path(tmp_path_factory.mktemp("rows")) / "in.jsonl"
    path.write_text("\n".join(json.dumps({"id": i, "text": t}) for i, t in rows) + "\n")
    spec = InputSpec(uri=str(path), format="jsonl", id_column="id", text_column="text",
                     files=[InputFile(uri=str(path), rows=len(rows))])
    expected = _oracle(rows, str(path))

    def run(validator: Validator) -> dict[int, tuple[str | None, R | None, str]]:
        got = {}
        for block in iter_shard_blocks(spec, [Segment(0, 0, len(rows))], batch_rows):
            vb = validator.validate(block)
            got.update({row: (rid, None, "") for rid, row in zip(vb.rows.ids, vb.rows.source_row, strict=True)})
            got.update({d.source_row: (d.id, d.reason, d.detail if d.reason is R.DUPLICATE_ID else "")
                        for d in vb.dead})
        return got

    full = run(Validator("id"))
    assert [full[i] for i in range(len(rows))] == expected
    # resume after a random prefix was committed: the rest classifies identically, nothing twice
    cut = data.draw(st.integers(0, len(rows)))
    done_ids = {rid for i, (rid, reason, _) in enumerate(expected[:cut]) if reason is None}
    done_dead = {(str(path), i) for i, (_, reason, _) in enumerate(expected[:cut]) if reason is not None}
    resumed = run(Validator("id", done_ids=done_ids, done_dead=done_dead))
    assert resumed == {i: expected[i] for i in range(cut, len(rows))}


def test_parquet_reader_reads_only_the_used_columns(tmp_path: Path) -> None:
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": ["a"], "text": ["t"], "blob": pa.array([b"\xff"], pa.binary()).view(pa.string()),
                             "n": [1]}), path)
    spec = InputSpec(uri=str(path), format="parquet", id_column="id", text_column="text",
                     files=[InputFile(uri=str(path), rows=1)])
    block = next(iter_shard_blocks(spec, [Segment(0, 0, 1)], 10))
    assert block.extras.column_names == []
    block = next(iter_shard_blocks(spec, [Segment(0, 0, 1)], 10, ["n", "blob", "missing"]))
    assert block.extras.column_names == ["n", "blob"] and block.extras.column("blob").to_pylist() == ["\ufffd"]
