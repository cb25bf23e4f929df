"""Token-balanced planning keeps split points stable per file (``planner.token_pieces``).

The class of defect: with ``shard_by: tokens`` the split points were chosen over the whole input, so an
edit in one file moved every shard's boundaries and no shard was carried over. Properties over generated
multi-file inputs (file sizes from a few rows to many shards, row groups of different lengths) and one
random edit (rows or lengths changed, a file added, a file removed): every row is planned exactly once;
shards stay within the documented token tolerance; and, while the run's token target is unchanged,
every shard that reads only files the edit cannot reach has the very same segments (file URI and row
range) in both plans. A file cut on its own (at least half the target) is never reached by another
file's edit; a small file is reached only through its pack run (``planner.starts_pack_run``). Then the
same through ``plan()`` on real Parquet files and the carry-over input keys (``carryover.shard_keys``).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from batch_inference.carryover import shard_keys
from batch_inference.planner import (
    ONE_SHARD_TOLERANCE,
    PlanRequest,
    _Block,
    _FileMeta,
    build_shards,
    plan,
    read_metadata,
    resolve_input_files,
    starts_pack_run,
    token_target,
)
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

SETTINGS = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])

blocks_st = st.lists(st.tuples(st.integers(1, 120), st.floats(1.0, 400.0, allow_nan=False)), min_size=1, max_size=4)


@st.composite
def inputs(draw: Any) -> tuple[list[str], list[list[tuple[int, float]]]]:
    """Sorted file names and each file's blocks ``(rows, estimated tokens per row)``."""
    n = draw(st.integers(1, 14))
    names = sorted(draw(st.lists(st.text("abcdefghij", min_size=1, max_size=6), min_size=n, max_size=n, unique=True)))
    return [f"gs://b/in/{name}.parquet" for name in names], [draw(blocks_st) for _ in names]


@st.composite
def edits(draw: Any, uris: list[str], files: list) -> tuple[str, list[str], list]:
    """One edit: a file's blocks changed, a file added (a new name in input order) or a file removed."""
    ops = ["edit", "add"] + (["remove"] if len(uris) > 1 else [])
    op = draw(st.sampled_from(ops))
    uris, files = list(uris), list(files)
    if op == "add":
        name = draw(st.text("abcdefghij", min_size=1, max_size=6).map(lambda s: f"gs://b/in/{s}~new.parquet"))
        uris.append(name)
        files.append(draw(blocks_st))
        order = sorted(range(len(uris)), key=lambda i: uris[i])
        return name, [uris[i] for i in order], [files[i] for i in order]
    i = draw(st.integers(0, len(uris) - 1))
    if op == "remove":
        return uris[i], uris[:i] + uris[i + 1:], files[:i] + files[i + 1:]
    files[i] = draw(blocks_st.filter(lambda b, old=files[i]: b != old))
    return uris[i], uris, files


def _metas(uris: list[str], files: list) -> list[_FileMeta]:
    return [_FileMeta(uri, sum(r for r, _ in blocks), [r for r, _ in blocks], None,
                      [_Block(r, w) for r, w in blocks]) for uri, blocks in zip(uris, files, strict=True)]


def _request(rows_per_shard: int, max_map_length: int = 100_000) -> PlanRequest:
    return PlanRequest(input_uri="gs://b/in", id_column="id", text_column="text", output_root="gs://b/out",
                       run_id="r", engine={"kind": "encoder"}, rows_per_shard=rows_per_shard,
                       shard_by="tokens", max_map_length=max_map_length)


def _plan(uris: list[str], files: list, rows_per_shard: int, max_map_length: int = 100_000):
    """``(shards as tuples of (uri, row_start, row_stop), est tokens per shard, target, file tokens)``."""
    metas = _metas(uris, files)
    shards = build_shards(metas, _request(rows_per_shard, max_map_length))
    named = [tuple((uris[g.file_index], g.row_start, g.row_stop) for g in s.segments) for s in shards]
    per_file = [[_Block(r, w) for r, w in blocks] for blocks in files]
    tokens = {uri: sum(r * w for r, w in blocks) for uri, blocks in zip(uris, files, strict=True)}
    return named, [s.est_tokens for s in shards], token_target(per_file, rows_per_shard), tokens


def _check_partition(named: list[tuple], uris: list[str], files: list) -> None:
    covered = [(uri, r) for shard in named for uri, lo, hi in shard for r in range(lo, hi)]
    everything = [(uri, r) for uri, blocks in zip(uris, files, strict=True) for r in range(sum(n for n, _ in blocks))]
    assert covered == everything, "every row in exactly one shard, in input order"
    assert all(shard and all(lo < hi for _, lo, hi in shard) for shard in named)


def _check_tolerance(named: list[tuple], est: list[int], target: float, files: list, uris: list[str]) -> None:
    """Documented bounds (planner.token_pieces): a piece of a file cut on its own is within 0.5..1.5 of
    the target (0.75..1.25 with two or more pieces), a pack of small files at most the target; each give
    or take one row's tokens (plus 1 for the integer rounding of ``est_tokens``)."""
    longest = {uri: max(w for _, w in blocks) for uri, blocks in zip(uris, files, strict=True)}
    if len(named) == 1:  # less than ONE_SHARD_TOLERANCE targets in all: the whole input is one shard
        assert est[0] < ONE_SHARD_TOLERANCE * target + max(longest.values()) + 1
        return
    pieces: dict[str, int] = {}
    for shard in named:
        if len(shard) == 1:
            pieces[shard[0][0]] = pieces.get(shard[0][0], 0) + 1
    for shard, tokens in zip(named, est, strict=True):
        slack = max(longest[uri] for uri, _, _ in shard) + 1
        uri = shard[0][0]
        whole = len(shard) == 1 and shard[0][1] == 0 and pieces[uri] == 1
        file_tokens = sum(r * w for r, w in files[uris.index(uri)])
        if len(shard) > 1 or (whole and file_tokens < target / 2):  # a pack of small files
            assert tokens <= target + slack
        elif pieces[uri] == 1:
            assert target / 2 - slack <= tokens <= 1.5 * target + slack
        else:
            assert 0.75 * target - slack <= tokens <= 1.25 * target + slack


def _runs(uris: list[str], tokens: dict[str, float], target: float) -> list[list[str]]:
    """The pack runs of the documented rule: small files (under half the target) between two run starts
    (a file that ``starts_pack_run``, or a file cut on its own)."""
    runs: list[list[str]] = []
    current: list[str] = []
    for uri in uris:
        if tokens[uri] >= target / 2:
            runs.append(current) if current else None
            current = []
        elif current and starts_pack_run(uri, tokens[uri], target):
            runs.append(current)
            current = [uri]
        else:
            current.append(uri)
    if current:
        runs.append(current)
    return runs


def _reach(edited: str, before: tuple, after: tuple) -> set[str]:
    """Files whose shards the edit may change: the edited file, and every small file that shares a pack
    run, in either plan, with the edited file or with its neighbours in input order."""
    reach = {edited}
    for uris, tokens, target in (before, after):
        order = sorted(set(uris) | {edited})
        i = order.index(edited)
        near = {u for u in order[max(0, i - 1):i + 2] if u in tokens}
        for run in _runs(uris, tokens, target):
            if near & set(run):
                reach |= set(run)
    return reach


@SETTINGS
@given(data=st.data(), case=inputs(), rows_per_shard=st.integers(1, 400))
def test_an_edit_in_one_file_leaves_every_shard_of_the_other_files_as_it_was(data, case, rows_per_shard) -> None:
    uris, files = case
    edited, new_uris, new_files = data.draw(edits(uris, files))
    old, old_est, old_target, old_tokens = _plan(uris, files, rows_per_shard)
    new, new_est, new_target, new_tokens = _plan(new_uris, new_files, rows_per_shard)
    _check_partition(old, uris, files)
    _check_partition(new, new_uris, new_files)
    _check_tolerance(old, old_est, old_target, files, uris)
    _check_tolerance(new, new_est, new_target, new_files, new_uris)
    if old_target != new_target:  # the whole input's mean length crossed a grid midpoint: all re-cut
        event("token target changed")
        return
    if len(old) == 1 or len(new) == 1:  # an input of one shard's worth is one shard: nothing to keep apart
        event("one shard")
        return
    event("token target kept")
    reach = _reach(edited, (uris, old_tokens, old_target), (new_uris, new_tokens, new_target))
    untouched_old = {s for s in old if not {u for u, _, _ in s} & reach}
    untouched_new = {s for s in new if not {u for u, _, _ in s} & reach}
    assert untouched_new == untouched_old, "a shard reading only files the edit cannot reach kept its segments"
    cut_alone = {u for u in uris if u != edited and old_tokens[u] >= old_target / 2}
    for uri in cut_alone:  # a file cut on its own is never reached by another file's edit
        assert [s for s in new if s[0][0] == uri] == [s for s in old if s[0][0] == uri]


@SETTINGS
@given(data=st.data(), n=st.integers(2, 10), rows_per_shard=st.integers(1, 60))
def test_when_every_file_is_cut_on_its_own_every_other_files_shards_stay(data, n, rows_per_shard) -> None:
    """The common case of a partitioned dataset (files of a shard or more each): strictly every shard
    that reads only other files keeps its segments, whatever the edit does to one file."""
    uris = [f"gs://b/in/part-{i:05d}.parquet" for i in range(n)]
    files = [data.draw(st.lists(st.tuples(st.integers(4 * rows_per_shard, 8 * rows_per_shard), st.just(50.0)),
                                min_size=1, max_size=2)) for _ in uris]
    edited = data.draw(st.sampled_from(uris))
    i = uris.index(edited)
    new_files = list(files)
    new_files[i] = data.draw(st.lists(st.tuples(st.integers(1, 8 * rows_per_shard), st.floats(1.0, 400.0)),
                                      min_size=1, max_size=3))
    old, _, old_target, _ = _plan(uris, files, rows_per_shard)
    new, _, new_target, _ = _plan(uris, new_files, rows_per_shard)
    if old_target != new_target:
        event("token target changed")
        return
    others = lambda shards: [s for s in shards if all(u != edited for u, _, _ in s)]  # noqa: E731
    assert others(new) == others(old)


def test_the_cap_doubles_the_target_until_the_plan_fits() -> None:
    uris = [f"gs://b/in/f{i}.parquet" for i in range(6)]
    files = [[(100, 10.0)] for _ in uris]
    named, _, target, _ = _plan(uris, files, 10)
    assert len(named) > 5
    capped, est, _, _ = _plan(uris, files, 10, max_map_length=5)
    assert 1 <= len(capped) <= 5
    _check_partition(capped, uris, files)
    assert max(est) >= 2 * target / 1.5  # shards grew instead of multiplying


# -- through plan() on real files, and the carry-over input keys ------------------------------------------


def _write(folder: Path, name: str, lengths: list[int], row_group: int = 50) -> None:
    pq.write_table(pa.table({"id": [f"{name}-{i}" for i in range(len(lengths))],
                             "text": ["w" * n for n in lengths]}), folder / f"{name}.parquet", row_group_size=row_group)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sizes=st.lists(st.integers(130, 400), min_size=3, max_size=6), data=st.data())
def test_an_edited_file_leaves_the_carry_over_keys_of_the_other_files_shards(sizes, data) -> None:
    """Files of two target shards or more (each cut on its own), one rewritten with other rows, lengths
    and row groups: the carry-over input key of every shard that reads only other files is unchanged."""
    work = Path(tempfile.mkdtemp(prefix="planstab-"))
    try:
        folder = work / "in"
        folder.mkdir()
        names = [f"part-{i}" for i in range(len(sizes))]
        for k, (name, n) in enumerate(zip(names, sizes, strict=True)):
            _write(folder, name, [40 + (k * 37 + i * 11) % 200 for i in range(n)])

        def planned(run_id: str):
            manifest, _ = plan(PlanRequest(input_uri=str(folder), id_column="id", text_column="text",
                                           output_root=str(work / "out"), run_id=run_id, engine={"kind": "encoder"},
                                           rows_per_shard=60, shard_by="tokens"))
            fmt, uris = resolve_input_files(str(folder))
            target = token_target([m.blocks for m in read_metadata(fmt, uris, "id", "text")], 60)
            keys = shard_keys(manifest, "files:model")
            reads = {s.shard_id: {Path(manifest.input.files[g.file_index].uri).stem for g in s.segments}
                     for s in manifest.shards}
            return keys, reads, target

        keys1, reads1, target1 = planned("r1")
        edited = data.draw(st.sampled_from(names))
        n = data.draw(st.integers(20, 400))
        _write(folder, edited, [30 + (i * 7) % 150 for i in range(n)], row_group=data.draw(st.integers(10, 80)))
        keys2, reads2, target2 = planned("r2")
        if target1 != target2:
            event("token target changed")
            return
        others1 = {keys1[s] for s, files in reads1.items() if edited not in files}
        others2 = {keys2[s] for s, files in reads2.items() if edited not in files}
        assert others1 and others2 == others1, "every shard reading only unedited files keeps its carry-over key"
    finally:
        shutil.rmtree(work, ignore_errors=True)
