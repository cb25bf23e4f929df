"""Create-only commits of objects over the resumable threshold keep the lost-reply guarantee.

google-cloud-storage uploads objects over 8 MiB (``_MAX_MULTIPART_SIZE``) as a resumable session: a POST
opens it, PUTs with ``Content-Range`` carry the chunks (308 until the last, 200 for the final one). A
reply lost at any of those requests (the server did the work, the client never heard) must end in
exactly one committed object holding our bytes; another writer's different object must end in
:class:`~batch_contract.storage.AlreadyExistsError` and stay untouched.

fake-gcs-server differs from GCS on resumable uploads (it ignores ``ifGenerationMatch``, appends a re-sent
chunk again, answers 404 for a finalized session), so the proxy runs with ``gcs_resumable=True``: it
applies GCS's documented behaviour in front of the emulator (see ``fault_proxy._ResumableShim``). The
last test runs the emulator's own behaviour to show that it never leaves a corrupt object either.
"""

from __future__ import annotations

import os
import re
import urllib.request
from collections.abc import Callable, Iterator
from urllib.parse import quote

import gcs_fixture
import pytest
from batch_contract import gcs, storage
from fault_proxy import FaultPlan, FaultProxy, ScriptedFault
from google.cloud.storage.blob import _MAX_MULTIPART_SIZE

fake_gcs, gcs_bucket = gcs_fixture.fake_gcs, gcs_fixture.gcs_bucket

pytestmark = pytest.mark.integration

THRESHOLD = _MAX_MULTIPART_SIZE
"""The client's own multipart/resumable threshold (8 MiB): at most this many bytes go up in one request."""
CHUNK = 4 * 256 * 1024
"""Resumable chunk size in the tests (1 MiB, a multiple of GCS's 256 KiB): 9+ PUTs per object."""

SIZES = {"at_threshold": THRESHOLD, "threshold_plus_1": THRESHOLD + 1, "multi_chunk": THRESHOLD + 2 * CHUNK + 12345}


def _drop_points(size: int) -> list[tuple[str, int]]:
    """(step, n-th request of that step) whose reply is dropped: every kind of request of the upload."""
    if size <= THRESHOLD:
        return [("multipart", 1)]
    return [("initiate", 1), ("middle", 1), ("middle", 3), ("final", 1)]


CASES = [(label, step, nth) for label, size in SIZES.items() for step, nth in _drop_points(size)]


@pytest.fixture
def make_proxy(fake_gcs, gcs_bucket: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., FaultProxy]]:  # noqa: F811
    """Start a :class:`FaultProxy` (no random faults) in front of the emulator and point the storage
    layer at it, with 1 MiB chunks and fast retries."""
    monkeypatch.setattr(gcs, "UPLOAD_CHUNK_BYTES", CHUNK)
    monkeypatch.setattr(gcs, "RETRY_INITIAL_S", 0.05)
    started: list[FaultProxy] = []

    def make(**kwargs: object) -> FaultProxy:
        proxy = FaultProxy(fake_gcs.url, FaultPlan(rate=0.0), **kwargs).start()
        started.append(proxy)
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
        return proxy

    yield make
    for proxy in started:
        proxy.stop()


def _commits(proxy: FaultProxy) -> list[str]:
    """Outcomes of the requests that create an object (the multipart POST, a final chunk PUT) and that
    the server accepted (200, whether the reply reached the client or not)."""
    return [o for s, o in proxy.uploads if s in ("multipart", "final") and o in ("200", "dropped 200")]


def _other_writer(fake_gcs, uri: str, data: bytes) -> Callable[[], None]:  # noqa: F811
    """A callable that commits ``data`` at ``uri`` straight on the emulator (another process's write)."""
    bucket, name = gcs.split_uri(uri)

    def write() -> None:
        url = f"{fake_gcs.url}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={quote(name, safe='')}"
        req = urllib.request.Request(url, data=data, method="POST",
                                     headers={"Content-Type": "application/octet-stream"})
        with urllib.request.urlopen(req, timeout=30):
            pass

    return write


def _read_direct(fake_gcs, uri: str) -> bytes:  # noqa: F811
    bucket, name = gcs.split_uri(uri)
    with urllib.request.urlopen(f"{fake_gcs.url}/download/storage/v1/b/{bucket}/o/{quote(name, safe='')}?alt=media",
                                timeout=30) as resp:
        return resp.read()


@pytest.mark.parametrize(("size_label", "step", "nth"), CASES)
def test_lost_reply_commits_exactly_once(make_proxy, fake_gcs, gcs_bucket: str, size_label: str,  # noqa: F811
                                         step: str, nth: int) -> None:
    data = os.urandom(SIZES[size_label])
    proxy = make_proxy(script=[ScriptedFault(step, "reset_after", nth=nth)], gcs_resumable=True, completed_status=412)
    uri = f"{gcs_bucket}/shards/00000/part-00000-{size_label}-{step}-{nth}.parquet"
    storage.write_create_only(uri, data)
    dropped = [o for s, o in proxy.uploads if o.startswith("dropped")]
    assert dropped == ["dropped 308" if step == "middle" else "dropped 200"], proxy.uploads
    assert _commits(proxy) == (["dropped 200"] if step in ("multipart", "final") else ["200"]), proxy.uploads
    assert _read_direct(fake_gcs, uri) == data


@pytest.mark.parametrize("completed_status", [412, 410, None], ids=["412", "410", "emulator-404"])
def test_lost_final_reply_whatever_the_retry_meets(make_proxy, fake_gcs, gcs_bucket: str,  # noqa: F811
                                                   completed_status: int | None) -> None:
    """The re-sent final chunk meets a finalized session: 412 (precondition re-checked), 410 (session
    gone) or fake-gcs-server's 404. Each is read back: our bytes -> success, nothing uploaded again."""
    data = os.urandom(SIZES["multi_chunk"])
    proxy = make_proxy(script=[ScriptedFault("final")], gcs_resumable=True, completed_status=completed_status)
    uri = f"{gcs_bucket}/p/part-final-{completed_status}.parquet"
    storage.write_create_only(uri, data)
    finals = [o for s, o in proxy.uploads if s == "final"]
    assert finals == ["dropped 200", str(completed_status or 404)]
    assert _commits(proxy) == ["dropped 200"]
    assert _read_direct(fake_gcs, uri) == data


@pytest.mark.parametrize("size_label", ["threshold_plus_1", "multi_chunk"])
@pytest.mark.parametrize("other", ["same_size", "other_size"])
def test_other_writer_before_us_is_already_exists(make_proxy, fake_gcs, gcs_bucket: str,  # noqa: F811
                                                  size_label: str, other: str) -> None:
    data = os.urandom(SIZES[size_label])
    theirs = os.urandom(len(data)) if other == "same_size" else os.urandom(len(data) - CHUNK)
    uri = f"{gcs_bucket}/p/part-{size_label}-{other}.parquet"
    _other_writer(fake_gcs, uri, theirs)()
    proxy = make_proxy(gcs_resumable=True)
    with pytest.raises(storage.AlreadyExistsError, match=f"^{re.escape(uri)} already exists with other content"):
        storage.write_create_only(uri, data)
    assert [s for s, _ in proxy.uploads] == ["initiate"]
    assert proxy.uploads[0][1] == "412"
    assert _read_direct(fake_gcs, uri) == theirs


@pytest.mark.parametrize("drop_final", [False, True], ids=["final-reply-kept", "final-reply-lost"])
def test_other_writer_during_our_upload_is_already_exists(make_proxy, fake_gcs, gcs_bucket: str,  # noqa: F811
                                                          drop_final: bool) -> None:
    """Another writer commits between our chunks: our final PUT gets 412, the read-back finds their bytes."""
    data = os.urandom(SIZES["multi_chunk"])
    theirs = os.urandom(len(data))
    uri = f"{gcs_bucket}/p/part-race-{drop_final}.parquet"
    script = [ScriptedFault("middle", None, nth=2, before=_other_writer(fake_gcs, uri, theirs))]
    if drop_final:
        script.append(ScriptedFault("final"))
    proxy = make_proxy(script=script, gcs_resumable=True)
    with pytest.raises(storage.AlreadyExistsError, match=f"^{re.escape(uri)} already exists with other content"):
        storage.write_create_only(uri, data)
    assert [o for s, o in proxy.uploads if s == "final"][-1] == "412"
    assert _commits(proxy) == []
    assert _read_direct(fake_gcs, uri) == theirs


def test_same_bytes_already_there_is_success(make_proxy, fake_gcs, gcs_bucket: str) -> None:  # noqa: F811
    """A commit that finds our exact bytes (an earlier attempt of the same task landed) succeeds."""
    data = os.urandom(SIZES["multi_chunk"])
    uri = f"{gcs_bucket}/p/part-again.parquet"
    _other_writer(fake_gcs, uri, data)()
    proxy = make_proxy(gcs_resumable=True)
    storage.write_create_only(uri, data)
    assert proxy.uploads == [("initiate", "412")]


def test_emulator_duplicate_chunk_never_leaves_a_corrupt_object(make_proxy, fake_gcs, gcs_bucket: str) -> None:  # noqa: F811
    """On fake-gcs-server itself a re-sent middle chunk is appended twice; the client's CRC32C check then
    fails, the library deletes the object and the commit raises: a failure, never a corrupt object."""
    data = os.urandom(SIZES["multi_chunk"])
    uri = f"{gcs_bucket}/p/part-emulator.parquet"
    make_proxy(script=[ScriptedFault("middle", nth=2)], gcs_resumable=False)
    with pytest.raises(storage.StorageError,
                       match=f"^{re.escape(uri)}: " + re.escape("create-only upload (checksum mismatch) failed")):
        storage.write_create_only(uri, data)
    assert not storage.exists(uri)
