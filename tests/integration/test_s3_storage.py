"""s3:// specifics against a real S3-compatible server (moto) and a fault-injecting proxy: the server
enforces create-only, lost replies and cut connections are resolved by a read-back, throttling and 5xx
are retried, multipart uploads keep the guarantee, errors name the URI and never a credential. The
behaviour shared by every scheme is in ``test_gcs_storage.py`` (its ``root`` fixture covers s3)."""

from __future__ import annotations

import hashlib
import io
import re
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import s3_fixture
from batch_contract import storage
from batch_contract.storage import s3
from gcs_fixture import Fault

moto_s3, s3_bucket, s3_fault_proxy = s3_fixture.moto_s3, s3_fixture.s3_bucket, s3_fixture.s3_fault_proxy

pytestmark = pytest.mark.integration


@pytest.fixture
def proxied_bucket(s3_fault_proxy, moto_s3) -> str:
    """A fresh bucket reached through the fault proxy (created directly on the server)."""
    return moto_s3.create_bucket(f"proxied-{uuid.uuid4().hex[:10]}")


def _uploads(proxy, method: str = "PUT") -> list[str]:
    return [o for m, _, o in proxy.seen if m == method]


def test_server_refuses_a_second_create_and_nothing_changes(s3_bucket: str) -> None:
    import botocore.exceptions

    uri = f"{s3_bucket}/runs/r1/shards/00000/_SUCCESS.json"
    storage.write_create_only(uri, b'{"status": "succeeded"}')
    bucket, key = uri[5:].split("/", 1)
    head = s3.client().head_object(Bucket=bucket, Key=key)
    assert head["Metadata"]["sha256"] == hashlib.sha256(b'{"status": "succeeded"}').hexdigest()
    with pytest.raises(botocore.exceptions.ClientError, match="PreconditionFailed"):  # the server itself
        s3.client().put_object(Bucket=bucket, Key=key, Body=b"overwrite", IfNoneMatch="*")
    with pytest.raises(storage.AlreadyExistsError, match=f"^{re.escape(uri)} already exists with other content"):
        storage.write_create_only(uri, b'{"status": "other"}')
    storage.write_create_only(uri, b'{"status": "succeeded"}')
    assert s3.client().head_object(Bucket=bucket, Key=key)["ETag"] == head["ETag"]
    assert storage.read_bytes(uri) == b'{"status": "succeeded"}'


def test_lost_reply_on_create_only_is_resolved(s3_fault_proxy, proxied_bucket: str) -> None:
    s3_fault_proxy.faults.append(Fault(method="PUT", path_contains="/shards/", mode="drop_reply"))
    uri = f"{proxied_bucket}/shards/00000/part-00000-a.parquet"
    storage.write_create_only(uri, b"chunk bytes")  # reply lost -> botocore retries -> 412 -> same bytes
    assert _uploads(s3_fault_proxy)[:2] == ["dropped 200", "412"]
    assert storage.read_bytes(uri) == b"chunk bytes"


def test_cut_connection_is_retried_and_lands_once(s3_fault_proxy, proxied_bucket: str) -> None:
    s3_fault_proxy.faults.append(Fault(method="PUT", path_contains="/cut/", mode="cut"))
    uri = f"{proxied_bucket}/cut/_SUCCESS.json"
    storage.write_create_only(uri, b"{}")
    assert _uploads(s3_fault_proxy) == ["cut", "200"]
    assert storage.read_bytes(uri) == b"{}"


@pytest.mark.parametrize("status", [503, 500, 429])
def test_server_errors_and_throttling_are_retried(s3_fault_proxy, proxied_bucket: str, status: int) -> None:
    s3_fault_proxy.faults += [Fault(method="PUT", path_contains="/x/", mode="status", status=status),
                              Fault(method="GET", path_contains="/x/", mode="status", status=status)]
    uri = f"{proxied_bucket}/x/_SUCCESS.json"
    storage.write_create_only(uri, b"{}")
    assert storage.read_bytes(uri) == b"{}"
    assert _uploads(s3_fault_proxy) == [f"injected {status}", "200"]
    assert _uploads(s3_fault_proxy, "GET") == [f"injected {status}", "200"]


def test_non_retryable_error_names_the_uri_and_never_a_credential(s3_fault_proxy, proxied_bucket: str) -> None:
    s3_fault_proxy.faults.append(Fault(method="PUT", path_contains="/denied/", mode="status", status=403))
    uri = f"{proxied_bucket}/denied/x.json"
    with pytest.raises(storage.StorageError, match=re.escape(uri) + r": create-only upload failed .*403") as info:
        storage.write_create_only(uri, b"{}")
    assert s3_fixture.CREDENTIAL_ENV["AWS_SECRET_ACCESS_KEY"] not in str(info.value)
    assert s3_fixture.CREDENTIAL_ENV["AWS_ACCESS_KEY_ID"] not in str(info.value)


def test_retries_give_up_with_a_storage_error(s3_fault_proxy, proxied_bucket: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(s3, "MAX_ATTEMPTS", 2)
    monkeypatch.setattr(s3, "_clients", {})
    s3_fault_proxy.faults += [Fault(method="GET", path_contains="/gone/", mode="status", status=503)] * 5
    uri = f"{proxied_bucket}/gone/x.json"
    with pytest.raises(storage.StorageError, match=re.escape(uri) + r": download failed .*503"):
        storage.read_bytes(uri)
    assert _uploads(s3_fault_proxy, "GET") == ["injected 503"] * 2  # MAX_ATTEMPTS, the first included


def _parquet_bytes(n: int) -> tuple[pa.Table, bytes]:
    values = np.random.default_rng(0).random(n * 16, dtype=np.float32)
    table = pa.table({"id": pa.array([f"row-{i:08d}" for i in range(n)]),
                      "emb": pa.FixedSizeListArray.from_arrays(pa.array(values), 16)})
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=50_000, compression="none")
    return table, buf.getvalue()


def test_multipart_upload_is_create_only_and_reads_back_through_arrow(
        s3_fault_proxy, proxied_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(s3, "MULTIPART_THRESHOLD_BYTES", 5 * 2**20)
    monkeypatch.setattr(s3, "PART_BYTES", 5 * 2**20)
    table, data = _parquet_bytes(110_000)
    assert len(data) > 10 * 2**20  # three parts
    uri = f"{proxied_bucket}/in/big.parquet"
    s3_fault_proxy.faults.append(Fault(method="POST", path_contains="uploadId=", mode="drop_reply"))
    storage.write_create_only(uri, data)  # the completion's reply is lost: retried, then read back
    assert sum("partNumber=" in p for m, p, _ in s3_fault_proxy.seen if m == "PUT") == 3
    completions = [o for m, p, o in s3_fault_proxy.seen if m == "POST" and "uploadId=" in p]
    assert completions[0] == "dropped 200" and len(completions) == 2
    storage.write_create_only(uri, data)  # the same bytes again: success, by the SHA-256 metadata
    with pytest.raises(storage.AlreadyExistsError, match="already exists with other content"):
        storage.write_create_only(uri, data[:-1] + b"\0")
    fs, path = storage.arrow_filesystem(uri)
    assert fs.type_name == "s3" and fs.get_file_info(path).size == len(data)
    assert pq.read_table(path, filesystem=fs).equals(table)


def test_an_object_without_the_digest_is_compared_by_its_bytes(s3_bucket: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from batch_contract.storage import objectstore

    monkeypatch.setattr(objectstore, "COMPARE_PIECE_BYTES", 3)
    bucket = s3_bucket[5:]
    s3.client().put_object(Bucket=bucket, Key="foreign.json", Body=b"written by another tool")
    uri = f"{s3_bucket}/foreign.json"
    storage.write_create_only(uri, b"written by another tool")  # same bytes, compared piece by piece
    with pytest.raises(storage.AlreadyExistsError, match="already exists with other content"):
        storage.write_create_only(uri, b"written by another tooL")


def test_listing_spans_many_pages(s3_bucket: str) -> None:
    shard = f"{s3_bucket}/shards/00003"
    names = [f"part-{i:05d}-x.parquet" for i in range(25)]
    for name in names:
        storage.write_create_only(f"{shard}/{name}", b"p")
    for sub in ("attempts", "extra"):
        storage.write_create_only(f"{shard}/{sub}/a.json", b"{}")
    assert sorted(s3.list_names(shard, page_size=4)) == sorted(names + ["attempts", "extra"])
    assert storage.list_glob(f"{s3_bucket}/shards", "*/extra/*.json") == ["00003/extra/a.json"]


def test_missing_bucket_listing_is_an_error(moto_s3) -> None:
    with pytest.raises(storage.StorageError, match="bucket 'absent-bucket-x' not found"):
        storage.list_names("s3://absent-bucket-x/runs")


def test_uris_without_a_bucket_or_object_name_are_refused(moto_s3) -> None:
    with pytest.raises(storage.StorageError, match="no bucket name"):
        storage.normalize("s3:///x")
    with pytest.raises(storage.StorageError, match="needs a name after the bucket"):
        storage.write_create_only("s3://bucket/dir/", b"")
    for dotted in ("s3://b/runs/a/../r1", "s3://b/runs/../other", "s3://b/../c/runs"):
        with pytest.raises(storage.StorageError, match="path segment"):
            storage.is_under(dotted, "s3://b/runs")
    assert not storage.is_under("s3://b/runs2/x", "s3://b/runs")


CONFLICT = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>ConditionalRequestConflict</Code>'
            b"<Message>A conflicting conditional operation is currently in progress against this resource."
            b"</Message></Error>")
"""S3's reply to a conditional write while another one to the same key is in flight (HTTP 409)."""


def _conflicts(n: int, path: str, method: str = "PUT") -> list[Fault]:
    return [Fault(method=method, path_contains=path, mode="status", status=409, body=CONFLICT)] * n


@pytest.mark.parametrize("conflicts", [1, 4])
def test_a_conditional_write_conflict_is_retried(s3_fault_proxy, proxied_bucket: str, conflicts: int,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(s3, "CONFLICT_BACKOFF_S", 0.01)
    s3_fault_proxy.faults += _conflicts(conflicts, "/conflict/")
    uri = f"{proxied_bucket}/conflict/_SUCCESS.json"
    storage.write_create_only(uri, b"{}")
    assert _uploads(s3_fault_proxy) == ["injected 409"] * conflicts + ["200"]
    assert storage.read_bytes(uri) == b"{}"


def test_persistent_conflicts_are_resolved_by_what_the_other_writer_left(
        s3_fault_proxy, proxied_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(s3, "CONFLICT_BACKOFF_S", 0.01)
    same, other, absent = (f"{proxied_bucket}/{name}/_SUCCESS.json" for name in ("same", "other", "absent"))
    storage.write_create_only(same, b'{"ok": 1}')
    storage.write_create_only(other, b'{"ok": 2}')
    for uri in (same, other, absent):
        s3_fault_proxy.faults += _conflicts(s3.CONFLICT_ATTEMPTS, uri.split("/", 3)[3])
    storage.write_create_only(same, b'{"ok": 1}')  # the other writer committed our bytes
    with pytest.raises(storage.AlreadyExistsError, match="already exists with other content"):
        storage.write_create_only(other, b'{"ok": 1}')
    with pytest.raises(storage.StorageError, match=re.escape(absent) + r": create-only upload failed .*409"):
        storage.write_create_only(absent, b'{"ok": 1}')
    assert _uploads(s3_fault_proxy).count("injected 409") == 3 * s3.CONFLICT_ATTEMPTS


def test_a_conflict_on_completing_a_multipart_upload_is_retried(
        s3_fault_proxy, proxied_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(s3, "MULTIPART_THRESHOLD_BYTES", 5 * 2**20)
    monkeypatch.setattr(s3, "PART_BYTES", 5 * 2**20)
    monkeypatch.setattr(s3, "CONFLICT_BACKOFF_S", 0.01)
    data = np.random.default_rng(7).bytes(6 * 2**20)
    s3_fault_proxy.faults += _conflicts(1, "uploadId=", method="POST")  # CompleteMultipartUpload
    uri = f"{proxied_bucket}/mpu/part-00000-a.parquet"
    storage.write_create_only(uri, data)
    assert storage.read_bytes(uri) == data
    posts = [(path.split("?")[1][:8], outcome) for m, path, outcome in s3_fault_proxy.seen if m == "POST"]
    assert posts == [("uploads", "200"), ("uploadId", "injected 409"), ("uploads", "200"), ("uploadId", "200")]
