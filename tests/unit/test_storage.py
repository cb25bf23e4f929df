"""Storage API on local paths and the pure parts of the gs:// backend (no server needed)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from batch_contract import gcs, storage
from batch_contract.layout import TEMP_MARK


def test_local_create_only_never_overwrites(tmp_path: Path) -> None:
    uri = str(tmp_path / "a" / "part-00000-x.parquet")
    storage.write_create_only(uri, b"one")
    storage.write_create_only(uri, b"one")
    with pytest.raises(storage.AlreadyExistsError, match=f"^{re.escape(uri)} already exists with other content"):
        storage.write_create_only(uri, b"two")
    assert storage.read_bytes(uri) == b"one"
    assert not [p for p in (tmp_path / "a").iterdir() if TEMP_MARK in p.name]


def test_local_listing_hides_temp_files_and_clean_temp_removes_them(tmp_path: Path) -> None:
    (tmp_path / f"{TEMP_MARK}part-00000-x.parquet-1234").write_bytes(b"partial")
    (tmp_path / "part-00000-x.parquet").write_bytes(b"done")
    (tmp_path / "attempts").mkdir()
    assert storage.list_names(f"file://{tmp_path}") == ["attempts", "part-00000-x.parquet"]
    assert storage.clean_temp(str(tmp_path)) == 1
    assert storage.clean_temp(str(tmp_path)) == 0
    assert storage.list_names(str(tmp_path / "missing")) == []


def test_clean_temp_with_an_age_leaves_a_live_writers_temp_file(tmp_path: Path) -> None:
    """Work stealing: several workers commit into one shard; a ledger build removes only old strays."""
    import os
    import time

    fresh = tmp_path / f"{TEMP_MARK}part-00001-y.parquet-1"
    stray = tmp_path / f"{TEMP_MARK}part-00000-x.parquet-2"
    fresh.write_bytes(b"in flight")
    stray.write_bytes(b"killed writer")
    old = time.time() - 700
    os.utime(stray, (old, old))
    assert storage.clean_temp(str(tmp_path), older_than_seconds=600) == 1
    assert fresh.exists() and not stray.exists()
    assert storage.clean_temp(str(tmp_path)) == 1 and not fresh.exists()


def test_local_path_rejects_other_schemes() -> None:
    with pytest.raises(storage.StorageError, match="s3://b/k"):
        storage.local_path("s3://b/k")


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("gs://bucket/a/b.json", ("bucket", "a/b.json")),
        ("gs://bucket", ("bucket", "")),
        ("gs://bucket/", ("bucket", "")),
        ("gs://bucket/dir/", ("bucket", "dir/")),
    ],
)
def test_split_uri(uri: str, expected: tuple[str, str]) -> None:
    assert gcs.split_uri(uri) == expected


@pytest.mark.parametrize(("uri", "reason"), [
    ("gs://", "no bucket name"),
    ("gs:///key", "no bucket name"),
    ("/local/path", "not a gs:// URI"),
    ("s3://b/k", "not a gs:// URI"),
])
def test_split_uri_rejects(uri: str, reason: str) -> None:
    with pytest.raises(storage.StorageError, match=f"^{re.escape(uri)}: {reason}"):
        gcs.split_uri(uri)


def test_object_uri_needs_a_name() -> None:
    with pytest.raises(storage.StorageError, match="^gs://bucket/dir/: an object URI needs a name"):
        storage.read_bytes("gs://bucket/dir/")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("http://127.0.0.1:4443", ("http", "127.0.0.1:4443")),
        ("https://gcs.local:9000/", ("https", "gcs.local:9000")),
        ("localhost:4443", ("http", "localhost:4443")),
        ("", None),
    ],
)
def test_emulator_endpoint(monkeypatch: pytest.MonkeyPatch, value: str, expected) -> None:
    monkeypatch.setenv(gcs.EMULATOR_ENV, value)
    assert gcs.emulator_endpoint() == expected


def test_credentials_env_from_connection_extra() -> None:
    key = {"type": "service_account", "project_id": "p", "private_key": "-----BEGIN..."}
    assert gcs.credentials_env_from_connection_extra({"key_path": "/secrets/key.json", "project": "p1"}) == {
        "GOOGLE_APPLICATION_CREDENTIALS": "/secrets/key.json",
        "GOOGLE_CLOUD_PROJECT": "p1",
    }
    env = gcs.credentials_env_from_connection_extra({"keyfile_dict": key})
    assert json.loads(env[gcs.CREDENTIALS_JSON_ENV]) == key
    legacy = {"extra__google_cloud_platform__keyfile_dict": json.dumps(key)}
    assert json.loads(gcs.credentials_env_from_connection_extra(legacy)[gcs.CREDENTIALS_JSON_ENV]) == key
    assert gcs.credentials_env_from_connection_extra({}) == {}


def test_bad_credentials_json_error_never_echoes_the_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(gcs.EMULATOR_ENV, raising=False)
    secret = '{"type": "service_account", "private_key": "SUPERSECRET"}'
    monkeypatch.setenv(gcs.CREDENTIALS_JSON_ENV, secret)
    with pytest.raises(storage.StorageError,
                       match=f"^{gcs.CREDENTIALS_JSON_ENV} is not a usable service_account key") as info:
        gcs.client()
    assert "SUPERSECRET" not in str(info.value)
    monkeypatch.setenv(gcs.CREDENTIALS_JSON_ENV, "not json SUPERSECRET")
    with pytest.raises(storage.StorageError, match=f"^{gcs.CREDENTIALS_JSON_ENV} is set but is not valid JSON") as info:
        gcs.client()
    assert "SUPERSECRET" not in str(info.value)


def test_contract_imports_without_google_cloud_storage(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name == "google" or name.startswith("google."):
                    raise ImportError("blocked " + name)
        sys.meta_path.insert(0, Block())
        import batch_contract
        from batch_contract import storage
        storage.write_create_only({str(tmp_path / "x.json")!r}, b"{{}}")
        assert storage.read_bytes({str(tmp_path / "x.json")!r}) == b"{{}}"
        try:
            storage.read_bytes("gs://bucket/x.json")
        except storage.StorageError as exc:
            print("ERR", exc)
        """
    )
    plugins = Path(__file__).resolve().parents[2] / "plugins"
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=plugins
    ).stdout
    assert "ERR gs:// URIs need google-cloud-storage" in out


def test_missing_adc_is_a_clear_storage_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in (gcs.EMULATOR_ENV, gcs.CREDENTIALS_JSON_ENV, "GOOGLE_APPLICATION_CREDENTIALS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_GCE_CHECK", "True")  # no metadata-server probe
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))  # no gcloud user credentials
    with pytest.raises(storage.StorageError, match="needs credentials.*GOOGLE_APPLICATION_CREDENTIALS"):
        storage.exists("gs://bucket/x.json")


class _FakeBlob:
    """Just enough of a ``google.cloud.storage.Blob`` for :func:`gcs._same_content` (no network)."""

    def __init__(self, data: bytes, md5: bool, crc: bool) -> None:
        import base64
        import hashlib

        import google_crc32c

        self.data, self.size, self.generation = data, len(data), 7
        self.md5_hash = base64.b64encode(hashlib.md5(data).digest()).decode() if md5 else None
        self.crc32c = base64.b64encode(google_crc32c.value(data).to_bytes(4, "big")).decode() if crc else None
        self.ranges: list[tuple[int, int]] = []

    def reload(self, **_: object) -> None:
        pass

    def download_as_bytes(self, start: int, end: int, generation: int, **_: object) -> bytes:
        assert generation == self.generation
        self.ranges.append((start, end))
        return self.data[start : end + 1]


@pytest.mark.parametrize(("md5", "crc"), [(True, True), (False, True), (False, False)], ids=["md5", "crc32c", "bytes"])
def test_same_content_by_md5_crc32c_or_streamed_bytes(monkeypatch: pytest.MonkeyPatch, md5: bool, crc: bool) -> None:
    monkeypatch.setattr(gcs, "COMPARE_PIECE_BYTES", 1000)
    ours = bytes(range(256)) * 10  # 2,560 bytes: three pieces when compared byte for byte
    assert gcs._same_content(_FakeBlob(ours, md5, crc), ours) is True
    theirs = ours[:-1] + b"\x00"  # same size, last byte differs
    blob = _FakeBlob(theirs, md5, crc)
    assert gcs._same_content(blob, ours) is False
    assert blob.ranges == ([] if md5 or crc else [(0, 999), (1000, 1999), (2000, 2559)])
    assert gcs._same_content(_FakeBlob(ours[:-1], md5, crc), ours) is False  # size differs: no hashing


@pytest.mark.parametrize(
    ("uri", "root", "under"),
    [
        ("gs://b/root/x", "gs://b/root/", True),
        ("gs://b/root", "gs://b/root", True),
        ("gs://b/rootless/x", "gs://b/root", False),
        ("gs://b/root/../x", "gs://b/root", False),  # collapsed: gs://b/x
        ("gs://b/other/../root/x", "gs://b/root", False),  # as written: not under the root
        ("gs://c/root/x", "gs://b/root", False),
        ("gs://b/anything", "gs://b", True),
        ("/b/root/x", "gs://b/root", False),  # another backend never matches
    ],
)
def test_is_under_by_backend(uri: str, root: str, under: bool) -> None:
    assert storage.is_under(uri, root) is under


def test_normalize_and_local_is_under(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    real = str((tmp_path / "real").resolve())
    assert storage.normalize(f"file://{tmp_path}/link/x/../y") == f"{real}/y"
    assert storage.normalize("gs://b/a/./c/../d/") == "gs://b/a/d"
    assert storage.is_under(f"{tmp_path}/link/z", real) and not storage.is_under(f"{real}x", real)
    for bad in ("gs://", "gs:///key"):
        with pytest.raises(storage.StorageError, match=f"^{re.escape(bad)}: no bucket name"):
            storage.normalize(bad)
    with pytest.raises(storage.StorageError, match="^oss://b/k: no storage backend for scheme 'oss'"):
        storage.normalize("oss://b/k")
    assert storage.scheme_of("GS://b/k") == "gs" and storage.scheme_of("/a/b") == ""
    assert storage.backend_for("file:///x") is storage.backend_for("/x")
