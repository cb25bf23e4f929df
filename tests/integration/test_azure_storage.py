"""The storage API on az:// (a real Azurite server): the contract of the other backends, and the
Azure-specific commit, retry and credential rules (mirroring test_gcs_storage.py's gs:// tests)."""

from __future__ import annotations

import io
import re

import azure_fixture
import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from azure_fixture import ACCOUNT_KEY, CONNECTION_STRING_ENV, AzuriteServer, RecordingFaultProxy
from batch_contract import storage
from batch_contract.layout import TEMP_MARK
from batch_contract.storage import azure as az
from batch_contract.storage import objectstore
from gcs_fixture import Fault

azurite, azure_container, azure_fault_proxy = (azure_fixture.azurite, azure_fixture.azure_container,
                                                azure_fixture.azure_fault_proxy)

pytestmark = pytest.mark.integration


@pytest.fixture
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Backoff of milliseconds, so retried faults cost no time."""
    monkeypatch.setattr(az, "RETRY_INITIAL_S", 0.01)
    monkeypatch.setattr(az, "RETRY_MAX_S", 0.02)


@pytest.fixture
def proxied(azurite: AzuriteServer, azure_fault_proxy: RecordingFaultProxy, fast_retries: None) -> str:
    """``az://<fresh container>`` (made directly on Azurite) reached through ``azure_fault_proxy``."""
    return azurite.create_container(azure_fixture.new_container_name("proxied"))


def _other_content(uri: str) -> str:
    """The ``match=`` pattern of the :class:`~batch_contract.storage.AlreadyExistsError` for ``uri``."""
    return f"^{re.escape(uri)} already exists with other content"


def _outcomes(proxy: RecordingFaultProxy, method: str, path_part: str) -> list[str]:
    return [o for m, p, o in proxy.seen if m == method and path_part in p]


def _parquet_bytes(n: int) -> tuple[pa.Table, bytes]:
    values = np.random.default_rng(0).random(n * 16, dtype=np.float32)
    table = pa.table({"id": pa.array([f"row-{i:08d}" for i in range(n)]),
                      "emb": pa.FixedSizeListArray.from_arrays(pa.array(values), 16)})
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=50_000, compression="none")
    return table, buf.getvalue()


def _messages(exc: BaseException) -> str:
    """The text of ``exc`` and of every exception chained to it (what a traceback would print)."""
    parts = []
    seen: BaseException | None = exc
    while seen is not None:
        parts += [str(seen), repr(seen)]
        seen = seen.__cause__ or (None if seen.__suppress_context__ else seen.__context__)
    return "\n".join(parts)


# ------------------------------------------------------------------------------- the storage contract


def test_create_only_read_exists_delete(azure_container: str) -> None:
    uri = f"{azure_container}/some/prefix/shards/00000/part-00000-a.parquet"
    assert not storage.exists(uri)
    with pytest.raises(FileNotFoundError):
        storage.read_bytes(uri)
    storage.write_create_only(uri, b"first")
    assert storage.exists(uri)
    assert storage.read_bytes(uri) == b"first"
    storage.write_create_only(uri, b"first")  # same bytes: a retried commit, success
    with pytest.raises(storage.AlreadyExistsError, match=_other_content(uri)):
        storage.write_create_only(uri, b"other")
    with pytest.raises(storage.AlreadyExistsError, match=_other_content(uri)):
        storage.write_create_only(uri, b"other, longer")
    assert storage.read_bytes(uri) == b"first"
    storage.delete(uri)
    assert not storage.exists(uri)
    storage.delete(uri)  # deleting a missing object is not an error
    with pytest.raises(storage.StorageError, match="an object URI needs a name after the container"):
        storage.write_create_only(f"{azure_container}/dir/", b"x")


def test_replace_overwrites_and_move(azure_container: str) -> None:
    uri = f"{azure_container}/shards/00001/_PROGRESS.json"
    storage.write_replace(uri, b'{"rows": 1}')
    storage.write_replace(uri, b'{"rows": 2}')
    assert storage.read_bytes(uri) == b'{"rows": 2}'
    props = az._blob(uri).get_blob_properties()
    assert props.content_settings.content_type == "application/json"
    assert props.metadata[objectstore.SHA256_METADATA] == objectstore.sha256_hex(b'{"rows": 2}')
    dst = f"{azure_container}/final/part-0.parquet"
    storage.move(uri, dst)
    assert not storage.exists(uri) and storage.read_bytes(dst) == b'{"rows": 2}'
    with pytest.raises(FileNotFoundError):
        storage.move(uri, dst)


def test_listings(azure_container: str) -> None:
    shard = f"{azure_container}/shards/00002"
    assert storage.list_names(shard) == [] and storage.list_sizes(shard) == {}
    for name in ("part-00001-b.parquet", "part-00000-a.parquet", "_SUCCESS.json"):
        storage.write_create_only(f"{shard}/{name}", name.encode())
    storage.write_create_only(f"{shard}/attempts/a1.json", b"{}")
    storage.write_create_only(f"{shard}-other/x.json", b"{}")  # a sibling sharing the name prefix
    storage.write_create_only(f"{shard}/part-00002-c.parquet{TEMP_MARK}x", b"partial")  # dropped by storage
    expected = ["_SUCCESS.json", "attempts", "part-00000-a.parquet", "part-00001-b.parquet"]
    assert storage.list_names(shard) == expected
    assert storage.list_names(shard + "/") == expected
    assert len(az.list_names(shard)) == 5  # the backend itself lists it
    assert storage.list_names(f"{azure_container}/shards") == ["00002", "00002-other"]
    sizes = az.list_sizes(shard)
    assert sizes["_SUCCESS.json"] == len(b"_SUCCESS.json") and "attempts" not in sizes
    assert storage.list_glob(f"{azure_container}/shards", "*/_SUCCESS.json") == ["00002/_SUCCESS.json"]
    assert storage.list_glob(azure_container, "shards/0000?/*.json") == ["shards/00002/_SUCCESS.json"]
    assert sorted(az.list_glob(azure_container, "shards/*/*.json")) == [
        "shards/00002-other/x.json", "shards/00002/_SUCCESS.json"]
    assert az.list_glob(azure_container, "shards/00002/a*/*.json") == ["shards/00002/attempts/a1.json"]


def test_copy_is_create_only_and_content_tag_follows_the_bytes(azure_container: str) -> None:
    root = f"{azure_container}/prefix"
    src, dst = f"{root}/runs/r1/part-a.parquet", f"{root}/runs/r2/part-a.parquet"
    with pytest.raises(FileNotFoundError):
        storage.content_tag(src)
    storage.write_create_only(src, b"abcd")
    tag = storage.content_tag(src)
    assert re.fullmatch(r"etag=[^;\"]+;size=4;modified=\S+", tag)
    storage.copy(src, dst)
    storage.copy(src, dst)  # a retried copy of the same bytes: success
    assert storage.read_bytes(dst) == b"abcd"
    other = f"{root}/runs/r1/other.parquet"
    storage.write_create_only(other, b"wxyz")
    with pytest.raises(storage.AlreadyExistsError, match=_other_content(dst)):
        storage.copy(other, dst)
    storage.write_replace(src, b"abce")  # same size, new bytes
    assert storage.content_tag(src) != tag
    with pytest.raises(FileNotFoundError):
        storage.copy(f"{root}/missing", f"{root}/x")


def test_arrow_tree_open_and_localize(azure_container: str, tmp_path) -> None:
    table = pa.table({"id": [f"r{i}" for i in range(100)], "x": list(range(100))})
    buf = io.BytesIO()
    pq.write_table(table, buf)
    uris = [f"{azure_container}/in/a/data.parquet", f"{azure_container}/in/b/c/more.parquet"]
    for uri in uris:
        storage.write_create_only(uri, buf.getvalue())
    fs, path = storage.arrow_filesystem(uris[0])
    assert fs.type_name == "py::az-blob" and path == f"{azure_container[5:]}/in/a/data.parquet"
    assert pq.read_table(path, filesystem=fs).equals(table)
    backend = storage.backend_for(azure_container)
    tree = storage.list_tree(f"{azure_container}/in")
    assert sorted(backend.uri_from_arrow_path(p) for p in tree) == sorted(uris)
    assert storage.list_tree(f"{azure_container}/nothing-here") == []
    with storage.open_input_file(uris[1], [f"{azure_container}/in"]) as f:
        assert pq.read_table(f).equals(table)
    with pytest.raises(storage.InputRefusedError, match="lies outside the allowed input locations"):
        storage.open_input_file(uris[1], [f"{azure_container}/in/a"])
    local = storage.localize(uris[1], tmp_path / "copy" / "more.parquet")
    assert pq.read_table(local).equals(table)
    assert storage.clean_temp(f"{azure_container}/in") == 0
    assert not storage.is_local(uris[0])


def test_normalize_and_is_under() -> None:
    assert storage.normalize("az://c/a/b/d/") == "az://c/a/b/d"
    with pytest.raises(storage.StorageError, match=r"'\.' path segment"):
        storage.normalize("az://c/a/./b/../d/")
    assert storage.normalize("az://c") == "az://c"
    assert storage.is_under("az://c/data/in/x.parquet", "az://c/data")
    assert not storage.is_under("az://c/database/x", "az://c/data")
    with pytest.raises(storage.StorageError, match="path segment"):
        storage.is_under("az://c/data/../secret/x", "az://c/data")
    assert not storage.is_under("az://other/data/x", "az://c/data")
    assert not storage.is_under("az://c/data/x", "gs://c/data")
    with pytest.raises(storage.StorageError, match="no container name"):
        storage.normalize("az:///x")
    backend = storage.backend_for("az://c/x")
    assert backend.shared and backend.arrow_filesystem_required
    assert backend.config_envs == ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_BLOB_ENDPOINT")


# ------------------------------------------------------------------------------- Azure-specific rules


def test_server_refuses_a_second_create_and_nothing_changes(azurite: AzuriteServer,
                                                            azure_container: str) -> None:
    from azure.core.exceptions import ResourceExistsError

    uri = f"{azure_container}/runs/r1/shards/00000/_SUCCESS.json"
    storage.write_create_only(uri, b'{"status": "succeeded"}')
    blob = azurite.service_client().get_blob_client(azure_container[5:], "runs/r1/shards/00000/_SUCCESS.json")
    etag = blob.get_blob_properties().etag
    with pytest.raises(ResourceExistsError):  # the server itself enforces create-only (If-None-Match: *)
        blob.upload_blob(b"overwrite", overwrite=False)
    with pytest.raises(storage.AlreadyExistsError, match=_other_content(uri)):
        storage.write_create_only(uri, b'{"status": "other"}')
    storage.write_create_only(uri, b'{"status": "succeeded"}')
    props = blob.get_blob_properties()
    assert props.etag == etag
    assert props.metadata == {"sha256": objectstore.sha256_hex(b'{"status": "succeeded"}')}
    assert props.content_settings.content_type == "application/json"
    assert storage.read_bytes(uri) == b'{"status": "succeeded"}'


def test_lost_reply_on_create_only_is_resolved(proxied: str, azure_fault_proxy: RecordingFaultProxy) -> None:
    azure_fault_proxy.faults.append(Fault(method="PUT", path_contains="/lost.json", mode="drop_reply"))
    uri = f"{proxied}/shards/00000/lost.json"
    storage.write_create_only(uri, b"chunk bytes")  # first reply lost -> retry -> 409 -> same content
    assert _outcomes(azure_fault_proxy, "PUT", "/lost.json") == ["dropped 201", "409"]
    assert _outcomes(azure_fault_proxy, "HEAD", "/lost.json") == ["200"]  # the read-back
    assert storage.read_bytes(uri) == b"chunk bytes"


def test_lost_reply_then_other_content_is_already_exists(proxied: str, azure_fault_proxy: RecordingFaultProxy,
                                                          azurite: AzuriteServer) -> None:
    uri = f"{proxied}/x/taken.json"
    azurite.service_client().get_blob_client(proxied[5:], "x/taken.json").upload_blob(b"another writer's")
    azure_fault_proxy.faults.append(Fault(method="PUT", path_contains="/taken.json", mode="status",
                                          status=503))
    with pytest.raises(storage.AlreadyExistsError, match=_other_content(uri)):
        storage.write_create_only(uri, b"ours")
    assert _outcomes(azure_fault_proxy, "PUT", "/taken.json") == ["injected 503", "409"]


def test_5xx_and_429_are_retried(proxied: str, azure_fault_proxy: RecordingFaultProxy) -> None:
    azure_fault_proxy.faults += [
        Fault(method="PUT", path_contains="/_SUCCESS.json", mode="status", status=503),
        Fault(method="PUT", path_contains="/_SUCCESS.json", mode="status", status=429),
        Fault(method="GET", path_contains="/_SUCCESS.json", mode="status", status=500),
        Fault(method="HEAD", path_contains="/_SUCCESS.json", mode="status", status=429),
        Fault(method="GET", path_contains="comp=list", mode="status", status=503),
    ]
    uri = f"{proxied}/x/_SUCCESS.json"
    storage.write_create_only(uri, b"{}")
    assert storage.read_bytes(uri) == b"{}"
    assert storage.exists(uri)
    assert storage.list_names(f"{proxied}/x") == ["_SUCCESS.json"]
    assert _outcomes(azure_fault_proxy, "PUT", "/_SUCCESS.json") == ["injected 503", "injected 429", "201"]
    reads = _outcomes(azure_fault_proxy, "GET", "/_SUCCESS.json")
    assert reads[0] == "injected 500" and reads[1] in ("200", "206") and len(reads) == 2
    assert _outcomes(azure_fault_proxy, "HEAD", "/_SUCCESS.json") == ["injected 429", "200"]
    assert _outcomes(azure_fault_proxy, "GET", "comp=list") == ["injected 503", "200"]


def test_connection_cut_mid_upload_is_retried_and_lands_once(proxied: str,
                                                             azure_fault_proxy: RecordingFaultProxy) -> None:
    small = f"{proxied}/cut/small.json"
    azure_fault_proxy.faults.append(Fault(method="PUT", path_contains="/small.json", mode="cut"))
    storage.write_create_only(small, b'{"a": 1}')
    assert _outcomes(azure_fault_proxy, "PUT", "/small.json") == ["cut", "201"]
    assert storage.read_bytes(small) == b'{"a": 1}'

    data = bytes(range(256)) * (10 * 2**12)  # 10 MiB: two blocks
    big = f"{proxied}/cut/big.bin"
    azure_fault_proxy.faults.append(Fault(method="PUT", path_contains="/big.bin?comp=block&", mode="cut"))
    storage.write_create_only(big, data)
    blocks = _outcomes(azure_fault_proxy, "PUT", "/big.bin?comp=block&")
    assert blocks[0] == "cut" and blocks[1:] == ["201", "201"]
    assert _outcomes(azure_fault_proxy, "PUT", "/big.bin?comp=blocklist") == ["201"]  # committed once
    assert storage.read_bytes(big) == data


def test_non_retryable_status_names_the_uri_and_status(azure_fault_proxy: RecordingFaultProxy,
                                                        fast_retries: None) -> None:
    azure_fault_proxy.faults.append(Fault(method="PUT", path_contains="/x.json", mode="status", status=403))
    uri = "az://no-such-container/x.json"
    expected = r"^az://no-such-container/x.json: create-only upload failed \(\w+ HTTP 403\)$"
    with pytest.raises(storage.StorageError, match=expected) as caught:
        storage.write_create_only(uri, b"{}")
    assert _outcomes(azure_fault_proxy, "PUT", "/x.json") == ["injected 403"]  # not retried, no read-back
    assert [m for m, _, _ in azure_fault_proxy.seen] == ["PUT"]
    assert ACCOUNT_KEY not in _messages(caught.value)


def test_retries_give_up_with_a_storage_error(azure_fault_proxy: RecordingFaultProxy,
                                              fast_retries: None) -> None:
    azure_fault_proxy.faults += [Fault(method="GET", path_contains="/x.json", mode="status", status=503)] * 50
    expected = (r"^az://any-container/x.json: download failed "
                r"\(gave up retrying; last error HttpResponseError HTTP 503\)$")
    with pytest.raises(storage.StorageError, match=expected):
        storage.read_bytes("az://any-container/x.json")
    assert sum(o == "injected 503" for _, _, o in azure_fault_proxy.seen) == az.RETRY_STATUS + 1


def test_create_only_gives_up_when_nothing_landed(proxied: str,
                                                  azure_fault_proxy: RecordingFaultProxy) -> None:
    azure_fault_proxy.faults += [Fault(method="PUT", path_contains="/never.json", mode="status",
                                       status=500)] * 50
    uri = f"{proxied}/never.json"
    expected = rf"^{re.escape(uri)}: create-only upload failed \(gave up retrying; last error \w+ HTTP 500\)$"
    with pytest.raises(storage.StorageError, match=expected):
        storage.write_create_only(uri, b"{}")
    assert _outcomes(azure_fault_proxy, "HEAD", "/never.json") == ["404"]  # read back: nothing there
    assert not storage.exists(uri)


def test_multi_mb_parquet_goes_up_as_blocks_and_reads_through_arrow(
        proxied: str, azure_fault_proxy: RecordingFaultProxy) -> None:
    n = 150_000
    table, data = _parquet_bytes(n)
    assert len(data) > az.SINGLE_PUT_BYTES + 2**20  # above the single-put size: a block blob
    uri = f"{proxied}/in/big.parquet"
    storage.write_create_only(uri, data)
    blocks = _outcomes(azure_fault_proxy, "PUT", "/big.parquet?comp=block&")
    assert blocks == ["201"] * -(-len(data) // az.BLOCK_BYTES)
    assert _outcomes(azure_fault_proxy, "PUT", "/big.parquet?comp=blocklist") == ["201"]
    single_puts = [p for m, p, _ in azure_fault_proxy.seen if m == "PUT" and p.endswith("/big.parquet")]
    assert single_puts == []  # no Put Blob of the whole object
    # The SDK puts the create-only condition on the commit, not on the staged blocks.
    sent = [(p, h) for m, p, h in azure_fault_proxy.forwarded if m == "PUT" and "/big.parquet" in p]
    assert all(h.get("if-none-match") == "*" for p, h in sent if "comp=blocklist" in p)
    assert not any("if-none-match" in h for p, h in sent if "comp=block&" in p)
    fs, path = storage.arrow_filesystem(uri)
    assert fs.get_file_info(path).size == len(data)
    pf = pq.ParquetFile(path, filesystem=fs)
    assert pf.metadata.num_rows == n and pf.metadata.num_row_groups == 3
    assert pq.read_table(path, filesystem=fs).equals(table)
    storage.write_create_only(uri, data)  # a retried commit of a block blob: success
    with pytest.raises(storage.AlreadyExistsError, match=_other_content(uri)):
        storage.write_create_only(uri, data[:-1] + b"\0")
    assert _outcomes(azure_fault_proxy, "PUT", "/big.parquet?comp=blocklist") == ["201", "409", "409"]


def test_lost_reply_on_block_list_commit_is_resolved(proxied: str,
                                                     azure_fault_proxy: RecordingFaultProxy) -> None:
    data = bytes(range(256)) * (9 * 2**12)  # 9 MiB
    uri = f"{proxied}/in/commit.bin"
    azure_fault_proxy.faults.append(Fault(method="PUT", path_contains="/commit.bin?comp=blocklist",
                                          mode="drop_reply"))
    storage.write_create_only(uri, data)
    assert _outcomes(azure_fault_proxy, "PUT", "/commit.bin?comp=blocklist") == ["dropped 201", "409"]
    assert storage.read_bytes(uri) == data


def test_object_without_sha256_metadata_is_compared_by_bytes(
        proxied: str, azure_fault_proxy: RecordingFaultProxy, azurite: AzuriteServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(objectstore, "COMPARE_PIECE_BYTES", 4)
    data = b"0123456789"
    uri = f"{proxied}/foreign/part.parquet"
    raw = azurite.service_client().get_blob_client(proxied[5:], "foreign/part.parquet")
    raw.upload_blob(data)  # another tool: no sha256 metadata
    assert not raw.get_blob_properties().metadata
    storage.write_create_only(uri, data)  # same bytes: success, compared in 3 ranged reads
    reads = [h for m, p, h in azure_fault_proxy.forwarded if m == "GET" and "/foreign/part.parquet" in p]
    assert [h.get("x-ms-range") for h in reads] == ["bytes=0-3", "bytes=4-7", "bytes=8-9"]
    assert all(h.get("if-match") for h in reads)  # pinned to the ETag read by the read-back
    with pytest.raises(storage.AlreadyExistsError, match=_other_content(uri)):
        storage.write_create_only(uri, b"0123456780")  # same size, last piece differs
    with pytest.raises(storage.AlreadyExistsError, match=_other_content(uri)):
        storage.write_create_only(uri, b"01234")  # other size: no read at all
    assert not raw.get_blob_properties().metadata  # nothing was rewritten


def test_listing_spans_many_pages(proxied: str, azure_fault_proxy: RecordingFaultProxy,
                                  azurite: AzuriteServer) -> None:
    shard = f"{proxied}/shards/00003"
    names = [f"part-{i:05d}-x.parquet" for i in range(25)]
    direct = azurite.service_client().get_container_client(proxied[5:])  # not through the proxy: faster
    for name in names + ["attempts/a.json", "extra/a.json"]:
        direct.upload_blob(f"shards/00003/{name}", b"p")
    listed = az.list_names(shard, page_size=4)  # 27 entries: 7 pages
    assert sorted(listed) == sorted(names + ["attempts", "extra"])
    assert len(_outcomes(azure_fault_proxy, "GET", "comp=list")) == 7
    assert len(az.list_sizes(shard, page_size=5)) == 25
    assert len(az.list_glob(shard, "*/a.json", page_size=1)) == 2


def test_missing_container_listing_is_an_error(azurite: AzuriteServer) -> None:
    for call in (storage.list_names, storage.list_sizes, lambda uri: storage.list_glob(uri, "*/x")):
        with pytest.raises(storage.StorageError, match="^az://absent-container-x/runs: container "
                                                       "'absent-container-x' not found$"):
            call("az://absent-container-x/runs")
    with pytest.raises(FileNotFoundError):
        storage.read_bytes("az://absent-container-x/runs/a.json")
    assert not storage.exists("az://absent-container-x/runs/a.json")
    storage.delete("az://absent-container-x/runs/a.json")


def test_credentials_never_appear_in_error_messages(azurite: AzuriteServer, azure_container: str,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    fast_retries: None) -> None:
    uri = f"{azure_container}/x.json"
    wrong_key = ACCOUNT_KEY[:-8] + "AAAAAAA="  # valid base64, another key: the server refuses (403)
    monkeypatch.setenv(CONNECTION_STRING_ENV, azurite.connection_string.replace(ACCOUNT_KEY, wrong_key))
    expected = rf"^{re.escape(uri)}: create-only upload failed \(\w+ HTTP 403 \w+\)$"
    with pytest.raises(storage.StorageError, match=expected) as caught:
        storage.write_create_only(uri, b"{}")
    assert ACCOUNT_KEY not in _messages(caught.value) and wrong_key not in _messages(caught.value)
    with pytest.raises(storage.StorageError, match=rf"^{re.escape(uri)}: download failed") as caught:
        storage.read_bytes(uri)
    assert wrong_key not in _messages(caught.value)
    bad_base64 = "not-base64-%%%"
    monkeypatch.setenv(CONNECTION_STRING_ENV, azurite.connection_string.replace(ACCOUNT_KEY, bad_base64))
    with pytest.raises(storage.StorageError, match=rf"^{re.escape(uri)}: download failed") as caught:
        storage.read_bytes(uri)
    assert bad_base64 not in _messages(caught.value)
    monkeypatch.setenv(CONNECTION_STRING_ENV, f"AccountKey={ACCOUNT_KEY}")  # no account, no endpoint
    with pytest.raises(storage.StorageError, match=f"^{CONNECTION_STRING_ENV} is set but is not") as caught:
        storage.read_bytes(uri)
    assert ACCOUNT_KEY not in _messages(caught.value)
    monkeypatch.setenv(CONNECTION_STRING_ENV, azurite.connection_string.replace(str(azurite.port), "9"))
    with pytest.raises(storage.StorageError, match=rf"^{re.escape(uri)}: download failed \(gave up retrying; "
                       r"last error ServiceRequestError\)$") as caught:
        storage.read_bytes(uri)  # nothing listens on port 9: connection refused, retried, given up
    assert ACCOUNT_KEY not in _messages(caught.value)


def test_no_account_configured_names_the_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CONNECTION_STRING_ENV, raising=False)
    monkeypatch.delenv(az.ACCOUNT_NAME_ENV, raising=False)
    expected = f"set {CONNECTION_STRING_ENV} .* or {az.ACCOUNT_NAME_ENV}"
    with pytest.raises(storage.StorageError, match=expected):
        storage.read_bytes("az://c/x.json")
    fs, path = storage.arrow_filesystem("az://c/x.json")  # made without a request: fails on first use
    with pytest.raises(OSError, match=expected):
        fs.open_input_file(path)


def test_account_name_uses_the_default_credential(monkeypatch: pytest.MonkeyPatch) -> None:
    from azure.identity import DefaultAzureCredential

    monkeypatch.delenv(CONNECTION_STRING_ENV, raising=False)
    monkeypatch.setenv(az.ACCOUNT_NAME_ENV, "acct")
    monkeypatch.delenv(az.BLOB_ENDPOINT_ENV, raising=False)
    service = az.client()
    assert service.url == "https://acct.blob.core.windows.net/"
    assert isinstance(service.credential, DefaultAzureCredential)
    assert service._config.max_single_put_size == az.SINGLE_PUT_BYTES
    assert service._config.max_block_size == az.BLOCK_BYTES
    fs, path = storage.arrow_filesystem("az://c/a/b.parquet")  # made without a request
    assert fs.type_name == "py::az-blob" and path == "c/a/b.parquet"
    monkeypatch.setenv(az.BLOB_ENDPOINT_ENV, "https://acct.privatelink.blob.core.windows.net")
    assert az.client().url == "https://acct.privatelink.blob.core.windows.net/"
    monkeypatch.setenv(az.BLOB_ENDPOINT_ENV, "http://127.0.0.1:10000/acct")  # a token is never sent in clear
    for call in (lambda: storage.read_bytes("az://c/x.json"), lambda: storage.write_create_only("az://c/x", b"")):
        with pytest.raises(storage.StorageError, match=f"{az.BLOB_ENDPOINT_ENV}=http://.* needs an https://"):
            call()


def test_arrow_filesystem_is_a_file_system_over_the_sdk(azure_container: str) -> None:
    """The pyarrow filesystem of az:// (reads, writes, listings and deletes pyarrow and pyiceberg make)."""
    fs, base = storage.arrow_filesystem(azure_container)
    with fs.open_output_stream(f"{base}/d/sub/a.bin") as out:  # uploaded when closed
        out.write(b"0123456789" * 1000)
    storage.write_create_only(f"{azure_container}/d/b.json", b"{}")
    info = fs.get_file_info([f"{base}/d/sub/a.bin", f"{base}/d", f"{base}/d/sub", f"{base}/nothing"])
    assert [i.type for i in info] == [pafs.FileType.File, pafs.FileType.Directory, pafs.FileType.Directory,
                                      pafs.FileType.NotFound]
    assert info[0].size == 10_000
    flat = fs.get_file_info(pafs.FileSelector(f"{base}/d"))
    assert sorted((i.path, i.type) for i in flat) == [(f"{base}/d/b.json", pafs.FileType.File),
                                                       (f"{base}/d/sub", pafs.FileType.Directory)]
    deep = fs.get_file_info(pafs.FileSelector(f"{base}/d", recursive=True))
    assert sorted(i.path for i in deep if i.type == pafs.FileType.File) == [f"{base}/d/b.json",
                                                                           f"{base}/d/sub/a.bin"]
    with fs.open_input_file(f"{base}/d/sub/a.bin") as f:
        f.seek(9_995)
        assert f.read() == b"56789" and f.size() == 10_000
    with pytest.raises(FileNotFoundError):
        fs.get_file_info(pafs.FileSelector(f"{base}/nothing"))
    with pytest.raises(FileNotFoundError):
        fs.open_input_stream(f"{base}/nothing.bin")
    fs.delete_dir_contents(f"{base}/d")
    assert storage.list_names(azure_container) == []
