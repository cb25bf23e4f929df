"""The URI rules of the ``s3://`` and ``az://`` backends that guard the allow-list.

An HTTP client or server may collapse ``.`` and ``..`` in a request path, even across the bucket name
(``/inputs/../secrets/x`` reaches bucket ``secrets``), and ``a//b`` is another object than ``a/b``. So a
URI these backends accept must be a fixed point of that collapsing, and the allow-list answer
(:func:`storage.is_under`) must hold for the collapsed path too, whatever form an attacker writes. No
server is needed: a refused URI is refused before any request, and the endpoints point at a closed
port, so a request that slipped through would fail with a message other than the refusal's.
"""

from __future__ import annotations

import posixpath

import pytest
from batch_contract import storage
from hypothesis import given, settings
from hypothesis import strategies as st

SCHEMES = ("s3", "az")
SEGMENTS = st.one_of(st.sampled_from(["", ".", "..", "a", "b", "runs", "in", "x.parquet", "..a", "a..", ".h"]),
                     st.text(alphabet="ab.%2e", min_size=1, max_size=4))
REFUSAL = "path segment"


@pytest.fixture(autouse=True)
def _closed_endpoints(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "unused")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "unused")
    monkeypatch.setenv("AZURE_STORAGE_BLOB_ENDPOINT", "http://127.0.0.1:9/devstoreaccount1")
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", "")


def _request_path(uri: str) -> str:
    """The path an HTTP client that collapses dot segments would send for ``uri`` (path-style)."""
    return posixpath.normpath("/" + uri.split("://", 1)[1])


def _accepted(uri: str) -> bool:
    try:
        storage.normalize(uri)
    except storage.StorageError as exc:
        assert REFUSAL in str(exc) or "no bucket" in str(exc) or "no container" in str(exc), exc
        return False
    return True


@settings(max_examples=300, deadline=None)
@given(scheme=st.sampled_from(SCHEMES), parts=st.lists(SEGMENTS, min_size=1, max_size=6),
       root_parts=st.lists(SEGMENTS, min_size=1, max_size=4))
def test_an_accepted_uri_names_the_object_its_request_reaches(scheme: str, parts: list[str],
                                                             root_parts: list[str]) -> None:
    uri, root = f"{scheme}://" + "/".join(parts), f"{scheme}://" + "/".join(root_parts)
    if _accepted(uri):
        assert _request_path(uri) == "/" + storage.normalize(uri).split("://", 1)[1]
    if _accepted(uri) and _accepted(root) and storage.is_under(uri, root):
        top = _request_path(root)
        assert _request_path(uri) == top or _request_path(uri).startswith(top.rstrip("/") + "/")
    if any(p in (".", "..") for p in parts):
        assert not _accepted(uri)


ESCAPES = ["{s}://inputs/../secrets/x.parquet", "{s}://inputs/runs/../../secrets/x", "{s}://inputs/./x",
           "{s}://inputs//x", "{s}://inputs/runs//", "{s}://../secrets/x", "{s}://./x", "{s}://inputs/runs/.."]


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("template", ESCAPES)
def test_every_operation_refuses_a_dot_or_empty_segment(scheme: str, template: str) -> None:
    uri = template.format(s=scheme)
    good = f"{scheme}://inputs/ok.txt"
    calls = [lambda: storage.normalize(uri), lambda: storage.is_under(uri, f"{scheme}://inputs"),
             lambda: storage.is_under(good, uri),
             lambda: storage.check_under_roots(uri, [f"{scheme}://inputs"]),
             lambda: storage.read_bytes(uri), lambda: storage.write_create_only(uri, b"x"),
             lambda: storage.write_replace(uri, b"x"), lambda: storage.exists(uri),
             lambda: storage.list_names(uri), lambda: storage.list_glob(uri, "*"),
             lambda: storage.delete(uri), lambda: storage.move(uri, good), lambda: storage.move(good, uri),
             lambda: storage.copy(uri, good), lambda: storage.copy(good, uri),
             lambda: storage.content_tag(uri), lambda: storage.arrow_filesystem(uri),
             lambda: storage.open_input_file(uri)]
    for call in calls:
        with pytest.raises(storage.StorageError, match=REFUSAL):
            call()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_plain_names_with_dots_inside_a_segment_and_upper_case_schemes_are_kept(scheme: str) -> None:
    assert storage.normalize(f"{scheme.upper()}://b/runs/..a/x.y/") == f"{scheme}://b/runs/..a/x.y"
    assert storage.is_under(f"{scheme}://b/runs/a../x", f"{scheme}://b/runs")
    assert not storage.is_under(f"{scheme}://b/runs2/x", f"{scheme}://b/runs")
    assert not storage.is_under(f"{scheme}://c/runs/x", f"{scheme}://b/runs")
    assert storage.normalize(f"{scheme}://b/") == f"{scheme}://b"
