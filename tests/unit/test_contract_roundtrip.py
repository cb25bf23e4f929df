"""Round trips of the data contract: manifest, marker, attempt, progress, schemas, layout, storage."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from batch_contract import storage
from batch_contract.engine_config import ConfigError, EncoderConfig, WorkerSettings
from batch_contract.engines import engine_config_from_dict
from batch_contract.enums import DeadLetterReason, ExitCode, ShardStatus
from batch_contract.hostinfo import host_facts, host_key
from batch_contract.layout import TEMP_MARK, RunLayout, chunk_of, part_name, shard_id_for, validate_run_id
from batch_contract.manifest import (
    InputFile,
    InputSpec,
    Manifest,
    Segment,
    ShardSpec,
    config_fingerprint,
    result_fingerprint,
)
from batch_contract.marker import STAGES, AttemptRecord, ShardMarker, ShardProgress
from batch_contract.schemas import DEAD_LETTER_SCHEMA, parquet_write_options, part_schema
from batch_contract.version import SCHEMA_VERSION
from hypothesis import given, settings
from hypothesis import strategies as st


def _manifest(**engine) -> Manifest:
    return _manifest_with_engine({"kind": "encoder", **engine})


def _manifest_with_engine(engine: dict) -> Manifest:
    return Manifest(
        run_id="manual__2026-11-30T02:43:00+00:00",
        input=InputSpec(
            uri="/data/x.parquet", format="parquet", id_column="id", text_column="text",
            files=[InputFile(uri="/data/x.parquet", rows=10, row_group_rows=[6, 4], size_bytes=123)],
        ),
        shards=[ShardSpec("00000", [Segment(0, 0, 6)], est_tokens=500), ShardSpec("00001", [Segment(0, 6, 10)])],
        engine=engine,
        worker=WorkerSettings(chunk_rows=3),
        params={"table": "t"},
    )


def test_manifest_round_trip_keeps_every_field() -> None:
    m = _manifest(pooling="cls")
    back = Manifest.from_json_bytes(m.to_json_bytes())
    assert back == m
    assert back.rows == 10 and back.shard("00001").rows == 4
    assert back.config_fingerprint == config_fingerprint(m.engine)
    with pytest.raises(KeyError, match="00007"):
        back.shard("00007")


def test_fingerprint_changes_with_engine_config_and_model_digest() -> None:
    a, b = _manifest(pooling="mean"), _manifest(pooling="cls")
    assert a.config_fingerprint != b.config_fingerprint
    assert result_fingerprint(a.config_fingerprint, "d1") != result_fingerprint(a.config_fingerprint, "d2")
    assert result_fingerprint(a.config_fingerprint, "d1") == result_fingerprint(a.config_fingerprint, "d1")


@settings(max_examples=50, deadline=None)
@given(names=st.lists(st.text("abcdefgh_", min_size=1, max_size=6), min_size=2, max_size=5, unique=True))
def test_a_json_schema_keeps_its_property_order_in_the_manifest_and_the_fingerprint(names: list[str]) -> None:
    """Structured output generates keys in the schema's order: the manifest must not reorder them, and two
    orders of the same properties must not share a fingerprint (cached rows of one are not the other's)."""
    def engine(order: list[str]) -> dict:
        return {"kind": "llm", "model_path": "/m", "user_template": "{{ text }}", "max_tokens": 32,
                "json_schema": {"type": "object", "properties": {n: {"type": "string"} for n in order},
                                "required": order}}

    rev = list(reversed(names))
    back = Manifest.from_json_bytes(_manifest_with_engine(engine(rev)).to_json_bytes())
    assert list(back.engine["json_schema"]["properties"]) == rev
    assert config_fingerprint(engine(names)) != config_fingerprint(engine(rev))
    assert config_fingerprint(engine(names)) == config_fingerprint(engine(list(names)))
    as_text = {**engine(rev), "json_schema": json.dumps(engine(rev)["json_schema"])}  # JSONB-proof form
    config = engine_config_from_dict(as_text)
    assert list(config.json_schema["properties"]) == rev
    assert config_fingerprint(as_text) == config_fingerprint(engine(rev))


def test_manifest_rejects_bad_engine_config_naming_the_field() -> None:
    with pytest.raises(ConfigError, match="engine.pooling"):
        _manifest(pooling="max")
    with pytest.raises(ConfigError, match=re.escape("engine: unknown field(s) ['poolin']")):
        engine_config_from_dict({"kind": "encoder", "poolin": "mean"})
    assert isinstance(engine_config_from_dict({"kind": "encoder"}), EncoderConfig)


def test_manifest_refuses_unreadable_schema_version() -> None:
    data = _manifest().to_dict()
    data["schema_version"] = SCHEMA_VERSION + 5
    with pytest.raises(ValueError, match="schema_version"):
        Manifest.from_dict(data)


def test_marker_attempt_progress_round_trip() -> None:
    attempt = AttemptRecord(attempt_id="a1", shard_id="00000", started_at="t0", exit_code=75,
                            status=ShardStatus.INTERRUPTED.value, rows_committed=3, rows_processed=5,
                            stage_seconds=dict.fromkeys(STAGES, 1.5), tokens_real=10, tokens_padded=16,
                            fingerprint="fp")
    assert AttemptRecord.from_json_bytes(attempt.to_json_bytes()) == attempt
    marker = ShardMarker(run_id="r", shard_id="00000", fingerprint="fp", rows_input=6, rows_ok=5,
                         rows_dead_letter=1, dead_letter_reasons={DeadLetterReason.NULL_TEXT.value: 1},
                         tokens_real=90, tokens_padded=100, attempts=[attempt.to_dict()], parts=["part-00000-x.parquet"])
    back = ShardMarker.from_json_bytes(marker.to_json_bytes())
    assert back == marker and back.padding_efficiency == pytest.approx(0.9)
    progress = ShardProgress(shard_id="00000", status="running", rows_total=6, rows_done=3, rows_dead_letter=0,
                             rows_per_s=1.5, eta_s=2.0, updated_at="t")
    assert ShardProgress.from_json_bytes(progress.to_json_bytes()) == progress


def test_marker_host_facts_round_trip_and_old_markers_still_read() -> None:
    facts = host_facts()
    attempt = AttemptRecord(attempt_id="a1", shard_id="00000", started_at="t0", host_facts=facts)
    assert AttemptRecord.from_json_bytes(attempt.to_json_bytes()).host_facts == facts
    marker = ShardMarker(run_id="r", shard_id="00000", fingerprint="fp", rows_input=1, rows_ok=1,
                         rows_dead_letter=0, host_facts=facts)
    back = ShardMarker.from_json_bytes(marker.to_json_bytes())
    assert back.host_facts == facts and host_key(back.host_facts) == host_key(facts) != ()
    data = json.loads(marker.to_json_bytes())
    del data["host_facts"]  # a marker written before the field
    old = ShardMarker.from_json_bytes(json.dumps(data).encode())
    assert old.host_facts == {} and host_key(old.host_facts) == ()


def test_attempt_record_from_before_the_added_fields_still_reads() -> None:
    old = b'{"attempt_id": "a", "shard_id": "00000", "started_at": "t", "schema_version": 1}'
    rec = AttemptRecord.from_json_bytes(old)
    assert rec.tokens_padded == 0 and rec.fingerprint == "" and rec.status == "running" and rec.threads == 0


def test_part_and_dead_letter_schemas_survive_parquet() -> None:
    schema = part_schema("embedding", 4)
    table = pa.table(
        {"id": ["a"], "fingerprint": ["fp"], "n_tokens": pa.array([3], pa.int32()), "truncated": [False],
         "text_repaired": [True], "embedding": pa.array([[0.1, 0.2, 0.3, 0.4]], schema.field("embedding").type)},
        schema=schema,
    )
    buf = io.BytesIO()
    pq.write_table(table, buf)
    assert pq.read_table(io.BytesIO(buf.getvalue())).schema.equals(schema)
    assert part_schema("classification").names[-2:] == ["label", "score"]
    assert "reason" in DEAD_LETTER_SCHEMA.names
    with pytest.raises(ValueError, match=re.escape("part_schema('embedding') needs embedding_dim")):
        part_schema("embedding")
    with pytest.raises(ValueError, match="^unknown task 'regression': expected embedding"):
        part_schema("regression")


def test_part_write_options_keep_floats_plain_and_ids_compressed() -> None:
    schema = part_schema("embedding", 16)
    n = 3000
    table = pa.table(
        {"id": [f"id-{i}" for i in range(n)], "fingerprint": ["fp"] * n, "n_tokens": pa.array([3] * n, pa.int32()),
         "truncated": [False] * n, "text_repaired": [False] * n,
         "embedding": pa.FixedSizeListArray.from_arrays(pa.array([i / 7 for i in range(16 * n)], pa.float32()), 16)},
        schema=schema,
    )
    buf = io.BytesIO()
    pq.write_table(table, buf, **parquet_write_options(schema))
    meta = pq.read_metadata(io.BytesIO(buf.getvalue()))
    columns = {meta.row_group(0).column(i).path_in_schema: meta.row_group(0).column(i) for i in range(6)}
    emb = columns["embedding.list.element"]
    assert emb.compression == "UNCOMPRESSED" and "RLE_DICTIONARY" not in emb.encodings
    assert columns["id"].compression == "ZSTD" and "RLE_DICTIONARY" in columns["fingerprint"].encodings
    assert pq.read_table(io.BytesIO(buf.getvalue())).equals(table)
    score = parquet_write_options(part_schema("classification"))
    assert score["compression"]["score"] == "none" and score["compression"]["label"] == "zstd"


def test_layout_uris_and_names() -> None:
    layout = RunLayout("gs://bucket/prefix/", "run1")
    assert layout.run_dir == "gs://bucket/prefix/runs/run1"
    assert RunLayout.from_run_dir(layout.run_dir) == RunLayout("gs://bucket/prefix", "run1")
    assert layout.marker_uri("00003").endswith("/runs/run1/shards/00003/_SUCCESS.json")
    assert shard_id_for(7) == "00007"
    name = part_name("part-", 12)
    assert chunk_of(name) == 12 and chunk_of(f"{TEMP_MARK}{name}") is None and chunk_of("_SUCCESS.json") is None
    assert part_name("part-", 12) != name
    for bad in ("a/b", "..", "a b"):
        with pytest.raises(ValueError, match=f"^run_id {re.escape(repr(bad))} is not a safe path segment"):
            validate_run_id(bad)
    with pytest.raises(ValueError, match="^shard id '7' is not five digits"):
        layout.shard_dir("7")


def test_storage_create_only_semantics(tmp_path: Path) -> None:
    uri = str(tmp_path / "s" / "part-00000-a.parquet")
    storage.write_create_only(uri, b"x")
    storage.write_create_only(uri, b"x")  # same content: a retried commit is a no-op
    with pytest.raises(storage.AlreadyExistsError, match=f"^{re.escape(uri)} already exists with other content"):
        storage.write_create_only(uri, b"y")
    storage.write_replace(str(tmp_path / "s" / "_PROGRESS.json"), b"1")
    storage.write_replace(str(tmp_path / "s" / "_PROGRESS.json"), b"2")
    assert storage.read_bytes(str(tmp_path / "s" / "_PROGRESS.json")) == b"2"
    (tmp_path / "s" / f"{TEMP_MARK}part-00001-b.parquet-1").write_bytes(b"partial")
    assert storage.list_names(str(tmp_path / "s")) == ["_PROGRESS.json", "part-00000-a.parquet"]
    assert storage.clean_temp(str(tmp_path / "s")) == 1


def test_exit_codes_are_the_documented_values() -> None:
    assert [int(c) for c in ExitCode] == [0, 1, 2, 75]


def test_token_budget_zero_means_the_device_default() -> None:
    from batch_contract.engine_config import AUTO_TOKEN_BUDGET

    auto = WorkerSettings()
    assert auto.token_budget == 0
    assert auto.token_budget_for("cpu") == AUTO_TOKEN_BUDGET["cpu"] == 8192
    assert auto.token_budget_for("cuda") == AUTO_TOKEN_BUDGET["cuda"]
    assert auto.token_budget_for("mps") == AUTO_TOKEN_BUDGET["cpu"]
    assert WorkerSettings(token_budget=2048).token_budget_for("cuda") == 2048
    with pytest.raises(ConfigError, match="worker.token_budget"):
        WorkerSettings(token_budget=32)
