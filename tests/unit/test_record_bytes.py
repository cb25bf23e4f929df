"""The contract's JSON records share one writer/reader (:mod:`batch_contract.records`): their bytes are
those the per-class methods wrote before (golden files written by that code), and reading checks the
object, its schema version and its fields."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest
from batch_contract.canary import CanaryResult, TuningProfile
from batch_contract.carryover import CarryOverPlan, ShardIndexEntry
from batch_contract.jsonutil import json_type_name, pretty_json
from batch_contract.manifest import Manifest
from batch_contract.marker import AttemptRecord, ShardMarker, ShardProgress
from batch_contract.records import JsonRecord
from batch_contract.tokens import TokenCounts
from batch_contract.version import SCHEMA_VERSION
from hypothesis import given, settings
from hypothesis import strategies as st
from record_cases import BUILDERS, GOLDEN_DIR, cases

RECORDS = [AttemptRecord, ShardProgress, ShardMarker, ShardIndexEntry, CarryOverPlan, CanaryResult, TuningProfile,
           Manifest]
CASES = cases()


def _previous_bytes(record: JsonRecord) -> bytes:
    """What each class's own ``to_json_bytes`` wrote before the shared base: ``pretty_json(asdict)``,
    the manifest its ``to_dict()`` unsorted; without the ``preprocess`` figures of attempt records and
    markers when they are empty (documents runs only: text runs write what they wrote before), nor their
    ``steal`` figures (work stealing runs only), a marker's attempts included."""
    if isinstance(record, Manifest):
        return pretty_json(record.to_dict(), sort_keys=False)
    data = dataclasses.asdict(record)
    if isinstance(record, AttemptRecord | ShardMarker):
        for name in ("preprocess", "steal"):
            if not data[name]:
                del data[name]
    if isinstance(record, ShardMarker):
        data["attempts"] = [{k: v for k, v in a.items() if k not in ("preprocess", "steal") or v}
                            for a in data["attempts"]]
    return pretty_json(data)


def test_every_record_class_uses_the_base_and_has_a_golden_file() -> None:
    built = {type(r) for _, r in CASES}
    assert built == set(RECORDS)
    for cls in RECORDS:
        assert issubclass(cls, JsonRecord) and "to_json_bytes" not in vars(cls) and "from_json_bytes" not in vars(cls)
    assert sorted(p.name for p in GOLDEN_DIR.glob("*.json")) == sorted(name for name, _ in CASES)


@pytest.mark.parametrize(("file_name", "record"), CASES, ids=[n for n, _ in CASES])
def test_bytes_equal_the_golden_files_and_read_back(file_name: str, record: JsonRecord) -> None:
    raw = record.to_json_bytes()
    assert raw == (GOLDEN_DIR / file_name).read_bytes()
    assert type(record).from_json_bytes(raw) == record


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(sorted(BUILDERS)), seed=st.integers(0, 2**32))
def test_random_records_write_the_previous_bytes(name: str, seed: int) -> None:
    record = BUILDERS[name](random.Random(seed))
    raw = record.to_json_bytes()
    assert raw == _previous_bytes(record)
    assert type(record).from_json_bytes(raw) == record


@pytest.mark.parametrize("cls", [c for c in RECORDS if c is not Manifest])
def test_reading_refuses_a_non_object_naming_the_record(cls: type[JsonRecord]) -> None:
    with pytest.raises(ValueError, match=f"^{cls.RECORD_NAME}: expected a JSON object, got array$"):
        cls.from_json_bytes(b"[1, 2]")
    with pytest.raises(json.JSONDecodeError):  # a ValueError
        cls.from_json_bytes(b"{not json")


def test_reading_checks_schema_version_and_fields_naming_them() -> None:
    marker = json.loads(next(r for _, r in CASES if isinstance(r, ShardMarker)).to_json_bytes())
    with pytest.raises(ValueError, match="^shard marker: schema_version 99 "):
        ShardMarker.from_dict({**marker, "schema_version": 99})
    with pytest.raises(ValueError, match="^shard marker: schema_version -1 "):
        ShardMarker.from_dict({k: v for k, v in marker.items() if k != "schema_version"})
    with pytest.raises(ValueError, match=r"^shard marker: unknown field\(s\) \['zz_new'\]$"):
        ShardMarker.from_dict({**marker, "zz_new": 1})
    with pytest.raises(ValueError, match=r"^shard marker: missing field\(s\) \['fingerprint', 'rows_ok'\]$"):
        ShardMarker.from_dict({k: v for k, v in marker.items() if k not in ("fingerprint", "rows_ok")})
    profile = next(r for _, r in CASES if isinstance(r, TuningProfile))
    data = {k: v for k, v in json.loads(profile.to_json_bytes()).items() if k != "schema_version"}
    back = TuningProfile.from_dict({**data, "zz_new": 1})  # a newer writer's key; no version: current
    assert back == profile and back.schema_version == SCHEMA_VERSION


@given(st.lists(st.tuples(*[st.integers(0, 10**12)] * 5), max_size=4))
def test_token_counts_add_and_round_trip(rows: list[tuple[int, ...]]) -> None:
    counts = [TokenCounts(*r) for r in rows]
    total = sum(counts, TokenCounts())
    assert [getattr(total, f) for f in ("real", "padded", "prompt", "cached", "output")] == [
        sum(r[i] for r in rows) for i in range(5)]
    assert TokenCounts.from_dict(total.to_dict()) == total
    assert list(total.to_dict()) == ["tokens_real", "tokens_padded", "tokens_prompt", "tokens_cached", "tokens_output"]


def test_marker_tokens_are_its_token_fields() -> None:
    marker = next(r for _, r in CASES if isinstance(r, ShardMarker))
    assert marker.tokens.to_dict() == {k: getattr(marker, k) for k in marker.tokens.to_dict()}
    assert TokenCounts.from_dict({"tokens_real": 3}) == TokenCounts(real=3)


@pytest.mark.parametrize(("value", "name"), [
    (None, "null"), (True, "boolean"), (0, "integer"), (1.5, "number"), ("", "string"), ([], "array"),
    ((1,), "array"), ({}, "object"), (b"x", "bytes"), ({1}, "set"),
])
def test_json_type_name(value: object, name: str) -> None:
    assert json_type_name(value) == name
