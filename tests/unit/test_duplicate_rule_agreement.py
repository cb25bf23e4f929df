"""The duplicate-id rule exists twice: in Python, per shard (the worker's
:class:`batch_worker.validate.Validator`) and in SQL, across shards (publish's
:func:`batch_inference.publish.coverage.check_coverage` in DuckDB). Both apply
:mod:`batch_contract.rows`' rule; this test feeds both the same random JSONL input and checks that the
published outcome of the shards' committed files equals what the Python rule gives for the whole input
in one pass (so it also does not depend on where the shard boundaries fall)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from types import SimpleNamespace

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
from batch_contract.engine_config import WorkerSettings
from batch_contract.manifest import InputFile, InputSpec, Manifest, Segment, ShardSpec
from batch_inference.publish.coverage import check_coverage
from batch_worker.reader import iter_shard_blocks
from batch_worker.validate import DeadLetter, Validator
from batch_worker.writer import dead_letter_table
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FP = "fp"
_ID_TEXT = st.lists(st.sampled_from(["a", "A", "1", " ", "\t", "\u00a0", "\u00e9", "e\u0301", "\u2603", "\x00"]),
                   max_size=3).map("".join)
IDS = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([2**70, 1.0, 2.5, [1], {"a": 1}]),
    _ID_TEXT, st.sampled_from(["1", "-1", "01", " 1", "1 ", "", "\ud800", "a\udcff"]),
)
"""Ids as a JSONL line may hold them: null, booleans, integers (and their decimal strings), floats,
arrays, objects, strings with whitespace, unicode, NUL, lone surrogates; drawn from a small pool so
they repeat."""
TEXTS = st.one_of(st.just("t"), st.sampled_from([None, "", "  ", 5, "x\ud800"]))
LINES = st.one_of(
    st.builds(lambda i, t: json.dumps({"id": i, "text": t}), IDS, TEXTS),
    st.sampled_from(["not json", "[1, 2]", '{"text": "no id"}']),
)


def _input(tmp: Path, lines: list[str]) -> tuple[str, int]:
    path = tmp / "in.jsonl"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8", errors="surrogatepass")
    return str(path), len(lines)


def _python_rule(spec: InputSpec, segments: list[Segment]) -> tuple[list[str], list[DeadLetter]]:
    """Results (ids) and dead letters of one worker validator over the rows of ``segments``."""
    validator = Validator("id", text_column="text")
    ids: list[str] = []
    dead: list[DeadLetter] = []
    for block in iter_shard_blocks(spec, segments, batch_rows=7):
        out = validator.validate(block)
        ids.extend(out.rows.ids)
        dead.extend(out.dead)
    return ids, dead


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(LINES, min_size=1, max_size=14), cuts=st.lists(st.integers(0, 15), max_size=3))
def test_python_and_sql_duplicate_rules_agree(lines: list[str], cuts: list[int]) -> None:
    lines = [*lines, json.dumps({"id": "anchor", "text": "t"})]  # one result: publish refuses an all-dead run
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        uri, rows = _input(tmp, lines)
        spec = InputSpec(uri=uri, format="jsonl", id_column="id", text_column="text",
                         files=[InputFile(uri=uri, rows=rows)])
        bounds = sorted({0, rows, *(c for c in cuts if c < rows)})
        shards = [ShardSpec(f"{i:05d}", [Segment(0, lo, hi)]) for i, (lo, hi) in enumerate(zip(bounds, bounds[1:], strict=False))]
        manifest = Manifest(run_id="r", input=spec, shards=shards, engine={"kind": "encoder"}, worker=WorkerSettings())

        parts, dead_files = [], []
        for shard in shards:  # each shard's worker validates its own rows and commits results + dead letters
            sdir = tmp / "shards" / shard.shard_id
            sdir.mkdir(parents=True)
            ids, dead = _python_rule(spec, shard.segments)
            if ids:
                pq.write_table(pa.table({"id": pa.array(ids, pa.string()), "fingerprint": [FP] * len(ids)}),
                               sdir / "part-00000.parquet")
                parts.append(str(sdir / "part-00000.parquet"))
            if dead:
                pq.write_table(dead_letter_table(dead, FP), sdir / "dead-letter-00000.parquet")
                dead_files.append(str(sdir / "dead-letter-00000.parquet"))

        inv = SimpleNamespace(manifest=manifest, fingerprint=FP, run_id="r", rows_input=rows)
        con = duckdb.connect()
        cov = check_coverage(con, inv, parts, dead_files)  # type: ignore[arg-type]
        published = sorted(r[0] for r in con.execute(f"SELECT id FROM ({cov.results_sql()})", {"parts": parts}).fetchall())
        sql_dead = sorted(con.execute(f"SELECT source_row, reason, id, detail FROM ({cov.dead_letters_sql()})").fetchall(),
                          key=repr)
        con.close()

        want_ids, want_dead = _python_rule(spec, [Segment(0, 0, rows)])
        assert cov.rows_missing == 0
        assert published == sorted(want_ids)
        assert sql_dead == sorted(((x.source_row, x.reason.value, x.id, x.detail) for x in want_dead), key=repr)

