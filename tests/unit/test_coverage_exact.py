"""The coverage check stays exact with the scale shortcut (issue #35: the grouped search for an id with
results in several shards is skipped when every result id is distinct): against a Python reference on
random runs with dropped rows, re-committed rows, an id moved into another shard and unexpected ids."""

from __future__ import annotations

import tempfile
from pathlib import Path
from types import SimpleNamespace

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from batch_contract.engine_config import WorkerSettings
from batch_contract.manifest import InputFile, InputSpec, Manifest, Segment, ShardSpec
from batch_inference.publish.coverage import check_coverage
from batch_inference.publish.errors import CoverageError, PublishError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FP = "fp"


@st.composite
def runs(draw: st.DrawFn) -> dict:
    n = draw(st.integers(2, 40))
    cuts = sorted({0, n, *draw(st.lists(st.integers(1, n - 1), max_size=4))})
    bounds = list(zip(cuts, cuts[1:], strict=False))
    rows = st.integers(0, n - 1)
    drop, dead = draw(st.sets(rows, max_size=4)), draw(st.sets(rows, max_size=3))
    moved = draw(st.one_of(st.none(), rows))  # a row's result also committed by another shard
    moved = None if moved in drop | dead or len(bounds) < 2 else moved
    return {"n": n, "bounds": bounds, "drop": drop, "dead": dead, "recommit": draw(st.sets(rows, max_size=3)),
            "moved": moved, "unexpected": draw(st.booleans())}


def _reference(run: dict) -> tuple[str, int, int]:
    """``("ok", published, missing)`` or the error class name the check must raise."""
    if run["moved"] is not None:  # checked first: the run directory does not match its manifest
        return "PublishError", 0, 0
    if run["unexpected"]:
        return "CoverageError", 0, 0
    covered = set(range(run["n"])) - run["drop"]
    return "ok", len(covered - run["dead"]), len(run["drop"])


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run=runs())
def test_coverage_counts_match_a_python_reference(run: dict) -> None:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        uri = str(tmp / "in.parquet")
        pq.write_table(pa.table({"id": [f"id{i}" for i in range(run["n"])], "text": ["t"] * run["n"]}), uri)
        spec = InputSpec(uri=uri, format="parquet", id_column="id", text_column="text",
                         files=[InputFile(uri=uri, rows=run["n"])])
        shards = [ShardSpec(f"{i:05d}", [Segment(0, lo, hi)]) for i, (lo, hi) in enumerate(run["bounds"])]
        parts, dead_files = [], []
        for k, (lo, hi) in enumerate(run["bounds"]):
            sdir = tmp / "shards" / f"{k:05d}"
            sdir.mkdir(parents=True)
            ids = [f"id{r}" for r in range(lo, hi) if r not in run["drop"] | run["dead"]]
            ids += [f"id{r}" for r in range(lo, hi) if r in run["recommit"] and r not in run["drop"] | run["dead"]]
            if k == len(run["bounds"]) - 1 and run["moved"] is not None:
                if run["moved"] not in range(lo, hi):
                    ids.append(f"id{run['moved']}")  # a result of another shard's row
                else:  # the moved row lies in the last shard: put it in the first one instead
                    first = tmp / "shards" / "00000" / "part-00001.parquet"
                    pq.write_table(pa.table({"id": [f"id{run['moved']}"], "fingerprint": [FP]}), first)
                    parts.append(str(first))
            if k == 0 and run["unexpected"]:
                ids.append("not-in-the-input")
            if ids:
                path = sdir / "part-00000.parquet"
                pq.write_table(pa.table({"id": pa.array(ids, pa.string()), "fingerprint": [FP] * len(ids)}), path)
                parts.append(str(path))
            dead = [r for r in range(lo, hi) if r in run["dead"] and r not in run["drop"]]
            if dead:
                path = sdir / "dead-letter-00000.parquet"
                pq.write_table(pa.table({
                    "id": [f"id{r}" for r in dead], "reason": ["empty_text"] * len(dead),
                    "detail": ["x"] * len(dead), "source_uri": [uri] * len(dead),
                    "source_row": pa.array(dead, pa.int64()), "fingerprint": [FP] * len(dead)}), path)
                dead_files.append(str(path))
        manifest = Manifest(run_id="r", input=spec, shards=shards, engine={"kind": "encoder"}, worker=WorkerSettings())
        inv = SimpleNamespace(manifest=manifest, fingerprint=FP, run_id="r", rows_input=run["n"])
        expected, published, missing = _reference(run)
        con = duckdb.connect()
        if expected != "ok" or published == 0:  # published 0: an all-dead run never swaps in an empty table
            with pytest.raises(PublishError, match="manifest|input row") as err:
                check_coverage(con, inv, sorted(parts), dead_files, min_success_ratio=1e-9)  # type: ignore[arg-type]
            if expected in ("CoverageError", "ok"):
                assert isinstance(err.value, CoverageError)
            else:
                assert not isinstance(err.value, CoverageError) and "several shards" in str(err.value)
            return
        cov = check_coverage(con, inv, sorted(parts), dead_files, min_success_ratio=1e-9)  # type: ignore[arg-type]
        assert (cov.rows_published, cov.rows_missing) == (published, missing)
        assert cov.rows_dead_letter == len(run["dead"] - run["drop"])
        recommitted = run["recommit"] - run["drop"] - run["dead"]
        assert cov.duplicates_removed == len(recommitted)


def test_the_coverage_check_raises_duckdbs_memory_limit_for_a_large_run_only() -> None:
    from batch_inference.publish.coverage import COVERAGE_MEMORY_CAP_MB, _raise_memory_limit

    con = duckdb.connect()
    con.execute("SET memory_limit = '1GB'")
    before = con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0]
    _raise_memory_limit(con, 1_000_000)
    assert con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0] == before
    _raise_memory_limit(con, 40_000_000)
    limit = con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0]
    assert limit == f"{COVERAGE_MEMORY_CAP_MB * 1e6 / 2**30:.1f} GiB"  # DuckDB's MB are 10^6 bytes
