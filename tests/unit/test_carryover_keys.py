"""Shard carry-over keys and decisions (``batch_contract.carryover``, ``batch_inference.carryover``).

The key must change with anything that changes a shard's rows or results (input bytes, segment, columns,
format, config fingerprint, model) and with nothing else; a source shard is carried only when its marker
and every committed file are intact.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from batch_contract import storage
from batch_contract.carryover import (
    CarryOverPlan,
    ShardIndexEntry,
    index_uri,
    model_identity,
    shard_input_key,
)
from batch_contract.manifest import InputFile, InputSpec, Segment
from batch_inference.carryover import carried_name
from hypothesis import given, settings
from hypothesis import strategies as st

FILES = [InputFile(uri="/data/a.parquet", rows=100), InputFile(uri="/data/b.parquet", rows=50)]
SPEC = InputSpec(uri="/data", format="parquet", id_column="id", text_column="text", files=FILES)
TAGS = {"/data/a.parquet": "size=1;sha256=aa", "/data/b.parquet": "size=2;sha256=bb"}
SEGMENTS = [Segment(0, 10, 100), Segment(1, 0, 20)]
BASE = {"spec": SPEC, "segments": SEGMENTS, "tags": TAGS, "config_fingerprint": "c" * 32,
        "model": model_identity(model_digest="d" * 64)}


def _key(**changes: object) -> str:
    args = {**BASE, **changes}
    return shard_input_key(args["spec"], args["segments"], args["tags"], args["config_fingerprint"], args["model"])


VARIANTS = {
    "file bytes": {"tags": {**TAGS, "/data/b.parquet": "size=2;sha256=bc"}},
    "segment rows": {"segments": [Segment(0, 10, 99), Segment(1, 0, 20)]},
    "segment file": {"segments": [Segment(1, 10, 100), Segment(1, 0, 20)]},
    "text column": {"spec": InputSpec(uri="/data", format="parquet", id_column="id", text_column="body", files=FILES)},
    "id column": {"spec": InputSpec(uri="/data", format="parquet", id_column="key", text_column="text", files=FILES)},
    "file uri": {"spec": InputSpec(uri="/data", format="parquet", id_column="id", text_column="text",
                                   files=[InputFile(uri="/other/a.parquet", rows=100), FILES[1]]),
                 "tags": {**TAGS, "/other/a.parquet": TAGS["/data/a.parquet"]}},
    "config": {"config_fingerprint": "e" * 32},
    "model files": {"model": model_identity(model_digest="f" * 64)},
    "model image": {"model": model_identity(image="repo@sha256:" + "0" * 64, model_path="/models/m")},
}


def test_key_is_stable_and_hex() -> None:
    key = _key()
    assert key == _key() and len(key) == 40 and all(c in "0123456789abcdef" for c in key)
    assert index_uri("/out", key) == f"/out/cache/shards/{key}.json"


@pytest.mark.parametrize("what", sorted(VARIANTS))
def test_key_changes_with_anything_that_changes_results(what: str) -> None:
    assert _key(**VARIANTS[what]) != _key()


def test_key_ignores_files_the_shard_does_not_read() -> None:
    only_a = [Segment(0, 0, 100)]
    assert _key(segments=only_a, tags={**TAGS, "/data/b.parquet": "changed"}) == _key(segments=only_a)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 40), st.integers(1, 40)), min_size=1, max_size=4),
       st.data())
def test_any_change_of_a_segment_changes_the_key(raw: list[tuple[int, int, int]], data: st.DataObject) -> None:
    segments = [Segment(f, s, s + n) for f, s, n in raw]
    i = data.draw(st.integers(0, len(segments) - 1))
    bump = data.draw(st.sampled_from(["start", "stop"]))
    seg = segments[i]
    changed = Segment(seg.file_index, seg.row_start + (bump == "start"), seg.row_stop + 1)
    other = segments[:i] + [changed] + segments[i + 1:]
    assert _key(segments=segments) != _key(segments=other)


def test_model_identity_needs_bytes_pinned() -> None:
    needs_pin = "^model identity needs a model digest or an image pinned by digest"
    with pytest.raises(ValueError, match=needs_pin):
        model_identity(image="repo:latest", model_path="/m")
    with pytest.raises(ValueError, match=needs_pin):
        model_identity()


def test_index_uri_refuses_non_keys() -> None:
    for bad in ("../../etc/passwd", "A" * 40, "a" * 39):
        with pytest.raises(ValueError, match=f"^shard input key {re.escape(repr(bad))} is not 40 lowercase hex"):
            index_uri("/out", bad)


def test_records_round_trip() -> None:
    plan = CarryOverPlan(keys={"00000": "a" * 40}, carried={"00000": {"source_run_dir": "/r", "source_shard_id": "00001",
                                                                       "fingerprint": "f", "seconds": 1.5}},
                         pinned={"fingerprint": "f", "resolved": {"dtype": "bfloat16"}})
    assert CarryOverPlan.from_json_bytes(plan.to_json_bytes()) == plan
    entry = ShardIndexEntry(run_dir="/r", shard_id="00001", fingerprint="f", resolved={"dtype": "float32"},
                            rows_input=9, seconds=2.0)
    assert ShardIndexEntry.from_json_bytes(entry.to_json_bytes()) == entry


@pytest.mark.parametrize(("name", "expected"), [
    ("part-00003-1a2b3c4d5e6f.parquet", "part-00003-reuse-1a2b3c4d5e6f.parquet"),
    ("part-00003-reuse-1a2b3c4d5e6f.parquet", "part-00003-reuse-1a2b3c4d5e6f.parquet"),
    ("dead-letter-00004-1a2b3c4d5e6f.parquet", "dead-letter-00004-1a2b3c4d5e6f.parquet"),
])
def test_carried_names(name: str, expected: str) -> None:
    from batch_contract.layout import chunk_of, is_reused_part

    assert carried_name(name) == expected
    assert chunk_of(carried_name(name)) == chunk_of(name)
    assert is_reused_part(carried_name(name)) == name.startswith("part-")


def test_local_content_tag_sees_a_same_size_rewrite(tmp_path: Path) -> None:
    path = tmp_path / "in.parquet"
    path.write_bytes(b"abcd")
    before = storage.content_tag(str(path))
    stat = path.stat()
    path.write_bytes(b"abce")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # even with the old mtime restored
    assert storage.content_tag(str(path)) != before
    path.write_bytes(b"abcd")
    assert storage.content_tag(str(path)) == before


def test_local_copy_is_create_only(tmp_path: Path) -> None:
    src, dst = tmp_path / "a", tmp_path / "sub" / "b"
    src.write_bytes(b"xyz")
    storage.copy(str(src), str(dst))
    storage.copy(str(src), str(dst))  # same content: no-op
    assert dst.read_bytes() == b"xyz"
    other = tmp_path / "c"
    other.write_bytes(b"different")
    with pytest.raises(storage.AlreadyExistsError, match=f"^{re.escape(str(dst))} already exists with other content"):
        storage.copy(str(other), str(dst))
