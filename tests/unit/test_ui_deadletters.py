"""The error file of the Batch inference page (:mod:`batch_inference.ui.deadletters`):

* **CSV formula injection**: no cell of the CSV, in any column, starts with a character that makes a
  spreadsheet read it as a formula (OWASP: ``=``, ``+``, ``-``, ``@``, tab, CR); a neutralised cell is
  the value with one ``'`` in front, and the CSV parses back to exactly those cells (property tests).
* **Bounded memory**: files are read a batch at a time, the output leaves in chunks, a recommitted chunk's
  rows are written once (one bit per input row of the shard), and rows are produced lazily.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from batch_contract import storage
from batch_contract.layout import DEAD_LETTER_PREFIX, join_uri
from batch_contract.runstore import RunStore
from batch_contract.schemas import DEAD_LETTER_SCHEMA
from batch_inference.ui import deadletters
from batch_inference.ui.deadletters import COLUMNS, FORMULA_PREFIXES, safe_cell, to_csv, to_jsonl
from hypothesis import given, settings
from hypothesis import strategies as st
from ui.app_harness import make_run

TRIGGERS = list(FORMULA_PREFIXES)
CELL_TEXT = st.one_of(
    st.text(max_size=12),
    st.builds(lambda c, rest: c + rest, st.sampled_from(TRIGGERS), st.text(max_size=10)),
    st.sampled_from(["=1+1", "=HYPERLINK(\"http://x\",\"y\")", "+cmd|' /C calc'!A0", "-2+3", "@SUM(A1)",
                     "\t=1", "\r=1", "'=1", " =1", "a,b", 'q"q', "line\nbreak", "=", "-", "-1"]),
)
CELLS = st.one_of(CELL_TEXT, st.none(), st.integers(-(10**6), 10**6))
ROWS = st.lists(st.fixed_dictionaries({c: CELLS for c in COLUMNS}), max_size=8)


def _parse(chunks) -> list[list[str]]:
    return list(csv.reader(io.StringIO(b"".join(chunks).decode("utf-8"), newline="")))


@settings(max_examples=150, deadline=None)
@given(ROWS)
def test_no_csv_cell_starts_a_formula(rows: list[dict]) -> None:
    table = _parse(to_csv(iter(rows)))
    assert table[0] == list(COLUMNS) and len(table) == len(rows) + 1
    for row, parsed in zip(rows, table[1:], strict=True):
        for column, cell in zip(COLUMNS, parsed, strict=True):
            assert not cell.startswith(FORMULA_PREFIXES), (column, cell)
            text = "" if row[column] is None else str(row[column])
            assert cell == ("'" + text if text.startswith(FORMULA_PREFIXES) else text), (column, cell)


@settings(max_examples=150, deadline=None)
@given(CELLS)
def test_safe_cell_prefixes_exactly_the_formula_triggers(value) -> None:
    text = "" if value is None else str(value)
    cell = safe_cell(value)
    assert not cell.startswith(FORMULA_PREFIXES)
    assert cell == text or (cell == "'" + text and text[:1] in TRIGGERS)


def test_every_csv_cell_is_quoted() -> None:
    raw = b"".join(to_csv(iter([{"shard_id": "00000", "id": "=1+1", "reason": "empty_text", "detail": "-",
                                 "source_uri": "/in.parquet", "source_row": 3, "fingerprint": "f"}]))).decode()
    assert raw.splitlines()[1] == '"00000","\'=1+1","empty_text","\'-","/in.parquet","3","f"'
    assert raw.endswith("\r\n")


def test_jsonl_keeps_values_as_they_are() -> None:
    rows = [{"id": "=1+1", "detail": "@x", "source_row": -1}]
    assert [json.loads(x) for x in b"".join(to_jsonl(iter(rows))).decode().splitlines()] == rows


def test_output_leaves_in_bounded_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deadletters, "CHUNK_BYTES", 1000)
    rows = [{c: f"{c}-{i}-" + "x" * 50 for c in COLUMNS} for i in range(200)]
    for encode in (to_csv, to_jsonl):
        chunks = list(encode(iter(rows)))
        assert len(chunks) > 10
        assert max(len(c) for c in chunks) < 1000 + 600          # one row over the mark at most


def test_rows_are_produced_lazily() -> None:
    """The encoders pull rows as they go: the first chunk leaves before the rows run out."""
    pulled = []

    def rows():
        for i in range(10_000):
            pulled.append(i)
            yield {c: "v" * 100 for c in COLUMNS}

    first = next(to_csv(rows()))
    assert first.startswith(b'"shard_id"') and len(pulled) < 10_000


def _dead_table(rows: list[int], uri: str, detail: str = "d") -> pa.Table:
    n = len(rows)
    return pa.table({"id": [f"id{r}" for r in rows], "reason": ["empty_text"] * n, "detail": [detail] * n,
                     "source_uri": [uri] * n, "source_row": rows, "fingerprint": ["f" * 32] * n},
                    schema=DEAD_LETTER_SCHEMA)


def test_a_file_is_read_a_batch_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file of many row groups is decoded :data:`BATCH_ROWS` rows at a time, never as a whole table."""
    layout = make_run(tmp_path / "out", rows=5000, dead_rows=())
    src = RunStore(layout).manifest.input.files[0].uri
    shard = layout.shard_dir("00000")
    pq.write_table(_dead_table(list(range(5000)), src), Path(shard) / f"{DEAD_LETTER_PREFIX}00001-big.parquet",
                   row_group_size=700)
    sizes = []
    real_read = storage.read_bytes

    def read_bytes(uri: str) -> bytes:
        assert not uri.endswith(".parquet"), f"{uri} read whole"
        return real_read(uri)

    class Recording(pq.ParquetFile):
        def iter_batches(self, *args, **kwargs):
            for batch in super().iter_batches(*args, **kwargs):
                sizes.append(batch.num_rows)
                yield batch

    monkeypatch.setattr(deadletters, "BATCH_ROWS", 256)
    monkeypatch.setattr(pq, "read_table", lambda *a, **k: pytest.fail("a whole file was read"))
    monkeypatch.setattr(pq, "ParquetFile", Recording)
    monkeypatch.setattr(storage, "read_bytes", read_bytes)
    rows = list(deadletters.iter_dead_letters(RunStore(layout)))
    assert [r["source_row"] for r in rows] == list(range(5000))
    assert max(sizes) <= 256 and sum(sizes) == 5000


def test_a_recommitted_chunk_is_written_once_and_rows_outside_the_shard_pass(tmp_path: Path) -> None:
    layout = make_run(tmp_path / "out", rows=30, dead_rows=(3, 17))
    src = RunStore(layout).manifest.input.files[0].uri
    shard = layout.shard_dir("00000")
    # a retry committed rows 3 and 17 again, plus 25 (first met there), in another chunking
    storage.write_create_only(join_uri(shard, f"{DEAD_LETTER_PREFIX}00009-retry.parquet"),
                              _parquet(_dead_table([17, 3, 25, 25], src)))
    # rows that are no input rows of the shard: another file, a row past the shard's segment
    storage.write_create_only(join_uri(shard, f"{DEAD_LETTER_PREFIX}00010-odd.parquet"),
                              _parquet(pa.concat_tables([_dead_table([3], "/elsewhere.parquet"),
                                                         _dead_table([99, 99], src)])))
    rows = [(r["source_uri"], r["source_row"]) for r in deadletters.iter_dead_letters(RunStore(layout))]
    assert rows == [(src, 3), (src, 17), (src, 25), ("/elsewhere.parquet", 3), (src, 99), (src, 99)]


def _parquet(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()
