"""The OpenAI API's files and batch records, and a batch's output and error files, on ``gs://`` (a real
fake-gcs-server): the same objects and answers as on a local files root."""

from __future__ import annotations

import json
from pathlib import Path

import gcs_fixture
import pytest
from batch_contract import storage
from batch_contract.layout import RunLayout
from batch_contract.openai_batch import EMBEDDINGS, parse_file
from batch_contract.runstore import RunStore
from batch_inference.openai_api.batches import write_inputs
from batch_inference.openai_api.results import build_files
from batch_inference.openai_api.store import ApiStore, BatchRecord, FileRecord, new_batch_id, new_file_id
from synthetic_runs import RunSpec, build_run, write_input

fake_gcs, gcs_bucket = gcs_fixture.fake_gcs, gcs_fixture.gcs_bucket
pytestmark = pytest.mark.integration


def test_files_batches_and_output_files_on_gcs(gcs_bucket: str, tmp_path: Path) -> None:
    api = ApiStore(f"{gcs_bucket}/openai")
    fid = new_file_id()
    data = b"".join(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": EMBEDDINGS,
                                "body": {"model": "other" if i == 3 else "m", "input": f"t{i}"}}).encode() + b"\n"
                    for i in range(6))
    api.put_file(FileRecord(id=fid, filename="in.jsonl", purpose="batch", created_at=1, bytes=len(data),
                            uri=api.file_data_uri(fid), owner="alice"), data)
    assert api.get_file(fid).owner == "alice" and storage.read_bytes(api.get_file(fid).uri) == data
    assert api.get_file(new_file_id()) is None
    parsed = parse_file(enumerate(data.splitlines()), EMBEDDINGS, "m")
    bid = new_batch_id()
    write_inputs(api, bid, parsed)
    record = BatchRecord(id=bid, endpoint=EMBEDDINGS, input_file_id=fid, completion_window="24h", model="m",
                         dag_id="d", owner="alice", created_at=1, total=6, rejected=1)
    api.put_batch(record)
    assert api.batch_ids() == [bid] and api.get_batch(bid) == record
    accepted = [r.custom_id for r in parsed.requests]
    local = build_run(tmp_path / "out", bid, write_input(tmp_path / "in.parquet", accepted),
                      RunSpec(shards=2, chunk_rows=2, dead_rows={0}))
    remote = RunLayout(f"{gcs_bucket}/out", bid)
    for path in Path(local.run_dir).rglob("*"):  # the synthetic run, uploaded as the worker writes it
        if path.is_file():
            storage.write_replace(f"{remote.run_dir}/{path.relative_to(local.run_dir).as_posix()}", path.read_bytes())
    built = build_files(api, record, RunStore(remote), "completed", 2)
    assert (built.completed, built.failed) == (4, 2)
    codes = sorted(json.loads(x)["error"]["code"] for x in built.errors.splitlines())
    assert codes == ["empty_text", "model_mismatch"]
