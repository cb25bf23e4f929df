"""Planner: metadata-only planning, schema errors naming the column, the max_map_length cap, reuse."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from batch_contract import storage
from batch_contract.engine_config import ConfigError
from batch_contract.layout import RunLayout
from batch_contract.manifest import Manifest
from batch_inference.planner import (
    PlanError,
    PlanRequest,
    plan,
    resolve_input_files,
    shard_count,
    split_boundaries,
)

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample" / "debian_descriptions_sample.parquet"


def _request(input_uri: str, out: Path, run_id: str = "run1", **kw) -> PlanRequest:
    base = dict(input_uri=input_uri, id_column="id", text_column="text", output_root=str(out),
                run_id=run_id, engine={"kind": "encoder"})
    base.update(kw)
    return PlanRequest(**base)


def _covered(manifest: Manifest) -> list[tuple[int, int]]:
    """(file_index, row) pairs covered by the plan, in plan order."""
    return [(seg.file_index, r) for s in manifest.shards for seg in s.segments
            for r in range(seg.row_start, seg.row_stop)]


def test_sample_plan_covers_every_row_once(tmp_path: Path) -> None:
    manifest, refs = plan(_request(str(SAMPLE), tmp_path, rows_per_shard=1000, shard_by="rows"))
    assert len(refs) == 6 and [r["rows"] for r in refs] == [1000] * 6
    covered = _covered(manifest)
    assert covered == [(0, r) for r in range(6000)]
    assert refs[0] == {"run_dir": str(tmp_path / "runs" / "run1"), "shard_id": "00000", "rows": 1000,
                       "est_tokens": manifest.shards[0].est_tokens}
    on_disk = Manifest.from_json_bytes(storage.read_bytes(RunLayout(str(tmp_path), "run1").manifest_uri))
    assert on_disk.rows == 6000 and on_disk.input.files[0].row_group_rows == [1000] * 6


def test_token_balanced_plan_covers_all_rows(tmp_path: Path) -> None:
    manifest, refs = plan(_request(str(SAMPLE), tmp_path, rows_per_shard=1000, shard_by="tokens"))
    # rows of the mean estimated length per shard, that length on the 2 ** (k / 2) grid: within 2 ** (1/4)
    assert sum(r["rows"] for r in refs) == 6000 and 6 / 2 ** 0.25 <= len(refs) <= 6 * 2 ** 0.25 + 0.5
    tokens = [s.est_tokens for s in manifest.shards]
    assert max(tokens) <= 1.1 * min(tokens)
    assert _covered(manifest) == [(0, r) for r in range(6000)]


def test_1500_shards_are_planned_as_at_most_1024(tmp_path: Path) -> None:
    manifest, refs = plan(_request(str(SAMPLE), tmp_path, rows_per_shard=4, shard_by="rows"))
    assert shard_count(6000, 4, 1024) == 1024
    assert len(refs) == 1024 and len(manifest.shards) == 1024
    assert sum(s.rows for s in manifest.shards) == 6000
    assert min(s.rows for s in manifest.shards) >= 5  # shards grew instead of multiplying
    # small XCom, whatever the temp dir's path length (pytest-xdist's workers add to it): measured with the
    # run dir a typical gs:// production run has
    assert len(json.dumps([{**r, "run_dir": "gs://bucket/batch/runs/manual__2026-12-02T02:00:00+00:00"}
                           for r in refs])) < 150_000


def test_split_boundaries_keep_every_shard_non_empty() -> None:
    from batch_inference.planner import _Block

    blocks = [_Block(rows=3, tokens_per_row=1000.0), _Block(rows=97, tokens_per_row=1.0)]
    bounds = split_boundaries(blocks, 10, by_tokens=True)
    assert bounds[0] == 0 and bounds[-1] == 100
    assert all(b2 > b1 for b1, b2 in zip(bounds, bounds[1:], strict=False))


def test_row_limit_and_multi_file_directory(tmp_path: Path) -> None:
    data = tmp_path / "in"
    data.mkdir()
    for i in range(3):
        pq.write_table(pa.table({"id": [f"{i}-{j}" for j in range(50)], "text": ["hello"] * 50}),
                       data / f"part-{i}.parquet")
    manifest, refs = plan(_request(str(data), tmp_path / "out", rows_per_shard=40, row_limit=120,
                                   shard_by="rows"))
    assert manifest.rows == 120 and len(refs) == 3
    assert [f.uri for f in manifest.input.files] == [str(data / f"part-{i}.parquet") for i in range(3)]
    assert _covered(manifest) == [(0, r) for r in range(50)] + [(1, r) for r in range(50)] + \
        [(2, r) for r in range(20)]


def test_glob_and_jsonl_line_index(tmp_path: Path) -> None:
    for i in range(2):
        lines = [json.dumps({"id": i * 100 + j, "text": "t" * (j + 1)}) for j in range(25)]
        (tmp_path / f"d{i}.jsonl").write_text("\n".join(lines[:10]) + "\n\n" + "\n".join(lines[10:]) + "\n")
    (tmp_path / "ignored.txt").write_text("x")
    fmt, uris = resolve_input_files(str(tmp_path / "d*.jsonl"))
    assert fmt.value == "jsonl" and len(uris) == 2
    manifest, refs = plan(_request(str(tmp_path / "d*.jsonl"), tmp_path / "out", rows_per_shard=10))
    assert manifest.input.format == "jsonl" and [f.rows for f in manifest.input.files] == [25, 25]
    assert sum(r["rows"] for r in refs) == 50 and 5 <= len(refs) <= 6
    assert all(len(s.segments) == 1 for s in manifest.shards)  # token-balanced: each file cut on its own


def test_missing_column_is_named(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match=r"text_column: column 'body' is missing") as err:
        plan(_request(str(SAMPLE), tmp_path, text_column="body"))
    assert "its columns are: id, section, text" in str(err.value) and "--text-column" in str(err.value)


def test_missing_jsonl_column_lists_the_keys(tmp_path: Path) -> None:
    path = tmp_path / "f.jsonl"
    path.write_text('{"key": "a", "body": "x"}\n{"key": "b", "body": "y", "extra": 1}\n')
    with pytest.raises(PlanError, match=r"id_column: column 'id' is missing .*its columns are: key, body, extra"):
        plan(_request(str(path), tmp_path))


def test_unusable_type_is_named(tmp_path: Path) -> None:
    path = tmp_path / "f.parquet"
    pq.write_table(pa.table({"id": [1, 2], "text": [1.5, 2.5]}), path)
    with pytest.raises(PlanError, match=r"text_column: column 'text' has type double"):
        plan(_request(str(path), tmp_path / "out"))


def test_mixed_types_across_files_name_both_files(tmp_path: Path) -> None:
    pq.write_table(pa.table({"id": ["a"], "text": ["x"]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": [1], "text": ["x"]}), tmp_path / "b.parquet")
    with pytest.raises(PlanError, match=r"id_column: column 'id' is string in .*a.parquet but integer in .*b.parquet"):
        plan(_request(str(tmp_path), tmp_path / "out"))


def test_all_null_column_is_named(tmp_path: Path) -> None:
    pq.write_table(pa.table({"id": ["a", "b"], "text": pa.array([None, None], pa.null())}), tmp_path / "n.parquet")
    with pytest.raises(PlanError, match=r"text_column: column 'text' is all null"):
        plan(_request(str(tmp_path / "n.parquet"), tmp_path / "out"))


def test_empty_input_plans_zero_shards(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    manifest, refs = plan(_request(str(tmp_path / "empty"), tmp_path / "out"))
    assert refs == [] and manifest.shards == []
    pq.write_table(pa.table({"id": pa.array([], pa.string()), "text": pa.array([], pa.string())}),
                   tmp_path / "zero.parquet")
    manifest, refs = plan(_request(str(tmp_path / "zero.parquet"), tmp_path / "out", run_id="run2"))
    assert refs == [] and manifest.rows == 0


def test_missing_input_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match=r"input_uri: .* does not exist"):
        plan(_request(str(tmp_path / "nope.parquet"), tmp_path / "out"))


def test_rerun_reuses_the_manifest_and_refuses_a_changed_plan(tmp_path: Path) -> None:
    first, refs1 = plan(_request(str(SAMPLE), tmp_path, rows_per_shard=2000))
    second, refs2 = plan(_request(str(SAMPLE), tmp_path, rows_per_shard=500))  # same run id: reused
    assert refs1 == refs2 and first.created_at == second.created_at
    explicit = plan(_request(str(SAMPLE), tmp_path, engine={"kind": "encoder", "pooling": "auto"}))[0]
    assert explicit.created_at == first.created_at  # a default written out is the same config: reused
    with pytest.raises(PlanError, match="Use a new run id"):
        plan(_request(str(SAMPLE), tmp_path, engine={"kind": "encoder", "dtype": "float32"}))


def test_bad_settings_name_the_field() -> None:
    with pytest.raises(ValueError, match="rows_per_shard"):
        _request(str(SAMPLE), Path("/tmp"), rows_per_shard=0)
    with pytest.raises(ValueError, match="shard_by"):
        _request(str(SAMPLE), Path("/tmp"), shard_by="bytes")


def test_llm_user_template_is_checked_against_the_input_columns_at_plan_time(tmp_path: Path) -> None:
    llm = {"kind": "llm", "model_path": "/models/tiny", "max_tokens": 16}
    with pytest.raises(ConfigError, match=r"user_template: reads field\(s\) \['no_such_column'\]"):
        plan(_request(str(SAMPLE), tmp_path, run_id="bad", engine={**llm, "user_template": "{{ no_such_column }}"}))
    with pytest.raises(ConfigError, match="user_template: template syntax error"):
        plan(_request(str(SAMPLE), tmp_path, run_id="bad", engine={**llm, "user_template": "{{ text "}))
    assert not (tmp_path / "runs" / "bad").exists()
    manifest, _ = plan(_request(str(SAMPLE), tmp_path, engine={**llm, "user_template": "{{ id }}: {{ text }}"}))
    assert manifest.engine_config.user_template == "{{ id }}: {{ text }}"


def test_template_check_is_skipped_without_jinja2(monkeypatch: pytest.MonkeyPatch) -> None:
    from batch_contract.llm_config import LLMConfig, check_user_template

    monkeypatch.setitem(sys.modules, "jinja2", None)  # import jinja2 -> ImportError
    check_user_template(LLMConfig(model_path="/m", max_tokens=8, user_template="{{ nosuch }}"), ["id", "text"])


def test_a_plan_is_reused_only_by_its_own_dag_run_under_the_same_input_roots(tmp_path: Path) -> None:
    roots = [str(SAMPLE.parent)]
    first, _ = plan(_request(str(SAMPLE), tmp_path, dag_id="dag_a", params={"dag_id": "dag_a"}, input_roots=roots))
    again, _ = plan(_request(str(SAMPLE), tmp_path, dag_id="dag_a", params={"dag_id": "dag_a"}, input_roots=roots))
    assert again == first and first.input.roots == roots
    other, _ = plan(_request(str(SAMPLE), tmp_path, dag_id="dag_b", params={"dag_id": "dag_b"}, input_roots=roots))
    assert other.params["dag_id"] == "dag_b", "another DAG's run of the same id plans in its own directory"
    forged = RunLayout(str(tmp_path), "run1", "dag_c")
    storage.makedirs(forged.run_dir)
    storage.write_create_only(forged.manifest_uri, first.to_json_bytes())  # dag_a's plan copied into dag_c's
    with pytest.raises(PlanError, match=r"^run_id: .* belongs to another run \(DAG 'dag_a'"):
        plan(_request(str(SAMPLE), tmp_path, dag_id="dag_c", params={"dag_id": "dag_c"}, input_roots=roots))
    with pytest.raises(PlanError, match="planned under other input roots"):
        plan(_request(str(SAMPLE), tmp_path, dag_id="dag_a", params={"dag_id": "dag_a"},
                      input_roots=[str(tmp_path)]))
