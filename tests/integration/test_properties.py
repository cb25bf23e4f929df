"""Property tests of the whole path: generated inputs through the real planner, the real worker
(in-process, real MiniLM) and the real DuckDB publish, checked against the spec.

For each generated input (see ``tests/property_lib.py``) the test plans and runs it three times: one shard
(``rows_per_shard = rows``), a random ``rows_per_shard``, and the same split with the worker killed at
random commits and resumed. Invariants:

1. no crash: the planner accepts the input or raises the ``PlanError`` the oracle expects for an input
   invalid as a whole; every shard completes (exit 0, after kills); publish succeeds, or refuses with a
   ``CoverageError`` exactly when every row is a dead letter;
2. every input row exactly once: published results + published dead letters == input rows, each
   result id once, dead letters keyed by ``(source_uri, source_row)`` of input rows;
3. sharding invariance: the published tables (ids, flags, vectors within cosine 0.999; dead letters'
   id, reason, source, then detail) are the same for one shard and for the random split;
4. kill invariance: killing and resuming gives the same published tables as the uninterrupted split;
5. the spec's outcome per row (``property_lib.expected_outcome``): the first *valid* occurrence of an
   id wins, later valid occurrences are ``duplicate_id``, rows invalid on their own keep their reason;
   repaired text (lone surrogates, invalid UTF-8) is published ``text_repaired``; an id with a lone
   surrogate or invalid UTF-8 is an ``invalid_id`` dead letter with a null id.

Examples are few by default (reproducible: ``derandomize``); ``HYPOTHESIS_PROFILE=chaos`` (``make
chaos``) runs many more with random seeds.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from batch_inference.planner import PlanError
from hypothesis import HealthCheck, Phase, given, settings
from property_lib import (
    ANY_ID,
    Dataset,
    Expected,
    Published,
    Workdir,
    datasets,
    dead_keys,
    expected_outcome,
    expected_plan_error,
    flags,
    min_cosine,
    plan_run,
    run_whole_path,
    write_dataset,
)

pytestmark = pytest.mark.integration

COSINE = 0.999

os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' per-load "Loading weights" bar

_phases = ([Phase.explicit, Phase.reuse, Phase.generate] if os.environ.get("PROPS_NO_SHRINK")
           else list(Phase))
"""``PROPS_NO_SHRINK=1``: report failures unshrunk (shrinking runs the whole path hundreds of times)."""
_common = dict(deadline=None, phases=_phases, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                      HealthCheck.function_scoped_fixture])
settings.register_profile("props", max_examples=int(os.environ.get("PROPS_EXAMPLES", "8")), derandomize=True,
                          print_blob=True, **_common)
settings.register_profile("chaos", max_examples=int(os.environ.get("PROPS_EXAMPLES", "200")), derandomize=False,
                          print_blob=True, **_common)
PROFILE = settings.get_profile("chaos" if os.environ.get("HYPOTHESIS_PROFILE") == "chaos" else "props")
"""This file's settings (not loaded globally, so other hypothesis tests keep theirs)."""


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("props")


# ------------------------------------------------------------------------------------------ checks


def check_complete(ds: Dataset, exp: dict[tuple[str, int], Expected], p: Published, what: str) -> None:
    """Invariants 1 and 2 for one run."""
    for shard, codes in p.exit_codes.items():
        assert codes[-1] == 0, f"{what}: shard {shard} attempts {codes}"
    assert p.result_rows == len(p.results), f"{what}: a result id published twice"
    assert p.dead_rows == len(p.dead), f"{what}: a dead letter published twice for one input row"
    assert not set(p.dead) - set(exp), f"{what}: dead letters at non-input positions {set(p.dead) - set(exp)}"
    assert len(p.results) + len(p.dead) == ds.rows, (
        f"{what}: {len(p.results)} results + {len(p.dead)} dead letters != {ds.rows} input rows")
    any_valid = any(e.reason is None for e in exp.values())
    if any_valid:
        assert p.refused is None, f"{what}: publish refused: {p.refused}"
        s = p.summary
        assert (s["rows_input"], s["rows_published"] + s["rows_dead_letter"], s["rows_missing"]) == (ds.rows, ds.rows, 0)
    else:
        assert p.refused is not None, f"{what}: every row is a dead letter but publish swapped in an empty table"
    for vec, _t, _r in p.results.values():
        assert vec.shape == (384,), f"{what}: embedding of shape {vec.shape}"


def check_same(a: Published, b: Published, what: str) -> None:
    """Invariants 3/4: the published tables of two runs of one input are the same."""
    assert sorted(a.results) == sorted(b.results), f"{what}: result ids differ: only in first " \
        f"{sorted(set(a.results) - set(b.results))!r}, only in second {sorted(set(b.results) - set(a.results))!r}"
    assert flags(a) == flags(b), f"{what}: flags differ"
    cos = min_cosine(a.results, b.results)
    assert cos >= COSINE, f"{what}: min cosine {cos:.6f} < {COSINE}"
    da, db = dead_keys(a), dead_keys(b)
    diff = {k: (da.get(k), db.get(k)) for k in set(da) | set(db) if da.get(k) != db.get(k)}
    assert not diff, f"{what}: dead letters (id, reason) differ by position: {diff}"
    details = {k: (a.dead[k][2], b.dead[k][2]) for k in a.dead if a.dead[k][2] != b.dead[k][2]}
    assert not details, f"{what}: dead-letter details differ: {details}"


def check_spec(exp: dict[tuple[str, int], Expected], p: Published, what: str) -> None:
    """Invariant 5: each row's outcome is the spec's."""
    want_results = {e.id: (e.truncated, e.text_repaired) for e in exp.values() if e.reason is None}
    wrong = {}
    for pos, e in exp.items():
        got = p.dead.get(pos)
        if e.reason is None:
            if got is not None or e.id not in p.results:
                wrong[pos] = ("want result", e.id, "got", got or ("result" if e.id in p.results else "nothing"))
        elif got is None or got[1] != e.reason.value or (e.id != ANY_ID and got[0] != e.id):
            wrong[pos] = ("want", e.reason.value, e.id, "got", got[:2] if got else "no dead letter")
    assert not wrong, f"{what}: outcomes differ from the spec: {wrong}"
    assert sorted(p.results) == sorted(want_results), f"{what}: result ids {sorted(p.results)!r} != {sorted(want_results)!r}"
    got_trunc = {k: v[0] for k, v in flags(p).items()}
    assert got_trunc == {k: v[0] for k, v in want_results.items()}, f"{what}: truncated flags differ"
    got_rep = {k: v[1] for k, v in flags(p).items()}
    assert got_rep == {k: v[1] for k, v in want_results.items()}, f"{what}: text_repaired flags differ"
    for pos, (_id, _reason, detail) in p.dead.items():
        assert detail, f"{what}: dead letter at {pos} has no detail"


def whole_path(ds: Dataset, base: Path) -> None:
    with Workdir(base) as work:
        input_uri, uris = write_dataset(ds, work)
        plan_error = expected_plan_error(ds)
        if plan_error is not None:
            with pytest.raises(PlanError, match=plan_error):
                plan_run(input_uri, work / "out", "rejected", ds, ds.rows)
            return
        exp = expected_outcome(ds, uris)
        # kill invariance first (same sharding), so a sharding or spec defect does not mask a resume defect
        split = run_whole_path(ds, input_uri, work, "split", rows_per_shard=ds.rows_per_shard)
        check_complete(ds, exp, split, f"rows_per_shard={ds.rows_per_shard}")
        if ds.kills:
            killed = run_whole_path(ds, input_uri, work, "killed", rows_per_shard=ds.rows_per_shard, kills=ds.kills)
            check_complete(ds, exp, killed, f"killed at {ds.kills}")
            check_same(split, killed, f"uninterrupted vs killed at commits {ds.kills} (attempts {killed.exit_codes})")
        one = run_whole_path(ds, input_uri, work, "one", rows_per_shard=ds.rows)
        assert one.n_shards == 1
        check_complete(ds, exp, one, "one shard")
        check_same(one, split, f"one shard vs rows_per_shard={ds.rows_per_shard} ({split.n_shards} shards)")
        check_spec(exp, one, "one shard")
        check_spec(exp, split, f"rows_per_shard={ds.rows_per_shard}")


# ------------------------------------------------------------------------------------------ tests


@settings(PROFILE)
@given(ds=datasets(broken=False))
def test_whole_path_properties(ds: Dataset, base: Path) -> None:
    """Parquet or JSONL with odd but valid Unicode, null/blank/duplicate ids, null/empty/long texts."""
    whole_path(ds, base)


@settings(PROFILE)
@given(ds=datasets(broken=True))
def test_whole_path_properties_broken_unicode(ds: Dataset, base: Path) -> None:
    """Adds lone surrogate escapes and invalid UTF-8 (in id, text and the unused column), Parquet binary
    text with invalid UTF-8, and (after the planner's 200 sampled lines) unparsable lines and values of
    other JSON types."""
    whole_path(ds, base)
