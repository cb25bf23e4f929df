"""Documents in (docs/documents.md): the contract's rules, the extractors and their dead-letter reasons,
the extraction pool's order and window, the planner's document index, the pod's CPU request and the
report's preprocess figures. Documents are generated here (bench/doc_corpus.py), a few KB each."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from batch_contract.documents import (
    DocumentSettings,
    document_id,
    extractor_for,
    index_root,
    is_document_name,
)
from batch_contract.engine_config import ConfigError
from batch_contract.enums import DeadLetterReason
from batch_contract.manifest import InputFile, InputSpec, Manifest, Segment, ShardSpec, config_fingerprint
from batch_contract.marker import AttemptRecord, ShardMarker
from batch_inference.planner import PlanError, PlanRequest, plan
from batch_worker.engines.base import ChunkRows
from batch_worker.extract import extract_document
from batch_worker.preprocess import DocumentPool, apply_extraction, pool_size

from bench.doc_corpus import (
    CORRUPT_PDF,
    encrypted_pdf_bytes,
    html_bytes,
    scanned_pdf_bytes,
    scanned_png_bytes,
    text_pdf_bytes,
)

PARAGRAPHS = ["Lightweight directory access protocol server with replication and access control.",
              "Command line tools for converting office documents into portable formats."]
HAS_TESSERACT = shutil.which("tesseract") is not None
needs_ocr = pytest.mark.skipif(not HAS_TESSERACT, reason="Debian's tesseract-ocr is not installed "
                               "(scripts/ensure_tesseract.sh; CI installs it)")


def _write(path: Path, data: bytes) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return str(path)


# -- contract ---------------------------------------------------------------------------------------------


def test_settings_validate_and_only_output_fields_are_fingerprinted() -> None:
    with pytest.raises(ConfigError, match="input.documents.preprocess"):
        DocumentSettings(preprocess="none")
    with pytest.raises(ConfigError, match="max_pages"):
        DocumentSettings(max_pages=0)
    with pytest.raises(ConfigError, match="ocr_lang"):
        DocumentSettings(ocr_lang="eng; rm -rf /")
    with pytest.raises(ConfigError, match="unknown field"):
        DocumentSettings.from_dict({"preprocess": "pdf", "dpi": 300})
    engine = {"kind": "encoder"}
    base = config_fingerprint(engine)
    pdf = config_fingerprint(engine, DocumentSettings(preprocess="pdf"))
    assert len({base, pdf, config_fingerprint(engine, DocumentSettings(preprocess="html"))}) == 3
    assert config_fingerprint(engine, DocumentSettings(preprocess="pdf", pool_workers=7, queue_depth=3)) == pdf


def test_extractor_ids_and_listing_rules() -> None:
    assert extractor_for("gs://b/x/A.PDF", "auto") == "pdf"
    assert extractor_for("/d/page.htm?x=1", "auto") == "html"
    assert extractor_for("/d/scan.tiff", "auto") == "ocr"
    assert extractor_for("/d/page.html", "pdf") == "pdf"
    assert document_id("/data/docs/2019/a.pdf", "/data/docs/") == "2019/a.pdf"
    assert document_id("gs://b/docs/a.pdf", "gs://b/other") == "a.pdf"
    assert is_document_name("/d/a.pdf", "pdf") and not is_document_name("/d/a.html", "pdf")
    assert is_document_name("/d/a.png", "ocr") and is_document_name("/d/a.html", "auto")
    assert not is_document_name("/d/.hidden.pdf", "auto") and not is_document_name("/d/a.pdf", "none")


def test_manifest_without_documents_writes_what_it_wrote_before_and_with_them_round_trips() -> None:
    spec = InputSpec(uri="/in", format="parquet", id_column="id", text_column="uri",
                     files=[InputFile(uri="/in/x.parquet", rows=2)])
    shards = [ShardSpec("00000", [Segment(0, 0, 2)])]
    plain = Manifest(run_id="r", input=spec, shards=shards, engine={"kind": "encoder"})
    assert "documents" not in plain.to_dict()["input"]
    assert plain.config_fingerprint == config_fingerprint({"kind": "encoder"})
    docs = Manifest(run_id="r", input=InputSpec(**{**spec.__dict__, "documents": DocumentSettings("ocr", max_pages=9)}),
                    shards=shards, engine={"kind": "encoder"})
    back = Manifest.from_json_bytes(docs.to_json_bytes())
    assert back == docs and back.input.documents == DocumentSettings("ocr", max_pages=9)
    assert back.config_fingerprint != plain.config_fingerprint


def test_records_write_preprocess_figures_only_when_there_are_some() -> None:
    attempt = AttemptRecord(attempt_id="a", shard_id="00000", started_at="t")
    assert "preprocess" not in json.loads(attempt.to_json_bytes())
    attempt.preprocess = {"rows": 3, "cpu_seconds": 1.5}
    assert AttemptRecord.from_json_bytes(attempt.to_json_bytes()) == attempt
    marker = ShardMarker(run_id="r", shard_id="00000", fingerprint="f", rows_input=3, rows_ok=2, rows_dead_letter=1,
                         attempts=[attempt.to_dict()], preprocess={"rows": 3})
    assert ShardMarker.from_json_bytes(marker.to_json_bytes()) == marker


# -- extractors ---------------------------------------------------------------------------------------------


def test_text_pdf_and_html_give_their_text(tmp_path: Path) -> None:
    settings = DocumentSettings(preprocess="auto")
    got = extract_document(_write(tmp_path / "a.pdf", text_pdf_bytes(PARAGRAPHS)), settings)
    assert got.reason is None and got.method == "pdf" and got.pages == 1
    assert "directory access protocol" in got.text and "office documents" in got.text
    page = extract_document(_write(tmp_path / "p.html", html_bytes("Release notes", PARAGRAPHS * 3)), settings)
    assert page.reason is None and page.method == "html"
    assert "office documents" in page.text and "All rights reserved" not in page.text


@pytest.mark.parametrize(("name", "data", "settings", "reason"), [
    ("enc.pdf", encrypted_pdf_bytes(PARAGRAPHS), {}, DeadLetterReason.ENCRYPTED_DOCUMENT),
    ("bad.pdf", CORRUPT_PDF, {}, DeadLetterReason.UNREADABLE_DOCUMENT),
    ("blank.pdf", text_pdf_bytes([], blank=True), {}, DeadLetterReason.EMPTY_EXTRACTION),
    ("long.pdf", text_pdf_bytes(PARAGRAPHS * 40), {"max_pages": 1}, DeadLetterReason.PAGE_LIMIT_EXCEEDED),
    ("big.pdf", text_pdf_bytes(PARAGRAPHS), {"max_document_bytes": 100}, DeadLetterReason.UNREADABLE_DOCUMENT),
    ("page.html", html_bytes("t", PARAGRAPHS), {"preprocess": "pdf"}, DeadLetterReason.UNREADABLE_DOCUMENT),
    ("empty.html", b"<html><body>   </body></html>", {}, DeadLetterReason.EMPTY_EXTRACTION),
    ("noise.png", b"\x89PNG\r\n\x1a\n not an image", {}, DeadLetterReason.UNREADABLE_DOCUMENT),
])
def test_bad_documents_are_dead_letters_with_reasons(tmp_path: Path, name: str, data: bytes, settings: dict,
                                                     reason: DeadLetterReason) -> None:
    got = extract_document(_write(tmp_path / name, data), DocumentSettings(**{"preprocess": "auto", **settings}))
    assert got.reason == reason and got.detail and got.text == ""


def test_any_parser_exception_is_that_documents_dead_letter(tmp_path: Path, monkeypatch) -> None:
    import batch_worker.extract as extract

    def explode(data: bytes):
        raise RecursionError("maximum recursion depth exceeded in a nested table")

    monkeypatch.setattr(extract, "_html", explode)
    got = extract_document(_write(tmp_path / "deep.html", b"<table>" * 10), DocumentSettings(preprocess="auto"))
    assert got.reason == DeadLetterReason.UNREADABLE_DOCUMENT and "RecursionError" in got.detail


def test_a_missing_or_refused_file_is_unreadable(tmp_path: Path) -> None:
    settings = DocumentSettings(preprocess="pdf")
    assert extract_document(str(tmp_path / "gone.pdf"), settings).reason == DeadLetterReason.UNREADABLE_DOCUMENT
    outside = _write(tmp_path / "out" / "a.pdf", text_pdf_bytes(PARAGRAPHS))
    refused = extract_document(outside, settings, roots=[str(tmp_path / "in")])
    assert refused.reason == DeadLetterReason.UNREADABLE_DOCUMENT and "refused" in refused.detail


@needs_ocr
def test_scanned_pages_and_images_go_through_ocr(tmp_path: Path) -> None:
    scan = _write(tmp_path / "scan.pdf", scanned_pdf_bytes("Invoice total amount due", width=700, font_size=28))
    got = extract_document(scan, DocumentSettings(preprocess="pdf"))
    assert got.reason is None and got.method == "pdf+ocr" and "Invoice" in got.text
    off = extract_document(scan, DocumentSettings(preprocess="pdf", ocr=False))
    assert off.reason == DeadLetterReason.EMPTY_EXTRACTION and "OCR is off" in off.detail
    png = extract_document(_write(tmp_path / "a.png", scanned_png_bytes("Purchase order", font_size=28)),
                           DocumentSettings(preprocess="auto"))
    assert png.method == "ocr" and "Purchase" in png.text and png.cpu_seconds > 0


# -- pool -----------------------------------------------------------------------------------------------


def _rows(uris: list[str]) -> ChunkRows:
    ids = [f"d{i}" for i in range(len(uris))]
    return ChunkRows(ids=ids, texts=list(uris), text_repaired=[False] * len(uris), source_uri=["/idx"] * len(uris),
                     source_row=list(range(len(uris))), fields=pa.table({"id": ids, "uri": uris, "lang": ["en"] * len(uris)}))


def test_pool_keeps_input_order_through_a_small_window_and_splits_dead_letters(tmp_path: Path) -> None:
    uris = []
    for i in range(7):
        data = CORRUPT_PDF if i == 3 else text_pdf_bytes([f"Document number {i} about {PARAGRAPHS[i % 2]}"])
        uris.append(_write(tmp_path / f"{i}.pdf", data))
    with DocumentPool(DocumentSettings(preprocess="pdf", queue_depth=2), workers=2) as pool:
        assert (pool.workers, pool.depth) == (2, 2)
        results = pool.extract(uris)
        assert pool.extract(uris[:2], should_stop=lambda: True) is None
    assert [f"Document number {i} " in r.text for i, r in enumerate(results)] == [i != 3 for i in range(7)]
    rows, dead = apply_extraction(_rows(uris), results, "uri")
    assert rows.ids == ["d0", "d1", "d2", "d4", "d5", "d6"] and rows.source_row == [0, 1, 2, 4, 5, 6]
    assert rows.fields.column("uri").to_pylist() == rows.texts and rows.texts[0].startswith("Document number 0")
    assert rows.fields.column("lang").to_pylist() == ["en"] * 6
    assert [(d.id, d.reason, d.source_row) for d in dead] == [("d3", DeadLetterReason.UNREADABLE_DOCUMENT, 3)]
    assert pool.stats.rows == 7 and pool.stats.cpu_seconds >= 0


def test_documents_queued_a_chunk_ahead_come_back_in_queue_order(tmp_path: Path) -> None:
    uris = [_write(tmp_path / f"{i}.pdf", text_pdf_bytes([f"Chunk document {i} on {PARAGRAPHS[0]}"]))
            for i in range(5)]
    with DocumentPool(DocumentSettings(preprocess="pdf", queue_depth=2), workers=2) as pool:
        pool.enqueue(uris[:2])
        pool.enqueue(uris[2:])  # the next chunk, queued while the first is still being collected
        first = pool.collect(2)
        with pytest.raises(ValueError, match="4 documents asked for, 3 queued"):
            pool.collect(4)
        rest = pool.collect(3)
    assert [r.text.split(" on ")[0] for r in first + rest] == [f"Chunk document {i}" for i in range(5)]


def test_pool_size_from_settings_then_the_pods_request_then_the_cpus() -> None:
    assert pool_size(DocumentSettings(pool_workers=3), {}) == 3
    assert pool_size(DocumentSettings(), {"BATCH_PREPROCESS_WORKERS": "5"}) == 5
    assert pool_size(DocumentSettings(), {}) >= 1


# -- planner ------------------------------------------------------------------------------------------------


def _folder(tmp_path: Path) -> Path:
    root = tmp_path / "docs"
    _write(root / "2019" / "a.pdf", text_pdf_bytes(PARAGRAPHS))
    _write(root / "b.pdf", text_pdf_bytes(PARAGRAPHS[:1]))
    _write(root / "c.html", html_bytes("t", PARAGRAPHS))
    _write(root / ".hidden.pdf", b"x")
    return root


def _request(tmp_path: Path, input_uri: str, preprocess: str, **kw) -> PlanRequest:
    return PlanRequest(input_uri=input_uri, id_column="id", text_column="text", output_root=str(tmp_path / "out"),
                       run_id=f"r-{preprocess}-{len(kw)}", engine={"kind": "encoder"}, preprocess=preprocess, **kw)


def test_a_folder_is_planned_into_a_document_index_with_relative_ids(tmp_path: Path) -> None:
    root = _folder(tmp_path)
    roots = [str(tmp_path)]
    manifest, refs = plan(_request(tmp_path, str(root), "pdf", input_roots=roots))
    spec = manifest.input
    assert (spec.format, spec.id_column, spec.text_column) == ("parquet", "id", "uri")
    assert spec.documents == DocumentSettings(preprocess="pdf") and manifest.rows == 2
    run_dir = refs[0]["run_dir"]
    assert spec.roots == [*roots, index_root(run_dir)] and refs[0]["preprocess_workers"] == 4
    index = pq.read_table(spec.files[0].uri).to_pylist()
    assert index == [{"id": "2019/a.pdf", "uri": str(root / "2019" / "a.pdf")}, {"id": "b.pdf", "uri": str(root / "b.pdf")}]
    again, _ = plan(_request(tmp_path, str(root), "pdf", input_roots=roots))  # a retried plan task reuses it
    assert again == manifest
    auto, _ = plan(_request(tmp_path, str(root), "auto"))
    assert auto.rows == 3 and auto.input.roots == []


def test_document_inputs_that_cannot_be_planned_say_why(tmp_path: Path) -> None:
    root = _folder(tmp_path)
    with pytest.raises(PlanError, match="holds no file that preprocess='html'"):
        plan(_request(tmp_path, str(root / "2019"), "html"))  # a folder with only a PDF, read as HTML
    pq.write_table(pa.table({"id": [1], "text": ["x"]}), root / "rows.parquet")
    with pytest.raises(PlanError, match="both documents and Parquet/JSONL"):
        plan(_request(tmp_path, str(root), "pdf"))


def test_a_column_of_uris_keeps_its_input_and_turns_carry_over_off(tmp_path: Path) -> None:
    from batch_contract.runstore import RunStore
    from batch_inference.carryover import decide  # the carry-over module imports the run store

    table = tmp_path / "in" / "docs.parquet"
    table.parent.mkdir()
    pq.write_table(pa.table({"key": ["a", "b"], "path": ["/x/a.pdf", "/x/b.pdf"]}), table)
    manifest, refs = plan(PlanRequest(input_uri=str(table), id_column="key", text_column="path",
                                      output_root=str(tmp_path / "out"), run_id="col", engine={"kind": "encoder"},
                                      preprocess="pdf"))
    assert (manifest.input.text_column, manifest.input.files[0].uri) == ("path", str(table))
    assert manifest.input.documents is not None
    decision = decide(RunStore.open(refs[0]["run_dir"]), manifest, "files:abc")
    assert "documents" in decision.disabled and not decision.carried


# -- pod spec and report ---------------------------------------------------------------------------------------


def test_a_document_pod_requests_its_pool_cpus() -> None:
    from batch_inference.pod_spec import PREPROCESS_LABEL, kpo_expand_kwargs, with_preprocess_cpus
    from kubernetes.client import models as k8s

    ref = {"run_dir": "gs://b/runs/r", "shard_id": "00001", "rows": 5}
    assert PREPROCESS_LABEL not in kpo_expand_kwargs(ref, "run")["labels"]
    labels = kpo_expand_kwargs({**ref, "preprocess_workers": 3}, "run")["labels"]
    pod = k8s.V1Pod(metadata=k8s.V1ObjectMeta(labels=labels), spec=k8s.V1PodSpec(containers=[k8s.V1Container(
        name="base", resources=k8s.V1ResourceRequirements(requests={"cpu": "500m", "memory": "1Gi"}))]))
    container = with_preprocess_cpus(pod).spec.containers[0]
    assert container.resources.requests == {"cpu": "3500m", "memory": "1Gi"}
    assert [(e.name, e.value) for e in container.env] == [("BATCH_PREPROCESS_WORKERS", "3")]


def test_report_preprocess_figures_and_idle_share() -> None:
    from batch_inference.report.aggregate import preprocess

    def marker(**figures) -> ShardMarker:
        return ShardMarker(run_id="r", shard_id="0", fingerprint="f", rows_input=1, rows_ok=1, rows_dead_letter=0,
                           preprocess=figures)

    assert preprocess([ShardMarker(run_id="r", shard_id="0", fingerprint="f", rows_input=1, rows_ok=1,
                                   rows_dead_letter=0)]) is None
    got = preprocess([marker(rows=10, cpu_seconds=4.0, wall_seconds=5.0, engine_wait_seconds=1.0,
                             engine_busy_seconds=9.0, pool_workers=2),
                      marker(rows=30, cpu_seconds=6.0, wall_seconds=15.0, engine_wait_seconds=0.0,
                             engine_busy_seconds=10.0, pool_workers=4)])
    assert got["rows"] == 40 and got["cpu_seconds"] == 10.0 and got["rows_per_s"] == 2.0
    assert got["engine_idle_share"] == pytest.approx(1 / 20) and got["pool_workers"] == 4
