"""Iceberg files on gs:// go through the project's GCS setup (iceberg_backend.StorageFileIO): the catalog of a
gs:// warehouse names it as ``py-io-impl``, and it reads and writes the emulator named by
STORAGE_EMULATOR_HOST anonymously (pyiceberg's own GcsFileSystem ignores that variable and, with no
Application Default Credentials, retries the metadata server for minutes)."""

from __future__ import annotations

import time

import gcs_fixture
import pytest
from batch_contract import storage
from batch_inference.publish import PublishTarget
from batch_inference.publish.iceberg_backend import StorageFileIO, catalog_properties
from pyiceberg.io import PY_IO_IMPL, load_file_io
from pyiceberg.io.pyarrow import PyArrowFileIO

fake_gcs, gcs_bucket = gcs_fixture.fake_gcs, gcs_fixture.gcs_bucket

DSN = "postgresql://u@127.0.0.1:5432/db"


def test_gcs_warehouse_catalog_uses_the_storage_file_io() -> None:
    target = PublishTarget(backend="iceberg", table="emb", iceberg_warehouse="gs://b/out/iceberg/warehouse/", dsn=DSN)
    props = catalog_properties(target)
    assert props == {"uri": "postgresql+psycopg://u@127.0.0.1:5432/db", "warehouse": "gs://b/out/iceberg/warehouse",
                     PY_IO_IMPL: "batch_inference.publish.iceberg_backend.StorageFileIO"}
    assert type(load_file_io(props, "gs://b/out/iceberg/warehouse/default.db/emb/metadata/x.json")) is StorageFileIO


def test_local_warehouse_catalog_keeps_pyiceberg_file_io(tmp_path) -> None:
    props = catalog_properties(PublishTarget(backend="iceberg", table="emb", iceberg_warehouse=str(tmp_path / "wh")))
    assert PY_IO_IMPL not in props and props["warehouse"] == (tmp_path / "wh").as_uri()
    assert type(load_file_io(props, props["warehouse"])) is PyArrowFileIO


def test_storage_file_io_reads_and_writes_the_emulator(gcs_bucket: str, tmp_path) -> None:
    io = StorageFileIO({})
    uri = f"{gcs_bucket}/iceberg/warehouse/default.db/t/metadata/00000-x.metadata.json"
    start = time.monotonic()
    with io.new_output(uri).create() as out:
        out.write(b'{"format-version": 2}')
    assert time.monotonic() - start < 10, "no credential lookups against a metadata server"
    assert storage.read_bytes(uri) == b'{"format-version": 2}'  # the object the rest of the project sees
    with io.new_input(uri).open() as f:
        assert f.read() == b'{"format-version": 2}'
    io.delete(uri)
    assert not storage.exists(uri)
    local = tmp_path / "f.bin"
    with io.new_output(str(local)).create() as out:
        out.write(b"x")
    assert local.read_bytes() == b"x"


@pytest.mark.parametrize("scheme", ["gs", "gcs"])
def test_both_gcs_schemes_get_the_project_filesystem(gcs_bucket: str, scheme: str) -> None:
    fs = StorageFileIO({}).fs_by_scheme(scheme, gcs_bucket.removeprefix("gs://"))
    assert fs is storage.arrow_filesystem(f"{gcs_bucket}/x")[0]
