"""The storage contract: the storage API behaves the same on local paths, gs:// (a real fake-gcs-server),
s3:// (moto's S3 server) and az:// (Azurite); then the gs:// specifics (test_s3_storage.py and
test_azure_storage.py hold the other schemes' specifics)."""

from __future__ import annotations

import base64
import hashlib
import io
import re
import time
import uuid

import azure_fixture
import gcs_fixture
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import s3_fixture
from batch_contract import gcs, storage
from gcs_fixture import Fault

fake_gcs, gcs_bucket, fault_proxy = gcs_fixture.fake_gcs, gcs_fixture.gcs_bucket, gcs_fixture.fault_proxy
moto_s3, s3_bucket = s3_fixture.moto_s3, s3_fixture.s3_bucket
azurite, azure_container = azure_fixture.azurite, azure_fixture.azure_container

pytestmark = pytest.mark.integration


@pytest.fixture(params=["local", "file", "gs", "s3", "az"])
def root(request: pytest.FixtureRequest, tmp_path) -> str:
    """A fresh empty root URI on each backend: local paths, fake-gcs-server, moto's S3 server, Azurite."""
    if request.param == "local":
        return str(tmp_path / "root")
    if request.param == "file":
        return f"file://{tmp_path}/root"
    bucket = {"gs": "gcs_bucket", "s3": "s3_bucket", "az": "azure_container"}[request.param]
    return request.getfixturevalue(bucket) + "/some/prefix"


def test_create_only_read_exists_delete(root: str) -> None:
    uri = f"{root}/shards/00000/part-00000-a.parquet"
    assert not storage.exists(uri)
    with pytest.raises(FileNotFoundError):
        storage.read_bytes(uri)
    storage.write_create_only(uri, b"first")
    assert storage.exists(uri)
    assert storage.read_bytes(uri) == b"first"
    storage.write_create_only(uri, b"first")  # same bytes: a retried commit, success
    with pytest.raises(storage.AlreadyExistsError, match=f"^{re.escape(uri)} already exists with other content"):
        storage.write_create_only(uri, b"other")
    assert storage.read_bytes(uri) == b"first"
    storage.delete(uri)
    assert not storage.exists(uri)
    storage.delete(uri)  # deleting a missing object is not an error


def test_replace_overwrites(root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gcs, "MIN_REWRITE_INTERVAL_S", 0.0)
    uri = f"{root}/shards/00001/_PROGRESS.json"
    storage.write_replace(uri, b'{"rows": 1}')
    storage.write_replace(uri, b'{"rows": 2}')
    assert storage.read_bytes(uri) == b'{"rows": 2}'


def test_list_names_is_a_directory_listing(root: str) -> None:
    assert storage.list_names(f"{root}/shards/00002") == []
    shard = f"{root}/shards/00002"
    for name in ("part-00001-b.parquet", "part-00000-a.parquet", "_SUCCESS.json"):
        storage.write_create_only(f"{shard}/{name}", name.encode())
    storage.write_create_only(f"{shard}/attempts/a1.json", b"{}")
    storage.write_create_only(f"{shard}-other/x.json", b"{}")  # a sibling sharing the name prefix
    expected = ["_SUCCESS.json", "attempts", "part-00000-a.parquet", "part-00001-b.parquet"]
    assert storage.list_names(shard) == expected
    assert storage.list_names(shard + "/") == expected
    assert storage.list_names(f"{root}/shards") == ["00002", "00002-other"]


def test_arrow_filesystem_reads_parquet(root: str) -> None:
    table = pa.table({"id": [f"r{i}" for i in range(100)], "x": list(range(100))})
    buf = io.BytesIO()
    pq.write_table(table, buf)
    uri = f"{root}/in/data.parquet"
    storage.write_create_only(uri, buf.getvalue())
    fs, path = storage.arrow_filesystem(uri)
    assert pq.read_table(path, filesystem=fs).equals(table)


def test_copy_is_create_only_and_content_tag_follows_the_bytes(root: str) -> None:
    src, dst = f"{root}/runs/r1/part-a.parquet", f"{root}/runs/r2/part-a.parquet"
    with pytest.raises(FileNotFoundError):
        storage.content_tag(src)
    storage.write_create_only(src, b"abcd")
    tag = storage.content_tag(src)
    storage.copy(src, dst)
    storage.copy(src, dst)  # a retried copy of the same bytes: success
    assert storage.read_bytes(dst) == b"abcd"
    other = f"{root}/runs/r1/other.parquet"
    storage.write_create_only(other, b"wxyz")
    with pytest.raises(storage.AlreadyExistsError, match=f"^{re.escape(dst)} already exists with other content"):
        storage.copy(other, dst)
    storage.write_replace(src, b"abce")  # same size, new bytes
    assert storage.content_tag(src) != tag
    with pytest.raises(FileNotFoundError):
        storage.copy(f"{root}/missing", f"{root}/x")


def test_gcs_second_commit_gets_412_and_changes_nothing(gcs_bucket: str) -> None:
    from google.api_core.exceptions import PreconditionFailed

    uri = f"{gcs_bucket}/runs/r1/shards/00000/_SUCCESS.json"
    storage.write_create_only(uri, b'{"status": "succeeded"}')
    blob = gcs.client().bucket(gcs_bucket[5:]).blob("runs/r1/shards/00000/_SUCCESS.json")
    blob.reload()
    generation = blob.generation
    with pytest.raises(PreconditionFailed):  # the server itself enforces create-only
        blob.upload_from_string(b"overwrite", if_generation_match=0)
    with pytest.raises(storage.AlreadyExistsError, match=f"^{re.escape(uri)} already exists with other content"):
        storage.write_create_only(uri, b'{"status": "other"}')
    storage.write_create_only(uri, b'{"status": "succeeded"}')
    blob.reload()
    assert blob.generation == generation
    assert storage.read_bytes(uri) == b'{"status": "succeeded"}'
    assert blob.md5_hash == base64.b64encode(hashlib.md5(b'{"status": "succeeded"}').digest()).decode()


def test_gcs_listing_spans_many_pages(gcs_bucket: str) -> None:
    shard = f"{gcs_bucket}/shards/00003"
    names = [f"part-{i:05d}-x.parquet" for i in range(25)]
    for name in names:
        storage.write_create_only(f"{shard}/{name}", b"p")
    for sub in ("attempts", "extra"):
        storage.write_create_only(f"{shard}/{sub}/a.json", b"{}")
    listed = gcs.list_names(shard, page_size=4)  # 7 pages of objects
    assert sorted(listed) == sorted(names + ["attempts", "extra"])


def test_gcs_lost_reply_on_create_only_is_resolved(fault_proxy) -> None:
    bucket = f"lost-{uuid.uuid4().hex[:10]}"
    gcs.client().create_bucket(bucket)
    fault_proxy.faults.append(Fault(method="POST", path_contains="/upload/", mode="drop_reply"))
    uri = f"gs://{bucket}/shards/00000/part-00000-a.parquet"
    storage.write_create_only(uri, b"chunk bytes")  # first reply lost -> retry -> 412 -> same content
    outcomes = [o for m, p, o in fault_proxy.seen if "/upload/" in p]
    assert outcomes[0] == "dropped 200"
    assert outcomes[1] == "412"
    assert storage.read_bytes(uri) == b"chunk bytes"


def test_gcs_5xx_and_429_are_retried(fault_proxy, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gcs, "RETRY_INITIAL_S", 0.05)
    bucket = f"retry-{uuid.uuid4().hex[:10]}"
    gcs.client().create_bucket(bucket)
    fault_proxy.faults += [
        Fault(method="POST", path_contains="/upload/", mode="status", status=503),
        Fault(method="POST", path_contains="/upload/", mode="status", status=429),
        Fault(method="GET", path_contains="/o/", mode="status", status=500),
    ]
    uri = f"gs://{bucket}/x/_SUCCESS.json"
    storage.write_create_only(uri, b"{}")
    assert storage.read_bytes(uri) == b"{}"
    uploads = [o for _, p, o in fault_proxy.seen if "/upload/" in p]
    reads = [o for _, p, o in fault_proxy.seen if "/download/" in p]
    assert uploads == ["injected 503", "injected 429", "200"]
    assert reads == ["injected 500", "200"]


def test_gcs_non_retryable_error_names_the_uri(fault_proxy) -> None:
    fault_proxy.faults.append(Fault(method="POST", path_contains="/upload/", mode="status", status=403))
    uri = "gs://no-such-bucket-here/x.json"
    with pytest.raises(storage.StorageError, match="gs://no-such-bucket-here/x.json.*403"):
        storage.write_create_only(uri, b"{}")


def test_gcs_write_replace_is_rate_limited(gcs_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gcs, "MIN_REWRITE_INTERVAL_S", 0.3)
    uri = f"{gcs_bucket}/p/_PROGRESS.json"
    stamps = []
    for i in range(3):
        storage.write_replace(uri, str(i).encode())
        stamps.append(time.monotonic())
    assert stamps[1] - stamps[0] >= 0.29 and stamps[2] - stamps[1] >= 0.29
    assert storage.read_bytes(uri) == b"2"  # no write dropped: the last one landed


def test_gcs_missing_bucket_listing_is_an_error(fake_gcs) -> None:
    with pytest.raises(storage.StorageError, match="bucket 'absent-bucket-x' not found"):
        storage.list_names("gs://absent-bucket-x/runs")


def test_gcs_multi_mb_parquet_through_arrow(gcs_bucket: str) -> None:
    n = 150_000
    values = np.random.default_rng(0).random(n * 16, dtype=np.float32)
    table = pa.table(
        {
            "id": pa.array([f"row-{i:08d}" for i in range(n)]),
            "emb": pa.FixedSizeListArray.from_arrays(pa.array(values), 16),
        }
    )
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=50_000, compression="none")
    data = buf.getvalue()
    assert len(data) > 9 * 2**20  # above the 8 MiB multipart limit: a resumable upload
    uri = f"{gcs_bucket}/in/big.parquet"
    storage.write_create_only(uri, data)
    fs, path = storage.arrow_filesystem(uri)
    assert fs.type_name == "gcs"
    assert fs.get_file_info(path).size == len(data)
    pf = pq.ParquetFile(path, filesystem=fs)
    assert pf.metadata.num_rows == n and pf.metadata.num_row_groups == 3
    assert pq.read_table(path, filesystem=fs).equals(table)


def test_gcs_retries_give_up_with_a_storage_error(fault_proxy, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gcs, "RETRY_INITIAL_S", 0.05)
    monkeypatch.setattr(gcs, "RETRY_TIMEOUT_S", 0.6)
    fault_proxy.faults += [Fault(method="GET", path_contains="/o/", mode="status", status=503)] * 200
    with pytest.raises(storage.StorageError, match=r"gs://any-bucket/x.json: download failed \(gave up .*503"):
        storage.read_bytes("gs://any-bucket/x.json")
    assert sum(o == "injected 503" for _, _, o in fault_proxy.seen) >= 2
