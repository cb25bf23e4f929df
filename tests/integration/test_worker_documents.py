"""Documents through the real worker: a generated folder (text PDFs, HTML pages, a scanned PDF, bad
documents) planned into a document index, extracted by the pool and embedded by the real
all-MiniLM-L6-v2. Every document is exactly once in results or dead letters; an embedding is the
extracted text's; a shard killed after its first chunks resumes by id and extracts only the rest; the
canary samples extracted text; the same from a gs:// bucket (fake-gcs-server)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gcs_fixture
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from batch_contract import storage
from batch_contract.runstore import RunStore
from batch_inference.planner import PlanRequest, plan
from batch_worker.canary import CanaryOptions, run_canary
from batch_worker.engines.base import ChunkRows, engine_class
from batch_worker.extract import extract_document
from batch_worker.runtime import run_shard

from bench.doc_corpus import CORRUPT_PDF, encrypted_pdf_bytes, html_bytes, scanned_pdf_bytes, text_pdf_bytes

pytestmark = pytest.mark.integration
fake_gcs, gcs_bucket = gcs_fixture.fake_gcs, gcs_fixture.gcs_bucket  # pytest fixtures

TEXTS = ["Lightweight directory access protocol server with multi-master replication.",
         "Command line tools for converting office documents into portable formats.",
         "Library for parsing and validating structured configuration files.",
         "Fast incremental backup program with deduplication and encryption.",
         "Graphical front end for managing virtual machines and containers."]
OCR = shutil.which("tesseract") is not None


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("docs")
    for i in range(9):
        sub = root / f"year-{2019 + i % 3}"
        sub.mkdir(exist_ok=True)
        (sub / f"contract-{i}.pdf").write_bytes(text_pdf_bytes([TEXTS[i % 5], TEXTS[(i + 2) % 5]]))
    (root / "page.html").write_bytes(html_bytes("Notes", TEXTS))
    if OCR:
        (root / "scan.pdf").write_bytes(scanned_pdf_bytes("Invoice for backup services", width=700, font_size=28))
    (root / "locked.pdf").write_bytes(encrypted_pdf_bytes(TEXTS[:1]))
    (root / "broken.pdf").write_bytes(CORRUPT_PDF)
    (root / "blank.pdf").write_bytes(text_pdf_bytes([], blank=True))
    return root


def _plan(folder: Path | str, out: Path | str, run_id: str) -> tuple[str, str]:
    _, refs = plan(PlanRequest(input_uri=str(folder), id_column="id", text_column="text", output_root=str(out),
                               run_id=run_id, engine={"kind": "encoder", "dtype": "float32"},
                               worker={"chunk_rows": 4, "reuse": "off"}, preprocess="auto",
                               rows_per_shard=1000))
    return refs[0]["run_dir"], refs[0]["shard_id"]


def _committed(shard_dir: Path) -> tuple[dict[str, list[float]], dict[str, str]]:
    results, dead = {}, {}
    for p in sorted(shard_dir.glob("part-*.parquet")):
        t = pq.read_table(p)
        results.update(zip(t.column("id").to_pylist(), t.column("embedding").to_pylist(), strict=True))
    for p in sorted(shard_dir.glob("dead-letter-*.parquet")):
        t = pq.read_table(p)
        dead.update(zip(t.column("id").to_pylist(), t.column("reason").to_pylist(), strict=True))
    return results, dead


def test_every_document_once_with_the_extracted_texts_embedding_and_resume(folder: Path, tmp_path: Path) -> None:
    run_dir, shard = _plan(folder, tmp_path / "out", "docs")
    store = RunStore.open(run_dir)
    manifest = store.manifest
    assert run_shard(run_dir, shard, install_signals=False) == 0
    shard_dir = Path(store.layout.shard_dir(shard))
    results, dead = _committed(shard_dir)
    ids = pq.read_table(manifest.input.files[0].uri).column("id").to_pylist()
    assert sorted([*results, *dead]) == sorted(ids) and not set(results) & set(dead)
    assert dead == {"locked.pdf": "encrypted_document", "broken.pdf": "unreadable_document",
                    "blank.pdf": "empty_extraction"}
    assert "year-2020/contract-1.pdf" in results and "page.html" in results and ("scan.pdf" in results) == OCR

    # an embedding is the engine's output for the document's extracted text
    engine = engine_class(manifest.engine_config.kind)(manifest.engine_config, manifest.worker)
    engine.load()
    uri = str(folder / "year-2020" / "contract-1.pdf")
    text = extract_document(uri, manifest.input.documents).text
    rows = ChunkRows(ids=["x"], texts=[text], text_repaired=[False], source_uri=["i"], source_row=[0],
                     fields=pa.table({"id": ["x"], "uri": [text]}))
    ref = engine.process(engine.prepare(rows), lambda: False).table.column("embedding").to_pylist()[0]
    np.testing.assert_allclose(results["year-2020/contract-1.pdf"], ref, atol=1e-5)

    marker = store.marker(shard)
    assert marker.preprocess["rows"] == len(ids) and marker.preprocess["pool_workers"] >= 1
    assert "preprocess" in marker.stage_seconds and marker.dead_letter_reasons["encrypted_document"] == 1

    # a kill after the first chunks: the marker and the later files never landed; the rerun extracts and
    # embeds only the rest, and every document is still there exactly once with the same embeddings
    parts = sorted(shard_dir.glob("part-*.parquet")) + sorted(shard_dir.glob("dead-letter-*.parquet"))
    late = sorted(parts, key=lambda p: p.name.split("-")[-2])[-2:]
    for p in [*late, shard_dir / "_SUCCESS.json"]:
        p.unlink()
    kept_results, kept_dead = _committed(shard_dir)
    assert run_shard(run_dir, shard, install_signals=False) == 0
    again, dead_again = _committed(shard_dir)
    assert sorted([*again, *dead_again]) == sorted(ids) and dead_again == dead
    for rid, emb in again.items():
        np.testing.assert_allclose(emb, results[rid], atol=1e-5)
    latest = max(store.attempts(shard, marker.fingerprint), key=lambda a: a.started_at)
    assert latest.preprocess["rows"] == len(ids) - len(kept_results) - len(kept_dead)
    assert json.loads((shard_dir / "_SUCCESS.json").read_bytes())["rows_ok"] == len(results)


def test_the_canary_runs_extracted_text_and_leaves_bad_documents_to_their_shard(folder: Path, tmp_path: Path) -> None:
    run_dir, shard = _plan(folder, tmp_path / "out", "canary")
    canary = run_canary(run_dir, CanaryOptions(min_rows=8, strategy="candidates"))
    store = RunStore.open(run_dir)
    shard_dir = Path(store.layout.shard_dir(shard))
    sampled, dead = _committed(shard_dir)
    assert canary.sample_rows == len(sampled) > 0 and not dead  # the sample's bad documents are not in it
    assert "preprocess" in canary.stage_seconds
    assert run_shard(run_dir, shard, install_signals=False) == 0
    results, dead = _committed(shard_dir)
    ids = pq.read_table(store.manifest.input.files[0].uri).column("id").to_pylist()
    assert sorted([*results, *dead]) == sorted(ids) and set(sampled) <= set(results)
    assert set(dead) == {"locked.pdf", "broken.pdf", "blank.pdf"}
    assert store.marker(shard).preprocess["rows"] == len(ids) - len(sampled)


def test_documents_in_a_gs_bucket(gcs_bucket: str) -> None:
    folder = f"{gcs_bucket}/scans/2026"
    for i in range(3):
        storage.write_create_only(f"{folder}/q{i}/report-{i}.pdf", text_pdf_bytes([TEXTS[i], TEXTS[i + 1]]))
    storage.write_create_only(f"{folder}/page.html", html_bytes("Notes", TEXTS))
    storage.write_create_only(f"{folder}/locked.pdf", encrypted_pdf_bytes(TEXTS[:1]))
    run_dir, shard = _plan(folder, f"{gcs_bucket}/out", "gs")
    store = RunStore.open(run_dir)
    index_uri = store.manifest.input.files[0].uri
    assert index_uri.startswith(f"{gcs_bucket}/out/runs/")
    index = pq.read_table(pa.BufferReader(storage.read_bytes(index_uri))).to_pylist()
    assert [r["id"] for r in index] == ["locked.pdf", "page.html", "q0/report-0.pdf", "q1/report-1.pdf",
                                       "q2/report-2.pdf"]
    assert index[2]["uri"] == f"{folder}/q0/report-0.pdf"
    assert run_shard(run_dir, shard, install_signals=False) == 0
    marker = store.marker(shard)
    assert (marker.rows_input, marker.rows_ok, marker.dead_letter_reasons) == (5, 4, {"encrypted_document": 1})
