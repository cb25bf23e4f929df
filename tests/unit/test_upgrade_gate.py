"""The upgrade check (``batch_inference.upgrade_gate``) on synthetic runs published into real DuckDB and
Iceberg tables: the backends' ``read_rows``, the pass-and-say-why cases, label and LLM agreement, and a
refusal recorded as the projection's decision."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from batch_contract.canary import CanaryResult
from batch_contract.runstore import RunStore
from batch_inference import upgrade_gate
from batch_inference.params import RunConfig
from batch_inference.publish import publish_run
from batch_inference.publish.backend import backend_for, read_published
from publish_backends import BACKENDS, Published
from synthetic_runs import RunSpec, build_run, write_input

OLD_FP, NEW_FP = "a" * 32, "b" * 32


def _canary(run_dir: str, fingerprint: str) -> CanaryResult:
    """A canary record naming every shard of the run (its committed files stand for the canary's parts)."""
    store = RunStore.open(run_dir)
    return CanaryResult(run_id=store.run_id, fingerprint=fingerprint, engine_kind="encoder", model_digest="d",
                        device="cpu", device_name="cpu", threads=1, sample_rows=0, sample_text_bytes=0,
                        sample_tokens_real=0, sample_tokens_padded=0, model_load_seconds=0.0,
                        steady_rows_per_s=0.0, steady_tokens_per_s=0.0, worker_seconds_per_token=0.0,
                        padding_efficiency=None, strategy="fixed", chosen={"token_budget": 1, "max_batch_rows": 1},
                        shard_rows={s.shard_id: s.rows for s in store.manifest.shards})


def _setup(tmp_path: Path, task: str, backend: str = "duckdb", n: int = 60, **new_spec) -> tuple[str, Published]:
    """Publish an old run of ``task``, build a new run (the 'canary') of the same ids; returns its run dir."""
    inp = write_input(tmp_path / "in.parquet", [f"id{i:03d}" for i in range(n)])
    pub = Published(backend, tmp_path)
    old = build_run(tmp_path / "out", "old", inp, RunSpec(task=task, shards=2, chunk_rows=n, fingerprint=OLD_FP,
                                                          dim=16, unit_embeddings=True))
    publish_run(old.run_dir, pub.target("emb"))
    spec = RunSpec(task=task, shards=2, chunk_rows=n, fingerprint=NEW_FP, dim=16, unit_embeddings=True)
    new = build_run(tmp_path / "out", "new", inp, replace(spec, **new_spec))
    return new.run_dir, pub


def _cfg(**kw) -> RunConfig:
    return RunConfig(**{"upgrade_gate": "auto", **kw})


@pytest.mark.parametrize("backend", BACKENDS)
def test_read_rows_returns_the_asked_ids_and_the_columns_the_table_has(tmp_path: Path, backend: str) -> None:
    _, pub = _setup(tmp_path, "embedding", backend)
    with backend_for(pub.target("emb")) as b:
        rows = b.read_rows(["id001", "id040", "nope"], ["embedding", "label"])
        assert rows is not None and sorted(rows.column("id").to_pylist()) == ["id001", "id040"]
        assert rows.column_names == ["id", "embedding"]  # no label column in an embedding table
        assert len(rows.column("embedding")[0].as_py()) == 16
        assert b.read_rows([], ["embedding"]).num_rows == 0
    with backend_for(pub.target("other")) as b:
        assert b.read_rows(["id001"], ["embedding"]) is None


def test_no_previous_publish_passes_and_says_why_without_creating_the_database(tmp_path: Path) -> None:
    inp = write_input(tmp_path / "in.parquet", [f"id{i}" for i in range(30)])
    run = build_run(tmp_path / "out", "new", inp, RunSpec(shards=1, chunk_rows=30, fingerprint=NEW_FP))
    target = Published("duckdb", tmp_path).target("emb")
    section = upgrade_gate.compare_with_published(_cfg(), run.run_dir, _canary(run.run_dir, NEW_FP), target)
    assert section["decision"] == "passed" and not section["compared"]
    assert "no previous publish" in section["message"]
    assert not (tmp_path / "w.duckdb").exists()
    assert read_published(target, ["id1"], ["embedding"]) == (None, None)


def test_the_same_embeddings_pass_with_overlap_and_cosine_one(tmp_path: Path) -> None:
    run_dir, pub = _setup(tmp_path, "embedding")
    section = upgrade_gate.compare_with_published(_cfg(), run_dir, _canary(run_dir, NEW_FP), pub.target("emb"))
    assert section["decision"] == "passed" and section["compared"] and section["rows_compared"] == 60
    emb = section["embedding"]
    assert emb["neighbours"]["overlap"] == 1.0 and emb["cosine"]["p5"] == pytest.approx(1.0, abs=1e-6)
    assert section["previous"]["run_id"] == "old" and section["previous"]["fingerprint"] == OLD_FP
    assert section["message"].startswith("upgrade check passed: 60 canary rows")


def test_auto_skips_a_table_published_under_the_same_fingerprint_and_on_compares(tmp_path: Path) -> None:
    run_dir, pub = _setup(tmp_path, "embedding", fingerprint=OLD_FP)
    canary = _canary(run_dir, OLD_FP)
    auto = upgrade_gate.compare_with_published(_cfg(), run_dir, canary, pub.target("emb"))
    assert auto["decision"] == "passed" and not auto["compared"] and "same model" in auto["message"]
    on = upgrade_gate.compare_with_published(_cfg(upgrade_gate="on"), run_dir, canary, pub.target("emb"))
    assert on["compared"] and on["embedding"]["neighbours"]["overlap"] == 1.0


def test_unrelated_embeddings_are_refused_and_the_projection_says_so(tmp_path: Path) -> None:
    run_dir, pub = _setup(tmp_path, "embedding", n=120)
    for path in Path(run_dir).glob("shards/*/part-*.parquet"):  # the 'new model': vectors of other rows
        t = pq.read_table(path)
        emb = t.column("embedding")
        pq.write_table(t.set_column(t.schema.get_field_index("embedding"), "embedding",
                                    pa.concat_arrays([emb.combine_chunks()[7:], emb.combine_chunks()[:7]])), path)
    projection = {"decision": "go", "message": "GO: ..."}
    upgrade_gate.apply(projection, _cfg(upgrade_min_cosine=0.5), run_dir, _canary(run_dir, NEW_FP), pub.target("emb"))
    assert projection["decision"] == "refused_upgrade"
    msg = projection["message"]
    assert msg.startswith("REFUSED (upgrade): 120 canary rows") and "upgrade_min_overlap=0.3" in msg
    assert "upgrade_min_cosine=0.5" in msg and "upgrade_gate=off" in msg
    assert len(projection["upgrade"]["failed"]) == 2


def test_label_agreement_gates_a_classifier(tmp_path: Path) -> None:
    run_dir, pub = _setup(tmp_path, "classification")
    target, canary = pub.target("emb"), _canary(run_dir, NEW_FP)
    same = upgrade_gate.compare_with_published(_cfg(), run_dir, canary, target)
    assert same["decision"] == "passed" and same["label"]["agreement"] == 1.0 and "embedding" not in same
    for path in Path(run_dir).glob("shards/*/part-*.parquet"):  # every label of the new model changes
        t = pq.read_table(path)
        labels = pa.array([v + "x" for v in t.column("label").to_pylist()], pa.string())
        pq.write_table(t.set_column(t.schema.get_field_index("label"), "label", labels), path)
    moved = upgrade_gate.compare_with_published(_cfg(), run_dir, canary, target)
    assert moved["decision"] == "refused" and moved["label"]["agreement"] == 0.0
    assert "label agreement 0.000 < upgrade_min_agreement=0.7" in moved["message"]


def test_llm_outputs_reuse_the_quality_gate_comparison(tmp_path: Path) -> None:
    run_dir, pub = _setup(tmp_path, "llm", dead_rows={3, 4})
    section = upgrade_gate.compare_with_published(_cfg(), run_dir, _canary(run_dir, NEW_FP), pub.target("emb"))
    llm = section["llm"]
    assert llm["output_kind"] == "text" and llm["agreement"] == 1.0
    assert llm["candidate_valid_rate"] == pytest.approx(58 / 60)  # the canary's dead letters count as invalid
    assert section["decision"] == "refused" and "LLM agreement" in section["failed"][0]  # 3.3% > 2% validity drop
